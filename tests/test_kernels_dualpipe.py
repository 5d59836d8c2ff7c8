"""kernels: bidirectional DualPipe runs for real (gloo, CPU): each rank holds two stages,
half the microbatches enter at each end, the two copies of every stage average their
gradients over pipeline ranks r and P-1-r before the step. Gradients and Adam-updated
parameters equal the single-process reference, and the two copies of every parameter are
equal after the step (kernels.results refuses copies that differ)."""
import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels import KernelsError, run_schedule  # noqa: E402
from clustersim.schedules.names import PP_COPIES  # noqa: E402
from clustersim.schedules.parallel import ParallelConfig  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402
from test_kernels_zero import GPT, LLAMA, assert_matches_reference  # noqa: E402


def plan_of(pp, dp, m, model=LLAMA, **kw):
    bucket = {"bucket_bytes": 200_000} if dp > 1 else {}
    return resolve(model, ParallelConfig(schedule="dualpipe", pp=pp, dp=dp, micro_batch_size=2,
                                         num_microbatches=m, **bucket, **kw))


@pytest.mark.parametrize("pp, dp, m", [(2, 1, 4), (2, 2, 6), (4, 2, 8)])
def test_gradients_and_parameters_equal_the_reference(pp, dp, m):
    plan = plan_of(pp, dp, m)
    timeline, grads, params = run_schedule(plan.build_schedule(), plan, timeout=90,
                                           warmup_iterations=0, return_grads=True,
                                           return_params=True)
    assert_matches_reference(grads, params, plan.parallel, LLAMA)
    copies = [s for s in timeline.spans if s.op.group == PP_COPIES]
    assert len(copies) == 2 * plan.world_size  # two stages per rank, each one all-reduce


@pytest.mark.parametrize("model, kw, match", [
    (LLAMA, dict(zero_stage=1), "zero_stage=1 with dualpipe"),
    (GPT, {}, "tied embeddings")])
def test_what_the_copies_cannot_run_is_refused(model, kw, match):
    plan = plan_of(2, 2, 4, model, **kw)
    with pytest.raises(KernelsError, match=match):
        run_schedule(plan.build_schedule(), plan, timeout=30)
