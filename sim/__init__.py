"""HOW LONG it takes: the SimPy replay of a lowered schedule on a topology (simulate,
engine), the cost models (cost_model), the flow network and collectives, outputs (Gantt,
trace, report) and the command line (cli/). docs/architecture.md is the map."""
