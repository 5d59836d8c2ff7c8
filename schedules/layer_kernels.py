"""The kernels of a transformer layer, embedding and head: FLOPs and HBM bytes of each.

A roofline of a whole layer (its FLOPs at one efficiency) cannot represent a layer's
memory-bound work: softmax and dropout over the b*a*s^2 attention scores, norms, GeLU,
bias-dropout-add. Their share grows like a*s/h^2 as layers narrow, so one whole-layer
efficiency over-predicts narrow models and under-predicts wide ones. Here a layer is the
kernel sequence Megatron-LM runs (fused scale-mask-softmax, fused bias-GeLU,
fused bias-dropout-add, batched GEMMs for the core attention; flash attention as one
kernel), each with its FLOPs and the bytes it moves, so a cost model can charge each
kernel its own roofline, max(FLOPs / peak, bytes / bandwidth), and sum them.

Units: FLOPs and bytes for one micro-batch on one rank (a TP/CP shard). FLOPs are the
GEMM FLOPs of `ModelSpec` (SC21): the kernels of a layer's forward sum to exactly
`layer_forward_flops() / (tp * cp)`, elementwise kernels count 0 FLOPs. Bytes are the
tensors each kernel reads and writes once (elements of `dtype_bytes`, dropout masks 1
byte, cross-entropy in fp32), counted from the kernel's inputs and outputs, not measured.
GEMM shapes: each GEMM kernel carries (M, N, K), an (M x K) @ (K x N) product (T tokens
as M in the forward; its backward's input- and weight-gradient GEMMs as two kernels,
`Kernel.gradient_gemms`), for cost models that know how GEMM speed depends on the shape.
An MoE layer's routed-expert GEMMs carry the shape of all k experts' columns over the
T tokens, not one expert's grouped-GEMM slice.
Rotary position embeddings (`position_embedding_type='rope'`) add one elementwise kernel
that reads and writes Q and K (Megatron-Core's fused RoPE), forward and backward.
Notation (per rank): T = b*s/cp tokens, R = T*h residual-stream elements (/t with sequence
parallelism), S = b*(a/t)*s^2/cp attention scores, F = T*f/t MLP elements, d = dtype bytes.
MLP weights read per GEMM: h*f/t per matrix; in an MoE layer the k routed experts a token
runs, each split over etp ranks (expert tensor parallelism), h*k*f_e/etp, and the shared
experts h*f_sh/t (an approximation: a rank's grouped GEMM reads all its E/ep experts).
Backward: each GEMM runs twice (input and weight gradient: 2x FLOPs and bytes, SC21);
elementwise backward kernels read the forward's saved tensor and the incoming gradient
and write the outgoing one.

FLOPs and work. `Kernel.flops` are the model FLOPs of the FLOP formulas (what MFU counts);
`Kernel.work` the FLOPs the kernel executes, which a cost model charges. They differ for
flash attention only. These models are decoder-only language models, so attention is
causal: Megatron's unfused path computes all s^2 scores and masks them (work = FLOPs),
but a flash kernel skips the masked blocks and executes half of the forward's 4bs^2h,
and its backward recomputes the scores and runs five GEMMs to the forward's two, 2.5x
the forward's work (not 2x): the FLOP count of flash-attention's own benchmark,
`flops = 4*batch*seqlen^2*nheads*headdim // (2 if causal else 1)`, backward `2.5 * f`
(Dao-AILab/flash-attention, benchmarks/benchmark_flash_attention.py; Dao 2023, FA2).

FP8 (dtype 'fp8', ModelSpec.fp8 the recipe; transformer_engine/pytorch/module/linear.py
and layernorm_linear.py, Megatron-Core's TE layers: LayerNormLinear QKV and fc1 (an MoE
layer's experts: GroupedLinear after TENorm and the router), Linear out proj and fc2 after
Megatron's own bias-activation): the FP8_GEMMS read FP8 copies of their operands
(Fp8Recipe.copy_bytes, weights weight_bytes) and `fp8_kernels` adds the memory-bound
kernels (0 FLOPs) that make them. Each GEMM input X and output gradient dY needs a
row-wise copy for one GEMM and a column-wise one for the other of its backward pair:
- a cast reads the 16-bit tensor (d bytes per element) and writes its copies: per-tensor
  recipes the row-wise one and its transpose (TE's fused cast-transpose), block-scaled
  ones both, each with its scales (Fp8Recipe docstring);
- current scaling (tensorwise) first reads the tensor once for its amax (an `fp8_amax`
  kernel), but where a norm computed it; delayed scaling's norm writes QKV's and fc1's
  FP8 row-wise copy itself (the 'norm' kernel writes copy_bytes instead of d) and a
  transpose (read and write 1 byte) makes the other (common/normalization/layernorm/
  ln_api.cpp); no cast is fused into the activation (TE's LayerNormMLP would fuse it,
  but Megatron-Core's TE spec runs Megatron's activation, then TERowParallelLinear);
- with sequence parallelism a per-tensor recipe casts the row-wise copy of its rank's
  shard before the all-gather (TE cannot gather a transpose: distributed.py
  _all_gather_fp8) and transposes the gathered copy in the backward; a block-scaled one
  casts both copies of the shard (its gathers move both for dY: schedules.tp_comms);
- weights: TE casts each FP8-GEMM weight (both copies) once per step and caches it
  across the step's microbatches (Megatron-Core passes is_first_microbatch,
  megatron/core/extensions/transformer_engine.py; linear.py quantize_weight
  update_workspace): 1/M of the step's weight casts is charged to each of the M
  microbatches' forwards (the step's total is exact; the first microbatch's share is
  spread), and none to a recomputed forward (under FSDP2, ZeRO-3 here, TE casts every
  forward's gathered weights again, linear.py is_fsdp2: not modelled).
The transposes are Hopper's (TN-only FP8 GEMMs); Blackwell skips them for the per-tensor
recipes, which this module does not know (ModelSpec.fp8 is device-free; fp8_notes).

LoRA (ModelSpec.lora, schedules.lora): after each adapted base GEMM (T x in) @ (in x out)
its adapters run `lora_a_gemm` (T x in) @ (in x r) and `lora_b_gemm` (T x r) @ (r x out),
split over tp as the base layer is (NeMo's ParallelLinearAdapter: r over tp for a
column-parallel base, in for a row-parallel one; out over tp), and a `lora_add` that
scales the adapter's output and adds it to the base's (reads 2, writes 1 of T x out). In
the backward the adapter GEMMs run both gradient GEMMs (dA, dB and the input gradients),
`lora_add` scales dY (reads and writes T x out), a `lora_grad_add` sums the adapter's dX
into the base's (reads 2, writes 1 of T x in), and the frozen base GEMMs (BASE_GEMMS,
the output layer's too) run their input gradient only: half their usual backward.
QLoRA (lora_base_dtype): a `dequantize` kernel before each base GEMM, in the forward and
again in the backward (bitsandbytes keeps no 16-bit copy), reads the weight's stored
bytes (schedules.lora.stored_weight_bytes) and writes it in dtype. The adapters'
all-gathers and all-reduces of the T x r intermediate over tp are not modelled (r << h),
nor that autograd skips the first layer's input gradients (its input needs none).

Eager elementwise ops (ModelSpec.fused_elementwise False: PyTorch without torch.compile,
e.g. torchtitan with compile off): each op its own kernel, as torchtitan's Llama runs
them (pytorch/torchtitan@9dec370, torchtitan/models/norms.py RMSNorm.forward,
torchtitan/models/llama/model.py apply_rotary_emb, repeat_kv, FeedForward.forward,
TransformerBlock.forward), bytes per element in EAGER_OPS: RMSNorm (the final norm's
too; LayerNorm and GeLU are single ATen kernels either way), SwiGLU's silu and mul,
RoPE's fp32 passes, GQA's repeat_kv copies and the residual adds (no dropout). The
backward of each op is autograd's (torch/csrc/autograd/FunctionsManual.cpp): it reads
the tensors the op saved and the incoming gradient and writes each input's gradient.
Ignored: per-token statistics (T elements), the norm weight and RoPE's freqs_cis (h and
s*head_dim/2 elements), views (reshape, view_as_complex/real, flatten, transpose: SDPA's
flash output is already (b, s, heads, head_dim)), the sums of the separate wq/wk/wv and
w1/w3 input gradients (GEMMs as the fused default), and the activation memory the fp32
intermediates hold (layer_activation_bytes stays K22's).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from .errors import ConfigError
from .fp8 import Fp8Recipe
from .lora import adapters, base_linears, stored_weight_bytes
from .model import ModelSpec
from .parallel import ParallelConfig
from .tp_grid import TpGrid, tp_grid

CROSS_ENTROPY_FP32 = 4  # vocab-parallel cross-entropy runs in fp32 (K22 section 4.3)
CAUSAL_FLASH_SHARE = 0.5  # of the score blocks a causal flash kernel computes (docstring)
FLASH_BACKWARD_WORK = 2.5  # flash backward work / forward work (docstring)
FP8_GEMMS = frozenset({"qkv_gemm", "proj_gemm", "fc1_gemm", "fc2_gemm"})
"""The GEMMs Transformer Engine runs in FP8 under dtype 'fp8': those of its linear layers
(LayerNormLinear QKV and FC1, Linear projection and FC2, GroupedLinear experts). The
core attention (DotProductAttention; FP8 attention is a separate opt-in), the router and
Megatron's output layer (a plain ColumnParallelLinear) stay 16-bit. An FP8 GEMM reads its
input and weight in FP8 and writes a 16-bit output."""
BASE_GEMMS = {"linear_qkv": "qkv_gemm", "linear_proj": "proj_gemm", "linear_fc1": "fc1_gemm",
              "linear_fc2": "fc2_gemm"}  # a layer's linear layers (Megatron names): their GEMMs
FROZEN_GEMMS = frozenset({*BASE_GEMMS.values(), "logits_gemm"})  # frozen under LoRA
COLUMN_PARALLEL = frozenset({"linear_qkv", "linear_fc1"})  # the others are row-parallel
FP32 = 4  # bytes of an fp32 element
RMSNORM_OPS = ("rmsnorm_to_fp32", "rmsnorm_pow", "rmsnorm_mean", "rmsnorm_mul_rsqrt",
               "rmsnorm_type_as", "rmsnorm_mul_weight")  # per residual element
ROPE_OPS = ("rope_to_fp32", "rope_complex_mul", "rope_type_as")  # per Q and K element
SWIGLU_OPS = ("silu", "swiglu_mul")  # per MLP element F


def eager_ops(d: float) -> dict[str, tuple[float, float]]:
    """{op: (forward, backward) HBM bytes per element} of the eager ops (module docstring),
    d the dtype's bytes. RMSNorm, x * rsqrt(x.float().pow(2).mean(-1) + eps), type_as(x),
    * weight: forward cast (d in, fp32 out), pow, mean (reads), mul, cast back, mul; in
    the backward the cast reads the sum of the fp32 gradients of pow's and mul's paths
    (an add: 2 read, 1 written), pow reads x.pow(1) (a copy), 2 * it and grad * that,
    mean writes grad / h expanded, mul writes grad * rsqrt and reads grad * x for its
    row sum, the weight mul writes grad * w and grad * y and sums the latter over tokens.
    silu: silu_backward reads grad and the input; mul: grad * each saved factor. RoPE:
    .float(), a complex64 mul (4 bytes per real element), type_as; backward the casts
    reversed and grad * conj(freqs). repeat_kv: per K and V element and its repeat
    (reads h_kv, writes h; backward sums back). residual_add: x + y; its backward sums the
    gradients of the two branches (2 read, 1 written)."""
    f = FP32
    return {"rmsnorm_to_fp32": (d + f, 3 * f + f + d), "rmsnorm_pow": (2 * f, 7 * f),
            "rmsnorm_mean": (f, f), "rmsnorm_mul_rsqrt": (2 * f, 6 * f),
            "rmsnorm_type_as": (f + d, d + f), "rmsnorm_mul_weight": (2 * d, 6 * d),
            "silu": (2 * d, 3 * d), "swiglu_mul": (3 * d, 6 * d),
            "rope_to_fp32": (d + f, f + d), "rope_complex_mul": (2 * f, 2 * f),
            "rope_type_as": (f + d, d + f), "repeat_kv": (d, d), "residual_add": (3 * d, 3 * d)}


def _eager(names: Iterable[str], elements: float, d: float) -> list[Kernel]:
    """The forward kernels of eager ops `names` over `elements` (eager_ops)."""
    ops = eager_ops(d)
    return [Kernel(name, 0.0, ops[name][0] * elements) for name in names]


def _norm(model: ModelSpec, elements: float, written: float) -> list[Kernel]:
    """A norm over `elements`: one kernel reading d and writing `written` bytes per
    element, or under eager elementwise ops torchtitan's RMSNorm op by op."""
    d = model.dtype_bytes
    if not model.fused_elementwise and model.normalization == "RMSNorm":
        return _eager(RMSNORM_OPS, elements, d)
    return [Kernel("norm", 0.0, (d + written) * elements)]


