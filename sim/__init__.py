"""HOW LONG it takes: SimPy replay of a schedule on a topology, network, cost model, outputs and the CLI."""
