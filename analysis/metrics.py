"""The run's metrics, computed from the per-rank tables of one run: the analysis's tokens/s,
HW5's metrics, the step breakdown, the pipeline bubble, the losses.

tokens/s (throughput(), the analysis's one definition; analysis/README.md): all ranks' padded
tokens (batch x seq_len on every data-parallel rank; a pipeline's batch counted once per replica,
not once per stage) per second of training time. Per epoch: the epoch's tokens / its training
time (the mean over ranks of /epochs/train_time, each rank's summed step times); then mean and
population std over the epochs after the warm-up epochs. The C++ trainers count a step's tokens
alike (all ranks: the step's padded tokens x LoopSetup::tokens_factor, the ranks of dp_train or
the replicas of pp_train).

HW5's metrics (run_performance(), kept as HW5 defines them): per epoch, training time = mean over
ranks of /epochs/train_time; throughput = sum over data-parallel replicas of /epochs/tokens_per_sec
(padded tokens, as HW5 counts). Every rank of dp_train and gpt2_train is its own replica (it trains
on its own shard), so HW5's sum over ranks applies. All stages of a pipeline work on the same batch:
they form one replica, whose throughput is the mean over its stages (stages that record no tokens
are left out); a pp_train run with --dp D has D such replicas, each on its share of the batch, and
its throughput is the sum of theirs. Warm-up epochs (the run's config.warmup_epochs unless
overridden) are dropped, then mean and population standard deviation (numpy std, ddof=0) are taken
over the remaining epochs."""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from analysis import reader
from analysis.reader import Run, schedule_name, warn

PHASES = ("data", "forward", "backward", "sync_exposed", "optimizer")
OP_NAMES = reader.OP_NAMES
COMPUTE_OPS = (0, 1, 7)  # F, B and W (the deferred half of a split backward)

# What "tokens/s" means everywhere in the analysis's own output (analysis/README.md), and how each
# output aggregates it. Plots and tables label it TOK_S_LABEL.
TOKENS_COUNTED = ("all ranks' padded tokens (batch x seq_len on every data-parallel rank; a "
                  "pipeline's batch counted once per replica, not once per stage)")
TOK_S_DEFINITION = (f"tokens/s: {TOKENS_COUNTED} per second of training time; per epoch: the "
                    "epoch's tokens / its training time (the mean over ranks of /epochs/train_time, "
                    "each rank's summed step times); then mean and population std over the epochs "
                    "after the warm-up epochs")
TOK_S_LABEL = "tok/s (all ranks, padded)"
TOK_S_AGGREGATE = "mean ± std of the epochs after warm-up"
# HW5's throughput, as HW5 defines it (performance_summary.json's tok_mean / tok_std).
HW5_TOK_DP_DEFINITION = ("HW5's tokens/s: the sum over ranks of each rank's padded tokens / its own "
                         "epoch training time (/epochs/tokens_per_sec, the trainer's per-rank "
                         "'Tokens_per_sec' line); mean and population std over the epochs after "
                         "warm-up")
HW5_TOK_PP_DEFINITION = ("HW5's tokens/s: per pipeline replica the mean over its stages of each "
                         "stage's padded tokens / its own epoch training time "
                         "(/epochs/tokens_per_sec), summed over the replicas; mean and population "
                         "std over the epochs after warm-up")
HW5_TIME_DEFINITION = ("HW5's training time per epoch: the mean over ranks of /epochs/train_time "
                       "(each rank's summed step times); mean and population std over the epochs "
                       "after warm-up")


def hw5_tok_definition(run: Run) -> str:
    return HW5_TOK_PP_DEFINITION if run.is_pipeline else HW5_TOK_DP_DEFINITION


def warmup_of(run: Run, override: Optional[int] = None) -> int:
    if override is not None:
        return int(override)
    return int(run.config.get("warmup_epochs", 0) or 0)


