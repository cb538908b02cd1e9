"""Fake kernels for myns::vector_add and myns::vector_add_out."""

from __future__ import annotations

import torch

from ._checks import FLOAT_AND_INT_DTYPES, check_elementwise, write_out


@torch.library.register_fake("myns::vector_add")
def vector_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    check_elementwise("vector_add", [("a", a), ("b", b)], FLOAT_AND_INT_DTYPES)
    return a.new_empty(a.shape)  # dense, like the real kernels' output


@torch.library.register_fake("myns::vector_add_out")
def vector_add_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    check_elementwise("vector_add_out", [("a", a), ("b", b)], FLOAT_AND_INT_DTYPES)
    write_out("vector_add_out", ("a", a), ("out", out))
