"""Where independent simulations run: on local cores or on a Ray or Dask cluster. Used by
`clustersim sweep` (sim.cli.sweep_command) and the planner's replays (sim.planner.search).

- `local` (default): joblib's process pool (loky) on this machine, `jobs` workers (-1: all
  cores, 1: in this process, in order).
- `ray`: the Ray session this process already runs; else the cluster at RAY_ADDRESS
  (`ray.init(address=...)`); else a new local cluster of `jobs` CPUs (all, for -1).
- `dask`: the dask.distributed scheduler at DASK_SCHEDULER_ADDRESS; else a new
  LocalCluster of `jobs` single-threaded worker processes (all cores, for -1).
What was connected or started is said once (sim.progress.note); only what this module
started is shut down. The workers of a running cluster must have clustersim installed.

Ray and Dask are imported only when chosen (the CLI starts without them), from the
`sweep` extra: a missing one is one ConfigError naming `pip install 'clustersim[sweep]'`.
Both run through their futures APIs (ray.wait, distributed.as_completed) so results
stream as they finish: Ray's joblib backend (ray.util.joblib) is a multiprocessing-pool
backend that joblib cannot stream from (`return_as='generator_unordered'`), and it
rebinds joblib's PicklingPool to Ray's pool for the whole process.

`Backend.imap_unordered(fn, calls)` yields `(index, fn(*calls[index]))` as each call
finishes, at most `workers` (local) or 2 x `workers` (clusters) in flight; `map` returns
them in call order. An exception raised by `fn` propagates (callers that must survive a
broken call catch it inside `fn`).
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from clustersim.schedules.errors import ConfigError

from . import progress

BACKENDS = ("local", "ray", "dask")
EXTRA = "pip install 'clustersim[sweep]'"
ADDRESS_VARIABLES = {"ray": "RAY_ADDRESS", "dask": "DASK_SCHEDULER_ADDRESS"}

Call = Sequence[Any]


def _call(fn: Callable[..., Any], index: int, arguments: Call) -> tuple[int, Any]:
    """What a worker runs: the call, tagged with its index."""
    return index, fn(*arguments)


class Backend:
    """A pool of `workers` that runs calls; `where` says what it is, in words."""

    name = "local"

    def __init__(self, workers: int, where: str) -> None:
        self.workers, self.where = workers, where

    def imap_unordered(self, fn: Callable[..., Any], calls: Sequence[Call]
                       ) -> Iterator[tuple[int, Any]]:
        raise NotImplementedError

    def map(self, fn: Callable[..., Any], calls: Sequence[Call]) -> list[Any]:
        """fn(*call) of every call, in call order."""
        results: list[Any] = [None] * len(calls)
        for index, result in self.imap_unordered(fn, calls):
            results[index] = result
        return results

    def close(self) -> None:
        """Release what this backend started (nothing by default)."""


class LocalBackend(Backend):
    """joblib's loky process pool, kept open between calls (its workers are reused)."""

    def __init__(self, jobs: int) -> None:
        from joblib import Parallel, effective_n_jobs  # here: the CLI starts faster
        workers = effective_n_jobs(jobs)
        super().__init__(workers, f"local: {workers} worker process(es) (joblib)"
                         if workers > 1 else "local: in this process")
        self.pool = Parallel(n_jobs=workers, return_as="generator_unordered")
        self.pool.__enter__()

    def imap_unordered(self, fn: Callable[..., Any], calls: Sequence[Call]
                       ) -> Iterator[tuple[int, Any]]:
        from joblib import delayed
        yield from self.pool(delayed(_call)(fn, i, call) for i, call in enumerate(calls))

    def close(self) -> None:
        self.pool.__exit__(None, None, None)