def check_kernel_list_used(model: ModelSpec, costs: str) -> None:
    """Refuse fused_elementwise=False where `costs` (a cost source that does not price this
    module's kernel list: measured times, fixed seconds, real kernels) would ignore it."""
    if not model.fused_elementwise:
        raise ConfigError(f"fused_elementwise=False (--no-fused-elementwise) picks the "
                          f"roofline's eager kernel list; {costs} would ignore it: drop one "
                          f"of them")


@dataclass(frozen=True)
class Kernel:
    """One kernel (or a repeat of it, summed): model FLOPs, HBM bytes and the FLOPs it
    executes (`work`; None = its FLOPs; module docstring)."""

    name: str
    flops: float
    nbytes: float
    work: float | None = None
    gemm: tuple[float, float, float] | None = None  # (M, N, K) of a GEMM kernel
    attention: tuple[float, str, float] | None = None  # a flash kernel's (sequence,
    # 'forward' | 'backward', FLOPs of one call): the sequence length each call attends
    # over (s / cp), its pass, and one layer's call (a stage's kernel sums its layers)

    def gradient_gemms(self) -> list[Kernel]:
        """A GEMM's backward: the input gradient dX = dY W^T, an (M x K) output over N,
        and the weight gradient dW = X^T dY, (K x N) over M; each the forward's FLOPs and
        bytes (SC21: backward = 2x forward)."""
        m, n, k = self.gemm
        return [replace(self, gemm=(m, k, n)), replace(self, gemm=(k, n, m))]

    @property
    def executed(self) -> float:
        """FLOPs the kernel runs: what a cost model charges."""
        return self.flops if self.work is None else self.work

    def scaled(self, factor: float) -> Kernel:
        # the constructor, not dataclasses.replace (4x slower): a plan's stages scale
        # every layer kernel, and the planner builds thousands of plans
        return Kernel(self.name, self.flops * factor, self.nbytes * factor,
                      None if self.work is None else self.work * factor, self.gemm,
                      self.attention)


