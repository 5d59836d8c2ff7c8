"""Several jobs on one fabric (sim.shared_fabric, `clustersim jobs`): two identical jobs
through one oversubscribed uplink each get half of it (max-min fairness: the alpha-beta
closed form with half the bandwidth); jobs on disjoint links keep their alone times; one
job through the jobs path is `simulate`; every op of every job runs once and no link
carries more than its capacity; bad jobs files are one line naming the field."""
import json
from collections import Counter

import networkx as nx
import pytest

import clustersim
from clustersim.schedules.lowering import lower
from clustersim.schedules.names import PP
from clustersim.schedules.ops import OpKind
from clustersim.sim.cli import main
from clustersim.sim.cluster import cluster_facts
from clustersim.sim.flows import FlowNetwork
from clustersim.sim.shared_fabric import Job, simulate_jobs
from clustersim.sim.simulate import checked_plan
from clustersim.sim.world import Replaying
from clustersim.topologies import validate_topology
from clustersim.topologies.nodes import add_link

UPLINK = 10e9  # bytes/s per direction of the one leaf0-leaf1 link
PORT = 40e9  # bytes/s per direction of each GPU's link to its leaf: 4x the uplink
HOP = 1e-6  # seconds per edge
ROUTE = 3 * HOP  # gpu -> leaf0 -> leaf1 -> gpu


def two_leaves() -> nx.DiGraph:
    """GPUs 0, 1 under leaf0, GPUs 2, 3 under leaf1 (one host each), the leaves joined by
    one link of a quarter of a GPU port: every leaf0-leaf1 transfer crosses it. The links
    are of a kind without an efficiency (sim.link_capacity), so they run at these rates,
    and with no NICs NCCL's model does not apply: the collectives are the alpha-beta ones."""
    g = nx.DiGraph(name="two-leaves", num_nodes=4, gpus_per_node=1)
    for leaf in ("leaf0", "leaf1"):
        g.add_node(leaf, type="switch")
    for i in range(4):
        g.add_node(f"gpu{i}", type="gpu", device="h100-sxm", index=i, host=i)
        add_link(g, f"gpu{i}", f"leaf{i // 2}", PORT, HOP, "fabric")
    add_link(g, "leaf0", "leaf1", UPLINK, HOP, "fabric")
    validate_topology(g)
    return g


MODEL = clustersim.get_model("llama3-8b", num_layers=4)


def two_jobs(**layout) -> tuple:
    """Jobs a (GPUs 0, 2) and b (GPUs 1, 3), identical, each across the uplink."""
    parallel = clustersim.ParallelConfig.from_kwargs(**layout)
    return simulate_jobs([Job("a", MODEL, parallel, (0, 2)),
                          Job("b", MODEL, parallel, (1, 3))], two_leaves())


def test_two_identical_pipelines_through_one_uplink_each_get_half_of_it():
    """pp 2: every SEND of n bytes crosses the uplink; alone it takes the route latency
    plus n / C, together (the other job's send starts at the same instant, by symmetry)
    max-min gives each C / 2: the route latency plus 2 n / C."""
    run = two_jobs(pp=2, num_microbatches=4)
    for result in run.jobs:
        for timeline, rate in ((result.alone, UPLINK), (result.together, UPLINK / 2)):
            sends = [s for s in timeline.spans if s.op.kind in (OpKind.SEND_F, OpKind.SEND_B)]
            assert len(sends) == 2 * 4
            for s in sends:
                assert s.end - s.start == pytest.approx(ROUTE + s.op.nbytes / rate, rel=1e-9)
        assert result.slowdown > 1
    assert {(s.src, s.dst) for s in run.links} == {("leaf0", "leaf1"), ("leaf1", "leaf0")}
    for link in run.links:  # both jobs always on it together, each its own bytes
        sent = {r.job.name: sum(s.op.nbytes for s in r.together.spans
                                if s.op.kind in (OpKind.SEND_F, OpKind.SEND_B)
                                and (s.rank == 0) == (link.src == "leaf0"))
                for r in run.jobs}
        assert dict(link.bytes_by_job) == pytest.approx(sent)
        assert link.contended_s == pytest.approx(link.busy_s, rel=1e-9)
        assert link.busy_s == pytest.approx(sum(sent.values()) / UPLINK, rel=1e-9)


