"""`clustersim serve`: simulate serving a model (sim.serving) and print vLLM's benchmark
summary; `--json PATH` writes vLLM's result keys. Flags spelled as vLLM's benchmark
scripts spell them (`--input-len`, `--num-prompts`, `--request-rate`, `--max-num-seqs`,
...); the model flags are `simulate`'s that shape a model (a preset, Megatron-named dims).
Its parser (`add_parser`) and handler (`cmd_serve`), registered in COMMANDS."""
from __future__ import annotations

import argparse
import json
import math

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.output_files import check_outputs, write_text_atomic
from clustersim.schedules.profile import Profile

from ..serving import (DTYPES, KV_DTYPES, POLICIES, SWAP_SPACE_GIB, Limits, load_trace,
                       simulate_serving, synthetic)
from ..serving.metrics import SLO_KEYS
from .arg_types import checked_number, fraction, positive_int
from .flags import DEFAULT_TOPOLOGY, MODEL_FLAGS, model_from_args

SERVE_MODEL_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                      "num_query_groups", "vocab_size", "seq_length", "swiglu",
                      "untie_embeddings_and_output_weights", "add_bias_linear")
"""`simulate`'s model flags that shape a served model (the rest are training's);
--seq-length is the model's context (vLLM's max_model_len: the longest request, prompt and
output, it serves, and the default token budget)."""
DEFAULT_MODEL = "llama3-8b"
WORKLOAD_DEFAULTS = {"input_len": 1024, "output_len": 128, "num_prompts": 1000,
                     "request_rate": math.inf, "seed": 0}
"""The synthetic workload's flags (None on the command line when not given) and defaults."""


_rate = checked_number(float, lambda v: v > 0, "a rate > 0 requests/s (inf: all at once)")
_limit_ms = checked_number(float, lambda v: 0 < v < math.inf, "a limit > 0 ms")
_gib = checked_number(float, lambda v: 0 < v < math.inf, "a size > 0 GiB")