def epoch_table(run: Run) -> Dict[str, np.ndarray]:
    """Per epoch present on every rank: epoch, time (mean over ranks), tok (HW5 throughput),
    tokens (all ranks' padded tokens, a pipeline replica's batch once), and the per-rank columns
    time_r / tok_r as [epochs x ranks] arrays."""
    per_rank = [r.table("epochs") for r in run.ranks]
    common = None
    for t in per_rank:
        e = set(t.get("epoch", np.array([])).astype(int).tolist())
        common = e if common is None else common & e
    epochs = np.array(sorted(common or []), dtype=int)
    time_r = np.zeros((len(epochs), len(per_rank)))
    tok_r = np.zeros_like(time_r)
    tokens_r = np.zeros_like(time_r)
    for j, t in enumerate(per_rank):
        idx = {int(e): i for i, e in enumerate(t["epoch"])} if "epoch" in t else {}
        for i, e in enumerate(epochs):
            time_r[i, j] = t["train_time"][idx[e]]
            tok_r[i, j] = t["tokens_per_sec"][idx[e]]
            tokens_r[i, j] = t["padded_tokens"][idx[e]]
    time = time_r.mean(axis=1) if len(per_rank) else np.zeros(0)
    if run.is_pipeline:
        # Per replica, the mean over its stages; then the sum over replicas.
        replica = np.array([r.dp_rank for r in run.ranks])
        tok = np.zeros(len(epochs))
        for d in np.unique(replica):
            counted = (tokens_r > 0) & (replica == d)
            n = np.maximum(counted.sum(axis=1), 1)
            tok = tok + np.where(counted, tok_r, 0).sum(axis=1) / n
    else:
        tok = tok_r.sum(axis=1)
    # The analysis's count: the tokens of all ranks, a pipeline replica's batch once (its largest
    # stage's count).
    if run.is_pipeline:
        replica = np.array([r.dp_rank for r in run.ranks])
        tokens = np.zeros(len(epochs))
        for d in np.unique(replica):
            tokens = tokens + tokens_r[:, replica == d].max(axis=1)
    else:
        tokens = tokens_r.sum(axis=1)
    return {"epoch": epochs, "time": time, "tok": tok, "tokens": tokens, "time_r": time_r,
            "tok_r": tok_r}


def stats(values: np.ndarray) -> Dict[str, float]:
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return {"mean": float("nan"), "std": float("nan")}
    return {"mean": float(np.mean(values)), "std": float(np.std(values))}


def _kept_epochs(run: Run, t: Dict[str, np.ndarray], warmup: Optional[int], quiet: bool = False):
    """The epochs after warm-up (all of them, with a warning unless `quiet`, when all are warm-up)
    and how many warm-up epochs were dropped."""
    drop = warmup_of(run, warmup)
    keep = t["epoch"] >= (t["epoch"].min() + drop if t["epoch"].size else 0)
    dropped = drop
    if t["epoch"].size and not keep.any():
        if not quiet:
            warn(f"{run.path}: all {t['epoch'].size} epoch(s) are warm-up (warmup_epochs {drop}); "
                 "using them all: run more epochs or pass --warmup-epochs 0")
        keep[:] = True
        dropped = 0
    return keep, dropped


def run_performance(run: Run, warmup: Optional[int] = None) -> Dict[str, object]:
    """HW5's {time_mean, time_std, tok_mean, tok_std} of one run, plus what they came from and
    what they are (tokens_per_sec_definition, time_definition)."""
    t = epoch_table(run)
    keep, dropped = _kept_epochs(run, t, warmup)
    if t["epoch"].size == 0:
        warn(f"{run.path}: no epoch finished on every rank; its metrics are NaN")
    ts, ks = stats(t["time"][keep]), stats(t["tok"][keep])
    return {
        "time_mean": ts["mean"], "time_std": ts["std"], "tok_mean": ks["mean"], "tok_std": ks["std"],
        "epochs_used": t["epoch"][keep].tolist(), "warmup_epochs_dropped": dropped,
        "time_per_epoch": t["time"].tolist(), "tok_per_epoch": t["tok"].tolist(),
        "tokens_per_sec_definition": hw5_tok_definition(run), "time_definition": HW5_TIME_DEFINITION,
    }


def throughput(run: Run, warmup: Optional[int] = None) -> Dict[str, object]:
    """The analysis's tokens/s of one run (TOK_S_DEFINITION): tok_s_mean, tok_s_std over the
    epochs after warm-up, and per epoch (every epoch, warm-up included) tok_s, tokens and
    time; epochs_used are the /epochs numbers (from 0) of those averaged."""
    t = epoch_table(run)
    keep, dropped = _kept_epochs(run, t, warmup, quiet=True)  # run_performance warns
    with np.errstate(divide="ignore", invalid="ignore"):
        per_epoch = np.where(t["time"] > 0, t["tokens"] / t["time"], np.nan)
    ks = stats(per_epoch[keep])
    return {"tok_s_mean": ks["mean"], "tok_s_std": ks["std"], "epochs_used": t["epoch"][keep].tolist(),
            "warmup_epochs_dropped": dropped, "tok_s_per_epoch": per_epoch.tolist(),
            "tokens_per_epoch": t["tokens"].tolist(), "time_per_epoch": t["time"].tolist(),
            "label": f"{TOK_S_LABEL}, {TOK_S_AGGREGATE}", "tok_s_definition": TOK_S_DEFINITION}


