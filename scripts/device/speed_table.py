#!/usr/bin/env python3
"""The table of scripts/device/speed.sh: our runs beside compile_anchor.py's lines.

usage: speed_table.py RUNS_DIR ANCHOR_JSONL [--json OUT] [--skip N]

RUNS_DIR holds one directory per matrix row (rank0.h5) and rows.tsv (name, anchor config).
Ours: the median step after the first N (default 8) of rank 0: tokens/s (batch x seq / step),
step ms, MFU (the trainers' own, model/flops.h), peak GiB. Anchor: its tok_s, step_ms, mem_gib.
"""
import argparse
import json
import pathlib
import sys

import h5py
import numpy as np


def our_row(run_dir, skip):
    path = run_dir / "rank0.h5"
    if not path.exists():
        return None
    with h5py.File(path, "r") as f:
        st = f["steps"]
        step = np.asarray(st["end"][:] - st["start"][:])[skip:]
        if len(step) == 0:
            return None
        tokens = float(st["padded_tokens"][0])
        mfu = np.asarray(st["mfu"][:])[skip:] if "mfu" in st else np.array([np.nan])
        peak = float(f.attrs.get("peak_memory_bytes", np.nan))
        med = float(np.median(step))
        return dict(step_ms=1e3 * med, tok_s=tokens / med, mfu=float(np.median(mfu)),
                    mem_gib=peak / 2**30, steps=int(len(step)))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("runs")
    ap.add_argument("anchor")
    ap.add_argument("--json")
    ap.add_argument("--skip", type=int, default=8)
    a = ap.parse_args(argv)
    runs = pathlib.Path(a.runs)
    anchors = {}
    if pathlib.Path(a.anchor).exists():
        for line in open(a.anchor):
            line = line.strip()
            if line.startswith("{"):
                d = json.loads(line)
                if "tok_s" in d:
                    anchors[d["config"]] = d
    rows = []
    for line in open(runs / "rows.tsv"):
        name, anchor = line.rstrip("\n").split("\t")
        ours = our_row(runs / name, a.skip)
        peer = anchors.get(anchor)
        rows.append(dict(name=name, anchor_config=anchor, ours=ours, anchor=peer,
                         ratio=(ours["tok_s"] / peer["tok_s"]) if ours and peer else None))
    print(f"{'run':<26} {'tok/s':>9} {'step ms':>8} {'MFU':>6} {'GiB':>5} | {'compile':>9} {'ms':>7} {'GiB':>5} | {'ours/compile':>12}")
    for r in rows:
        o, p = r["ours"], r["anchor"]
        left = (f"{o['tok_s']:9.0f} {o['step_ms']:8.2f} {100 * o['mfu']:5.1f}% {o['mem_gib']:5.1f}"
                if o else f"{'failed':>9} {'':8} {'':6} {'':5}")
        right = f"{p['tok_s']:9.0f} {p['step_ms']:7.2f} {p.get('mem_gib', float('nan')):5.1f}" if p else f"{'-':>9} {'':7} {'':5}"
        ratio = f"{r['ratio']:11.3f}x" if r["ratio"] else f"{'-':>12}"
        print(f"{r['name']:<26} {left} | {right} | {ratio}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["ours"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
