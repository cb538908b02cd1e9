"""op_db rows of the csr ops."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from helpers import FLOAT_DTYPES, INT_DTYPES, make_layout, random_tensor
from op_db.core import ErrorInput, OpInfo, Sample, _grad, expect  # noqa: F401
from op_db.elementwise import _CUDA_VS_CPU  # noqa: F401


# ------------------------------------------------------------------------------------------------ csr_spmm
# A CSR matrix is given by its rows' column lists; values are random. The cases: an empty row, unsorted and
# duplicate columns within a row, one row much longer than the others (several CUDA work units, so the
# carry path runs), nnz = 0, M = 0, K = 0, N = 0 / 1 / odd / a multiple of 4 / wide (column tiles), and
# dense transposed, column-sliced (copied) and row-sliced (read in place through its row stride).
def _rows_random(m: int, k: int, max_len: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, max_len + 1, (m,), generator=g).tolist()
    return [torch.randint(0, k, (n,), generator=g).tolist() if k else [] for n in lens]


def _rows_long(m: int, k: int, long_len: int) -> list[list[int]]:
    rows = [[(3 * i + 1) % k] for i in range(m)]
    rows[2] = [(7 * j) % k for j in range(long_len)]  # wraps around: duplicates too
    rows[4] = []
    return rows


_CSR_CASES: list[tuple[str, list[list[int]], int, int, str]] = [  # desc, rows, K, N, dense layout
    ("general", [[1, 4, 2], [], [6, 0, 6], [3], [5, 1, 0, 2]], 7, 8, "contiguous"),  # unsorted, duplicates, empty row
    ("odd N", [[1, 4, 2], [], [6, 0, 6], [3], [5, 1, 0, 2]], 7, 3, "contiguous"),
    ("N=1", [[0, 2], [1], [], [2, 2]], 3, 1, "contiguous"),
    ("nnz=0", [[], [], [], []], 3, 5, "contiguous"),
    ("M=0", [], 3, 4, "contiguous"),
    ("K=0", [[], []], 0, 4, "contiguous"),
    ("N=0", [[0], [1, 0]], 2, 0, "contiguous"),
    ("long row", _rows_long(9, 20, 150), 20, 4, "contiguous"),
    ("random", _rows_random(40, 30, 9, 1), 30, 33, "contiguous"),
    ("random N=64", _rows_random(37, 25, 12, 2), 25, 64, "contiguous"),
    ("random wide N", _rows_random(12, 10, 6, 3), 10, 520, "contiguous"),
    ("dense transposed", _rows_random(9, 11, 5, 4), 11, 6, "transposed"),
    ("dense column-sliced", _rows_random(9, 11, 5, 5), 11, 8, "sliced"),
    ("dense row-sliced", _rows_random(9, 11, 5, 6), 11, 12, "row-sliced"),
    ("dense misaligned", _rows_random(9, 11, 5, 7), 11, 16, "offset"),
]


def _csr_indices(rows: list[list[int]], index_dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    lens = torch.tensor([0] + [len(r) for r in rows], dtype=torch.int64)
    crow = torch.cumsum(lens, 0).to(index_dtype)
    col = torch.tensor([c for r in rows for c in r], dtype=index_dtype)
    return crow.to(device), col.to(device)


def _dense(k: int, n: int, dtype: torch.dtype, device: str, layout: str) -> torch.Tensor:
    if layout == "row-sliced":  # columns contiguous, row stride n + 5, misaligned start
        return random_tensor((k, n + 5), dtype, device)[:, 3:3 + n]
    return make_layout((k, n), dtype, device, layout)


def _index_dtype(i: int) -> torch.dtype:
    return INT_DTYPES[i % 2]  # the cases alternate int32 and int64 indices


def csr_spmm_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for i, (desc, rows, k, n, layout) in enumerate(_CSR_CASES):
        crow, col = _csr_indices(rows, _index_dtype(i), device)
        values = _grad(random_tensor((col.numel(),), dtype, device), requires_grad)
        dense = _grad(_dense(k, n, dtype, device, layout), requires_grad)
        samples.append(Sample((crow, col, values, dense), desc=f"{desc} ({col.dtype})"))
    return samples


def _csr_rows(crow: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(crow.numel() - 1), (crow[1:] - crow[:-1]).long())


def csr_spmm_reference(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, dense: torch.Tensor,
                       *transpose: torch.Tensor) -> torch.Tensor:
    a = torch.zeros(crow.numel() - 1, dense.shape[0], dtype=values.dtype)
    a.index_put_((_csr_rows(crow), col.long()), values, accumulate=True)  # duplicates add up
    return a @ dense


def csr_transpose_reference(crow: torch.Tensor, col: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    perm = torch.sort(col, stable=True).indices
    counts = torch.bincount(col.long(), minlength=k)
    t_crow = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
    return t_crow.to(crow.dtype), _csr_rows(crow)[perm].to(crow.dtype), perm.to(crow.dtype)


def csr_spmm_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    """n rows, K = n + 1 columns, 3 nonzeros per row: every size but N = 4 scales with n."""
    crow, col = _csr_indices([[i, (i + 1) % (n + 1), (2 * i + 3) % (n + 1)] for i in range(n)], torch.int64, device)
    return (crow, col, random_tensor((3 * n,), dtype, device), random_tensor((n + 1, 4), dtype, device))


def _csr_example(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A valid (crow, col, values, dense): 2 x 3 with 3 nonzeros, dense 3 x 4, int64 indices."""
    crow, col = torch.tensor([0, 2, 3], device=device), torch.tensor([0, 2, 1], device=device)
    return crow, col, torch.randn(3, device=device), torch.randn(3, 4, device=device)


