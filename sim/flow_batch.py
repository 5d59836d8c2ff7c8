"""The state of flows started together (sim.flows.FlowNetwork.start): a `Coflow` whose event
fires when its last flow has ended, its flows held in parts of one of two forms with one
interface (the network reads and changes them only through the methods below):

- `FlowBatch`: many flows in numpy arrays (a 1,024-GPU all-to-all phase has a million:
  one object, vectorised updates), for a start of at least ARRAY_FLOWS flows;
- `OneFlow`: one flow in plain Python values, for smaller starts (a pipeline's P2P send, a
  data-parallel ring of a few GPUs), where numpy's per-call cost would dominate and
  re-rating is per flow.

A part's live flows are always re-rated together, so they share one `last` (s): flow state
is `remaining` bytes as of `last`, moving at `rate` bytes/s, ending at
last + remaining / rate. `on_links` holds the links the part's live flows are on (a
FlowBatch's: with how many of them are on each); `version` counts re-ratings
(FlowNetwork's heap entries of an older one are stale). Units: bytes, seconds, bytes/s;
links are the flow network's link ids.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import NamedTuple

import numpy as np
import simpy

from .maxmin import link_counts


EPS_BYTES = 1e-6  # remaining bytes below this count as delivered (float rounding)
Routes = Iterator[tuple[tuple[int, ...], float, float]]


class Ended(NamedTuple):
    """Flows that ended: how many, the links they used (with how many of them used
    each) and the links the part no longer has a live flow on."""

    count: int
    links: Sequence[int]
    counts: Sequence[int]
    vacated: Sequence[int]


NONE_ENDED = Ended(0, (), (), ())


class Entries:
    """Route entries of several parts gathered for one max-min solve (sim.maxmin):
    lone flows' as plain lists, many flows' as arrays, joined once by `arrays`."""

    def __init__(self) -> None:
        self.flows: list[int] = []
        self.links: list[int] = []
        self.flow_arrays: list[np.ndarray] = []
        self.link_arrays: list[np.ndarray] = []

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(flow index, link id) of every entry gathered."""
        return (np.concatenate([np.array(self.flows, dtype=np.int64), *self.flow_arrays]),
                np.concatenate([np.array(self.links, dtype=np.int64), *self.link_arrays]))


ARRAY_FLOWS = 256
"""A start of at least this many flows is one FlowBatch; a smaller one is a OneFlow each."""


class Countdown:
    """A coflow's `size` flows, `left` of them not ended yet; `done` fires when none is
    (FlowNetwork._finished: the event order). Its parts hold this, not the coflow, so
    that nothing refers in a cycle (the CLI runs with the cyclic collector off)."""

    __slots__ = ("size", "left", "done")

    def __init__(self, size: int, done: simpy.Event):
        self.size = self.left = size
        self.done = done


class Coflow:
    """Flows started together: its `parts` and their `countdown` (`size`, `done`)."""

    __slots__ = ("parts", "countdown")

    def __init__(self, routes: Sequence[Sequence[int]], sizes: Sequence[float],
                 done: simpy.Event, n_links: int):
        countdown = self.countdown = Countdown(len(routes), done)
        self.parts: list[FlowBatch | OneFlow] = (
            [FlowBatch(routes, sizes, countdown, n_links)] if len(routes) >= ARRAY_FLOWS
            else [OneFlow(links, nbytes, countdown) for links, nbytes in zip(routes, sizes)])

    @property
    def size(self) -> int:
        return self.countdown.size

    @property
    def done(self) -> simpy.Event:
        return self.countdown.done

    def routes(self) -> Routes:
        """(link ids, bytes, end time) of each flow (sim.shared_links)."""
        for part in self.parts:
            yield from part.routes()


