"""Collective algorithms as phases of flows: what each GPU sends to whom, and how many
latency steps each phase pays; and their uncontended alpha-beta estimate (`estimate_time`,
the rule in sim.collectives). No simulation here (sim.collectives runs the phases).

A `Phase` is (steps, flows[(src_gpu, dst_gpu, nbytes)]). Chunks are pipelined as in NCCL,
so a phase is one flow per (src, dst) pair carrying that pair's total bytes, not one flow
per chunk; it costs `steps` route latencies plus the time the flows need on the network.
Units: bytes.

Sizes follow nccl-tests (doc/PERFORMANCE.md): S is the per-rank buffer for all-reduce,
broadcast and reduce, the total output for all-gather (each rank contributes S/n), the
per-rank input for reduce-scatter (output S/n), the per-rank send buffer for all-to-all
(S/n per peer).

Algorithms (n ranks, in the order given):
- ring: all-reduce 2(n-1) steps, flow i->i+1 of 2(n-1)/n*S; all-gather and reduce-scatter
  n-1 steps, flows of (n-1)/n*S; broadcast a pipelined chain from rank 0, n-1 steps, S;
  reduce the same chain towards rank 0 (NCCL runs broadcast and reduce as rings only:
  src/device/broadcast.h, reduce.h).
- tree: NCCL's double binary tree (Sanders, Speck & Traeff 2009; NCCL src/graph/trees.cc):
  two complementary binary trees, each carrying S/2. All-reduce = reduce up + broadcast
  down, pipelined, so one phase with both directions, 2*depth steps (depth =
  ceil(log2 n)). Broadcast: the root sends S/2 to the root of each of two trees spanning
  the other n-1 ranks, which forward it down: one phase, 1 + depth steps.
- hierarchical (GPUs grouped by their `host`, g per host, h hosts): all-reduce =
  intra-host reduce-scatter rings, then g concurrent inter-host all-reduce rings (one per
  local index) on S/g, then intra-host all-gather rings. All-gather = inter-host rings
  (each rank's S/n to its peers of the same local index), then intra-host rings;
  reduce-scatter mirrors it (intra-host first, then inter-host on S/g).
- multi-ring (multi-host groups): NCCL's channels: g rings at once, each on S/g, ring j
  visiting each host's GPUs starting from local index j, so each ring leaves every host
  through a different GPU (and NIC). Steps and per-ring bytes as ring. A pipelined ring
  runs at its slowest link: here each flow is independent, so the NVLink flows finish
  early and the NIC flows set the makespan, as in the real pipeline.
- direct: all-to-all, one step, a flow i->j of S/n for every i != j; P2P, one flow.
To add an algorithm: docs/architecture.md, "Add a collective algorithm".
"""
from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np

from clustersim.schedules.errors import ConfigError

from .route_shares import route_shares

FlowSpec = tuple[str, str, float]  # (src gpu, dst gpu, bytes)


@dataclass(frozen=True)
class Phase:
    """Flows that run together after `steps` route latencies, or after `latency` seconds
    where it is given (NCCL's latency of the algorithm and protocol: sim.nccl_collectives)."""

    steps: int
    flows: list[FlowSpec]
    latency: float | None = None

    def wait(self, alpha: float) -> float:
        """Seconds before the flows start, `alpha` being the largest route latency."""
        return self.steps * alpha if self.latency is None else self.latency


def paid_latency(phases: Sequence[Phase]) -> tuple[int, float | None]:
    """What `phases` pay before their flows, as reported: the route-latency steps of the
    phases that pay steps (Phase.wait), and the seconds of the latencies given to the
    others (NCCL's model of the algorithm and protocol), None when no phase has one. A
    phase with a given latency pays no steps, whatever its `steps` says."""
    steps = sum(p.steps for p in phases if p.latency is None)
    given = [p.latency for p in phases if p.latency is not None]
    return steps, (sum(given) if given else None)


# --- rings -----------------------------------------------------------------------------------
def ring_flows(gpus: Sequence[str], nbytes: float) -> list[FlowSpec]:
    """Every rank sends `nbytes` to the next one in `gpus`, the last back to the first."""
    n = len(gpus)
    return [(gpus[i], gpus[(i + 1) % n], nbytes) for i in range(n)] if n > 1 else []


