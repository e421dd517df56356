"""What one run is, once its rank files are read (analysis/reader.py reads them): a RankFile per
rank (its root attributes, config and tables) and the Run they make, which names the run's program,
schedule and layout and tells which ranks shared a GPU.

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
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np


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


def shared_gpu_note(runs) -> Optional[str]:
    """The note for results made from `runs` (None entries are skipped) when ranks of any of them
    shared a GPU: "2 ranks shared one GPU: timings are functional, not speed figures"; else None."""
    phrases: List[str] = []
    for run in runs:
        s = run.sharing() if run is not None else None
        if s and s not in phrases:
            phrases.append(s)
    return f"{'; '.join(phrases)}: {SHARED_GPU_CAVEAT}" if phrases else None

