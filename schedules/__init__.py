"""WHAT runs: the hardware-free op IR (ops, schedule), the schedule registry (registry,
pipelines/), the Plan that resolves one run's facts (plan), the lowering passes
(lowering), the execution contract (contract), validation, the memory model and the
Timeline both backends emit. Standard library only. docs/architecture.md is the map."""
