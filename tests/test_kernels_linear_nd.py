"""kernels.linear_nd: a chain of two linears Y = (X W1) W2 on real gloo grids of 8 processes,
3D (q = 2, the second linear's input and output groups swapped) and 2.5D (q = 2, d = 2),
equals torch's single-process product and gradients, and the collectives that ran are
the closed forms the simulator charges (schedules.tp_3d.linear_3d_comms,
schedules.tp_2d.summa_comms on T/d tokens, plus one depth all-reduce per weight
gradient). Layouts: docs/research/tensor_parallel_nd.md sections 1.2 and 1.3.

One set of 8 rank processes runs every case (module fixture); fp32, so results agree to
fp32 round-off."""

import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from gloo_ranks import run_ranks  # noqa: E402
from clustersim.kernels.linear_nd import (AXES_3D, AXES_25D, Grid3D, Grid25D,  # noqa: E402
                                          linear_3d, linear_25d, sum_over_depth,
                                          world_groups)
from clustersim.kernels.split_backward import backward_input, backward_weight  # noqa: E402
from clustersim.schedules.names import TP_INPUT, TP_OUTPUT, TP_WEIGHT  # noqa: E402
from clustersim.schedules.tp_2d import summa_comms, summa_placements  # noqa: E402
from clustersim.schedules.tp_3d import linear_3d_comms  # noqa: E402
from clustersim.schedules.tp_grid import TpGrid  # noqa: E402

Q, D = 2, 2
WORLD = 8  # q^3 = d q^2
B, S = 4, 3  # the batch splits q^2 (3D) or d q (2.5D) ways
H = (4, 8, 6)  # X: h0, W1: h0 x h1, W2: h1 x h2; 3D splits h_in q^2 ways and h_out q ways
LINEARS = [(H[0], H[1]), (H[1], H[2])]
FP32 = 4
WAIT_S = 120.0
CASES = ("3d", "3d-split", "2.5d")


def operands() -> dict:
    gen = torch.Generator().manual_seed(11)
    return {"x": torch.randn(B, S, H[0], generator=gen),
            "w": [torch.randn(h_in, h_out, generator=gen) for h_in, h_out in LINEARS],
            "dy": torch.randn(B, S, H[2], generator=gen)}


