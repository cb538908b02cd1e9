"""Message passing ops specifics the generic tables don't express: spmm_reduce against torch.sparse.mm's
reductions, every reduce x head layout x weights through gradcheck, the max/min tie rule, sddmm and
csr_softmax details, torchops.spmm with a reduce (and its cached transpose), torchops.graph.to_csr, the
GAT layer of the demo against a dense reference (and against torch_geometric's GATConv when installed),
DTensor rules on spawned gloo groups, and on CUDA: power-law rows that many work units share (the carry
paths of every reduce and of softmax), agreement with the CPU, determinism, malformed indices."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchops
from helpers import DEVICES, FLOAT_DTYPES, HALF_DTYPES, INT_DTYPES, requires_cuda
from op_db import _csr_indices
from op_db.csr import csr_softmax_reference, spmm_reduce_arg_reference, spmm_reduce_reference
from test_csr_spmm import power_law_csr
from torchops import ops as torchops_ops

F64 = torch.float64
REDUCES = ("sum", "mean", "max", "min")
TORCH_REDUCE = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}


def rows_of(crow: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(crow.numel() - 1, device=crow.device), crow.diff())


def unique_power_law(m: int, k: int, nnz: int, *, device: str, index_dtype=torch.int64, seed: int = 0,
                     long_len: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """power_law_csr's rows with their columns sorted and distinct (torch's sparse CSR reductions want them)."""
    crow, col = power_law_csr(m, k, nnz, device="cpu", seed=seed, long_len=long_len)
    keys = torch.unique(rows_of(crow) * k + col)
    rows, col = keys // k, keys % k
    crow = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(torch.bincount(rows, minlength=m), 0)])
    return crow.to(index_dtype).to(device), col.to(index_dtype).to(device)


# ------------------------------------------------------------------------------------ torch.sparse.mm

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("reduce", REDUCES)
def test_forward_equals_torch_sparse_mm_reduce_on_the_cpu(dtype: torch.dtype, reduce: str) -> None:
    crow, col = unique_power_law(300, 200, 4000, device="cpu", long_len=150)
    values = torch.randn(col.numel(), dtype=dtype)
    A = torch.sparse_csr_tensor(crow, col, values, (300, 200))
    for n in (1, 7, 32, 64, 100):
        dense = torch.randn(200, n, dtype=dtype)
        expected = torch.sparse.mm(A, dense, TORCH_REDUCE[reduce])
        got = torchops.spmm_reduce(crow, col, values, dense, reduce)
        if reduce in ("max", "min"):  # a selected product is the product itself
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
        else:
            torch.testing.assert_close(got, expected)
        torch.testing.assert_close(torchops.spmm(A, dense, reduce), got, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------ gradcheck

def _case(device: str, heads: str, ones: bool, index_dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rows = [[1, 4, 2], [], [6, 0, 5, 3], [3], [5, 1, 0, 2, 6], [2, 6]]  # unsorted, an empty row
    crow, col = _csr_indices(rows, index_dtype, device)
    h = 3
    values = None
    if not ones:
        shape = (col.numel(), h) if heads == "heads" else (col.numel(),)
        values = torch.randn(shape, dtype=F64, generator=g).to(device).requires_grad_()
    shape = (7, 4) if heads == "1-D" else (7, h, 4)
    dense = torch.randn(shape, dtype=F64, generator=g).to(device).requires_grad_()
    return crow, col, values, dense


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("heads,ones", [("1-D", False), ("heads", False), ("shared", False), ("1-D", True),
                                        ("shared", True)])
def test_gradcheck_every_reduce_and_layout(device: str, reduce: str, heads: str, ones: bool) -> None:
    for index_dtype in INT_DTYPES:
        crow, col, values, dense = _case(device, heads, ones, index_dtype)
        inputs = tuple(t for t in (values, dense) if t is not None)

        def fn(*args):
            return torchops.spmm_reduce(crow, col, args[0] if values is not None else None, args[-1], reduce)

        assert torch.autograd.gradcheck(fn, inputs)
        if reduce in ("sum", "mean"):  # linear: differentiable twice
            assert torch.autograd.gradgradcheck(fn, inputs)


@pytest.mark.parametrize("device", DEVICES)
def test_max_min_refuse_double_backward_by_name(device: str) -> None:
    crow, col, values, dense = _case(device, "1-D", False, torch.int64)
    out = torchops.spmm_reduce(crow, col, values, dense, "max")
    (gv,) = torch.autograd.grad(out.sum(), values, create_graph=True)
    with pytest.raises(RuntimeError, match=r"^myns::_spmm_reduce_backward: double backward"):
        gv.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("device", DEVICES)
def test_backward_reads_an_arg_or_transpose_given_at_any_offset(device: str, dtype: torch.dtype) -> None:
    # _spmm_reduce_backward takes arg and the transpose from its caller: contiguous views at odd offsets (which
    # the CUDA kernels' vector reads of arg must allow for) give the same gradients as fresh tensors, to rounding:
    # the CUDA kernels' vector width follows arg's alignment, and with it the order of a gradient's f32 sums.
    crow, col = power_law_csr(40, 24, 200, device=device, seed=3)
    values = torch.randn(col.numel(), dtype=dtype, device=device)
    dense = torch.randn(24, 16, dtype=dtype, device=device)
    grad = torch.randn(40, 16, dtype=dtype, device=device)
    _, arg = torch.ops.myns._spmm_reduce_forward(crow, col, values, dense, "max")
    transpose = torch.ops.myns._csr_transpose(crow, col, 24)

    def offset(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t.new_zeros(1), t.flatten()])[1:].view(t.shape)

    want = torch.ops.myns._spmm_reduce_backward(grad, crow, col, values, dense, arg, *transpose, True, True)
    got = torch.ops.myns._spmm_reduce_backward(grad, crow, col, values, dense, offset(arg),
                                               *map(offset, transpose), True, True)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w)


@requires_cuda
@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_cuda_transpose_with_out_of_range_t_perm_reads_in_bounds(reduce: str) -> None:
    # A transpose handed to an op is metadata whose entries are read in bounds whatever they are (csr/csr.h):
    # an out-of-range t_perm must not reach index_select's device assert, which ends the CUDA context.
    crow, col = power_law_csr(40, 24, 200, device="cuda", seed=4)
    values = torch.randn(col.numel(), device="cuda", requires_grad=True)
    dense = torch.randn(24, 8, device="cuda", requires_grad=True)
    t_crow, t_col, t_perm = torch.ops.myns._csr_transpose(crow, col, 24)
    out = torch.ops.myns._csr_spmm_with_transpose(crow, col, values, dense, t_crow, t_col, t_perm + 10**6, reduce)
    out.sum().backward()
    torch.cuda.synchronize()
    assert dense.grad.shape == dense.shape and torch.ones(1, device="cuda").item() == 1.0


# ------------------------------------------------------------------------------------- the tie rule

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_ties_send_the_gradient_to_the_first_nonzero_of_the_row(device: str, reduce: str) -> None:
    # Row 0: three nonzeros whose products tie in column 0 (positions 0 and 2 equal, 1 different), and in
    # column 1 all three tie. Row 1: two entries of the same column (positions 3, 4), a tie again.
    crow = torch.tensor([0, 3, 5], device=device)
    col = torch.tensor([0, 1, 2, 1, 1], device=device)
    values = torch.tensor([2.0, 1.0, 1.0, 3.0, 3.0], dtype=F64, device=device, requires_grad=True)
    dense = torch.tensor([[1.0, 1.0], [-4.0 if reduce == "max" else 4.0, 2.0], [2.0, 2.0]], dtype=F64,
                         device=device, requires_grad=True)
    out, arg = torch.ops.myns._spmm_reduce_forward(crow, col, values, dense, reduce)
    assert arg.tolist() == [[0, 0], [3, 3]]
    out.backward(torch.ones_like(out))
    assert values.grad.tolist() == [2.0, 0.0, 0.0, dense[1].sum().item(), 0.0]
    assert dense.grad.tolist() == [[2.0, 2.0], [3.0, 3.0], [0.0, 0.0]]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_values_gradient_sums_the_heads_before_rounding(device: str, dtype: torch.dtype, reduce: str) -> None:
    # One nonzero (selected in both heads by max / min) of a (K, 2, 1) dense, its weight shared by the heads (1-D
    # values): its gradient is the sum of two cancelling terms, 1.375 * d and -1.375 * (d - 0.25) = 0.34375
    # exactly. Each term rounded to the 16-bit dtype before the sum (the CUDA max backward, and every device's sum
    # and mean backward, once did) gives 0.375 (f16) or 0.25 (bf16).
    d = {torch.float16: 47.25, torch.bfloat16: 23.5}[dtype]
    crow, col = torch.tensor([0, 1], device=device), torch.tensor([0], device=device)
    values = torch.ones(1, dtype=dtype, device=device, requires_grad=True)
    dense = torch.tensor([[[d], [-(d - 0.25)]]], dtype=dtype, device=device)
    out = torchops.spmm_reduce(crow, col, values, dense, reduce)
    out.backward(torch.full_like(out, 1.375))
    assert values.grad.item() == 0.34375


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_mean_gradient_rounds_once_where_the_rows_cancel(device: str, dtype: torch.dtype) -> None:
    # dense's one row is gathered three times by row 0 (length 3) and once by row 1, so its gradient is
    # 3 * (g0 / 3) + g1 = g0 + g1 exactly: 1 (f16) or 8 (bf16). g0 / 3 rounded to the 16-bit dtype before the
    # product (every device's mean backward once did; the property suite's long profile found it) gives 0.75 or 10.
    g0, g1 = {torch.float16: (1000.0, -999.0), torch.bfloat16: (1000.0, -992.0)}[dtype]
    crow, col = _csr_indices([[0, 0, 0], [0]], torch.int64, device)
    dense = torch.ones(1, 1, dtype=dtype, device=device, requires_grad=True)
    out = torchops.spmm_reduce(crow, col, None, dense, "mean")
    out.backward(torch.tensor([[g0], [g1]], dtype=dtype, device=device))
    assert dense.grad.item() == g0 + g1


@pytest.mark.parametrize("device", DEVICES)
def test_nan_is_selected_over_every_number(device: str) -> None:
    crow = torch.tensor([0, 3], device=device)
    col = torch.tensor([0, 1, 2], device=device)
    dense = torch.tensor([[1.0], [float("nan")], [float("nan")]], device=device)
    for reduce in ("max", "min"):
        out, arg = torch.ops.myns._spmm_reduce_forward(crow, col, None, dense, reduce)
        assert out.isnan().all() and arg.tolist() == [[1]], reduce  # the first NaN


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", INT_DTYPES)
def test_empty_rows_nnz_zero_and_m_zero(device: str, index_dtype: torch.dtype) -> None:
    for reduce in REDUCES:
        crow, col = _csr_indices([[], [0], []], index_dtype, device)
        dense = torch.randn(2, 3, 5, device=device)
        out = torchops.spmm_reduce(crow, col, None, dense, reduce)
        assert out.shape == (3, 3, 5) and not out[0].any() and not out[2].any()
        torch.testing.assert_close(out[1], dense[0])
        crow, col = _csr_indices([[], []], index_dtype, device)
        assert not torchops.spmm_reduce(crow, col, torch.zeros(0, device=device), dense[:, 0], reduce).any()
        crow, col = _csr_indices([], index_dtype, device)
        assert torchops.spmm_reduce(crow, col, None, dense, reduce).shape == (0, 3, 5)
        arg = torch.ops.myns._spmm_reduce_forward(*_csr_indices([[], [1]], index_dtype, device), None, dense[:, 0],
                                                  "max" if reduce in ("sum", "max") else "min")[1]
        assert arg.dtype == index_dtype and arg[0].eq(-1).all() and arg[1].eq(0).all()  # a position, not a column


@pytest.mark.parametrize("device", DEVICES)
def test_mean_divides_by_the_rows_length_forward_and_backward(device: str) -> None:
    crow, col = _csr_indices([[0, 1, 1, 2], [2], []], torch.int64, device)
    dense = torch.randn(3, 4, dtype=F64, device=device, requires_grad=True)
    out = torchops.spmm_reduce(crow, col, None, dense, "mean")
    torch.testing.assert_close(out[0], (dense[0] + 2 * dense[1] + dense[2]) / 4)
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(dense.grad, torch.tensor([0.25, 0.5, 1.25], dtype=F64, device=device)[:, None].expand(3, 4))


def test_reduce_names_the_op_and_argument() -> None:
    crow, col = _csr_indices([[0]], torch.int64, "cpu")
    with pytest.raises(RuntimeError, match=r"^myns::spmm_reduce: reduce must be 'sum', 'mean', 'max' or 'min', got 'amax'$"):
        torchops.spmm_reduce(crow, col, None, torch.randn(1, 2), "amax")
    with pytest.raises(RuntimeError, match=r"^myns::sddmm: op must be 'dot', 'add' or 'mul', got 'sub'$"):
        torchops.sddmm(crow, col, torch.randn(1, 2), torch.randn(1, 2), "sub")


# ---------------------------------------------------------------------------------- sddmm, csr_softmax

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["dot", "add", "mul"])
@pytest.mark.parametrize("heads", [False, True])
def test_sddmm_gradcheck_twice(device: str, op: str, heads: bool) -> None:
    crow, col = _csr_indices([[1, 4, 2], [], [3, 0, 3], [4]], torch.int32, device)
    tail = ((2,) if heads else ()) + ((3,) if op == "dot" else ())
    a = torch.randn((4,) + tail, dtype=F64, device=device, requires_grad=True)
    b = torch.randn((5,) + tail, dtype=F64, device=device, requires_grad=True)
    fn = lambda x, y: torchops.sddmm(crow, col, x, y, op)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (a, b))
    assert torch.autograd.gradgradcheck(fn, (a, b))


@pytest.mark.parametrize("device", DEVICES)
def test_csr_softmax_rows(device: str) -> None:
    crow, _ = _csr_indices([[0], [], [0, 0, 0], [0, 0]], torch.int64, device)
    values = torch.tensor([5.0, 1e4, 1e4 + 1, -1e4, float("-inf"), 3.0], device=device)
    out = torchops.csr_softmax(crow, values)
    e = torch.e
    expected = torch.tensor([1.0, 1 / (1 + e), e / (1 + e), 0.0, 0.0, 1.0])
    torch.testing.assert_close(out.cpu(), expected)  # no overflow at 1e4; exp(-inf) is 0


@pytest.mark.parametrize("heads", [1, 20])  # 20: more heads than a warp's groups, one lane group a row on CUDA
@pytest.mark.parametrize("device", DEVICES)
def test_csr_softmax_rows_with_infinities_and_nan_are_torch_softmax(device: str, heads: int) -> None:
    # Two -inf in a row are 0 (not exp(inf - inf)); a +inf makes its whole row NaN, as a NaN does; a row of
    # -inf alone is NaN. Forward and backward, against torch.softmax on each dense row.
    inf, nan = float("inf"), float("nan")
    rows = [[-inf, -inf, 3.0], [inf, 5.0], [-inf, -inf], [nan, 1.0], [inf, inf], [5.0, -inf, -inf, 2.0],
            [-inf, 4.0, -inf, -inf, 4.0], [2.0] * 40 + [-inf] * 3]
    crow, _ = _csr_indices([[0] * len(r) for r in rows], torch.int64, device)
    flat = torch.tensor([v for r in rows for v in r], dtype=F64)
    values = flat[:, None].repeat(1, heads) if heads > 1 else flat
    grad = torch.randn(values.shape, dtype=F64)
    leaf = values.to(device).requires_grad_()
    out = torchops.csr_softmax(crow, leaf)
    (got_grad,) = torch.autograd.grad(out, leaf, grad.to(device))
    want, want_grad, start = [], [], 0
    for r in rows:
        part = values[start:start + len(r)].clone().requires_grad_()
        y = torch.softmax(part, dim=0)
        want.append(y.detach())
        want_grad.append(torch.autograd.grad(y, part, grad[start:start + len(r)])[0])
        start += len(r)
    torch.testing.assert_close(out.detach().cpu(), torch.cat(want), equal_nan=True)
    torch.testing.assert_close(got_grad.cpu(), torch.cat(want_grad), equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_csr_softmax_gradcheck_and_refused_double_backward(device: str) -> None:
    crow, _ = _csr_indices([[0, 0, 0], [], [0], [0, 0]], torch.int64, device)
    for shape in ((6,), (6, 3)):
        values = torch.randn(shape, dtype=F64, device=device, requires_grad=True)
        assert torch.autograd.gradcheck(lambda v: torchops.csr_softmax(crow, v), (values,))
    (g,) = torch.autograd.grad(torchops.csr_softmax(crow, values).pow(2).sum(), values, create_graph=True)
    with pytest.raises(RuntimeError, match=r"^myns::_csr_softmax_backward: double backward"):
        g.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_check_invariants_of_the_new_wrappers(device: str) -> None:
    crow, col = torch.tensor([0, 2, 3], device=device), torch.tensor([0, 5, 1], device=device)
    dense, a = torch.randn(3, 4, device=device), torch.randn(2, 4, device=device)
    message = r"col_indices must lie in \[0, K\) with K = 3, got col_indices\[1\] = 5"
    with pytest.raises(RuntimeError, match=r"^myns::spmm_reduce: " + message):
        torchops.spmm_reduce(crow, col, None, dense, "max", check_invariants=True)
    with pytest.raises(RuntimeError, match=r"^myns::sddmm: " + message):
        torchops.sddmm(crow, col, a, dense, check_invariants=True)
    with pytest.raises(RuntimeError, match=r"^myns::csr_softmax: crow_indices\[-1\] must equal nnz = 4 \(the length "
                                           r"of values\), got 3$"):
        torchops.csr_softmax(crow, torch.randn(4, device=device), check_invariants=True)
    ok = torch.tensor([0, 1, 3], device=device)
    torchops.csr_softmax(ok, torch.randn(3, device=device), check_invariants=True)


# ------------------------------------------------------------------------------------ spmm(A, reduce)

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduce", REDUCES)
def test_spmm_with_a_reduce_caches_the_transpose(device: str, reduce: str) -> None:
    crow, col = unique_power_law(40, 30, 300, device=device, seed=2)
    values = torch.randn(col.numel(), dtype=F64, device=device)
    A = torch.sparse_csr_tensor(crow, col, values, (40, 30)).requires_grad_()
    for dense_shape in ((30, 5), (30, 2, 3)):
        dense = torch.randn(dense_shape, dtype=F64, device=device, requires_grad=True)
        out = torchops.spmm(A, dense, reduce)
        ref_values = values.clone().requires_grad_()
        ref_dense = dense.detach().clone().requires_grad_()
        ref = torchops.spmm_reduce(crow, col, ref_values, ref_dense, reduce)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        g = torch.randn_like(out)
        out.backward(g)
        ref.backward(g)
        torch.testing.assert_close(dense.grad, ref_dense.grad)
        torch.testing.assert_close(A.grad.values(), ref_values.grad)
        A.grad = None
        assert torchops_ops._STRUCTURE_CACHE[A]._transpose is not None


def test_spmm_with_a_reduce_scripts() -> None:
    class Mean(torch.nn.Module):
        def forward(self, A: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
            return torchops.spmm(A, dense, "mean")

    crow, col = unique_power_law(20, 10, 60, device="cpu")
    A = torch.sparse_csr_tensor(crow, col, torch.randn(col.numel()), (20, 10))
    dense = torch.randn(10, 4)
    scripted = torch.jit.script(Mean())
    assert "myns::spmm_reduce" in str(scripted.inlined_graph)
    torch.testing.assert_close(scripted(A, dense), torchops.spmm_reduce(crow, col, A.values(), dense, "mean"))


# ------------------------------------------------------------------------------------------- to_csr

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_to_csr_rows_are_targets_columns_sources_ascending(device: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    n, e = 30, 200
    edge_index = torch.randint(0, n, (2, e), generator=g).to(dtype).to(device)
    edge_index[:, 5] = edge_index[:, 9]  # a duplicate edge
    crow, col, perm = torchops.graph.to_csr(edge_index, n)
    assert crow.dtype == col.dtype == dtype and perm.dtype == torch.int64 and crow.numel() == n + 1
    rows = rows_of(crow)
    assert torch.equal(rows, edge_index[1][perm].long()) and torch.equal(col, edge_index[0][perm])
    assert (rows.diff() > 0).logical_or((rows.diff() == 0) & (col.diff() >= 0)).all(), "sorted by (row, column)"
    assert torch.equal(torch.sort(perm).values, torch.arange(e, device=device))
    # Messages flow source -> target as in PyG: out[i] sums x[source] over the edges into i.
    x = torch.randn(n, 4, dtype=F64, device=device)
    weight = torch.randn(e, dtype=F64, device=device)
    expected = torch.zeros_like(x).index_add(0, edge_index[1].long(), weight[:, None] * x[edge_index[0].long()])
    torch.testing.assert_close(torchops.spmm_reduce(crow, col, weight[perm], x), expected)


def test_to_csr_refuses_bad_input() -> None:
    with pytest.raises(RuntimeError, match=r"torchops.graph.to_csr: edge_index must be a \(2, E\) tensor, got \[3, 4\]"):
        torchops.graph.to_csr(torch.zeros(3, 4, dtype=torch.long), 5)
    with pytest.raises(RuntimeError, match=r"must hold integers, got torch.float32"):
        torchops.graph.to_csr(torch.zeros(2, 4), 5)
    with pytest.raises(RuntimeError, match=r"must lie in \[0, num_nodes\) with num_nodes = 5, got 5"):
        torchops.graph.to_csr(torch.tensor([[0, 1], [5, 2]]), 5)
    with pytest.raises(RuntimeError, match=r"got -1"):
        torchops.graph.to_csr(torch.tensor([[0, -1], [1, 2]]), 5)
    crow, col, perm = torchops.graph.to_csr(torch.zeros(2, 0, dtype=torch.long), 3)
    assert crow.tolist() == [0, 0, 0, 0] and col.numel() == perm.numel() == 0


# ------------------------------------------------------------------------------------------ the GAT layer

def dense_gat(layer: torch.nn.Module, crow: torch.Tensor, col: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The same layer over a dense adjacency: a masked softmax per head (one edge per (i, j))."""
    n = x.size(0)
    adjacency = torch.zeros(n, n, dtype=torch.bool, device=x.device)
    adjacency[rows_of(crow), col.long()] = True
    h = layer.lin(x).view(n, layer.heads, layer.head_features)
    src, dst = (h * layer.att_src).sum(-1), (h * layer.att_dst).sum(-1)
    scores = F.leaky_relu(dst.t()[:, :, None] + src.t()[:, None, :], layer.negative_slope)  # (heads, i, j)
    p = torch.softmax(scores.masked_fill(~adjacency, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("hij,jhd->ihd", p, h).reshape(n, -1) + layer.bias


@pytest.mark.parametrize("device", DEVICES)
def test_gat_layer_matches_a_dense_reference_and_plain_pytorch(device: str) -> None:
    from torchops.demo import GATLayer

    torch.manual_seed(0)
    crow, col = unique_power_law(50, 50, 400, device=device, seed=3)
    x = torch.randn(50, 12, dtype=F64, device=device)
    ours = GATLayer(12, 4, 8, use_torchops=True).to(device, F64)
    plain = GATLayer(12, 4, 8, use_torchops=False).to(device, F64)
    plain.load_state_dict(ours.state_dict())
    for layer in (ours, plain):
        out = layer(crow, col, x)
        torch.testing.assert_close(out, dense_gat(layer, crow, col, x))
    xs = x.clone().requires_grad_()
    grads = [torch.autograd.grad(layer(crow, col, xs).pow(2).sum(), [xs, *layer.parameters()]) for layer in (ours, plain)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_gat_layer_compiles_one_graph_for_every_graph_size() -> None:
    import torch._dynamo.testing
    from torchops.demo import GATLayer

    torch._dynamo.reset()
    layer = GATLayer(8, 2, 4, use_torchops=True)
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(layer, backend=counter, fullgraph=True, dynamic=True)
    for n, nnz in ((20, 90), (33, 150), (47, 300)):  # other node and edge counts: no recompilation
        crow, col = unique_power_law(n, n, nnz, device="cpu", seed=n)
        x = torch.randn(n, 8, requires_grad=True)
        out = compiled(crow, col, x)
        torch.testing.assert_close(out, layer(crow, col, x))
        out.sum().backward()
    assert counter.frame_count == 1


def _torch_geometric():
    try:
        import torch_geometric  # noqa: F401
        from torch_geometric.nn import GATConv
    except Exception:  # not installed (it is a peer of the benchmark, not a dependency)
        return None
    return GATConv


@pytest.mark.skipif(_torch_geometric() is None, reason="torch_geometric is not installed")
@pytest.mark.parametrize("device", DEVICES)
def test_gat_layer_equals_torch_geometric_gatconv(device: str) -> None:
    from torchops.demo import GATLayer

    GATConv = _torch_geometric()
    torch.manual_seed(0)
    n = 60
    edge_index = torch.randint(0, n, (2, 500), device=device)
    conv = GATConv(16, 8, heads=4, add_self_loops=True).to(device, F64)
    loops = torch.arange(n, device=device).expand(2, n)
    ours = GATLayer(16, 4, 8, use_torchops=True).to(device, F64)
    with torch.no_grad():
        ours.lin.weight.copy_(conv.lin.weight)
        ours.att_src.copy_(conv.att_src.view(4, 8))
        ours.att_dst.copy_(conv.att_dst.view(4, 8))
        ours.bias.copy_(conv.bias)
    x = torch.randn(n, 16, dtype=F64, device=device)
    # GATConv drops the self-loops edge_index has and adds one per node: the same graph in CSR.
    keep = edge_index[0] != edge_index[1]
    crow, col, _ = torchops.graph.to_csr(torch.cat([edge_index[:, keep], loops], 1), n)
    torch.testing.assert_close(ours(crow, col, x), conv(x, edge_index))


# ---------------------------------------------------------------------------------------------- CUDA

def assert_cuda_matches_f64(crow, col, values, dense, reduce: str) -> None:
    """spmm_reduce on CUDA against the float64 reference on the CPU; for max/min also the positions (the
    16-bit products are exact in f32, so the first maximum is the same one)."""
    got = torchops.spmm_reduce(crow, col, values, dense, reduce)
    args = tuple(None if t is None else t.cpu().double() if t.is_floating_point() else t.cpu()
                 for t in (crow, col, values, dense))
    expected = spmm_reduce_reference(*args, reduce)
    dtype = dense.dtype
    tol = dict(rtol=1e-3, atol=1e-3) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-9)
    if dtype in HALF_DTYPES:
        tol = dict(rtol=2e-2, atol=2e-2 * max(float(expected.abs().max()), 1.0))
    torch.testing.assert_close(got.cpu().double(), expected, **tol)
    if reduce in ("max", "min") and dtype != torch.float32:
        arg = torch.ops.myns._spmm_reduce_forward(crow, col, values, dense, reduce)[1]
        assert torch.equal(arg.cpu(), spmm_reduce_arg_reference(*args, reduce))


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("n", [1, 4, 32, 64, 128, 200, 512])
def test_cuda_power_law_rows_every_reduce(dtype: torch.dtype, reduce: str, n: int) -> None:
    # A few rows of 20000 nonzeros among thousands of short ones: many work units share a row (the carries).
    crow, col = power_law_csr(3000, 2500, 30000, device="cuda", long_len=20000, seed=6)
    values = torch.randn(col.numel(), device="cuda", dtype=dtype)
    assert_cuda_matches_f64(crow, col, values, torch.randn(2500, n, device="cuda", dtype=dtype), reduce)
    assert_cuda_matches_f64(crow, col, None, torch.randn(2500, n, device="cuda", dtype=dtype), reduce)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("heads,d", [(8, 64), (4, 33), (3, 1), (40, 8)])
def test_cuda_heads(dtype: torch.dtype, reduce: str, heads: int, d: int) -> None:
    crow, col = power_law_csr(2000, 1500, 20000, device="cuda", long_len=6000, seed=7, index_dtype=torch.int32)
    values = torch.randn(col.numel(), heads, device="cuda", dtype=dtype)
    dense = torch.randn(1500, heads, d, device="cuda", dtype=dtype)
    assert_cuda_matches_f64(crow, col, values, dense, reduce)
    assert_cuda_matches_f64(crow, col, values[:, 0].contiguous(), dense, reduce)  # one weight for every head


@requires_cuda
@pytest.mark.parametrize("reduce", REDUCES)
def test_cuda_gradients_match_the_cpu(reduce: str) -> None:
    crow, col = power_law_csr(1500, 1200, 15000, device="cpu", long_len=5000, seed=8)
    values = torch.randn(col.numel(), 4, dtype=F64)
    dense = torch.randn(1200, 4, 16, dtype=F64)
    g = torch.randn(1500, 4, 16, dtype=F64)
    results = []
    for device in ("cpu", "cuda"):
        v, d = (t.to(device, copy=True).requires_grad_() for t in (values, dense))  # leaves on either device
        out = torchops.spmm_reduce(crow.to(device), col.to(device), v, d, reduce)
        out.backward(g.to(device))
        results.append((out.cpu(), v.grad.cpu(), d.grad.cpu()))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@requires_cuda
def test_cuda_max_ties_across_work_units_pick_the_first_position() -> None:
    # One row of 30000 equal products: spread over many units, the first position must still win.
    crow = torch.tensor([0, 5, 30005, 30010], device="cuda")
    col = torch.zeros(30010, dtype=torch.long, device="cuda")
    dense = torch.randn(1, 64, device="cuda")
    for reduce in ("max", "min"):
        out, arg = torch.ops.myns._spmm_reduce_forward(crow, col, None, dense, reduce)
        assert arg[:, 0].tolist() == [0, 5, 30005]
        torch.testing.assert_close(out, dense.expand(3, 64))


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("heads", [None, 1, 3, 8, 40])
def test_cuda_sddmm_and_softmax_on_power_law_rows(dtype: torch.dtype, heads: int | None) -> None:
    crow, col = power_law_csr(3000, 2500, 30000, device="cuda", long_len=20000, seed=9)
    rows = rows_of(crow.cpu())
    h = () if heads is None else (heads,)
    tol = dict(rtol=1e-3, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    if dtype == F64:
        tol = dict(rtol=1e-10, atol=1e-12)
    for op, d in (("dot", (64,)), ("dot", (7,)), ("add", ()), ("mul", ())):
        a = torch.randn(3000, *h, *d, device="cuda", dtype=dtype)
        b = torch.randn(2500, *h, *d, device="cuda", dtype=dtype)
        got = torchops.sddmm(crow, col, a, b, op)
        x, y = a.cpu().double()[rows], b.cpu().double()[col.cpu().long()]
        expected = (x * y).sum(-1) if op == "dot" else x + y if op == "add" else x * y
        torch.testing.assert_close(got.cpu().double(), expected, **tol)
    values = torch.randn(col.numel(), *h, device="cuda", dtype=dtype) * 4
    out = torchops.csr_softmax(crow, values)
    torch.testing.assert_close(out.cpu().double(), csr_softmax_reference(crow.cpu(), values.cpu().double()), **tol)
    g = torch.randn_like(values)
    leaf = values.detach().requires_grad_()
    (grad,) = torch.autograd.grad(torchops.csr_softmax(crow, leaf), leaf, g)
    ref_leaf = values.cpu().double().requires_grad_()
    (expected,) = torch.autograd.grad(csr_softmax_reference(crow.cpu(), ref_leaf), ref_leaf, g.cpu().double())
    torch.testing.assert_close(grad.cpu().double(), expected, **tol)


@requires_cuda
def test_cuda_results_are_deterministic() -> None:
    crow, col = power_law_csr(5000, 4000, 100000, device="cuda", long_len=30000, seed=10)
    values = torch.randn(col.numel(), 2, device="cuda", requires_grad=True)
    dense = torch.randn(4000, 2, 32, device="cuda", requires_grad=True)
    for reduce in REDUCES:
        runs = []
        for _ in range(2):
            out = torchops.spmm_reduce(crow, col, values, dense, reduce)
            runs.append((out, *torch.autograd.grad(out, (values, dense), torch.ones_like(out))))
            s = torchops.csr_softmax(crow, values)
            runs[-1] += (s, *torch.autograd.grad(s, (values,), torch.ones_like(s)))
        for a, b in zip(*runs):
            assert torch.equal(a, b), reduce


_CUDA_MALFORMED = [  # crow, col, K: indices the CUDA kernels never validate
    ([0, 2, 3], [0, 7, 1], 3),              # col >= K
    ([0, 2, 3], [0, -5, 1], 3),             # negative col
    ([0, 3, 1, 3], [0, 2, 1], 3),           # crow decreasing
    ([0, 2, 9], [0, 2, 1], 3),              # crow[M] > nnz
    ([-4, 2, 3], [0, 2, 1], 3),             # crow[0] < 0
    ([0, 2**31 - 1, 3], [0, 2, 1], 3),      # huge offset
    ([5, 1, 0], [0, 2, 1], 3),              # everything backwards
]


@requires_cuda
@pytest.mark.parametrize("index_dtype", INT_DTYPES)
@pytest.mark.parametrize("crow,col,k", _CUDA_MALFORMED)
def test_cuda_malformed_indices_do_not_crash(index_dtype, crow, col, k) -> None:
    # every sparse op (csr_spmm included) on indices no CUDA kernel validates: any result, but no fault
    crow = torch.tensor(crow, dtype=index_dtype, device="cuda")
    col = torch.tensor(col, dtype=index_dtype, device="cuda")
    m = crow.numel() - 1
    for n in (1, 32, 128, 512):
        dense = torch.randn(k, 2, n, device="cuda")
        values = torch.randn(col.numel(), 2, device="cuda", requires_grad=True)
        for reduce in REDUCES:
            out = torchops.spmm_reduce(crow, col, values, dense, reduce)  # result unspecified, but in bounds
            out.sum().backward()
        torchops.sddmm(crow, col, torch.randn(m, 2, n, device="cuda"), dense)
        torchops.sddmm(crow, col, torch.randn(m, 2, device="cuda"), dense[..., 0], "add")
        torchops.csr_softmax(crow, values.detach()).sum()
        torch.ops.myns._csr_softmax_backward(crow, values.detach(), values.detach())
        torchops.csr_spmm(crow, col, values.detach()[:, 0].contiguous(), dense[:, 0].contiguous())
    torch.ops.myns._csr_transpose(crow, col, k)
    torch.cuda.synchronize()  # a device-side fault would surface here
    x = torch.randn(1000, device="cuda")
    torch.testing.assert_close(torchops.vector_add(x, x).cpu(), 2 * x.cpu())  # the context still works


@requires_cuda
def test_cuda_matches_cpu_for_strided_operands() -> None:
    crow, col = power_law_csr(200, 150, 3000, device="cpu", long_len=900, seed=11)
    values = torch.randn(col.numel(), 3)
    for dense in (torch.randn(150, 3, 96), torch.randn(150, 96, 3).transpose(1, 2), torch.randn(150, 4, 100)[:, 1:, 2:98]):
        for reduce in REDUCES:
            cpu = torchops.spmm_reduce(crow, col, values, dense, reduce)
            cuda = torchops.spmm_reduce(crow.cuda(), col.cuda(), values.cuda(), dense.cuda(), reduce)
            torch.testing.assert_close(cuda.cpu(), cpu, rtol=1e-4, atol=1e-4)
