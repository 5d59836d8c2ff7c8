"""USP context parallelism (schedules/usp.py, schedules/cp_comms.py; Fang & Zhao 2024,
arXiv 2405.07719; Megatron-Core's --cp-comm-type a2a+p2p): its two levels of groups, its
communication against the closed forms (Ulysses' all-to-alls of Q, K, V and the output
over the a2a ranks; ring attention's KV all-gather of R blocks of 2 b (s/cp) h_kv d / t
bytes over the R ring steps), where each runs, and its one-line refusals."""
import pytest

from clustersim.schedules.comm_spec import Covered
from clustersim.schedules.cp_comms import cp_comms
from clustersim.schedules.errors import ConfigError
from clustersim.schedules.model import ModelSpec
from clustersim.schedules.names import CP_A2A, CP_RING
from clustersim.schedules.ops import OpKind
from clustersim.schedules.parallel import ParallelConfig
from clustersim.sim.cli import main

MODEL = ModelSpec(num_layers=4, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                  seq_length=32768, micro_batch_size=1, vocab_size=1024)


def test_the_groups_are_megatrons_two_levels():
    """cp = 8 as 2 Ulysses ranks x 4 ring steps: adjacent cp ranks form the a2a level,
    the ranks at one place of every pair the ring (Megatron-Core's hierarchical groups)."""
    parallel = ParallelConfig(cp=8, cp_comm="usp", cp_a2a=2)
    assert [parallel.group(CP_A2A, r) for r in (0, 1, 2, 7)] == [[0, 1], [0, 1], [2, 3],
                                                                  [6, 7]]
    assert parallel.group(CP_RING, 0) == [0, 2, 4, 6]
    assert parallel.group(CP_RING, 5) == [1, 3, 5, 7]
    assert parallel.overlapped_groups == {CP_RING}  # the ring hides behind attention


def test_a_forward_layer_moves_the_closed_form_bytes():
    parallel = ParallelConfig(cp=8, cp_comm="usp", cp_a2a=2)
    tokens, h, hkv, d = 32768 / 8, 4096, 1024, 2
    comms = cp_comms(MODEL, parallel, Covered(OpKind.F, 1), "usp")
    by: dict = {}
    for c in comms:
        by.setdefault((c.kind, c.group), []).append(c.nbytes)
    assert by[(OpKind.ALL_TO_ALL, CP_A2A)] == [tokens * (h + 2 * hkv) * d, tokens * h * d]
    assert by[(OpKind.ALL_GATHER, CP_RING)] == [4 * 2 * tokens * hkv * d]  # R KV blocks
    assert (OpKind.REDUCE_SCATTER, CP_RING) not in by  # dKV only in backward
    backward = cp_comms(MODEL, parallel, Covered(OpKind.B, 1), "usp")
    assert {(c.kind, c.group) for c in backward} == {
        (OpKind.ALL_TO_ALL, CP_A2A), (OpKind.ALL_GATHER, CP_RING),
        (OpKind.REDUCE_SCATTER, CP_RING)}


@pytest.mark.parametrize("kw, words", [
    (dict(cp=4, cp_comm="usp"), "needs cp_a2a"),
    (dict(cp=4, cp_comm="usp", cp_a2a=4), "1 < cp_a2a < cp"),
    (dict(cp=6, cp_comm="usp", cp_a2a=4), "to divide cp=6"),
    (dict(cp=4, cp_a2a=2), "needs cp_comm='usp'"),
])
def test_sizes_that_are_not_usp_are_refused(kw, words):
    with pytest.raises(ConfigError, match=words):
        ParallelConfig(**kw)


def test_megatrons_spellings_and_the_head_split_rule():
    parallel = ParallelConfig.from_kwargs(cp_comm_type="a2a+p2p",
                                          hierarchical_context_parallel_sizes=[2, 4])
    assert (parallel.cp_comm, parallel.cp, parallel.cp_a2a) == ("usp", 8, 2)
    with pytest.raises(ConfigError, match="two positive integers"):
        ParallelConfig.from_kwargs(hierarchical_context_parallel_sizes=[2])
    three_groups = ModelSpec(num_layers=4, hidden_size=768, num_attention_heads=6,
                             num_query_groups=3, seq_length=4096, vocab_size=1024)
    with pytest.raises(ConfigError, match="divisible by cp_a2a"):
        ParallelConfig(cp=4, cp_comm="usp", cp_a2a=2).check_model(three_groups)


def test_the_cli_simulates_it(tmp_path, capsys):
    assert main(["simulate", "--model", "llama3-8b", "--num-layers", "4", "--seq-length",
                 "16384", "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes",
                 "2", "2", "--pp", "1", "--microbatches", "2",
                 "-o", str(tmp_path / "u.html")]) == 0
    assert "iteration time" in capsys.readouterr().out
