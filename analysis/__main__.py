"""python3 -m analysis {summarize,watch,hw5,timeline,sweep} ...; see --help of each."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from analysis import metrics, plots, report_html, summary, timeline, watch
from analysis import numbers as fmt
from analysis.reader import Run, RunError, find_runs, read_run, shared_gpu_note, warn

EXIT_BELOW_THRESHOLD = 2


def _expand(paths: List[str], allow_missing: bool) -> List[Run]:
    """Each path is a run directory or a directory holding run directories."""
    runs = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            if allow_missing:
                warn(f"{path}: does not exist, skipped")
                continue
            raise RunError(f"{path}: no such run directory")
        dirs = find_runs(path)
        if not dirs:
            raise RunError(f"{path}: no rank<r>.h5 files here or below; pass a trainer's --out directory")
        runs.extend(read_run(d) for d in dirs)
    if not runs:
        raise RunError("none of the given run directories exists: " + " ".join(paths))
    return runs


def _unique_names(runs: List[Run]) -> List[str]:
    names, seen = [], {}
    for r in runs:
        base = r.name or "run"
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return names


def pm_column(cells: Sequence[Tuple[float, Optional[float], Optional[int]]], suffix: bool = True) -> List[str]:
    """(mean, spread, n) per row as "value ± spread" (numbers.pm_parts), the ± signs of the
    column one under the other; one sample: "value (n=1)"."""
    parts = [fmt.pm_parts(m, sd, n, suffix) for m, sd, n in cells]
    width = max([len(v) for v, _ in parts] + [0])
    out = []
    for (v, sd), (_, _, n) in zip(parts, cells):
        if sd is not None:
            out.append(f"{v:>{width}} ± {sd}")
        else:
            out.append(f"{v:>{width}}" + (" (n=1)" if n == 1 and v != fmt.MISSING else ""))
    return out


def table(head: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> List[str]:
    """Lines of a plain-text table: the header as a comment ("# ..."), then the rows indented two
    spaces; the columns in `right` right-aligned."""
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]

    def line(cells):
        return "  ".join(c.rjust(w) if j in right else c.ljust(w)
                         for j, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return ["# " + line(head)] + ["  " + line(r) for r in rows]


def comment(text: str, width: int = 100) -> str:
    """`text` as "# " lines of at most `width` characters."""
    return "\n".join(textwrap.wrap(text, width - 2, initial_indent="# ", subsequent_indent="#   "))


def _epochs_used(p: Dict) -> str:
    """"2 +1 warm-up": the epochs averaged and the warm-up epochs dropped before them."""
    n, w = len(p["epochs_used"]), p["warmup_epochs_dropped"]
    return f"{n} +{w} warm-up" if w else str(n)


def cmd_summarize(args) -> int:
    runs = _expand(args.runs, allow_missing=True)
    out = Path(args.out)
    rows = []
    for run, name in zip(runs, _unique_names(runs)):
        s = summary.run_summary(run, args.warmup_epochs)
        d = out / name
        summary.write_json(d / "metrics.json", s)
        figs = report_html.draw(run, d, args.warmup_epochs)
        report_html.write_text(d / "index.html", report_html.run_page(run, s, figs))
        rows.append({"name": name, **s})
    perf = [r["performance"] for r in rows]
    tput = [r["throughput"] for r in rows]
    times = pm_column([(p["time_mean"], p["time_std"], len(p["epochs_used"])) for p in perf], suffix=False)
    toks = pm_column([(t["tok_s_mean"], t["tok_s_std"], len(t["epochs_used"])) for t in tput])
    print(comment(metrics.TOK_S_DEFINITION + " (analysis/README.md)."))
    print(comment("time/epoch: " + metrics.HW5_TIME_DEFINITION.split(": ", 1)[1] + "."))
    head = ["run", "program", "ranks", "epochs", "time/epoch s", metrics.TOK_S_LABEL, "val loss"]
    cells = [[r["name"], r["program"], str(r["world_size"]), _epochs_used(p), t, k,
              fmt.sig(r["losses"]["final_val_loss"], 4)]
             for r, p, t, k in zip(rows, perf, times, toks)]
    print("\n".join(table(head, cells, right=(2, 6))))
    summary.write_json(out / "summary.json", {"runs": rows})
    if len(rows) > 1:
        report_html.write_text(out / "index.html", report_html.index_page(rows))
    plots.loss_plot(runs, out / "loss_curves.png")
    note = shared_gpu_note(runs)
    if note:
        print(f"note: {note} (runs: {', '.join(r['name'] for r in rows if r.get('ranks_share_gpu'))})")
    pages = f"{out}/{rows[0]['name']}/index.html" if len(rows) == 1 else f"{out}/index.html links them"
    print(f"wrote {out}/summary.json and per run metrics.json, plots and a page ({pages})")
    return 0


def _thresholds(args) -> Dict[str, float]:
    return {"dp_time": args.dp_time_threshold, "dp_throughput": args.dp_throughput_threshold,
            "pp_time": args.pp_time_threshold, "pp_throughput": args.pp_throughput_threshold}


def cmd_hw5(args) -> int:
    given = {"dp_single": args.dp_single, "dp_multi": args.dp_multi,
             "pp_model": args.pp_model_parallel, "pp_pipeline": args.pp_pipeline}
    if not any(given.values()):
        raise RunError("hw5: pass at least --dp-single and --dp-multi, or --pp-model-parallel and "
                       "--pp-pipeline")
    runs = {k: read_run(v) if v else None for k, v in given.items()}
    s = summary.hw5_summary(runs["dp_single"], runs["dp_multi"], runs["pp_model"],
                            runs["pp_pipeline"], args.warmup_epochs)
    out = Path(args.out)
    summary.write_json(out / "performance_summary.json", s)
    details = {k: summary.run_summary(r, args.warmup_epochs) for k, r in runs.items() if r}
    summary.write_json(out / "hw5_details.json", details)
    run_of = {"single_gpu": "dp_single", "two_gpu": "dp_multi", "model_parallel": "pp_model",
              "pipeline_parallel": "pp_pipeline"}
    samples = {k: len(details[r]["performance"]["epochs_used"]) for k, r in run_of.items() if r in details}
    plots.hw5_plots(s, out, {"dp_multi": runs["dp_multi"], "pp_pipeline": runs["pp_pipeline"]}, samples)
    print(f"# HW5 summary (warm-up epochs dropped: {s['config']['warmup_epochs_dropped']}; "
          "HW5's metrics as HW5 defines them)")
    if s.get("ranks_share_gpu"):
        print(f"# note: {s['note']}")
    sections = [(sec, keys) for sec, keys in (("data_parallel", ("single_gpu", "two_gpu")),
                                              ("pipeline_parallel", ("model_parallel", "pipeline_parallel")))
                if s[sec] is not None]
    print(comment(metrics.HW5_TIME_DEFINITION + "."))
    for sec, _ in sections:
        print(comment(f"{sec}: {s[sec]['tokens_per_sec_definition']}."))
    stats = [s[sec][k] for sec, keys in sections for k in keys]
    n = [samples[k] for _, keys in sections for k in keys]
    times = pm_column([(v["time_mean"], v["time_std"], m) for v, m in zip(stats, n)], suffix=False)
    toks = pm_column([(v["tok_mean"], v["tok_std"], m) for v, m in zip(stats, n)])
    cells = [[sec, k] for sec, keys in sections for k in keys]
    print("\n".join(table(["section", "run", "HW5 time/epoch s", "HW5 tok/s"],
                          [c + [t, k] for c, t, k in zip(cells, times, toks)])))
    for sec, _ in sections:
        v = s[sec]
        print(f"  {sec}: speedup: time {fmt.ratio(v['speedup_time_reduction_x'])}, "
              f"throughput {fmt.ratio(v['speedup_throughput_x'])}")
    print(f"wrote {out}/performance_summary.json and the HW5 plots")
    if args.grade:
        failures = summary.grade(s, _thresholds(args))
        if failures:
            print("GRADE: below threshold:")
            for f in failures:
                print(f"  - {f}")
            return EXIT_BELOW_THRESHOLD
        print("GRADE: pass (every speedup at or above its threshold)")
    return 0


def cmd_timeline(args) -> int:
    run = read_run(args.run)
    made = timeline.write_timeline(run, args.out, args.step)
    print("wrote " + ", ".join(str(p) for p in made))
    return 0


def cmd_sweep(args) -> int:
    runs = _expand(args.runs, allow_missing=False)
    out = Path(args.out)
    world_pts, m_pts = [], []
    for run in runs:
        p = metrics.run_performance(run, args.warmup_epochs)
        t = metrics.throughput(run, args.warmup_epochs)
        # tok_s_*: the analysis's tokens/s (what the plots draw); tok_* and time_*: HW5's.
        pt = {"run": str(run.path), "program": run.program, "world_size": run.world_size,
              "tok_s_mean": t["tok_s_mean"], "tok_s_std": t["tok_s_std"],
              "tok_mean": p["tok_mean"], "tok_std": p["tok_std"], "time_mean": p["time_mean"],
              "time_std": p["time_std"]}
        note = shared_gpu_note([run])
        if note:
            pt.update(ranks_share_gpu=True, note=note)
        if run.is_pipeline:
            c = run.config
            pt.update(mode=c.get("mode", "pipeline"), schedule=run.schedule,
                      microbatches=int(c.get("microbatches", 1)))
            if run.hybrid:
                pt.update(dp=run.dp, pp=run.pp)
            b = metrics.bubble(run)
            if b:
                pt["bubble_measured"], pt["bubble_ideal"] = b["measured"], b["ideal"]
            m_pts.append(pt)
        else:
            world_pts.append(pt)
    predicted = None
    pipe_runs = [r for r in runs if r.is_pipeline]
    if args.plan:
        if not pipe_runs:
            raise RunError(f"--plan {args.plan}: none of the runs is a pp_train run to compare it with")
        try:
            plan = json.loads(Path(args.plan).read_text())
        except (OSError, ValueError) as e:
            raise RunError(f"--plan {args.plan}: cannot read pp_plan's JSON ({e}); pass pp_plan --json-out's file")
        c = pipe_runs[0].config
        try:
            predicted = metrics.plan_points(plan, c.get("partition", "balanced"), int(c["batch_size"]),
                                            int(c["seq_len"]), pipe_runs[0].pp)
        except (ValueError, KeyError) as e:
            raise RunError(f"--plan {args.plan}: {e}")
    summary.write_json(out / "sweep.json", {
        "world_size": world_pts, "microbatches": m_pts, "predicted": predicted or [],
        "definitions": {"tok_s_mean": metrics.TOK_S_DEFINITION,
                        "tok_mean": f"dp_train, gpt2_train: {metrics.HW5_TOK_DP_DEFINITION}; "
                                    f"pp_train: {metrics.HW5_TOK_PP_DEFINITION}",
                        "time_mean": metrics.HW5_TIME_DEFINITION}})
    made = []
    if world_pts:
        made.append(plots.world_size_plot(world_pts, out / "throughput_vs_world_size.png",
                                          note=shared_gpu_note([r for r in runs if not r.is_pipeline])))
    if [p for p in m_pts if p["mode"] != "model_parallel"]:
        made.append(plots.microbatch_plot(m_pts, out / "throughput_vs_microbatches.png", predicted,
                                          note=shared_gpu_note(pipe_runs)))
    print(f"wrote {out}/sweep.json" + "".join(f", {p}" for p in made))
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m analysis", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    warm = dict(type=int, default=None, metavar="N",
                help="warm-up epochs to drop (default: each run's config.warmup_epochs)")

    s = sub.add_parser("summarize", help="per-run metrics JSON, plots and an HTML page for each run directory")
    s.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="trainer --out directories, or directories holding them (missing ones are skipped)")
    s.add_argument("--out", required=True, help="output directory")
    s.add_argument("--warmup-epochs", **warm)
    s.set_defaults(fn=cmd_summarize)

    v = sub.add_parser("watch", help="a run's page, rewritten while the run goes on, until it finishes")
    v.add_argument("run", metavar="RUN_DIR", help="the --out directory of a running (or finished) trainer")
    v.add_argument("--out", required=True, help="output directory: index.html, metrics.json, plots")
    v.add_argument("--every", type=float, default=10.0, metavar="SECONDS",
                   help="seconds between two reads of the rank files; the page reloads as often "
                        "(default: 10)")
    v.add_argument("--warmup-epochs", **warm)
    v.set_defaults(fn=watch.cmd_watch)

    h = sub.add_parser("hw5", help="HW5's performance_summary.json and its four plots")
    h.add_argument("--dp-single", help="dp_train/gpt2_train run on 1 rank (HW5: batch 64)")
    h.add_argument("--dp-multi", help="dp_train run on 2 ranks (HW5: global batch 128)")
    h.add_argument("--pp-model-parallel", help="pp_train --mode model_parallel run")
    h.add_argument("--pp-pipeline", help="pp_train --mode pipeline run")
    h.add_argument("--out", required=True, help="output directory")
    h.add_argument("--warmup-epochs", **warm)
    h.add_argument("--grade", action="store_true",
                   help=f"exit {EXIT_BELOW_THRESHOLD} when a speedup is below its threshold")
    for flag, key in (("--dp-time-threshold", "dp_time"), ("--dp-throughput-threshold", "dp_throughput"),
                      ("--pp-time-threshold", "pp_time"), ("--pp-throughput-threshold", "pp_throughput")):
        d = summary.DEFAULT_THRESHOLDS[key]
        h.add_argument(flag, type=float, default=d, metavar="X",
                       help=f"minimum speedup, x (default: {d}, HW5)")
    h.set_defaults(fn=cmd_hw5)

    t = sub.add_parser("timeline", help="pipeline Gantt chart (PNG) and Chrome trace (JSON)")
    t.add_argument("run", metavar="RUN_DIR", help="a pp_train --out directory")
    t.add_argument("--out", required=True, help="output directory")
    t.add_argument("--step", type=int, default=None,
                   help="optimizer step drawn in the Gantt chart (default: first after warm-up)")
    t.set_defaults(fn=cmd_timeline)

    w = sub.add_parser("sweep", help="throughput vs world size (dp) and vs micro-batches M (pp)")
    w.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories or their parents")
    w.add_argument("--out", required=True, help="output directory")
    w.add_argument("--warmup-epochs", **warm)
    w.add_argument("--plan", default=None, metavar="PLAN_JSON",
                   help="pp_plan --json-out file: draw its predicted throughput for the runs' partition")
    w.set_defaults(fn=cmd_sweep)
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except RunError as e:
        print(f"analysis: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
