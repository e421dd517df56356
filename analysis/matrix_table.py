"""The table of one scripts/benchmark run: per matrix row tokens/s, step time, peak memory, MFU and
the last loss, beside its PyTorch anchor and its base row; writes table.txt, table.json, README.md.

    python3 -m analysis.matrix_table OUT_DIR --warmup W [--matrix FILE] [--command CMD]
                                     [--commit C] [--date D]

OUT_DIR is what scripts/benchmark wrote: rows.tsv (one line per row and repetition: name, rep,
ranks, program, anchor, anchor_key, base, expect, rc, seconds, note, command), anchors.tsv (key, rep,
rc, seconds, command), runs/<row>/rep<r>/ (the trainers' rank<r>.h5; pp_plan's plan.json),
anchors/<key>.rep<r>.jsonl (an anchor's JSON lines) and machine.txt.

How the numbers are made, per row:
- tokens/s is the analysis's (metrics.TOK_S_DEFINITION, analysis/README.md): all ranks' padded
  tokens per second of training time, taken per step: a step's tokens are the batch's padded
  tokens summed over the ranks of dp_train (each rank is a replica), counted once per pipeline for
  pp_train (its stages share one batch; with --dp D summed over the D replicas), its time is the
  slowest rank's (end - start of /steps);
- the first W steps of every repetition are warm-up and dropped; the rest of all repetitions are
  pooled: tokens/s = median of tokens / step time, step = median step time;
- peak = the largest peak_memory_bytes of any rank (median over repetitions); MFU = the trainers'
  own per-step MFU (model/flops.h), mean over ranks, median over the steps, where recorded;
- anchor: the anchor script's tok_s for the same configuration (median over repetitions), run
  in the same invocation; the anchors count alike (every rank's batch x seq_len over the median
  step); ours/anchor = our tokens/s over it;
- ours/base: our tokens/s over the base row's; where the base is a pp_plan row, over the tokens/s
  of its predicted step for this row's schedule, M and stages per rank.
Exit status: 0 when every row and anchor ended as expected, 1 when one did not, 2 on bad input."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from analysis import metrics
from analysis import numbers as fmt
from analysis.reader import RunError, read_run, schedule_name
from analysis.matrix_render import readme, text_table, tok_s_note
from analysis.summary import write_json

TRAINERS = ("dp_train", "pp_train", "gpt2_train")
ROW_FIELDS = ("name", "rep", "ranks", "program", "anchor", "anchor_key", "base", "expect", "rc",
              "seconds", "note", "command")
ANCHOR_FIELDS = ("key", "rep", "rc", "seconds", "command")


def read_tsv(path: Path, fields) -> List[Dict[str, str]]:
    if not path.exists():
        raise RunError(f"{path}: missing; is {path.parent} an output directory of scripts/benchmark?")
    rows = []
    with open(path, newline="") as f:
        for n, rec in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
            if not rec or rec[0].startswith("#"):
                continue
            if len(rec) != len(fields):
                raise RunError(f"{path}:{n}: {len(rec)} fields, expected {len(fields)} ({' '.join(fields)})")
            rows.append(dict(zip(fields, rec)))
    return rows


def run_steps(run_dir: Path, warmup: int) -> Dict[str, object]:
    """One repetition of a trainer row: its measured steps (after `warmup`) across ranks."""
    run = read_run(run_dir)
    tables = [r.table("steps") for r in run.ranks if r.rows("steps")]
    replicas = [r.dp_rank for r in run.ranks if r.rows("steps")]
    if not tables:
        raise RunError(f"{run_dir}: no steps recorded")
    index = [{int(s): i for i, s in enumerate(t["step"])} for t in tables]
    common = sorted(set.intersection(*(set(ix) for ix in index)))
    measured = common[warmup:]
    dur, tokens, mfu = [], [], []
    for k in measured:
        rows = [(t, ix[k]) for t, ix in zip(tables, index)]
        dur.append(max(t["end"][i] - t["start"][i] for t, i in rows))
        tok = [t["padded_tokens"][i] for t, i in rows]
        if run.is_pipeline:  # one count per replica's pipeline: its largest stage's
            per = {}
            for d, x in zip(replicas, tok):
                per[d] = max(per.get(d, x), x)
            tokens.append(sum(per.values()))
        else:
            tokens.append(sum(tok))
        m = [t["mfu"][i] for t, i in rows if "mfu" in t and np.isfinite(t["mfu"][i])]
        mfu.append(float(np.mean(m)) if m else np.nan)
    peaks = []
    for r in run.ranks:
        ep = r.table("epochs").get("peak_memory_bytes")
        peak = float(np.max(ep)) if ep is not None and len(ep) else float(r.attrs.get("peak_memory_bytes", np.nan))
        peaks.append(peak)
    loss_table = metrics.loss_rank(run).table("steps")
    loss = float(loss_table["loss"][-1]) if loss_table and len(loss_table.get("loss", [])) else np.nan
    c = run.config
    config = {k: c.get(k) for k in ("mode", "schedule", "microbatches", "stages_per_rank",
                                    "partition", "zero_bubble", "zb_extra_live", "batch_size", "seq_len")}
    return dict(dur=np.asarray(dur), tokens=np.asarray(tokens, dtype=float), mfu=np.asarray(mfu),
                peak=float(np.nanmax(peaks)) if np.isfinite(peaks).any() else np.nan, loss=loss,
                steps=len(common), pipeline=run.is_pipeline, config=config)


def anchor_line(spec: str, ranks: int, lines: List[Dict]) -> Optional[Dict]:
    """The JSON line of an anchor's output that is the same work as a row (see scripts/benchmark
    for the spec: compile:BxSxP[+tf32], ddp:BxSxP[:mode], pp:BxSxP:model_parallel|SCHED:M, comm)."""
    kind, _, rest = spec.partition(":")
    timed = [x for x in lines if "tok_s" in x]
    if kind == "compile":
        return timed[0] if timed else None
    if kind not in ("ddp", "pp"):
        return None
    cfg, _, extra = rest.partition(":")
    b, s, prec = cfg.split("x")
    same = [x for x in timed if x.get("B") == int(b) and x.get("S") == int(s) and x.get("prec") == prec]
    if kind == "ddp":
        mode = extra or ("single" if ranks == 1 else "ddp")
        world = 1 if mode == "single" else ranks
        same = [x for x in same if x.get("mode") == mode and x.get("world") == world]
    elif extra == "model_parallel":
        same = [x for x in same if x.get("mode") == "model_parallel"]
    else:
        sched, _, m = extra.partition(":")
        same = [x for x in same if x.get("mode") == "pipe_" + sched and x.get("M") == int(m)]
    return same[0] if same else None


def read_jsonl(path: Path) -> List[Dict]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                out.append(value)
    return out


def plan_prediction(plan: Dict, config: Dict) -> Optional[float]:
    """pp_plan's predicted step (s) for a run's schedule, M and stages per rank (and partition and
    zero bubble where the plan has them); with one stage every schedule at a given M is the same.
    model_parallel is the plan's own row, or any row's step times its speed-up over it."""
    preds = [p for p in plan.get("predictions", [])
             if p.get("partition", config.get("partition")) == config.get("partition")]
    if config.get("mode") == "model_parallel":
        mp = [p for p in preds if p.get("schedule") == "model_parallel"]
        if mp:
            return mp[0]["step_s"]
        return preds[0]["step_s"] * preds[0]["speedup_vs_model_parallel"] if preds else None
    cands = [p for p in preds if p.get("microbatches") == config.get("microbatches")
             and p.get("stages_per_rank", 1) == (config.get("stages_per_rank") or 1)
             and bool(p.get("zero_bubble", False)) == bool(config.get("zero_bubble"))
             and (not p.get("zero_bubble") or p.get("zb_extra_live", 0) == (config.get("zb_extra_live") or 0))]
    exact = [p for p in cands if p.get("schedule") == config.get("schedule")]
    if exact:
        return exact[0]["step_s"]
    if cands and plan.get("stages") == 1:
        return cands[0]["step_s"]
    if plan.get("stages") == 1 and config.get("microbatches") == 1:  # one stage, M = 1: model_parallel
        return plan_prediction(plan, dict(config, mode="model_parallel"))
    return None


def plan_note(plan: Dict) -> str:
    preds = plan.get("predictions", [])
    if not preds:
        return "no predictions"
    best = max(preds, key=lambda p: (p.get("speedup_vs_model_parallel", 0), -p.get("step_s", 0)))
    name = schedule_name(best["schedule"], best.get("stages_per_rank", 1), best.get("zero_bubble", False),
                         best.get("zb_extra_live", 0))
    return (f"{len(preds)} predictions on {plan.get('stages', '?')} stages; fastest: {name} "
            f"M={best['microbatches']} {best.get('partition', '')}, {fmt.ms(best['step_s'])}, "
            f"{fmt.ratio(best.get('speedup_vs_model_parallel'))} over model_parallel")


def median(values) -> float:
    v = np.asarray([x for x in values if x is not None], dtype=float)
    v = v[np.isfinite(v)]
    return float(np.median(v)) if v.size else float("nan")


def summarise_row(out: Path, reps: List[Dict[str, str]], warmup: int) -> Dict[str, object]:
    first = reps[0]
    ranks, expect = int(first["ranks"]), int(first["expect"])
    row = dict(name=first["name"], ranks=ranks, program=first["program"], anchor=first["anchor"],
               base=first["base"], expect=expect, command=first["command"], reps=[], ok=True)
    if first["rc"] == "skip":
        return dict(row, status="skipped: " + first["note"])
    runs, problems = [], []
    anchors, anchor_mem = [], []
    for rep in reps:
        rc, n = int(rep["rc"]), int(rep["rep"])
        info = dict(rep=n, rc=rc, seconds=float(rep["seconds"]))
        run_dir = out / "runs" / row["name"] / f"rep{n}"
        if rc != expect:
            problems.append(f"rep {n}: rc {rc} (want {expect}; logs/{row['name']}.rep{n}.log)")
        elif row["program"] in TRAINERS and expect == 0:
            try:
                r = run_steps(run_dir, warmup)
            except RunError as e:
                problems.append(f"rep {n}: {e}")
            else:
                if not r["dur"].size:
                    problems.append(f"rep {n}: {r['steps']} steps, none after the {warmup} warm-up steps")
                else:
                    runs.append(r)
                    info.update(steps=r["steps"], step_ms=1e3 * float(np.median(r["dur"])),
                                tok_s=float(np.median(r["tokens"] / r["dur"])))
        elif row["program"] == "pp_plan" and (run_dir / "plan.json").exists():
            row["plan"] = json.loads((run_dir / "plan.json").read_text())
        if row["anchor"] != "-":
            line = anchor_line(row["anchor"], ranks,
                               read_jsonl(out / "anchors" / f"{first['anchor_key']}.rep{n}.jsonl"))
            info["anchor"] = line
            if line:
                anchors.append(line["tok_s"])
                anchor_mem.append(line.get("mem_gib"))
        row["reps"].append(info)
    if runs:
        dur = np.concatenate([r["dur"] for r in runs])
        tok = np.concatenate([r["tokens"] for r in runs])
        row.update(tok_s=float(np.median(tok / dur)), step_s=float(np.median(dur)),
                   steps_measured=int(dur.size), peak_bytes=median(r["peak"] for r in runs),
                   mfu=median(np.concatenate([r["mfu"] for r in runs])), loss=runs[-1]["loss"],
                   config=runs[0]["config"], tokens_per_step=float(np.median(tok)))
    if anchors:
        row["anchor_tok_s"] = median(anchors)
        row["anchor_gib"] = median(anchor_mem)
        if "tok_s" in row:
            row["vs_anchor"] = row["tok_s"] / row["anchor_tok_s"]
    elif row["anchor"] != "-" and row["anchor"] != "comm":
        problems.append(f"no line of anchor {row['anchor']} (anchors/{first['anchor_key']}.rep*.jsonl, .err)")
    if problems:
        row.update(ok=False, status="failed: " + "; ".join(problems))
    elif expect != 0:
        row["status"] = f"ok (rc {expect}, as expected)"
    elif "plan" in row:
        row["status"] = "ok: " + plan_note(row["plan"])
    elif row["program"] in TRAINERS:
        row["status"] = "ok"
    else:
        row["status"] = f"ok (output: logs/{row['name']}.rep1.log)"
    return row


def add_base_ratios(rows: List[Dict]) -> None:
    by_name = {r["name"]: r for r in rows}
    for r in rows:
        base = by_name.get(r["base"])
        if base is None or "tok_s" not in r:
            continue
        if "tok_s" in base:
            r["vs_base"] = r["tok_s"] / base["tok_s"]
        elif "plan" in base:
            step = plan_prediction(base["plan"], r["config"])
            if step:
                r["predicted_step_s"] = step
                r["vs_base"] = step / r["step_s"]


def build(out: Path, warmup: int, meta: Dict[str, str]) -> Dict[str, object]:
    entries = read_tsv(out / "rows.tsv", ROW_FIELDS)
    if not entries:
        raise RunError(f"{out / 'rows.tsv'}: no rows ran")
    names = list(dict.fromkeys(e["name"] for e in entries))
    rows = [summarise_row(out, [e for e in entries if e["name"] == n], warmup) for n in names]
    add_base_ratios(rows)
    anchors = []
    for e in read_tsv(out / "anchors.tsv", ANCHOR_FIELDS) if (out / "anchors.tsv").exists() else []:
        a = next((x for x in anchors if x["key"] == e["key"]), None)
        if a is None:
            a = dict(key=e["key"], command=e["command"], reps=[])
            anchors.append(a)
        lines = read_jsonl(out / "anchors" / f"{e['key']}.rep{e['rep']}.jsonl")
        a["reps"].append(dict(rep=int(e["rep"]), rc=int(e["rc"]), seconds=float(e["seconds"]), lines=lines))
        a["ok"] = a.get("ok", True) and int(e["rc"]) == 0 and all("error" not in x for x in lines)
    matrix = meta.get("matrix") or str(out / "matrix.tsv")
    title = meta.get("title") or Path(matrix).stem
    repeat = max(int(e["rep"]) for e in entries)
    doc = dict(title=title, matrix=matrix, command=meta.get("command") or "?",
               commit=meta.get("commit") or "?", date=meta.get("date") or "?",
               machine=(out / "machine.txt").read_text().strip() if (out / "machine.txt").exists() else "?",
               warmup_steps=warmup, repeat=repeat, rows=rows, anchors=anchors,
               tok_s_definition=tok_s_note(warmup))
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m analysis.matrix_table",
                                 description="The table of one scripts/benchmark output directory.")
    ap.add_argument("out", type=Path, help="scripts/benchmark's output directory")
    ap.add_argument("--warmup", type=int, default=8, help="steps dropped at the start of every run (default 8)")
    for k in ("matrix", "command", "commit", "date", "title"):
        ap.add_argument(f"--{k}", default="", help=f"the run's {k}, for README.md")
    a = ap.parse_args(argv)
    try:
        doc = build(a.out, a.warmup, vars(a))
    except RunError as e:
        print(f"matrix_table: error: {e}", file=sys.stderr)
        return 2
    text = text_table(doc["rows"]) + "\n" + textwrap.fill(tok_s_note(a.warmup), 100) + "\n"
    (a.out / "table.txt").write_text(text)
    public = dict(doc, rows=[{k: v for k, v in r.items() if k != "plan"} for r in doc["rows"]])
    write_json(a.out / "table.json", public)
    (a.out / "README.md").write_text(readme(a.out, doc, doc["rows"], doc["anchors"]))
    sys.stdout.write(text)
    failed = [r["name"] for r in doc["rows"] if not r["ok"]] + [x["key"] for x in doc["anchors"] if not x["ok"]]
    if failed:
        print(f"matrix_table: not as expected: {' '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
