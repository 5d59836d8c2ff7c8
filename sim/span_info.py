"""The `info` of the P2P spans the replay writes (sim.engine), in little memory: a deep
pipeline has millions of sends and receives, and a dict per span was a fifth of the
replay's memory. Both are read-only mappings, read as the dicts they stand for
(`dict(info)`, `info['peer']`, `info.get(...)`); bandwidth in bytes/s.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType


class SendInfo(Mapping):
    """A SEND span's {'peer': the receiving rank, 'bandwidth_Bps': bytes/s, or None for a
    transfer of no duration}, in two slots."""

    __slots__ = ("peer", "bandwidth_Bps")
    _KEYS = ("peer", "bandwidth_Bps")

    def __init__(self, peer: int, bandwidth: float | None):
        self.peer, self.bandwidth_Bps = peer, bandwidth

    def __getitem__(self, key: str):
        if key in self._KEYS:
            return getattr(self, key)
        raise KeyError(key)

    def __iter__(self):
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)

    def __repr__(self) -> str:
        return repr(dict(self))


@lru_cache(maxsize=None)
def received_from(peer: int) -> Mapping[str, int]:
    """A RECV span's {'peer': the sending rank}: one read-only mapping per peer, shared
    by all its receives."""
    return MappingProxyType({"peer": peer})
