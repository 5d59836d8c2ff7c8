"""kernels: PipeDream and PipeDream-2BW run for real (gloo, CPU) with weight stashing
(kernels.stashing): the parameters after the run and the last update's gradients equal a
single-process reference that applies the same stale weights microbatch by microbatch
(kernels.reference.run_stale_reference), and differ from the synchronous reference (so
the stale versions are really used); what the stashing cannot run is refused."""
import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from clustersim.kernels import (KernelsError, run_reference_steps, run_schedule,  # noqa: E402
                                run_stale_reference)
from clustersim.schedules.parallel import ParallelConfig  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402
from test_kernels_zero import GPT, LLAMA  # noqa: E402


def plan_of(name, pp, dp, m, model=LLAMA, **kw):
    bucket = {"bucket_bytes": 200_000} if dp > 1 else {}  # several buckets per stage
    return resolve(model, ParallelConfig(schedule=name, pp=pp, dp=dp, micro_batch_size=2,
                                         num_microbatches=m, **bucket, **kw))


@pytest.mark.parametrize("name, pp, dp, m", [
    ("pipedream", 2, 2, 2), ("pipedream", 4, 1, 2), ("pipedream-2bw", 2, 2, 2),
    ("pipedream-2bw", 4, 1, 4)])
def test_parameters_and_gradients_equal_the_stale_reference(name, pp, dp, m):
    plan = plan_of(name, pp, dp, m)
    schedule = plan.build_schedule()
    timeline, grads, params = run_schedule(schedule, plan, timeout=90, warmup_iterations=0,
                                           return_grads=True, return_params=True)
    want_grads, want_params = run_stale_reference(plan, schedule.asynchronous)
    assert set(params) == set(want_params) == set(grads) == set(want_grads)
    for name_ in want_params:
        torch.testing.assert_close(grads[name_], want_grads[name_], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(params[name_], want_params[name_], rtol=1e-5, atol=1e-5)
    _, synchronous = run_reference_steps(LLAMA, plan.parallel, 1)
    assert max((params[n] - synchronous[n]).abs().max().item() for n in params) > 1e-4
    steady = timeline.meta["steady_state"]
    assert steady["end"] > steady["start"] and timeline.iteration_time == pytest.approx(
        steady["end"] - steady["start"])
    assert any("weight stashing" in limit for limit in timeline.meta["limits"])


@pytest.mark.parametrize("kw, match", [
    (dict(recompute="full"), "recompute='full' with weight stashing"),
    (dict(), "tied embeddings with weight stashing")])
def test_what_the_stashing_cannot_run_is_refused(kw, match):
    model = LLAMA if kw else GPT  # GPT: tied embeddings
    plan = plan_of("pipedream", 2, 1, 2, model, **kw)
    with pytest.raises(KernelsError, match=match):
        run_schedule(plan.build_schedule(), plan, timeout=30)
