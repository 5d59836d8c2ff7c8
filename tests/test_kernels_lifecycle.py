"""kernels: rank processes never outlive `clustersim run` / `clustersim calibrate`, they
meet on the loopback address only, and `timeout` is a no-progress watchdog that names
each stuck rank's last op (issue 15). Real processes, inspected through /proc (Linux)."""
import ipaddress
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels import KernelsError, run_schedule  # noqa: E402
from clustersim.schedules.model import ModelSpec  # noqa: E402
from clustersim.schedules.parallel import ParallelConfig  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402
from clustersim.schedules.registry import build_schedule  # noqa: E402
from test_kernels import deadlocked_schedule  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="inspects processes and sockets through /proc")

ROOT = Path(__file__).resolve().parent.parent
GPT = ModelSpec(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32,
                vocab_size=128, micro_batch_size=2, dtype="fp32")
TINY = ("--model", "gpt3-1.3b", "--num-layers", "4", "--hidden-size", "64",
        "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "128",
        "--micro-batch-size", "2", "--dtype", "fp32")
HARNESS_S = 30  # generous bound on anything that must not hang


# --- /proc ------------------------------------------------------------------------------
def _stat(pid):
    """(state, ppid, start time in clock ticks) of `pid`, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()
    return rest[0], int(rest[1]), int(rest[19])


def descendants(root):
    """{pid: start time} of every process below `root`."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))):
            children.setdefault(stat[1], []).append((int(entry), stat[2]))
    out, todo = {}, [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            out[pid] = start
            todo.append(pid)
    return out


def alive(pid, start):
    stat = _stat(pid)
    return stat is not None and stat[2] == start and stat[0] not in "ZX"


def wait_all_gone(procs, within):
    end = time.monotonic() + within
    while time.monotonic() < end:
        left = {p: s for p, s in procs.items() if alive(p, s)}
        if not left:
            return {}
        time.sleep(0.1)
    return left


def listening(pid):
    """Addresses of the TCP sockets `pid` listens on."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with_link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if with_link.startswith("socket:["):
                inodes.add(with_link[8:-1])
    except OSError:
        return []
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                raw = bytes.fromhex(fields[1].split(":")[0])
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                out.append(ipaddress.ip_address(raw))
    return out


def start_cli(tmp_path, *args):
    log = open(tmp_path / "stderr.txt", "w")
    proc = subprocess.Popen([sys.executable, "-m", "clustersim", *args], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=log)
    log.close()
    return proc


def wait_for_ranks(proc, tmp_path, count):
    """Descendants of `proc` once `count` of them listen on a socket (ranks in their
    process group, gloo's listener open)."""
    end = time.monotonic() + HARNESS_S
    while time.monotonic() < end:
        assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()
        tree = descendants(proc.pid)
        if sum(1 for pid in tree if listening(pid)) >= count:
            return tree
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"no {count} rank processes came up: {(tmp_path / 'stderr.txt').read_text()}")


# --- 1, 2: processes die with the launcher; sockets on loopback -------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killed_run_leaves_no_process_behind_and_listened_on_loopback_only(tmp_path, sig):
    proc = start_cli(tmp_path, "run", "--pp", "2", "--microbatches", "4", *TINY,
                     "--iterations", "1000000", "--warmup-iterations", "0")
    try:
        wait_for_ranks(proc, tmp_path, 2)
        tree = descendants(proc.pid)  # the ranks, the forkserver, the resource tracker
        sockets = {pid: listening(pid) for pid in [proc.pid, *tree]}
        assert sockets[proc.pid], "the launcher serves the rendezvous store"
        exposed = {pid: [str(a) for a in addrs if not a.is_loopback]
                   for pid, addrs in sockets.items()}
        assert not any(exposed.values()), exposed
        proc.send_signal(sig)
        code = proc.wait(timeout=HARNESS_S)
    finally:
        proc.kill()
    assert code == (128 + signal.SIGTERM if sig == signal.SIGTERM else -signal.SIGKILL)
    assert len(tree) >= 3
    assert not wait_all_gone(tree, within=10), "processes outlived `clustersim run`"


def test_killed_calibration_leaves_no_process_behind(tmp_path):
    proc = start_cli(tmp_path, "calibrate", *TINY, "--repeats", "1000000", "-o", "p.json")
    try:
        wait_for_ranks(proc, tmp_path, 2)
        tree = descendants(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=HARNESS_S)
    finally:
        proc.kill()
    assert len(tree) >= 2
    assert not wait_all_gone(tree, within=10), "processes outlived `clustersim calibrate`"


# --- 3, 4: timeout is a no-progress watchdog that names each stuck rank's op --------------
def plan_of(schedule, par):
    return resolve(GPT, par, schedule=schedule)


def test_run_longer_than_its_timeout_completes_while_ops_keep_finishing():
    """`timeout` bounds the time without a finished op, not the run: a healthy run twice
    as long as its timeout completes."""
    schedule = build_schedule("1f1b", 2, 4)
    plan = plan_of(schedule, ParallelConfig(micro_batch_size=2, pp=2, num_microbatches=4))
    probe = run_schedule(schedule, plan, warmup_iterations=0, iterations=5)  # warm start
    per_iteration = statistics.median(probe.meta["iteration_times"])
    timeout = 1.5
    iterations = int(2 * timeout / per_iteration) + 1
    start = time.monotonic()
    timeline = run_schedule(schedule, plan, timeout=timeout, warmup_iterations=0,
                            iterations=iterations)
    elapsed = time.monotonic() - start
    assert len(timeline.meta["iteration_times"]) == iterations
    assert elapsed > timeout, (elapsed, iterations)


def test_stall_names_each_ranks_last_op_and_next_one_line_per_rank():
    schedule = deadlocked_schedule()
    plan = plan_of(schedule, ParallelConfig(micro_batch_size=2, pp=2, num_microbatches=1))
    start = time.monotonic()
    with pytest.raises(KernelsError) as info:
        run_schedule(schedule, plan, timeout=1.5, check=False)
    assert time.monotonic() - start < HARNESS_S
    first, *ranks = str(info.value).splitlines()
    assert "no op finished on any rank for 1.5 s" in first and "rank 0 on op 0B0" in first
    assert len(ranks) == 2
    assert ranks[0].startswith("rank 0 (pipeline rank 0) made no progress for ")
    assert "last op done: 0RECV_B0, next: 0B0 (iteration 1 of 2)" in ranks[0]
    # rank 1 finished its backward and waits in the optimizer step's embedding sum
    assert ranks[1].startswith("rank 1 (pipeline rank 1) made no progress for ")
    assert "last op done: 1B0, next: 1OPT_STEP" in ranks[1]
    idle = float(ranks[0].split("made no progress for ")[1].split(" s;")[0])
    assert 1.5 <= idle < HARNESS_S


def test_cli_timeout_help_says_it_is_a_no_progress_watchdog():
    out = subprocess.run([sys.executable, "-m", "clustersim", "run", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=HARNESS_S)
    assert "no op finished on any rank" in " ".join(out.stdout.split())
