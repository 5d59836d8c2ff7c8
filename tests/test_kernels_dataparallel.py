"""kernels: torch.nn.DataParallel's pattern run for real with torch.distributed (gloo,
CPU): before every forward the parameters are broadcast from the first DP rank, after every
backward the replicas' gradients (each of the loss divided by dp, DataParallel's mean over
the gathered losses) are summed onto it, and it alone steps. Its gradients and Adam-stepped
parameters equal the single-process reference over several iterations (a replica that
kept stale parameters, or a step on every rank, would not)."""
import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels import run_schedule  # noqa: E402
from clustersim.schedules.ops import OpKind  # noqa: E402
from clustersim.schedules.parallel import ParallelConfig  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402
from test_kernels_zero import GPT, assert_matches_reference  # noqa: E402


@pytest.mark.parametrize("dp, m", [(2, 2), (4, 3)])
def test_gradients_and_parameters_equal_the_reference(dp, m):
    parallel = ParallelConfig(dp=dp, micro_batch_size=2, num_microbatches=m,
                              dp_impl="dataparallel")
    plan = resolve(GPT, parallel)
    timeline, grads, params = run_schedule(plan.build_schedule(), plan, timeout=90,
                                           warmup_iterations=1, return_grads=True,
                                           return_params=True)
    assert_matches_reference(grads, params, parallel, GPT, steps=2)
    for rank in range(dp):
        kinds = [s.op.kind for s in timeline.spans if s.rank == rank]
        assert kinds.count(OpKind.BROADCAST) == kinds.count(OpKind.REDUCE) == m
        assert (OpKind.OPT_STEP in kinds) == (rank == 0)
