"""matplotlib (Agg) figures: HW5's four bar charts, step-time breakdown, loss curves, and the
sweeps (throughput vs world size, vs micro-batches M with the ideal M/(M+n-1) curve).

A figure made from a run whose ranks shared a GPU (reader.shared_gpu_note) says so in its title:
"2 ranks shared one GPU: timings are functional, not speed figures"."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter, ScalarFormatter  # noqa: E402

from analysis import metrics  # noqa: E402
from analysis import numbers as fmt  # noqa: E402
from analysis.reader import Run, shared_gpu_note  # noqa: E402

PHASE_COLORS = {"data": "#9e9e9e", "forward": "#4c72b0", "backward": "#dd8452",
                "sync_exposed": "#c44e52", "optimizer": "#55a868", "other": "#d9d9d9"}
PHASE_LABELS = {"data": "data", "forward": "forward", "backward": "backward",
                "sync_exposed": "exposed sync", "optimizer": "optimizer", "other": "other"}
# The analysis's tokens/s on an axis (metrics.TOK_S_DEFINITION).
TOK_S_AXIS = f"{metrics.TOK_S_LABEL}\n{metrics.TOK_S_AGGREGATE}"


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return path


def tokens_axis(axis) -> None:
    """Ticks of a tokens/s axis as a reader reads them: 50k, 100k, 1.5M (never 1e5 or an offset)."""
    axis.set_major_formatter(FuncFormatter(lambda v, _: fmt.count(v, trim=True)))


def plain_axis(axis) -> None:
    """Ticks as plain numbers: no scientific notation, no offset."""
    f = ScalarFormatter(useOffset=False)
    f.set_scientific(False)
    axis.set_major_formatter(f)


def titled(title: str, note: Optional[str], width_in: float, fontsize: float = 11) -> str:
    """`title`, then the shared-GPU `note` (if any) on lines of its own that fit a figure
    `width_in` inches wide: split after its ": " (and "; ") when it is longer than a line."""
    if not note:
        return title
    chars = max(20, int(width_in * 72 / (0.6 * fontsize)))  # about 0.6 em per character
    lines = [note] if len(note) <= chars else note.replace("; ", ";\n").replace(": ", ":\n").split("\n")
    return title + "\n" + "\n".join(textwrap.fill(line, chars) for line in lines)


def points_note(points: Sequence[Dict]) -> Optional[str]:
    """The shared-GPU notes of sweep points (cmd_sweep sets "note" where a run's ranks shared a
    GPU), one per line; None when none did."""
    notes = []
    for p in points:
        if p.get("ranks_share_gpu") and p.get("note") and p["note"] not in notes:
            notes.append(p["note"])
    return "\n".join(notes) or None


def _device_word(run: Optional[Run]) -> str:
    if run is None:
        return "GPU"
    dev = str(run.ranks[0].attrs.get("device", ""))
    return "GPU" if dev.startswith("cuda") else "CPU rank"


def _bars(path, title, ylabel, labels, means, stds, note="", tokens=False, shared=None, ns=None):
    """Bars of mean ± std, each labelled with both to the same decimal place (numbers.mean_pm):
    "107.667k ± 0.042k tok/s" (tokens) or "8.5598 ± 0.0087 s"; a bar of one sample (its `ns`
    entry 1) "336.6 tok/s (n=1)". `shared`: the shared-GPU note, added under the title."""
    fig, ax = plt.subplots(figsize=(5.5, 4.2 + (0.5 if shared else 0)))
    x = np.arange(len(labels))
    colors = ["#4c72b0", "#dd8452"]
    bars = ax.bar(x, means, yerr=stds, capsize=8, color=colors[: len(labels)], width=0.55,
                  error_kw={"elinewidth": 1.5})
    for b, m, s, n in zip(bars, means, stds, ns or [None] * len(means)):
        if np.isfinite(m):
            text = fmt.mean_pm(m, s, n, suffix=tokens)
            unit = " tok/s" if tokens else " s"
            text = text[:-6] + unit + " (n=1)" if text.endswith(" (n=1)") else text + unit
            ax.annotate(text, (b.get_x() + b.get_width() / 2, m + (s or 0)),
                        xytext=(0, 4), textcoords="offset points", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(x, labels)
    ax.set_ylabel(ylabel)
    ax.set_title(titled(title + (f"\n{note}" if note else ""), shared, 5.5), fontsize=11)
    ax.set_ylim(0, max([m + (s or 0) for m, s in zip(means, stds) if np.isfinite(m)] + [1e-9]) * 1.25)
    (tokens_axis if tokens else plain_axis)(ax.yaxis)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


HW5_TOK_DP_AXIS = "HW5 tokens/s: sum over ranks of\neach rank's padded tokens / its time"
HW5_TOK_PP_AXIS = "HW5 tokens/s: mean over stages of\neach stage's padded tokens / its time"
HW5_TIME_AXIS = "HW5 training time per epoch (s):\nmean over ranks"


def hw5_plots(summary: Dict, out_dir, runs: Dict[str, Optional[Run]],
              samples: Optional[Dict[str, int]] = None) -> List[Path]:
    """HW5's ddp_training_time.png, ddp_tokens_per_second.png, pp_training_time.png,
    pp_tokens_per_second.png (mean ± population std over the epochs after warm-up), HW5's metrics
    as HW5 defines them, their axes saying which (metrics.HW5_TOK_DP_DEFINITION, ...). A section
    whose ranks shared a GPU (its "note" in `summary`) says so under each of its titles, and the
    data-parallel bar names ranks and GPUs: "(2 ranks on 1 GPU)". `samples`: the epochs averaged
    per run ("single_gpu", "two_gpu", "model_parallel", "pipeline_parallel"), where known: a
    run of one says n=1 instead of a spread."""
    out_dir = Path(out_dir)
    samples = samples or {}
    made = []
    drop = summary["config"]["warmup_epochs_dropped"]
    dp, pp = summary.get("data_parallel"), summary.get("pipeline_parallel")
    if dp:
        multi = runs.get("dp_multi")
        dev = _device_word(multi)
        shared = dp.get("note")
        if multi is not None and multi.shares_gpu:
            gpus = len({(r.attrs.get("host"), r.attrs.get("device")) for r in multi.ranks})
            second = f"Data Parallel\n({multi.world_size} ranks on {gpus} GPU{'s' if gpus > 1 else ''})"
        else:
            second = f"Data Parallel\n({multi.world_size} {dev}s)" if multi else "Data Parallel"
        labels = [f"Single {dev}", second]
        a, b = dp["single_gpu"], dp["two_gpu"]
        made.append(_bars(out_dir / "ddp_training_time.png", "Data parallel: training time per epoch",
                          HW5_TIME_AXIS, labels, [a["time_mean"], b["time_mean"]],
                          [a["time_std"], b["time_std"]],
                          f"{fmt.ratio(dp['speedup_time_reduction_x'], 2)} faster, warm-up epochs dropped: {drop}",
                          shared=shared, ns=[samples.get("single_gpu"), samples.get("two_gpu")]))
        made.append(_bars(out_dir / "ddp_tokens_per_second.png", "Data parallel: HW5 throughput",
                          HW5_TOK_DP_AXIS, labels, [a["tok_mean"], b["tok_mean"]],
                          [a["tok_std"], b["tok_std"]],
                          f"{fmt.ratio(dp['speedup_throughput_x'], 2)} throughput, warm-up epochs dropped: {drop}",
                          tokens=True, shared=shared, ns=[samples.get("single_gpu"), samples.get("two_gpu")]))
    if pp:
        m = summary["config"].get("pipeline_n_chunk")
        labels = ["Model Parallel", f"Pipeline Parallel\n(M = {m})"]
        shared = pp.get("note")
        a, b = pp["model_parallel"], pp["pipeline_parallel"]
        made.append(_bars(out_dir / "pp_training_time.png", "Pipeline parallel: training time per epoch",
                          HW5_TIME_AXIS, labels, [a["time_mean"], b["time_mean"]],
                          [a["time_std"], b["time_std"]],
                          f"{fmt.ratio(pp['speedup_time_reduction_x'], 2)} faster, warm-up epochs dropped: {drop}",
                          shared=shared, ns=[samples.get("model_parallel"), samples.get("pipeline_parallel")]))
        made.append(_bars(out_dir / "pp_tokens_per_second.png", "Pipeline parallel: HW5 throughput",
                          HW5_TOK_PP_AXIS, labels, [a["tok_mean"], b["tok_mean"]],
                          [a["tok_std"], b["tok_std"]],
                          f"{fmt.ratio(pp['speedup_throughput_x'], 2)} throughput, warm-up epochs dropped: {drop}",
                          tokens=True, shared=shared,
                          ns=[samples.get("model_parallel"), samples.get("pipeline_parallel")]))
    return made


# What the step breakdown's phases hold, under the plot (the trainers' step code: dp_trainer.cpp,
# pipeline_step.cpp; the columns: include/gpt2p/io/run_record.h).
HEAD_NOTE = ("forward includes the LM head's backward: its hidden-state and weight gradients are "
             "computed in the forward pass (include/gpt2p/model/lm_head_loss.h), so backward is "
             "the transformer blocks' backward alone")
DP_SYNC_NOTE = ("exposed sync: the wait for the gradient all-reduce after backward; optimizer: "
                "gradient clipping and the loss-scale check (where on) and the AdamW step")
PP_SYNC_NOTE = ("exposed sync: waits for activations and gradients from the neighbouring stages, "
                "then the tied embedding/LM-head gradient summed between the first and the last "
                "stage{replicas}; optimizer: gradient clipping and the loss-scale agreement (where "
                "on) and the AdamW step")


def step_notes(run: Run) -> List[str]:
    """The step breakdown's caption, one entry per sentence: what forward, exposed sync and
    optimizer hold for this run's trainer."""
    if run.is_pipeline:
        notes = ["the last stage's " + HEAD_NOTE,
                 PP_SYNC_NOTE.format(replicas=", and each stage's gradients over the replicas"
                                     if run.dp > 1 else "")]
    else:
        notes = [HEAD_NOTE, DP_SYNC_NOTE]
    return [n[0].upper() + n[1:] for n in notes]


