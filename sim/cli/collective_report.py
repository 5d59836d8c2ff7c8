"""`clustersim collective`: simulate one collective, or a size sweep printed like
nccl-tests' table. Times in µs, bandwidths in GB/s (1e9 bytes/s, as nccl-tests).

Sizes: a number of bytes with an optional unit. K, M, G, T (any case, optionally with
'i' + 'B': KiB, MiB, ...) are binary (2^10, 2^20, ...), as nccl-tests' `-b 8 -e 128M`;
kB/KB, MB, GB, TB are decimal (1e3, 1e6, ...). So `1G` = 1073741824, `1GB` = 1e9.
The sweep's `count` column is nccl-tests' count of `--dtype` elements (float by default):
the whole buffer for all-reduce, broadcast, reduce and p2p; one rank's part for
all-gather and reduce-scatter, and one peer's for all-to-all, rounded down as
nccl-tests 2.13+ does (`nccl_tests_count`).
"""
from __future__ import annotations

import argparse
import json
import math
import re

from clustersim.schedules.errors import ConfigError

from .flags import DEFAULT_TOPOLOGY

_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgt", start=1):
    _UNITS.update({_p: 1024 ** _i, f"{_p}i": 1024 ** _i, f"{_p}ib": 1024 ** _i,
                   f"{_p}b": 1000 ** _i})
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?(?:e\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
MAX_COLLECTIVE_BYTES = 1e15  # one collective's buffer above 1 PB is a typo
MAX_SWEEP_SIZES = 1000  # nccl-tests' default sweep (8 B .. 1 GB, factor 2) has 28
DTYPE_BYTES = {"int8": 1, "uint8": 1, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
               "float": 4, "fp32": 4, "int32": 4, "double": 8, "fp64": 8, "int64": 8}


def parse_size(text: str, flag: str = "--size") -> int:
    """Bytes in `text` ('8', '256M', '1G', '1GB', '1.5KiB', '1e9'); see module docstring."""
    match = _SIZE.match(str(text))
    unit = match and _UNITS.get(match.group(2).lower())
    if not match or unit is None:
        raise ConfigError(f"{flag}: {text!r} is not a size; give bytes with an optional unit, "
                          "e.g. 8, 8K, 256M, 1G (binary, as nccl-tests) or 1GB (decimal)")
    value = float(match.group(1)) * unit
    if not 1 <= value <= MAX_COLLECTIVE_BYTES or value != int(value):
        raise ConfigError(f"{flag}: {text!r} is {value:g} bytes; it must be a whole number "
                          f"from 1 to {MAX_COLLECTIVE_BYTES:.0e} (1 PB)")
    return int(value)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collective", help="simulate a collective (nccl-tests style bandwidths)",
        description="Simulate one collective on a topology and print time, algbw and busbw "
                    "(nccl-tests conventions), or a size sweep as nccl-tests' table.")
    p.add_argument("op", help="all-reduce, all-gather, reduce-scatter, broadcast, reduce or "
                              "all-to-all (allreduce, all_reduce, ... also accepted)")
    p.add_argument("--size", help="bytes: per-rank buffer (all-reduce, broadcast, reduce, "
                                  "all-to-all, reduce-scatter input), total output "
                                  "(all-gather); 1G = 2^30")
    p.add_argument("--ranks", type=int, help="use the first N GPUs (default: all)")
    p.add_argument("--topology", default=DEFAULT_TOPOLOGY,
                   help=f"preset name or topology JSON file (default {DEFAULT_TOPOLOGY})")
    p.add_argument("--algorithm", help="ring, tree, nvls, nvls-tree, pat, collnet-chain "
                                       "(NCCL's; multi-ring is NCCL's ring across hosts; "
                                       "collnet-chain needs a SHARP fabric), hierarchical "
                                       "or direct "
                                       "(default: NCCL's own choice on CUDA GPUs, else the "
                                       "fastest alpha-beta estimate)")
    p.add_argument("--protocol", help="LL, LL128 or Simple: NCCL's protocol for NCCL's "
                                      "algorithms (default: NCCL's own choice; not for "
                                      "all-to-all and p2p, whose NCCL picks by size)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--sweep", action="store_true", help="sweep sizes from --min-size to --max-size")
    p.add_argument("--min-size", default="8", help="sweep start (default 8)")
    p.add_argument("--max-size", default="1G", help="sweep end (default 1G)")
    p.add_argument("--factor", type=float, default=2.0, help="sweep size factor (default 2)")
    p.add_argument("--dtype", default="float", help=f"element type for the count column "
                                                    f"(default float; {', '.join(DTYPE_BYTES)})")


