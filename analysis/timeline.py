"""Pipeline timelines from the /actions table: a Gantt chart of one step (one row per rank, a box
per forward/backward micro-batch, communication as thin boxes below, bubbles left blank; with
several stages per rank (interleaved) the later stages' boxes are hatched and labelled
"micro-batch/stage") and the whole run as a Chrome/Perfetto trace (chrome://tracing or
ui.perfetto.dev). A run of D data-parallel replicas (pp_train --dp D) shows every replica: one row
per world rank, replica 0's P rows first, each replica's rows set apart from the next and labelled
"replica d, rank p"; in the trace each world rank is a process named "replica d rank p".

The time between a rank's last schedule action and its optimizer is not a bubble: pp_train sums
the gradients there (pipeline_step.cpp: the wait for the rank's last sends, the tied
embedding/LM-head gradient summed between the first and the last stage, with --dp the stages'
gradients over the replicas; /steps sync_exposed counts it). The chart draws it as a dotted box
labelled "grad sync", the trace as a "grad sync" event (derived from the actions' times).

Times are each rank's own clock (seconds since that rank started the run), moved onto the last
stage's clock by metrics.clock_offset (the loss broadcast that ends every step is the common
point), so stages line up even when ranks started apart or run on different nodes.

When the run's ranks shared a GPU (reader.shared_gpu_note) the chart's title and the trace's
otherData say so: their timings are functional, not speed figures."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Dict, List, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402
import numpy as np  # noqa: E402

from analysis import metrics  # noqa: E402
from analysis.plots import plain_axis, titled  # noqa: E402
from analysis.reader import Run, RunError, shared_gpu_note  # noqa: E402
from analysis.summary import write_json  # noqa: E402

OP_COLORS = {0: "#4c72b0", 1: "#dd8452", 2: "#8172b3", 3: "#937860", 4: "#da8bc3", 5: "#8c8c8c",
             6: "#55a868", 7: "#c44e52"}
OP_SHORT = {0: "F", 1: "B", 2: "send act", 3: "recv act", 4: "send grad", 5: "recv grad", 6: "opt",
            7: "W"}


def _require_actions(run: Run) -> Dict[str, np.ndarray]:
    a = metrics.actions(run)
    if a["step"].size == 0:
        raise RunError(f"{run.path}: no /actions rows; timelines need a pp_train run "
                       "(dp_train and gpt2_train do not record schedule actions)")
    return a


def pick_step(run: Run, step: Optional[int] = None) -> int:
    """The requested step, else the first step after the warm-up epochs (else the last step)."""
    a = _require_actions(run)
    steps = np.unique(a["step"]).astype(int)
    if step is not None:
        if step not in steps:
            raise RunError(f"{run.path}: step {step} has no actions; recorded steps are "
                           f"{steps.min()}..{steps.max()}")
        return step
    s = metrics.loss_rank(run).table("steps")
    drop = metrics.warmup_of(run)
    if s and len(s["step"]):
        after = s["step"][s["epoch"] >= s["epoch"].min() + drop]
        for cand in after.astype(int):
            if cand in steps:
                return int(cand)
    return int(steps[-1])


REPLICA_GAP = 0.6  # extra space between two replicas' rows (in rows)
OPTIMIZER = 6
SYNC_COLOR = "#c44e52"
SYNC_SHORT = "grad sync"
MIN_SYNC_FRACTION = 0.002  # of the step's span: narrower gaps are not drawn


def sync_label(dp: int) -> str:
    """What the gap before a rank's optimizer holds (pipeline_step.cpp)."""
    return ("grad sync before the optimizer: the last sends, the tied embedding/LM-head gradient "
            "summed between the first and last stage" + (", each stage's gradients over the replicas"
                                                        if dp > 1 else "")
            + "; in /steps sync_exposed")


def sync_gaps(a: Dict[str, np.ndarray], sel: np.ndarray) -> List[Dict[str, float]]:
    """Per rank with an optimizer action among `sel`: the gap from its last other action's end to
    its optimizer's start (start, end, rank, replica, pp_rank, step), where positive."""
    out = []
    for rank in np.unique(a["rank"][sel]):
        mine = sel & (a["rank"] == rank)
        opt, other = mine & (a["op"] == OPTIMIZER), mine & (a["op"] != OPTIMIZER)
        if not opt.any() or not other.any():
            continue
        start, end = float(a["end"][other].max()), float(a["start"][opt].min())
        if end > start:
            i = int(np.flatnonzero(opt)[0])
            out.append({"start": start, "end": end, "rank": int(rank), "replica": int(a["replica"][i]),
                        "pp_rank": int(a["pp_rank"][i]), "step": int(a["step"][i])})
    return out