def _slo(text: str) -> tuple[str, float]:
    key, _, limit = text.partition(":")
    if key not in SLO_KEYS:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY:MS with KEY one of "
                                         f"{', '.join(SLO_KEYS)}")
    return key, _limit_ms(limit)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="simulate serving a model: TTFT, TPOT, throughput (vLLM's metrics)",
        description="Simulate an LLM inference server on the topology: requests arrive, "
                    "each replica batches them (static, continuous, chunked-prefill or "
                    "disaggregated) and runs "
                    "prefill and decode steps priced by the roofline cost model and the "
                    "collective model; prints vLLM's benchmark summary.")
    m = p.add_argument_group("model (a preset, optionally overridden by Megatron-named dims)")
    m.add_argument("--model", help=f"model preset; see `clustersim models` (default "
                                   f"{DEFAULT_MODEL})")
    for flag in MODEL_FLAGS:
        if flag.field in SERVE_MODEL_FIELDS:
            flag.add_to(m)
    m.add_argument("--dtype", default="auto", dest="serve_dtype", metavar="DTYPE",
                   help="bfloat16, float16 or auto (bfloat16)")
    m.add_argument("--quantization", choices=["fp8"], help="fp8 weights and GEMMs")
    m.add_argument("--kv-cache-dtype", default="auto", metavar="DTYPE",
                   help="auto (the dtype) or fp8")
    c = p.add_argument_group("cluster and parallelism")
    c.add_argument("--topology", default=DEFAULT_TOPOLOGY,
                   help=f"preset name or topology JSON file (default {DEFAULT_TOPOLOGY})")
    c.add_argument("--tensor-parallel-size", "-tp", type=positive_int, default=1,
                   dest="tp", help="tensor-parallel GPUs per pipeline stage (default 1)")
    c.add_argument("--pipeline-parallel-size", "-pp", type=positive_int, default=1,
                   dest="pp", help="pipeline stages per replica (default 1)")
    c.add_argument("--sp", type=positive_int, default=1, dest="sp",
                   help="sequence (context) parallel shards per replica: a prompt's tokens "
                        "and its KV cache split over them, every shard with all the "
                        "weights (default 1)")
    c.add_argument("--dp", "--data-parallel-size", type=positive_int, default=1, dest="dp",
                   help="replicas, requests sent to them in turn (default 1)")
    c.add_argument("--ep", "--expert-parallel-size", type=positive_int, default=1, dest="ep",
                   help="MoE models: GPUs the experts are split over (each holds whole "
                        "experts); tensor-parallel-size x the replicas that step together "
                        "(vLLM's --enable-expert-parallel is tp x dp; default 1: every "
                        "expert split over the tensor-parallel GPUs)")
    c.add_argument("--gpu-memory-utilization", type=fraction, default=0.9,
                   help="fraction of GPU memory for weights, activations and KV cache "
                        "(vLLM's default 0.9)")
    c.add_argument("--compute-efficiency", type=fraction,
                   help="fraction of the GEMM peak reached (default: the device's "
                        "measured ceiling x the attainment factor)")
    c.add_argument("--memory-efficiency", type=fraction,
                   help="fraction of the HBM bandwidth reached (default: likewise)")
    c.add_argument("--profile", metavar="PATH",
                   help="a `clustersim calibrate --serving` profile: FLOP and byte rates and "
                        "a per-layer step overhead fitted to real prefill and decode steps "
                        "replace the device's (the profile's device stands for the "
                        "topology's GPUs)")
    w = p.add_argument_group("workload and scheduler")
    d = WORKLOAD_DEFAULTS
    w.add_argument("--input-len", type=positive_int,
                   help=f"prompt tokens per request (default {d['input_len']})")
    w.add_argument("--output-len", type=positive_int,
                   help=f"output tokens per request (default {d['output_len']})")
    w.add_argument("--num-prompts", type=positive_int,
                   help=f"requests (default {d['num_prompts']})")
    w.add_argument("--request-rate", type=_rate,
                   help="Poisson arrivals per second (default inf: all at once)")
    w.add_argument("--seed", type=int,
                   help=f"seed of the Poisson arrivals (default {d['seed']})")
    w.add_argument("--trace", metavar="PATH",
                   help="requests from a CSV or JSONL file (arrival_time, input_tokens, "
                        "output_tokens) instead of --input-len/--output-len/--num-prompts/"
                        "--request-rate")
    w.add_argument("--batching", choices=POLICIES, default="continuous",
                   help="continuous (iteration-level, prefills in steps of their own: "
                        "vLLM V0, Orca; default), chunked-prefill (decodes first, prompts "
                        "in chunks filling the token budget: Sarathi-Serve, vLLM V1), "
                        "static (fixed batches of --batch-size) or disaggregated (prefill "
                        "and decode replicas: DistServe, Splitwise)")
    w.add_argument("--num-prefill-replicas", type=positive_int,
                   help="with --batching disaggregated: how many of the --dp replicas "
                        "prefill (the others decode; the KV cache moves between them)")
    w.add_argument("--batch-size", type=positive_int,
                   help="requests per static batch (with --batching static)")
    w.add_argument("--max-num-seqs", type=positive_int,
                   help="sequences per step (vLLM's default 256; not with static batching, "
                        "whose steps run --batch-size sequences)")
    w.add_argument("--max-num-batched-tokens", type=positive_int,
                   help="new tokens per step (default: max(model context, 2048), vLLM's "
                        "without chunked prefill; 2048 with it; not with static batching, "
                        "which prefills a whole batch's prompts in one step)")
    w.add_argument("--preemption-mode", choices=["recompute", "swap"], default="recompute",
                   help="when KV blocks run out: recompute the preempted sequence's prompt "
                        "(default; vLLM V1's only mode) or swap its blocks to host memory "
                        "over PCIe and back (vLLM V0's; continuous batching)")
    w.add_argument("--swap-space", type=_gib, metavar="GIB",
                   help="with --preemption-mode swap: host memory per GPU for swapped KV "
                        "blocks, GiB (vLLM's default 4)")
    w.add_argument("--goodput", nargs="+", type=_slo, metavar="KEY:MS",
                   help="service-level objectives for request_goodput, vLLM's spelling: "
                        "ttft:MS tpot:MS e2el:MS (any of them)")
    p.add_argument("--search-layouts", type=positive_int, metavar="GPUS",
                   help="simulate the tp x pp x sp x dp splits of GPUS GPUs on the workload "
                        "(tp, pp, sp powers of two: tp up to a host's GPUs, pp up to 8, sp up "
                        "to 4; sim.serving.search) and rank them (by request goodput with "
                        "--goodput, else output throughput); --compare takes any other")
    p.add_argument("--compare", nargs="+", metavar="LAYOUT",
                   help="simulate these layouts side by side on the workload, each "
                        "KEY=N[,KEY=N..] with KEY tp, pp, sp, dp, ep or prefill (prefill "
                        "replicas, with --batching disaggregated); unnamed keys are 1 "
                        "(prefill 0), e.g. --compare tp=8 tp=4,dp=2 tp=2,pp=2,dp=2")
    p.add_argument("--json", metavar="PATH", help="write vLLM's result keys as JSON (with "
                   "--search-layouts or --compare: the candidates and their metrics)")
    p.add_argument("--html", metavar="PATH", help="write the page: every GPU's prefill, "
                   "decode and communication over time, and the KV-cache usage")