def hw5_stats(perf: Dict[str, object]) -> Dict[str, float]:
    return {k: perf[k] for k in ("time_mean", "time_std", "tok_mean", "tok_std")}


def speedups(baseline: Dict[str, float], new: Dict[str, float]) -> Dict[str, float]:
    """HW5: time reduction = baseline time / new time; throughput = new tok / baseline tok."""
    def ratio(a, b):
        return float(a / b) if b and np.isfinite(a) and np.isfinite(b) else float("nan")
    return {"speedup_time_reduction_x": ratio(baseline["time_mean"], new["time_mean"]),
            "speedup_throughput_x": ratio(new["tok_mean"], baseline["tok_mean"])}


def step_breakdown(run: Run, warmup: Optional[int] = None) -> List[Dict[str, float]]:
    """Per rank: mean seconds per step of each phase (after warm-up epochs) and `other`, the rest
    of the step's wall time; with several replicas also the rank's replica and pp_rank."""
    drop = warmup_of(run, warmup)
    out = []
    for r in run.ranks:
        s = r.table("steps")
        where = {"replica": r.dp_rank, "pp_rank": r.pp_rank} if run.hybrid else {}
        if not s or len(s["step"]) == 0:
            out.append({"rank": r.rank, **where, "steps": 0, **{p: 0.0 for p in PHASES},
                        "other": 0.0, "total": 0.0})
            continue
        keep = s["epoch"] >= s["epoch"].min() + drop
        if not keep.any():
            keep = np.ones_like(keep)
        total = (s["end"] - s["start"])[keep]
        row = {"rank": r.rank, **where, "steps": int(keep.sum())}
        for p in PHASES:
            row[p] = float(np.mean(s[p][keep]))
        row["total"] = float(np.mean(total))
        row["other"] = max(0.0, row["total"] - sum(row[p] for p in PHASES))
        out.append(row)
    return out


def clock_offset(rank, ref) -> float:
    """Seconds to subtract from `rank`'s times to put them on `ref`'s clock. Every rank stamps times
    on its own clock from its own start, and those starts (and, across nodes, the clocks) differ.
    A pipeline step ends with the loss broadcast, which every rank leaves within microseconds of
    the others, so the median difference of the steps' end times is the offset."""
    a, b = rank.table("steps"), ref.table("steps")
    if not a or not b or not len(a["step"]) or not len(b["step"]):
        return 0.0
    common, ia, ib = np.intersect1d(a["step"], b["step"], return_indices=True)
    if common.size == 0:
        return 0.0
    return float(np.median(a["end"][ia] - b["end"][ib]))


def actions(run: Run) -> Dict[str, np.ndarray]:
    """All ranks' /actions rows concatenated (empty columns when the run recorded none), with
    every rank's times moved onto the loss rank's clock (clock_offset, loss_rank), and the columns
    `rank` (the file's world rank), `replica` (its dp_rank) and `pp_rank` (its place in the
    replica's pipeline). `stage` is the action's stage within its replica's pipeline (0..P V-1),
    which differs from pp_rank with several stages per rank."""
    cols = ("step", "stage", "op", "microbatch", "start", "end", "bytes_sent", "bytes_recv")
    extra = ("rank", "replica", "pp_rank")
    ranks = [r for r in run.ranks if r.rows("actions")]
    if not ranks:
        return {c: np.zeros(0) for c in cols + extra}
    ref = loss_rank(run)
    parts = []
    for r in ranks:
        t = dict(r.table("actions"))
        off = clock_offset(r, ref)
        t["start"], t["end"] = t["start"] - off, t["end"] - off
        t["rank"] = np.full(len(t["step"]), float(r.rank))
        t["replica"] = np.full(len(t["step"]), float(r.dp_rank))
        t["pp_rank"] = np.full(len(t["step"]), float(r.pp_rank))
        parts.append(t)
    return {c: np.concatenate([p[c] for p in parts]) for c in cols + extra}


