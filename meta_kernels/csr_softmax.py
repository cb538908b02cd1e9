"""Fake kernels for myns::csr_softmax and _csr_softmax_backward, with the checks of csrc/csr/csr.cpp in the same
order (messages: meta_kernels._checks.MESSAGES). Both results have values' shape."""

from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, check, dtype_in, same_device, same_dtype
from .csr_spmm import check_crow_indices, dims

_VALUES = "1-D (nnz) or 2-D (nnz, H)"


@torch.library.register_fake("myns::csr_softmax")
def csr_softmax(crow_indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    op = "csr_softmax"
    v = ("values", values)
    check_crow_indices(op, ("crow_indices", crow_indices), v)
    dims(op, v, 1, 2, _VALUES)
    dtype_in(op, v, FLOAT_DTYPES)
    return values.new_empty(values.shape)


@torch.library.register_fake("myns::_csr_softmax_backward")
def csr_softmax_backward(crow_indices: torch.Tensor, grad_out: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    op = "_csr_softmax_backward"
    g, v = ("grad_out", grad_out), ("values", values)
    check_crow_indices(op, ("crow_indices", crow_indices), v)
    same_device(op, v, g)
    dims(op, v, 1, 2, _VALUES)
    dtype_in(op, v, FLOAT_DTYPES)
    same_dtype(op, g, v)
    check(grad_out.dim() == values.dim() and all(x == y for x, y in zip(grad_out.shape, values.shape)), op,
          "same_shape", x="grad_out", y="values", x_shape=list(grad_out.shape), y_shape=list(values.shape))
    return values.new_empty(values.shape)