def _requests(args: argparse.Namespace) -> list:
    """The trace's requests, or the synthetic workload's; a workload flag that would change
    nothing (any with --trace, --seed without a finite --request-rate) is refused."""
    given = {f: getattr(args, f) for f in WORKLOAD_DEFAULTS if getattr(args, f) is not None}
    if args.trace:
        if given:
            raise ConfigError(f"--trace gives the requests: "
                              f"{', '.join('--' + f.replace('_', '-') for f in given)} would "
                              f"change nothing")
        return load_trace(args.trace)
    w = {**WORKLOAD_DEFAULTS, **given}
    if "seed" in given and math.isinf(w["request_rate"]):
        raise ConfigError("--seed draws the Poisson arrivals: with --request-rate inf (all "
                          "at once, the default) it changes nothing")
    return synthetic(w["num_prompts"], w["input_len"], w["output_len"], w["request_rate"],
                     w["seed"])


def cmd_serve(args: argparse.Namespace) -> int:
    check_outputs({"--json": args.json, "--html": args.html},
                  {"--trace": args.trace, "--profile": args.profile})
    if args.model is None and not any(getattr(args, f, None) is not None
                                      for f in SERVE_MODEL_FIELDS):
        args.model = DEFAULT_MODEL
    if args.swap_space is not None and args.preemption_mode != "swap":
        raise ConfigError("--swap-space sizes swap preemption's host memory: without "
                          "--preemption-mode swap it would change nothing")
    model = model_from_args(args)
    requests = _requests(args)
    if args.batching == "static":
        given = [flag for flag, value in (("--max-num-seqs", args.max_num_seqs),
                                          ("--max-num-batched-tokens",
                                           args.max_num_batched_tokens)) if value]
        if given:
            raise ConfigError(f"{' and '.join(given)}: static batching runs --batch-size "
                              f"sequences per step and prefills their prompts in one: it "
                              f"would change nothing")
        limits = Limits(batch_size=args.batch_size)
    else:
        limits = Limits(args.max_num_seqs or Limits.max_num_seqs,
                        args.max_num_batched_tokens or (
                            2048 if args.batching == "chunked-prefill"
                            else max(model.seq_length, 2048)),
                        args.batch_size)
    options = dict(dtype=args.serve_dtype, quantization=args.quantization,
                   kv_cache_dtype=args.kv_cache_dtype, batching=args.batching, limits=limits,
                   gpu_memory_utilization=args.gpu_memory_utilization,
                   compute_efficiency=args.compute_efficiency,
                   memory_efficiency=args.memory_efficiency,
                   profile=Profile.load(args.profile) if args.profile else None,
                   slo=dict(args.goodput) if args.goodput else None,
                   preemption_mode=args.preemption_mode,
                   swap_space_gib=args.swap_space or SWAP_SPACE_GIB)
    if args.search_layouts or args.compare:
        return _layouts(args, model, requests, options)
    result = simulate_serving(model, args.topology, requests, tp=args.tp, dp=args.dp,
                              pp=args.pp, sp=args.sp, ep=args.ep,
                              prefill_replicas=args.num_prefill_replicas or 0, **options)
    print(summary(result, model.name or "custom", args))
    if args.json:
        write_text_atomic(args.json, json.dumps(result.metrics, indent=1) + "\n")
    if args.html:
        from ..serving.gantt import write_serving_html  # plotly only when asked for
        title = (f"{model.name or 'custom'} on {args.topology}: {layout_name(args)}, "
                 f"{args.batching} batching, {result.metrics['completed']} requests")
        print(write_serving_html(result, title, args.html))
    return 0


