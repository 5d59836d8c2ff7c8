"""Throughput of one iteration, the numbers users compare across tools and papers, each
with the formula it comes from (they are stored with it: meta['throughput']).

With B = global batch (sequences), s = sequence length, T = iteration time (s),
G = GPUs of the job (tp * cp * dp * pp):
- tokens/s = B * s / T, and per GPU / G;
- model FLOPs = 3 x the forward FLOPs of the B sequences (forward + backward = 2x forward,
  SC21 section 5.1 / K22 eq. 7's counting: recomputation NOT counted), from
  ModelSpec.iteration_flops (per-layer FLOPs of SC21, generalised to GQA, SwiGLU and MoE);
  model TFLOP/s per GPU = model FLOPs / (T * G) / 1e12; under LoRA the backward counts
  the GEMMs it runs (frozen weights have no weight gradient: ModelSpec.iteration_flops,
  schedules.lora), so model FLOPs are forward + executed backward, not 3x forward;
- hardware FLOPs = model FLOPs + what recomputation redoes (full: one more forward of the
  layers, SC21 eq. 3's 4x; selective: the core attention 4bsh*s per layer, K22 section 5):
  hardware TFLOP/s per GPU likewise;
- MFU = model FLOP/s per GPU / the device's dense peak for the model's dtype (datasheet,
  topologies.devices), as K22 and PaLM define it; None where the device has no peak.
"""
from __future__ import annotations

from clustersim.schedules.plan import Plan
from clustersim.schedules.recompute import KEPT, layer_role
from clustersim.topologies import DeviceSpec, TopologyError

FORMULAS = {
    "tokens_per_s": "global_batch_size * seq_length / iteration_time",
    "tokens_per_s_per_gpu": "tokens_per_s / GPUs",
    "model_tflops_per_gpu": "3 x forward FLOPs of the global batch (no recompute; SC21, K22 "
                            "eq. 7) / (iteration_time * GPUs) / 1e12",
    "hardware_tflops_per_gpu": "model FLOPs + recomputed FLOPs (full: one more forward of "
                               "each recomputed layer; selective: core attention) / "
                               "(iteration_time * GPUs) / 1e12",
    "mfu": "model FLOP/s per GPU / the device's dense peak FLOP/s for the dtype (datasheet)",
}
LORA_MODEL_FLOPS = ("forward FLOPs + the backward GEMMs LoRA runs (frozen weights: input "
                    "gradients only; schedules.lora) of the global batch (no recompute) / "
                    "(iteration_time * GPUs) / 1e12")


def iteration_flops(plan: Plan) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of one iteration of the whole job."""
    model, parallel = plan.model, plan.parallel
    sequences = parallel.global_batch_size // model.micro_batch_size  # microbatches, all dp
    flops = model.iteration_flops(sequences)
    if parallel.recompute == "full":
        rerun = sum(model.layer_forward_flops(first + p)
                    for first, layers in zip(plan.stage_offsets[:plan.model_stages],
                                             plan.stage_layers[:plan.model_stages])
                    for p in range(layers) if layer_role(parallel, p) != KEPT)
        return flops, flops + sequences * rerun
    if parallel.recompute == "selective":
        return flops, flops + sequences * model.num_layers * model.attention_core_flops()
    return flops, flops


def throughput(plan: Plan, iteration_time: float, device: DeviceSpec | None) -> dict:
    """The throughput figures of one iteration (module docstring) and their formulas."""
    gpus = plan.world_size
    tokens = plan.parallel.global_batch_size * plan.model.seq_length
    model_flops, hardware_flops = iteration_flops(plan)
    per_gpu = iteration_time * gpus
    model_tflops = model_flops / per_gpu / 1e12 if iteration_time > 0 else 0.0
    peak = _peak(device, plan.model.dtype)
    return {
        "tokens_per_s": tokens / iteration_time if iteration_time > 0 else 0.0,
        "tokens_per_s_per_gpu": tokens / per_gpu if iteration_time > 0 else 0.0,
        "model_tflops_per_gpu": model_tflops,
        "hardware_tflops_per_gpu": (hardware_flops / per_gpu / 1e12
                                    if iteration_time > 0 else 0.0),
        "mfu": model_tflops * 1e12 / peak if peak else None,
        "peak_tflops": peak / 1e12 if peak else None,
        "device": device.name if device else None,
        "gpus": gpus,
        "formulas": ({**FORMULAS, "model_tflops_per_gpu": LORA_MODEL_FLOPS}
                     if plan.model.lora else FORMULAS),
    }


def _peak(device: DeviceSpec | None, dtype: str) -> float | None:
    if device is None:
        return None
    try:
        return device.peak(dtype)
    except TopologyError:  # a dtype the datasheet gives no peak for
        return None


def format_throughput(figures: dict) -> str:
    """One summary line: tokens/s (job, per GPU), model and hardware TFLOP/s per GPU, MFU."""
    lora = figures.get("formulas", {}).get("model_tflops_per_gpu") == LORA_MODEL_FLOPS
    counted = "forward + LoRA's backward GEMMs" if lora else "3x forward"
    mfu = (f"MFU {figures['mfu']:.1%} of {figures['peak_tflops']:.0f} TFLOP/s "
           f"({figures['device']})" if figures["mfu"] is not None
           else "MFU n/a (no dense peak for this device and dtype)")
    return (f"throughput {figures['tokens_per_s']:,.0f} tokens/s "
            f"({figures['tokens_per_s_per_gpu']:,.0f} per GPU, {figures['gpus']} GPUs), "
            f"model {figures['model_tflops_per_gpu']:.1f} TFLOP/s per GPU ({counted}, "
            f"no recompute), hardware {figures['hardware_tflops_per_gpu']:.1f} TFLOP/s per "
            f"GPU (recompute counted), {mfu}")
