"""Several jobs on one fabric: each job's iteration replayed alone and together with the
other jobs on one topology, whose links they share, and the links where they meet.

A `Job` is a model, a ParallelConfig and its GPUs: `gpus[g]` is the topology GPU index
(topologies.graph: node `gpu{index}`) its rank g runs on (sim.cluster). Its ranks,
program keys, compute and memory are its own: one sim.engine.Replay per job, prepared as
`simulate` prepares one (sim.simulate.prepare_replay). The jobs' replays share one SimPy
environment and one flow network (sim.engine.run_replays), so flows of different jobs on
one link share it max-min fairly (sim.flows, sim.maxmin), and ECMP's least-loaded route
choice (sim.ecmp) sees every job's flows. Every job starts its one iteration at time 0;
a job that ends first leaves the fabric to the others (no job repeats its iteration).

Replayed ranks: every rank of every job by default (`Replaying('all')`). The symmetric
replay runs one pipeline replica and assumes the others alike, which another job's
traffic, on some of a job's links and not others, breaks in general. A job may still ask
for 'symmetric' or 'auto'; its other replicas' collectives then stand in as shadow flows
(sim.collective_model), assumed to meet the other jobs as replica 0 does, and a note says so.
Intra-host TP/CP/EP collectives take their uncontended time (sim.collective_model's
approximation), so jobs sharing a host meet only through their flows there (a note says
so). zb-auto's order is built once per job, from a symmetric replay of the job alone.

Reported per job: its iteration time alone (the same job, GPUs and replay, no other job
on the fabric: exactly `simulate(..., gpus=...)`) and together, and the slowdown
(together / alone); per link where the jobs meet (sim.shared_links): the bytes of each
job, the seconds it was busy and contended. Units: seconds, bytes, bytes/s.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx
import simpy

from clustersim.schedules.errors import ConfigError, DeadlockError
from clustersim.schedules.limits import MAX_OPS
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.parallel import ParallelConfig
from clustersim.schedules.registry import schedule_entry
from clustersim.schedules.schedule import Schedule
from clustersim.schedules.timeline import Timeline
from clustersim.schedules.validate import dry_run
from clustersim.topologies import gpu_nodes

from .cost_model import CostModel, RooflineCostModel
from .engine import run_replays
from .flows import FlowNetwork
from .offload import with_host_links
from .shared_links import FlowLog, JobFlows, SharedLink, shared_links
from .simulate import PreparedReplay, checked_plan, prepare_replay, simulate_schedule
from .world import Replaying

FULL_REPLAY_NOTE = ("every rank of every job replayed op by op (--replay all): jobs that "
                    "share some links and not others break the symmetric replay's "
                    "assumption that a job's replicas run alike")
ONE_ITERATION_NOTE = ("all jobs start one iteration at 0 s; a job that ends first leaves the "
                      "fabric to the others, so a longer job's tail runs alone")


@dataclass(frozen=True)
class Job:
    """One job on the fabric (module docstring): `gpus[g]`, the topology GPU index of rank
    g; `costs`, `replaying` and `max_ops` as `simulate` takes them."""

    name: str
    model: ModelSpec
    parallel: ParallelConfig
    gpus: tuple[int, ...]
    costs: CostModel = RooflineCostModel()
    replaying: Replaying = Replaying("all")
    max_ops: int = MAX_OPS


@dataclass(frozen=True)
class JobResult:
    """A job's Timelines alone on the fabric and together with the other jobs."""

    job: Job
    alone: Timeline
    together: Timeline

    @property
    def slowdown(self) -> float:
        """Together / alone iteration time (1: the other jobs cost it nothing)."""
        return self.together.iteration_time / self.alone.iteration_time

    def to_dict(self) -> dict:
        return {"name": self.job.name, "gpus": list(self.job.gpus),
                "world_size": self.job.parallel.world_size,
                "replayed": self.together.meta.get("replayed"),
                "alone_iteration_s": self.alone.iteration_time,
                "together_iteration_s": self.together.iteration_time,
                "slowdown": self.slowdown,
                "warnings": list(self.together.meta.get("warnings", ()))}


