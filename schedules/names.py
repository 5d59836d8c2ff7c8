"""The shared vocabulary: parallel axes, the group axes an op talks over, and the lanes of
a Timeline. One spelling each, used by the IR, both backends and the outputs (the JSON
and text forms carry these strings).

Axes of the dense rank grid (ParallelConfig.rank_order names them, innermost first):
tensor, context, expert, data and pipeline parallel. The expert grid of Megatron-Core
re-splits a pipeline stage's tp * cp * dp ranks into expert tensor, expert and expert
data parallel (schedules.parallel). Data-parallel collectives run on the whole DP group
('dp_cp' with context parallelism: the CP ranks hold the same weights), or with HSDP /
ZeRO++ hpZ on a shard group inside a node and the replica group across shard groups
(schedules.sharding.group_ranks); the routed experts' gradients run on the expert
data-parallel group 'edp' where it differs (Plan.expert_grad_group). USP context
parallelism splits the cp group in two levels (schedules.cp_comms): 'cp_a2a', blocks of
consecutive cp ranks (Ulysses), and 'cp_ring', the ranks at one place in every block.
2D, 2.5D and 3D tensor parallelism (schedules.tp_grid) lay a tp group out as a grid: 'tp_row'
and 'tp_col' are a 2D grid's rows and columns, 'tp_dep' 2.5D's depth; 'tp_input', 'tp_weight',
'tp_output' and the planes 'tp_input_weight', 'tp_output_weight' are 3D's. 2.5D's depth
slices hold the same weights, so their gradients reduce over 'dp_dep' (dp x depth ranks).
"""
from __future__ import annotations

TP, CP, EP, DP, PP = "tp", "cp", "ep", "dp", "pp"
ETP, EDP = "etp", "edp"
DP_SHARD, DP_REPLICATE = "dp_shard", "dp_replicate"
DP_CP = "dp_cp"  # Megatron-Core's data-parallel group with context parallel (dp x cp ranks)
CP_A2A, CP_RING = "cp_a2a", "cp_ring"  # USP's levels of cp: Ulysses inside, ring across
TP_ROW, TP_COL = "tp_row", "tp_col"  # 2D tensor parallelism's grid rows and columns
TP_DEP = "tp_dep"  # 2.5D tensor parallelism's depth
TP_INPUT, TP_WEIGHT, TP_OUTPUT = "tp_input", "tp_weight", "tp_output"  # 3D's axes
TP_INPUT_WEIGHT, TP_OUTPUT_WEIGHT = "tp_input_weight", "tp_output_weight"  # 3D's planes
DP_DEP = "dp_dep"  # 2.5D: the dp ranks times the depth slices, which hold the same weights
PP_COPIES = "pp_copies"  # DualPipe: pipeline ranks r and P-1-r, holding copies of a stage
HOST = "host"  # an OPT_STEP on the host CPU (ZeRO-Offload)
PCIE = "pcie"  # a copy between a GPU and its host CPU

GRID_AXES = (TP, CP, EP, DP, PP)
"""The axes of ParallelConfig.rank_order (ep folds into dp and cp)."""
EXPERT_AXES = {EP: EP, ETP: TP, EDP: DP}
"""Expert-grid group axis -> the dense axis whose place it takes in the rank order."""
DP_GROUPS = frozenset({DP, DP_CP, DP_SHARD, DP_REPLICATE, EDP, PP_COPIES, DP_DEP})
"""Group axes of data-parallel communication (gradient reductions over the ranks that
hold the same weights; DualPipe's two copies of a stage and 2.5D's depth slices included:
schedules.chains, schedules.tp_grid)."""
TP_GRID_GROUPS = frozenset({TP_ROW, TP_COL, TP_DEP, TP_INPUT, TP_WEIGHT, TP_OUTPUT,
                            TP_INPUT_WEIGHT, TP_OUTPUT_WEIGHT})
"""Group axes inside a 2D, 2.5D or 3D tensor-parallel group (schedules.tp_grid)."""
INTRA_LAYER_GROUPS = frozenset({TP, CP, EP, ETP, CP_A2A, CP_RING}) | TP_GRID_GROUPS
"""Group axes of communication inside a layer (tensor, context, expert parallelism)."""

COMPUTE_LANE, SEND_LANE, RECV_LANE = "compute", "send", "recv"
PCIE_LANE, HOST_LANE, COLLECTIVE_LANE = PCIE, HOST, "coll"
"""Timeline lanes: the compute stream, P2P sends and receives, host copies, host optimizer
steps; a collective runs on the lane named by its group axis (COLLECTIVE_LANE without
one)."""


def collective_lane(group: str | None) -> str:
    """The Timeline lane of a collective on `group` (COLLECTIVE_LANE without one)."""
    return group or COLLECTIVE_LANE
