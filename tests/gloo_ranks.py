"""Run a kernels test's work on `world` real gloo rank processes and collect what each
returns (shared by tests/test_kernels_summa.py and tests/test_kernels_linear_nd.py).

`work(rank)` runs in rank process `rank` after it joined the gloo group and returns
{case: {"tensors": {name: tensor}, ...} or any picklable value}; `run_ranks` returns
{rank: that dict} with the tensors loaded back, or fails the test naming the rank."""
import io
import multiprocessing as mp
import os
import queue
import traceback

import pytest
import torch

from clustersim.kernels.lifecycle import die_with_parent, rank_session
from clustersim.kernels.rendezvous import join_group


def _rank_main(work, world: int, wait_s: float, rank: int, port: int, results, link) -> None:
    die_with_parent(link)
    try:
        torch.set_num_threads(1)
        join_group("gloo", rank, world, port, wait_s)
        out = work(rank)
        for case in out.values():
            if isinstance(case, dict) and "tensors" in case:
                buffer = io.BytesIO()
                torch.save(case["tensors"], buffer)
                case["tensors"] = buffer.getvalue()
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
        results.put(("ok", rank, out))
    except BaseException:  # noqa: BLE001 (reported to the test)
        results.put(("error", rank, traceback.format_exc()))
        results.close()
        results.join_thread()
        os._exit(1)


def run_ranks(work, world: int, wait_s: float) -> dict[int, dict]:
    """{rank: work(rank)} from `world` gloo processes (module docstring)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["clustersim.kernels.worker"])
    out: dict[int, dict] = {}
    with rank_session(ctx, wait_s) as session:
        session.start([ctx.Process(target=_rank_main, daemon=True,
                                   args=(work, world, wait_s, r, session.port,
                                         session.results, session.link))
                       for r in range(world)])
        while len(out) < world:
            try:
                message = session.results.get(timeout=wait_s)
            except queue.Empty:
                pytest.fail(f"no rank reported for {wait_s} s")
            if message[0] == "error":
                pytest.fail(f"rank {message[1]} failed:\n{message[2]}")
            out[message[1]] = message[2]
    for payload in out.values():
        for case in payload.values():
            if isinstance(case, dict) and "tensors" in case:
                case["tensors"] = torch.load(io.BytesIO(case["tensors"]))
    return out
