"""The hardware commands: `clustersim calibrate` and `clustersim run` (whose measured
Timeline `clustersim compare A.json B.json` compares with a simulated one).

`kernels` (and so torch) is imported lazily inside `calibrate` and `run` only; without
torch they end in one error line naming the install command. Times in seconds.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time
from typing import Any

from clustersim.schedules.errors import ClustersimError, ConfigError
from clustersim.schedules.output_files import check_outputs, write_output, write_text_atomic
from clustersim.schedules.plan import resolve
from clustersim.schedules.profile import Profile
from clustersim.topologies import DeviceSpec, TopologyError, get_device

from ..report import format_summary
from ..throughput import throughput
from ..units import format_seconds
from .commands import (add_output_flags, input_paths, output_paths, report_stream,
                       schedule_and_parallel, write_outputs)
from .config_files import add_config_flags
from .flags import add_model_flags, add_parallel_flags, max_ops_from_args, model_from_args

INSTALL_HINT = "the kernels backend needs PyTorch: pip install -e '.[kernels]'"
GLOO_REDUCE_SCATTER = "note: gloo reduce-scatter is an all-reduce underneath"
CPU_ONLY = "note: CPU timings calibrate only this CPU (and gloo), not a GPU cluster"
ONE_GPU = ("note: every rank needs its own GPU: one GPU cannot run NCCL between ranks "
           "('Duplicate GPU'); on one GPU run world size 1, --replay, or --device cpu")


def _kernels(module: str) -> Any:
    """Import kernels.<module> lazily; a missing torch is one actionable error."""
    try:
        missing = importlib.util.find_spec("torch") is None
    except (ImportError, ValueError):  # a broken or blocked torch entry in sys.modules
        missing = True
    if missing:
        raise ClustersimError(INSTALL_HINT)
    return importlib.import_module(f"clustersim.kernels.{module}")


def _note(text: str) -> None:
    print(text, file=sys.stderr)


class ProgressBar:
    """Calibration progress, `progress(done, total, label)`: a tqdm bar on a terminal; a
    line per tenth when stderr is not a terminal (a redrawn bar would flood logs)."""

    def __init__(self, title: str, stream: Any = None):
        self.title, self.stream = title, stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.started = time.monotonic()
        self._last_decile = -1
        self.bar: Any = None

    def __call__(self, done: int, total: int, label: str) -> None:
        if self.tty:
            if self.bar is None:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc=self.title, file=self.stream)
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(done - self.bar.n)
            if done >= total:
                self.bar.close()
            return
        fraction = done / total if total else 1.0
        if int(fraction * 10) != self._last_decile or done >= total:
            self._last_decile = int(fraction * 10)
            print(f"{self.title}: {done}/{total} {time.monotonic() - self.started:.1f}s "
                  f"{label}", file=self.stream, flush=True)


# --- parsers ----------------------------------------------------------------------------
def add_parsers(sub: argparse._SubParsersAction) -> None:
    """`calibrate` and `run` (`compare` is parsed in sim.cli.commands)."""
    cal = sub.add_parser(
        "calibrate", help="measure this device's layer ops, P2P and collectives into a profile",
        description="Run micro-benchmarks of the model's layer ops (F, B, I, W at its shapes), "
                    "P2P and all-reduce size sweeps on real devices, and write the profile "
                    "JSON that `clustersim simulate --profile` uses.")
    cal.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    cal.add_argument("-o", "--output", default="profile.json",
                     help="profile JSON (default profile.json)")
    cal.add_argument("--repeats", type=int, default=7, help="timed repeats (median; default 7)")
    cal.add_argument("--warmup", type=int, default=2, help="untimed warm-up runs (default 2)")
    cal.add_argument("--ranks", type=int, default=2,
                     help="rank processes for the P2P and collective sweeps (default 2)")
    cal.add_argument("--serving", action="store_true",
                     help="also measure one layer's real prefill and decode steps with a KV "
                          "cache and the output layer's sampling (the profile's serving "
                          "section, for `clustersim serve --profile`; bf16 or fp16 models)")
    cal.add_argument("--collectives", default="all_reduce",
                     help="comma-separated: all_reduce, all_gather, reduce_scatter, broadcast, "
                          "all_to_all (default all_reduce)")
    add_model_flags(cal)

    run = sub.add_parser(
        "run", help="execute a schedule for real (torch) and write the measured Timeline",
        description="Execute the schedule `simulate` would simulate, one process per rank "
                    "(gloo on CPU, NCCL on CUDA), and write the measured Timeline JSON, a "
                    "Gantt chart and metrics.")
    run.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    add_config_flags(run)
    run.add_argument("--nproc", type=int, help="rank processes; must equal the world size "
                                               "tp*cp*dp*pp if given")
    run.add_argument("--replay", action="store_true",
                     help="run each pipeline rank's program in turn in one process on one "
                          "device, P2P in loopback: every rank's compute times from a single "
                          "GPU (dp must be 1)")
    run.add_argument("--iterations", type=int, default=3,
                     help="timed iterations; the Timeline is the median one (default 3)")
    run.add_argument("--warmup-iterations", type=int, default=1,
                     help="untimed iterations first (default 1)")
    run.add_argument("--timeout", type=float, default=300.0,
                     help="no-progress watchdog: the run ends with an error, naming each "
                          "rank's last op, when no op finished on any rank for this many "
                          "seconds (default 300)")
    run.add_argument("--seed", type=int, default=0)
    add_parallel_flags(run)
    add_model_flags(run)
    add_output_flags(run, timeline_default="measured.json")


# --- calibrate --------------------------------------------------------------------------
def cmd_calibrate(args: argparse.Namespace) -> int:
    check_outputs({"--output": args.output})  # before importing torch or measuring
    model = model_from_args(args)
    collectives = tuple(c.strip().replace("-", "_") for c in args.collectives.split(",")
                        if c.strip())
    if args.ranks < 2:
        raise ConfigError(f"--ranks must be >= 2 (P2P needs two ranks), got {args.ranks}")
    if args.serving and model.dtype not in ("bf16", "fp16"):
        raise ConfigError(f"--serving measures the steps `clustersim serve` prices, in bf16 "
                          f"or fp16: --dtype {model.dtype} is not served")
    calibrate = _kernels("calibrate")
    _kernels("preflight").check_local_ranks(args.ranks, f"--ranks={args.ranks}")
    if args.device == "cpu":
        _note(CPU_ONLY)
        if "reduce_scatter" in collectives:
            _note(GLOO_REDUCE_SCATTER)
    profile = calibrate.calibrate(model, device=args.device, repeats=args.repeats,
                                  warmup=args.warmup, group_sizes=(args.ranks,),
                                  collectives=collectives,
                                  progress=ProgressBar(f"calibrate {args.device}"),
                                  serving=args.serving)
    for note in profile.get("notes", ()):
        if "one GPU" in note:
            _note(f"note: {note}")
    written = write_output(args.output, lambda path: write_text_atomic(
        path, json.dumps(profile, indent=2) + "\n"))
    layer = profile["compute"]["layer"]
    print(f"{profile['device']}: one layer F {format_seconds(layer['F'])}, "
          f"B {format_seconds(layer['B'])}, I {format_seconds(layer['I'])}, "
          f"W {format_seconds(layer['W'])}; optimizer step "
          f"{profile['optimizer_seconds_per_param'] * 1e9:.3g} ns/parameter; P2P alpha "
          f"{format_seconds(profile['p2p']['alpha'])}, {_bandwidth(profile['p2p']['beta'])}")
    if args.serving:
        print(_serving_fit(Profile.from_dict(profile), model))
    print(written)
    return 0


def _serving_fit(profile: Profile, model) -> str:
    """The serving rates fitted to the measured steps, and each point against them."""
    from ..serving.calibration import fit_serving
    rates = fit_serving(profile, model, profile.serving.dtype)
    lines = [f"serving steps, fitted (sim.serving.calibration): "
             f"{rates.flops_per_s / 1e12:.3g} TFLOP/s, {rates.bytes_per_s / 1e9:.3g} GB/s, "
             f"{format_seconds(rates.overhead)} per layer per step; worst point "
             f"{rates.worst_error():.1%} off",
             f"  {'point':<32} {'measured':>10} {'fitted':>10} {'error':>8}"]
    lines += [f"  {label:<32} {format_seconds(measured):>10} {format_seconds(model_s):>10} "
              f"{model_s / measured - 1:>+8.1%}" for label, measured, model_s in rates.residuals]
    return "\n".join(lines)


def _datasheet(device: str) -> DeviceSpec | None:
    """The datasheet of the measured device, when its name is one we know (for MFU)."""
    try:
        return get_device(device)
    except TopologyError:
        return None


def _bandwidth(beta: float) -> str:
    return f"{1 / beta / 1e9:.3g} GB/s" if beta > 0 else "bandwidth not measured"


# --- run --------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    check_outputs(output_paths(args), input_paths(args))
    model = model_from_args(args)
    custom, parallel = schedule_and_parallel(args, model)
    if args.replay and args.nproc not in (None, 1):
        raise ConfigError(f"--replay runs in one process: --nproc must be 1 or absent, got "
                          f"{args.nproc}")
    if not args.replay and args.nproc is not None and args.nproc != parallel.world_size:
        raise ConfigError(f"--nproc={args.nproc} must equal the world size tp*cp*dp*pp="
                          f"{parallel.world_size}")
    if args.iterations < 1 or args.warmup_iterations < 0:
        raise ConfigError("--iterations must be >= 1 and --warmup-iterations >= 0")
    launch = _kernels("launch")
    if not args.replay:  # before building the schedule, starting ranks or measuring
        p = parallel
        _kernels("preflight").check_local_ranks(
            p.world_size, f"--tp*--cp*--dp*--pp = {p.tp}*{p.cp}*{p.dp}*{p.pp} = {p.world_size}")
    plan = resolve(model, parallel, schedule=custom, max_ops=max_ops_from_args(args))
    if args.device == "cpu":
        _note(CPU_ONLY)
    elif parallel.world_size > 1 and not args.replay:
        _note(ONE_GPU)  # launch refuses more ranks than GPUs with the same reason
    if args.replay:
        _note("note: replay: each pipeline rank's compute alone on one device, one after "
              "another; P2P is not run, so the iteration time is not a pipeline's")
    timeline = launch.run_schedule(custom or plan.build_schedule(), plan, device=args.device,
                                   seed=args.seed, timeout=args.timeout,
                                   warmup_iterations=args.warmup_iterations,
                                   iterations=args.iterations, replay=args.replay)
    timeline.meta.setdefault("cost_model", "measured")
    timeline.meta["throughput"] = throughput(plan, timeline.iteration_time,
                                             _datasheet(timeline.meta.get("device", "")))
    print(format_summary(timeline), file=report_stream(args))
    times = timeline.meta.get("iteration_times", [])
    if len(times) > 1:
        print("iteration times: " + ", ".join(format_seconds(t) for t in times)
              + " (the Timeline is the median one)", file=report_stream(args))
    write_outputs(timeline, args)
    return 0


# --- compare two timelines ----------------------------------------------------------------
COMMANDS = {"calibrate": cmd_calibrate, "run": cmd_run}
