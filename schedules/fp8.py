"""Transformer Engine's FP8 training recipes (dtype 'fp8', ModelSpec.fp8_recipe and
fp8_format; Megatron-LM's --fp8-recipe / --fp8-format): how each recipe casts a GEMM
operand and what it keeps (Fp8Recipe), the notes a run prints of them, and which devices
may run them. What the casts cost: schedules.layer_kernels.fp8_kernels; the FP8 weight
copies: schedules.memory_model; the FP8 all-gathers: schedules.tp_comms (sequence
parallelism) and, with FP8 parameters (ModelSpec.fp8_param_gather,
check_fp8_param_gather), schedules.dp_sizes (the data-parallel parameter gathers).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .errors import ConfigError


@dataclass(frozen=True)
class Fp8Recipe:
    """A Transformer Engine FP8 recipe (transformer_engine/common/recipe/__init__.py), as
    Megatron-LM's --fp8-recipe names it (megatron/core/fp8_utils.py get_fp8_recipe), and
    how it casts a GEMM operand (what it costs: layer_kernels.fp8_kernels).

    - `current_amax`: scales come from the tensor's own amax, read in a pass before the
      cast (csrc/quantizer.cpp Float8CurrentScalingQuantizer::quantize_impl:
      nvte_compute_amax, then the cast); delayed scaling takes them from the amax history
      (the cast records the new amax; their all-reduce over Megatron's tp x dp x cp
      amax group, pytorch/quantization.py reduce_and_update_fp8_tensors, a few KB per
      pass, is not modelled) and a block-scaled cast finds its blocks' amax itself.
    - `fused_norm`: TE's norm kernel writes the FP8 output itself (csrc/extensions/
      normalization.cpp Impl::FULLY_FUSED, Float8Quantizer only); under current scaling it
      writes 16-bit output and its amax (FUSED_NORM_AMAX_FP8), under block scaling 16-bit
      output (UNFUSED), and a cast follows.
    - `scale_bytes` / `weight_scale_bytes`: scale bytes per element of an FP8 copy of an
      activation or gradient / a weight; 0 for one fp32 scale per tensor. MXFP8: one E8M0
      byte per 32 elements (pytorch/constants.py MXFP8_BLOCK_SCALING_SIZE); blockwise: an
      fp32 per 1x128 block, a weight's per 128x128 block (Float8BlockQuantizer block_len,
      Float8BlockScaling x/w_block_scaling_dim 1/2). A block-scaled recipe casts the row-
      and the column-wise copy from 16 bit at once ('MXFP8BlockScaling' docstring), also
      before a sequence-parallel all-gather, which then moves both in the backward
      (pytorch/distributed.py _all_gather_mxfp8); a per-tensor recipe's column-wise copy
      is the row-wise one's transpose, which Hopper's TN-only FP8 GEMMs need
      (csrc/quantizer.cpp with_transpose), and only the row-wise one can be gathered.
    - `default_format`: the TE recipe class's fp8_format default.
    - `blackwell_only`: TE runs it on compute capability 10.x only (pytorch/quantization.py
      _compute_mxfp8_support; check_fp8_device).
    """

    te_class: str
    default_format: str
    current_amax: bool = False
    fused_norm: bool = False
    scale_bytes: float = 0.0
    weight_scale_bytes: float = 0.0
    blackwell_only: bool = False

    @property
    def block_scaled(self) -> bool:
        return self.scale_bytes > 0

    @property
    def copy_bytes(self) -> float:
        """Bytes per element of one FP8 copy of an activation or gradient."""
        return 1 + self.scale_bytes

    @property
    def weight_bytes(self) -> float:
        """Bytes per element of one FP8 copy of a weight."""
        return 1 + self.weight_scale_bytes

    @property
    def cached_weight_bytes(self) -> float:
        """Bytes TE keeps per FP8-GEMM weight: its row- and column-wise copies."""
        return 2 * self.weight_bytes

    @property
    def gathered_gradient_bytes(self) -> float:
        """Bytes per element of an output gradient in a sequence-parallel all-gather: its
        row-wise copy (per-tensor), or both copies (block-scaled; class docstring)."""
        return 2 * self.copy_bytes if self.block_scaled else self.copy_bytes


MXFP8_BLOCK, FP8_BLOCK, FP32_SCALE = 32, 128, 4  # elements per scale; bytes of an fp32 scale
FP8_RECIPES = {  # Megatron-LM's --fp8-recipe choices but 'custom' (a user's quantizer)
    "delayed": Fp8Recipe("DelayedScaling", "hybrid", fused_norm=True),
    "tensorwise": Fp8Recipe("Float8CurrentScaling", "hybrid", current_amax=True),
    "mxfp8": Fp8Recipe("MXFP8BlockScaling", "e4m3", scale_bytes=1 / MXFP8_BLOCK,
                       weight_scale_bytes=1 / MXFP8_BLOCK, blackwell_only=True),
    "blockwise": Fp8Recipe("Float8BlockScaling", "e4m3", scale_bytes=FP32_SCALE / FP8_BLOCK,
                           weight_scale_bytes=FP32_SCALE / FP8_BLOCK ** 2),
}
DEFAULT_FP8_RECIPE = "delayed"  # Megatron-LM's --fp8-recipe default
FP8_FORMATS = {  # Megatron-LM's --fp8-format (TransformerConfig.fp8)
    "e4m3": "E4M3 for every FP8 tensor",
    "hybrid": "E4M3 for activations and weights, E5M2 for output gradients",
}


class Fp8Settings(Protocol):
    """What the notes and the device check read of a ModelSpec (schedules.model)."""

    fp8_recipe: str | None
    fp8_format: str | None
    fp8_param_gather: bool

    @property
    def fp8(self) -> Fp8Recipe | None: ...


def fp8_notes(model: Fp8Settings, sequence_parallel: bool = False) -> list[str]:
    """What a run of `model` assumed of its FP8 settings (a run's notes; none without
    FP8): the format changes numerics only, what the recipe's casts cost and where
    (layer_kernels.fp8_kernels), and the weights' FP8 copies (schedules.memory_model)."""
    recipe = model.fp8
    if recipe is None:
        return []
    if recipe.block_scaled:
        casts = (f"row- and column-wise copies cast from 16 bit at once, "
                 f"{recipe.copy_bytes:g} bytes per element with their block scales")
    elif recipe.current_amax:
        casts = "scales from each tensor's amax, read in a pass before its cast"
        if sequence_parallel:
            casts += ", all-reduced over tp before a sequence-parallel all-gather"
    else:
        casts = ("scales from the amax history, TE's norm writing the FP8 input of QKV and "
                 "fc1 (the amaxes' all-reduce over tp x dp x cp, a few KB per pass, is not "
                 "modelled)")
    if not recipe.block_scaled:
        casts += ("; column-wise copies are transposes, as Hopper's TN-only FP8 GEMMs need "
                  "(Blackwell's would not: charged there too)")
    if model.fp8_param_gather:
        weights = (f"FP8 parameters (fp8_param_gather): TE's linear weights are kept in FP8 "
                   f"({recipe.cached_weight_bytes:g} bytes per weight, the row-wise copy and "
                   f"its column-wise one), no 16-bit copy of them (fp32 master weights stay "
                   f"in the optimizer), and the parameter all-gathers move them at "
                   f"{recipe.weight_bytes:g} B per weight; other parameters stay 16-bit")
    else:
        weights = (f"FP8 weight copies ({recipe.cached_weight_bytes:g} bytes per FP8-GEMM "
                   f"weight, row- and column-wise) kept beside the 16-bit weights, cast once "
                   f"per step (TE caches them across microbatches): 1/M of the casts "
                   f"charged to each of the M forwards")
    return [f"fp8 format {model.fp8_format} ({FP8_FORMATS[model.fp8_format]}): the same "
            f"FP8 bytes and GEMM rate either way; it changes numerics only, which are not "
            f"modelled",
            f"fp8 recipe {model.fp8_recipe} (Transformer Engine {recipe.te_class}): {casts}",
            weights]


