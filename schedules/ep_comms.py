"""Expert-parallel communication of one compute op, and the cost of imbalanced experts.

Mixture-of-experts layers (Megatron-Core's MoE with the all-to-all token dispatcher;
Lepikhin et al. 2020, "GShard"; Fedus et al. 2021, "Switch Transformer"): the router sends
each token to its top-k experts, spread over the ep ranks of the EP group, with an
all-to-all (dispatch) before the experts and another (combine) after them; backward runs
the same two on the gradients. A rank's send buffer holds tokens * k copies of h values:
S = tokens * h * k * dtype with tokens = b*s/cp (/t under sequence parallelism, where
each TP rank dispatches its own sequence shard), and a rank sends (e-1)/e of it to the
other e-1 ranks (balanced routing): tokens * h * k * (e-1)/e * dtype bytes per all-to-all
(issue 6's closed form). Blocking. Full recompute repeats the forward's two in backward.

Expert tensor parallelism (Megatron-Core's --expert-tensor-parallel-size, etp, default
tp; the groups: schedules.parallel's expert grid etp x ep x edp). Each expert's weights
are split over etp ranks (column-parallel fc1, row-parallel fc2: ModelSpec.
layer_param_count). Two cases:
- tokens replicated over the TP ranks (tp > 1 without sequence parallelism, where
  ParallelConfig.check_model requires etp = tp): each TP rank runs 1/t of every expert on
  all its tokens, as the dense MLP does, and the MLP's TP all-reduce follows
  (schedules.tp_comms); no 'etp' ops. Megatron-Core refuses this layout in
  training (MoE with tp > 1 needs --sequence-parallel); it is kept as the dense analogue.
- each rank's tokens are its own (sequence parallelism, or tp = 1): the dispatcher
  all-gathers the dispatched tokens over the etp group after the dispatch all-to-all and
  reduce-scatters the expert output before the combine (MoEAlltoAllTokenDispatcher:
  A2A(EP) -> AG(ETP) -> experts -> RS(ETP) -> A2A(EP)); backward the reverse, again one
  all-gather and one reduce-scatter. nccl-tests sizes: S = etp * tokens * h * k * dtype
  (the gathered output; the reduce-scattered input: the tokens dispatched to the etp
  group), so a rank moves (etp-1)/etp * S = (etp-1) * tokens * h * k * dtype per
  collective (balanced routing). Blocking, on group axis 'etp'. The MoE layer's MLP then
  posts no TP collective except for its shared experts, a TP-split dense MLP
  (schedules.tp_comms).
The experts' FLOPs per rank are the same either way: the rank runs 1/(t*cp) of the
layer's token-expert work (1/etp of the width for etp/t of the tokens).

Imbalance (`moe_imbalance` f >= 1): with balanced routing each expert gets tokens*k/E
tokens; the busiest expert of a step gets f times that, and every rank waits for it, so
the expert MLP FLOPs of each MoE layer are scaled by f (router, attention, shared experts
are not; nor are the collectives' sizes).
"""
from __future__ import annotations

from .comm_spec import Comm, Covered, comms
from .model import ModelSpec
from .names import EP, ETP
from .ops import OpKind
from .parallel import ParallelConfig


def experts_split_by_tp(parallel: ParallelConfig) -> bool:
    """Whether MoE layers run their experts as the dense MLP runs: tokens replicated over
    tp > 1 ranks, without sequence parallelism (module docstring)."""
    return parallel.tp > 1 and not parallel.sequence_parallel


def dispatch_bytes(model: ModelSpec, parallel: ParallelConfig) -> float:
    """S of one dispatch (or combine) all-to-all: tokens * h * k * dtype (module docstring)."""
    tokens = model.micro_batch_size * model.seq_length / parallel.cp
    if parallel.sequence_parallel:
        tokens /= parallel.tp
    return tokens * model.hidden_size * model.moe_router_topk * model.dtype_bytes


PAIR_COMM_SMS = 20
"""SMs DeepSeek-V3 gives the expert all-to-alls while an overlapped forward-backward pair
computes on the rest ("only 20 SMs", of the H800's 132: DeepSeek-V3 report, sections
3.2.2 and 3.5.1)."""


def pair_hides_experts(model: ModelSpec, parallel: ParallelConfig) -> bool:
    """Whether an overlapped pair (Op.overlapped: DualPipe's F&B) has expert all-to-alls
    (or expert-TP gathers) to hide behind its compute: DeepSeek-V3's reason for the pair
    (section 3.2.1). Its EP and ETP collectives then run alongside its ops, and its
    compute runs on the SMs PAIR_COMM_SMS leave (schedules.intra_layer, sim.cost)."""
    return model.is_moe and max(parallel.ep, parallel.etp) > 1


def ep_comms(model: ModelSpec, parallel: ParallelConfig, cov: Covered) -> list[Comm]:
    """The EP all-to-alls of the compute op `cov` describes (module docstring)."""
    if parallel.ep == 1 or not cov.moe_layers:
        return []
    n = 2 * (cov.forward_moe_layers + cov.moe_layers * cov.backward)
    return comms(OpKind.ALL_TO_ALL, EP, n * dispatch_bytes(model, parallel), n)


def etp_comms(model: ModelSpec, parallel: ParallelConfig, cov: Covered) -> list[Comm]:
    """The expert-TP all-gathers and reduce-scatters of the compute op `cov` describes:
    per MoE layer one of each per forward pass and per backward, S = etp * dispatch_bytes
    (module docstring)."""
    if parallel.etp == 1 or not cov.moe_layers or experts_split_by_tp(parallel):
        return []
    n = cov.forward_moe_layers + cov.moe_layers * cov.backward
    size = n * parallel.etp * dispatch_bytes(model, parallel)
    return (comms(OpKind.ALL_GATHER, ETP, size, n)
            + comms(OpKind.REDUCE_SCATTER, ETP, size, n))


def expert_forward_flops(model: ModelSpec, parallel: ParallelConfig) -> float:
    """Forward FLOPs of one MoE layer's routed experts on one rank, balanced:
    2*b*s*h*k*f_e per matrix (3 matrices with SwiGLU, else 2) / (tp * cp)."""
    matrices = 3 if model.swiglu else 2
    b, s, h = model.micro_batch_size, model.seq_length, model.hidden_size
    flops = 2 * b * s * h * model.moe_router_topk * model.moe_ffn_hidden_size * matrices
    return flops / (parallel.tp * parallel.cp)


def imbalance_flops(model: ModelSpec, parallel: ParallelConfig, cov: Covered,
                    factor: float) -> float:
    """FLOPs the busiest expert adds to the compute op over the balanced cost:
    (f - 1) * expert FLOPs of its MoE layers, x1 for F, x2 for B (+1 for each MoE layer
    a full recompute reruns), half of B's for I and for W (as schedules.annotate splits
    B)."""
    if factor == 1 or not cov.moe_layers:
        return 0.0
    extra = (factor - 1) * cov.moe_layers * expert_forward_flops(model, parallel)
    if cov.kind is OpKind.F:
        return extra
    rerun = (factor - 1) * cov.rerun_moe_layers * expert_forward_flops(model, parallel)
    backward = 2 * extra + rerun
    return backward if cov.kind is OpKind.B else backward / 2