class FlowBatch:
    """Many flows of a coflow in arrays: flow i has `nbytes[i]`, `remaining[i]`, `rate[i]`,
    `ended[i]` (s; nan while alive); its route is the (flow, link) entries k with `flow_of[k]` == i,
    link `ids[k]`, in route order (`live_*`: the live flows' entries only)."""

    __slots__ = ("size", "left", "countdown", "last", "version", "on_links", "n_links",
                 "flow_of", "ids", "nbytes", "remaining", "rate", "ended", "alive",
                 "live_flow_of", "live_ids", "seq")

    def __init__(self, routes: Sequence[Sequence[int]], sizes: Sequence[float],
                 countdown: Countdown, n_links: int):
        n = self.size = self.left = len(routes)
        lengths = np.fromiter(map(len, routes), dtype=np.int64, count=n)
        self.ids = np.fromiter(chain.from_iterable(routes), dtype=np.int64,
                               count=int(lengths.sum()))
        self.flow_of = np.repeat(np.arange(n), lengths)
        self.nbytes = np.fromiter(sizes, dtype=float, count=n)
        self.remaining = self.nbytes.copy()
        self.rate = np.zeros(n)
        self.ended = np.full(n, np.nan)
        self.alive = np.ones(n, dtype=bool)
        self.countdown, self.last, self.version, self.n_links = countdown, 0.0, 0, n_links
        self.live_flow_of, self.live_ids = self.flow_of, self.ids
        links, counts = link_counts(self.ids, self.n_links)
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
        links, counts = link_counts(self.live_ids[leaving], self.n_links)
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

    def gather(self, offset: int, entries: Entries) -> None:
        """Add every live flow's route entries to `entries`, flow i as `offset` + i."""
        entries.flow_arrays.append(self.live_flow_of + offset)
        entries.link_arrays.append(self.live_ids)

    def lone_rate(self, capacity: list[float]) -> float:
        """The rate of the only live flow when no other flow shares its links."""
        return min(map(capacity.__getitem__, self.live_ids.tolist()))

    def longest_route(self, latency: list[float], latency_array: np.ndarray) -> float:
        """The largest sum of per-link latency (s; given as a list and as an array) over a
        flow's route, in route order (0 if no flow has a link)."""
        if not self.ids.size:
            return 0.0
        return float(np.bincount(self.flow_of, weights=latency_array[self.ids]).max())

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


class OneFlow:
    """One flow of a coflow: FlowBatch's interface on plain values; `links` its route."""

    __slots__ = ("left", "countdown", "last", "version", "on_links", "links", "nbytes",
                 "remaining", "rate", "ended", "seq")
    size = 1

    def __init__(self, links: Sequence[int], nbytes: float, countdown: Countdown):
        self.links = self.on_links = tuple(links)
        self.nbytes = float(nbytes)
        self.remaining, self.rate, self.ended = self.nbytes, 0.0, float("nan")
        self.left, self.countdown, self.last, self.version = 1, countdown, 0.0, 0

    def end_empty(self, now: float) -> Ended:
        empty = not self.links or self.remaining <= EPS_BYTES
        return self._end(now) if empty else NONE_ENDED

    def end_due(self, due: float, now: float) -> Ended:
        return self._end(now) if self.left and self.next_finish() <= due else NONE_ENDED

    def _end(self, now: float) -> Ended:
        self.left, self.remaining, self.ended, self.on_links = 0, 0.0, now, ()
        return Ended(1, self.links, (1,) * len(self.links), self.links)

    def gather(self, offset: int, entries: Entries) -> None:
        if self.left:
            entries.flows += [offset] * len(self.links)
            entries.links += self.links

    def lone_rate(self, capacity: list[float]) -> float:
        return min(map(capacity.__getitem__, self.links))

    def longest_route(self, latency: list[float], latency_array: np.ndarray) -> float:
        return sum(map(latency.__getitem__, self.links)) if self.links else 0.0

    def set_rates(self, rates: float, now: float) -> None:
        self.remaining = max(self.remaining - self.rate * (now - self.last), 0.0)
        self.rate = rates
        self.last = now
        self.version += 1

    def next_finish(self) -> float:
        return self.last + self.remaining / self.rate

    def routes(self) -> Routes:
        yield self.links, self.nbytes, self.ended

    def live_link_rates(self) -> Iterator[tuple[int, float]]:
        return ((link, self.rate) for link in (self.links if self.left else ()))
