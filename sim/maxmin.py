"""Max-min fair rates of flows sharing links: progressive filling (water-filling).

All flows grow at the same rate until some link is full; the flows through that link are
frozen at its fair share, their bandwidth is removed from their other links, and the rest
keep growing (Bertsekas & Gallager, "Data Networks", 2nd ed., section 6.5.2). Vectorised
with numpy over the flow x link incidence, one iteration per distinct bottleneck level,
each over the entries of the flows still growing.
Units: bytes/s.
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

_TOLERANCE = 1e-9


def max_min_rates(flow_links: Sequence[Sequence[int]], capacity: Sequence[float]) -> np.ndarray:
    """Rate of each flow; `flow_links[f]` lists the link ids flow f crosses (non-empty),
    `capacity[l]` is link l's bandwidth (pass a float array when calling often: a list
    of a large topology's links costs a conversion per call)."""
    n_flows = len(flow_links)
    lengths = np.fromiter(map(len, flow_links), dtype=np.int64, count=n_flows)
    link_ids = np.fromiter(chain.from_iterable(flow_links), dtype=np.int64,
                           count=int(lengths.sum()))
    return max_min_entries(np.repeat(np.arange(n_flows), lengths), link_ids, n_flows,
                           np.asarray(capacity, dtype=float))


def max_min_entries(flow_of: np.ndarray, link_ids: np.ndarray, n_flows: int,
                    capacity: np.ndarray) -> np.ndarray:
    """`max_min_rates` of flows given as (flow, link) entries: entry k says flow
    `flow_of[k]` crosses link `link_ids[k]`; every flow in range(n_flows) that has an
    entry gets its rate (others 0). `capacity`: a float array over all link ids."""
    used, link_of = used_links(link_ids, len(capacity))
    free = capacity[used]  # fancy indexing copies
    rates = np.zeros(n_flows)
    # Only the entries of flows not yet frozen are kept (dropped as their flows freeze):
    # the same counts and sums as masking all entries each round, in less work.
    while flow_of.size:
        counts = np.bincount(link_of, minlength=len(used))
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(counts > 0, np.maximum(free, 0.0) / counts, np.inf)
        level = share.min()
        bottleneck = share <= level * (1 + _TOLERANCE)
        frozen = np.zeros(n_flows, dtype=bool)
        frozen[flow_of[bottleneck[link_of]]] = True
        rates[frozen] = level
        leaving = frozen[flow_of]
        free -= level * np.bincount(link_of[leaving], minlength=len(used))
        flow_of, link_of = flow_of[~leaving], link_of[~leaving]
    return rates


def _by_sort(link_ids: np.ndarray, n_links: int) -> bool:
    """Whether to find the distinct ids among `link_ids` by a sort rather than by a table
    over all `n_links` ids: when the entries are fewer than a tenth of the links (a
    million flows' routes are not)."""
    return link_ids.size * 10 < n_links


def used_links(link_ids: np.ndarray, n_links: int) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct ids in `link_ids`, ascending; each entry's index among them): as
    `np.unique(link_ids, return_inverse=True)` (`_by_sort` says how)."""
    if _by_sort(link_ids, n_links):
        return np.unique(link_ids, return_inverse=True)
    present = np.zeros(n_links, dtype=bool)
    present[link_ids] = True
    used = np.flatnonzero(present)
    index = np.empty(n_links, dtype=np.int64)
    index[used] = np.arange(used.size)
    return used, index[link_ids]


def link_counts(link_ids: np.ndarray, n_links: int) -> tuple[list[int], list[int]]:
    """(the distinct ids in `link_ids`, ascending; how many entries each has), as lists
    (`_by_sort` says how)."""
    if _by_sort(link_ids, n_links):
        used, counts = np.unique(link_ids, return_counts=True)
        return used.tolist(), counts.tolist()
    counts = np.bincount(link_ids, minlength=n_links)
    used = np.flatnonzero(counts)
    return used.tolist(), counts[used].tolist()
