"""The GPUs each rank of a simulated Timeline stands for: the names of the Gantt rows, the
hover text and the report's tables.

A simulated Timeline's rank r is pipeline rank r of replica 0 (the Plan's words): global
rank `plan['replayed_ranks'][r]` on GPU `plan['devices'][r]`. Under the symmetric replay
(docs/architecture.md, "What is replayed") it also stands for every other rank with the
same pipeline coordinate: the same program on the other tp/cp/dp replicas, assumed to take
the same time. Global rank g runs on GPU `gpu{g}`: the cluster hands ranks the GPUs in
`index` order (sim.cluster) and a GPU's node id is `gpu{index}` (topologies.graph checks
it); a job placed on other GPUs (simulate(..., gpus=)) names the ranks a row stands for by
rank instead. The rank grid is ParallelConfig's (schedules.parallel), rebuilt from plan['parallel'].
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.names import PP
from clustersim.schedules.parallel import ParallelConfig

SHOWN_RANGES = 4  # ranges of GPU ids written out before "…"


@dataclass(frozen=True, slots=True)
class RankGpus:
    """The GPU of a Timeline rank and the global ranks (= GPU indices) it stands for."""

    rank: int  # the Timeline's rank (a pipeline rank of replica 0 in a simulation)
    gpu: str  # GPU node id of the replayed rank
    global_rank: int
    stands_for: tuple[int, ...]  # global ranks timed by this row, its own included

    @property
    def label(self) -> str:
        """Short row name: `rank 3 · gpu192`, `+63` when it stands for 63 more GPUs."""
        more = len(self.stands_for) - 1
        return f"rank {self.rank} · {self.gpu}" + (f" +{more}" if more else "")

    def describe(self) -> str:
        """The replayed GPU and, under the symmetric replay, the GPUs the row times."""
        own = f"{self.gpu} (global rank {self.global_rank})"
        if len(self.stands_for) == 1:
            return own
        if self.gpu == f"gpu{self.global_rank}":
            them = f"{gpu_ranges(self.stands_for)}: {len(self.stands_for)} GPUs"
        else:  # a job placed on other GPUs (simulate(..., gpus=)): its ranks, not GPU names
            them = (f"global ranks {gpu_ranges(self.stands_for, prefix='')}: "
                    f"{len(self.stands_for)} ranks")
        return f"{own}; stands for {them}, one program (symmetric replay)"


def gpu_ranges(ranks: Sequence[int], shown: int = SHOWN_RANGES, prefix: str = "gpu") -> str:
    """`gpu0–gpu63`, `gpu0–gpu7, gpu16–gpu23, …` for sorted global ranks (GPU indices;
    `prefix` '' writes the rank numbers alone)."""
    runs: list[list[int]] = []
    for g in sorted(ranks):
        if runs and g == runs[-1][1] + 1:
            runs[-1][1] = g
        else:
            runs.append([g, g])
    parts = [f"{prefix}{a}" if a == b else f"{prefix}{a}–{prefix}{b}" for a, b in runs[:shown]]
    return ", ".join(parts) + (f", … ({len(runs)} ranges)" if len(runs) > shown else "")


def _same_coordinate(parallel: ParallelConfig, world: int) -> dict[int, list[int]]:
    """Global ranks by pipeline coordinate."""
    by_pp: dict[int, list[int]] = defaultdict(list)
    for g in range(world):
        by_pp[parallel.coords(g)[PP]].append(g)
    return by_pp


def rank_gpus(plan: Mapping[str, Any] | None) -> dict[int, RankGpus]:
    """RankGpus of every replayed rank of a described plan (Plan.describe); empty when the
    plan places no ranks on GPUs (a run without a cluster, such as the kernels backend)."""
    if not plan or not plan.get("devices") or not plan.get("replayed_ranks"):
        return {}
    replayed, devices = list(plan["replayed_ranks"]), list(plan["devices"])
    world = int(plan.get("world_size") or len(replayed))
    try:
        parallel = ParallelConfig(**plan["parallel"])
    except (ConfigError, KeyError, TypeError):  # an older or foreign plan: own GPU only
        parallel = None
    symmetric = (parallel is not None and len(replayed) < world
                 and parallel.dp_impl != "dataparallel")  # DataParallel: GPU 0 differs
    by_pp = _same_coordinate(parallel, world) if symmetric else {}
    return {r: RankGpus(r, gpu, g, tuple(by_pp[parallel.coords(g)[PP]]) if symmetric
                        else (g,))
            for r, (gpu, g) in enumerate(zip(devices, replayed))}