def test_two_identical_gradient_all_reduces_through_one_uplink_each_get_half_of_it():
    """dp 2: the ring all-reduce of S bytes between two GPUs (count k back to back) is
    2k steps of S / 2k bytes each way, each paying the route latency: 2k alpha + S / C
    alone, 2k alpha + 2 S / C with the other job's identical ring on the same link."""
    run = two_jobs(dp=2, pp=1, num_microbatches=2)
    for result in run.jobs:
        for timeline, rate in ((result.alone, UPLINK), (result.together, UPLINK / 2)):
            reductions = [s for s in timeline.spans if s.op.kind is OpKind.ALL_REDUCE]
            assert reductions and {s.info["algorithm"] for s in reductions} == {"ring"}
            for s in reductions:
                expected = 2 * s.op.count * ROUTE + s.op.nbytes / rate
                assert s.end - s.start == pytest.approx(expected, rel=1e-9)


def test_jobs_on_disjoint_links_keep_their_alone_times():
    """Two different jobs (models, layouts) on the two halves of one NVSwitch box: every
    GPU has its own switch port, so no link carries both and nothing changes. (Equal to
    1e-9, not bit for bit: the flow network completes flows due within 1e-12 s of each
    other in one event, whoever's they are.)"""
    topology = clustersim.load_topology("dgx-h100")
    first = clustersim.ParallelConfig.from_kwargs(pp=2, dp=2, num_microbatches=4)
    other = clustersim.get_model("gpt3-1.3b", num_layers=4)
    second = clustersim.ParallelConfig.from_kwargs(tp=2, dp=2, pp=1, num_microbatches=2)
    run = simulate_jobs([Job("llama", MODEL, first, (0, 1, 2, 3)),
                         Job("gpt", other, second, (4, 5, 6, 7))], topology)
    assert run.links == ()
    assert any("host(s) hold GPUs of several jobs (e.g. host 0: jobs llama, gpt)" in note
               for note in run.notes)
    for result in run.jobs:
        assert result.together.iteration_time == pytest.approx(result.alone.iteration_time,
                                                               rel=1e-9)
        assert len(result.together.spans) == len(result.alone.spans)


@pytest.mark.parametrize("gpus", [(0, 1, 2, 3), (4, 5, 6, 7), (6, 2, 5, 1)])
def test_one_job_through_the_jobs_path_is_simulate(gpus):
    """The jobs path (prepared, replayed with run_replays on a logged network view) gives
    `clustersim.simulate`'s spans exactly, on the same GPUs, replaying every rank."""
    topology = clustersim.load_topology("dgx-h100")
    parallel = clustersim.ParallelConfig.from_kwargs(tp=2, pp=2, num_microbatches=4)
    run = simulate_jobs([Job("only", MODEL, parallel, gpus)], topology)
    nodes = [f"gpu{g}" for g in gpus]
    reference = clustersim.simulate(MODEL, parallel, topology, replaying=Replaying("all"),
                                    gpus=None if gpus == (0, 1, 2, 3) else nodes)

    def spans(timeline):
        return [(s.rank, s.lane, str(s.op), s.start, s.end) for s in timeline.spans]
    for timeline in (run.jobs[0].alone, run.jobs[0].together):
        assert spans(timeline) == spans(reference)
        assert timeline.meta["plan"]["devices"] == reference.meta["plan"]["devices"]
        assert timeline.meta["plan"]["devices"][0] == nodes[0]
    assert run.jobs[0].slowdown == 1.0 and run.links == ()