def stages_per_rank(run: Run, a: Dict[str, np.ndarray]) -> int:
    """V from the actions: (highest stage + 1) // P, at least 1."""
    return max(1, (int(a["stage"].max()) + 1) // run.pp) if a["stage"].size else 1


def bubble(run: Run) -> Optional[Dict[str, float]]:
    """Measured pipeline idle fraction: per replica and step, 1 - (compute time summed over the
    replica's P ranks) / (P x the replica's step span), averaged over its steps after the first,
    then over the replicas; and the ideal (P-1)/(V M+P-1) for P ranks per pipeline running V stages
    each (V = 1 but for the interleaved schedule). `ranks` is P, `replicas` D."""
    a = actions(run)
    if a["step"].size == 0:
        return None
    n = run.pp
    v = stages_per_rank(run, a)
    m = int(a["microbatch"].max()) + 1
    per_replica, counted = [], []
    for d in np.unique(a["replica"]):
        mine = a["replica"] == d
        fractions = []
        for step in np.unique(a["step"][mine]):
            sel = mine & (a["step"] == step)
            span = a["end"][sel].max() - a["start"][sel].min()
            comp = sel & np.isin(a["op"], COMPUTE_OPS)
            busy = (a["end"][comp] - a["start"][comp]).sum()
            if span > 0:
                fractions.append(1.0 - busy / (n * span))
        measured = fractions[1:] if len(fractions) > 1 else fractions
        per_replica.append(float(np.mean(measured)))
        counted.append(len(fractions))
    out = {"replicas": run.dp, "ranks": n, "stages": n * v, "stages_per_rank": v, "microbatches": m,
           "measured": float(np.mean(per_replica)), "ideal": (n - 1) / (v * m + n - 1),
           "steps": counted[0]}
    if run.dp > 1:
        out["measured_per_replica"] = per_replica
    return out


def loss_rank(run: Run):
    """The rank whose /steps loss is the model's: the last stage of a pipeline (the last pipeline
    rank of replica 0 when there are several replicas), else rank 0."""
    if not run.is_pipeline:
        return run.ranks[0]
    first = min(r.dp_rank for r in run.ranks)
    return max(run.replica_ranks(first), key=lambda r: r.pp_rank)


def losses(run: Run) -> Dict[str, object]:
    s = loss_rank(run).table("steps")
    e = loss_rank(run).table("epochs")
    def last(t, c):
        return float(t[c][-1]) if t and len(t.get(c, [])) else float("nan")
    return {"final_train_loss": last(s, "loss"), "final_val_loss": last(e, "val_loss"),
            "final_val_ppl": last(e, "val_ppl"), "final_bleu": last(e, "bleu")}


def plan_points(plan: Dict, partition: str, batch_size: int, seq_len: int, stages: int) -> List[Dict]:
    """pp_plan's predictions for `partition` as sweep points: predicted tokens/s per schedule and M,
    and the model-parallel prediction they are relative to. Raises ValueError when the plan was made
    for another batch, sequence length or stage count than the runs."""
    want = (batch_size, seq_len, stages)
    got = (plan.get("batch_size"), plan.get("seq_len"), plan.get("stages"))
    if got != want:
        raise ValueError(f"the plan is for batch {got[0]} x {got[1]} on {got[2]} stages but the runs are "
                         f"batch {want[0]} x {want[1]} on {want[2]} stages; run pp_plan with the runs' "
                         "--batch-size, --seq-len and --stages")
    tokens = batch_size * seq_len
    pts = []
    for p in plan.get("predictions", []):
        if p["partition"] != partition:
            continue
        tok = tokens / p["step_s"]
        pts.append({"schedule": schedule_name(p["schedule"], int(p.get("stages_per_rank", 1)),
                                               bool(p.get("zero_bubble", False)),
                                               int(p.get("zb_extra_live", 0))),
                    "microbatches": int(p["microbatches"]), "tok_s": tok,
                    "model_parallel_tok_s": tok / p["speedup_vs_model_parallel"], "split": p["split"]})
    if not pts:
        raise ValueError(f"the plan has no prediction for partition '{partition}'")
    return sorted(pts, key=lambda p: (p["schedule"], p["microbatches"]))
