"""What a Plan knows of the cluster, as plain data: schedules imports no topology, so the
simulator reads these facts off its topology graph (sim.cluster) and the kernels backend,
which runs on whatever host it is given, has none.

Rank g of the parallel grid runs on `gpus[g]`, the g-th GPU in the topology's GPU order
(or of the GPUs a job is placed on, sim.cluster), whose host is `hosts[g]`. Units: bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError
from .names import DP


@dataclass(frozen=True)
class ClusterFacts:
    """The cluster's `name`, its GPU nodes in rank order and the host of each, and the
    device of its GPUs (`device`, `memory_bytes` of GPU 0's device)."""

    name: str
    gpus: tuple[str, ...]
    hosts: tuple[int, ...]
    device: str
    memory_bytes: float

    def __post_init__(self) -> None:
        if not self.gpus or len(self.gpus) != len(self.hosts):
            raise ConfigError(f"cluster {self.name!r}: one host per GPU and at least one GPU, "
                              f"got {len(self.gpus)} GPUs and {len(self.hosts)} hosts")

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    @property
    def gpus_per_node(self) -> int:
        """GPUs on the host of GPU 0."""
        return self.hosts.count(self.hosts[0])

    def check_fits(self, world_size: int) -> None:
        if world_size > self.num_gpus:
            raise ConfigError(f"the parallel config needs {world_size} GPUs (tp*cp*dp*pp), "
                              f"topology {self.name!r} has {self.num_gpus}")

    def spans_hosts(self, ranks: list[int]) -> bool:
        return len({self.hosts[g] for g in ranks}) > 1

    def dp_ranks_per_node(self, parallel) -> int:
        """Ranks of the first replica's DP group (a ParallelConfig's) on its first rank's
        host: the default size of a hybrid shard group or an hpZ partition."""
        group = parallel.group(DP, parallel.rank())
        self.check_fits(max(group) + 1)
        host = self.hosts[group[0]]
        return sum(1 for g in group if self.hosts[g] == host)
