"""Fake kernel for myns::sddmm, with the checks of csrc/csr/csr.cpp in the same order (messages:
meta_kernels._checks.MESSAGES). The result is (nnz,) or (nnz, H), nnz = col_indices.numel()."""

from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, check, dtype_in, same_device, same_dtype
from .csr_spmm import check_csr_indices, check_rows, dims


@torch.library.register_fake("myns::sddmm")
def sddmm(crow_indices: torch.Tensor, col_indices: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
          op: str = "dot") -> torch.Tensor:
    name = "sddmm"
    check(op in ("dot", "add", "mul"), name, "sddmm_op", got=op)
    na, nb = ("a", a), ("b", b)
    check_csr_indices(name, ("crow_indices", crow_indices), ("col_indices", col_indices), na)
    same_device(name, na, nb)
    dot = op == "dot"
    what = "2-D (rows, D) or 3-D (rows, H, D)" if dot else "1-D (rows) or 2-D (rows, H)"
    dims(name, na, 2 if dot else 1, 3 if dot else 2, what)
    dims(name, nb, 2 if dot else 1, 3 if dot else 2, what)
    dtype_in(name, na, FLOAT_DTYPES)
    same_dtype(name, na, nb)
    check(a.dim() == b.dim() and all(x == y for x, y in zip(a.shape[1:], b.shape[1:])), name, "same_trailing",
          x="a", y="b", x_shape=list(a.shape), y_shape=list(b.shape))
    check_rows(name, na, crow_indices.numel() - 1)
    heads = a.dim() == (3 if dot else 2)
    return a.new_empty((col_indices.shape[0], a.shape[1]) if heads else (col_indices.shape[0],))