LAYOUT_FLAGS = {"tp": "--tensor-parallel-size", "pp": "--pipeline-parallel-size",
                "sp": "--sp", "dp": "--dp", "ep": "--ep"}


def _layouts(args: argparse.Namespace, model, requests, options: dict) -> int:
    """--search-layouts (rank every layout of the GPUs) or --compare (the given layouts in
    their order): one table (sim.serving.search)."""
    from ..serving import search as layout_runs
    mode = "--search-layouts" if args.search_layouts else "--compare"
    if args.search_layouts and args.compare:
        raise ConfigError("--search-layouts and --compare both choose the layouts: give one")
    given = [flag for field, flag in LAYOUT_FLAGS.items() if getattr(args, field) != 1]
    if args.num_prefill_replicas:
        given.append("--num-prefill-replicas")
    if args.html:
        given.append("--html")
    if given:
        raise ConfigError(f"{mode} sets the layouts: {', '.join(given)} would change nothing"
                          + (" (a layout's own: 'tp=..,prefill=..')" if args.compare else ""))
    if args.search_layouts:
        candidates = layout_runs.search(model, args.topology, requests, args.search_layouts,
                                        **options)
        head = (f"{args.search_layouts} GPUs of {args.topology}, {model.name or 'custom'}, "
                f"{args.batching} batching; ranked by "
                f"{'request goodput (req/s)' if options['slo'] else 'output tok/s'}")
    else:
        candidates = layout_runs.compare(model, args.topology, requests,
                                         [layout_runs.parse_layout(t) for t in args.compare],
                                         **options)
        head = (f"{len(candidates)} layouts on {args.topology}, {model.name or 'custom'}, "
                f"{args.batching} batching, in the order given")
    goodput = bool(options["slo"])
    lines = [head, f"{'#':>3}  {'layout':<34} {'GPUs':>5} "
                   f"{'goodput' if goodput else 'out tok/s':>10} {'out tok/s/GPU':>14} "
                   f"{'p99 TTFT ms':>12} {'p99 TPOT ms':>12} {'mean E2EL ms':>13}"]
    for i, c in enumerate(candidates, 1):
        name = c.layout.name()
        if c.result is None:
            lines.append(f"{i:>3}  {name:<34} {c.layout.gpus:>5} refused: {c.refused}")
            continue
        m = c.result.metrics
        score = m["request_goodput"] if goodput else m["output_throughput"]
        lines.append(f"{i:>3}  {name:<34} {c.layout.gpus:>5} {score:>10.2f} "
                     f"{m['output_throughput'] / c.layout.gpus:>14.1f} "
                     f"{m['p99_ttft_ms']:>12.1f} {m['p99_tpot_ms']:>12.2f} "
                     f"{m['mean_e2el_ms']:>13.1f}")
    best = next((c for c in candidates if c.result is not None), None)
    if best and args.search_layouts:
        lines.append(f"simulate the best: clustersim serve ... {best.layout.flags()}")
    if not goodput:
        lines += offered_load_note(requests)
    print("\n".join(lines))
    if args.json:
        rows = [{**{k: getattr(c.layout, k) for k in layout_runs.LAYOUT_KEYS},
                 **({"metrics": c.result.metrics} if c.result else {"refused": c.refused})}
                for c in candidates]
        write_text_atomic(args.json, json.dumps({"candidates": rows}, indent=1) + "\n")
    return 0


def offered_load_note(requests) -> list[str]:
    """A note under a table of output throughputs when the requests arrive over time:
    output tok/s is the output tokens over the benchmark's duration (first arrival to
    last completion, vLLM's), so a layout that keeps up with the arrivals serves near
    the offered rate, and what separates such layouts is how long the last requests
    take, not their capacity. [] when all arrive at once (--request-rate inf)."""
    span = max(r.arrival for r in requests) - min(r.arrival for r in requests)
    if span <= 0:
        return []
    offered = sum(r.output_tokens for r in requests) / span
    return [f"note: the requests arrive over {span:.2f} s, {offered:,.0f} output tok/s "
            f"offered: a layout that keeps up serves near that rate, and out tok/s then "
            f"ranks how fast the last requests finish, not capacity (for capacity: "
            f"--request-rate inf; for latency targets: --goodput)"]


