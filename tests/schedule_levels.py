"""Helper for the schedule tests: microbatch-stages held along a program."""
from clustersim.schedules.ops import OpKind


def in_flight(program):
    """Levels of microbatch-stages held, in program order (+1 at F, -1 at B or W)."""
    level, levels = 0, []
    for op in program:
        level += {OpKind.F: 1, OpKind.B: -1, OpKind.W: -1}.get(op.kind, 0)
        levels.append(level)
    return levels