# --- the layouts, as the research note states them ---------------------------------------
def cube_blocks(t: int, swapped: bool) -> tuple:
    """3D rank t = i + q j + q^2 k: (X blocks, W blocks) of a linear gathering over
    'tp_input' (or 'tp_output' when swapped): X batch i q + c[in] of q^2, hidden c[out];
    W rows c[out] q + i of q^2, columns c[in]."""
    c = {TP_WEIGHT: t % Q, TP_INPUT: t // Q % Q, TP_OUTPUT: t // Q**2}
    gather, scatter = (TP_OUTPUT, TP_INPUT) if swapped else (TP_INPUT, TP_OUTPUT)
    return (((0, c[TP_WEIGHT] * Q + c[gather], Q * Q), (-1, c[scatter], Q)),
            ((0, c[scatter] * Q + c[TP_WEIGHT], Q * Q), (1, c[gather], Q)))


def slab_blocks(t: int) -> tuple:
    """2.5D rank t = col + q row + q^2 dep: (activation blocks: batch dep q + row of d q,
    hidden col; W blocks (row, col) of q x q)."""
    col, row, dep = t % Q, t // Q % Q, t // Q**2
    return ((0, dep * Q + row, D * Q), (-1, col, Q)), ((0, row, Q), (1, col, Q))


def take(full: torch.Tensor, blocks: tuple) -> torch.Tensor:
    for dim, index, parts in blocks:
        size = full.shape[dim] // parts
        full = full.narrow(dim, index * size, size)
    return full.clone()


def assemble(shape: tuple, parts: list[tuple]) -> torch.Tensor:
    """The full tensor from (block, its blocks) pairs; NaN where no block lands."""
    out = torch.full(shape, float("nan"))
    for block, blocks in parts:
        take_view = out
        for dim, index, n in blocks:
            size = out.shape[dim] // n
            take_view = take_view.narrow(dim, index * size, size)
        take_view.copy_(block)
    return out


# --- the rank processes -------------------------------------------------------------------
def records(grid) -> list[tuple]:
    return [(r.kind.value, r.group, r.site, r.alongside, r.nbytes, r.end >= r.start)
            for r in grid.take_records()]


def run_cube(grid: Grid3D, split: bool) -> dict:
    full, t = operands(), grid.rank
    x = take(full["x"], cube_blocks(t, False)[0]).requires_grad_()
    ws = [take(w, cube_blocks(t, n % 2 == 1)[1]).requires_grad_()
          for n, w in enumerate(full["w"])]
    dy = take(full["dy"], cube_blocks(t, len(ws) % 2 == 1)[0])
    y = x
    for n, w in enumerate(ws):
        y = linear_3d(y, w, grid, swapped=n % 2 == 1, site=f"fc{n}")
    out = {"forward": records(grid)}
    if split:
        dx, state = backward_input(y, dy, x, ws)
        out["input_grad"] = records(grid)
        backward_weight(ws, state)
        out["weight_grad"] = records(grid)
    else:
        y.backward(dy)
        dx = x.grad
        out["backward"] = records(grid)
    out["tensors"] = {"y": y.detach(), "dx": dx, "dw": [w.grad for w in ws]}
    out["blocks"] = [(grid.input_blocks(s), grid.weight_blocks(s)) for s in (False, True)]
    return out


def run_slab(grid: Grid25D) -> dict:
    full, (x_blocks, w_blocks) = operands(), slab_blocks(grid.rank)
    x = take(full["x"], x_blocks).requires_grad_()
    ws = [take(w, w_blocks).requires_grad_() for w in full["w"]]
    y = x
    for n, w in enumerate(ws):
        y = linear_25d(y, w, grid, site=f"fc{n}")
    out = {"forward": records(grid)}
    y.backward(take(full["dy"], x_blocks))
    out["backward"] = records(grid)
    sum_over_depth(ws, grid)
    out["depth"] = records(grid)
    out["tensors"] = {"y": y.detach(), "dx": x.grad, "dw": [w.grad for w in ws]}
    out["blocks"] = [(grid.input_blocks(), grid.weight_blocks())]
    return out


def rank_work(rank: int) -> dict:
    """One rank's cases (run by tests/gloo_ranks.py in its gloo process)."""
    cube = Grid3D.of_groups(Q, rank, world_groups(TpGrid("3d", Q), AXES_3D))
    slab = Grid25D.of_groups(Q, D, rank, world_groups(TpGrid("2.5d", Q, D), AXES_25D))
    return {"3d": run_cube(cube, False), "3d-split": run_cube(cube, True),
            "2.5d": run_slab(slab)}


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict]:
    return run_ranks(rank_work, WORLD, WAIT_S)


# --- results equal torch's ----------------------------------------------------------------
def reference() -> dict:
    full = operands()
    x = full["x"].requires_grad_()
    ws = [w.requires_grad_() for w in full["w"]]
    y = x @ ws[0] @ ws[1]
    y.backward(full["dy"])
    return {"y": y.detach(), "dx": x.grad, "dw": [w.grad for w in ws]}


@pytest.mark.parametrize("case", ["3d", "3d-split"], ids=["backward", "split-I-W"])
def test_3d_chain_equals_torch(ranks, case):
    """Output, input gradient and both weight gradients, each rank's block put where
    the 3D layout says (every element covered once: q^3 blocks); with the zero-bubble
    split too (kernels.split_backward)."""
    want = reference()
    got = {t: ranks[t][case]["tensors"] for t in ranks}
    last = len(LINEARS) % 2 == 1  # the chain's output block: the next linear's input
    torch.testing.assert_close(
        assemble(want["y"].shape, [(got[t]["y"], cube_blocks(t, last)[0]) for t in got]),
        want["y"])
    torch.testing.assert_close(
        assemble(want["dx"].shape, [(got[t]["dx"], cube_blocks(t, False)[0]) for t in got]),
        want["dx"])
    for n, dw in enumerate(want["dw"]):
        torch.testing.assert_close(
            assemble(dw.shape, [(got[t]["dw"][n], cube_blocks(t, n % 2 == 1)[1])
                                for t in got]), dw, msg=lambda m, n=n: f"dW{n + 1}: {m}")


