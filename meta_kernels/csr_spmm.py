"""Fake kernels for myns::csr_spmm and its backward helpers (_csr_spmm_with_transpose, _csr_sddmm,
_csr_transpose), with the checks of csrc/csr/csr.cpp in the same order (messages: meta_kernels._checks.MESSAGES).

The output sizes are symbolic where the inputs' are: M = crow_indices.numel() - 1, N = dense.size(1),
nnz = col_indices.numel(). The CSR structure itself (values of the index tensors) is not checked here:
the CPU kernels validate it, and ``torchops.csr_spmm(..., check_invariants=True)`` on any device.
"""

from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, INT_DTYPES, check, dtype_in, same_device, same_dtype



def _one_d(op: str, t: tuple[str, torch.Tensor]) -> None:
    check(t[1].dim() == 1, op, "one_d", x=t[0], shape=list(t[1].shape))


def check_csr_indices(op: str, crow: tuple[str, torch.Tensor], col: tuple[str, torch.Tensor],
                      device_of: tuple[str, torch.Tensor]) -> None:
    same_device(op, device_of, crow)
    same_device(op, device_of, col)
    _one_d(op, crow)
    _one_d(op, col)
    check(crow[1].numel() >= 1, op, "crow_empty", x=crow[0])
    dtype_in(op, crow, INT_DTYPES)
    same_dtype(op, crow, col)


def check_csr_matrix(op: str, t: tuple[str, torch.Tensor], device_of: tuple[str, torch.Tensor]) -> None:
    same_device(op, device_of, t)
    check(t[1].dim() == 2, op, "two_d", x=t[0], shape=list(t[1].shape))
    dtype_in(op, t, FLOAT_DTYPES)


def check_csr_spmm_args(op: str, crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor,
                        dense: torch.Tensor) -> None:
    v, d = ("values", values), ("dense", dense)
    check_csr_indices(op, ("crow_indices", crow), ("col_indices", col), v)
    _one_d(op, v)
    dtype_in(op, v, FLOAT_DTYPES)
    check(col.numel() == values.numel(), op, "nnz_mismatch", col=col.numel(), values=values.numel())
    check_csr_matrix(op, d, v)
    same_dtype(op, v, d)


@torch.library.register_fake("myns::csr_spmm")
def csr_spmm(crow_indices: torch.Tensor, col_indices: torch.Tensor, values: torch.Tensor,
             dense: torch.Tensor) -> torch.Tensor:
    check_csr_spmm_args("csr_spmm", crow_indices, col_indices, values, dense)
    return values.new_empty((crow_indices.shape[0] - 1, dense.shape[1]))


@torch.library.register_fake("myns::_csr_spmm_with_transpose")
def csr_spmm_with_transpose(crow_indices: torch.Tensor, col_indices: torch.Tensor, values: torch.Tensor,
                            dense: torch.Tensor, t_crow_indices: torch.Tensor, t_col_indices: torch.Tensor,
                            t_perm: torch.Tensor) -> torch.Tensor:
    op = "_csr_spmm_with_transpose"
    check_csr_spmm_args(op, crow_indices, col_indices, values, dense)
    c, tc = ("crow_indices", crow_indices), ("t_crow_indices", t_crow_indices)
    check_csr_indices(op, tc, ("t_col_indices", t_col_indices), c)
    check_csr_indices(op, tc, ("t_perm", t_perm), c)
    same_dtype(op, c, tc)
    check(t_crow_indices.numel() == dense.shape[0] + 1, op, "t_crow_size", k_plus_1=dense.shape[0] + 1,
          got=t_crow_indices.numel())
    nnz = col_indices.numel()
    check(t_col_indices.numel() == nnz and t_perm.numel() == nnz, op, "t_nnz", nnz=nnz, t_col=t_col_indices.numel(),
          t_perm=t_perm.numel())
    return values.new_empty((crow_indices.shape[0] - 1, dense.shape[1]))


@torch.library.register_fake("myns::_csr_sddmm")
def csr_sddmm(crow_indices: torch.Tensor, col_indices: torch.Tensor, grad_out: torch.Tensor,
              dense: torch.Tensor) -> torch.Tensor:
    op = "_csr_sddmm"
    g, d = ("grad_out", grad_out), ("dense", dense)
    check_csr_indices(op, ("crow_indices", crow_indices), ("col_indices", col_indices), g)
    check_csr_matrix(op, g, g)
    check_csr_matrix(op, d, g)
    same_dtype(op, g, d)
    m = crow_indices.numel() - 1
    check(grad_out.shape[0] == m, op, "grad_out_rows", m=m, rows=grad_out.shape[0])
    check(grad_out.shape[1] == dense.shape[1], op, "grad_out_columns", x_columns=grad_out.shape[1],
          y_columns=dense.shape[1])
    return grad_out.new_empty((col_indices.shape[0],))


@torch.library.register_fake("myns::_csr_transpose")
def csr_transpose(crow_indices: torch.Tensor, col_indices: torch.Tensor,
                  K: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    op = "_csr_transpose"
    c = ("crow_indices", crow_indices)
    check_csr_indices(op, c, ("col_indices", col_indices), c)
    check(K >= 0, op, "negative_K", K=K)
    nnz = col_indices.shape[0]
    return crow_indices.new_empty((K + 1,)), crow_indices.new_empty((nnz,)), crow_indices.new_empty((nnz,))
