"""The state of flows started together (sim.flows.FlowNetwork.start_flows): their routes,
bytes, rates and ends, as one object per start, not one per flow.

Two forms with one interface, chosen by `flow_batch`: `FlowBatch` holds many flows in
numpy arrays (a 1,024-GPU all-to-all phase has a million: one object, vectorised
updates), `OneFlow` holds a lone transfer's in plain Python values (a pipeline's P2P
sends, where numpy's per-call cost would dominate). The network reads and changes them
only through the methods below.

A batch's live flows are always re-rated together, so they share one `last` (s): flow
state is `remaining` bytes as of `last`, moving at `rate` bytes/s, ending at
last + remaining / rate. `on_links` counts the live flows on each link; `version`
counts re-ratings (FlowNetwork's heap entries of an older one are stale); `done` fires
when the last flow has ended. Units: bytes, seconds, bytes/s; links are the flow
network's link ids.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import NamedTuple

import numpy as np
import simpy


EPS_BYTES = 1e-6  # remaining bytes below this count as delivered (float rounding)
Routes = Iterator[tuple[tuple[int, ...], float, float]]


class Ended(NamedTuple):
    """Flows that ended: how many, the links they used (with how many of them used
    each) and the links the batch no longer has a live flow on."""

    count: int
    links: list[int]
    counts: list[int]
    vacated: list[int]


NONE_ENDED = Ended(0, [], [], [])


def flow_batch(flows: Sequence[tuple[Sequence[int], float]], done: simpy.Event,
               n_links: int) -> FlowBatch | OneFlow:
    """The batch of `flows` ((link ids, bytes) each; `n_links` link ids in all)."""
    if len(flows) == 1:
        return OneFlow(*flows[0], done)
    return FlowBatch(flows, done, n_links)


class FlowBatch:
    """Many flows in arrays: flow i has `nbytes[i]`, `remaining[i]`, `rate[i]`, `ended[i]`
    (s; nan while alive); its route is the (flow, link) entries k with `flow_of[k]` == i,
    link `ids[k]`, in route order (`live_*`: the live flows' entries only)."""

    __slots__ = ("size", "left", "done", "last", "version", "on_links", "n_links", "flow_of",
                 "ids", "nbytes", "remaining", "rate", "ended", "alive", "live_flow_of",
                 "live_ids")

    def __init__(self, flows: Sequence[tuple[Sequence[int], float]], done: simpy.Event,
                 n_links: int):
        n = self.size = self.left = len(flows)
        routes = [links for links, _ in flows]
        lengths = np.fromiter(map(len, routes), dtype=np.int64, count=n)
        self.ids = np.fromiter(chain.from_iterable(routes), dtype=np.int64,
                               count=int(lengths.sum()))
        self.flow_of = np.repeat(np.arange(n), lengths)
        self.nbytes = np.fromiter((nbytes for _, nbytes in flows), dtype=float, count=n)
        self.remaining = self.nbytes.copy()
        self.rate = np.zeros(n)
        self.ended = np.full(n, np.nan)
        self.alive = np.ones(n, dtype=bool)
        self.done, self.last, self.version, self.n_links = done, 0.0, 0, n_links
        self.live_flow_of, self.live_ids = self.flow_of, self.ids
        links, counts = self._link_counts(self.ids)
        self.on_links = dict(zip(links, counts))

    def end_empty(self, now: float) -> Ended:
        """End at once the flows with no bytes or no link to send them on."""
        routed = np.bincount(self.flow_of, minlength=self.size) > 0
        empty = ~routed | (self.remaining <= EPS_BYTES)
        return self._end(empty, now) if empty.any() else NONE_ENDED

    def end_due(self, due: float, now: float) -> Ended:
        """End (at `now`) the live flows that finish by `due`."""
        return self._end(self._finish_times() <= due, now)

    def _end(self, ending: np.ndarray, now: float) -> Ended:
        ending &= self.alive
        count = int(np.count_nonzero(ending))
        self.alive[ending] = False
        self.remaining[ending] = 0.0
        self.ended[ending] = now
        leaving = ending[self.live_flow_of]
        links, counts = self._link_counts(self.live_ids[leaving])
        keep = ~leaving
        self.live_flow_of, self.live_ids = self.live_flow_of[keep], self.live_ids[keep]
        on_links, vacated = self.on_links, []
        for link, gone in zip(links, counts):
            still = on_links[link] - gone
            if still:
                on_links[link] = still
            else:
                del on_links[link]
                vacated.append(link)
        self.left -= count
        return Ended(count, links, counts, vacated)

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """(flow index, link id) of every live flow's route entries."""
        return self.live_flow_of, self.live_ids

    def lone_rate(self, capacity: list[float]) -> float:
        """The rate of the only live flow when no other flow shares its links."""
        return min(map(capacity.__getitem__, self.live_ids.tolist()))

    def longest_route(self, latency: np.ndarray) -> float:
        """The largest sum of `latency` (per link) over a flow's route (0 if none)."""
        if not self.ids.size:
            return 0.0
        return float(np.bincount(self.flow_of, weights=latency[self.ids]).max())

    def set_rates(self, rates: float | np.ndarray, now: float) -> None:
        """Advance the live flows to `now` and give them `rates` (one for all, or an
        array over the batch's flows)."""
        alive = self.alive
        left = self.remaining[alive] - self.rate[alive] * (now - self.last)
        self.remaining[alive] = np.maximum(left, 0.0)
        self.rate[alive] = rates if isinstance(rates, float) else rates[alive]
        self.last = now
        self.version += 1

    def next_finish(self) -> float:
        return float(self._finish_times().min())

    def _finish_times(self) -> np.ndarray:
        """When each flow ends at its current rate (s; inf for ended flows)."""
        times = np.full(self.size, np.inf)
        alive = self.alive
        times[alive] = self.last + self.remaining[alive] / self.rate[alive]
        return times

    def routes(self) -> Routes:
        """(link ids, bytes, end time) of each flow (sim.shared_links)."""
        bounds = np.searchsorted(self.flow_of, np.arange(self.size + 1)).tolist()
        ids, nbytes, ended = self.ids.tolist(), self.nbytes.tolist(), self.ended.tolist()
        for i in range(self.size):
            yield tuple(ids[bounds[i]:bounds[i + 1]]), nbytes[i], ended[i]

    def live_link_rates(self) -> Iterator[tuple[int, float]]:
        """(link, rate) of every live flow on every link of its route."""
        return zip(self.live_ids.tolist(), self.rate[self.live_flow_of].tolist())

    def _link_counts(self, ids: np.ndarray) -> tuple[list[int], list[int]]:
        """The distinct link ids among route entries `ids` (ascending) and how many entries
        each has: by a sort, or by a count over all link ids when the entries outnumber
        a tenth of them."""
        if ids.size * 10 < self.n_links:
            used, counts = np.unique(ids, return_counts=True)
            return used.tolist(), counts.tolist()
        counts = np.bincount(ids, minlength=self.n_links)
        used = np.flatnonzero(counts)
        return used.tolist(), counts[used].tolist()


class OneFlow:
    """A lone flow (a P2P transfer): FlowBatch's interface on plain values; `links` its
    route."""

    __slots__ = ("left", "done", "last", "version", "on_links", "links", "nbytes",
                 "remaining", "rate", "ended")
    size = 1

    def __init__(self, links: Sequence[int], nbytes: float, done: simpy.Event):
        self.links, self.nbytes = tuple(links), float(nbytes)
        self.remaining, self.rate, self.ended = self.nbytes, 0.0, float("nan")
        self.left, self.done, self.last, self.version = 1, done, 0.0, 0
        self.on_links = dict.fromkeys(self.links, 1)

    def end_empty(self, now: float) -> Ended:
        empty = not self.links or self.remaining <= EPS_BYTES
        return self._end(now) if empty else NONE_ENDED

    def end_due(self, due: float, now: float) -> Ended:
        return self._end(now) if self.left and self.next_finish() <= due else NONE_ENDED

    def _end(self, now: float) -> Ended:
        self.left, self.remaining, self.ended, self.on_links = 0, 0.0, now, {}
        links = list(self.links)
        return Ended(1, links, [1] * len(links), links)

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(len(self.links), dtype=np.int64), np.array(self.links, dtype=np.int64)

    def lone_rate(self, capacity: list[float]) -> float:
        return min(map(capacity.__getitem__, self.links))

    def longest_route(self, latency: np.ndarray) -> float:
        return float(sum(latency[list(self.links)].tolist())) if self.links else 0.0

    def set_rates(self, rates: float | np.ndarray, now: float) -> None:
        self.remaining = max(self.remaining - self.rate * (now - self.last), 0.0)
        self.rate = rates if isinstance(rates, float) else float(rates[0])
        self.last = now
        self.version += 1

    def next_finish(self) -> float:
        return self.last + self.remaining / self.rate

    def routes(self) -> Routes:
        yield self.links, self.nbytes, self.ended

    def live_link_rates(self) -> Iterator[tuple[int, float]]:
        return ((link, self.rate) for link in (self.links if self.left else ()))