def row_names(run: Run, v: int) -> List[str]:
    """The gantt's row labels, top to bottom: one per world rank, replica by replica."""
    d, n = run.dp, run.pp
    names = []
    for k in range(d * n):
        rep, p = divmod(k, n)
        name = f"replica {rep}, rank {p}" if d > 1 else f"rank {p}"
        if v > 1:
            name += ": stages " + ", ".join(str(p + c * n) for c in range(v))
        names.append(name)
    return names


def gantt_figure(run: Run, step: Optional[int] = None):
    """The gantt chart of one step as (figure, axes), not yet saved (gantt writes it)."""
    a = _require_actions(run)
    step = pick_step(run, step)
    sel = a["step"] == step
    t0 = a["start"][sel].min()
    d, n = run.dp, run.pp  # replicas, ranks per pipeline
    rows = d * n
    v = metrics.stages_per_rank(run, a)
    gap = REPLICA_GAP if d > 1 else 0.0

    def row_y(replica: int, p: int) -> float:
        # Top to bottom: replica 0's ranks 0..P-1, then replica 1's, ...
        return rows - 1 - (replica * n + p) + gap * (d - 1 - replica)

    span_ms = (a["end"][sel].max() - t0) * 1e3
    top = row_y(0, 0)
    fig, ax = plt.subplots(figsize=(11, 0.9 * (top + 1) + 1.8))
    for i in np.flatnonzero(sel):
        stage = int(a["stage"][i])
        op, mb = int(a["op"][i]), int(a["microbatch"][i])
        x0 = (a["start"][i] - t0) * 1e3
        w = (a["end"][i] - a["start"][i]) * 1e3
        compute = op in (0, 1, 6, 7)
        y = row_y(int(a["replica"][i]), int(a["pp_rank"][i]))
        h, yb = (0.6, y - 0.22) if compute else (0.18, y - 0.45)
        later = op in (0, 1, 7) and stage >= n  # a later stage of an interleaved rank
        ax.broken_barh([(x0, w)], (yb, h), facecolors=OP_COLORS.get(op, "black"),
                       edgecolors="white", linewidth=0.6, hatch="///" if later else None)
        if op in (0, 1, 7) and w > span_ms * (0.012 if v == 1 else 0.02):
            ax.text(x0 + w / 2, yb + h / 2, str(mb) if v == 1 else f"{mb}/{stage}", ha="center",
                    va="center", color="white", fontsize=8, fontweight="bold")
    # The gradient sync before each rank's optimizer (not a bubble): a dotted box (a patch, not one
    # of the actions' collections), labelled on the top-most row that has one, where the space
    # above is free.
    gaps = [g for g in sync_gaps(a, sel) if g["end"] - g["start"] > MIN_SYNC_FRACTION * span_ms / 1e3]
    for g in gaps:
        y = row_y(g["replica"], g["pp_rank"])
        ax.add_patch(Rectangle(((g["start"] - t0) * 1e3, y - 0.17), (g["end"] - g["start"]) * 1e3, 0.5,
                               facecolor="none", edgecolor=SYNC_COLOR, linewidth=0.8, hatch="....",
                               gid="grad-sync"))
    if gaps:
        g = max(gaps, key=lambda g: row_y(g["replica"], g["pp_rank"]))
        ax.annotate(SYNC_SHORT, xy=((g["start"] - t0) * 1e3, row_y(g["replica"], g["pp_rank"]) + 0.33),
                    xytext=(-3, 3), textcoords="offset points", ha="right", va="bottom", fontsize=7,
                    color=SYNC_COLOR, gid="grad-sync-label")
    names = row_names(run, v)
    if d == 1:
        ax.set_yticks(range(n), [names[n - 1 - k] for k in range(n)])
    else:
        ax.set_yticks([row_y(k // n, k % n) for k in range(rows)], names)
        for rep in range(1, d):  # between replica rep-1's last row and replica rep's first
            ax.axhline((row_y(rep - 1, n - 1) + row_y(rep, 0)) / 2 - 0.06, color="gray", lw=1.2,
                       ls="--", alpha=0.8)
    ax.set_ylim(-0.6, rows - 0.3 + gap * (d - 1))
    ax.set_xlim(0, span_ms * 1.01)
    ax.set_xlabel(f"time since the step started (ms); step {step}")
    plain_axis(ax.xaxis)
    b = metrics.bubble(run)
    bub = f", idle {b['measured']:.0%} (ideal bubble {b['ideal']:.0%})" if b else ""
    boxes = "micro-batch number" if v == 1 else "micro-batch/stage, later stages hatched"
    where = (f"\n{d} replicas x {n} pipeline ranks, replica 0 on top" if d > 1 else "")
    ax.set_title(titled(f"Pipeline timeline: {run.label()}{bub}\nboxes: {boxes}; "
                        f"thin boxes below: communication; gaps: bubbles"
                        f"{'; dotted: grad sync' if gaps else ''}{where}",
                        shared_gpu_note([run]), 11, 10), fontsize=10)
    ops = sorted({int(o) for o in a["op"][sel]})
    handles = [Patch(color=OP_COLORS[o], label=metrics.OP_NAMES[o]) for o in ops]
    below = -0.28 if rows < 3 else -0.18
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, below), ncol=len(ops),
              fontsize=8, frameon=False)
    if gaps:
        # Its own legend line under the operations' (a second legend: the first stays drawn).
        ax.add_artist(ax.get_legend())
        ax.legend(handles=[Patch(facecolor="none", edgecolor=SYNC_COLOR, hatch="....",
                                 label=textwrap.fill(sync_label(d), 130))],
                  loc="upper center", bbox_to_anchor=(0.5, below - (0.1 if rows < 3 else 0.06)),
                  fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig, ax


def gantt(run: Run, path, step: Optional[int] = None) -> Path:
    fig, _ = gantt_figure(run, step)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return path


def process_name(run: Run, rank: int) -> str:
    """The trace's name for world rank `rank`: "rank r", or "replica d rank p" with replicas."""
    if run.dp > 1:
        rep, p = divmod(rank, run.pp)
        return f"replica {rep} rank {p}"
    return f"rank {rank}"


def chrome_trace(run: Run) -> Dict[str, List[Dict]]:
    """traceEvents: complete events (ph "X") with pid = world rank, tid 0 compute / 1 communication,
    ts and dur in microseconds; metadata events name the processes ("rank r", or "replica d rank p"
    for a run of several replicas) and threads. Event names carry the stage when a rank runs
    several ("F 3 @2": forward of micro-batch 3 on stage 2 of its replica's pipeline)."""
    a = _require_actions(run)
    events: List[Dict] = []
    n = max(int(a["rank"].max()) + 1, run.dp * run.pp if run.dp > 1 else 0)
    several = int(a["stage"].max()) + 1 > run.pp
    for rank in range(n):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": process_name(run, rank)}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
        for tid, name in ((0, "compute"), (1, "communication")):
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                           "args": {"name": name}})
    for i in np.argsort(a["start"], kind="stable"):
        op = int(a["op"][i])
        name = f"{OP_SHORT.get(op, op)} {int(a['microbatch'][i])}" if op != 6 else "optimizer"
        if several and op != 6:
            name += f" @{int(a['stage'][i])}"
        args = {"step": int(a["step"][i]), "stage": int(a["stage"][i]),
                "microbatch": int(a["microbatch"][i]),
                "bytes_sent": int(a["bytes_sent"][i]), "bytes_recv": int(a["bytes_recv"][i])}
        if run.dp > 1:
            args["replica"] = int(a["replica"][i])
        events.append({
            "name": name, "cat": metrics.OP_NAMES.get(op, str(op)), "ph": "X",
            "pid": int(a["rank"][i]), "tid": 0 if op in (0, 1, 6, 7) else 1,
            "ts": float(a["start"][i] * 1e6), "dur": float(max(0.0, a["end"][i] - a["start"][i]) * 1e6),
            "args": args})
    # The gradient sync before each rank's optimizer, derived from the actions' times.
    gaps = [g for step in np.unique(a["step"]) for g in sync_gaps(a, a["step"] == step)]
    for g in gaps:
        args = {"step": g["step"], "derived": "from the rank's last schedule action to its optimizer",
                "holds": sync_label(run.dp)}
        if run.dp > 1:
            args["replica"] = g["replica"]
        events.append({"name": SYNC_SHORT, "cat": "gradient sync", "ph": "X", "pid": g["rank"], "tid": 0,
                       "ts": g["start"] * 1e6, "dur": (g["end"] - g["start"]) * 1e6, "args": args})
    other = {"run": str(run.path), "label": run.label()}
    note = shared_gpu_note([run])
    if note:
        other.update(ranks_share_gpu=True, note=note)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_timeline(run: Run, out_dir, step: Optional[int] = None) -> List[Path]:
    out_dir = Path(out_dir)
    png = gantt(run, out_dir / "pipeline_timeline.png", step)
    trace = write_json(out_dir / "pipeline_trace.json", chrome_trace(run))
    return [png, trace]