def _csr_metadata_errors(op: str, device: str, make: Callable[..., tuple], device_of: str = "values") -> list[ErrorInput]:
    """Argument errors for ops taking (crow, col, values-like, dense, ...): `make(crow, col, values, dense)`;
    `device_of`: the argument whose device the others are checked against."""
    i32, i64 = torch.int32, torch.int64
    crow, col, v, d = _csr_example(device)
    e = functools.partial(expect, op)
    cases = [
        e(Sample(make(crow.to(i32), col.to(i64), v, d)), "same_dtype", x="crow_indices", y="col_indices",
          x_dtype=i32, y_dtype=i64),
        e(Sample(make(crow.float(), col.float(), v, d)), "dtype_in", x="crow_indices", dtype=torch.float32,
          supported=INT_DTYPES),
        e(Sample(make(crow.view(1, 3), col, v, d)), "one_d", x="crow_indices", shape=[1, 3]),
        e(Sample(make(crow[:0], col, v, d)), "crow_empty", x="crow_indices"),
        e(Sample(make(crow, col.view(3, 1), v, d)), "one_d", x="col_indices", shape=[3, 1]),
    ]
    if device == "cuda":
        cases.append(e(Sample(make(crow.cpu(), col, v, d)), "same_device", x=device_of, y="crow_indices",
                       **_CUDA_VS_CPU))
        cases.append(e(Sample(make(crow, col, v, d.cpu())), "same_device", x=device_of, y="dense",
                       **_CUDA_VS_CPU))
    return cases


def _csr_structure_errors(op: str, device: str, make: Callable[..., tuple]) -> list[ErrorInput]:
    """Malformed CSR structure: raised by the CPU kernels (which read the indices), not by fake kernels."""
    if device != "cpu":
        return []  # CUDA kernels don't validate (no sync); see test_csr_spmm.py for what they guarantee
    v, d = torch.randn(3), torch.randn(3, 4)
    t = torch.tensor
    e = functools.partial(expect, op, on_fake=False)
    return [
        e(Sample(make(t([1, 2, 3]), t([0, 2, 1]), v, d)), "crow_first", got=1),
        e(Sample(make(t([0, 3, 2, 3]), t([0, 2, 1]), v, d)), "crow_decreasing", i=1, a=3, j=2, b=2),
        e(Sample(make(t([0, 2, 2]), t([0, 2, 1]), v, d)), "crow_last", nnz=3, got=2),
        e(Sample(make(t([0, 2, 3]), t([0, 3, 1]), v, d)), "col_out_of_range", K=3, p=1, got=3),
        e(Sample(make(t([0, 2, 3]), t([0, 1, -1]), v, d)), "col_out_of_range", K=3, p=2, got=-1),
    ]