class RayBackend(Backend):
    """Ray tasks of one CPU each (module docstring: which session or cluster)."""

    name = "ray"

    def __init__(self, jobs: int) -> None:
        try:
            import ray
        except ImportError:
            raise _missing("ray", "ray") from None
        self.ray, self.started = ray, False
        address = os.environ.get(ADDRESS_VARIABLES["ray"])
        if ray.is_initialized():
            where = "ray: this process's Ray session"
        elif address:
            ray.init(address=address, logging_level="WARNING", log_to_driver=False)
            self.started = True  # connected: shutdown disconnects, the cluster stays
            where = f"ray: the cluster at RAY_ADDRESS={address}"
        else:  # address="local": never join a cluster another session left registered
            ray.init(address="local", num_cpus=jobs if jobs > 0 else None,
                     include_dashboard=False, logging_level="WARNING", log_to_driver=False)
            self.started = True
            where = "ray: started a local cluster (set RAY_ADDRESS to use a running one)"
        cpus = int(ray.cluster_resources().get("CPU", 1))
        workers = min(jobs, cpus) if jobs > 0 else cpus
        super().__init__(max(workers, 1), f"{where}, {cpus} CPUs")
        self.task = ray.remote(num_cpus=1)(_call)

    def imap_unordered(self, fn: Callable[..., Any], calls: Sequence[Call]
                       ) -> Iterator[tuple[int, Any]]:
        ray = self.ray
        fn_ref = ray.put(fn)  # shipped once, not with every call
        waiting = list(enumerate(calls))[::-1]
        pending: list[Any] = []
        while waiting or pending:
            while waiting and len(pending) < 2 * self.workers:
                index, call = waiting.pop()
                pending.append(self.task.remote(fn_ref, index, call))
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


class DaskBackend(Backend):
    """dask.distributed futures (module docstring: which scheduler)."""

    name = "dask"

    def __init__(self, jobs: int) -> None:
        try:
            import distributed
        except ImportError:
            raise _missing("dask", "distributed") from None
        address = os.environ.get(ADDRESS_VARIABLES["dask"])
        self.cluster = None
        # distributed logs its cluster's life at INFO, which reaches the CLI's handler:
        # kept to warnings unless clustersim itself logs INFO (-v); restored on close
        self.logger = logging.getLogger("distributed")
        self.level = self.logger.level
        if not logging.getLogger("clustersim").isEnabledFor(logging.INFO):
            self.logger.setLevel(logging.WARNING)
        if address:
            self.client = distributed.Client(address)
            where = f"dask: the scheduler at DASK_SCHEDULER_ADDRESS={address}"
        else:
            workers = jobs if jobs > 0 else (os.cpu_count() or 1)
            # single-threaded worker processes: a replay is pure Python (the GIL)
            self.cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1,
                                                    processes=True, dashboard_address=None)
            self.client = distributed.Client(self.cluster)
            where = ("dask: started a LocalCluster (set DASK_SCHEDULER_ADDRESS to use a "
                     "running one)")
        threads = sum(self.client.nthreads().values()) or 1
        super().__init__(min(jobs, threads) if jobs > 0 else threads,
                         f"{where}, {threads} worker threads")
        self.as_completed = distributed.as_completed

    def imap_unordered(self, fn: Callable[..., Any], calls: Sequence[Call]
                       ) -> Iterator[tuple[int, Any]]:
        client = self.client
        waiting = list(enumerate(calls))[::-1]

        def submit() -> Any:
            index, call = waiting.pop()
            return client.submit(_call, fn, index, call, pure=False)

        first = [submit() for _ in range(min(len(waiting), 2 * self.workers))]
        finished = self.as_completed(first)
        for future in finished:
            yield future.result()
            if waiting:
                finished.add(submit())

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()
        self.logger.setLevel(self.level)


def _missing(backend: str, package: str) -> ConfigError:
    return ConfigError(f"--backend {backend} needs the {package} package: {EXTRA}")


def check_backend(name: str, jobs: int) -> None:
    """ConfigError unless `name` is a backend and `jobs` a worker count (-1 or >= 1)."""
    if name not in BACKENDS:
        raise ConfigError(f"--backend {name!r}: choose one of {', '.join(BACKENDS)}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not (jobs == -1 or jobs >= 1):
        raise ConfigError(f"--jobs must be -1 (all cores) or an integer >= 1, got {jobs!r}")


@contextlib.contextmanager
def open_backend(name: str = "local", jobs: int = -1) -> Iterator[Backend]:
    """The backend `name` with `jobs` workers (module docstring), closed on exit."""
    check_backend(name, jobs)
    backend: Backend = {"local": LocalBackend, "ray": RayBackend,
                        "dask": DaskBackend}[name](jobs)
    if name != "local":
        progress.note(backend.where)
    try:
        yield backend
    finally:
        backend.close()
