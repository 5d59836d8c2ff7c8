"""kernels.summa: SUMMA products on a real 2 x 2 grid of gloo processes equal torch's
single-process X @ W (and X @ W^T) and its autograd gradients, and the collectives that
ran are the closed forms of docs/research/tensor_parallel_nd.md section 1.1 (Colossal-AI's
Matmul_AB_2D / Matmul_ABT_2D / Matmul_ATB_2D): q broadcasts per operand per product,
q reduces per backward product, payloads the q x q blocks.

One set of 4 rank processes runs every case (module fixture); fp32, so results agree to
fp32 round-off."""
from collections import Counter

import pytest

torch = pytest.importorskip("torch", reason="the kernels backend needs torch "
                            "(pip install -e '.[kernels]')")

from gloo_ranks import run_ranks  # noqa: E402
from clustersim.kernels.summa import summa_matmul, world_grid  # noqa: E402

Q = 2
T, H_IN, H_OUT, V = 8, 6, 10, 12  # tokens, a linear's features, a vocabulary: divisible by Q
FP32 = 4
WAIT_S = 120.0


def full_operands(case: str) -> dict:
    """X, W and dY of a case, the same on every process: 'ab' is Y = X W (a linear,
    W h_in x h_out), 'abt' is Y = X W^T (the output layer, W V x h)."""
    gen = torch.Generator().manual_seed(7)
    w_shape, y_cols = ((H_IN, H_OUT), H_OUT) if case == "ab" else ((V, H_IN), V)
    return {"x": torch.randn(T, H_IN, generator=gen), "w": torch.randn(*w_shape, generator=gen),
            "dy": torch.randn(T, y_cols, generator=gen)}


def block(t: torch.Tensor, row: int, col: int) -> torch.Tensor:
    m, n = t.shape[0] // Q, t.shape[1] // Q
    return t[row * m:(row + 1) * m, col * n:(col + 1) * n].clone()


def records(grid) -> list[tuple]:
    return [(r.kind.value, r.group, r.nbytes, r.alongside) for r in grid.take_records()]


def run_case(grid, case: str) -> dict:
    """This rank's Y block, gradients (full backward, then the input and the weight
    gradient apart) and the collectives of each pass."""
    full = full_operands(case)
    x, w, dy = (block(full[k], grid.row, grid.col) for k in ("x", "w", "dy"))
    x.requires_grad_()
    w.requires_grad_()
    out = {}
    y = summa_matmul(x, w, grid, "layer", transposed=case == "abt")
    out["forward"] = records(grid)
    y.backward(dy, retain_graph=True)
    out["backward"] = records(grid)
    (dx,) = torch.autograd.grad(y, x, dy, retain_graph=True)
    out["input_grad"] = records(grid)
    (dw,) = torch.autograd.grad(y, w, dy)
    out["weight_grad"] = records(grid)
    out["tensors"] = {"y": y.detach(), "dx": x.grad, "dw": w.grad, "dx_alone": dx,
                      "dw_alone": dw}
    return out


def rank_work(rank: int) -> dict:
    """One rank's cases (run by tests/gloo_ranks.py in its gloo process)."""
    grid = world_grid(Q)
    out = {case: run_case(grid, case) for case in ("ab", "abt")}
    out["coords"] = (grid.row, grid.col)
    return out


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict]:
    return run_ranks(rank_work, Q * Q, WAIT_S)


def assembled(ranks: dict, case: str, name: str) -> torch.Tensor:
    """The full tensor from the ranks' blocks (rank q*i + j holds block (i, j))."""
    return torch.cat([torch.cat([ranks[Q * i + j][case]["tensors"][name] for j in range(Q)],
                                dim=1) for i in range(Q)])


@pytest.mark.parametrize("case", ["ab", "abt"], ids=["linear-XW", "head-XWT"])
def test_summa_product_and_gradients_equal_torch(ranks, case):
    full = full_operands(case)
    x, w = full["x"].requires_grad_(), full["w"].requires_grad_()
    y = x @ (w.t() if case == "abt" else w)
    y.backward(full["dy"])
    assert all(ranks[r]["coords"] == divmod(r, Q) for r in ranks)
    torch.testing.assert_close(assembled(ranks, case, "y"), y.detach())
    for name, want in (("dx", x.grad), ("dw", w.grad), ("dx_alone", x.grad),
                       ("dw_alone", w.grad)):
        torch.testing.assert_close(assembled(ranks, case, name), want, msg=name)


def expected(case: str) -> dict[str, Counter]:
    """Per pass, (kind, group, bytes, alongside) -> count on every rank: q steps per
    product, each moving one block; steps after the first beside the GEMMs."""
    if case == "ab":  # Y = X W: forward ab(X, W); dX = abt(dY, W); dW = atb(X, dY)
        x, w = T * H_IN // Q**2 * FP32, H_IN * H_OUT // Q**2 * FP32
        passes = {"forward": [("BROADCAST", "tp_row", x), ("BROADCAST", "tp_col", w)],
                  "input_grad": [("BROADCAST", "tp_col", w), ("REDUCE", "tp_row", x)],
                  "weight_grad": [("BROADCAST", "tp_row", x), ("REDUCE", "tp_col", w)]}
    else:  # Y = X W^T: forward abt(X, W); dX = ab(dY, W); dW = atb(dY, X)
        y, w = T * V // Q**2 * FP32, V * H_IN // Q**2 * FP32
        passes = {"forward": [("BROADCAST", "tp_col", w), ("REDUCE", "tp_row", y)],
                  "input_grad": [("BROADCAST", "tp_row", y), ("BROADCAST", "tp_col", w)],
                  "weight_grad": [("BROADCAST", "tp_row", y), ("REDUCE", "tp_col", w)]}
    out = {name: Counter({(*c, False): 1 for c in calls} | {(*c, True): Q - 1 for c in calls})
           for name, calls in passes.items()}
    out["backward"] = out["input_grad"] + out["weight_grad"]
    return out


@pytest.mark.parametrize("case", ["ab", "abt"], ids=["linear-XW", "head-XWT"])
def test_collectives_are_the_closed_forms(ranks, case):
    """Counts and bytes per pass on every rank; the input and the weight gradient run
    only their own collectives (two autograd nodes: an exact zero-bubble split)."""
    want = expected(case)
    for rank, payload in ranks.items():
        for name, counts in want.items():
            assert Counter(payload[case][name]) == counts, (rank, name)
