"""Stage placement: the loop of Megatron's interleaving and the V of ZB-V/DualPipeV."""
import pytest

from clustersim.schedules.errors import ConfigError
from clustersim.schedules.placement import stage_ranks


def test_loop_puts_stage_s_on_rank_s_mod_p():
    assert stage_ranks("loop", 4, 8) == (0, 1, 2, 3, 0, 1, 2, 3)


def test_v_puts_stages_r_and_2p_minus_1_minus_r_on_rank_r():
    """Qi et al. 2024 (ZB-V): rank r holds stages r and 2P-1-r."""
    ranks = stage_ranks("v", 4, 8)
    assert all(ranks[r] == ranks[2 * 4 - 1 - r] == r for r in range(4))
    assert stage_ranks("v", 2, 6) == (0, 1, 1, 0, 0, 1)  # the zig-zag goes on


def test_bad_placements_are_refused():
    with pytest.raises(ConfigError, match="placement"):
        stage_ranks("spiral", 2, 4)
    with pytest.raises(ConfigError, match="pp=4"):
        stage_ranks("loop", 4, 6)
