#!/usr/bin/env python3
"""Side-by-side table of our device runs and a PyTorch anchor's JSON lines.

usage: bench_table.py dp|pp RUNS_DIR ANCHOR_JSONL [--json OUT]

Ours: for each run directory under RUNS_DIR, tokens/s two ways -- HW5's (per epoch, padded tokens
summed over ranks / mean rank training time, first epoch dropped) and the median step
(all ranks' padded tokens / median step time of epochs after the first), which is what the anchors
report (median of timed steps). Anchor: its tok_s per configuration.
"""
import argparse
import json
import pathlib
import statistics

import h5py
import numpy as np


def our_run(run_dir):
    ranks = sorted(run_dir.glob("rank*.h5"))
    if not ranks:
        return None
    per_rank_time, per_rank_tok, step_times, step_tokens, peaks = [], [], [], 0, []
    phases = {"forward": [], "backward": [], "sync_exposed": []}
    pipeline = False
    cfg = {}
    for path in ranks:
        with h5py.File(path, "r") as f:
            cfg = json.loads(f.attrs["config"])
            pipeline = "stage" in f.attrs  # pp_train records its stage
            ep = f["epochs"]
            keep = ep["epoch"][:] >= 1 if len(ep["epoch"]) > 1 else slice(None)
            per_rank_time.append(np.asarray(ep["train_time"][:])[keep])
            per_rank_tok.append(np.asarray(ep["tokens_per_sec"][:])[keep])
            st = f["steps"]
            sel = st["epoch"][:] >= 1 if len(ep["epoch"]) > 1 else slice(None)
            step_times.append(np.asarray(st["end"][:] - st["start"][:])[sel])
            step_tokens += int(st["padded_tokens"][0])
            for k in phases:
                phases[k].append(float(np.median(np.asarray(st[k][:])[sel])))
            if "peak_memory_bytes" in ep:
                peaks.append(float(np.max(ep["peak_memory_bytes"][:])))
    # The stages of a pp_train run all work on the same batch: one replica, so its tokens are
    # counted once (mean over ranks); dp ranks are replicas (HW5: sum over ranks).
    epoch_time = np.mean(per_rank_time, axis=0)       # mean over ranks, per epoch
    epoch_tok = (np.mean if pipeline else np.sum)(per_rank_tok, axis=0)
    if pipeline:
        step_tokens //= len(ranks)
    med_step = float(np.median(np.max(np.stack(step_times), axis=0)))
    return dict(world=len(ranks), precision=cfg.get("precision"), seq=cfg.get("seq_len"),
                batch=cfg.get("batch_size"), sync=cfg.get("grad_sync"),
                mode=cfg.get("mode"), schedule=cfg.get("schedule"), m=cfg.get("microbatches"),
                partition=cfg.get("partition"), stages_per_rank=cfg.get("stages_per_rank", 1),
                hw5_epoch_time=float(np.mean(epoch_time)), hw5_tok_s=float(np.mean(epoch_tok)),
                median_step_s=med_step, step_tok_s=step_tokens / med_step,
                # median phase times, the slowest rank's
                phase_ms={k: 1000 * max(v) for k, v in phases.items()},
                peak_gib=[p / 2**30 for p in peaks])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["dp", "pp"])
    ap.add_argument("runs", type=pathlib.Path)
    ap.add_argument("anchor", type=pathlib.Path)
    ap.add_argument("--json", type=pathlib.Path)
    a = ap.parse_args()
    ours = {d.name: our_run(d) for d in sorted(a.runs.iterdir()) if d.is_dir()}
    ours = {k: v for k, v in ours.items() if v}
    anchor = []
    if a.anchor.exists():
        for line in a.anchor.read_text().splitlines():
            try:
                anchor.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    print(f"{'run':26s} {'world':>5s} {'HW5 tok/s':>10s} {'epoch s':>8s} {'step tok/s':>10s} "
          f"{'step ms':>8s} {'vs base':>7s} {'HW5 x':>6s} {'fwd':>6s} {'bwd':>6s} {'sync':>5s} "
          f"{'peak GiB/rank':>14s}")
    for name, r in ours.items():
        # pp: speed-up over the model_parallel run of the same setting (fp32_mp for fp32_*,
        # fp32_mp_uniform for *_uniform); dp: over the 1-GPU run of the same precision.
        if a.kind == "pp":
            base = name.split("_")[0] + "_mp" + ("_uniform" if name.endswith("_uniform") else "")
        else:
            base = name.split("_")[0] + "_1gpu"
        rel = f"{r['step_tok_s'] / ours[base]['step_tok_s']:6.3f}x" if base in ours else "      -"
        hw5 = f"{r['hw5_tok_s'] / ours[base]['hw5_tok_s']:5.3f}x" if base in ours else "     -"
        peak = "/".join(f"{p:.1f}" for p in r["peak_gib"]) or "-"
        ph = r["phase_ms"]
        print(f"{name:26s} {r['world']:5d} {r['hw5_tok_s']:10.0f} {r['hw5_epoch_time']:8.2f} "
              f"{r['step_tok_s']:10.0f} {1000 * r['median_step_s']:8.1f} {rel:>7s} {hw5:>6s} "
              f"{ph['forward']:6.1f} {ph['backward']:6.1f} {ph['sync_exposed']:5.2f} {peak:>14s}")
    if anchor:
        print("anchor (PyTorch, median step):")
        for x in anchor:
            if "tok_s" in x:
                label = " ".join(f"{k}={x[k]}" for k in x if k not in ("tok_s", "step_s", "mem_gib"))
                print(f"  {label:60s} tok/s {x['tok_s']:>9} step {1000 * x['step_s']:.1f} ms")
            else:
                print("  ", json.dumps(x))
    if a.json:
        a.json.write_text(json.dumps({"ours": ours, "anchor": anchor}, indent=2))


if __name__ == "__main__":
    main()