def check_fp8_device(model: Fp8Settings, device: str,
                     compute_capability: tuple[int, int] | None) -> None:
    """Refuse an FP8 recipe TE cannot run on `device` of CUDA `compute_capability` (None:
    not an NVIDIA GPU): MXFP8 needs Blackwell's block-scaled tensor cores, compute
    capability 10.x (Fp8Recipe.blackwell_only; TE _compute_mxfp8_support). Devices without
    FP8 at all are refused by their missing fp8 peak."""
    blackwell = compute_capability is not None and compute_capability[0] == 10
    if model.fp8 and model.fp8.blackwell_only and not blackwell:
        raise ConfigError(f"--fp8-recipe {model.fp8_recipe}: Transformer Engine runs MXFP8 "
                          f"on Blackwell GPUs only (compute capability 10.x), not on the "
                          f"{device}: choose delayed, tensorwise or blockwise")


def check_fp8_param_gather(model: Fp8Settings, parallel: Any) -> None:
    """Refuse FP8 parameters (ModelSpec.fp8_param_gather) on a layout that does not gather
    parameters over data-parallel ranks. Megatron-LM allows --fp8-param-gather only with
    the distributed optimizer or FSDP (training/arguments.py validate_args: "only
    supported with distributed optimizer, torch fsdp2, megatron fsdp"): the optimizer
    steps fp32 master shards and casts them into the FP8 parameters
    (core/fp8_utils.py quantize_param_shard), which its all-gather then moves; torchao's
    enable_fsdp_float8_all_gather is an FSDP2 all-gather (torchtitan docs/float8.md). So
    zero_stage >= 1 (ZeRO-1/2: the gather after the step; ZeRO-3: the gathers before
    compute). ZeRO++'s qwZ and hpZ (their own gather formats) and offload (a host step
    writing 16-bit shards) are not modelled with it. Checked by ParallelConfig.check_model,
    before any work."""
    if not model.fp8_param_gather:
        return
    rule = "fp8_param_gather=True (--fp8-param-gather)"
    if parallel.zero_stage == 0:
        raise ConfigError(f"{rule} needs a data-parallel layout that gathers parameters: "
                          f"zero_stage >= 1 (Megatron's distributed optimizer, or FSDP), got 0")
    for name in ("quantized_weights", "hpz", "offload"):
        if getattr(parallel, name):
            raise ConfigError(f"{rule} with {name}=True is not modelled: drop one of them")
