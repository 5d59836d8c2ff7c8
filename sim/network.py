"""The one transfer seam: `Network.transfer(src, dst, nbytes)` returns a SimPy event that
fires when the bytes have arrived. Fidelity changes here and only here.

- `sim.flows.FlowNetwork`: flows on topology routes sharing links max-min fairly (the
  default whenever costs come from a cost model).
- `InstantNetwork`: every transfer takes zero time (used with `--uniform-costs`).
"""
from __future__ import annotations

from typing import Protocol

import simpy


class Network(Protocol):
    def transfer(self, src: str, dst: str, nbytes: int) -> simpy.Event: ...


class InstantNetwork:
    def __init__(self, env: simpy.Environment):
        self.env = env

    def transfer(self, src: str, dst: str, nbytes: int) -> simpy.Event:
        return self.env.timeout(0)