@dataclass(frozen=True)
class SharedFabricRun:
    """The jobs' results, the links where they met, and what the run assumed."""

    topology: str
    jobs: tuple[JobResult, ...]
    links: tuple[SharedLink, ...]
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {"topology": self.topology, "jobs": [j.to_dict() for j in self.jobs],
                "shared_links": [link.to_dict() for link in self.links],
                "notes": list(self.notes)}


def check_jobs(jobs: Sequence[Job], topology: nx.DiGraph) -> None:
    """ConfigError naming the job and the field: names, and GPUs that are the topology's,
    one per rank, each used by one job."""
    if not jobs:
        raise ConfigError("jobs: at least one job is needed")
    count, name = len(gpu_nodes(topology)), topology.graph.get("name", "custom")
    needed = sum(job.parallel.world_size for job in jobs)
    if needed > count:
        raise ConfigError(f"jobs: they need {needed} GPUs together (one per rank), topology "
                          f"{name!r} has {count}")
    owner: dict[int, str] = {}
    for job in jobs:
        if not isinstance(job.name, str) or not job.name:
            raise ConfigError(f"job {job.name!r}: name must be a non-empty string")
        if any(job.name == other for other in owner.values()):
            raise ConfigError(f"job {job.name!r}: name: used by two jobs; rule: names are "
                              f"unique")
        where = f"job {job.name!r}: gpus"
        for gpu in job.gpus:
            if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < count:
                raise ConfigError(f"{where}: {gpu!r} is not a GPU index of topology {name!r} "
                                  f"(0..{count - 1})")
        if len(set(job.gpus)) != len(job.gpus):
            twice = next(g for g in job.gpus if job.gpus.count(g) > 1)
            raise ConfigError(f"{where}: GPU {twice} is listed twice; rule: one GPU per rank")
        if len(job.gpus) != job.parallel.world_size:
            raise ConfigError(f"{where}: {len(job.gpus)} GPUs for {job.parallel.world_size} "
                              f"ranks (tp*cp*dp*pp); rule: one GPU per rank")
        for gpu in job.gpus:
            if gpu in owner:
                raise ConfigError(f"{where}: GPU {gpu} is also job {owner[gpu]!r}'s; rule: "
                                  f"jobs' GPUs are disjoint")
        owner.update(dict.fromkeys(job.gpus, job.name))


def simulate_jobs(jobs: Sequence[Job], topology: nx.DiGraph) -> SharedFabricRun:
    """Every job alone, then all together on `topology` (module docstring)."""
    check_jobs(jobs, topology)
    nodes = gpu_nodes(topology)
    placed = {job.name: [nodes[g] for g in job.gpus] for job in jobs}
    schedules = {job.name: _schedule(job, topology, placed[job.name]) for job in jobs}

    def prepare(job: Job, fabric: nx.DiGraph) -> PreparedReplay:
        plan = checked_plan(job.model, job.parallel, fabric, schedules[job.name],
                            job.max_ops, placed[job.name])
        return prepare_replay(plan, fabric, job.costs, schedules[job.name], job.replaying)

    prepared = [prepare(job, topology) for job in jobs]
    fabric = topology
    if any(p.topology is not topology for p in prepared):
        fabric = with_host_links(topology)[0]  # a job copies to host CPUs: all see them
        prepared = [prepare(job, fabric) for job in jobs]
    alone = [_run([p], [job], fabric)[0][0] for p, job in zip(prepared, jobs)]
    timelines, network, logs = _run(prepared, jobs, fabric)
    notes = [FULL_REPLAY_NOTE] if all(p.world.full for p in prepared) else []
    notes += [f"job {job.name!r}: {t.meta['replayed']}; its other replicas' collectives are "
              f"assumed to meet the other jobs' traffic as replica 0's do (approximate where "
              f"jobs share links: replay every rank, replay: all)"
              for job, p, t in zip(jobs, prepared, timelines) if not p.world.full]
    notes += _shared_hosts(jobs, topology)
    notes.append(ONE_ITERATION_NOTE)
    return SharedFabricRun(topology.graph.get("name", "custom"),
                           tuple(JobResult(j, a, t) for j, a, t in zip(jobs, alone, timelines)),
                           tuple(shared_links(network, logs)), tuple(notes))