def ring(op: str, gpus: Sequence[str], size: float) -> list[Phase]:
    n = len(gpus)
    if op == "all-reduce":
        return [Phase(2 * (n - 1), ring_flows(gpus, 2 * (n - 1) / n * size))]
    if op in ("all-gather", "reduce-scatter"):
        return [Phase(n - 1, ring_flows(gpus, (n - 1) / n * size))]
    if op == "broadcast":
        return [Phase(n - 1, [(gpus[i], gpus[i + 1], size) for i in range(n - 1)])]
    if op == "reduce":  # the broadcast's chain run backwards, ending at rank 0
        return [Phase(n - 1, [(gpus[i + 1], gpus[i], size) for i in range(n - 1)])]
    raise AssertionError(op)


# --- double binary tree ------------------------------------------------------------------------
def btree_parent(rank: int, n: int) -> int:
    """Parent of `rank` in NCCL's binary tree over 0..n-1 rooted at 0 (-1 for the root):
    clear the lowest set bit and set the next one up, or just clear it if that is >= n."""
    if rank == 0:
        return -1
    bit = rank & -rank
    up = (rank ^ bit) | (bit << 1)
    return up if up < n else rank ^ bit


def double_binary_tree(n: int) -> tuple[list[int], list[int]]:
    """Parents (-1 = root) of the two trees: the binary tree, and its mirror (n even) or
    its shift by one rank (n odd), so that a rank inner in one tree is a leaf in the other."""
    first = [btree_parent(r, n) for r in range(n)]
    second = []
    for r in range(n):
        if n % 2:
            p = btree_parent((r - 1) % n, n)
            second.append(-1 if p < 0 else (p + 1) % n)
        else:
            p = btree_parent(n - 1 - r, n)
            second.append(-1 if p < 0 else n - 1 - p)
    return first, second


def tree_depth(parents: Sequence[int]) -> int:
    """Edges on the longest root-to-leaf path."""
    depth = 0
    for r in range(len(parents)):
        d, p = 0, parents[r]
        while p >= 0:
            d, p = d + 1, parents[p]
        depth = max(depth, d)
    return depth


def tree(op: str, gpus: Sequence[str], size: float) -> list[Phase]:
    n = len(gpus)
    if n < 2:
        return []
    if op == "all-reduce":
        trees = double_binary_tree(n)
        flows = [flow for parents in trees for r, p in enumerate(parents) if p >= 0
                 for flow in ((gpus[r], gpus[p], size / 2), (gpus[p], gpus[r], size / 2))]
        return [Phase(2 * max(map(tree_depth, trees)), flows)]
    if op == "broadcast":
        root, others = gpus[0], gpus[1:]
        trees = double_binary_tree(len(others))
        flows = [(root, others[parents.index(-1)], size / 2) for parents in trees]
        flows += [(others[p], others[r], size / 2)
                  for parents in trees for r, p in enumerate(parents) if p >= 0]
        return [Phase(1 + max(map(tree_depth, trees)), flows)]
    raise AssertionError(op)