def merge(kernels: Iterable[Kernel]) -> tuple[Kernel, ...]:
    """Sum kernels of the same name, GEMM shape and attention pass (exact for a roofline:
    equal shapes, equal ratio)."""
    total: dict[tuple, list] = {}
    for k in kernels:
        entry = total.setdefault((k.name, k.gemm, k.attention), [0.0, 0.0, 0.0, False])
        entry[0] += k.flops
        entry[1] += k.nbytes
        entry[2] += k.executed
        entry[3] = entry[3] or k.work is not None
    return tuple(Kernel(name, f, b, w if own else None, gemm, attention)
                 for (name, gemm, attention), (f, b, w, own) in total.items())


class _Shape:
    """Per-rank element counts of one layer (module docstring's notation)."""

    def __init__(self, model: ModelSpec, parallel: ParallelConfig):
        t, cp = parallel.tp, parallel.cp
        self.d = model.dtype_bytes
        self.d_in = model.gemm_input_bytes  # an FP8_GEMMS input element
        self.d_w = model.fp8.weight_bytes if model.fp8 else self.d  # and weight element
        self.h, self.t = model.hidden_size, t
        self.tokens = model.micro_batch_size * model.seq_length / cp
        self.residual = self.tokens * self.h / (t if parallel.activations_split else 1)
        self.full = self.tokens * self.h  # a GEMM's input after the SP all-gather
        self.scores = (model.micro_batch_size * model.num_attention_heads / t
                       * model.seq_length ** 2 / cp)
        self.head_dim = self.h / model.num_attention_heads
        self.q = self.tokens * self.h / t
        self.kv = self.tokens * model.kv_hidden_size / t
        self.up = 2 if model.swiglu else 1  # fc1 output columns per MLP width (SwiGLU: 2)
        self._model = model

    def mlp(self, layer: int | None) -> float:
        """F: MLP elements (of one matrix's width) of `layer` (ModelSpec's `layer`)."""
        return self.tokens * self._model._mlp_widths(layer) / self.t

    def gemm(self, name: str, in_elems: float, out_elems: float, weights: float) -> Kernel:
        """A (T x in) @ (in x out) GEMM: 2 * T * in * out FLOPs; reads input and weights,
        writes output. `weights` is the per-rank weight element count."""
        flops = 2 * in_elems * out_elems / self.tokens
        d_in, d_w = (self.d_in, self.d_w) if name in FP8_GEMMS else (self.d, self.d)
        shape = (self.tokens, out_elems / self.tokens, in_elems / self.tokens)
        return Kernel(name, flops, d_in * in_elems + d_w * weights + self.d * out_elems,
                      gemm=shape)