def test_25d_chain_equals_torch(ranks):
    """Output and input gradient from all 8 blocks (d q batch blocks x q hidden blocks);
    each weight gradient, summed over depth, from the slice dep = 0, identical on dep = 1."""
    want = reference()
    got = {t: ranks[t]["2.5d"]["tensors"] for t in ranks}
    for name in ("y", "dx"):
        torch.testing.assert_close(
            assemble(want[name].shape, [(got[t][name], slab_blocks(t)[0]) for t in got]),
            want[name], msg=lambda m, n=name: f"{n}: {m}")
    for n, dw in enumerate(want["dw"]):
        torch.testing.assert_close(
            assemble(dw.shape, [(got[t]["dw"][n], slab_blocks(t)[1]) for t in range(Q * Q)]),
            dw, msg=lambda m, n=n: f"dW{n + 1}: {m}")
        for t in range(Q * Q, WORLD):
            assert torch.equal(got[t]["dw"][n], got[t - Q * Q]["dw"][n]), (t, n)


def test_grids_report_the_layouts(ranks):
    """Grid3D / Grid25D's block descriptors (for kernels.layers.block_parameter) are the
    research note's layouts."""
    for t, payload in ranks.items():
        assert payload["3d"]["blocks"] == [cube_blocks(t, s) for s in (False, True)], t
        assert payload["2.5d"]["blocks"] == [slab_blocks(t)], t


# --- the collectives are the simulator's closed forms -------------------------------------
def totals(rows) -> dict:
    """{(kind, group, site, alongside): (count, bytes)} of (key..., bytes, count) rows."""
    out: dict = {}
    for *key, nbytes, count in rows:
        have = out.get(tuple(key), (0, 0))
        out[tuple(key)] = (have[0] + count, have[1] + nbytes)
    return out


def ran(rows: list[tuple]) -> dict:
    assert all(ordered for *_, ordered in rows)  # clock markers: end after start
    return totals((kind, group, site, along, nbytes, 1)
                  for kind, group, site, along, nbytes, _ in rows)


def cube_expected(passes: tuple[int, int, int]) -> dict:
    """linear_3d_comms of each linear for (forward, input_grad, weight_grad) passes."""
    rows = []
    for n, (h_in, h_out) in enumerate(LINEARS):
        roles = (TP_OUTPUT, TP_INPUT) if n % 2 else (TP_INPUT, TP_OUTPUT)
        rows += [(c.kind.value, c.group, f"fc{n}", False, c.nbytes, c.count)
                 for c in linear_3d_comms(Q, B * S, h_in, h_out, FP32, roles, *passes)]
    return totals(rows)


@pytest.mark.parametrize("case,passes", [
    ("3d", {"forward": (1, 0, 0), "backward": (0, 1, 1)}),
    ("3d-split", {"forward": (1, 0, 0), "input_grad": (0, 1, 0), "weight_grad": (0, 0, 1)})],
    ids=["backward", "split-I-W"])
def test_3d_collectives_are_the_closed_forms(ranks, case, passes):
    """Per linear and pass on every rank: forward all-gathers X (T h_in/q^2) and W
    (h_in h_out/q^2), reduce-scatters Y (T h_out/q^2); backward all-gathers dY,
    reduce-scatters dX and dW, on the groups the linear's roles name; the split runs dW's
    reduce-scatter alone in W."""
    for t, payload in ranks.items():
        for name, counts in passes.items():
            assert ran(payload[case][name]) == cube_expected(counts), (t, name)


def slab_expected(passes: tuple[int, int, int]) -> dict:
    """summa_comms of each linear on one slice's T/d tokens, steps 2..q alongside."""
    rows = []
    for n, (h_in, h_out) in enumerate(LINEARS):
        comms = summa_comms(Q, B * S // D * h_in * FP32, h_in * h_out * FP32, *passes)
        rows += [(c.kind.value, c.group, f"fc{n}", along, c.nbytes, c.count)
                 for c, along in summa_placements(comms, Q)]
    return totals(rows)


def test_25d_collectives_are_the_closed_forms(ranks):
    """SUMMA's broadcasts and reduces on the slice's rows and columns, with T/d tokens,
    then one all-reduce of each weight gradient (h_in h_out/q^2) over 'tp_dep'."""
    depth = totals(("ALL_REDUCE", "tp_dep", "dep_grad", False, h_in * h_out // Q**2 * FP32, 1)
                   for h_in, h_out in LINEARS)
    for t, payload in ranks.items():
        case = payload["2.5d"]
        assert ran(case["forward"]) == slab_expected((1, 0, 0)), t
        assert ran(case["backward"]) == slab_expected((0, 1, 1)), t
        assert ran(case["depth"]) == depth, t
