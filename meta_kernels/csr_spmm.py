"""Fake kernels for the sparse x dense products (csr_spmm, spmm_reduce, _spmm_reduce_forward,
_spmm_reduce_backward, _csr_spmm_with_transpose) and _csr_transpose, with the checks of csrc/csr/csr.cpp in the
same order (messages: meta_kernels._checks.MESSAGES); the shared CSR checks for csr_sddmm.py and csr_softmax.py.

The output sizes are symbolic where the inputs' are: M = crow_indices.numel() - 1, nnz = col_indices.numel(),
K, H and D from dense. The CSR structure itself (values of the index tensors) is not checked here: the CPU
kernels validate it, and the wrappers' ``check_invariants=True`` on any device.
"""

from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, INT_DTYPES, check, dtype_in, same_device, same_dtype

Named = tuple[str, torch.Tensor]


def one_d(op: str, t: Named) -> None:
    check(t[1].dim() == 1, op, "one_d", x=t[0], shape=list(t[1].shape))


def dims(op: str, t: Named, lo: int, hi: int, what: str) -> None:
    check(lo <= t[1].dim() <= hi, op, "dims", x=t[0], what=what, shape=list(t[1].shape))


def check_crow_indices(op: str, crow: Named, device_of: Named) -> None:
    same_device(op, device_of, crow)
    one_d(op, crow)
    check(crow[1].numel() >= 1, op, "crow_empty", x=crow[0])
    dtype_in(op, crow, INT_DTYPES)


def check_csr_indices(op: str, crow: Named, col: Named, device_of: Named) -> None:
    check_crow_indices(op, crow, device_of)
    same_device(op, device_of, col)
    one_d(op, col)
    same_dtype(op, crow, col)


def check_nnz(op: str, col: torch.Tensor, values: torch.Tensor) -> None:
    check(col.numel() == values.shape[0], op, "nnz_mismatch", col=col.numel(), values=values.shape[0])


def check_rows(op: str, t: Named, m: int) -> None:
    check(t[1].shape[0] == m, op, "rows", x=t[0], m=m, rows=t[1].shape[0])


def check_csr_matrix(op: str, t: Named, device_of: Named) -> None:
    same_device(op, device_of, t)
    check(t[1].dim() == 2, op, "two_d", x=t[0], shape=list(t[1].shape))
    dtype_in(op, t, FLOAT_DTYPES)


def check_csr_spmm_args(op: str, crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor,
                        dense: torch.Tensor) -> None:
    v, d = ("values", values), ("dense", dense)
    check_csr_indices(op, ("crow_indices", crow), ("col_indices", col), v)
    one_d(op, v)
    dtype_in(op, v, FLOAT_DTYPES)
    check_nnz(op, col, values)
    check_csr_matrix(op, d, v)
    same_dtype(op, v, d)


_REDUCES = ("sum", "mean", "max", "min")


def check_reduce(op: str, reduce: str) -> None:
    check(reduce in _REDUCES, op, "reduce", got=reduce)


def check_spmm_reduce_args(op: str, crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor | None,
                           dense: torch.Tensor) -> None:
    d = ("dense", dense)
    check_csr_indices(op, ("crow_indices", crow), ("col_indices", col), d)
    dims(op, d, 2, 3, "2-D (K, D) or 3-D (K, H, D)")
    dtype_in(op, d, FLOAT_DTYPES)
    if values is None:
        return
    v = ("values", values)
    same_device(op, d, v)
    dims(op, v, 1, 2, "1-D (nnz) or 2-D (nnz, H)")
    same_dtype(op, v, d)
    check_nnz(op, col, values)
    check(values.dim() == 1 or (dense.dim() == 3 and dense.shape[1] == values.shape[1]), op, "values_heads",
          values=list(values.shape), heads=values.shape[-1], dense=list(dense.shape))


def spmm_result_shape(crow: torch.Tensor, dense: torch.Tensor) -> tuple:
    return (crow.shape[0] - 1, *dense.shape[1:])


def check_transpose_args(op: str, crow: torch.Tensor, col: torch.Tensor, dense: torch.Tensor, t_crow: torch.Tensor,
                         t_col: torch.Tensor, t_perm: torch.Tensor) -> None:
    c, tc = ("crow_indices", crow), ("t_crow_indices", t_crow)
    check_csr_indices(op, tc, ("t_col_indices", t_col), c)
    check_csr_indices(op, tc, ("t_perm", t_perm), c)
    same_dtype(op, c, tc)
    check(t_crow.numel() == dense.shape[0] + 1, op, "t_crow_size", k_plus_1=dense.shape[0] + 1, got=t_crow.numel())
    nnz = col.numel()
    check(t_col.numel() == nnz and t_perm.numel() == nnz, op, "t_nnz", nnz=nnz, t_col=t_col.numel(),
          t_perm=t_perm.numel())


