"""Simulated serving against published measurements, and the seeds' parallelism claims
in numbers (issue 21).

Every row of benchmarks/serving_data.py that is not excluded there is simulated with
`sim.serving.simulate_serving` on the preset the row names, as the source ran it:
- output_throughput_per_gpu: one static batch of `batch_size` requests (TensorRT-LLM's
  gptSessionBenchmark), output tokens / the batch's time / tp;
- first_token_latency_ms: one request of one output token: its TTFT;
- e2e_latency_ms: `batch_size` requests at once under continuous batching (vLLM's
  benchmark_latency), the time until the last token.
fp8 rows run FP8 weights and GEMMs (`quantization='fp8'`) and an FP8 KV cache. Nothing is
fitted to these rows: the costs are sim.cost's (device ceilings x ATTAINMENT, from a
training layer) and the collective model's. Error = simulated / published - 1.

The claims (same run): data parallelism scales throughput but not latency; tensor
parallelism lowers latency at a communication cost that grows off NVLink (Llama 3 70B on
one DGX H100 at tp 2, 4, 8 and across two on an NDR fat tree at tp 16); pipeline
parallelism raises throughput but not a lone request's latency; and the batching
policies' TTFT / ITL trade-off on the same GPUs; sequence parallelism speeds up prefill,
not decode; expert parallelism fits an MoE model that data parallelism alone cannot, at
the price of its all-to-alls.

    python benchmarks/serving.py
Writes benchmarks/results/serving.md and .json.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from environment import environment_markdown
from serving_data import POINTS

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model_presets import get_model
from clustersim.sim.collectives import simulate_collective
from clustersim.sim.serving import Limits, simulate_serving, synthetic
from clustersim.topologies import fat_tree

RESULTS = Path(__file__).parent / "results"
WITHIN, MEAN_GOAL = 0.15, 0.10


def simulate_point(point: dict) -> dict:
    model = get_model(point["model"])
    fp8 = point["precision"] == "fp8"
    dtype = "bf16" if fp8 else point["precision"]
    common = dict(tp=point["tp"], dtype=dtype, quantization="fp8" if fp8 else None,
                  kv_cache_dtype="fp8" if fp8 else "auto")
    b, i, o = point["batch_size"], point["input_len"], point["output_len"]
    row = {k: point[k] for k in ("id", "model", "topology", "tp", "precision", "batch_size",
                                 "input_len", "output_len", "metric", "value", "unit", "url")}
    try:
        if point["metric"] == "output_throughput_per_gpu":
            r = simulate_serving(model, point["topology"], synthetic(b, i, o),
                                 batching="static", limits=Limits(batch_size=b), **common)
            simulated = r.metrics["output_throughput"] / point["tp"]
        elif point["metric"] == "first_token_latency_ms":
            r = simulate_serving(model, point["topology"], synthetic(1, i, 1), **common)
            simulated = r.metrics["mean_ttft_ms"]
        else:
            r = simulate_serving(model, point["topology"], synthetic(b, i, o), **common)
            simulated = r.metrics["duration"] * 1e3
    except ConfigError as err:
        return {**row, "simulated": None, "error": None, "refused": str(err)}
    return {**row, "simulated": simulated, "error": simulated / point["value"] - 1,
            "refused": None}


def claims() -> list[str]:
    """The seeds' claims, each with the numbers that show it (module docstring)."""
    lines = ["## The seeds' claims, in numbers", ""]
    l8, reqs = get_model("llama3-8b"), synthetic(512, 512, 128)
    lines += ["Data parallelism (Llama 3 8B, bf16, one DGX H100; 512 requests of 512 + 128 "
              "tokens at once; and one request alone):", "",
              "| dp | output tok/s | one request's E2E latency (ms) |", "|---:|---:|---:|"]
    for dp in (1, 2, 4, 8):
        many = simulate_serving(l8, "dgx-h100", reqs, dp=dp).metrics
        one = simulate_serving(l8, "dgx-h100", synthetic(1, 512, 128), dp=dp).metrics
        lines.append(f"| {dp} | {many['output_throughput']:,.0f} | {one['mean_e2el_ms']:.1f} |")
    l70 = get_model("llama3-70b")
    two_nodes = fat_tree("dgx-h100", 2, "ndr")
    lines += ["", "Tensor parallelism (Llama 3 70B, bf16; one request of 512 + 128 tokens; "
              "tp 16 spans two DGX H100 on 400 Gb/s InfiniBand):", "",
              "| tp | GPUs' link | TPOT (ms) | of which 2 x 80 all-reduces of one token (ms) |",
              "|---:|---|---:|---:|"]
    for tp, topo, link in ((2, "dgx-h100", "NVLink"), (4, "dgx-h100", "NVLink"),
                           (8, "dgx-h100", "NVLink"), (16, two_nodes, "InfiniBand")):
        m = simulate_serving(l70, topo, synthetic(1, 512, 128), tp=tp).metrics
        ar = simulate_collective("all-reduce", l70.hidden_size * 2, tp, topo).time_s
        lines.append(f"| {tp} | {link} | {m['mean_tpot_ms']:.2f} | "
                     f"{2 * l70.num_layers * ar * 1e3:.2f} |")
    lines += ["", "Pipeline parallelism (Llama 3 70B, bf16, tp 4 per stage on one DGX H100; "
              "256 requests of 512 + 128 tokens at once, at most 64 per step; and one "
              "request alone):", "",
              "| pp | GPUs | output tok/s | one request's E2E latency (ms) |",
              "|---:|---:|---:|---:|"]
    for pp in (1, 2):
        many = simulate_serving(l70, "dgx-h100", synthetic(256, 512, 128), tp=4, pp=pp,
                                limits=Limits(max_num_seqs=64)).metrics
        one = simulate_serving(l70, "dgx-h100", synthetic(1, 512, 128), tp=4,
                               pp=pp).metrics
        lines.append(f"| {pp} | {4 * pp} | {many['output_throughput']:,.0f} | "
                     f"{one['mean_e2el_ms']:.1f} |")
    lines += ["", "Batching policies on the same two H100s (Llama 3 8B, bf16; Poisson "
              "arrivals at 6 requests/s of 1500 + 100 tokens, 300 requests):", "",
              "| policy | mean TTFT (ms) | p99 TTFT (ms) | mean ITL (ms) | p99 ITL (ms) | "
              "output tok/s |", "|---|---:|---:|---:|---:|---:|"]
    reqs = synthetic(300, 1500, 100, 6.0, seed=1)
    for label, kw in (("continuous, dp 2", {}),
                      ("chunked-prefill (512-token budget), dp 2",
                       dict(batching="chunked-prefill",
                            limits=Limits(max_num_batched_tokens=512))),
                      ("disaggregated, 1 prefill + 1 decode",
                       dict(batching="disaggregated", prefill_replicas=1))):
        m = simulate_serving(l8, "dgx-h100", reqs, dp=2, **kw).metrics
        lines.append(f"| {label} | {m['mean_ttft_ms']:.1f} | {m['p99_ttft_ms']:.1f} | "
                     f"{m['mean_itl_ms']:.2f} | {m['p99_itl_ms']:.2f} | "
                     f"{m['output_throughput']:,.0f} |")
    lines += ["", "Sequence (context) parallelism (Llama 3 8B, bf16, one DGX H100; one "
              "request of 8000 + 64 tokens): time to first token and per output token, and "
              "each against sp 1:", "",
              "| sp | TTFT (ms) | TTFT speed-up | TPOT (ms) | TPOT speed-up |",
              "|---:|---:|---:|---:|---:|"]
    base = None
    for sp in (1, 2, 4):
        m = simulate_serving(l8, "dgx-h100", synthetic(1, 8000, 64), sp=sp).metrics
        base = base or m
        lines.append(f"| {sp} | {m['mean_ttft_ms']:.1f} | "
                     f"{base['mean_ttft_ms'] / m['mean_ttft_ms']:.2f} | "
                     f"{m['mean_tpot_ms']:.2f} | {base['mean_tpot_ms'] / m['mean_tpot_ms']:.2f} |")
    mix = get_model("mixtral-8x7b")
    lines += ["", "Expert parallelism (Mixtral 8x7B, bf16, one DGX H100, 8 GPUs; 1000 "
              "requests of 1024 + 128 tokens at once): experts split over the TP group, or "
              "whole experts over ep GPUs whose replicas step together, paying two "
              "all-to-alls per MoE layer:", "",
              "| layout | weights per GPU (GB) | output tok/s | mean TPOT (ms) | "
              "communication share of the busiest replica's step time (TP collectives, "
              "EP all-to-alls) |",
              "|---|---:|---:|---:|---:|"]
    for tp, dp, ep in ((1, 8, 1), (8, 1, 1), (2, 4, 1), (2, 4, 8), (1, 8, 8)):
        label = f"tp {tp} x dp {dp}" + (f", ep {ep}" if ep > 1 else "")
        try:
            r = simulate_serving(mix, "dgx-h100", synthetic(1000, 1024, 128), tp=tp, dp=dp,
                                 ep=ep)
        except ConfigError as err:
            lines.append(f"| {label} | refused: {err} | | | |")
            continue
        log = max(r.run.step_log, key=lambda steps: sum(x.end - x.start for x in steps))
        busy = sum(x.end - x.start for x in log)
        communication = sum(x.communication for x in log)
        lines.append(f"| {label} | {r.capacity.weights / 1e9:.1f} | "
                     f"{r.metrics['output_throughput']:,.0f} | "
                     f"{r.metrics['mean_tpot_ms']:.2f} | {communication / busy:.1%} |")
    return lines