def nccl_tree(op: str, gpus: Sequence[str], size: float,
              host_of: Mapping[str, int]) -> list[Phase]:
    """NCCL's tree all-reduce (src/graph/trees.cc, connect.cc): inside each host a chain
    of its GPUs, across hosts the double binary tree of the hosts, whose edges join the
    chains' heads; two trees each carry S/2 up (reduce) and down (broadcast), pipelined
    as one phase. Tree t's chain starts at local index t x g/2, so the two trees leave a
    host through different GPUs (and NICs). Hosts of unequal size keep one chain each."""
    if op != "all-reduce":
        raise AssertionError(op)
    groups: dict[int, list[str]] = {}
    for gpu in gpus:
        groups.setdefault(host_of[gpu], []).append(gpu)
    hosts = list(groups.values())
    flows: list[FlowSpec] = []
    for t, parents in enumerate(double_binary_tree(len(hosts)) if len(hosts) > 1
                                else ([-1], [-1])):
        chains = [host[t * len(host) // 2:] + host[:t * len(host) // 2] for host in hosts]
        for chain in chains:
            for a, b in zip(chain, chain[1:]):
                flows += [(b, a, size / 2), (a, b, size / 2)]
        for child, parent in enumerate(parents):
            if parent >= 0:
                a, b = chains[child][0], chains[parent][0]
                flows += [(a, b, size / 2), (b, a, size / 2)]
    return [Phase(1, flows)]


def pat(op: str, gpus: Sequence[str], size: float) -> list[Phase]:
    """NCCL's PAT (parallel aggregated trees) all-gather / reduce-scatter, log-depth: at
    distance d = 1, 2, 4, ... each rank passes min(d, n - d) chunks of S/n to the rank d
    after it (all-gather; reduce-scatter the rank d before it), n - 1 chunks in all, as
    in a ring; pipelined as one phase."""
    n, chunk = len(gpus), size / len(gpus)
    sign = 1 if op == "all-gather" else -1
    if op not in ("all-gather", "reduce-scatter"):
        raise AssertionError(op)
    flows: list[FlowSpec] = []
    d = 1
    while d < n:
        flows += [(gpus[r], gpus[(r + sign * d) % n], min(d, n - d) * chunk) for r in range(n)]
        d *= 2
    return [Phase(1, flows)]


def collnet_chain(op: str, gpus: Sequence[str], size: float, host_of: Mapping[str, int],
                  leaf_of: Mapping[str, str]) -> list[Phase]:
    """NCCL's CollNet chain all-reduce through in-network reduction (SHARP): one channel
    per GPU of a host (its head, leaving through its NIC), each on S/g: a chain through
    the host's GPUs from its head reduces up to the head, which sends its S/g to its
    leaf switch; the network reduces it with the other hosts' (switch-to-switch traffic
    not simulated) and sends the sum back, which the chain passes down. Per GPU,
    (2g - 2)/g S out through its NVLink (up and down the chains); per NIC, S/g each way
    (sim.nccl_collectives runs these network legs at NCCL's CollNet share). One pipelined
    phase."""
    if op != "all-reduce":
        raise AssertionError(op)
    hosts = host_groups(gpus, host_of, "collnet-chain")
    g = len(hosts[0])
    flows: list[FlowSpec] = []
    for host in hosts:
        for j in range(g):
            chain = host[j:] + host[:j]
            for a, b in zip(chain, chain[1:]):
                flows += [(b, a, size / g), (a, b, size / g)]
            flows += [(chain[0], leaf_of[chain[0]], size / g),
                      (leaf_of[chain[0]], chain[0], size / g)]
    return [Phase(1, flows)]


# --- hierarchical ------------------------------------------------------------------------------
def host_groups(gpus: Sequence[str], host_of: Mapping[str, int],
                algorithm: str = "hierarchical") -> list[list[str]]:
    """`gpus` grouped by host (hosts in order of first appearance); raises ConfigError
    unless there are >= 2 hosts with the same number (>= 2) of the GPUs on each."""
    groups: dict[int, list[str]] = {}
    for gpu in gpus:
        groups.setdefault(host_of[gpu], []).append(gpu)
    sizes = {host: len(g) for host, g in groups.items()}
    if len(groups) < 2:
        raise ConfigError(
            f"algorithm={algorithm!r} needs the ranks on at least 2 hosts; all "
            f"{len(gpus)} are on host {next(iter(groups))} (use ring or tree)")
    if len(set(sizes.values())) > 1 or min(sizes.values()) < 2:
        shown = ", ".join(f"host {h}: {c}" for h, c in list(sizes.items())[:6])
        raise ConfigError(
            f"algorithm={algorithm!r} needs the same number (>= 2) of ranks on every host; "
            f"got {shown}{' ...' if len(sizes) > 6 else ''}")
    return list(groups.values())


def hierarchical(op: str, gpus: Sequence[str], size: float,
                 host_of: Mapping[str, int]) -> list[Phase]:
    hosts = host_groups(gpus, host_of)
    h, g = len(hosts), len(hosts[0])
    n = h * g
    rails = [[hosts[k][j] for k in range(h)] for j in range(g)]

    def intra(nbytes: float) -> Phase:
        return Phase(g - 1, [f for group in hosts for f in ring_flows(group, nbytes)])

    def inter(steps: int, nbytes: float) -> Phase:
        return Phase(steps, [f for rail in rails for f in ring_flows(rail, nbytes)])

    if op == "all-reduce":
        return [intra((g - 1) / g * size), inter(2 * (h - 1), 2 * (h - 1) / h * size / g),
                intra((g - 1) / g * size)]
    if op == "all-gather":
        return [inter(h - 1, (h - 1) * size / n), intra((g - 1) / g * size)]
    if op == "reduce-scatter":
        return [intra((g - 1) / g * size), inter(h - 1, (h - 1) / h * size / g)]
    raise AssertionError(op)


def multi_ring(op: str, gpus: Sequence[str], size: float,
               host_of: Mapping[str, int]) -> list[Phase]:
    hosts = host_groups(gpus, host_of, "multi-ring")
    g = len(hosts[0])
    orders = [[group[(j + i) % g] for group in hosts for i in range(g)] for j in range(g)]
    phases = [ring(op, order, size / g)[0] for order in orders]
    return [Phase(phases[0].steps, [f for phase in phases for f in phase.flows])]


# --- NVLink SHARP ------------------------------------------------------------------------------
def nvls(op: str, gpus: Sequence[str], size: float, switch_of: Mapping[str, str]) -> list[Phase]:
    """NVLS on one NVSwitch: each GPU reduces its 1/n shard in the switch (multimem
    ld_reduce: the switch reads the shard from all n GPUs) and stores the result to all
    (multimem st, the switch writes it to every GPU). All-reduce: out S + S/n, in S/n + S
    per GPU; all-gather: out S/n, in S; reduce-scatter: out S, in S/n. One phase: NCCL
    pipelines the two halves."""
    n = len(gpus)
    out, into = {"all-reduce": (size * (1 + 1 / n), size * (1 + 1 / n)),
                 "all-gather": (size / n, size), "reduce-scatter": (size, size / n)}[op]
    return [Phase(1, [f for g in gpus for f in ((g, switch_of[g], out), (switch_of[g], g, into))])]


def nvls_tree(op: str, gpus: Sequence[str], size: float, host_of: Mapping[str, int],
              switch_of: Mapping[str, str]) -> list[Phase]:
    """NCCL's NVLS-tree all-reduce over hosts of g GPUs: NVLS reduce-scatter inside each
    host, an all-reduce of each GPU's S/g shard with the GPUs of its local index on the
    other hosts along NCCL's double binary tree of hosts (each tree carries half the
    shard up and down), NVLS all-gather inside each host; pipelined as one phase."""
    hosts = host_groups(gpus, host_of, "nvls-tree")
    g = len(hosts[0])
    flows = [f for host in hosts for f in nvls("all-reduce", host, size, switch_of)[0].flows]
    for parents in double_binary_tree(len(hosts)):
        for child, parent in enumerate(parents):
            if parent >= 0:
                for j in range(g):
                    a, b = hosts[child][j], hosts[parent][j]
                    flows += [(a, b, size / g / 2), (b, a, size / g / 2)]
    return [Phase(1, flows)]


# --- direct ------------------------------------------------------------------------------------
def direct(op: str, gpus: Sequence[str], size: float) -> list[Phase]:
    n = len(gpus)
    if op == "all-to-all":
        share = size / n
        return [Phase(1, [(a, b, share) for a in gpus for b in gpus if a != b])] if n > 1 else []
    if op == "p2p":
        if n != 2:
            raise ConfigError(f"p2p: needs exactly 2 ranks (sender, receiver), got {n}")
        return [Phase(1, [(gpus[0], gpus[1], size)])]
    raise AssertionError(op)


# --- the alpha-beta estimate ----------------------------------------------------------------
def estimate_time(phases: Sequence[Phase], graph: nx.DiGraph,
                  per_pair: Callable | None = None) -> float:
    """Uncontended alpha-beta time of `phases` on `graph` (s): per phase, steps * the
    largest route latency + the most bytes on any link / its bandwidth, each flow's bytes
    split evenly over its equal-cost routes (the rule in sim.collectives). The routes'
    latencies and shares are cached per graph object (sim.route_shares: exact).
    `per_pair(src, dst)`: (latency, link ids, shares) of a pair, in place of
    RouteShares.of (sim.planner.bound.safe_time charges only what every route holds)."""
    shares = route_shares(graph)
    of = per_pair or shares.of
    total = 0.0
    for phase in phases:
        pairs = [of(src, dst) for src, dst, _ in phase.flows]
        alpha = max((p[0] for p in pairs), default=0.0)
        load, used = shares.phase_load(pairs, [nbytes for _, _, nbytes in phase.flows])
        beta = float(np.max(load[used] / shares.bandwidth[used])) if used.any() else 0.0
        total += phase.wait(alpha) + beta
    return total


_SAMPLE = 512  # flows per phase that estimate_lower_bound looks at


def estimate_lower_bound(phases: Sequence[Phase], graph: nx.DiGraph) -> float:
    """A bound never above `estimate_time(phases, graph)`, from a fixed sample of each
    phase's flows: steps x the largest sampled route latency + the largest load one
    sampled flow alone puts on a link / its bandwidth. It cannot exceed the estimate in
    floating point either: the same operations on inputs no larger (a sum of
    non-negative terms rounds to no less than any of its terms; *, / and + round
    monotonically)."""
    shares = route_shares(graph)
    total = 0.0
    for phase in phases:
        flows = phase.flows
        picked = (flows if len(flows) <= _SAMPLE else
                  [flows[i] for i in random.Random(len(flows)).sample(range(len(flows)),
                                                                     _SAMPLE)])
        alpha, beta = 0.0, 0.0
        for src, dst, nbytes in picked:
            latency, ids, part = shares.of(src, dst)
            alpha = max(alpha, latency)
            if len(ids):
                beta = max(beta, float(np.max(nbytes * part / shares.bandwidth[ids])))
        total += phase.wait(alpha) + beta
    return total
