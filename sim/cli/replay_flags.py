"""`simulate`'s flags for what the symmetric replay cannot see: which ranks to replay
(sim.world), slow GPUs (one by one, or every GPU's speed drawn from a distribution), and
slow or failed links (topologies.faults). A slow GPU or a faulted link makes the default
`--replay auto` replay every rank, and says so."""
from __future__ import annotations

import argparse

import networkx as nx

from clustersim.schedules.errors import ConfigError
from clustersim.topologies.faults import degrade, fail

from ..world import REPLAY_MODES, GpuSpread, Replaying


def add_replay_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("whole cluster: replayed ranks, stragglers, faults")
    group.add_argument("--replay", choices=REPLAY_MODES, default="auto",
                       help="symmetric: one pipeline replica, the others assumed alike; all: "
                            "every rank, each collective once its group's members all posted "
                            "it; auto (default): symmetric unless a slow GPU, a fault or an "
                            "uneven cluster breaks the symmetry")
    group.add_argument("--slow-gpu", action="append", default=[], metavar="RANK=FACTOR",
                       help="global rank RANK's compute takes FACTOR times as long (1.5: 50%% "
                            "slower); repeatable")
    group.add_argument("--gpu-spread", metavar="DIST:PARAMS",
                       help="every GPU's compute-time factor drawn independently: "
                            "lognormal:SIGMA (median 1, e.g. lognormal:0.05) or "
                            "uniform:LOW,HIGH (e.g. uniform:1,1.1); --slow-gpu overrides its "
                            "rank's draw; replays every rank")
    group.add_argument("--gpu-spread-seed", type=int, default=0, metavar="N",
                       help="seed of the --gpu-spread draws (numpy default_rng; default 0)")
    group.add_argument("--slow-link", action="append", default=[], metavar="LINK=FACTOR",
                       help="a link (a:b) or all of a node's links (a) keep FACTOR of their "
                            "bandwidth (0 < FACTOR <= 1, e.g. nic3=0.5); repeatable")
    group.add_argument("--fail-link", action="append", default=[], metavar="LINK",
                       help="a link (a:b) or all of a node's links (a) fail; traffic takes the "
                            "routes left; repeatable")


def _pair(flag: str, text: str) -> tuple[str, float]:
    name, sep, factor = text.rpartition("=")
    try:
        return name, float(factor) if sep and name else float("nan")
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected NAME=FACTOR with a number FACTOR")


def replaying_from_args(args: argparse.Namespace) -> Replaying:
    slow = []
    for text in args.slow_gpu:
        rank, factor = _pair("--slow-gpu", text)
        if not rank.isdigit() or factor != factor:
            raise ConfigError(f"--slow-gpu {text!r}: expected RANK=FACTOR, e.g. 17=1.5")
        slow.append((int(rank), factor))
    return Replaying(args.replay, tuple(slow), _spread(args))


def _spread(args: argparse.Namespace) -> GpuSpread | None:
    if args.gpu_spread is None:
        if args.gpu_spread_seed:
            raise ConfigError("--gpu-spread-seed: only with --gpu-spread (it seeds its draws)")
        return None
    name, _, params = args.gpu_spread.partition(":")
    try:
        values = tuple(float(v) for v in params.split(",")) if params else ()
    except ValueError:
        raise ConfigError(f"--gpu-spread {args.gpu_spread!r}: expected DIST:PARAMS, e.g. "
                          f"lognormal:0.05 or uniform:1,1.1")
    try:
        return GpuSpread(name, values, args.gpu_spread_seed)
    except ConfigError as err:
        raise ConfigError(f"--gpu-spread {args.gpu_spread!r}: {err}") from None


def faulted_topology(topology: nx.DiGraph, args: argparse.Namespace) -> nx.DiGraph:
    """`topology` with the --slow-link and --fail-link faults applied (a copy when any)."""
    for text in args.slow_link:
        link, factor = _pair("--slow-link", text)
        if factor != factor:
            raise ConfigError(f"--slow-link {text!r}: expected LINK=FACTOR, e.g. nic3=0.5")
        topology = degrade(topology, link, factor)
    for link in args.fail_link:
        topology = fail(topology, link)
    return topology