def csr_spmm_errors(device: str) -> list[ErrorInput]:
    op = "csr_spmm"
    make = lambda crow, col, v, d: (crow, col, v, d)  # noqa: E731
    crow, col, v, d = _csr_example(device)
    e = functools.partial(expect, op)
    cases = _csr_metadata_errors(op, device, make) + _csr_structure_errors(op, device, make) + [
        e(Sample((crow, col, v, d.double())), "same_dtype", x="values", y="dense", x_dtype=torch.float32,
          y_dtype=torch.float64),
        e(Sample((crow, col, torch.randn(4, device=device), d)), "nnz_mismatch", col=3, values=4),
        e(Sample((crow, col, v, torch.randn(3, device=device))), "two_d", x="dense", shape=[3]),
        e(Sample((crow, col, v.view(3, 1), d)), "one_d", x="values", shape=[3, 1]),
        e(Sample((crow, col, v.int(), d.int())), "dtype_in", x="values", dtype=torch.int32, supported=FLOAT_DTYPES),
    ]
    if device == "cuda":
        cases.append(e(Sample((crow, col, v.cpu(), d)), "same_device", x="values", y="crow_indices",
                       x_device="cpu", y_device="cuda:0"))
    return cases


def _with_transpose_args(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, dense: torch.Tensor) -> tuple:
    t = csr_transpose_reference(crow.cpu(), col.cpu(), dense.shape[0])
    return (crow, col, values, dense, *(x.to(crow.device) for x in t))


def csr_spmm_with_transpose_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    return [Sample(_with_transpose_args(*s.args), desc=s.desc) for s in csr_spmm_samples(device, dtype, requires_grad)]


def csr_spmm_with_transpose_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return _with_transpose_args(*csr_spmm_sized(device, dtype, n))


def csr_spmm_with_transpose_errors(device: str) -> list[ErrorInput]:
    def make(crow, col, v, d):
        return (crow, col, v, d, torch.tensor([0, 1, 2, 3], dtype=crow.dtype, device=crow.device),
                col.new_zeros(col.shape), col.new_zeros(col.shape))

    op = "_csr_spmm_with_transpose"
    crow, col, v, d = _csr_example(device)
    t_col = torch.zeros(3, dtype=torch.int64, device=device)
    e = functools.partial(expect, op)
    return _csr_metadata_errors(op, device, make) + _csr_structure_errors(op, device, make) + [
        e(Sample((crow, col, v, d, torch.tensor([0, 1, 3], device=device), t_col, t_col)), "t_crow_size",
          k_plus_1=4, got=3),
        e(Sample((crow, col, v, d, torch.tensor([0, 1, 2, 3], device=device), t_col[:2], t_col)), "t_nnz",
          nnz=3, t_col=2, t_perm=3),
        e(Sample((crow, col, v, d, torch.tensor([0, 1, 2, 3], device=device, dtype=torch.int32), t_col.int(),
                  t_col.int())), "same_dtype", x="crow_indices", y="t_crow_indices", x_dtype=torch.int64,
          y_dtype=torch.int32),
    ]


def csr_sddmm_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for i, (desc, rows, k, n, layout) in enumerate(_CSR_CASES):
        crow, col = _csr_indices(rows, _index_dtype(i), device)
        grad_out = _grad(make_layout((len(rows), n), dtype, device, "transposed" if layout == "transposed" else "contiguous"), requires_grad)
        dense = _grad(_dense(k, n, dtype, device, layout), requires_grad)
        samples.append(Sample((crow, col, grad_out, dense), desc=f"{desc} ({col.dtype})"))
    crow, col = _csr_indices([[0, 1], [2], [1, 1, 0]], torch.int64, device)
    grad_out = random_tensor((1, 5), dtype, device).expand(3, 5)  # stride-0 rows, as from out.sum().backward()
    samples.append(Sample((crow, col, grad_out, _grad(random_tensor((3, 5), dtype, device), requires_grad)), desc="expanded grad_out"))
    return samples


