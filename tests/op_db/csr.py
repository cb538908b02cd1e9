"""op_db rows of the csr ops."""

from __future__ import annotations

import functools
import itertools
import math
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


def _csr_metadata_errors(op: str, device: str, make: Callable[..., tuple], device_of: str = "values",
                         dense_name: str = "dense") -> list[ErrorInput]:
    """Argument errors for ops taking (crow, col, values-like, dense, ...): `make(crow, col, values, dense)`;
    `device_of`: the argument whose device the others are checked against; `dense_name`: what the op calls
    the 4th argument."""
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
        if device_of != dense_name:
            cases.append(e(Sample(make(crow, col, v, d.cpu())), "same_device", x=device_of, y=dense_name,
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
        e(Sample(make(t([0, 2, 2]), t([0, 2, 1]), v, d)), "crow_last", nnz=3, of="col_indices", got=2),
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
    """csr_spmm's samples (the default reduce), then spmm_reduce's (every reduce and head layout)."""
    plain = [Sample(_with_transpose_args(*s.args), desc=s.desc) for s in csr_spmm_samples(device, dtype, requires_grad)]
    reduced = [Sample((*_with_transpose_args(*s.args[:4]), s.args[4]), desc=s.desc)
               for s in spmm_reduce_samples(device, dtype, requires_grad)]
    return plain + reduced


def csr_spmm_with_transpose_reference(crow, col, values, dense, t_crow, t_col, t_perm, reduce="sum") -> torch.Tensor:
    return spmm_reduce_reference(crow, col, values, dense, reduce)


def csr_spmm_with_transpose_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    """spmm_reduce's sized heads with the transpose, and max: dense's gradient then goes through it."""
    crow, col, values, dense, _ = spmm_reduce_sized(device, dtype, n)
    return (*_with_transpose_args(crow, col, values, dense), "max")


def csr_spmm_with_transpose_errors(device: str) -> list[ErrorInput]:
    def make(crow, col, v, d):
        return (crow, col, v, d, torch.tensor([0, 1, 2, 3], dtype=crow.dtype, device=crow.device),
                col.new_zeros(col.shape), col.new_zeros(col.shape))

    op = "_csr_spmm_with_transpose"
    crow, col, v, d = _csr_example(device)
    t_col = torch.zeros(3, dtype=torch.int64, device=device)
    e = functools.partial(expect, op)
    return _csr_metadata_errors(op, device, make, device_of="dense") + _csr_structure_errors(op, device, make) + [
        e(Sample((crow, col, v, d, torch.tensor([0, 1, 3], device=device), t_col, t_col)), "t_crow_size",
          k_plus_1=4, got=3),
        e(Sample((crow, col, v, d, torch.tensor([0, 1, 2, 3], device=device), t_col[:2], t_col)), "t_nnz",
          nnz=3, t_col=2, t_perm=3),
        e(Sample((crow, col, v, d, torch.tensor([0, 1, 2, 3], device=device, dtype=torch.int32), t_col.int(),
                  t_col.int())), "same_dtype", x="crow_indices", y="t_crow_indices", x_dtype=torch.int64,
          y_dtype=torch.int32),
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


# ------------------------------------------------------------------------------------------- spmm_reduce
# Every reduce on every structure case above (the cases cycle through the reduces and head layouts), then every
# reduce x head layout x weights (values or None) on the general case; int32 and int64 indices alternate.
REDUCES = ("sum", "mean", "max", "min")
# (values, dense): "1-D" values (nnz,) with a (K, D) dense; "heads" (nnz, H) with (K, H, D); "shared" (nnz,) with
# (K, H, D): one weight for every head.
_HEAD_LAYOUTS = ("1-D", "heads", "shared")
_HEADS = 3


def _head_dense(k: int, n: int, dtype: torch.dtype, device: str, layout: str, heads: bool) -> torch.Tensor:
    if not heads:
        return _dense(k, n, dtype, device, layout)
    if layout == "row-sliced":  # last dim contiguous, heads and rows strided, misaligned start
        return random_tensor((k, _HEADS + 1, n + 3), dtype, device)[:, 1:, 2:2 + n]
    return make_layout((k, _HEADS, n), dtype, device, layout)


def _spmm_reduce_args(rows, k, n, layout, index_dtype, heads, ones, dtype, device, requires_grad):
    crow, col = _csr_indices(rows, index_dtype, device)
    values = None
    if not ones:
        shape = (col.numel(), _HEADS) if heads == "heads" else (col.numel(),)
        values = _grad(random_tensor(shape, dtype, device), requires_grad)
    dense = _grad(_head_dense(k, n, dtype, device, layout, heads != "1-D"), requires_grad)
    return crow, col, values, dense


def spmm_reduce_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for i, (desc, rows, k, n, layout) in enumerate(_CSR_CASES):
        reduce, heads, ones = REDUCES[i % 4], _HEAD_LAYOUTS[i % 3], i % 5 == 4
        args = _spmm_reduce_args(rows, k, n, layout, _index_dtype(i), heads, ones, dtype, device, requires_grad)
        samples.append(Sample((*args, reduce), desc=f"{desc} {reduce} {heads}{' ones' if ones else ''}"))
    rows, k, n = _CSR_CASES[0][1], _CSR_CASES[0][2], 5
    for i, (reduce, heads, ones) in enumerate(itertools.product(REDUCES, _HEAD_LAYOUTS, (False, True))):
        if ones and heads == "heads":
            continue  # without values every head has the same weights: "shared"
        args = _spmm_reduce_args(rows, k, n, "contiguous", _index_dtype(i), heads, ones, dtype, device, requires_grad)
        samples.append(Sample((*args, reduce), desc=f"general {reduce} {heads}{' ones' if ones else ''}"))
    return samples


def _products(col: torch.Tensor, values: torch.Tensor | None, dense: torch.Tensor) -> torch.Tensor:
    """values[p] * dense[col[p]] per nonzero p: (nnz, D) or (nnz, H, D)."""
    x = dense[col.long()]
    if values is None:
        return x
    return values.view(values.shape + (1,) * (x.dim() - values.dim())) * x


def spmm_reduce_reference(crow, col, values, dense, reduce="sum", *transpose) -> torch.Tensor:
    m = crow.numel() - 1
    rows = _csr_rows(crow)
    x = _products(col, values, dense)
    index = rows.view((-1,) + (1,) * (x.dim() - 1)).expand_as(x)
    out = torch.zeros((m,) + tuple(dense.shape[1:]), dtype=dense.dtype)
    how = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}[reduce]
    return out.scatter_reduce(0, index, x, how, include_self=False)  # rows without nonzeros keep their 0


def spmm_reduce_arg_reference(crow, col, values, dense, reduce) -> torch.Tensor:
    """The first position of each row whose product is the row's max (min), -1 for an empty row."""
    rows = _csr_rows(crow)
    x = _products(col, values, dense)
    best = spmm_reduce_reference(crow, col, values, dense, reduce)
    index = rows.view((-1,) + (1,) * (x.dim() - 1)).expand_as(x)
    positions = torch.arange(x.shape[0]).view(index.shape[:1] + (1,) * (x.dim() - 1)).expand_as(x)
    candidates = torch.where(x == best[rows], positions, torch.full_like(positions, x.shape[0]))
    arg = torch.full(best.shape, -1, dtype=torch.int64)
    return arg.scatter_reduce(0, index, candidates, "amin", include_self=False).to(crow.dtype)


def spmm_reduce_forward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    return [s for s in spmm_reduce_samples(device, dtype, requires_grad) if s.args[-1] in ("max", "min")]


def spmm_reduce_forward_reference(crow, col, values, dense, reduce) -> tuple[torch.Tensor, torch.Tensor]:
    return (spmm_reduce_reference(crow, col, values, dense, reduce),
            spmm_reduce_arg_reference(crow, col, values, dense, reduce))


def spmm_reduce_forward_dtypes(sample: Sample) -> tuple[torch.dtype, ...]:
    return (sample.args[3].dtype, sample.args[0].dtype)


def _with_reduce(args: tuple, reduce: str) -> tuple:
    return (*args, reduce)


def spmm_reduce_sized(device: str, dtype: torch.dtype, n: int, reduce: str = "mean") -> tuple[Any, ...]:
    """csr_spmm_sized's structure with heads: values (3n, 2), dense (n + 1, 2, 4)."""
    crow, col, _, _ = csr_spmm_sized(device, dtype, n)
    return (crow, col, random_tensor((3 * n, 2), dtype, device), random_tensor((n + 1, 2, 4), dtype, device), reduce)


def _spmm_reduce_errors(op: str, device: str, *, reduce: str | None) -> list[ErrorInput]:
    """Errors of the ops taking spmm_reduce's arguments (crow, col, values, dense[, reduce])."""
    tail = () if reduce is None else (reduce,)
    make = lambda crow, col, v, d: (crow, col, v, d, *tail)  # noqa: E731
    crow, col, v, d = _csr_example(device)
    e = functools.partial(expect, op)
    cases = _csr_metadata_errors(op, device, make, device_of="dense") + _csr_structure_errors(op, device, make) + [
        e(Sample(make(crow, col, v, torch.randn(3, device=device))), "dims", x="dense",
          what="2-D (K, D) or 3-D (K, H, D)", shape=[3]),
        e(Sample(make(crow, col, v, torch.randn(3, 2, 2, 2, device=device))), "dims", x="dense",
          what="2-D (K, D) or 3-D (K, H, D)", shape=[3, 2, 2, 2]),
        e(Sample(make(crow, col, v.view(3, 1, 1), d)), "dims", x="values", what="1-D (nnz) or 2-D (nnz, H)",
          shape=[3, 1, 1]),
        e(Sample(make(crow, col, v.double(), d)), "same_dtype", x="values", y="dense", x_dtype=torch.float64,
          y_dtype=torch.float32),
        e(Sample(make(crow, col, torch.randn(4, device=device), d)), "nnz_mismatch", col=3, values=4),
        e(Sample(make(crow, col, torch.randn(3, 2, device=device), d)), "values_heads", values=[3, 2], heads=2,
          dense=[3, 4]),
        e(Sample(make(crow, col, torch.randn(3, 2, device=device), torch.randn(3, 3, 4, device=device))),
          "values_heads", values=[3, 2], heads=2, dense=[3, 3, 4]),
        e(Sample(make(crow, col, v.int(), d.int())), "dtype_in", x="dense", dtype=torch.int32,
          supported=FLOAT_DTYPES),
    ]
    if device == "cuda":
        cases.append(e(Sample(make(crow, col, v.cpu(), d)), "same_device", x="dense", y="values", **_CUDA_VS_CPU))
    return cases


def spmm_reduce_errors(device: str) -> list[ErrorInput]:
    op = "spmm_reduce"
    crow, col, v, d = _csr_example(device)
    return _spmm_reduce_errors(op, device, reduce="max") + [
        expect(op, Sample((crow, col, v, d, "amax")), "reduce", got="amax"),
    ]


def spmm_reduce_forward_errors(device: str) -> list[ErrorInput]:
    op = "_spmm_reduce_forward"
    crow, col, v, d = _csr_example(device)
    return _spmm_reduce_errors(op, device, reduce="min") + [
        expect(op, Sample((crow, col, v, d, "sum")), "reduce_selects", got="sum"),
    ]


def _select_backward_args(crow, col, values, dense, reduce, g, *, transpose: bool, values_grad: bool = True,
                          dense_grad: bool = True) -> tuple:
    """_spmm_reduce_backward's arguments for grad_out g, the selection computed by the reference."""
    arg = spmm_reduce_arg_reference(*_upcast_csr((crow, col, values, dense)), reduce).to(crow.device)
    t = csr_transpose_reference(crow.cpu(), col.cpu(), dense.shape[0]) if transpose else (None, None, None)
    t = tuple(x.to(crow.device) if x is not None else None for x in t)
    return (g, crow, col, values, dense, arg, *t, values_grad and values is not None, dense_grad)


def _upcast_csr(args: tuple) -> tuple:
    return tuple(None if a is None else a.detach().cpu().double() if a.dtype.is_floating_point else a.cpu()
                 for a in args)


def spmm_reduce_backward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for i, s in enumerate(spmm_reduce_forward_samples(device, dtype, False)):
        crow, col, values, dense, reduce = s.args
        g = _grad(random_tensor((crow.numel() - 1,) + tuple(dense.shape[1:]), dtype, device), requires_grad)
        flags = [dict(), dict(values_grad=False), dict(dense_grad=False)][i % 3]
        args = _select_backward_args(crow, col, values, dense, reduce, g, transpose=i % 2 == 0, **flags)
        samples.append(Sample(args, desc=f"{s.desc} {flags}"))
    return samples


def spmm_reduce_backward_reference(g, crow, col, values, dense, arg, t_crow, t_col, t_perm, values_grad,
                                   dense_grad) -> tuple[torch.Tensor, torch.Tensor]:
    """Each output element's gradient to its selected nonzero p = arg: g * dense[col[p], h, d] to values[p(, h)],
    g * values[p(, h)] to dense[col[p], h, d]."""
    m, k = g.shape[0], dense.shape[0]
    c = math.prod(g.shape[1:])  # output columns per row (H * D)
    valid = (arg >= 0).reshape(m, c)
    pos = arg.clamp(min=0).long().reshape(m, c)
    rows = col.long()[pos] if col.numel() else torch.zeros_like(pos)  # dense row of each output element
    columns = torch.arange(c).expand(m, c)
    heads = values.shape[1] if values is not None and values.dim() == 2 else 1
    head = columns // (c // heads) if c else columns
    flat_g = g.reshape(m, c)
    grad_values = grad_dense = torch.zeros(0, dtype=g.dtype)
    # Only the selected elements (an empty row selects nothing).
    pos, rows, columns, head, flat_g = (t[valid] for t in (pos, rows, columns, head, flat_g))
    if values_grad:
        terms = flat_g * dense.reshape(k, c)[rows, columns]
        grad_values = torch.zeros(values.numel(), dtype=g.dtype).index_add(0, pos * heads + head, terms)
        grad_values = grad_values.view(values.shape)
    if dense_grad:
        w = values.reshape(-1)[pos * heads + head] if values is not None else torch.ones_like(flat_g)
        grad_dense = torch.zeros(k * c, dtype=g.dtype).index_add(0, rows * c + columns, flat_g * w)
        grad_dense = grad_dense.view(dense.shape)
    return grad_values, grad_dense


def spmm_reduce_backward_dtypes(sample: Sample) -> tuple[torch.dtype, ...]:
    return (sample.args[0].dtype,) * 2


def spmm_reduce_backward_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    crow, col, values, dense, _ = spmm_reduce_sized(device, dtype, n)
    g = random_tensor((n, 2, 4), dtype, device)
    return _select_backward_args(crow, col, values, dense, "max", g, transpose=False)


def spmm_reduce_backward_errors(device: str) -> list[ErrorInput]:
    op = "_spmm_reduce_backward"
    crow, col, v, d = _csr_example(device)
    g, arg = torch.randn(2, 4, device=device), torch.zeros(2, 4, dtype=torch.int64, device=device)
    t = tuple(x.to(device) for x in csr_transpose_reference(crow.cpu(), col.cpu(), 3))

    def make(crow, col, v, d):
        m = crow.numel() - 1 if crow.dim() == 1 and crow.numel() else 2
        gg = torch.randn(m, *d.shape[1:], dtype=d.dtype, device=d.device)
        return (gg, crow, col, v, d, torch.zeros(gg.shape, dtype=crow.dtype, device=d.device), None, None, None,
                True, True)

    e = functools.partial(expect, op)
    cases = _csr_metadata_errors(op, device, make, device_of="dense") + _csr_structure_errors(op, device, make) + [
        e(Sample((g[:1], crow, col, v, d, arg, None, None, None, True, True)), "result_shape", shape=[2, 4],
          got=[1, 4]),
        e(Sample((g, crow, col, v, d, arg[:, :2], None, None, None, True, True)), "same_shape", x="grad_out",
          y="arg", x_shape=[2, 4], y_shape=[2, 2]),
        e(Sample((g.double(), crow, col, v, d, arg, None, None, None, True, True)), "same_dtype", x="grad_out",
          y="dense", x_dtype=torch.float64, y_dtype=torch.float32),
        e(Sample((g, crow, col, v, d, arg.int(), None, None, None, True, True)), "same_dtype", x="arg",
          y="crow_indices", x_dtype=torch.int32, y_dtype=torch.int64),
        e(Sample((g, crow, col, None, d, arg, None, None, None, True, True)), "values_grad_without_values"),
        e(Sample((g, crow, col, v, d, arg, t[0], None, None, True, True)), "transpose_parts", given=1),
        e(Sample((g, crow, col, v, d, arg, t[0][:2], t[1], t[2], True, True)), "t_crow_size", k_plus_1=4, got=2),
    ]
    if device == "cuda":
        cases.append(e(Sample((g.cpu(), crow, col, v, d, arg, None, None, None, True, True)), "same_device",
                       x="dense", y="grad_out", **_CUDA_VS_CPU))
    return cases


# ----------------------------------------------------------------------------------------------- sddmm
SDDMM_OPS = ("dot", "add", "mul")


def _sddmm_operand(rows: int, n: int, op: str, heads: bool, dtype: torch.dtype, device: str, layout: str):
    if op == "dot":
        shape = (rows, _HEADS, n) if heads else (rows, n)
    else:
        shape = (rows, _HEADS) if heads else (rows,)
    if len(shape) == 1 and layout == "transposed":
        layout = "sliced"
    return make_layout(shape, dtype, device, layout)


def sddmm_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for i, (desc, rows, k, n, layout) in enumerate(_CSR_CASES):
        op, heads = SDDMM_OPS[i % 3], i % 2 == 1
        lay = layout if layout in ("contiguous", "transposed", "sliced", "offset") else "contiguous"
        crow, col = _csr_indices(rows, _index_dtype(i), device)
        a = _grad(_sddmm_operand(len(rows), n, op, heads, dtype, device, lay), requires_grad)
        b = _grad(_sddmm_operand(k, n, op, heads, dtype, device, lay), requires_grad)
        samples.append(Sample((crow, col, a, b, op), desc=f"{desc} {op}{' heads' if heads else ''} ({col.dtype})"))
    general = _CSR_CASES[0]
    for i, (op, heads) in enumerate(itertools.product(SDDMM_OPS, (False, True))):
        crow, col = _csr_indices(general[1], _index_dtype(i), device)
        a = _grad(_sddmm_operand(len(general[1]), 6, op, heads, dtype, device, "contiguous"), requires_grad)
        b = _grad(_sddmm_operand(general[2], 6, op, heads, dtype, device, "contiguous"), requires_grad)
        samples.append(Sample((crow, col, a, b, op), desc=f"general {op}{' heads' if heads else ''}"))
    crow, col = _csr_indices([[0, 1], [2], [1, 1, 0]], torch.int64, device)
    a = random_tensor((1, 5), dtype, device).expand(3, 5)  # stride-0 rows, as from out.sum().backward()
    samples.append(Sample((crow, col, a, _grad(random_tensor((3, 5), dtype, device), requires_grad), "dot"),
                          desc="expanded a"))
    return samples


def sddmm_reference(crow, col, a, b, op="dot") -> torch.Tensor:
    x, y = a[_csr_rows(crow)], b[col.long()]
    if op == "dot":
        return (x * y).sum(-1)
    return x + y if op == "add" else x * y


def sddmm_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    crow, col, _, _ = csr_spmm_sized(device, dtype, n)
    return (crow, col, random_tensor((n, 2, 4), dtype, device), random_tensor((n + 1, 2, 4), dtype, device), "dot")


def sddmm_errors(device: str) -> list[ErrorInput]:
    op = "sddmm"

    def make(crow, col, v, d):  # a on col's device, so each device error names the tensor it is about
        m = crow.numel() - 1 if crow.dim() == 1 and crow.numel() else 2
        return (crow, col, torch.randn(m, d.shape[-1], dtype=d.dtype, device=col.device), d, "dot")

    crow, col, _, d = _csr_example(device)
    e = functools.partial(expect, op)
    dot_dims, pointwise_dims = "2-D (rows, D) or 3-D (rows, H, D)", "1-D (rows) or 2-D (rows, H)"
    cases = _csr_metadata_errors(op, device, make, device_of="a", dense_name="b") + _csr_structure_errors(op, device, make) + [
        e(Sample((crow, col, torch.randn(2, 4, device=device), d, "cat")), "sddmm_op", got="cat"),
        e(Sample((crow, col, torch.randn(3, 4, device=device), d, "dot")), "rows", x="a", m=2, rows=3),
        e(Sample((crow, col, torch.randn(2, 5, device=device), d, "dot")), "same_trailing", x="a", y="b",
          x_shape=[2, 5], y_shape=[3, 4]),
        e(Sample((crow, col, torch.randn(2, 2, 4, device=device), d, "dot")), "same_trailing", x="a", y="b",
          x_shape=[2, 2, 4], y_shape=[3, 4]),
        e(Sample((crow, col, torch.randn(2, 4, device=device), d.double(), "dot")), "same_dtype", x="a", y="b",
          x_dtype=torch.float32, y_dtype=torch.float64),
        e(Sample((crow, col, torch.randn(2, device=device), d, "dot")), "dims", x="a", what=dot_dims, shape=[2]),
        e(Sample((crow, col, torch.randn(2, 4, device=device), torch.randn(3, 1, 1, 1, device=device), "dot")), "dims",
          x="b", what=dot_dims, shape=[3, 1, 1, 1]),
        e(Sample((crow, col, torch.randn(2, 4, 1, device=device), d, "add")), "dims", x="a", what=pointwise_dims,
          shape=[2, 4, 1]),
        e(Sample((crow, col, torch.randn(2, 4, device=device), torch.randn(3, 5, device=device), "mul")),
          "same_trailing", x="a", y="b", x_shape=[2, 4], y_shape=[3, 5]),
    ]
    return cases


# --------------------------------------------------------------------------------------------- softmax

def csr_softmax_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for i, (desc, rows, *_rest) in enumerate(_CSR_CASES):
        crow, _ = _csr_indices(rows, _index_dtype(i), device)
        nnz = int(crow[-1])
        shape = (nnz, _HEADS) if i % 2 else (nnz,)
        values = make_layout(shape, dtype, device, ("transposed" if len(shape) == 2 else "sliced") if i % 3 == 0 else "contiguous")
        samples.append(Sample((crow, _grad(values, requires_grad)), desc=f"{desc} {list(shape)} ({crow.dtype})"))
    crow, _ = _csr_indices([[0] * 40, [1], [], [2, 3]], torch.int64, device)
    wide = random_tensor((43, 2), dtype, device, low=-30, high=30)  # spread out: the row maximum matters
    samples.append(Sample((crow, _grad(wide, requires_grad)), desc="wide values"))
    return samples


def csr_softmax_reference(crow, values) -> torch.Tensor:
    rows = _csr_rows(crow)
    index = rows.view((-1,) + (1,) * (values.dim() - 1)).expand_as(values)
    top = torch.zeros((crow.numel() - 1,) + tuple(values.shape[1:]), dtype=values.dtype)
    top = top.scatter_reduce(0, index, values, "amax", include_self=False)
    e = torch.exp(values - top[rows])
    return e / torch.zeros_like(top).index_add(0, rows, e)[rows]


def csr_softmax_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    crow, col, _, _ = csr_spmm_sized(device, dtype, n)
    return (crow, random_tensor((3 * n, 2), dtype, device))


def _softmax_errors(op: str, device: str, make: Callable[..., tuple]) -> list[ErrorInput]:
    """Errors of the ops taking (crow_indices, values-like ...): make(crow, values)."""
    crow = torch.tensor([0, 2, 3], device=device)
    v = torch.randn(3, 2, device=device)
    e = functools.partial(expect, op)
    t = torch.tensor
    cases = [
        e(Sample(make(crow.float(), v)), "dtype_in", x="crow_indices", dtype=torch.float32, supported=INT_DTYPES),
        e(Sample(make(crow.view(1, 3), v)), "one_d", x="crow_indices", shape=[1, 3]),
        e(Sample(make(crow[:0], v)), "crow_empty", x="crow_indices"),
        e(Sample(make(crow, v.view(3, 2, 1))), "dims", x="values", what="1-D (nnz) or 2-D (nnz, H)", shape=[3, 2, 1]),
        e(Sample(make(crow, torch.randn((), device=device))), "dims", x="values", what="1-D (nnz) or 2-D (nnz, H)",
          shape=[]),
        e(Sample(make(crow, v.int())), "dtype_in", x="values", dtype=torch.int32, supported=FLOAT_DTYPES),
    ]
    if device == "cpu":  # the structure, read by the CPU kernels only
        s = functools.partial(expect, op, on_fake=False)
        cases += [
            s(Sample(make(t([1, 2, 3]), v)), "crow_first", got=1),
            s(Sample(make(t([0, 3, 2, 3]), v)), "crow_decreasing", i=1, a=3, j=2, b=2),
            s(Sample(make(t([0, 2, 2]), v)), "crow_last", nnz=3, of="values", got=2),
        ]
    else:
        cases.append(e(Sample(make(crow.cpu(), v)), "same_device", x="values", y="crow_indices", **_CUDA_VS_CPU))
    return cases


def csr_softmax_errors(device: str) -> list[ErrorInput]:
    return _softmax_errors("csr_softmax", device, lambda crow, v: (crow, v))


def csr_softmax_backward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    return [Sample((s.args[0], random_tensor(s.args[1].shape, dtype, device), s.args[1]), desc=s.desc)
            for s in csr_softmax_samples(device, dtype, False)]


def csr_softmax_backward_reference(crow, grad_out, values) -> torch.Tensor:
    y = csr_softmax_reference(crow, values)
    rows = _csr_rows(crow)
    dot = torch.zeros((crow.numel() - 1,) + tuple(values.shape[1:]), dtype=values.dtype).index_add(0, rows, grad_out * y)
    return y * (grad_out - dot[rows])


def csr_softmax_backward_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    crow, values = csr_softmax_sized(device, dtype, n)
    return (crow, random_tensor(values.shape, dtype, device), values)


def csr_softmax_backward_errors(device: str) -> list[ErrorInput]:
    op = "_csr_softmax_backward"
    crow, v = torch.tensor([0, 2, 3], device=device), torch.randn(3, 2, device=device)
    e = functools.partial(expect, op)
    cases = _softmax_errors(op, device, lambda crow, values: (crow, torch.randn(values.shape, device=values.device).to(values.dtype), values)) + [
        e(Sample((crow, v[:, :1], v)), "same_shape", x="grad_out", y="values", x_shape=[3, 1], y_shape=[3, 2]),
        e(Sample((crow, v.double(), v)), "same_dtype", x="grad_out", y="values", x_dtype=torch.float64,
          y_dtype=torch.float32),
    ]
    if device == "cuda":
        cases.append(e(Sample((crow, v.cpu(), v)), "same_device", x="values", y="grad_out", **_CUDA_VS_CPU))
    return cases


# name, dtypes, samples, reference, errors, sized inputs (op_db.core.OpInfo)
OPS: list[OpInfo] = [
    OpInfo("csr_spmm", FLOAT_DTYPES, csr_spmm_samples, csr_spmm_reference, csr_spmm_errors, csr_spmm_sized),
    OpInfo("_csr_spmm_with_transpose", FLOAT_DTYPES, csr_spmm_with_transpose_samples, csr_spmm_with_transpose_reference,
           csr_spmm_with_transpose_errors, csr_spmm_with_transpose_sized),
    OpInfo("spmm_reduce", FLOAT_DTYPES, spmm_reduce_samples, spmm_reduce_reference, spmm_reduce_errors,
           spmm_reduce_sized),
    OpInfo("_spmm_reduce_forward", FLOAT_DTYPES, spmm_reduce_forward_samples, spmm_reduce_forward_reference,
           spmm_reduce_forward_errors, functools.partial(spmm_reduce_sized, reduce="max"),
           output_dtypes=spmm_reduce_forward_dtypes),
    OpInfo("_spmm_reduce_backward", FLOAT_DTYPES, spmm_reduce_backward_samples, spmm_reduce_backward_reference,
           spmm_reduce_backward_errors, spmm_reduce_backward_sized, output_dtypes=spmm_reduce_backward_dtypes,
           differentiable=False),  # double backward is refused by its Autograd kernel
    OpInfo("sddmm", FLOAT_DTYPES, sddmm_samples, sddmm_reference, sddmm_errors, sddmm_sized),
    OpInfo("_csr_transpose", INT_DTYPES, csr_transpose_samples, csr_transpose_reference, csr_transpose_errors,
           csr_transpose_sized, differentiable=False),  # dtypes: the index dtype
    OpInfo("csr_softmax", FLOAT_DTYPES, csr_softmax_samples, csr_softmax_reference, csr_softmax_errors,
           csr_softmax_sized),
    OpInfo("_csr_softmax_backward", FLOAT_DTYPES, csr_softmax_backward_samples, csr_softmax_backward_reference,
           csr_softmax_backward_errors, csr_softmax_backward_sized,
           differentiable=False),  # double backward is refused by its Autograd kernel
]