def attention_core_forward(model: ModelSpec, parallel: ParallelConfig) -> list[Kernel]:
    """QK^T, scale-mask-softmax, dropout, attention-over-V (4bs^2h/(t*cp) FLOPs); with
    flash attention one kernel reading Q, K, V and writing the output."""
    x = _Shape(model, parallel)
    flops = 2 * x.scores * x.head_dim
    if model.use_flash_attn:
        return [Kernel("flash_attention", 2 * flops, x.d * (2 * x.q + 2 * x.kv),
                       work=2 * flops * CAUSAL_FLASH_SHARE,
                       attention=(model.seq_length / parallel.cp, "forward", 2 * flops))]
    return [Kernel("scores_bmm", flops, x.d * (x.scores + x.q + x.kv)),
            Kernel("softmax", 0.0, 2 * x.d * x.scores),
            Kernel("attention_dropout", 0.0, 2 * x.d * x.scores + x.scores),
            Kernel("context_bmm", flops, x.d * (x.scores + x.kv + x.q))]


def _layer_compute(model: ModelSpec, parallel: ParallelConfig,
                   layer: int | None) -> list[Kernel]:
    """A layer's forward kernels but FP8 casts (layer_forward)."""
    x = _Shape(model, parallel)
    h, t, d, hkv, up, mlp = x.h, x.t, x.d, model.kv_hidden_size, x.up, x.mlp(layer)
    held = model._mlp_widths(layer) / t  # weight columns per MLP matrix on this rank
    if model.is_moe_layer(layer):
        held = (model.moe_router_topk * model.moe_ffn_hidden_size / parallel.etp
                + (model.moe_shared_expert_intermediate_size or 0) / t)
    fused = model.fp8 is not None and model.fp8.fused_norm  # module docstring, FP8

    def norm(feeds_te_gemm: bool) -> list[Kernel]:
        return _norm(model, x.residual, x.d_in if fused and feeds_te_gemm else d)

    eager = not model.fused_elementwise
    residual_add = (_eager(["residual_add"], x.residual, d) if eager
                    else [Kernel("bias_dropout_add", 0.0, 3 * d * x.residual + x.residual)])
    rope = ([Kernel("rope", 0.0, 2 * d * (x.q + x.kv))]
            if model.position_embedding_type == "rope" else [])
    if rope and eager:
        rope = _eager(ROPE_OPS, x.q + x.kv, d)
    if eager and model.num_query_groups < model.num_attention_heads:
        rope += _eager(["repeat_kv"], 2 * (x.kv + x.q), d)
    activation = ([Kernel("activation", 0.0, d * (up + 1) * mlp)]
                  if not (eager and model.swiglu) else _eager(SWIGLU_OPS, mlp, d))
    grid = tp_grid(parallel)

    def linear(name: str, in_elems: float, out_elems: float, weights: float) -> list[Kernel]:
        if grid:
            return [grid_gemm(BASE_GEMMS[name], name in COLUMN_PARALLEL, x, in_elems,
                              out_elems, grid)]
        return _linear(model, x, name, x.gemm(BASE_GEMMS[name], in_elems, out_elems, weights))

    kernels = [*norm(True),
               *linear("linear_qkv", x.full, x.q + 2 * x.kv, h * (h + 2 * hkv) / t),
               *rope,
               *attention_core_forward(model, parallel),
               *linear("linear_proj", x.q, x.full, h * h / t),
               *residual_add, *norm(not model.is_moe_layer(layer)),
               *linear("linear_fc1", x.full, up * mlp, up * h * held),
               *activation,
               *linear("linear_fc2", mlp, x.full, h * held),
               *residual_add]
    if model.is_moe_layer(layer):
        k = model.moe_router_topk
        kernels += [x.gemm("router_gemm", x.full, x.tokens * model.num_experts / t,
                           h * model.num_experts / t),
                    Kernel("token_permute", 0.0, 4 * d * k * x.full)]
    return kernels