def _shared_hosts(jobs: Sequence[Job], topology: nx.DiGraph) -> list[str]:
    """A note per host holding GPUs of several jobs: their intra-host TP/CP/EP collectives
    take their uncontended time (sim.collective_model's approximation), so only the
    jobs' flows (P2P, data-parallel, cross-host groups) meet there."""
    nodes = gpu_nodes(topology)
    owners: dict[int, list[str]] = {}
    for job in jobs:
        for host in dict.fromkeys(topology.nodes[nodes[g]]["host"] for g in job.gpus):
            owners.setdefault(host, []).append(job.name)
    shared = {host: names for host, names in owners.items() if len(names) > 1}
    if not shared:
        return []
    host, names = next(iter(shared.items()))
    return [f"{len(shared)} host(s) hold GPUs of several jobs (e.g. host {host}: jobs "
            f"{', '.join(names)}): there the jobs' intra-host TP/CP/EP collectives take "
            f"their uncontended time and do not meet (sim.collective_model); their P2P and "
            f"data-parallel flows do"]


def _schedule(job: Job, topology: nx.DiGraph, gpus: list[str]) -> Schedule | None:
    """The registered schedule (None: the plan builds it), or a schedule built from the
    job's own costs (zb-auto: the order for the job alone on its GPUs, sim.auto_schedule,
    which reads the stage times off a symmetric replay)."""
    if not schedule_entry(job.parallel.schedule).built_from_costs:
        return None
    try:
        return simulate_schedule(job.model, job.parallel, topology, None, job.costs,
                                 job.max_ops, Replaying("symmetric"), gpus)[0]
    except ConfigError as err:
        raise ConfigError(f"job {job.name!r}: schedule {job.parallel.schedule} builds its "
                          f"order from a symmetric replay of the job alone: {err}") from None


def _run(prepared: Sequence[PreparedReplay], jobs: Sequence[Job], fabric: nx.DiGraph
         ) -> tuple[list[Timeline], FlowNetwork, Mapping[str, FlowLog]]:
    """The prepared jobs replayed together in one environment on one flow network: their
    described Timelines, the network and each job's flow log."""
    env = simpy.Environment()
    network = jobs[0].costs.network(env, fabric)  # every job's is checked alone first
    if not isinstance(network, FlowNetwork):
        raise ConfigError(f"job {jobs[0].name!r}: cost model {jobs[0].costs.describe()} has "
                          f"no flow network; rule: jobs meet on the topology's links, so "
                          f"every job needs the roofline cost model")
    logs: dict[str, FlowLog] = {job.name: [] for job in jobs}
    replays = [p.replay(env, JobFlows(network, logs[job.name]))
               for p, job in zip(prepared, jobs)]
    try:
        timelines = run_replays(replays)
    except DeadlockError:  # a job's schedule cannot run: its rank x step grid, named
        for job, p, replay in zip(jobs, prepared, replays):
            if any(pc < len(program) for pc, program in zip(replay.pc, replay.programs)):
                try:
                    dry_run(p.lowered)
                except DeadlockError as grid:
                    raise DeadlockError(f"job {job.name!r}: {grid.args[0]}", grid.stuck,
                                        grid.report) from None
        raise
    return [p.describe(t) for p, t in zip(prepared, timelines)], network, logs