def test_every_op_of_every_job_runs_once_and_no_link_exceeds_its_capacity(monkeypatch):
    """Each rank's program (its pipeline coordinate's lowered program) appears once per
    op in the together Timeline; at every rate change the flows on each link sum to at
    most its bandwidth (max-min never overbooks); a shared link's bytes fit its busy
    seconds at its bandwidth."""
    rerate = FlowNetwork._rerate
    overbooked = []

    def checked(self, seeds):
        rerate(self, seeds)
        overbooked.extend((link, load) for link, load in self.link_load().items()
                          if load > self.capacity[link] * (1 + 1e-9))
    monkeypatch.setattr(FlowNetwork, "_rerate", checked)
    topology = two_leaves()
    parallel = clustersim.ParallelConfig.from_kwargs(pp=2, num_microbatches=4)
    wide = clustersim.ParallelConfig.from_kwargs(dp=2, pp=1, num_microbatches=2)
    jobs = [Job("pipe", MODEL, parallel, (0, 2)), Job("ddp", MODEL, wide, (3, 1))]
    run = simulate_jobs(jobs, topology)
    assert not overbooked
    nodes = [f"gpu{i}" for i in range(4)]
    for job, result in zip(jobs, run.jobs):
        plan = checked_plan(job.model, job.parallel, topology, None, job.max_ops,
                            [nodes[g] for g in job.gpus])
        assert plan.cluster == cluster_facts(topology, [nodes[g] for g in job.gpus])
        lowered = lower(plan.build_schedule(), plan)
        expected = Counter((rank, op) for rank in range(job.parallel.world_size)
                           for op in lowered.programs[job.parallel.coords(rank)[PP]])
        assert Counter((s.rank, s.op) for s in result.together.spans) == expected
    assert run.links
    for link in run.links:
        assert sum(link.bytes_by_job.values()) <= link.bandwidth_Bps * link.busy_s * (1 + 1e-9)
        assert 0 <= link.contended_s <= link.busy_s


# --- the command line --------------------------------------------------------------------

def _topology_json(path) -> None:
    """two_leaves() in the explicit topology file form (topologies.presets)."""
    g = two_leaves()
    path.write_text(json.dumps({
        "name": g.graph["name"],
        "nodes": [{"id": n, **a} for n, a in g.nodes(data=True)],
        "edges": [{"src": u, "dst": v, **a} for u, v, a in g.edges(data=True)]}))


