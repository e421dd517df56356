"""JSON summaries: one per run (`summarize`) and HW5's performance_summary.json (`hw5`), with the
grader's thresholds.

A run's summary holds HW5's metrics ("performance": time_mean, time_std, tok_mean, tok_std, with
"tokens_per_sec_definition" and "time_definition" saying what HW5's are) and the analysis's
tokens/s ("throughput": tok_s_mean, tok_s_std, with "tok_s_definition"; metrics.TOK_S_DEFINITION).
performance_summary.json keeps HW5's keys and values; each section adds
"tokens_per_sec_definition", HW5's definition of its tok_mean and tok_std.

When ranks of a run shared a GPU (reader.Run.shares_gpu) its summary adds "ranks_share_gpu": true
and a "note" ("2 ranks shared one GPU: timings are functional, not speed figures"); so does
performance_summary.json at the top and in each section (false in a section whose runs did not).
Without shared GPUs neither key appears."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from analysis import metrics
from analysis.reader import Run, shared_gpu_note

# HW5's pass marks: data parallel on 2 GPUs vs 1, pipeline vs model parallel.
DEFAULT_THRESHOLDS = {"dp_time": 1.5, "dp_throughput": 1.5, "pp_time": 1.0, "pp_throughput": 1.0}


def write_json(path, obj) -> Path:
    """Writes atomically (temporary file in the same directory, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_finite(obj), f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def _finite(obj):
    """NaN/inf are not JSON: written as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def run_summary(run: Run, warmup: Optional[int] = None) -> Dict[str, object]:
    perf = metrics.run_performance(run, warmup)
    out = {
        "run": str(run.path), "label": run.label(), "program": run.program,
        "world_size": run.world_size, **({"dp": run.dp, "pp": run.pp} if run.hybrid else {}),
        "partial": run.partial, "config": run.config,
        "ranks": [{"rank": r.rank, "file": r.path.name, "partial": r.partial,
                   "host": r.attrs.get("host"), "device": r.attrs.get("device"),
                   "gpu_name": r.attrs.get("gpu_name"), "git_commit": r.attrs.get("git_commit"),
                   "steps": r.rows("steps"), "epochs": r.rows("epochs"),
                   "actions": r.rows("actions"),
                   **({"dp_rank": r.dp_rank, "pp_rank": r.pp_rank} if run.hybrid else {})}
                  for r in run.ranks],
        "performance": perf,
        "throughput": metrics.throughput(run, warmup),
        "step_breakdown": metrics.step_breakdown(run, warmup),
        "losses": metrics.losses(run),
    }
    b = metrics.bubble(run)
    if b is not None:
        out["pipeline_bubble"] = b
    note = shared_gpu_note([run])
    if note:
        out.update(ranks_share_gpu=True, note=note)
    return out


def _section(baseline: Optional[Run], new: Optional[Run], names, warmup) -> Optional[Dict]:
    if baseline is None or new is None:
        return None
    b = metrics.hw5_stats(metrics.run_performance(baseline, warmup))
    n = metrics.hw5_stats(metrics.run_performance(new, warmup))
    # HW5's keys, and what its tok_mean / tok_std are (added; HW5's keys are unchanged).
    return {names[0]: b, names[1]: n, **metrics.speedups(b, n),
            "tokens_per_sec_definition": metrics.hw5_tok_definition(new)}


def hw5_summary(dp_single: Optional[Run], dp_multi: Optional[Run], pp_model: Optional[Run],
                pp_pipeline: Optional[Run], warmup: Optional[int] = None) -> Dict[str, object]:
    """performance_summary.json in HW5's schema; a section whose runs are missing is null."""
    runs = [r for r in (dp_single, dp_multi, pp_model, pp_pipeline) if r is not None]
    first = runs[0] if runs else None
    pp_cfg = (pp_pipeline or pp_model).config if (pp_pipeline or pp_model) else {}
    dropped = metrics.warmup_of(first, warmup) if first else (warmup or 0)
    out = {
        "config": {
            "epochs": int(first.config.get("epochs", 0)) if first else 0,
            "warmup_epochs_dropped": dropped,
            "pipeline_batch_size": pp_cfg.get("batch_size"),
            "pipeline_n_chunk": pp_cfg.get("microbatches"),
        },
        "data_parallel": _section(dp_single, dp_multi, ("single_gpu", "two_gpu"), warmup),
        "pipeline_parallel": _section(pp_model, pp_pipeline, ("model_parallel", "pipeline_parallel"),
                                      warmup),
    }
    note = shared_gpu_note(runs)
    if note:
        # Ranks shared a GPU: said at the top and in each section (HW5's keys are unchanged).
        out = {"ranks_share_gpu": True, "note": note, **out}
        for key, pair in (("data_parallel", (dp_single, dp_multi)),
                          ("pipeline_parallel", (pp_model, pp_pipeline))):
            if out[key] is not None:
                sec_note = shared_gpu_note(pair)
                out[key]["ranks_share_gpu"] = sec_note is not None
                if sec_note:
                    out[key]["note"] = sec_note
    return out


def grade(summary: Dict[str, object], thresholds: Dict[str, float]) -> List[str]:
    """The failed checks, one line each (empty: pass). A missing section fails its checks."""
    checks = [("data_parallel", "speedup_time_reduction_x", "dp_time", "DP training-time reduction"),
              ("data_parallel", "speedup_throughput_x", "dp_throughput", "DP throughput speedup"),
              ("pipeline_parallel", "speedup_time_reduction_x", "pp_time", "PP training-time reduction"),
              ("pipeline_parallel", "speedup_throughput_x", "pp_throughput", "PP throughput speedup")]
    failures = []
    for section, key, th, what in checks:
        sec = summary.get(section)
        need = thresholds[th]
        if sec is None:
            failures.append(f"{what}: not measured (pass the {section.replace('_', ' ')} run directories)")
            continue
        value = sec.get(key)
        if value is None or not math.isfinite(value) or value < need:
            failures.append(f"{what}: {section}.{key} = {value if value is None else round(value, 3)} "
                            f"< required {need}")
    return failures