def layout_name(args: argparse.Namespace) -> str:
    """'tp 4 x pp 1 x sp 1 x dp 2' (and 'x ep N' with expert parallelism)."""
    text = f"tp {args.tp} x pp {args.pp} x sp {args.sp} x dp {args.dp}"
    return text + (f" x ep {args.ep}" if args.ep > 1 else "")


def summary(result, name: str, args: argparse.Namespace) -> str:
    """vLLM benchmark_serving's printed summary, and what a GPU's memory holds (with
    sequence parallelism a block's tokens spread over the sp group's GPUs)."""
    m, cap = result.metrics, result.capacity
    activations = DTYPES.get(str(args.serve_dtype).strip().lower(), args.serve_dtype)
    weights = "fp8" if args.quantization else activations
    changed = [f"{field.replace('_', '-')} {getattr(args, field)}" for field in
               SERVE_MODEL_FIELDS if getattr(args, field, None) is not None]
    split = (f" ({args.num_prefill_replicas} prefill / {args.dp - args.num_prefill_replicas} "
             f"decode replicas)" if args.num_prefill_replicas else "")
    lines = [f"{'=' * 14} Serving Benchmark Result (simulated) {'=' * 14}",
             f"{'Model:':<40}{name}" + (f" with {', '.join(changed)}" if changed else "")
             + f" on {args.topology}, {layout_name(args)}, {args.batching} batching{split}",
             f"{'Precision:':<40}weights {weights}, activations {activations}, KV cache "
             f"{'fp8' if KV_DTYPES.get(args.kv_cache_dtype) == 'fp8' else activations}",
             f"{'Successful requests:':<40}{m['completed']:<10}",
             f"{'Benchmark duration (s):':<40}{m['duration']:<10.2f}",
             f"{'Total input tokens:':<40}{m['total_input_tokens']:<10}",
             f"{'Total generated tokens:':<40}{m['total_output_tokens']:<10}",
             f"{'Request throughput (req/s):':<40}{m['request_throughput']:<10.2f}",
             f"{'Output token throughput (tok/s):':<40}{m['output_throughput']:<10.2f}",
             f"{'Total Token throughput (tok/s):':<40}{m['total_token_throughput']:<10.2f}"]
    if "request_goodput" in m:
        lines.insert(7, f"{'Request goodput (req/s):':<40}{m['request_goodput']:<10.2f}")
    for key, title in (("ttft", "Time to First Token"),
                       ("tpot", "Time per Output Token (excl. 1st token)"),
                       ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        lines.append(f"{'-' * 15}{title}{'-' * 15}")
        for stat in ("mean", "median", "p90", "p99"):
            label = f"{stat.capitalize() if stat in ('mean', 'median') else stat.upper()} " \
                    f"{key.upper()} (ms):"
            lines.append(f"{label:<40}{m[f'{stat}_{key}_ms']:<10.2f}")
    blocks = ("Blocks of 16 tokens (sp group's):" if args.sp > 1  # 1/sp of each per GPU
              else "Blocks of 16 tokens:")
    lines += [f"{'-' * 15}KV cache{'-' * 15}",
              f"{blocks:<40}{cap.blocks:,} "
              f"({cap.blocks * cap.block_bytes / 1e9:.1f} GB on each GPU; weights "
              f"{cap.weights / 1e9:.1f} GB of its {cap.usable / 1e9:.1f} GB usable)",
              f"{'Usage mean / max:':<40}{m['kv_cache_usage_mean']:.1%} / "
              f"{m['kv_cache_usage_max']:.1%}; preemptions {m['preemptions']}"
              + (f" ({result.run.swapped_blocks:,} blocks swapped out and in)"
                 if args.preemption_mode == "swap" else ""),
              "=" * 66]
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines)


COMMANDS = {"serve": cmd_serve}
