"""Fake kernels for myns::vector_add and myns::vector_add_out."""

from __future__ import annotations

import torch

from ._checks import FLOAT_AND_INT_DTYPES, check_elementwise, same_device, same_dtype


@torch.library.register_fake("myns::vector_add")
def vector_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    check_elementwise("vector_add", [("a", a), ("b", b)], FLOAT_AND_INT_DTYPES)
    return a.new_empty(a.shape)  # dense, like the real kernels' output


@torch.library.register_fake("myns::vector_add_out")
def vector_add_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    op = "vector_add_out"
    check_elementwise(op, [("a", a), ("b", b)], FLOAT_AND_INT_DTYPES)
    same_device(op, ("a", a), ("out", out))
    same_dtype(op, ("a", a), ("out", out))
    if out.shape == a.shape:
        return
    if torch._guards.TracingContext.try_get() is not None:
        # torch.compile / torch.export: a resized graph input is not traced (nor is torch.add(out=)'s). A graph
        # break, not an argument error: torch.compile runs the call eagerly, fullgraph and export refuse it.
        from torch._dynamo.exc import Unsupported

        raise Unsupported(f"myns::{op}: out of shape {list(out.shape)} would be resized to a's shape "
                          f"{list(a.shape)}, which a traced graph cannot do; pass an out of that shape")
    out.resize_(a.shape)  # as the real kernels resize it