def grid_gemm(kernel: str, column: bool, x: _Shape, in_elems: float, out_elems: float,
              grid: TpGrid) -> Kernel:
    """GEMM `kernel` of a linear layer under a 2D, 2.5D or 3D grid (schedules.tp_grid),
    given as its 1D split's per-rank input and output elements (`column`: 1D splits its
    output columns, else its input rows): the same FLOPs per rank, 2 T h_in h_out / t, run
    as the grid's local GEMMs (TpGrid.gemm_steps), each reading its two blocks and writing
    its output block."""
    h_in = in_elems / x.tokens * (1 if column else x.t)
    h_out = out_elems / x.tokens * (x.t if column else 1)
    steps, (m, n, k) = grid.gemm_steps(x.tokens, h_in, h_out)
    return Kernel(kernel, 2 * steps * m * n * k, x.d * steps * (m * k + k * n + m * n),
                  gemm=(m, n, k))


def _linear(model: ModelSpec, x: _Shape, name: str, gemm: Kernel) -> list[Kernel]:
    """The base GEMM of linear layer `name`, under QLoRA after its weight's dequantization,
    and its adapters' kernels after it (module docstring, LoRA)."""
    tokens, t, d, r = x.tokens, x.t, x.d, model.lora_rank
    before = []
    if model.lora_base_dtype is not None:
        n_in, n_out = base_linears(model)[name]
        stored = stored_weight_bytes(model, n_in, n_out, d)
        before = [Kernel("dequantize", 0.0, (stored + d * n_in * n_out) / t)]
    after = []
    in_elems = tokens * gemm.gemm[2]  # the base GEMM's input on this rank
    for _, base, n_in, n_out in adapters(model):
        if base != name:
            continue
        column = name in COLUMN_PARALLEL
        after += [x.gemm("lora_a_gemm", in_elems, tokens * r / (t if column else 1),
                         n_in * r / t),
                  x.gemm("lora_b_gemm", tokens * r, tokens * n_out / t, r * n_out / t),
                  Kernel("lora_add", 0.0, 3 * d * tokens * n_out / t)]
    return before + [gemm] + after


