"""The `info` of the spans the replay writes by the million (sim.engine), in little
memory: a deep pipeline has millions of sends and receives, and a dict per span was a
fifth of the replay's memory; a full replay has a collective span per member. All are
read-only mappings, read as the dicts they stand for (`dict(info)`, `info['peer']`,
`info.get(...)`); bandwidth in bytes/s, waits in seconds.
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


class WaitedInfo(Mapping):
    """A full-replay collective span's info: `{**shared, 'waited_s': seconds this member
    waited between posting it and its start, 'last': the member whose post it waited for,
    or None}` (sim.waits), with `shared` (the collective's own info, or None) held once
    for all members instead of copied into a dict per member."""

    __slots__ = ("shared", "waited_s", "last")
    _OWN = ("waited_s", "last")

    def __init__(self, shared: Mapping | None, waited_s: float, last: int | None):
        if shared and ("waited_s" in shared or "last" in shared):  # _OWN, per member span
            raise ValueError(f"a collective's info may not hold {self._OWN}: {dict(shared)}")
        self.shared, self.waited_s, self.last = shared or {}, waited_s, last

    def __getitem__(self, key: str):
        if key in self._OWN:
            return getattr(self, key)
        return self.shared[key]

    def __iter__(self):
        yield from self.shared
        yield from self._OWN

    def __len__(self) -> int:
        return len(self.shared) + len(self._OWN)

    def __repr__(self) -> str:
        return repr(dict(self))
