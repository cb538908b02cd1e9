"""Typed Python wrappers over the torch.ops.myns operators.

Each wrapper is a thin call into the dispatcher: argument checking happens once, in C++ (and in the fake
kernels under meta_kernels), so errors read the same however the op is reached.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["vector_add"]


def _eager_entry(overload: torch._ops.OpOverload):
    """The C++ entry point behind an OpOverload, for eager calls.

    ``OpOverload.__call__`` adds a Python frame and checks that only matter for ops with Python-level
    dispatch; skipping them makes a small call as cheap as ``torch.add``. Under torch.compile the
    OpOverload itself must be called, so dynamo sees the op (see ``_call``).
    """
    return overload._op


# Resolved once: attribute lookups through torch.ops cost more than a small kernel launch.
_vector_add = torch.ops.myns.vector_add.default
_vector_add_out = torch.ops.myns.vector_add_out.default
_vector_add_eager = _eager_entry(_vector_add)
_vector_add_out_eager = _eager_entry(_vector_add_out)
_is_compiling = torch.compiler.is_compiling


def vector_add(a: Tensor, b: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Elementwise ``a + b``.

    Args:
        a, b: tensors of the same shape, dtype (float16, bfloat16, float32, float64, int32 or int64) and
            device. Any strides; no broadcasting and no type promotion.
        out: optional destination of the same shape, dtype and device. It may be ``a`` or ``b``
            itself (in-place), but must not partially overlap them. Not differentiable.

    Returns:
        A new contiguous tensor, or ``out`` when given.

    Differentiable in ``a`` and ``b`` (float dtypes). Works under ``torch.compile``, ``torch.export``,
    TorchScript (as ``torch.ops.myns.vector_add``) and AOTInductor.
    """
    if _is_compiling():
        if out is None:
            return _vector_add(a, b)
        _vector_add_out(a, b, out)
        return out
    if out is None:
        return _vector_add_eager(a, b)
    _vector_add_out_eager(a, b, out)
    return out
