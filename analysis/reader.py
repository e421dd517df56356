"""Reads one run directory: every rank's HDF5 timing file (rank<r>.h5, or rank<r>.h5.partial
after a crash, with a warning). The layout is documented in include/gpt2p/io/run_record.h:
tables /steps, /epochs, /actions of equal-length float64 columns, and root attributes.

A file that resumed runs continued has a /segments table (the row where each run's rows begin);
it is read as one run: rows a resumed run repeated (it went back to its checkpoint) are taken from
the latest run, and each run's times, which count from its own start, are shifted to follow the
previous run's so that they keep increasing.

A pp_train run with --dp D is D data-parallel replicas of one P-rank pipeline: world rank r is
pipeline rank r % P of replica r // P. Its files carry the root attributes dp (D), dp_rank (the
replica), pp (P) and pp_rank (the place in the pipeline). Files without them (every other program,
and pp_train before --dp) read as D = 1, P = world_size, dp_rank = 0, pp_rank = rank.

Every file names where its rank ran (root attributes host and device, e.g. "cuda:0"). Two ranks
of one run with the same host and the same GPU device shared that GPU (several ranks on one GPU,
e.g. 2 ranks on a machine with one): such a run works, but its timings are functional, not speed
figures, and everything made from it says so (Run.shares_gpu, shared_gpu_note). CPU ranks ("cpu")
never count as sharing."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import h5py
import numpy as np

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


def schedule_name(schedule: str, stages_per_rank: int = 1, zero_bubble: bool = False,
                  zb_extra_live: int = 0) -> str:
    """"1f1b", "gpipe", or "interleaved x<V>" for V stages per rank; "+zb" for split backwards,
    "+zb+K" when their W's may keep K more micro-batches alive (--zb-extra-live), "+zb+inf"
    without a limit."""
    name = f"{schedule} x{stages_per_rank}" if stages_per_rank > 1 else schedule
    if not zero_bubble:
        return name
    if zb_extra_live == 0:
        return name + "+zb"
    return name + ("+zb+inf" if zb_extra_live < 0 else f"+zb+{zb_extra_live}")


# What the JSON and the plots say about a run whose ranks shared a GPU.
SHARED_GPU_CAVEAT = "timings are functional, not speed figures"


def is_gpu_device(device) -> bool:
    """A device string that names a GPU ("cuda:0", "cuda"); "cpu" and an empty one do not."""
    d = str(device or "").strip().lower()
    return bool(d) and not d.startswith("cpu")


class RunError(Exception):
    """A run directory or timing file that cannot be analysed; the message says what to do."""


def warn(message: str) -> None:
    print(f"analysis: warning: {message}", file=sys.stderr)


@dataclasses.dataclass
class RankFile:
    path: Path
    rank: int
    partial: bool
    attrs: Dict[str, object]
    config: Dict[str, object]
    tables: Dict[str, Dict[str, np.ndarray]]
    segments: int = 1  # runs that wrote the file: the first one plus its resumes

    def table(self, name: str) -> Dict[str, np.ndarray]:
        return self.tables.get(name, {})

    @property
    def dp_rank(self) -> int:
        """The data-parallel replica this rank belongs to (0 without the attribute)."""
        return int(self.attrs.get("dp_rank", 0))

    @property
    def pp_rank(self) -> int:
        """This rank's place in its replica's pipeline (its world rank without the attribute)."""
        return int(self.attrs.get("pp_rank", self.rank))

    def rows(self, name: str) -> int:
        t = self.table(name)
        return len(next(iter(t.values()))) if t else 0


@dataclasses.dataclass
class Run:
    path: Path
    ranks: List[RankFile]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def program(self) -> str:
        return str(self.ranks[0].attrs.get("program", "?"))

    @property
    def config(self) -> Dict[str, object]:
        return self.ranks[0].config

    @property
    def world_size(self) -> int:
        return int(self.ranks[0].attrs.get("world_size", len(self.ranks)))

    @property
    def is_pipeline(self) -> bool:
        return self.program == "pp_train"

    @property
    def dp(self) -> int:
        """D: data-parallel replicas of the pipeline (pp_train --dp); 1 without the attribute."""
        d = self.ranks[0].attrs.get("dp")
        if d is None and self.is_pipeline:
            d = self.config.get("dp")
        return max(1, int(d or 1))

    @property
    def pp(self) -> int:
        """P: ranks per pipeline; world_size without the attribute (D = 1)."""
        p = self.ranks[0].attrs.get("pp")
        return max(1, int(p)) if p is not None else max(1, self.world_size // self.dp)

    @property
    def hybrid(self) -> bool:
        """A pp_train run of several data-parallel replicas (D > 1)."""
        return self.is_pipeline and self.dp > 1

    def replica_ranks(self, replica: int) -> List["RankFile"]:
        """The rank files of one replica present in the run, in pipeline order."""
        return sorted((r for r in self.ranks if r.dp_rank == replica), key=lambda r: r.pp_rank)

    @property
    def partial(self) -> bool:
        return any(r.partial for r in self.ranks)

    @property
    def stages_per_rank(self) -> int:
        """Pipeline stages each rank runs (the interleaved schedule's V; 1 otherwise)."""
        return int(self.config.get("stages_per_rank", 1) or 1)

    @property
    def schedule(self) -> str:
        """The schedule's name, with the stages per rank of an interleaved one: "interleaved x2"."""
        return schedule_name(str(self.config.get("schedule", "?")), self.stages_per_rank,
                             bool(self.config.get("zero_bubble", False)),
                             int(self.config.get("zb_extra_live", 0)))

    @property
    def layout(self) -> str:
        """How the ranks are arranged: "n=4", or "2 x 2 hybrid" (D replicas x P pipeline ranks)."""
        if self.hybrid:
            return f"{self.dp} x {self.pp} hybrid"
        return f"n={self.world_size}"

    @property
    def shared_gpus(self) -> Dict[Tuple[str, str], List[int]]:
        """The GPUs that more than one rank of the run used: (host, device) -> those ranks. Empty
        when every rank had its own GPU, for CPU ranks, and for files without host or device."""
        by_gpu: Dict[Tuple[str, str], List[int]] = {}
        for r in self.ranks:
            host, device = r.attrs.get("host"), r.attrs.get("device")
            if host and is_gpu_device(device):
                by_gpu.setdefault((str(host), str(device)), []).append(r.rank)
        return {k: sorted(v) for k, v in by_gpu.items() if len(v) > 1}

    @property
    def shares_gpu(self) -> bool:
        """True when two ranks of the run ran on the same host and the same GPU device."""
        return bool(self.shared_gpus)

    def sharing(self) -> Optional[str]:
        """How the ranks shared GPUs, "2 ranks shared one GPU" or "4 ranks shared 2 GPUs"; None
        when they did not."""
        shared = self.shared_gpus
        if not shared:
            return None
        n = sum(len(v) for v in shared.values())
        return f"{n} ranks shared one GPU" if len(shared) == 1 else f"{n} ranks shared {len(shared)} GPUs"

    def label(self) -> str:
        c = self.config
        if self.is_pipeline:
            mode = c.get("mode", "pipeline")
            if mode == "model_parallel":
                return f"{self.program} model_parallel {self.layout}"
            return f"{self.program} {self.schedule} M={c.get('microbatches', '?')} {self.layout}"
        return f"{self.program} {self.layout}"


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


def shared_gpu_note(runs) -> Optional[str]:
    """The note for results made from `runs` (None entries are skipped) when ranks of any of them
    shared a GPU: "2 ranks shared one GPU: timings are functional, not speed figures"; else None."""
    phrases: List[str] = []
    for run in runs:
        s = run.sharing() if run is not None else None
        if s and s not in phrases:
            phrases.append(s)
    return f"{'; '.join(phrases)}: {SHARED_GPU_CAVEAT}" if phrases else None


def read_runs(directories) -> List[Run]:
    return [read_run(d) for d in directories]


def find_runs(root) -> List[Path]:
    """Run directories at or below `root` (directories holding rank<r>.h5 files)."""
    root = Path(root)
    dirs = {p.parent for p in root.rglob("rank*.h5*") if RANK_FILE.match(p.name)}
    return sorted(dirs)


def optional_run(directory: Optional[str]) -> Optional[Run]:
    return read_run(directory) if directory else None