def sweep_sizes(min_size: int, max_size: int, factor: float) -> list[int]:
    if not factor > 1 or not math.isfinite(factor):
        raise ConfigError(f"--factor must be a finite number > 1, got {factor}")
    if min_size > max_size:
        raise ConfigError(f"--min-size ({min_size}) must be <= --max-size ({max_size})")
    count = math.floor(math.log(max_size / min_size) / math.log(factor)) + 1
    if count > MAX_SWEEP_SIZES:
        raise ConfigError(f"--factor {factor} from {min_size} to {max_size} bytes makes "
                          f"{count:,} sizes, above {MAX_SWEEP_SIZES:,}: raise --factor or "
                          f"narrow the range")
    sizes, size = [], float(min_size)
    while size <= max_size * (1 + 1e-12):
        sizes.append(int(round(size)))
        size *= factor
    return sizes


def nccl_tests_count(op: str, nbytes: int, width: int, ranks: int) -> int:
    """The count nccl-tests prints for a size of `nbytes` (its *GetCollByteCount's
    paramcount): all-gather and reduce-scatter (count / (4 n)) x 4, all-to-all count / n
    down to a multiple of 16 bytes' elements; the whole count otherwise."""
    count = nbytes // width
    if op in ("all-gather", "reduce-scatter"):
        return count // (4 * ranks) * 4
    if op == "all-to-all":
        return count // ranks & -max(16 // width, 1)
    return count


def format_sweep(rows: list[dict], dtype: str) -> str:
    width = DTYPE_BYTES[dtype]
    lines = [f"#{'size':>12} {'count':>12} {'type':>8} {'algorithm':>13} {'time':>11} "
             f"{'algbw':>8} {'busbw':>8}",
             f"#{'(B)':>12} {'(elements)':>12} {'':>8} {'':>13} {'(us)':>11} "
             f"{'(GB/s)':>8} {'(GB/s)':>8}"]
    for r in rows:
        count = nccl_tests_count(r["op"], int(r["size_bytes"]), width, r["ranks"])
        lines.append(f" {int(r['size_bytes']):>12} {count:>12} "
                     f"{dtype:>8} {r['algorithm']:>13} {r['time_us']:>11.2f} "
                     f"{r['algbw_GBps']:>8.2f} {r['busbw_GBps']:>8.2f}")
    mean = sum(r["busbw_GBps"] for r in rows) / len(rows)
    lines.append(f"# Avg bus bandwidth    : {mean:.3f} GB/s")
    return "\n".join(lines)


def cmd_collective(args: argparse.Namespace) -> int:
    from clustersim.topologies import gpu_nodes, load_topology

    from ..collectives import parse_collective, sweep_collective
    from ..nccl_collectives import SEND_RECV
    from ..nccl_tuning import P2P_LL_THRESHOLD

    op = parse_collective(args.op)
    if args.protocol and op.value in SEND_RECV:
        raise ConfigError(f"--protocol: NCCL picks {op.value}'s protocol itself (send/recv: "
                          f"LL up to {P2P_LL_THRESHOLD // 1024} KiB per peer, Simple above; "
                          f"NCCL_PROTO does not apply), so it would change nothing")
    dtype = args.dtype.strip().lower()
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPE_BYTES)}, got {args.dtype!r}")
    if args.sweep:
        sizes = sweep_sizes(parse_size(args.min_size, "--min-size"),
                            parse_size(args.max_size, "--max-size"), args.factor)
    elif args.size is None:
        raise ConfigError("--size is required (or --sweep with --min-size/--max-size)")
    else:
        sizes = [parse_size(args.size)]
    graph = load_topology(args.topology)
    ranks = len(gpu_nodes(graph)) if args.ranks is None else args.ranks
    results = sweep_collective(op, sizes, ranks, graph, args.algorithm, args.protocol)
    rows = [{**r.to_dict(), "topology": graph.graph.get("name")} for r in results]
    if args.json:
        print(json.dumps(rows if args.sweep else rows[0], indent=2))
    elif args.sweep:
        print(f"# {op.value} on {ranks} ranks of {graph.graph.get('name')}"
              f" (simulated; algorithm {args.algorithm or 'auto'}, protocol "
              f"{args.protocol or 'auto'})")
        print(format_sweep(rows, dtype))
    else:
        r = rows[0]
        print(f"{op.value} of {r['size_bytes']} B on {ranks} ranks of {r['topology']}: "
              f"{r['time_us']:.2f} us, algbw {r['algbw_GBps']:.2f} GB/s, busbw "
              f"{r['busbw_GBps']:.2f} GB/s ({r['algorithm']}, {_latency(r)}, "
              f"{r['flows']} flows)")
    return 0


def _latency(row: dict) -> str:
    """The latency a run paid: NCCL's modelled latency of its algorithm and protocol, the
    latency assumed for its send/recv (direct: NCCL has no model of it), or the
    route-latency steps of a step-synchronous algorithm (sim.collectives)."""
    if "nccl_latency_us" in row:
        source = ("assumed: NCCL's one-hop ring latency" if row["algorithm"].startswith(
            "direct/") else "NCCL's model")
        return f"latency {row['nccl_latency_us']:.1f} us ({source})"
    return f"{row['steps']} steps"


COMMANDS = {"collective": cmd_collective}