def csr_sddmm_reference(crow: torch.Tensor, col: torch.Tensor, grad_out: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    return (grad_out[_csr_rows(crow)] * dense[col.long()]).sum(-1)


def csr_sddmm_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    crow, col, _, dense = csr_spmm_sized(device, dtype, n)
    return (crow, col, random_tensor((n, 4), dtype, device), dense)


def csr_sddmm_errors(device: str) -> list[ErrorInput]:
    def make(crow, col, v, d):  # grad_out on col's device, so each device error names the tensor it is about
        m = crow.numel() - 1 if crow.dim() == 1 and crow.numel() else 2
        return (crow, col, torch.randn(m, d.shape[-1], dtype=d.dtype, device=col.device), d)

    op = "_csr_sddmm"
    crow, col, _, d = _csr_example(device)
    e = functools.partial(expect, op)
    return _csr_metadata_errors(op, device, make, device_of="grad_out") + _csr_structure_errors(op, device, make) + [
        e(Sample((crow, col, torch.randn(3, 4, device=device), d)), "grad_out_rows", m=2, rows=3),
        e(Sample((crow, col, torch.randn(2, 5, device=device), d)), "grad_out_columns", x_columns=5, y_columns=4),
        e(Sample((crow, col, torch.randn(2, 4, device=device), d.double())), "same_dtype", x="grad_out", y="dense",
          x_dtype=torch.float32, y_dtype=torch.float64),
        e(Sample((crow, col, torch.randn(2, 4, 1, device=device), d)), "two_d", x="grad_out", shape=[2, 4, 1]),
    ]


def csr_transpose_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    index_dtype = dtype if dtype in INT_DTYPES else torch.int64  # generic tests also ask with float dtypes
    samples = []
    for desc, rows, k, _, _ in _CSR_CASES:
        crow, col = _csr_indices(rows, index_dtype, device)
        samples.append(Sample((crow, col, k), desc=desc))
    return samples


def csr_transpose_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    """n rows; K stays 5 (an int argument: export specialises it)."""
    crow, col = _csr_indices([[i % 5, (2 * i + 1) % 5] for i in range(n)], torch.int64, device)
    return (crow, col, 5)


def csr_transpose_errors(device: str) -> list[ErrorInput]:
    def make(crow, col, v, d):
        return (crow, col, 3)

    op = "_csr_transpose"
    crow, col, _, _ = _csr_example(device)
    cases = _csr_metadata_errors(op, device, make) + _csr_structure_errors(op, device, make) + [
        expect(op, Sample((crow, col, -1)), "negative_K", K=-1),
    ]
    cases = [c for c in cases if c.key != "same_device"]  # (crow's device is the reference here)
    if device == "cuda":
        cases.append(expect(op, Sample((crow.cpu(), col, 3)), "same_device", x="crow_indices", y="col_indices",
                            x_device="cpu", y_device="cuda:0"))
    return cases


# name, dtypes, samples, reference, errors, sized inputs (op_db.core.OpInfo)
OPS: list[OpInfo] = [
    OpInfo("csr_spmm", FLOAT_DTYPES, csr_spmm_samples, csr_spmm_reference, csr_spmm_errors, csr_spmm_sized),
    OpInfo("_csr_spmm_with_transpose", FLOAT_DTYPES, csr_spmm_with_transpose_samples, csr_spmm_reference,
           csr_spmm_with_transpose_errors, csr_spmm_with_transpose_sized),
    OpInfo("_csr_sddmm", FLOAT_DTYPES, csr_sddmm_samples, csr_sddmm_reference, csr_sddmm_errors, csr_sddmm_sized),
    OpInfo("_csr_transpose", INT_DTYPES, csr_transpose_samples, csr_transpose_reference, csr_transpose_errors,
           csr_transpose_sized, differentiable=False),  # dtypes: the index dtype
]
