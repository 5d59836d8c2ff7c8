"""A serving run's metrics under vLLM's names (benchmarks/benchmark_serving.py's result
JSON), so that a simulated run compares like with like. Units as vLLM's: seconds for
`duration`, milliseconds for the latencies, per second for the throughputs.

- duration: first arrival to last token; request_throughput = completed / duration;
  output_throughput = output tokens / duration; total_token_throughput = (input + output)
  tokens / duration.
- TTFT: first token - arrival. TPOT: (last token - first token) / (output tokens - 1),
  for requests of more than one output token. ITL: every gap between a request's
  consecutive tokens. E2EL: last token - arrival.
- Each as mean_, median_, std_ (population), p90_ and p99_ (vLLM's percentiles: numpy's
  linear interpolation).
- request_goodput (with service-level objectives, vLLM's --goodput): completed requests
  whose TTFT, TPOT and E2EL are within the given limits (ms), per second.
- kv_cache_usage_mean / _max: the fraction of the KV blocks in use after each step
  (every replica's steps), and preemptions (sequences preempted and recomputed).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .engine import ServingRun, duration

LATENCIES = ("ttft", "tpot", "itl", "e2el")


def _latencies(run: ServingRun) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {name: [] for name in LATENCIES}
    for s in run.served:
        times, arrival = s.token_times, s.request.arrival
        found["ttft"].append(times[0] - arrival)
        found["e2el"].append(times[-1] - arrival)
        if len(times) > 1:
            found["tpot"].append((times[-1] - times[0]) / (len(times) - 1))
            found["itl"] += list(np.diff(times))
    return found


SLO_KEYS = ("ttft", "tpot", "e2el")


def meets(served, slo: Mapping[str, float]) -> bool:
    """Whether one request's latencies are within `slo` (ms per SLO_KEYS key)."""
    times, arrival = served.token_times, served.request.arrival
    values = {"ttft": times[0] - arrival, "e2el": times[-1] - arrival,
              "tpot": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0}
    return all(values[key] * 1e3 <= limit for key, limit in slo.items())


def metrics(run: ServingRun, slo: Mapping[str, float] | None = None) -> dict[str, float | int]:
    """vLLM's result keys for `run` (module docstring); `slo` adds request_goodput."""
    seconds = duration(run)
    inputs = sum(s.request.input_tokens for s in run.served)
    outputs = sum(len(s.token_times) for s in run.served)
    result: dict[str, float | int] = {
        "duration": seconds, "completed": len(run.served),
        "total_input_tokens": inputs, "total_output_tokens": outputs,
        "request_throughput": len(run.served) / seconds,
        "output_throughput": outputs / seconds,
        "total_token_throughput": (inputs + outputs) / seconds,
    }
    for name, values in _latencies(run).items():
        ms = np.asarray(values, dtype=float) * 1e3
        empty = ms.size == 0
        result[f"mean_{name}_ms"] = 0.0 if empty else float(ms.mean())
        result[f"median_{name}_ms"] = 0.0 if empty else float(np.median(ms))
        result[f"std_{name}_ms"] = 0.0 if empty else float(ms.std())
        for p in (90, 99):
            result[f"p{p}_{name}_ms"] = 0.0 if empty else float(np.percentile(ms, p))
    if slo:
        result["request_goodput"] = sum(meets(s, slo) for s in run.served) / seconds
    usage = [u for samples in run.kv_usage for _, u in samples]
    result["kv_cache_usage_mean"] = float(np.mean(usage)) if usage else 0.0
    result["kv_cache_usage_max"] = float(np.max(usage)) if usage else 0.0
    result["preemptions"] = sum(s.preemptions for s in run.served)
    return result


def time_average_in_system(run: ServingRun) -> float:
    """Mean number of requests in the system over the run's duration, integrated from
    the arrival and completion samples (Little's law: = arrival rate x mean E2EL)."""
    samples = run.in_system
    area = sum(n * (t1 - t0) for (t0, n), (t1, _) in zip(samples, samples[1:]))
    return area / duration(run)