def layer_forward(model: ModelSpec, parallel: ParallelConfig, layer: int | None = None,
                  weight_casts: bool = True) -> list[Kernel]:
    """The forward kernels of one layer (`layer` as ModelSpec: None = the repeating one);
    under FP8 with its inputs' casts and, `weight_casts`, its share of the step's weight
    casts (fp8_kernels)."""
    forward, _, weights = fp8_kernels(model, parallel, layer)
    return _layer_compute(model, parallel, layer) + forward + (weights if weight_casts else [])


def layer_backward(model: ModelSpec, parallel: ParallelConfig,
                   layer: int | None = None) -> list[Kernel]:
    """The backward kernels of one layer, without recomputation: GEMMs twice; softmax,
    GeLU, norm backward read the saved tensor and the gradient and write a gradient
    (3 tensors); dropout backward reads gradient and mask; the residual gradients add;
    under FP8 the output gradients' casts and the transposes (fp8_kernels); under LoRA
    frozen base GEMMs once (dX) and the adapters' and QLoRA's kernels (module docstring);
    eager ops their autograd backward (eager_ops)."""
    x = _Shape(model, parallel)
    eager = eager_ops(x.d)
    d = x.d
    elementwise = {
        "norm": 3 * d * x.residual,
        "softmax": 3 * d * x.scores,
        "attention_dropout": 2 * d * x.scores + x.scores,
        "bias_dropout_add": 3 * d * x.residual + x.residual,  # dropout grad + residual add
        "rope": 2 * d * (x.q + x.kv),  # rotate the Q and K gradients back
    }
    out = []
    for k in _layer_compute(model, parallel, layer):
        if k.name == "flash_attention":  # reads Q, K, V, O, dO; writes dQ, dK, dV
            out.append(Kernel(k.name, 2 * k.flops, x.d * (4 * x.q + 4 * x.kv),
                              work=FLASH_BACKWARD_WORK * k.executed,
                              attention=(k.attention[0], "backward", 2 * k.flops)))
        elif k.gemm:
            out.extend(_gemm_backward(model, k))
        elif k.flops or k.name == "token_permute":
            out.append(k.scaled(2))
        elif k.name == "dequantize":
            out.append(k)
        elif k.name == "lora_add":  # scale dY into the adapter
            out.append(k.scaled(2 / 3))
        elif k.name in eager:
            forward, backward = eager[k.name]
            out.append(Kernel(k.name, 0.0, k.nbytes * backward / forward))
        elif k.name == "activation":
            out.append(Kernel(k.name, 0.0, k.nbytes * 5 / 3 if model.swiglu else k.nbytes * 3 / 2))
        else:
            out.append(Kernel(k.name, 0.0, elementwise[k.name]))
    return out + fp8_kernels(model, parallel, layer)[1]


