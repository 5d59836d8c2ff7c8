"""Pausing Python's cyclic garbage collector around a simulation.

A replay and its reports hold millions of objects (ops, spans, SimPy events) that live
until the run ends; each collection of the older generations walks all of them, and
objects allocated while the collector is paused are walked again when it resumes. Paused,
the reference counts still free every object that is not in a cycle; the cycles wait for
the next collection after the pause, so the replay makes none per op: only its SimPy
processes, one per rank, are cycles (no callback names itself: sim.engine.
when_processed; tests/test_replay_cycles.py). Peak memory barely moves (deep pipeline
P = 128: 417 MB either way) while the wall time of a deep pipeline drops by about a
quarter (benchmarks/results/engine_speed.md).
"""
from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def gc_paused():
    """Disable the cyclic collector inside the block, restoring its state after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
