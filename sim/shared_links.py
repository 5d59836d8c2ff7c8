"""Where jobs meet on a fabric: the links that carried more than one job's flows, from the
flows a shared-fabric replay simulated (sim.shared_fabric).

Each job's flows are logged as they start (`JobFlows`, a job's view of the one
sim.flows.FlowNetwork all jobs share: FlowNetwork.flow_log), with the time each joins the
network (after its route latency) and the time it delivered its last byte. A flow
occupies every link of its route from join to finish. Per directed link:
the bytes each job's flows carried over it, the seconds it carried any flow (`busy_s`)
and the seconds it carried flows of two or more jobs at once (`contended_s`: when, under
max-min sharing, each job had only part of it).
Units: bytes, seconds, bytes/s.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import groupby

import simpy

from .flow_batch import Coflow
from .flows import FlowNetwork

FlowLog = list[tuple[float, Coflow]]  # (join time, the flows started together)


class JobFlows:
    """One job's view of the shared FlowNetwork: everything else is the network's, but the
    flows this job starts are logged in `log` (FlowNetwork.flow_log) as its own."""

    def __init__(self, network: FlowNetwork, log: FlowLog):
        self._network, self.log = network, log

    def __getattr__(self, name: str):
        return getattr(self._network, name)

    def transfer(self, src: str, dst: str, nbytes: float) -> simpy.Event:
        self._network.flow_log = self.log
        try:
            return self._network.transfer(src, dst, nbytes)
        finally:
            self._network.flow_log = None

    def start(self, coflow: Coflow, delay: float = 0.0) -> simpy.Event:
        self._network.flow_log = self.log
        try:
            return self._network.start(coflow, delay)
        finally:
            self._network.flow_log = None


@dataclass(frozen=True)
class SharedLink:
    """A directed link that carried flows of more than one job (module docstring)."""

    src: str
    dst: str
    kind: str
    bandwidth_Bps: float
    bytes_by_job: Mapping[str, float]
    busy_s: float
    contended_s: float

    def to_dict(self) -> dict:
        return {"link": f"{self.src}->{self.dst}", "kind": self.kind,
                "bandwidth_Bps": self.bandwidth_Bps, "bytes_by_job": dict(self.bytes_by_job),
                "busy_s": self.busy_s, "contended_s": self.contended_s}


def shared_links(network: FlowNetwork, logs: Mapping[str, FlowLog]) -> list[SharedLink]:
    """The links of `network` that carried flows of more than one job (`logs`: job name ->
    its flow log), busiest-shared first (contended seconds, then bytes)."""
    on_link: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    sent: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for job, log in logs.items():
        for joined, coflow in log:
            for links, nbytes, ended in coflow.routes():
                for link in links:
                    on_link[link].append((joined, ended, job))
                    sent[link][job] += nbytes
    edges = list(network.graph.edges(data=True))  # FlowNetwork's link order
    found = []
    for link, per_job in sent.items():
        if len(per_job) < 2:
            continue
        src, dst, attrs = edges[link]
        busy, contended = _occupancy(on_link[link])
        found.append(SharedLink(src, dst, attrs["kind"], attrs["bandwidth"],
                                {job: per_job[job] for job in logs if job in per_job},
                                busy, contended))
    found.sort(key=lambda s: (-s.contended_s, -sum(s.bytes_by_job.values()), s.src, s.dst))
    return found


def _occupancy(intervals: list[tuple[float, float, str]]) -> tuple[float, float]:
    """(seconds with any interval open, seconds with intervals of two or more jobs open)."""
    events = sorted([(start, 1, job) for start, _, job in intervals]
                    + [(end, -1, job) for _, end, job in intervals])
    open_by_job: dict[str, int] = defaultdict(int)
    busy = contended = 0.0
    last = None
    for time, group in groupby(events, key=lambda event: event[0]):
        if last is not None:
            jobs = sum(1 for count in open_by_job.values() if count > 0)
            busy += (time - last) if jobs else 0.0
            contended += (time - last) if jobs > 1 else 0.0
        for _, step, job in group:
            open_by_job[job] += step
        last = time
    return busy, contended
