"""WHAT runs: the hardware-free schedule IR, generators, lowering passes, validation and
the Timeline both backends emit. Standard library only."""