@torch.library.register_fake("myns::csr_spmm")
def csr_spmm(crow_indices: torch.Tensor, col_indices: torch.Tensor, values: torch.Tensor,
             dense: torch.Tensor) -> torch.Tensor:
    check_csr_spmm_args("csr_spmm", crow_indices, col_indices, values, dense)
    return values.new_empty((crow_indices.shape[0] - 1, dense.shape[1]))


@torch.library.register_fake("myns::spmm_reduce")
def spmm_reduce(crow_indices: torch.Tensor, col_indices: torch.Tensor, values: torch.Tensor | None,
                dense: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
    op = "spmm_reduce"
    check_reduce(op, reduce)
    check_spmm_reduce_args(op, crow_indices, col_indices, values, dense)
    return dense.new_empty(spmm_result_shape(crow_indices, dense))


@torch.library.register_fake("myns::_spmm_reduce_forward")
def spmm_reduce_forward(crow_indices: torch.Tensor, col_indices: torch.Tensor, values: torch.Tensor | None,
                        dense: torch.Tensor, reduce: str) -> tuple[torch.Tensor, torch.Tensor]:
    op = "_spmm_reduce_forward"
    check(reduce in ("max", "min"), op, "reduce_selects", got=reduce)
    check_spmm_reduce_args(op, crow_indices, col_indices, values, dense)
    shape = spmm_result_shape(crow_indices, dense)
    return dense.new_empty(shape), dense.new_empty(shape, dtype=crow_indices.dtype)


@torch.library.register_fake("myns::_spmm_reduce_backward")
def spmm_reduce_backward(grad_out: torch.Tensor, crow_indices: torch.Tensor, col_indices: torch.Tensor,
                         values: torch.Tensor | None, dense: torch.Tensor, arg: torch.Tensor,
                         t_crow_indices: torch.Tensor | None, t_col_indices: torch.Tensor | None,
                         t_perm: torch.Tensor | None, values_grad: bool,
                         dense_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    op = "_spmm_reduce_backward"
    check_spmm_reduce_args(op, crow_indices, col_indices, values, dense)
    g, a, d, c = ("grad_out", grad_out), ("arg", arg), ("dense", dense), ("crow_indices", crow_indices)
    same_device(op, d, g)
    same_device(op, d, a)
    same_dtype(op, g, d)
    same_dtype(op, a, c)
    shape = spmm_result_shape(crow_indices, dense)
    check(grad_out.dim() == len(shape) and all(x == y for x, y in zip(grad_out.shape, shape)), op, "result_shape",
          shape=list(shape), got=list(grad_out.shape))
    check(arg.dim() == grad_out.dim() and all(x == y for x, y in zip(arg.shape, grad_out.shape)), op, "same_shape",
          x="grad_out", y="arg", x_shape=list(grad_out.shape), y_shape=list(arg.shape))
    check(not values_grad or values is not None, op, "values_grad_without_values")
    given = sum(t is not None for t in (t_crow_indices, t_col_indices, t_perm))
    check(given in (0, 3), op, "transpose_parts", given=given)
    if given == 3:
        check_transpose_args(op, crow_indices, col_indices, dense, t_crow_indices, t_col_indices, t_perm)
    grad_values = values.new_empty(values.shape) if values_grad else dense.new_empty((0,))
    grad_dense = dense.new_empty(dense.shape) if dense_grad else dense.new_empty((0,))
    return grad_values, grad_dense


@torch.library.register_fake("myns::_csr_spmm_with_transpose")
def csr_spmm_with_transpose(crow_indices: torch.Tensor, col_indices: torch.Tensor, values: torch.Tensor | None,
                            dense: torch.Tensor, t_crow_indices: torch.Tensor, t_col_indices: torch.Tensor,
                            t_perm: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
    op = "_csr_spmm_with_transpose"
    check_reduce(op, reduce)
    check_spmm_reduce_args(op, crow_indices, col_indices, values, dense)
    check_transpose_args(op, crow_indices, col_indices, dense, t_crow_indices, t_col_indices, t_perm)
    return dense.new_empty(spmm_result_shape(crow_indices, dense))


@torch.library.register_fake("myns::_csr_transpose")
def csr_transpose(crow_indices: torch.Tensor, col_indices: torch.Tensor,
                  K: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    op = "_csr_transpose"
    c = ("crow_indices", crow_indices)
    check_csr_indices(op, c, ("col_indices", col_indices), c)
    check(K >= 0, op, "negative_K", K=K)
    nnz = col_indices.shape[0]
    return crow_indices.new_empty((K + 1,)), crow_indices.new_empty((nnz,)), crow_indices.new_empty((nnz,))