def test_the_command_prints_both_times_and_the_links_where_jobs_meet(tmp_path, capsys):
    _topology_json(tmp_path / "two-leaves.json")
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("topology: two-leaves.json\n"  # beside the jobs file
                    "jobs:\n"
                    "  - {name: a, gpus: '0,2', model: llama3-8b, num-layers: 4, pp: 2,\n"
                    "     microbatches: 4}\n"
                    "  - {name: b, gpus: [1, 3], model: llama3-8b, num_layers: 4,\n"
                    "     pipeline-model-parallel-size: 2, microbatches: 4}\n")
    out = tmp_path / "out.json"
    assert main(["jobs", str(jobs), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "leaf0->leaf1" in printed and "10 GB/s" in printed and "slowdown" in printed
    assert "every rank of every job replayed" in printed
    data = json.loads(out.read_text())
    expected = two_jobs(pp=2, num_microbatches=4).to_dict()
    assert [j["together_iteration_s"] for j in data["jobs"]] == pytest.approx(
        [j["together_iteration_s"] for j in expected["jobs"]], rel=1e-12)
    assert [s["link"] for s in data["shared_links"]] == [s["link"] for s in
                                                         expected["shared_links"]]


def test_a_job_may_ask_for_the_symmetric_replay_and_is_told_what_it_assumes(tmp_path,
                                                                            capsys):
    jobs = tmp_path / "jobs.toml"
    job = 'model = "llama3-8b"\nnum-layers = 4\ntp = 2\ndp = 2\npp = 1\nmicrobatches = 2\n'
    jobs.write_text(f'topology = "dgx-h100"\n[[jobs]]\nname = "a"\ngpus = "0-3"\n{job}'
                    f'replay = "symmetric"\n[[jobs]]\nname = "b"\ngpus = [4, 5, 6, 7]\n{job}')
    assert main(["jobs", str(jobs)]) == 0
    out = capsys.readouterr().out
    assert "note: job 'a': 1 of 4 GPUs replayed" in out
    assert "assumed to meet the other jobs' traffic as replica 0's do" in out
    assert "every rank of every job replayed" not in out and "note: job 'b'" not in out


@pytest.mark.parametrize("text,words", [
    ("topology: dgx-h100\njobs:\n  - {name: a, gpus: 0-3, pp: 2, tp: 2}\n"
     "  - {name: b, gpus: 2-5, pp: 2, tp: 2}\n",
     ["job 'b'", "gpus", "GPU 2 is also job 'a'", "disjoint"]),
    ("topology: dgx-h100\njobs:\n  - {name: a, gpus: 0-5, pp: 2, dp: 3}\n"
     "  - {name: b, gpus: 6-9, pp: 2, tp: 2}\n",
     ["need 10 GPUs", "has 8"]),
    ("topology: dgx-h100\njobs:\n  - {name: a, gpus: 0-3, pp: 2, tp: 2, colour: red}\n",
     ["job 'a'", "unknown key 'colour'"]),
    ("topology: dgx-h100\nspeed: 3\njobs:\n  - {name: a, gpus: 0-3, pp: 2, tp: 2}\n",
     ["unknown key 'speed'", "top level"]),
    ("topology: dgx-h100\njobs:\n  - {name: a, gpus: 0-2, pp: 2, tp: 2}\n",
     ["job 'a'", "gpus", "3 GPUs for 4 ranks"]),
    ("topology: dgx-h100\njobs:\n  - {name: a, gpus: 3-0, pp: 2, tp: 2}\n",
     ["job 'a'", "key 'gpus'", "'3-0'"]),
    ("topology: dgx-h100\njobs:\n  - {name: a, pp: 2, tp: 2}\n",
     ["job 'a'", "key 'gpus' is missing"]),
    ("topology: dgx-h100\njobs:\n  - {name: a, gpus: 0-3, pp: 2, tp: 2, metrics-json: m}\n",
     ["job 'a'", "key 'metrics-json'", "writes no per-job files"]),
    ("topology: dgx-h100\njobs:\n  - {name: a, gpus: 0-3, pp: 2, tp: 2, topology: x}\n",
     ["job 'a'", "key 'topology'", "top level"]),
    ("topology: dgx-h100\njobs:\n  - {name: a, gpus: 0-3, pp: 2, tp: 2, uniform-costs: '1,2'}\n",
     ["job 'a'", "key 'uniform-costs'", "roofline"]),
    ("topology: dgx-h100\njobs:\n  - {name: a, gpus: 0-3, pp: two}\n",
     ["job 'a'", "key 'pp'"]),
    ("topology: dgx-h100\njobs:\n  - {name: a, gpus: 0-3, pp: 3, tp: 2}\n",
     ["job 'a'", "gpus", "4 GPUs for 6 ranks"]),
    ("topology: dgx-h100\njobs: []\n", ["key 'jobs'", "non-empty list"]),
    ("topology: dgx-h100\njobs:\n  - {name: a, gpus: 0-1, pp: 2}\n"
     "  - {name: a, gpus: 2-3, pp: 2}\n", ["job 'a'", "name", "unique"]),
], ids=["overlap", "too-few-gpus", "unknown-key", "unknown-top-key", "gpu-count",
        "bad-range", "no-gpus", "output-in-a-job", "fabric-key-in-a-job", "no-flow-network",
        "bad-value", "layout-needs-more", "no-jobs", "duplicate-name"])
def test_a_bad_jobs_file_is_one_line_naming_the_field(tmp_path, capsys, text, words):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(text)
    assert main(["jobs", str(jobs)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("clustersim: error: ")
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)


def test_a_placed_jobs_rows_name_its_gpus_and_the_ranks_they_stand_for():
    """simulate(..., gpus=): a row's GPU is the placed one, and the other replicas it
    stands for are named by rank (their GPUs are not gpu{rank})."""
    import clustersim
    from clustersim.sim.rank_gpus import rank_gpus
    model = clustersim.get_model("llama3-8b", num_layers=4)
    parallel = clustersim.ParallelConfig.from_kwargs(pp=2, dp=2, num_microbatches=4)
    timeline = clustersim.simulate(model, parallel, clustersim.load_topology("dgx-h100"),
                                   gpus=["gpu4", "gpu5", "gpu6", "gpu7"])
    rows = rank_gpus(timeline.meta["plan"])
    assert [row.gpu for row in rows.values()] == ["gpu4", "gpu6"]
    assert rows[1].describe() == ("gpu6 (global rank 2); stands for global ranks 2–3: 2 "
                                  "ranks, one program (symmetric replay)")