def _gemm_backward(model: ModelSpec, k: Kernel) -> list[Kernel]:
    """A GEMM's backward (Kernel.gradient_gemms): under LoRA a frozen base GEMM's input
    gradient only, and after an adapter's A GEMM the sum of its input gradient into the
    base's (lora_grad_add; module docstring)."""
    grads = k.gradient_gemms()
    if model.lora and k.name in FROZEN_GEMMS:
        return grads[:1]
    if k.name == "lora_a_gemm":
        m, _, n_in = k.gemm
        return grads + [Kernel("lora_grad_add", 0.0, 3 * model.dtype_bytes * m * n_in)]
    return grads


@dataclass(frozen=True)
class _Fp8Operand:
    """An FP8 GEMM operand: `elements` where TE casts it (a rank's shard, before a
    sequence-parallel all-gather), `gathered` its elements after that gather (0: none),
    `normed`: TE's norm produced it (LayerNormLinear's input)."""

    elements: float
    gathered: float = 0.0
    normed: bool = False


def _fp8_operands(model: ModelSpec, parallel: ParallelConfig,
                  layer: int | None) -> tuple[list[_Fp8Operand], list[_Fp8Operand]]:
    """(inputs, output gradients) of a layer's FP8_GEMMS on one rank, QKV, proj, fc1, fc2
    (module docstring's notation): QKV's and dense fc1's inputs come out of the norm and
    are gathered with SP, as the output gradients of proj and dense fc2 are; an MoE
    layer's experts take the dispatcher's tokens (x.full, as their GEMMs)."""
    x = _Shape(model, parallel)
    gathered = x.full if parallel.sequence_parallel else 0.0
    normed = _Fp8Operand(x.residual, gathered, normed=True)
    row_parallel_output = _Fp8Operand(x.residual, gathered)
    experts = _Fp8Operand(x.full)
    moe = model.is_moe_layer(layer)
    inputs = [normed, _Fp8Operand(x.q), experts if moe else normed, _Fp8Operand(x.mlp(layer))]
    gradients = [_Fp8Operand(x.q + 2 * x.kv), row_parallel_output,
                 _Fp8Operand(x.up * x.mlp(layer)), experts if moe else row_parallel_output]
    return inputs, gradients


def _fp8_casts(operand: _Fp8Operand, recipe: Fp8Recipe, d: int, copy: float,
               prefix: str = "fp8") -> tuple[list[Kernel], list[Kernel]]:
    """(the kernels where TE casts `operand` to its two FP8 copies of `copy` bytes per
    element, the transpose a per-tensor recipe runs after an all-gather); module
    docstring, FP8."""
    if recipe.block_scaled:
        return [Kernel(f"{prefix}_cast", 0.0, (d + 2 * copy) * operand.elements)], []
    n, gathered = operand.elements, operand.gathered
    later = [Kernel("fp8_transpose", 0.0, 2 * copy * gathered)] if gathered else []
    if recipe.fused_norm and operand.normed:  # the norm wrote the row-wise copy
        return ([] if gathered else [Kernel("fp8_transpose", 0.0, 2 * copy * n)]), later
    now = [Kernel(f"{prefix}_cast", 0.0, (d + (1 if gathered else 2) * copy) * n)]
    if recipe.current_amax and not operand.normed:
        now.insert(0, Kernel(f"{prefix}_amax", 0.0, d * n))
    return now, later


