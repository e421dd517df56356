"""Reads one run directory: every rank's HDF5 timing file (rank<r>.h5, or rank<r>.h5.partial
after a crash, with a warning), into the Run of analysis/run.py. The layout is documented in
include/gpt2p/io/run_record.h: tables /steps, /epochs, /actions of equal-length float64 columns,
and root attributes.

A file that resumed runs continued has a /segments table (the row where each run's rows begin);
it is read as one run: rows a resumed run repeated (it went back to its checkpoint) are taken from
the latest run, and each run's times, which count from its own start, are shifted to follow the
previous run's so that they keep increasing.

The run's model (Run, RankFile, schedule_name, shared_gpu_note, ...) is importable from here too,
so that callers read runs and what they mean through one module."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional

import h5py
import numpy as np

from analysis.run import (SHARED_GPU_CAVEAT, RankFile, Run, is_gpu_device,  # noqa: F401
                          schedule_name, shared_gpu_note)

TABLES = ("steps", "epochs", "actions")
SEGMENTS = "segments"
# The column that identifies a row of each table, and the tables whose times count from a run's start.
KEYS = {"steps": "step", "epochs": "epoch", "actions": "step"}
TIMED = ("steps", "actions")
RANK_FILE = re.compile(r"^rank(\d+)\.h5(\.partial)?$")
# The /actions op codes the analysis uses (io::ActionOp, include/gpt2p/io/action_ops.h). A file's
# "action_ops" attribute names the codes it was written with; its codes are translated to these by
# name, so the two never silently disagree. Files from before the attribute use these codes.
OP_NAMES = {0: "forward", 1: "backward", 2: "send activation", 3: "recv activation",
            4: "send grad", 5: "recv grad", 6: "optimizer", 7: "weight grad"}


class RunError(Exception):
    """A run directory or timing file that cannot be analysed; the message says what to do."""


def warn(message: str) -> None:
    print(f"analysis: warning: {message}", file=sys.stderr)


def _decode(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def _rows(table: Dict[str, np.ndarray]) -> int:
    return len(next(iter(table.values()))) if table else 0


def _segment_ids(starts, n: int) -> np.ndarray:
    """For each of n rows, the index of the segment it belongs to (starts: each one's first row)."""
    starts = np.clip(np.asarray(starts, dtype=np.int64), 0, n)
    return np.searchsorted(starts, np.arange(n), side="right") - 1


def _resume_point(tables, seg, k):
    """(first step, first epoch) run k recorded; None where it recorded no such row."""
    steps = tables.get("steps", {})
    rows = np.flatnonzero(seg["steps"] == k) if "steps" in seg else []
    if len(rows):
        return steps["step"][rows[0]], steps["epoch"][rows[0]]
    rows = np.flatnonzero(seg["epochs"] == k) if "epochs" in seg else []
    return None, (tables["epochs"]["epoch"][rows[0]] if len(rows) else None)


def merge_segments(tables, segments):
    """One view of the tables of a file several runs appended to (see the module's docstring)."""
    n_seg = _rows(segments)
    if n_seg <= 1:
        return tables
    seg = {name: _segment_ids(segments[f"{name}_row"], _rows(t)) for name, t in tables.items()
           if f"{name}_row" in segments and _rows(t)}
    keep = {name: np.ones(len(ids), dtype=bool) for name, ids in seg.items()}
    shift = {name: np.zeros(len(ids)) for name, ids in seg.items()}
    elapsed = 0.0
    for k in range(1, n_seg):
        first_step, first_epoch = _resume_point(tables, seg, k)
        for name, ids in seg.items():
            first = first_epoch if name == "epochs" else first_step
            if first is not None:
                keep[name] &= ~((ids < k) & (tables[name][KEYS[name]] >= first))
        for name in TIMED:
            if name in seg and "end" in tables[name]:
                ends = (tables[name]["end"] + shift[name])[seg[name] < k]  # dropped rows too
                elapsed = max(elapsed, float(ends.max()) if len(ends) else 0.0)
        for name in TIMED:
            if name in seg:
                shift[name][seg[name] == k] = elapsed
    out = {}
    for name, table in tables.items():
        if name not in seg:
            out[name] = table
            continue
        out[name] = {c: ((v + shift[name]) if c in ("start", "end") and name in TIMED else v)[keep[name]]
                     for c, v in table.items()}
    return out


def _open(path: Path, partial: bool):
    """Opens a timing file for reading; a .partial one without HDF5's file lock, which its trainer
    holds while it writes (flushing after every row) and which would refuse the reader."""
    if not partial:
        return h5py.File(path, "r")
    try:
        return h5py.File(path, "r", locking=False)
    except (TypeError, ValueError):  # h5py < 3.5 or HDF5 < 1.10.7: HDF5 reads this variable instead
        os.environ["HDF5_USE_FILE_LOCKING"] = "FALSE"
        return h5py.File(path, "r")


def read_rank_file(path: Path) -> RankFile:
    path = Path(path)
    m = RANK_FILE.match(path.name)
    if not m:
        raise RunError(f"{path}: not a timing file name (expected rank<r>.h5 or rank<r>.h5.partial)")
    partial = m.group(2) is not None
    try:
        f = _open(path, partial)
    except OSError as e:
        raise RunError(f"{path}: cannot open as HDF5 ({e}); a crash before the first flush leaves an "
                       "unreadable .partial file: delete it or rerun the training"
                       + (" (a running trainer's file may also not read for a moment while it is written)"
                          if partial else "")) from e
    with f:
        attrs = {k: _decode(v) for k, v in f.attrs.items()}
        try:
            config = json.loads(attrs.get("config", "{}") or "{}")
        except json.JSONDecodeError as e:
            raise RunError(f"{path}: root attribute 'config' is not JSON ({e})") from e
        tables = {}
        for name in TABLES + (SEGMENTS,):
            if name not in f:
                continue
            cols = {c: np.asarray(f[name][c][...], dtype=np.float64) for c in f[name]}
            # A crash between two columns' appends leaves unequal lengths: keep complete rows.
            n = min((len(v) for v in cols.values()), default=0)
            tables[name] = {c: v[:n] for c, v in cols.items()}
    rank = int(attrs.get("rank", int(m.group(1))))
    if rank != int(m.group(1)):
        raise RunError(f"{path}: file name says rank {m.group(1)} but attribute rank is {rank}; "
                       "files from different runs were mixed in one directory")
    if "actions" in tables and "action_ops" in attrs:
        tables["actions"]["op"] = _canonical_ops(path, tables["actions"]["op"], attrs["action_ops"])
    segments = tables.pop(SEGMENTS, {})
    tables = merge_segments(tables, segments)
    return RankFile(path, rank, partial, attrs, config, tables, max(1, _rows(segments)))


def _canonical_ops(path, ops, table_json):
    try:
        table = {int(k): str(v) for k, v in json.loads(table_json).items()}
    except (ValueError, AttributeError) as e:
        raise RunError(f"{path}: root attribute 'action_ops' is not a JSON table of op codes ({e})") from e
    by_name = {name: code for code, name in OP_NAMES.items()}
    unknown = sorted({name for name in table.values() if name not in by_name})
    if unknown:
        raise RunError(f"{path}: action op(s) {', '.join(unknown)} unknown to this analysis; "
                       "update analysis/reader.py's OP_NAMES from include/gpt2p/io/action_ops.h")
    out = np.array(ops, dtype=np.float64)
    for code, name in table.items():
        out[ops == code] = by_name[name]
    return out


def read_run(directory) -> Run:
    """Every rank file of one run directory, ordered by rank. Prefers rank<r>.h5 over a stale
    rank<r>.h5.partial; a .partial without its final file is read with a warning."""
    directory = Path(directory)
    if not directory.is_dir():
        raise RunError(f"{directory}: no such run directory (pass the --out directory of a trainer)")
    found: Dict[int, Path] = {}
    for p in sorted(directory.iterdir()):
        m = RANK_FILE.match(p.name)
        if not m:
            continue
        r = int(m.group(1))
        if m.group(2) is None or r not in found:
            found[r] = p
    if not found:
        raise RunError(f"{directory}: no rank<r>.h5 files; is this the --out directory of dp_train, "
                       "pp_train or gpt2_train?")
    ranks = []
    for r in sorted(found):
        rf = read_rank_file(found[r])
        if rf.partial:
            warn(f"{rf.path}: unfinished timing file (the run crashed or is still going); "
                 f"using its {rf.rows('steps')} step and {rf.rows('epochs')} epoch rows")
        ranks.append(rf)
    world = int(ranks[0].attrs.get("world_size", len(ranks)))
    if len(ranks) != world:
        warn(f"{directory}: {len(ranks)} rank file(s) for world_size {world}; metrics use the ranks present")
    _check_mesh(directory, ranks)
    return Run(directory, ranks)


def _check_mesh(directory: Path, ranks: List[RankFile]) -> None:
    """Rank files with the dp/pp attributes agree on D and P, and each rank r is pipeline rank
    r % P of replica r // P."""
    shapes = {(r.attrs.get("dp"), r.attrs.get("pp")) for r in ranks}
    if len(shapes) > 1:
        raise RunError(f"{directory}: the rank files disagree on dp x pp ({sorted(map(str, shapes))}); "
                       "files from different runs were mixed in one directory")
    for r in ranks:
        if "pp" not in r.attrs:
            continue
        p = max(1, int(r.attrs["pp"]))
        if (r.dp_rank, r.pp_rank) != (r.rank // p, r.rank % p):
            raise RunError(f"{r.path}: rank {r.rank} says replica {r.dp_rank}, pipeline rank "
                           f"{r.pp_rank}, but with pp {p} it is replica {r.rank // p}, pipeline rank "
                           f"{r.rank % p}; files from different runs were mixed in one directory")


def read_runs(directories) -> List[Run]:
    return [read_run(d) for d in directories]


def find_runs(root) -> List[Path]:
    """Run directories at or below `root` (directories holding rank<r>.h5 files)."""
    root = Path(root)
    dirs = {p.parent for p in root.rglob("rank*.h5*") if RANK_FILE.match(p.name)}
    return sorted(dirs)


def optional_run(directory: Optional[str]) -> Optional[Run]:
    return read_run(directory) if directory else None
