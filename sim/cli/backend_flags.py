"""--backend and --jobs: where independent simulations run (sim.backends), for `sweep`
and `plan`."""
from __future__ import annotations

import argparse

from ..backends import BACKENDS


def add_backend_flags(group: argparse._ActionsContainer) -> None:
    group.add_argument("--backend", choices=BACKENDS, default="local",
                       help="local: this machine's cores (joblib; default); ray: the "
                            "cluster at RAY_ADDRESS, else a new local one; dask: the "
                            "scheduler at DASK_SCHEDULER_ADDRESS, else a new LocalCluster "
                            "(ray and dask: pip install 'clustersim[sweep]')")
    group.add_argument("--jobs", type=int, default=-1, metavar="N",
                       help="simulations at once (default -1: every core, or every CPU of "
                            "the cluster; 1: one at a time in this process)")
