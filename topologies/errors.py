"""The one error type of `topologies`: bad topology input (names the node/edge, field, rule)."""


class TopologyError(ValueError):
    """An invalid device, topology graph, preset or topology file.

    Messages name the offending node or edge, the field and the rule it broke, so a user
    can fix the input without reading code.
    """
