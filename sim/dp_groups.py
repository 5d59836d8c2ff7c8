"""Data-parallel group axes -> concrete ranks and GPUs (the ops name axes, not ranks).

- 'dp': parallel.group('dp', rank), the DP group in dp-coordinate order.
- 'dp_shard': the block of `shard` consecutive dp coordinates holding the rank (HSDP's
  shard group, ZeRO++ hpZ's secondary partition): ranks of one node when `shard` is the
  number of dp ranks per node, the default.
- 'dp_replicate': the dp coordinates congruent to the rank's modulo `shard` (one per
  shard group): the replicas that all-reduce a shard across nodes.
`shard_size(parallel, topology)` resolves the shard group size: `shard_size` (hybrid) or
`hpz_partition_size` (hpZ) when given, else the dp ranks that share the host of the first
replica's rank. A hybrid shard group of a whole single-node dp group has no node
boundary to replicate across and is refused.
"""
from __future__ import annotations

import networkx as nx

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.sharding import group_ranks
from clustersim.topologies import gpu_nodes


def ranks_per_node(parallel: ParallelConfig, topology: nx.DiGraph) -> int:
    """dp ranks of the first replica's DP group that sit on its first rank's host."""
    gpus = gpu_nodes(topology)
    group = parallel.group("dp", parallel.rank())
    host = topology.nodes[gpus[group[0]]]["host"]
    return sum(1 for g in group if topology.nodes[gpus[g]]["host"] == host)


def shard_size(parallel: ParallelConfig, topology: nx.DiGraph) -> int | None:
    """Size of the 'dp_shard' group (module docstring); None when the run has none."""
    if parallel.fsdp == "hybrid":
        field, given = "shard_size", parallel.shard_size
    elif parallel.hpz:
        field, given = "hpz_partition_size", parallel.hpz_partition_size
    else:
        return None
    size = given if given is not None else ranks_per_node(parallel, topology)
    if parallel.dp % size:
        raise ConfigError(f"{field}={size} must divide dp={parallel.dp}: shard groups tile "
                          f"the data-parallel group")
    if parallel.fsdp == "hybrid" and size == parallel.dp:
        where = (f"all dp={parallel.dp} ranks sit on one node of topology "
                 f"{topology.graph.get('name', '?')!r}" if given is None
                 else f"shard_size={size} equals dp")
        raise ConfigError(f"fsdp='hybrid' shards inside a node and replicates across nodes, "
                          f"but {where}: there is no node boundary to replicate across; set "
                          f"shard_size to a divisor of dp smaller than dp, or use fsdp='full'")
    return size


def group_size(parallel: ParallelConfig, axis: str, shard: int | None) -> int:
    return len(group_ranks(parallel, axis, parallel.rank(), shard))