def step_breakdown_plot(run: Run, path, warmup: Optional[int] = None) -> Path:
    """Stacked bars per rank: mean seconds per step in each phase, with a caption (step_notes)
    that says what the phases hold: the LM head's backward is timed as forward."""
    rows = metrics.step_breakdown(run, warmup)
    note = shared_gpu_note([run])
    width = max(4.5, 1.2 * len(rows) + 3)
    caption = "\n".join(textwrap.fill(t + ".", int(width * 72 / (0.6 * 8))) for t in step_notes(run))
    fig, ax = plt.subplots(figsize=(width, 4.2 + (0.5 if note else 0) + 0.14 * (caption.count("\n") + 1)))
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    scale, unit = (1e3, "ms") if max(r["total"] for r in rows) < 1 else (1.0, "s")
    for p in list(metrics.PHASES) + ["other"]:
        vals = np.array([r[p] for r in rows]) * scale
        ax.bar(x, vals, bottom=bottom, color=PHASE_COLORS[p], label=PHASE_LABELS[p], width=0.6)
        bottom += vals
    ax.set_xticks(x, [f"replica {r['replica']}\nrank {r['pp_rank']}" if "replica" in r
                      else f"rank {r['rank']}" for r in rows])
    ax.set_ylabel(f"mean time per step ({unit})")
    plain_axis(ax.yaxis)
    ax.set_title(titled(f"Step time breakdown: {run.label()}\n({rows[0]['steps']} steps per rank after "
                        "warm-up)", note, width - 1.5), fontsize=11)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    # The caption, under the rank labels (an axes text: tight_layout keeps room for it).
    ax.annotate(caption, xy=(0, 0), xycoords="axes fraction", xytext=(0, -42 if "replica" in rows[0] else -30),
                textcoords="offset points", ha="left", va="top", fontsize=8, color="#333333",
                gid="step-notes")
    return _save(fig, path)


