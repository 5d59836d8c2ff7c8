"""Uneven pipeline splits (Megatron-Core's --decoder-first/last-pipeline-num-layers and
--account-for-embedding/loss-in-pipeline-split): the layer counts, the costs that follow
them, a lighter last stage shortening the iteration, and real gradients unchanged."""
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from clustersim.kernels import run_reference, run_schedule  # noqa: E402
from clustersim.schedules.errors import ConfigError  # noqa: E402
from clustersim.schedules.registry import build_schedule  # noqa: E402
from clustersim.schedules.model import ModelSpec  # noqa: E402
from clustersim.schedules.model_presets import get_model  # noqa: E402
from clustersim.schedules.parallel import ParallelConfig  # noqa: E402
from clustersim.schedules.pipeline_split import stage_layers  # noqa: E402
from clustersim.schedules.placement import loop  # noqa: E402
from clustersim.schedules.plan import resolve  # noqa: E402
from clustersim.sim.simulate import simulate  # noqa: E402
from clustersim.topologies import load_topology  # noqa: E402


def _split(num_layers, **kw):
    par = ParallelConfig.from_kwargs(**kw)
    return stage_layers(num_layers, par, loop(par.pp, par.pp * par.vpp))


def test_even_by_default_and_megatron_first_last_ranks():
    assert _split(32, pp=4) == (8,) * 4
    assert _split(32, pp=4, decoder_first_pipeline_num_layers=5,
                  decoder_last_pipeline_num_layers=3) == (5, 12, 12, 3)
    assert _split(32, pp=4, last_stage_layers=2) == (10, 10, 10, 2)
    # interleaved: rank r holds virtual stages r, r + pp, ...; its layers split over them
    assert _split(32, pp=4, vpp=2, schedule="interleaved-1f1b", num_microbatches=8,
                  first_stage_layers=6, last_stage_layers=6) == (3, 5, 5, 3, 3, 5, 5, 3)


def test_embedding_and_loss_take_one_layer_slot_each():
    assert _split(30, pp=4, account_for_embedding_in_pipeline_split=True,
                  account_for_loss_in_pipeline_split=True) == (7, 8, 8, 7)
    assert _split(31, pp=4, account_for_loss=True) == (8, 8, 8, 7)


@pytest.mark.parametrize("kw,rule", [
    ({"pp": 4, "first_stage_layers": 6}, "do not split evenly over 3"),
    ({"pp": 4, "first_stage_layers": 20, "last_stage_layers": 20}, "remaining layers"),
    ({"pp": 1, "last_stage_layers": 2}, "needs pp > 1"),
    ({"pp": 4, "account_for_loss": True, "last_stage_layers": 2}, "cannot be combined"),
    ({"pp": 4, "account_for_loss": True}, "do not split evenly over 4"),
    ({"pp": 2, "first_stage_layers": 0}, "first_stage_layers must be an integer >= 1"),
])
def test_bad_splits_name_the_field_and_rule(kw, rule):
    with pytest.raises(ConfigError, match=rule):
        _split(32, **kw)


def test_stage_costs_follow_the_split():
    model = replace(get_model("gpt3-1.3b"), num_layers=8)
    par = ParallelConfig(pp=4, first_stage_layers=1, last_stage_layers=1)
    costs = resolve(model, par).stage_costs
    assert [c.layers for c in costs] == [1, 3, 3, 1]
    assert sum(c.forward_flops for c in costs) == model.forward_flops()
    assert sum(c.param_count for c in costs) == model.param_count()
    middle = costs[1].forward_flops / 3
    assert costs[0].forward_flops == pytest.approx(middle)  # embedding: no GEMM FLOPs
    assert costs[3].forward_flops == pytest.approx(middle + model.logits_forward_flops())


def test_a_lighter_last_stage_shortens_the_iteration():
    """Llama-3 8B, pp 8: the last stage's 128k-vocabulary head is worth ~2 layers, so
    moving layers off it (and off the embedding stage less) shortens the iteration."""
    model, topology = get_model("llama3-8b"), load_topology("dgx-h100")
    even = simulate(model, ParallelConfig(pp=8, num_microbatches=8), topology)
    uneven = simulate(model, ParallelConfig(pp=8, num_microbatches=8, first_stage_layers=5,
                                            last_stage_layers=3), topology)
    assert uneven.iteration_time < 0.95 * even.iteration_time


def test_kernels_run_an_uneven_split_with_the_reference_gradients():
    model = ModelSpec(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32,
                      vocab_size=128, micro_batch_size=2, dtype="fp32")
    par = ParallelConfig(pp=2, micro_batch_size=2, num_microbatches=2, first_stage_layers=1)
    schedule = build_schedule("1f1b", 2, 2)
    timeline, grads = run_schedule(schedule, resolve(model, par, schedule=schedule), timeout=60,
                                   warmup_iterations=0, return_grads=True)
    want = run_reference(model, par)
    assert set(grads) == set(want)
    for name in want:
        torch.testing.assert_close(grads[name], want[name])
