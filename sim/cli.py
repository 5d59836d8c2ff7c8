"""The `clustersim` command line: simulate, show, compare, memory; calibrate and run on
hardware.

Every error a user can cause ends in one `clustersim: error: ...` line (a deadlock adds
its rank x step report) and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import argparse
import logging
import sys

from clustersim import __version__
from clustersim.schedules.errors import ClustersimError, DeadlockError
from clustersim.topologies import TopologyError

from . import collective_cli, commands, hardware_cli, memory_cli

EXIT_USAGE, EXIT_DEADLOCK = 2, 3


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump), like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (a preset, optionally overridden by Megatron-named dims)")
    g.add_argument("--model", default=commands.DEFAULT_MODEL,
                   help=f"model preset (default {commands.DEFAULT_MODEL}); "
                        "see `clustersim models`")
    for flag, kind in commands.MODEL_DIM_FLAGS.items():
        if kind is bool:
            g.add_argument(f"--{flag}", action="store_true", default=None)
        else:
            g.add_argument(f"--{flag}", type=kind, metavar=kind.__name__.upper())


def _add_parallel_flags(p: argparse.ArgumentParser, with_schedule: bool = True,
                        pp_default: int = commands.DEFAULT_PP) -> None:
    g = p.add_argument_group("parallelism (Megatron spellings accepted)")
    if with_schedule:
        g.add_argument("--schedule", default="1f1b",
                       help="gpipe, 1f1b or interleaved-1f1b (default 1f1b)")
    g.add_argument("--pp", "--pipeline-model-parallel-size", type=int,
                   default=pp_default, help=f"pipeline ranks (default {pp_default})")
    g.add_argument("--vpp", "--virtual-pipeline-model-parallel-size", type=int,
                   help="model chunks per rank (interleaved; default 2 there, else 1)")
    g.add_argument("--dp", "--data-parallel-size", type=int, default=1)
    g.add_argument("--tp", "--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--cp", "--context-parallel-size", type=int, default=1,
                   help="context-parallel ranks (the sequence split over them)")
    g.add_argument("--ep", "--expert-model-parallel-size", type=int, default=1,
                   help="expert-parallel ranks (MoE models; folds into dp * cp)")
    g.add_argument("--etp", "--expert-tensor-parallel-size", type=int,
                   help="expert tensor-parallel ranks: each MoE expert split over them "
                        "(default tp; etp * ep must divide tp * cp * dp)")
    g.add_argument("--sequence-parallel", action="store_true", default=None,
                   help="Megatron sequence parallelism (activations split by tp)")
    g.add_argument("--microbatches", "--num-microbatches", type=int,
                   help=f"microbatches per iteration (default {commands.DEFAULT_MICROBATCHES}, "
                        "or global-batch-size / (micro-batch-size * dp))")
    g.add_argument("--global-batch-size", type=int)
    g.add_argument("--rank-order", "--order", default="tp-cp-ep-dp-pp",
                   help="how the parallel grid maps to GPU indices, innermost first "
                        "(default Megatron's tp-cp-ep-dp-pp)")
    g.add_argument("--first-stage-layers", "--decoder-first-pipeline-num-layers", type=int,
                   help="layers on the first pipeline rank (the rest split evenly; "
                        "default: an even split)")
    g.add_argument("--last-stage-layers", "--decoder-last-pipeline-num-layers", type=int,
                   help="layers on the last pipeline rank, which also runs the output "
                        "layer and the loss")
    g.add_argument("--account-for-embedding", "--account-for-embedding-in-pipeline-split",
                   action="store_true", default=None,
                   help="count the embedding as one layer when splitting the pipeline")
    g.add_argument("--account-for-loss", "--account-for-loss-in-pipeline-split",
                   action="store_true", default=None,
                   help="count the output layer and loss as one layer when splitting")
    _add_sharding_flags(p)


def _add_sharding_flags(p: argparse.ArgumentParser) -> None:
    """ZeRO/FSDP, offload, ZeRO++, buckets and recompute; see schedules.sharding."""
    g = p.add_argument_group("data-parallel sharding and recompute "
                             "(DeepSpeed/Megatron/FSDP spellings accepted)")
    g.add_argument("--zero", "--zero-stage", dest="zero_stage", type=int, choices=range(4),
                   help="ZeRO stage: 1 optimizer state, 2 + gradients, 3 + parameters")
    g.add_argument("--fsdp", choices=["none", "full", "hybrid"],
                   help="full = ZeRO-3 over all dp ranks; hybrid = shard inside a node "
                        "(--shard-size), replicate across nodes")
    g.add_argument("--shard-size", type=int, help="hybrid shard group (default GPUs per node)")
    g.add_argument("--use-distributed-optimizer", action="store_true", default=None,
                   help="Megatron's distributed optimizer (= --zero 1)")
    g.add_argument("--data-parallel-sharding-strategy",
                   choices=["no_shard", "optim", "optim_grads", "optim_grads_params"],
                   help="Megatron-FSDP spelling of ZeRO 0/1/2/3")
    g.add_argument("--offload", action="store_true", default=None,
                   help="ZeRO-Offload: optimizer state and step on the host")
    g.add_argument("--bucket-mb", type=float, metavar="MiB",
                   help="gradient bucket in MiB (torch DDP bucket_cap_mb; default 25)")
    g.add_argument("--no-overlap-grad-reduce", dest="overlap_grad_reduce",
                   action="store_false", default=None,
                   help="reduce gradients after the backward instead of during it")
    g.add_argument("--no-reshard-after-forward", dest="reshard_after_forward",
                   action="store_false", default=None,
                   help="ZeRO-3/FSDP: keep gathered parameters from forward to backward")
    g.add_argument("--quantized-weights", action="store_true", default=None,
                   help="ZeRO++ qwZ: int8 parameter all-gather (ZeRO-3)")
    g.add_argument("--hpz", action="store_true", default=None,
                   help="ZeRO++ hpZ: secondary parameter shard inside the node (ZeRO-3)")
    g.add_argument("--hpz-partition-size", type=int,
                   help="hpZ secondary shard size (default GPUs per node)")
    g.add_argument("--quantized-gradients", action="store_true", default=None,
                   help="ZeRO++ qgZ: int4 gradient reduce-scatter (ZeRO-2/3)")
    g.add_argument("--recompute", choices=["none", "selective", "full"],
                   help="activation recompute (default none)")
    g.add_argument("--recompute-granularity", choices=["selective", "full"],
                   help="Megatron spelling of --recompute")
    g.add_argument("--recompute-method", choices=["uniform", "block"],
                   help="Megatron: with full recompute granularity")


def _add_intra_layer_flags(p: argparse.ArgumentParser) -> None:
    """How TP/CP/EP communication runs: ParallelConfig's intra-layer fields
    (schedules.intra_layer)."""
    g = p.add_argument_group("intra-layer communication (TP, CP, EP)")
    g.add_argument("--tp-comm-overlap", action="store_true", default=None,
                   help="Megatron --tp-comm-overlap: TP collectives run alongside the GEMMs "
                        "instead of between them")
    g.add_argument("--cp-comm", choices=["ring", "ulysses"],
                   help="context parallelism: ring attention (KV passed around the ring, "
                        "overlapped; default) or DeepSpeed-Ulysses all-to-alls")
    g.add_argument("--cp-comm-type", choices=["p2p", "a2a"],
                   help="Megatron-Core spelling of --cp-comm: p2p = ring, a2a = ulysses")
    g.add_argument("--moe-imbalance", type=float, metavar="FACTOR",
                   help="busiest expert's tokens over the balanced share (>= 1; default 1)")
    g.add_argument("--scatter-gather-tensors-in-pipeline", dest="scatter_gather",
                   action="store_true", default=None,
                   help="SC21's scatter/gather: each TP rank sends 1/tp of a pipeline "
                        "transfer, the receivers all-gather it (tp > 1, no SP)")


def _add_cluster_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster and costs")
    g.add_argument("--topology", default=commands.DEFAULT_TOPOLOGY,
                   help=f"preset name or topology JSON file (default {commands.DEFAULT_TOPOLOGY})")
    g.add_argument("--uniform-costs", metavar="F,B",
                   help="fixed seconds per forward/backward of one virtual stage on one "
                        "microbatch; communication then costs zero")
    g.add_argument("--compute-efficiency", type=float,
                   help="fraction of dense peak FLOP/s each kernel reaches (default 0.6)")
    g.add_argument("--memory-efficiency", type=float,
                   help="fraction of HBM bandwidth each kernel reaches (default 0.8)")
    g.add_argument("--profile", metavar="PATH",
                   help="measured compute and P2P times from `clustersim calibrate` instead "
                        "of the roofline (the topology then only places ranks)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="clustersim",
        description="Discrete-event simulator of distributed LLM training.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=f"clustersim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = sub.add_parser("simulate", help="simulate one iteration to a Gantt HTML",
                         description="Simulate one training iteration and write a Gantt chart.")
    _add_parallel_flags(sim)
    _add_intra_layer_flags(sim)
    _add_model_flags(sim)
    _add_cluster_flags(sim)
    out = sim.add_argument_group("outputs")
    out.add_argument("--schedule-csv", metavar="PATH",
                     help="run a custom schedule from a torch.distributed.pipelining CSV")
    out.add_argument("-o", "--output", default="gantt.html", help="Gantt HTML (default gantt.html)")
    out.add_argument("--trace-json", metavar="PATH", help="Chrome/Perfetto trace JSON")
    out.add_argument("--metrics-json", metavar="PATH", help="metrics JSON")
    out.add_argument("--timeline-json", metavar="PATH", help="the raw Timeline as JSON")

    show = sub.add_parser("show", help="print a schedule's rank x step grid or torch CSV",
                          description="Print a schedule without simulating it.")
    show.add_argument("schedule", help="gpipe, 1f1b or interleaved-1f1b")
    show.add_argument("--pp", type=int, required=True)
    show.add_argument("--microbatches", type=int, required=True)
    show.add_argument("--vpp", type=int)
    show.add_argument("--format", choices=["grid", "text", "torch-csv"], default="grid",
                      help="grid: unit-time rank x step table (default); text: program per "
                           "rank; torch-csv: torch.distributed.pipelining CSV")
    show.add_argument("--with-p2p", action="store_true",
                      help="include SEND/RECV ops (text and torch-csv formats)")

    cmp = sub.add_parser(
        "compare", help="simulate several schedules side by side, or compare two Timelines",
        description="Without files: simulate several schedules on the same model and cluster. "
                    "With two Timeline JSON files (`compare sim.json measured.json`): print "
                    "the iteration-time error and per-op-kind mean duration errors of A "
                    "against B, and with -o write both Gantt charts stacked.")
    cmp.add_argument("timelines", nargs="*", metavar="TIMELINE.json",
                     help="two Timeline JSON files A B (from --timeline-json of simulate or "
                          "run); B is the reference")
    cmp.add_argument("--schedules", default="gpipe,1f1b,interleaved-1f1b",
                     help="comma-separated; NAME:V sets vpp, e.g. interleaved-1f1b:4")
    _add_parallel_flags(cmp, with_schedule=False)
    _add_intra_layer_flags(cmp)
    _add_model_flags(cmp)
    _add_cluster_flags(cmp)
    cmp.add_argument("-o", "--output", help="HTML with the Gantt charts stacked")
    cmp.add_argument("--json", action="store_true", help="print the table as JSON")

    hardware_cli.add_parsers(sub, _add_model_flags, _add_parallel_flags)
    memory_cli.add_parser(sub, _add_model_flags, _add_parallel_flags)
    sub.add_parser("models", help="list model presets")
    sub.add_parser("topologies", help="list topology presets")
    collective_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="clustersim: %(levelname)s: %(message)s")
    try:
        handler = (hardware_cli.COMMANDS.get(args.command) or memory_cli.COMMANDS.get(args.command)
                   or commands.COMMANDS[args.command])
        return handler(args)
    except DeadlockError as err:
        print(f"clustersim: error: {err.args[0]}", file=sys.stderr)
        print(err.report, file=sys.stderr)
        return EXIT_DEADLOCK
    except (ClustersimError, TopologyError) as err:
        print(f"clustersim: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        sys.stderr.close()
        return 0
    except OSError as err:
        print(f"clustersim: error: {err.filename or ''}: {err.strerror or err}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
