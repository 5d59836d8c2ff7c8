"""Max-min fair rates against hand-solved cases and the bottleneck characterisation
(Bertsekas & Gallager, Data Networks, 6.5.2: rates are max-min fair iff feasible and every
flow crosses a saturated link on which no other flow gets more)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.sim.maxmin import max_min_rates


def test_flows_on_one_link_share_it_equally():
    assert list(max_min_rates([[0]] * 4, [8.0])) == [2.0] * 4


def test_hand_solved_two_links():
    # A (cap 1) carries f0, f1; B (cap 2) carries f1, f2: A is the bottleneck at 1/2,
    # and f2 takes what f1 leaves of B.
    assert list(max_min_rates([[0], [0, 1], [1]], [1.0, 2.0])) == [0.5, 0.5, 1.5]


def test_a_lone_flow_gets_its_narrowest_link():
    assert list(max_min_rates([[0, 1, 2]], [5.0, 3.0, 9.0])) == [3.0]


instances = st.integers(1, 6).flatmap(lambda n_links: st.tuples(
    st.lists(st.floats(0.5, 100.0), min_size=n_links, max_size=n_links),
    st.lists(st.lists(st.integers(0, n_links - 1), min_size=1, max_size=n_links, unique=True),
             min_size=1, max_size=12)))


@settings(max_examples=200, deadline=None)
@given(instances)
def test_rates_are_feasible_and_max_min_fair(instance):
    capacity, flows = instance
    rates = max_min_rates(flows, capacity)
    load = [0.0] * len(capacity)
    for links, rate in zip(flows, rates):
        assert rate > 0
        for link in links:
            load[link] += rate
    for link, cap in enumerate(capacity):
        assert load[link] <= cap * (1 + 1e-9)
    for f, links in enumerate(flows):
        bottlenecks = [
            link for link in links
            if load[link] >= capacity[link] * (1 - 1e-9)
            and all(rates[g] <= rates[f] * (1 + 1e-9) for g, other in enumerate(flows)
                    if link in other)
        ]
        assert bottlenecks, f"flow {f} has no bottleneck link"