def markdown(rows: list[dict], seconds: float) -> str:
    done = [r for r in rows if r["error"] is not None]
    lines = ["# Serving: simulated against published measurements (issue 21)", "",
             environment_markdown(), f"- whole benchmark: {seconds:.0f} s", "",
             "Produced by `python benchmarks/serving.py` (method: its docstring); the rows "
             "and their sources: `benchmarks/serving_data.py`.", "", "## Summary", ""]
    for label, kind in (("throughput", ("output_throughput_per_gpu",)),
                        ("latency", ("first_token_latency_ms", "e2e_latency_ms"))):
        part = [abs(r["error"]) for r in done if r["metric"] in kind]
        if part:
            lines.append(f"- {label}: {len(part)} points; within 15%: "
                         f"{sum(e <= WITHIN for e in part)}; mean |error| "
                         f"{sum(part) / len(part):.1%}")
    errors = [abs(r["error"]) for r in done]
    met = all(e <= WITHIN for e in errors) and sum(errors) / len(errors) <= MEAN_GOAL
    lines += [f"- goal (every point within 15%, mean within 10%): {'met' if met else 'NOT met'}",
              f"- refused: {len(rows) - len(done)}", "", "## Points", "",
              "| id | model | GPUs | precision | batch | in / out | metric | published | "
              "simulated | error |", "|---|---|---|---|---:|---|---|---:|---:|---:|"]
    for r in rows:
        sim = "refused: " + r["refused"] if r["refused"] else f"{r['simulated']:,.1f}"
        err = "" if r["error"] is None else f"{r['error']:+.1%}"
        lines.append(f"| [{r['id']}]({r['url']}) | {r['model']} | {r['topology']} tp "
                     f"{r['tp']} | {r['precision']} | {r['batch_size']} | {r['input_len']} / "
                     f"{r['output_len']} | {r['metric']} ({r['unit']}) | {r['value']:,} | "
                     f"{sim} | {err} |")
    lines += ["", "## Excluded (decided from the source, before simulating)", "",
              "| id | what | reason |", "|---|---|---|"]
    lines += [f"| [{p['id']}]({p['url']}) | {p['source']} | {p['excluded']} |"
              for p in POINTS if p["excluded"]]
    return "\n".join(lines + [""] + claims()) + "\n"


def main() -> None:
    start = time.perf_counter()
    rows = [simulate_point(p) for p in POINTS if not p["excluded"]]
    text = markdown(rows, time.perf_counter() - start)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "serving.md").write_text(text)
    (RESULTS / "serving.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    print(text.split("## Points")[0])


if __name__ == "__main__":
    main()
