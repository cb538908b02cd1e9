"""Typed Python wrappers over the torch.ops.myns operators.

Each wrapper is a thin call into the dispatcher: argument checking happens once, in C++ (and in the fake
kernels under meta_kernels), so errors read the same however the op is reached.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["swiglu", "vector_add"]

# Resolved once: attribute lookups through torch.ops cost about as much as a small kernel launch.
_vector_add = torch.ops.myns.vector_add.default
_vector_add_out = torch.ops.myns.vector_add_out.default
_swiglu = torch.ops.myns.swiglu.default

# Each wrapper comes in two bodies with the same logic. The public one calls the C++ entry behind each
# OpOverload (`._op`): OpOverload.__call__ only adds a Python frame and a check for ops with Python-level
# dispatch, which ours are not (torch function and dispatch modes are still honoured in C++), and a
# small call can't afford either. torch.compile can't see into `._op`, so the second body, registered
# with substitute_in_graph, is what dynamo traces instead: it calls the OpOverloads, which land in the
# graph. (A runtime `is_compiling()` branch would cost eager calls ~0.4 us.)
_vector_add_c = _vector_add._op
_vector_add_out_c = _vector_add_out._op
_swiglu_c = _swiglu._op


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
    if out is None:
        return _vector_add_c(a, b)
    _vector_add_out_c(a, b, out)
    return out


@torch.compiler.substitute_in_graph(vector_add)
def _vector_add_traced(a: Tensor, b: Tensor, *, out: Tensor | None = None) -> Tensor:
    if out is None:
        return _vector_add(a, b)
    _vector_add_out(a, b, out)
    return out


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """SwiGLU activation ``silu(gate) * up`` (``silu(x) = x * sigmoid(x)``), fused in one pass.

    Args:
        gate, up: tensors of the same shape, dtype (float16, bfloat16, float32 or float64) and device.
            Any strides: the two halves of ``x.chunk(2, dim=-1)`` are read in place, without copies.
            No broadcasting and no type promotion.

    Returns:
        A new contiguous tensor of ``gate``'s shape and dtype. float16/bfloat16 are computed in float32.

    Differentiable in ``gate`` and ``up``: the backward is the ``myns::swiglu_backward`` op, which
    recomputes the sigmoid instead of saving activations (it is itself differentiable, for double
    backward). Forward-mode AD (``torch.func.jvp``) is supported. Works under ``torch.compile``,
    ``torch.export``, TorchScript (as ``torch.ops.myns.swiglu``) and AOTInductor.

    Example::

        >>> x = torch.randn(4, 2 * 11008)           # fused gate/up projection output
        >>> y = torchops.swiglu(*x.chunk(2, dim=-1))  # (4, 11008)
    """
    return _swiglu_c(gate, up)


@torch.compiler.substitute_in_graph(swiglu)
def _swiglu_traced(gate: Tensor, up: Tensor) -> Tensor:
    return _swiglu(gate, up)