def fp8_kernels(model: ModelSpec, parallel: ParallelConfig, layer: int | None = None
                ) -> tuple[list[Kernel], list[Kernel], list[Kernel]]:
    """The FP8 cast kernels of one layer per microbatch (module docstring, FP8): (its
    inputs' casts in the forward, its output gradients' casts and the transposes in the
    backward, 1/M of the step's weight casts); empty without FP8."""
    recipe = model.fp8
    if recipe is None:
        return [], [], []
    d = model.dtype_bytes
    inputs, gradients = _fp8_operands(model, parallel, layer)
    forward, backward = [], []
    for operand in inputs:
        now, later = _fp8_casts(operand, recipe, d, recipe.copy_bytes)
        forward += now
        backward += later
    for operand in gradients:
        now, later = _fp8_casts(operand, recipe, d, recipe.copy_bytes)
        backward += now + later
    weights = _Fp8Operand(model.layer_fp8_weight_count(parallel.tp, parallel.ep, layer,
                                                       parallel.etp))
    step, _ = _fp8_casts(weights, recipe, d, recipe.weight_bytes, prefix="fp8_weight")
    return forward, backward, [k.scaled(1 / parallel.num_microbatches) for k in step]


def recompute_forward(model: ModelSpec, parallel: ParallelConfig,
                      layer: int | None = None) -> list[Kernel]:
    """What recomputation adds to a layer's backward: its whole forward (full; the
    weights' FP8 copies are cached, not cast again) or the attention core (selective,
    K22), none otherwise."""
    if parallel.recompute == "full":
        return layer_forward(model, parallel, layer, weight_casts=False)
    if parallel.recompute == "selective":
        return attention_core_forward(model, parallel)
    return []


def embedding_forward(model: ModelSpec, parallel: ParallelConfig) -> list[Kernel]:
    """Vocab-parallel lookup (reads and writes T*h) and the embedding dropout."""
    x = _Shape(model, parallel)
    return [Kernel("embedding", 0.0, 2 * x.d * x.full),
            Kernel("embedding_dropout", 0.0, 2 * x.d * x.residual + x.residual)]


def head_forward(model: ModelSpec, parallel: ParallelConfig) -> list[Kernel]:
    """Final norm, the output GEMM 2bshV/(t*cp) (vocab-parallel) and fp32 cross-entropy
    (cast, max, exp-sum, loss: the T*V/t logits read in dtype, written and read twice in
    fp32)."""
    x = _Shape(model, parallel)
    logits = x.tokens * model.vocab_size / x.t
    grid = tp_grid(parallel)
    gemm = (grid_gemm("logits_gemm", True, x, x.full, logits, grid) if grid else
            x.gemm("logits_gemm", x.full, logits, model.vocab_size * x.h / x.t))
    return [*_norm(model, x.residual, x.d), gemm,
            Kernel("cross_entropy", 0.0, logits * (x.d + 3 * CROSS_ENTROPY_FP32))]


def head_backward(model: ModelSpec, parallel: ParallelConfig) -> list[Kernel]:
    """Cross-entropy gradient (softmax read in fp32, gradient written in fp32 and cast),
    the output GEMM twice (once, dX, when frozen under LoRA), the final norm's backward."""
    x = _Shape(model, parallel)
    logits = x.tokens * model.vocab_size / x.t
    gemm = next(k for k in head_forward(model, parallel) if k.name == "logits_gemm")
    eager = eager_ops(x.d)
    norm = [Kernel(k.name, 0.0, k.nbytes * eager[k.name][1] / eager[k.name][0])
            for k in _norm(model, x.residual, x.d) if k.name in eager]
    return [Kernel("cross_entropy", 0.0, logits * (2 * CROSS_ENTROPY_FP32 + x.d)),
            *_gemm_backward(model, gemm), *(norm or [Kernel("norm", 0.0, 3 * x.d * x.residual)])]