def loss_plot(runs: Sequence[Run], path) -> Path:
    """Train loss per step (the model's rank) and validation loss per epoch, one colour per run."""
    note = shared_gpu_note(runs)
    fig, ax = plt.subplots(figsize=(7, 4.2 + (0.3 if note else 0)))
    for i, run in enumerate(runs):
        color = f"C{i}"
        r = metrics.loss_rank(run)
        s, e = r.table("steps"), r.table("epochs")
        if s and len(s["step"]):
            ax.plot(s["step"], s["loss"], color=color, lw=1.2, alpha=0.8, label=f"{run.name} ({run.label()}): train")
            if e and len(e["epoch"]):
                # validation runs after the last step of each epoch
                ends = [s["step"][s["epoch"] == ep].max() + 1 for ep in e["epoch"] if (s["epoch"] == ep).any()]
                ax.plot(ends, e["val_loss"][: len(ends)], "o--", color=color, ms=6,
                        label=f"{run.name}: validation")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy loss (nats/token)")
    ax.set_title(titled("Loss curves (train per step, validation per epoch)", note, 7), fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def world_size_plot(points: List[Dict], path, note: Optional[str] = None) -> Path:
    """Throughput (the points' tok_s_mean ± tok_s_std: the analysis's tokens/s, TOK_S_AXIS) vs
    world size, with the linear-scaling line from the smallest world. `note` (the runs' shared-GPU
    note; default: the points') goes under the title."""
    note = note or points_note(points)
    fig, ax = plt.subplots(figsize=(6, 4.2 + (0.5 if note else 0)))
    by_prog: Dict[str, List[Dict]] = {}
    for p in points:
        by_prog.setdefault(p["program"], []).append(p)
    for i, (prog, pts) in enumerate(sorted(by_prog.items())):
        pts = sorted(pts, key=lambda p: p["world_size"])
        w = np.array([p["world_size"] for p in pts])
        t = np.array([p["tok_s_mean"] for p in pts])
        ax.errorbar(w, t, yerr=[p["tok_s_std"] for p in pts], fmt="o-", capsize=5, color=f"C{i}",
                    label=f"{prog} measured")
        if prog != "pp_train":
            ax.plot(w, t[0] * w / w[0], ":", color=f"C{i}", label=f"{prog} linear scaling")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel(TOK_S_AXIS)
    tokens_axis(ax.yaxis)
    ax.set_xticks(sorted({p["world_size"] for p in points}))
    ax.set_title(titled("Throughput vs world size", note, 6), fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    return _save(fig, path)


def microbatch_plot(points: List[Dict], path, predicted: Optional[List[Dict]] = None,
                    note: Optional[str] = None) -> Path:
    """Pipeline throughput (the points' tok_s_mean ± tok_s_std: the analysis's tokens/s,
    TOK_S_AXIS) vs micro-batches M per schedule, with the ideal M/(M+n-1) curve scaled
    so that its asymptote is the no-bubble throughput (stages x model-parallel throughput when a
    model_parallel run is given, else fitted to the best measured point). `predicted`
    (metrics.plan_points) adds pp_plan's prediction per schedule as dashed lines, scaled so that its
    model-parallel point meets the measured model-parallel run when there is one. `note` (the
    runs' shared-GPU note; default: the points') goes under the title."""
    note = note or points_note(points)
    fig, ax = plt.subplots(figsize=(6.5, 4.2 + (0.5 if note else 0)))
    pipe = [p for p in points if p.get("mode") != "model_parallel"]
    mp = [p for p in points if p.get("mode") == "model_parallel"]
    n = max([p.get("pp", p["world_size"]) for p in points] + [1])  # ranks per pipeline
    scheds = sorted({p["schedule"] for p in pipe} | {p["schedule"] for p in predicted or []
                                                     if p["schedule"] != "model_parallel"})
    for i, sched in enumerate(scheds):
        pts = sorted([p for p in pipe if p["schedule"] == sched], key=lambda p: p["microbatches"])
        if pts:
            ax.errorbar([p["microbatches"] for p in pts], [p["tok_s_mean"] for p in pts],
                        yerr=[p["tok_s_std"] for p in pts], fmt="o-", capsize=5, color=f"C{i}",
                        label=f"{sched} measured")
        pred = [p for p in predicted or [] if p["schedule"] == sched]
        if pred:
            # Relative to the model-parallel prediction, on the measured model-parallel scale: the
            # plan leaves out per-step costs every mode pays (optimizer, data, evaluation).
            scale = mp[0]["tok_s_mean"] / pred[0]["model_parallel_tok_s"] if mp else 1.0
            # Alternate dash styles so that coinciding predictions (equal stages) both stay visible.
            ax.plot([p["microbatches"] for p in pred], [p["tok_s"] * scale for p in pred],
                    marker="x", ls=("--", "-.")[i % 2], lw=1.5 + (i % 2 == 0), color=f"C{i}", alpha=0.8, label=f"{sched} predicted (pp_plan{', scaled' if mp else ''})")
    ms = sorted({p["microbatches"] for p in points} | {p["microbatches"] for p in predicted or []} | {1})
    grid = np.linspace(1, max(ms), 200)
    if mp:
        peak = n * mp[0]["tok_s_mean"]
        ax.axhline(mp[0]["tok_s_mean"], color="gray", ls="--", lw=1, label="model parallel (M = 1)")
        how = "n × model-parallel"
    else:
        peak = max(p["tok_s_mean"] / (p["microbatches"] / (p["microbatches"] + n - 1)) for p in pipe)
        how = "fitted"
    ax.plot(grid, peak * grid / (grid + n - 1), "k:", label=f"ideal M/(M+n-1), n={n} ({how} peak)")
    # Interleaved schedules ("interleaved xV"): V stages per rank shrink the bubble V-fold.
    for v in sorted({int(m.group(1)) for m in (re.search(r" x(\d+)$", sc) for sc in scheds) if m}):
        ax.plot(grid, peak * v * grid / (v * grid + n - 1), color="gray", ls=(0, (1, 3)),
                label=f"ideal VM/(VM+n-1), V={v}")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("micro-batches per step M (n_chunk)")
    ax.set_ylabel(TOK_S_AXIS)
    tokens_axis(ax.yaxis)
    ax.set_xticks(ms)
    ax.set_title(titled("Pipeline throughput vs micro-batches", note, 6.5), fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
