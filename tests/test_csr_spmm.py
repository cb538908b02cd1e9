"""csr_spmm specifics the generic tables don't express: agreement with torch.sparse on larger power-law
matrices, the Python wrappers (check_invariants, spmm on a sparse CSR tensor and its transpose cache),
deterministic gradients, double backward, and on CUDA: malformed indices that must not crash, power-law
row lengths, wide N and run-to-run determinism of the forward."""

from __future__ import annotations

import pytest
import torch

import torchops
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import DEVICES, FLOAT_DTYPES, HALF_DTYPES, HAS_CUDA, INT_DTYPES, requires_cuda
from op_db import _csr_indices, csr_spmm_reference, csr_transpose_reference
from torchops import ops as torchops_ops

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float64: dict(rtol=1e-10, atol=1e-10),
       torch.bfloat16: dict(rtol=3e-2, atol=3e-2), torch.float16: dict(rtol=5e-3, atol=5e-3)}


def power_law_csr(m: int, k: int, nnz: int, *, device: str, index_dtype=torch.int64, long_rows: int = 3,
                  long_len: int = 0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows with Zipf-like lengths summing to about nnz, plus `long_rows` rows of `long_len` nonzeros."""
    g = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, m + 1, dtype=torch.float64) ** 1.1
    lens = torch.distributions.Multinomial(nnz, probs=weights / weights.sum()).sample().long() if nnz else torch.zeros(m, dtype=torch.long)
    lens = lens[torch.randperm(m, generator=g)]
    if long_len:
        lens[torch.randperm(m, generator=g)[:long_rows]] = long_len
    crow = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lens, 0)])
    col = torch.randint(0, k, (int(crow[-1]),), generator=g)
    return crow.to(index_dtype).to(device), col.to(index_dtype).to(device)


def torch_sparse(crow, col, values, k):
    return torch.sparse_csr_tensor(crow.long(), col.long(), values, (crow.numel() - 1, k))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_matches_torch_sparse_mm_on_power_law(device: str, dtype: torch.dtype) -> None:
    crow, col = power_law_csr(500, 300, 6000, device=device, index_dtype=torch.int32, long_len=700)
    values = torch.randn(col.numel(), device=device, dtype=dtype)
    for n in (1, 7, 32, 64, 128):
        dense = torch.randn(300, n, device=device, dtype=dtype)
        got = torchops.csr_spmm(crow, col, values, dense)
        expected = torch_sparse(crow.cpu(), col.cpu(), values.cpu().double(), 300) @ dense.cpu().double()
        torch.testing.assert_close(got.cpu().double(), expected, **TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_indices_and_values(device: str) -> None:
    crow, col = power_law_csr(50, 40, 400, device=device)
    values = torch.randn(col.numel(), 2, device=device)[:, 1]  # stride 2
    col_strided = torch.stack([col, col], 1)[:, 0]
    crow_strided = torch.stack([crow, crow], 1)[:, 1]
    dense = torch.randn(40, 16, device=device)
    expected = csr_spmm_reference(crow.cpu(), col.cpu(), values.cpu().double(), dense.cpu().double())
    got = torchops.csr_spmm(crow_strided, col_strided, values, dense)
    torch.testing.assert_close(got.cpu().double(), expected, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------- check_invariants

_MALFORMED = [  # crow, col, K, message
    ([1, 2, 3], [0, 2, 1], 3, r"crow_indices\[0\] must be 0, got 1"),
    ([0, 3, 2, 3], [0, 2, 1], 3, r"crow_indices must be non-decreasing, got crow_indices\[1\] = 3 > crow_indices\[2\] = 2"),
    ([0, 2, 4], [0, 2, 1], 3, r"crow_indices\[-1\] must equal nnz = 3 \(the length of col_indices\), got 4"),
    ([0, 2, 3], [0, 3, 1], 3, r"col_indices must lie in \[0, K\) with K = 3, got col_indices\[1\] = 3"),
    ([0, 2, 3], [0, -2, 1], 3, r"col_indices must lie in \[0, K\) with K = 3, got col_indices\[1\] = -2"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", INT_DTYPES)
@pytest.mark.parametrize("crow,col,k,message", _MALFORMED)
def test_check_invariants_raises_on_every_device(device, index_dtype, crow, col, k, message) -> None:
    crow = torch.tensor(crow, dtype=index_dtype, device=device)
    col = torch.tensor(col, dtype=index_dtype, device=device)
    values, dense = torch.randn(col.numel(), device=device), torch.randn(k, 4, device=device)
    with pytest.raises(RuntimeError, match=r"myns::csr_spmm: " + message):
        torchops.csr_spmm(crow, col, values, dense, check_invariants=True)
    if device == "cpu":  # the CPU kernel validates without being asked, with the same words
        with pytest.raises(RuntimeError, match=r"myns::csr_spmm: " + message):
            torchops.csr_spmm(crow, col, values, dense)


@pytest.mark.parametrize("device", DEVICES)
def test_check_invariants_passes_valid_input_and_leaves_metadata_errors_to_the_op(device: str) -> None:
    crow, col = _csr_indices([[0, 2], [], [1]], torch.int32, device)
    values, dense = torch.randn(3, device=device), torch.randn(3, 5, device=device)
    torch.testing.assert_close(torchops.csr_spmm(crow, col, values, dense, check_invariants=True),
                               torchops.csr_spmm(crow, col, values, dense))
    with pytest.raises(RuntimeError, match=r"myns::csr_spmm: crow_indices must be 1-D"):
        torchops.csr_spmm(crow.view(1, -1), col, values, dense, check_invariants=True)


def test_check_invariants_leaves_a_dense_that_is_not_2d_to_the_op() -> None:
    crow, col = _csr_indices([[0, 2], [], [1]], torch.int64, "cpu")
    for dense in (torch.randn(3), torch.randn(3, 2, 1), torch.tensor(1.0)):
        with pytest.raises(RuntimeError, match=r"myns::csr_spmm: dense must be 2-D, got shape"):
            torchops.csr_spmm(crow, col, torch.randn(3), dense, check_invariants=True)


def test_check_invariants_skips_the_data_checks_on_meta_and_fake_tensors() -> None:
    # Malformed structure (col 7 >= K = 3): only a check that reads the data could see it.
    crow, col = torch.tensor([0, 2, 3]), torch.tensor([0, 7, 1])
    values, dense = torch.randn(3), torch.randn(3, 4)
    meta = [t.to("meta") for t in (crow, col, values, dense)]
    out = torchops.csr_spmm(*meta, check_invariants=True)
    assert out.device.type == "meta" and out.shape == (2, 4)
    with pytest.raises(RuntimeError, match=r"myns::csr_spmm: dense must be 2-D"):  # metadata still checked
        torchops.csr_spmm(*meta[:3], meta[3][0], check_invariants=True)

    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (crow, col, values, dense)]
        out = torchops.csr_spmm(*fake, check_invariants=True)
        assert out.shape == (2, 4)
        with pytest.raises(RuntimeError, match=r"myns::csr_spmm: dense must be 2-D"):
            torchops.csr_spmm(*fake[:3], fake[3][0], check_invariants=True)


# ------------------------------------------------------------------------------------------- spmm(A, dense)

@pytest.mark.parametrize("device", DEVICES)
def test_spmm_sparse_csr_tensor_forward_and_grads(device: str) -> None:
    crow, col = power_law_csr(60, 45, 500, device=device, seed=3)
    values = torch.randn(col.numel(), device=device, dtype=torch.float64)
    A = torch.sparse_csr_tensor(crow, col, values, (60, 45)).requires_grad_()
    dense = torch.randn(45, 9, device=device, dtype=torch.float64, requires_grad=True)
    out = torchops.spmm(A, dense)
    w = torch.randn_like(out)
    (out * w).sum().backward()

    A_ref = torch_sparse(crow, col, values, 45).to_dense().requires_grad_()
    dense_ref = dense.detach().clone().requires_grad_()
    ref = A_ref @ dense_ref
    (ref * w).sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(dense.grad, dense_ref.grad)
    assert A.grad is not None and A.grad.layout == torch.sparse_csr
    rows = torch.repeat_interleave(torch.arange(60, device=device), crow[1:] - crow[:-1])
    torch.testing.assert_close(A.grad.values(), A_ref.grad[rows, col])


@pytest.mark.parametrize("device", DEVICES)
def test_spmm_caches_the_transpose_per_tensor(device: str) -> None:
    crow, col = power_law_csr(30, 20, 200, device=device, seed=4)
    A = torch.sparse_csr_tensor(crow, col, torch.randn(col.numel(), device=device), (30, 20))
    dense = torch.randn(20, 8, device=device, requires_grad=True)
    torchops.spmm(A, dense).sum().backward()
    first = torchops_ops._STRUCTURE_CACHE[A].transpose()
    grad_first = dense.grad.clone()
    dense.grad = None
    torchops.spmm(A, dense).sum().backward()
    assert torchops_ops._STRUCTURE_CACHE[A].transpose()[0] is first[0], "the second call must reuse the transpose"
    torch.testing.assert_close(dense.grad, grad_first, rtol=0, atol=0)
    expected = csr_transpose_reference(crow.cpu(), col.cpu(), 20)
    for got, exp in zip(first, expected):
        torch.testing.assert_close(got.cpu(), exp)
    # No gradient wanted: no transpose computed.
    B = torch.sparse_csr_tensor(crow, col, torch.randn(col.numel(), device=device), (30, 20))
    torchops.spmm(B, dense.detach())
    assert B not in torchops_ops._STRUCTURE_CACHE
    # A gradient for A alone: its structure copied, no transpose computed.
    B.requires_grad_()
    torchops.spmm(B, dense.detach()).sum().backward()
    assert torchops_ops._STRUCTURE_CACHE[B]._transpose is None
    # Indices changed in place: recomputed.
    A.col_indices().copy_(torch.flip(A.col_indices(), [0]))
    dense.grad = None
    torchops.spmm(A, dense).sum().backward()
    assert torchops_ops._STRUCTURE_CACHE[A].transpose()[0] is not first[0]


class _CountCalls(TorchDispatchMode):
    def __init__(self, op: torch._ops.OpOverload) -> None:
        super().__init__()
        self.op, self.count = op, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is self.op
        return func(*args, **(kwargs or {}))


def _spmm_dense_grad(A: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    dense = dense.detach().requires_grad_()
    torchops.spmm(A, dense).sum().backward()
    return dense.grad


def _expected_dense_grad(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, k: int, n: int) -> torch.Tensor:
    a = torch_sparse(crow.cpu(), col.cpu(), values.cpu().double(), k).to_dense()
    return (a.t() @ torch.ones(a.size(0), n, dtype=torch.float64)).to(values.device, values.dtype)


def test_spmm_transpose_cache_sees_changes_through_the_tensors_a_was_built_from() -> None:
    # An in-place change through the index tensors A was built from shares A's memory but bumps no version
    # counter A can see: the transpose must be recomputed all the same.
    crow, col, values = torch.tensor([0, 2, 3, 4]), torch.tensor([0, 1, 2, 0]), torch.tensor([1., 2, 3, 4])
    A = torch.sparse_csr_tensor(crow, col, values, (3, 3))
    d = torch.ones(3, 1)
    torch.testing.assert_close(_spmm_dense_grad(A, d), torch.tensor([[5.], [2.], [3.]]))
    col.copy_(torch.tensor([0, 2, 2, 1]))  # the repro: the old code's backward gave [5, 2, 3]
    torch.testing.assert_close(_spmm_dense_grad(A, d), torch.tensor([[1.], [4.], [5.]]))
    crow.copy_(torch.tensor([0, 1, 3, 4]))  # now row 0 = {0}, row 1 = {2, 2}, row 2 = {1}
    torch.testing.assert_close(_spmm_dense_grad(A, d), _expected_dense_grad(crow, col, values, 3, 1))
    torch.testing.assert_close(torchops.spmm(A, d), torch_sparse(crow, col, values, 3) @ d)


@pytest.mark.parametrize("device", DEVICES)
def test_spmm_transpose_cache_is_reused_until_the_indices_change(device: str) -> None:
    crow, col = power_law_csr(30, 20, 200, device=device, seed=11)
    values = torch.randn(col.numel(), device=device, dtype=torch.float64)
    A = torch.sparse_csr_tensor(crow, col, values, (30, 20))
    dense = torch.randn(20, 8, device=device, dtype=torch.float64)
    counter = _CountCalls(torch.ops.myns._csr_transpose.default)
    with counter:
        grads = [_spmm_dense_grad(A, dense) for _ in range(3)]
    assert counter.count == 1, "an unchanged A must reuse its transpose"
    for g in grads:
        torch.testing.assert_close(g, _expected_dense_grad(crow, col, values, 20, 8))
    # Changed in place by each route: through the tensors A was built from and through A's own.
    changes = [lambda: col.copy_(torch.flip(col, [0])),
               lambda: A.col_indices()[:5].copy_(torch.arange(5, device=device)),
               lambda: crow[1:-1].copy_(torch.sort(torch.randint(0, col.numel() + 1, (29,), device=device)).values),
               lambda: A.crow_indices()[1:-1].copy_(torch.linspace(0, col.numel(), 31, device=device)[1:-1].long())]
    for i, change in enumerate(changes):
        change()
        with counter:
            got = _spmm_dense_grad(A, dense)
            _spmm_dense_grad(A, dense)
        assert counter.count == 2 + i, f"change {i}: one new transpose, then reused"
        torch.testing.assert_close(got, _expected_dense_grad(crow, col, values, 20, 8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dense_grad", [True, False])
def test_spmm_backward_uses_the_structure_the_forward_used(device: str, dense_grad: bool) -> None:
    # A's column indices changed in place (through the tensor A was built from) between forward and
    # backward: both gradients are those of the product the forward computed (the old code gave dense's
    # gradient by the old structure, through the cached transpose, and A's by the new one).
    crow, col = torch.tensor([0, 2, 3, 5], device=device), torch.tensor([0, 2, 1, 0, 3], device=device)
    values = torch.randn(5, device=device, dtype=torch.float64)
    A = torch.sparse_csr_tensor(crow, col, values, (3, 4)).requires_grad_()
    dense = torch.randn(4, 6, device=device, dtype=torch.float64, requires_grad=dense_grad)
    ref_values = values.clone().requires_grad_()
    ref_dense = dense.detach().clone().requires_grad_(dense_grad)
    ref = torchops.csr_spmm(crow.clone(), col.clone(), ref_values, ref_dense)
    out = torchops.spmm(A, dense)
    torch.testing.assert_close(out, ref)
    col.copy_(torch.tensor([1, 3, 0, 2, 3], device=device))  # still valid: sorted distinct columns per row
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(A.grad.values(), ref_values.grad)
    if dense_grad:
        torch.testing.assert_close(dense.grad, ref_dense.grad)


def test_spmm_rejects_non_csr() -> None:
    with pytest.raises(RuntimeError, match=r"torchops.spmm: A must be a 2-D sparse CSR tensor"):
        torchops.spmm(torch.randn(3, 3), torch.randn(3, 2))
    A = torch.sparse_csr_tensor(torch.tensor([0, 1]), torch.tensor([0]), torch.ones(1), (1, 3))
    with pytest.raises(RuntimeError, match=r"torchops.spmm: A is 1 x 3 but dense has 4 rows"):
        torchops.spmm(A, torch.randn(4, 2))


# ------------------------------------------------------------------------------- determinism, double backward

@pytest.mark.parametrize("device", DEVICES)
def test_dense_grad_is_bit_identical_in_deterministic_mode(device: str) -> None:
    crow, col = power_law_csr(400, 300, 8000, device=device, long_len=2000, seed=5)
    values = torch.randn(col.numel(), device=device)
    grad_out = torch.randn(400, 64, device=device)
    dense0 = torch.randn(300, 64, device=device)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        grads = []
        for _ in range(2):
            dense, v = dense0.clone().requires_grad_(), values.clone().requires_grad_()
            torchops.csr_spmm(crow, col, v, dense).backward(grad_out)
            grads.append((dense.grad, v.grad))
    finally:
        torch.use_deterministic_algorithms(was)
    assert torch.equal(grads[0][0], grads[1][0])
    assert torch.equal(grads[0][1], grads[1][1])
    a = csr_spmm_reference(crow.cpu(), col.cpu(), values.cpu().double(), torch.eye(300, dtype=torch.float64))
    torch.testing.assert_close(grads[0][0].cpu().double(), a.t() @ grad_out.cpu().double(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward(device: str) -> None:
    crow, col = _csr_indices([[0, 2, 2], [], [1, 3], [3]], torch.int64, device)
    values = torch.randn(6, device=device, dtype=torch.float64, requires_grad=True)
    dense = torch.randn(4, 3, device=device, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda v, d: torchops.csr_spmm(crow, col, v, d), (values, dense))


# ---------------------------------------------------------------------------------------------------- CUDA

def assert_cuda_matches_f64(crow: torch.Tensor, col: torch.Tensor, k: int, n: int, dtype: torch.dtype) -> None:
    """csr_spmm on CUDA against the float64 product on the CPU, for random values and dense (k x n)."""
    values = torch.randn(col.numel(), device="cuda", dtype=dtype)
    dense = torch.randn(k, n, device="cuda", dtype=dtype)
    got = torchops.csr_spmm(crow, col, values, dense)
    expected = torch_sparse(crow.cpu(), col.cpu(), values.cpu().double(), k) @ dense.cpu().double()
    tol = dict(rtol=1e-3, atol=1e-3) if dtype == torch.float32 else TOL[dtype]
    if dtype in HALF_DTYPES:  # sums of up to 20000 terms: compare relative to the scale
        tol = dict(rtol=2e-2, atol=2e-2 * float(expected.abs().max()))
    torch.testing.assert_close(got.cpu().double(), expected, **tol)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", [4, 16, 32, 48, 64, 128, 256, 512, 33, 1100])  # every lane-group width
def test_cuda_power_law_rows(dtype: torch.dtype, n: int) -> None:
    # A few rows of 20000 nonzeros among thousands of short ones: many work units share a row.
    crow, col = power_law_csr(3000, 2500, 30000, device="cuda", long_len=20000, seed=6)
    assert_cuda_matches_f64(crow, col, 2500, n, dtype)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [256, 512, 1024, 1100])  # f32: 2, 4, 8, 9 tiles; bf16: 1, 2, 4 tiles, and narrower vectors
def test_cuda_long_rows_take_column_tiles(dtype: torch.dtype, n: int) -> None:
    # Long rows (>= 32 nonzeros per row on average) at wide N: each column tile's units split and carry them.
    crow, col = power_law_csr(1000, 2000, 60000, device="cuda", long_len=20000, seed=10)
    assert col.numel() >= 32 * 1000
    assert_cuda_matches_f64(crow, col, 2000, n, dtype)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [128, 520])  # 520: the last column tile partly filled
def test_cuda_long_rows_over_a_dense_larger_than_l2(dtype: torch.dtype, n: int) -> None:
    # Rows of >= 128 nonzeros on average gathering from a `dense` whose 32-lane column tile (K rows of
    # 512 bytes) is twice the L2: the forward narrows its lane groups, to 2..17 column tiles here.
    k = torch.cuda.get_device_properties(0).L2_cache_size // 256
    crow, col = power_law_csr(200, k, 40000, device="cuda", long_len=5000, seed=12)
    assert col.numel() >= 128 * 200
    assert_cuda_matches_f64(crow, col, k, n, dtype)


@requires_cuda
def test_cuda_forward_and_backward_are_deterministic() -> None:
    crow, col = power_law_csr(5000, 4000, 100000, device="cuda", long_len=30000, seed=7)
    values = torch.randn(col.numel(), device="cuda", requires_grad=True)
    for n in (32, 128):  # lanes split into groups of 8, and whole warps
        dense = torch.randn(4000, n, device="cuda", requires_grad=True)
        runs = []
        for _ in range(2):
            out = torchops.csr_spmm(crow, col, values, dense)
            gv, gd = torch.autograd.grad(out, (values, dense), torch.ones_like(out))
            runs.append((out, gv, gd))
        for a, b in zip(*runs):
            assert torch.equal(a, b)


@requires_cuda
def test_cuda_matches_cpu_on_every_layout() -> None:
    crow, col = power_law_csr(200, 150, 3000, device="cpu", long_len=900, seed=8)
    values = torch.randn(col.numel())
    for dense in (torch.randn(150, 96), torch.randn(96, 150).t(), torch.randn(150, 200)[:, 3:99]):
        cpu = torchops.csr_spmm(crow, col, values, dense)
        cuda = torchops.csr_spmm(crow.cuda(), col.cuda(), values.cuda(), dense.cuda())
        torch.testing.assert_close(cuda.cpu(), cpu, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_runs_on_the_current_stream() -> None:
    crow, col = power_law_csr(100, 80, 2000, device="cuda", seed=9)
    values = torch.randn(col.numel(), device="cuda")
    dense = torch.zeros(80, 64, device="cuda")
    src = torch.randn(80, 64, device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        dense.copy_(src)
        out = torchops.csr_spmm(crow, col, values, dense)
    side.synchronize()
    torch.testing.assert_close(out, torch_sparse(crow, col, values, 80) @ src, rtol=1e-4, atol=1e-4)
