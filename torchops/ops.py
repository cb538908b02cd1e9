"""Typed Python wrappers over the torch.ops.myns operators.

Each wrapper is a thin call into the dispatcher: argument checking happens once, in C++ (and in the fake
kernels, torchops._meta_kernels), so errors read the same however the op is reached.

One pattern for every wrapper, two bodies with the same logic:

- the public one calls the C++ entry behind each OpOverload (``OpOverload._op``, bound once below as
  ``_<op>_c``). OpOverload.__call__ only adds a Python frame and a check for ops with Python-level
  dispatch, which ours are not (torch function and dispatch modes are still honoured in C++), and a small
  call can't afford either; nor can it afford a runtime ``torch.compiler.is_compiling()`` branch.
  A good call pays for nothing else. A call that raised takes the slow path, ``_failed``, from inside
  the ``except`` block: a None where the schema wants a tensor becomes a TypeError naming it, and
  inference-mode tensors that autograd would have to save are retried as clones (torch's functions save
  only tensors they compute, so they take such inputs); any other error is raised as it came.
- a twin decorated ``@traced_as(<public>)`` calls the OpOverloads themselves (``_<op>``): torch.compile
  can't see into ``._op``, so it traces the twin instead and the OpOverloads land in the graph. Eager-only
  work (spmm's transpose cache) lives in the public body only.

``traced_as`` (torchops/_polyfills.py) registers the twin with ``torch.compiler.substitute_in_graph`` once
torch._dynamo is imported, so ``import torchops`` does not import it. ``scripted_as(<OpOverload>)`` makes
TorchScript compile a call of the public wrapper as a call of the op, so the wrapper must take the schema's
arguments and defaults (tests/test_wrappers.py checks it); it may make some keyword-only and add
keyword-only options of its own (``out=``), which TorchScript does not take. A new op's wrapper is thus::

    _rms_norm, _rms_norm_c = _entries(torch.ops.myns.rms_norm.default)

    @scripted_as(_rms_norm)
    def rms_norm(input: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
        ...  # docstring
        try:
            return _rms_norm_c(input, weight, eps)
        except RuntimeError:
            return _failed(_rms_norm_c, _rms_norm, input, weight, eps)

    @traced_as(rms_norm)
    def _rms_norm_traced(input: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
        return _rms_norm(input, weight, eps)

Keyword-only schema arguments are passed by keyword to both entries (``..., weight_offset=weight_offset)``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from torchops._meta_kernels._checks import INT_DTYPES, message
from torchops._polyfills import scripted_as, traced_as

__all__ = ["add_rms_norm", "apply_rotary_pos_emb", "cross_entropy", "csr_softmax", "csr_spmm", "gelu_and_mul",
           "layer_norm", "linear_cross_entropy", "qk_norm_rope", "rms_norm", "rotary_embedding", "rotary_embedding_",
           "sddmm", "spmm", "spmm_reduce", "swiglu", "vector_add"]


def _entries(overload: torch._ops.OpOverload) -> tuple[torch._ops.OpOverload, Callable[..., Any]]:
    """The OpOverload (for traced bodies) and its C++ entry (for eager bodies), resolved once: attribute
    lookups through torch.ops cost about as much as a small kernel launch."""
    return overload, overload._op


_vector_add, _vector_add_c = _entries(torch.ops.myns.vector_add.default)
_vector_add_out, _vector_add_out_c = _entries(torch.ops.myns.vector_add_out.default)
_swiglu, _swiglu_c = _entries(torch.ops.myns.swiglu.default)
_gelu_and_mul, _gelu_and_mul_c = _entries(torch.ops.myns.gelu_and_mul.default)
_rms_norm, _rms_norm_c = _entries(torch.ops.myns.rms_norm.default)
_add_rms_norm, _add_rms_norm_c = _entries(torch.ops.myns.add_rms_norm.default)
_layer_norm, _layer_norm_c = _entries(torch.ops.myns.layer_norm.default)
_csr_spmm, _csr_spmm_c = _entries(torch.ops.myns.csr_spmm.default)
_csr_spmm_with_transpose, _csr_spmm_with_transpose_c = _entries(torch.ops.myns._csr_spmm_with_transpose.default)
_csr_transpose = torch.ops.myns._csr_transpose.default
_spmm_reduce, _spmm_reduce_c = _entries(torch.ops.myns.spmm_reduce.default)
_sddmm, _sddmm_c = _entries(torch.ops.myns.sddmm.default)
_csr_softmax, _csr_softmax_c = _entries(torch.ops.myns.csr_softmax.default)
_linear_cross_entropy, _linear_cross_entropy_c = _entries(torch.ops.myns.linear_cross_entropy.default)
_linear_cross_entropy_chunked, _linear_cross_entropy_chunked_c = _entries(
    torch.ops.myns._linear_cross_entropy_chunked.default)
_cross_entropy, _cross_entropy_c = _entries(torch.ops.myns.cross_entropy.default)
_rotary_embedding, _rotary_embedding_c = _entries(torch.ops.myns.rotary_embedding.default)
_rotary_embedding_inplace, _rotary_embedding_inplace_c = _entries(torch.ops.myns.rotary_embedding_.default)
_qk_norm_rope, _qk_norm_rope_c = _entries(torch.ops.myns.qk_norm_rope.default)


def _reject_none(overload: torch._ops.OpOverload, args: tuple[Any, ...]) -> None:
    """A TypeError naming the op and the first argument (in schema order) where a Tensor is None."""
    for argument, value in zip(overload._schema.arguments, args):
        if value is None and isinstance(argument.type, torch.TensorType):
            raise TypeError(f"{overload._schema.name}: {argument.name} must be a Tensor, got None") from None


def _failed(entry: Callable[..., Any], overload: torch._ops.OpOverload, *args: Any) -> Any:
    """The slow path of a call whose C++ entry raised, called from its ``except`` block (never on a good call).

    ``args`` are the entry's arguments, in schema order. A None where the schema wants a Tensor is a
    TypeError naming the op and the argument (the dispatcher would report "no tensor arguments" with its
    kernel table, or an undefined tensor). Tensors made under ``torch.inference_mode()``, used outside it
    in a call that records autograd, cannot be saved for backward: the call is made again on clones of
    them, which can (``F.rms_norm`` and friends save only tensors they compute, so they take such inputs).
    Anything else re-raises the error being handled.
    """
    _reject_none(overload, args)
    tensors = [a for a in args if isinstance(a, Tensor)]
    if (torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            and any(t.is_inference() for t in tensors) and any(t.requires_grad for t in tensors)):
        return entry(*(a.clone() if isinstance(a, Tensor) and a.is_inference() else a for a in args))
    raise  # the error being handled: _failed runs inside the caller's except block


@scripted_as(_vector_add)
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
    TorchScript and AOTInductor. TorchScript compiles ``vector_add(a, b)`` as ``myns::vector_add``; there,
    write ``out=`` as ``torch.ops.myns.vector_add_out(a, b, out)``.
    """
    if out is None:
        try:
            return _vector_add_c(a, b)
        except RuntimeError:
            return _failed(_vector_add_c, _vector_add, a, b)
    if isinstance(out, Tensor) and isinstance(a, Tensor) and isinstance(b, Tensor) and out.shape != a.shape == b.shape:
        _resize_out(out, a.shape)
    try:
        _vector_add_out_c(a, b, out)
    except RuntimeError:
        _failed(_vector_add_out_c, _vector_add_out, a, b, out)
    return out


def _resize_out(out: Tensor, shape: torch.Size) -> None:
    """What torch's out= ops do with an out of another shape, warning through Python's warnings as torch.add
    does (the C++ kernels' own warning, through torch.ops, reaches only stderr)."""
    if out.numel() != 0:
        warnings.warn(f"An output with one or more elements was resized since it had shape {list(out.shape)}, "
                      f"which does not match the required output shape {list(shape)}. This behavior is deprecated, "
                      "and in a future PyTorch release outputs will not be resized unless they have zero elements. "
                      "You can explicitly reuse an out tensor t by resizing it, inplace, to zero elements with "
                      "t.resize_(0).", UserWarning, stacklevel=3)
    out.resize_(shape)


@traced_as(vector_add)
def _vector_add_traced(a: Tensor, b: Tensor, *, out: Tensor | None = None) -> Tensor:
    if out is None:
        return _vector_add(a, b)
    _vector_add_out(a, b, out)
    return out


@scripted_as(_swiglu)
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
    ``torch.export``, TorchScript and AOTInductor.

    Example::

        >>> x = torch.randn(4, 2 * 11008)           # fused gate/up projection output
        >>> y = torchops.swiglu(*x.chunk(2, dim=-1))  # (4, 11008)
    """
    try:
        return _swiglu_c(gate, up)
    except RuntimeError:
        return _failed(_swiglu_c, _swiglu, gate, up)


@traced_as(swiglu)
def _swiglu_traced(gate: Tensor, up: Tensor) -> Tensor:
    return _swiglu(gate, up)


@scripted_as(_gelu_and_mul)
def gelu_and_mul(gate: Tensor, up: Tensor, approximate: str = "none") -> Tensor:
    """GeGLU activation ``F.gelu(gate, approximate=approximate) * up``, fused in one pass.

    Args:
        gate, up: tensors of the same shape, dtype (float16, bfloat16, float32 or float64) and device.
            Any strides: the two halves of ``x.chunk(2, dim=-1)`` are read in place, without copies.
            No broadcasting and no type promotion.
        approximate: ``"none"`` for the exact GELU ``x * Phi(x)`` (erf), ``"tanh"`` for its tanh
            approximation, as in ``torch.nn.functional.gelu``. Anything else raises.

    Returns:
        A new contiguous tensor of ``gate``'s shape and dtype. float16/bfloat16 are computed in float32.

    Differentiable in ``gate`` and ``up``: the backward is the ``myns::gelu_and_mul_backward`` op, which
    recomputes the activation instead of saving it (it is itself differentiable, for double backward).
    Forward-mode AD (``torch.func.jvp``) is supported. Works under ``torch.compile``, ``torch.export``,
    TorchScript and AOTInductor.

    Example::

        >>> x = torch.randn(4, 2 * 16384)                                   # fused gate/up projection
        >>> y = torchops.gelu_and_mul(*x.chunk(2, dim=-1), approximate="tanh")  # (4, 16384)
    """
    try:
        return _gelu_and_mul_c(gate, up, approximate)
    except RuntimeError:
        return _failed(_gelu_and_mul_c, _gelu_and_mul, gate, up, approximate)


@traced_as(gelu_and_mul)
def _gelu_and_mul_traced(gate: Tensor, up: Tensor, approximate: str = "none") -> Tensor:
    return _gelu_and_mul(gate, up, approximate)


@scripted_as(_rms_norm)
def rms_norm(input: Tensor, weight: Tensor | None = None, eps: float = 1e-6, *, weight_offset: float = 0.0) -> Tensor:
    """Root-mean-square normalisation over the last dimension:
    ``x * rsqrt(mean(x**2, -1) + eps) * (weight + weight_offset)``.

    Equal to ``torch.nn.functional.rms_norm(input, (input.shape[-1],), weight + weight_offset, eps)`` with the
    offset weight formed in float32.

    Args:
        input: float16, bfloat16, float32 or float64 tensor of shape ``(..., N)``, ``N >= 1``, any leading
            shape (also empty). Rows with a row stride and a dense last dimension are read in place; other
            layouts are copied to a dense tensor first.
        weight: optional tensor of shape ``(N,)`` on input's device, of input's dtype, or float32 with a
            float16/bfloat16 input (mixed precision).
        eps: added to the mean of squares before the inverse square root.
        weight_offset: added to the weight in float32 (float64 for float64 input) before scaling: Gemma stores
            ``w`` and scales by ``1 + w`` (``weight_offset=1.0``). Needs a weight (non-zero with ``weight=None``
            raises).

    Returns:
        A new contiguous tensor of input's shape and dtype. Sums run in float32 (float64 for float64 input)
        with float64 partials for long float32 rows, so the error does not grow with N; ``x * rstd`` is formed
        in that precision, then multiplied by ``weight + weight_offset`` and rounded once, as ``F.rms_norm`` does.

    Differentiable in ``input`` and ``weight``, to any order, in backward and forward mode and under
    ``torch.func`` transforms (dweight is deterministic). Works under ``torch.compile``, ``torch.export``,
    TorchScript and AOTInductor. :class:`torchops.nn.RMSNorm` normalises over several trailing dimensions.
    """
    try:
        return _rms_norm_c(input, weight, eps, weight_offset)
    except RuntimeError:
        return _failed(_rms_norm_c, _rms_norm, input, weight, eps, weight_offset)


@traced_as(rms_norm)
def _rms_norm_traced(input: Tensor, weight: Tensor | None = None, eps: float = 1e-6, *,
                     weight_offset: float = 0.0) -> Tensor:
    return _rms_norm(input, weight, eps, weight_offset)


@scripted_as(_add_rms_norm)
def add_rms_norm(input: Tensor, residual: Tensor, weight: Tensor | None = None, eps: float = 1e-6, *,
                 weight_offset: float = 0.0) -> tuple[Tensor, Tensor]:
    """The residual add of a pre-norm transformer block fused into the norm that follows it.

    Returns ``(out, residual_out)`` with ``residual_out = input + residual`` (rounded to input's dtype, as the
    model would store it) and ``out = rms_norm(residual_out, weight, eps, weight_offset=weight_offset)``
    computed from the rounded ``residual_out``. One pass reads input and residual once and writes both outputs.

    Args:
        input, residual: tensors of the same shape ``(..., N)``, dtype (float16, bfloat16, float32, float64)
            and device; any layout (as rms_norm's input).
        weight, eps, weight_offset: as for :func:`rms_norm`.

    Returns:
        Two new contiguous tensors of input's shape and dtype.

    Differentiable in ``input``, ``residual`` and ``weight`` (backward and forward mode, ``torch.func``
    transforms; first derivatives only: a second derivative raises; both summands receive the same gradient:
    rms_norm's input gradient of ``residual_out`` plus ``residual_out``'s own gradient). Works under
    ``torch.compile``, ``torch.export``, TorchScript and AOTInductor.
    """
    try:
        return _add_rms_norm_c(input, residual, weight, eps, weight_offset)
    except RuntimeError:
        return _failed(_add_rms_norm_c, _add_rms_norm, input, residual, weight, eps, weight_offset)


@traced_as(add_rms_norm)
def _add_rms_norm_traced(input: Tensor, residual: Tensor, weight: Tensor | None = None, eps: float = 1e-6, *,
                         weight_offset: float = 0.0) -> tuple[Tensor, Tensor]:
    return _add_rms_norm(input, residual, weight, eps, weight_offset)


@scripted_as(_layer_norm)
def layer_norm(input: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Layer normalisation over the last dimension: ``(x - mean) * rsqrt(var + eps) * weight + bias``, with
    the mean and the biased variance of each row, as ``torch.nn.functional.layer_norm(input, (N,), weight,
    bias, eps)``.

    Args:
        input: float16, bfloat16, float32 or float64 tensor of shape ``(..., N)``, ``N >= 1``, any leading
            shape (also empty) and layout.
        weight, bias: optional tensors of shape ``(N,)`` on input's device, of input's dtype, or float32 with
            a float16/bfloat16 input (mixed precision); both of one dtype when both are given.
        eps: added to the variance before the inverse square root.

    Returns:
        A new contiguous tensor of input's shape and dtype. Mean and variance are computed in float32
        (float64 for float64 input).

    Differentiable in ``input``, ``weight`` and ``bias``, to second order and in forward mode. Works under
    ``torch.compile``, ``torch.export``, TorchScript and AOTInductor. :class:`torchops.nn.LayerNorm`
    normalises over several trailing dimensions.
    """
    try:
        return _layer_norm_c(input, weight, bias, eps)
    except RuntimeError:
        return _failed(_layer_norm_c, _layer_norm, input, weight, bias, eps)


@traced_as(layer_norm)
def _layer_norm_traced(input: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
                       eps: float = 1e-5) -> Tensor:
    return _layer_norm(input, weight, bias, eps)


def _check_csr_invariants(op: str, crow: Tensor, col: Tensor | None, nnz: int, of: str, K: int | None) -> None:
    """The CPU kernels' structure checks, on any device (reads the indices: synchronises with the GPU), raising
    ``myns::<op>: ...``: crow_indices[0] = 0, non-decreasing, crow_indices[-1] = nnz (the length of `of`), and,
    given col, 0 <= col < K.

    The caller passes only arguments whose metadata the check can read; anything else is left to the op, which
    names it. Meta and fake tensors (torch.compile, torch.export, FakeTensorMode) have no data to read: they
    are not checked.
    """
    tensors = (crow,) if col is None else (crow, col)
    if any(t.is_meta for t in tensors) or torch._guards.detect_fake_mode(tensors) is not None:
        return
    M = crow.numel() - 1

    def fail(key: str, **fields: Any) -> None:
        raise RuntimeError(message(op, key, **fields))

    if (first := int(crow[0])) != 0:
        fail("crow_first", got=first)
    if M > 0:
        down = torch.nonzero(crow[:-1] > crow[1:])
        if down.numel():
            i = int(down[0, 0])
            fail("crow_decreasing", i=i, a=int(crow[i]), j=i + 1, b=int(crow[i + 1]))
    if (last := int(crow[-1])) != nnz:
        fail("crow_last", nnz=nnz, of=of, got=last)
    if col is not None and col.numel():
        bad = torch.nonzero((col < 0) | (col >= K))
        if bad.numel():
            p = int(bad[0, 0])
            fail("col_out_of_range", K=K, p=p, got=int(col[p]))


def _indices_readable(crow: Tensor, col: Tensor | None = None) -> bool:
    """Index tensors whose metadata the structure check can read (else the op reports what is wrong)."""
    ok = crow.dim() == 1 and crow.numel() >= 1 and crow.dtype in INT_DTYPES
    return ok and (col is None or (col.dim() == 1 and col.dtype == crow.dtype))


def _check_spmm_invariants(op: str, overload: torch._ops.OpOverload, crow: Tensor, col: Tensor, values: Any,
                           dense: Tensor, dense_dims: tuple[int, ...]) -> None:
    _reject_none(overload, (crow, col, values, dense))
    if _indices_readable(crow, col) and dense.dim() in dense_dims:
        _check_csr_invariants(op, crow, col, col.numel(), "col_indices", dense.size(0))


@scripted_as(_csr_spmm)
def csr_spmm(crow_indices: Tensor, col_indices: Tensor, values: Tensor, dense: Tensor, *,
             check_invariants: bool = False) -> Tensor:
    """``A @ dense`` for the M x K CSR matrix ``A = (crow_indices, col_indices, values)``, K = ``dense.size(0)``.

    Args:
        crow_indices: 1-D, M + 1 row offsets; int32 or int64.
        col_indices: 1-D, nnz column indices, same dtype as ``crow_indices``; any order within a row,
            duplicates add up.
        values: 1-D, nnz values; float16, bfloat16, float32 or float64 (f32 accumulation for 16-bit).
        dense: K x N, same dtype and device as ``values``. Any row stride is read in place when its columns
            are contiguous; other layouts are copied to contiguous first.
        check_invariants: validate the structure first (crow_indices[0] = 0, non-decreasing,
            crow_indices[M] = nnz, 0 <= col < K) and raise a RuntimeError naming the first bad entry. The CPU
            kernel always validates; the CUDA kernel never does (no synchronisation), and on malformed
            indices returns an unspecified result without reading or writing out of bounds. This check
            reads the indices (a GPU sync), so it is meant for eager code: meta and fake tensors (as
            torch.compile and torch.export trace with) are not checked, having no data to read, and under
            ``torch.compile`` it breaks the graph. Malformed metadata (shapes, dtypes, devices) is
            reported by the op, as without the flag.

    Returns:
        A new contiguous M x N tensor of ``values``' dtype.

    Differentiable in ``values`` (``grad_out[i] . dense[j]`` per nonzero) and ``dense`` (``A^T @ grad_out``,
    through a stable transpose: deterministic), twice over. Works under ``torch.compile``,
    ``torch.export``, TorchScript (without ``check_invariants``) and AOTInductor. :func:`spmm_reduce` is the
    same product with other reductions and attention heads.
    """
    if check_invariants:
        _check_spmm_invariants("csr_spmm", _csr_spmm, crow_indices, col_indices, values, dense, (2,))
    try:
        return _csr_spmm_c(crow_indices, col_indices, values, dense)
    except RuntimeError:
        return _failed(_csr_spmm_c, _csr_spmm, crow_indices, col_indices, values, dense)


@traced_as(csr_spmm)
def _csr_spmm_traced(crow_indices: Tensor, col_indices: Tensor, values: Tensor, dense: Tensor, *,
                     check_invariants: bool = False) -> Tensor:
    if check_invariants:
        _check_spmm_invariants("csr_spmm", _csr_spmm, crow_indices, col_indices, values, dense, (2,))
    return _csr_spmm(crow_indices, col_indices, values, dense)


@scripted_as(_spmm_reduce)
def spmm_reduce(crow_indices: Tensor, col_indices: Tensor, values: Tensor | None, dense: Tensor,
                reduce: str = "sum", *, check_invariants: bool = False) -> Tensor:
    """Row ``i`` of the result reduces ``values[p] * dense[col_indices[p]]`` over row i's nonzeros ``p`` of the
    M x K CSR matrix ``A = (crow_indices, col_indices, values)``: message passing over a graph's edges.

    Args:
        crow_indices, col_indices: the structure, as for :func:`csr_spmm` (int32 or int64; any column order
            within a row; duplicates are separate nonzeros).
        values: None (every value is 1), ``(nnz,)`` (one weight per nonzero, for every head) or ``(nnz, H)``
            (one weight per head; dense must then be ``(K, H, D)``); float16, bfloat16, float32 or float64,
            dense's dtype.
        dense: ``(K, D)`` or ``(K, H, D)`` (attention heads); read in place when its last dimension is
            contiguous.
        reduce: ``"sum"``, ``"mean"`` (sum divided by the row's number of nonzeros), ``"max"`` or ``"min"``
            (per output element). An empty row gives 0 for every reduce.
        check_invariants: validate the structure first, as for :func:`csr_spmm`.

    Returns:
        A new contiguous ``(M, D)`` or ``(M, H, D)`` tensor of dense's dtype (f32 math for 16-bit, f64 for
        f64). Forward equals ``torch.sparse.mm(A, dense, reduce)`` (whose "amax"/"amin" are "max"/"min")
        where torch has it.

    Differentiable in ``values`` and ``dense`` (backward and forward mode). max and min send each output
    element's gradient to one nonzero: the first of its row (lowest position in ``col_indices``) whose product
    is the largest (smallest), a NaN product counting as larger (smaller) than any number, so the choice is
    deterministic (``torch.scatter_reduce`` instead splits it evenly between ties). Sum and mean are
    differentiable twice. No ``nnz x D`` tensor is ever made, forward or backward. Works under
    ``torch.compile`` (dynamic node and edge counts), ``torch.export``, TorchScript (without
    ``check_invariants``) and AOTInductor.
    """
    if check_invariants:
        _check_spmm_invariants("spmm_reduce", _spmm_reduce, crow_indices, col_indices, values, dense, (2, 3))
    try:
        return _spmm_reduce_c(crow_indices, col_indices, values, dense, reduce)
    except RuntimeError:
        return _failed(_spmm_reduce_c, _spmm_reduce, crow_indices, col_indices, values, dense, reduce)


@traced_as(spmm_reduce)
def _spmm_reduce_traced(crow_indices: Tensor, col_indices: Tensor, values: Tensor | None, dense: Tensor,
                        reduce: str = "sum", *, check_invariants: bool = False) -> Tensor:
    if check_invariants:
        _check_spmm_invariants("spmm_reduce", _spmm_reduce, crow_indices, col_indices, values, dense, (2, 3))
    return _spmm_reduce(crow_indices, col_indices, values, dense, reduce)


def _check_sddmm_invariants(crow: Tensor, col: Tensor, a: Tensor, b: Tensor) -> None:
    _reject_none(_sddmm, (crow, col, a, b))
    if _indices_readable(crow, col) and b.dim() >= 1:
        _check_csr_invariants("sddmm", crow, col, col.numel(), "col_indices", b.size(0))


@scripted_as(_sddmm)
def sddmm(crow_indices: Tensor, col_indices: Tensor, a: Tensor, b: Tensor, op: str = "dot", *,
          check_invariants: bool = False) -> Tensor:
    """One value per nonzero ``p = (i, j)`` of the M x K CSR structure ``(crow_indices, col_indices)``, from row
    ``i`` of ``a`` and row ``j`` of ``b`` (sampled dense-dense products: attention scores on a graph's edges).

    Args:
        crow_indices, col_indices: the structure, as for :func:`csr_spmm`.
        a, b: of one float dtype and device. ``op="dot"``: ``a`` ``(M, D)`` and ``b`` ``(K, D)``, or
            ``(M, H, D)`` and ``(K, H, D)``; the result is ``sum_d a[i, ..., d] * b[j, ..., d]``. ``op="add"`` /
            ``"mul"``: ``a`` ``(M,)`` and ``b`` ``(K,)``, or ``(M, H)`` and ``(K, H)``; the result is ``a[i] + b[j]``
            / ``a[i] * b[j]``.
        op: ``"dot"``, ``"add"`` or ``"mul"``.
        check_invariants: validate the structure first, as for :func:`csr_spmm`.

    Returns:
        A new contiguous ``(nnz,)`` or ``(nnz, H)`` tensor of a's dtype (f32 math for 16-bit).

    Differentiable in ``a`` and ``b`` (deterministic; backward and forward mode; twice for every op). Works
    under ``torch.compile``, ``torch.export``, TorchScript (without ``check_invariants``) and AOTInductor.
    """
    if check_invariants:
        _check_sddmm_invariants(crow_indices, col_indices, a, b)
    try:
        return _sddmm_c(crow_indices, col_indices, a, b, op)
    except RuntimeError:
        return _failed(_sddmm_c, _sddmm, crow_indices, col_indices, a, b, op)


@traced_as(sddmm)
def _sddmm_traced(crow_indices: Tensor, col_indices: Tensor, a: Tensor, b: Tensor, op: str = "dot", *,
                  check_invariants: bool = False) -> Tensor:
    if check_invariants:
        _check_sddmm_invariants(crow_indices, col_indices, a, b)
    return _sddmm(crow_indices, col_indices, a, b, op)


def _check_softmax_invariants(crow: Tensor, values: Tensor) -> None:
    _reject_none(_csr_softmax, (crow, values))
    if _indices_readable(crow) and values.dim() >= 1:
        _check_csr_invariants("csr_softmax", crow, None, values.size(0), "values", None)


@scripted_as(_csr_softmax)
def csr_softmax(crow_indices: Tensor, values: Tensor, *, check_invariants: bool = False) -> Tensor:
    """Softmax over each row's nonzeros: ``out[p] = exp(values[p]) / sum(exp(values[q]) for q in row(p))``, per
    head (attention weights over each node's incoming edges).

    Args:
        crow_indices: 1-D, M + 1 row offsets (int32 or int64); the rows' nonzeros are values' entries
            ``crow_indices[i]:crow_indices[i + 1]``.
        values: ``(nnz,)`` or ``(nnz, H)``, float16, bfloat16, float32 or float64.
        check_invariants: validate the row offsets first (crow_indices[0] = 0, non-decreasing,
            crow_indices[-1] = nnz), as for :func:`csr_spmm`.

    Returns:
        A new contiguous tensor of values' shape and dtype. Computed in f32 (f64 for f64), shifted by the row's
        maximum, so it never overflows; an empty row has nothing to normalise; a row holding a NaN is NaN, as
        in ``torch.softmax``. Under autocast it runs in float32, like ``torch.softmax``.

    Differentiable in ``values`` (backward, with the softmax recomputed rather than saved, and forward mode).
    Works under ``torch.compile``, ``torch.export``, TorchScript (without ``check_invariants``) and
    AOTInductor.
    """
    if check_invariants:
        _check_softmax_invariants(crow_indices, values)
    try:
        return _csr_softmax_c(crow_indices, values)
    except RuntimeError:
        return _failed(_csr_softmax_c, _csr_softmax, crow_indices, values)


@traced_as(csr_softmax)
def _csr_softmax_traced(crow_indices: Tensor, values: Tensor, *, check_invariants: bool = False) -> Tensor:
    if check_invariants:
        _check_softmax_invariants(crow_indices, values)
    return _csr_softmax(crow_indices, values)


class _Structure:
    """A private copy of a CSR tensor's indices, and the transpose of that structure once a call needed it.

    Compared with A's indices on every call: an in-place change through another tensor sharing their memory
    (the tensors A was built from, a numpy view, .data) bumps no version counter that A can see, so nothing
    short of the contents proves the copy current. The copy is what the op runs on when a gradient is
    recorded, so backward sees the structure the forward used even if A's indices change in between.
    """

    __slots__ = ("crow", "col", "K", "_transpose")

    def __init__(self, crow: Tensor, col: Tensor, K: int) -> None:
        self.crow, self.col, self.K = crow.clone(), col.clone(), K
        self._transpose: tuple[Tensor, Tensor, Tensor] | None = None

    def copies(self, crow: Tensor, col: Tensor, K: int) -> bool:
        return K == self.K and _same_contents(crow, self.crow) and _same_contents(col, self.col)

    def transpose(self) -> tuple[Tensor, Tensor, Tensor]:
        """(t_crow_indices, t_col_indices, t_perm), computed on first use."""
        if self._transpose is None:
            self._transpose = tuple(_csr_transpose(self.crow, self.col, self.K))
        return self._transpose


def _same_contents(a: Tensor, b: Tensor) -> bool:
    return a.dtype == b.dtype and a.device == b.device and a.shape == b.shape and torch.equal(a, b)


# One structure per sparse tensor, dropped with it. Keyed by identity: a CSR tensor built anew each call
# (even from the same index tensors) misses the cache.
_STRUCTURE_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _cached_structure(A: Tensor, crow: Tensor, col: Tensor) -> _Structure:
    K = A.size(1)
    entry = _STRUCTURE_CACHE.get(A)
    if entry is None or not entry.copies(crow, col, K):
        entry = _Structure(crow, col, K)
        _STRUCTURE_CACHE[A] = entry
    return entry


def _csr_parts(A: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    try:
        return A.crow_indices(), A.col_indices(), A.values()
    except RuntimeError as e:  # torch.func transforms cannot take a sparse tensor apart ("no strides")
        raise RuntimeError(
            "torchops.spmm: cannot read the sparse CSR tensor's parts here (inside torch.func transforms, e.g. "
            "grad, vjp, jvp / forward-mode AD, vmap, PyTorch cannot); take A.crow_indices(), A.col_indices() "
            f"and A.values() outside the transform and call torchops.csr_spmm ({e})") from e


def _check_spmm_args(A: Tensor, dense: Tensor) -> None:
    for name, value in (("A", A), ("dense", dense)):
        if value is None:
            raise TypeError(f"torchops.spmm: {name} must be a Tensor, got None")
    if A.layout != torch.sparse_csr or A.dim() != 2:
        raise RuntimeError(f"torchops.spmm: A must be a 2-D sparse CSR tensor, got layout {A.layout} with {A.dim()} dims")
    if dense.dim() in (2, 3) and A.size(1) != dense.size(0):
        raise RuntimeError(f"torchops.spmm: A is {A.size(0)} x {A.size(1)} but dense has {dense.size(0)} rows")


def _is_plain_product(dense: Tensor, reduce: str) -> bool:
    """Whether spmm is csr_spmm (a sum with a 2-D dense), else spmm_reduce."""
    return reduce == "sum" and dense.dim() == 2


def spmm(A: Tensor, dense: Tensor, reduce: str = "sum") -> Tensor:
    """``A @ dense`` (or another reduction) for a 2-D ``torch.sparse_csr_tensor`` ``A`` (M x K) and a
    ``(K, D)`` or ``(K, H, D)`` ``dense``; see :func:`csr_spmm` and :func:`spmm_reduce` (``reduce`` "sum", "mean",
    "max" or "min"; A's values are the weights, shared by every head).

    Gradients flow to ``dense`` and to ``A`` (through ``A.values()``; ``A.grad`` is then a sparse CSR
    tensor with A's structure). When a gradient is recorded, the op runs on a private copy of A's indices,
    cached on ``A`` (dropped with it) and compared with A's indices on each call (one pass over them; on
    CUDA a synchronisation): backward then uses the structure the forward used, even if A's indices change
    in place by any route in between, and a copy that no longer matches is taken anew. When ``dense``
    needs a gradient, the transposed structure (a stable sort of the nonzeros by column) is computed once
    per copy: a GNN layer that multiplies by the same adjacency every step pays for it once, and each
    backward is one SDDMM plus one SpMM. ``torch.compile`` does not take sparse tensors: it breaks the
    graph at ``A`` and this function runs eagerly there; in compiled code, call :func:`csr_spmm` or
    :func:`spmm_reduce` with A's index tensors. TorchScript compiles it as those ops on A's parts. Traced and
    scripted code never caches.
    """
    if torch.jit.is_scripting():  # TorchScript compiles this branch alone
        if reduce == "sum" and dense.dim() == 2:
            return torch.ops.myns.csr_spmm(A.crow_indices(), A.col_indices(), A.values(), dense)
        return torch.ops.myns.spmm_reduce(A.crow_indices(), A.col_indices(), A.values(), dense, reduce)
    else:
        return _spmm_eager(A, dense, reduce)


def _spmm_eager(A: Tensor, dense: Tensor, reduce: str) -> Tensor:
    _check_spmm_args(A, dense)
    crow, col, values = _csr_parts(A)
    plain = _is_plain_product(dense, reduce)
    entry, overload = (_csr_spmm_c, _csr_spmm) if plain else (_spmm_reduce_c, _spmm_reduce)
    args: tuple[Any, ...] = (crow, col, values, dense) + (() if plain else (reduce,))
    if torch.is_grad_enabled() and (dense.requires_grad or values.requires_grad):
        structure = _cached_structure(A, crow, col)
        args = (structure.crow, structure.col) + args[2:]
        if dense.requires_grad:
            entry, overload = _csr_spmm_with_transpose_c, _csr_spmm_with_transpose
            args = (structure.crow, structure.col, values, dense, *structure.transpose(), reduce)
    try:
        return entry(*args)
    except RuntimeError:
        return _failed(entry, overload, *args)


@traced_as(spmm)
def _spmm_traced(A: Tensor, dense: Tensor, reduce: str = "sum") -> Tensor:
    _check_spmm_args(A, dense)
    if _is_plain_product(dense, reduce):
        return _csr_spmm(A.crow_indices(), A.col_indices(), A.values(), dense)
    return _spmm_reduce(A.crow_indices(), A.col_indices(), A.values(), dense, reduce)


@scripted_as(_linear_cross_entropy)
def linear_cross_entropy(input: Tensor, linear_weight: Tensor, target: Tensor, *, linear_bias: Tensor | None = None,
                         reduction: str = "mean", ignore_index: int | None = -100, label_smoothing: float = 0.0,
                         softcap: float | None = None, chunk_size: int | None = None) -> Tensor:
    """The cross-entropy loss of a linear layer's logits (an LM head), without ever holding all the logits:
    ``F.cross_entropy(F.linear(input, linear_weight, linear_bias), target, ...)`` over the last dimension.

    The keyword names are ``torch.nn.functional.linear_cross_entropy``'s (torch 2.13+), so code written for it
    switches by changing the module. The logits are computed a chunk of tokens at a time (matmuls by ATen:
    cuBLAS on CUDA), each chunk turned in place into its loss terms and, under autograd, its gradient: the
    memory beyond the inputs and their gradients is one chunk of logits, not several tokens x vocabulary
    buffers.

    Args:
        input: ``(..., H)`` float16, bfloat16, float32 or float64; any leading dimensions (flattened to tokens).
        linear_weight: ``(V, H)``, input's dtype and device.
        target: class indices of input's leading shape, int64 or int32. Values outside ``[0, V)`` other than
            ``ignore_index`` raise a RuntimeError on the CPU; on CUDA (which never synchronises to check) such a
            token's loss is NaN and its gradient zero.
        linear_bias: optional ``(V,)``, input's dtype.
        reduction: ``"mean"`` (over the tokens whose target is not ``ignore_index``; NaN when there are none,
            as torch), ``"sum"`` or ``"none"`` (per-token losses of target's shape, 0 at ignored tokens).
        ignore_index: the target value whose tokens are left out (``None``: -100, as torch).
        label_smoothing: in ``[0, 1]``, as ``F.cross_entropy``'s.
        softcap: when given (> 0), the logits are capped to ``softcap * tanh(logits / softcap)`` first (Gemma 2's
            final-logit softcapping).
        chunk_size: tokens per chunk; ``None`` chooses from the sizes (all of them while their logits take at
            most 256 MiB, else equal chunks that do).

    Returns:
        The loss in input's dtype: a 0-dim tensor, or target's shape for ``"none"``. The softmax runs in float32
        (float64 for float64 input) whatever the input's dtype, without a float32 copy of the logits.

    Differentiable in ``input``, ``linear_weight`` and ``linear_bias`` (first derivatives: a second raises).
    For ``"mean"`` and ``"sum"`` the gradients are computed during the forward (one pass over the logits) and
    scaled by the incoming gradient in backward (in place unless the graph is retained); ``"none"``
    recomputes the logits in backward. No host synchronisation: a training step captures in one CUDA graph.
    Works under ``torch.compile`` (fullgraph, dynamic), ``torch.export``, TorchScript (as
    ``torch.ops.myns.linear_cross_entropy``) and AOTInductor; under ``torch.autocast`` the matmuls run in
    autocast's dtype, like ``F.linear``.
    """
    if ignore_index is None:
        ignore_index = -100
    if chunk_size is None:
        entry, overload, args = _linear_cross_entropy_c, _linear_cross_entropy, ()
    else:
        entry, overload, args = _linear_cross_entropy_chunked_c, _linear_cross_entropy_chunked, (chunk_size,)
    args = (input, linear_weight, target, linear_bias, reduction, ignore_index, label_smoothing, softcap, *args)
    try:
        return entry(*args)
    except RuntimeError:
        return _failed(entry, overload, *args)


@traced_as(linear_cross_entropy)
def _linear_cross_entropy_traced(input: Tensor, linear_weight: Tensor, target: Tensor, *,
                                 linear_bias: Tensor | None = None, reduction: str = "mean",
                                 ignore_index: int | None = -100, label_smoothing: float = 0.0,
                                 softcap: float | None = None, chunk_size: int | None = None) -> Tensor:
    if ignore_index is None:
        ignore_index = -100
    if chunk_size is None:
        return _linear_cross_entropy(input, linear_weight, target, linear_bias, reduction, ignore_index,
                                     label_smoothing, softcap)
    return _linear_cross_entropy_chunked(input, linear_weight, target, linear_bias, reduction, ignore_index,
                                         label_smoothing, softcap, chunk_size)


@scripted_as(_cross_entropy)
def cross_entropy(logits: Tensor, target: Tensor, *, reduction: str = "mean", ignore_index: int = -100,
                  label_smoothing: float = 0.0, softcap: float | None = None) -> Tensor:
    """``F.cross_entropy`` over the last dimension of ``logits``, fused: one pass forward, one backward.

    For models that need the logits anyway (else :func:`linear_cross_entropy` saves their memory). Equal to
    ``F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ...)`` (reshaped to target's shape for
    ``"none"``): the class dimension is the *last* one whatever the rank, as in language models (torch's
    takes dimension 1 of inputs of more than two dimensions).

    Args:
        logits: ``(..., V)`` float16, bfloat16, float32 or float64, any layout.
        target, reduction, ignore_index, label_smoothing, softcap: as for :func:`linear_cross_entropy`.

    Returns:
        The loss in logits' dtype (0-dim, or target's shape for ``"none"``). float32 math for 16-bit logits
        (float64 for float64) without a float32 copy of them; autocast leaves the logits as they are.

    Differentiable in ``logits`` (first derivatives): the forward saves each row's log-sum-exp, the backward
    reads the logits once and writes their gradient. No host synchronisation. Works under ``torch.compile``,
    ``torch.export``, TorchScript (as ``torch.ops.myns.cross_entropy``) and AOTInductor.
    """
    try:
        return _cross_entropy_c(logits, target, reduction, ignore_index, label_smoothing, softcap)
    except RuntimeError:
        return _failed(_cross_entropy_c, _cross_entropy, logits, target, reduction, ignore_index, label_smoothing,
                       softcap)


@traced_as(cross_entropy)
def _cross_entropy_traced(logits: Tensor, target: Tensor, *, reduction: str = "mean", ignore_index: int = -100,
                          label_smoothing: float = 0.0, softcap: float | None = None) -> Tensor:
    return _cross_entropy(logits, target, reduction, ignore_index, label_smoothing, softcap)


@scripted_as(_rotary_embedding)
def rotary_embedding(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1,
                     interleaved: bool = False) -> tuple[Tensor, Tensor]:
    """Rotary position embeddings of q and k in one pass: ``(q * cos + rotate_half(q) * sin, k * cos +
    rotate_half(k) * sin)`` over the first ``rot = cos.shape[-1]`` features of each head, the features past
    ``rot`` passed through unchanged (partial rotary, as Phi / GLM apply it), cos and sin unsqueezed at
    ``unsqueeze_dim`` and broadcast as in transformers (``rotate_half(x) = cat(-x2, x1)`` of its halves).

    Args:
        q, k: ``[batch, heads, seq, head_dim]`` (``unsqueeze_dim=1``) or ``[batch, seq, heads, head_dim]``
            (``unsqueeze_dim=2``), float16, bfloat16, float32 or float64, same dtype and device; k's heads may
            differ from q's (GQA). Any strides: the usual ``x.view(b, s, h, d).transpose(1, 2)`` is read in place
            (a last dimension that is not dense is copied first).
        cos, sin: ``[1 or batch, 1 or seq, rot]`` of q's dtype, ``rot`` even and at most head_dim; constants (an
            error if either requires grad: no gradient flows to them).
        unsqueeze_dim: 1 or 2, as above.
        interleaved: GPT-J's rotate-every-two: pairs ``(2i, 2i + 1)`` with cos and sin in that layout.

    Returns:
        Two new tensors of q's and k's shapes and dtype; float16/bfloat16 computed in float32, rounded once. Each
        keeps its input's strides when they are a permutation of dense ones with the features last (transformers'
        ``q_proj(x).view(b, s, h, d).transpose(1, 2)`` stays ``[b, s, h, d]`` in memory, as ``q * cos`` would keep
        it, so the attention after it needs no copy); else it is contiguous. Gradients likewise.

    Differentiable in q and k (the backward, ``myns::_rotary_embedding_backward``, rotates by the negative angle),
    to any order and in forward mode, also under ``torch.func``. Works under ``torch.compile``, ``torch.export``,
    TorchScript and AOTInductor. :func:`apply_rotary_pos_emb` takes transformers' arguments.
    """
    try:
        return _rotary_embedding_c(q, k, cos, sin, unsqueeze_dim, interleaved)
    except RuntimeError:
        return _failed(_rotary_embedding_c, _rotary_embedding, q, k, cos, sin, unsqueeze_dim, interleaved)


@traced_as(rotary_embedding)
def _rotary_embedding_traced(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1,
                             interleaved: bool = False) -> tuple[Tensor, Tensor]:
    return _rotary_embedding(q, k, cos, sin, unsqueeze_dim, interleaved)


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None,
                         unsqueeze_dim: int = 1, interleaved: bool = False) -> tuple[Tensor, Tensor]:
    """transformers' ``apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1)``: a drop-in for
    it, :func:`rotary_embedding` with transformers' arguments. ``position_ids`` is accepted and ignored, as in
    transformers (cos and sin are already per position). TorchScript compiles it as :func:`rotary_embedding`.
    """
    if torch.jit.is_scripting():  # TorchScript compiles this branch alone
        return torch.ops.myns.rotary_embedding(q, k, cos, sin, unsqueeze_dim, interleaved)
    else:
        return rotary_embedding(q, k, cos, sin, unsqueeze_dim, interleaved)


@traced_as(apply_rotary_pos_emb)
def _apply_rotary_pos_emb_traced(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None,
                                 unsqueeze_dim: int = 1, interleaved: bool = False) -> tuple[Tensor, Tensor]:
    return _rotary_embedding(q, k, cos, sin, unsqueeze_dim, interleaved)


@scripted_as(_rotary_embedding_inplace)
def rotary_embedding_(positions: Tensor, query: Tensor, key: Tensor | None, head_size: int, cos_sin_cache: Tensor,
                      is_neox: bool = True) -> None:
    """vLLM's in-place rotary embedding (``vllm._custom_ops.rotary_embedding``): rotates ``query`` and ``key``.

    Token ``t`` is rotated by row ``positions[t]`` of ``cos_sin_cache``, whose first ``rot / 2`` values are the
    cos of each pair and the next ``rot / 2`` its sin; only the first ``rot`` features of each head are rotated.

    Args:
        positions: int64 (or int32) ``[tokens]``.
        query, key: ``[tokens, heads * head_size]`` or ``[tokens, heads, head_size]``, float16, bfloat16, float32
            or float64, any token and head strides with a dense last dimension (a slice of a fused qkv projection
            is rotated where it is); key may be None and may have other heads than query. Written in place; they
            must not share memory with each other or the cache.
        head_size: the features of a head.
        cos_sin_cache: ``[max_position, rot]``, query's dtype or float32 (16-bit query), rot even and at most
            head_size.
        is_neox: True for the rotate-half layout (pairs ``(i, i + rot / 2)``), False for GPT-J's interleaved pairs
            ``(2i, 2i + 1)``.

    Inference only: raises if any tensor requires grad. A position outside ``[0, max_position)`` raises on the
    CPU (before anything is written); on CUDA, which never synchronises to check, that token is left as it is
    (nothing is read from the cache for it, nothing written). Works under ``torch.compile``, ``torch.export``,
    TorchScript (as ``torch.ops.myns.rotary_embedding_``) and AOTInductor.
    """
    try:
        _rotary_embedding_inplace_c(positions, query, key, head_size, cos_sin_cache, is_neox)
    except RuntimeError:
        _failed(_rotary_embedding_inplace_c, _rotary_embedding_inplace, positions, query, key, head_size,
                cos_sin_cache, is_neox)


@traced_as(rotary_embedding_)
def _rotary_embedding__traced(positions: Tensor, query: Tensor, key: Tensor | None, head_size: int,
                              cos_sin_cache: Tensor, is_neox: bool = True) -> None:
    _rotary_embedding_inplace(positions, query, key, head_size, cos_sin_cache, is_neox)


@scripted_as(_qk_norm_rope)
def qk_norm_rope(q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, cos: Tensor, sin: Tensor,
                 eps: float = 1e-6, *, weight_offset: float = 0.0, unsqueeze_dim: int = 1,
                 interleaved: bool = False) -> tuple[Tensor, Tensor]:
    """Per-head RMSNorm of q and k followed by their rotary embedding (Qwen3, Gemma 3), in one pass per tensor.

    Equal to ``rotary_embedding(rms_norm(q, q_weight, eps, weight_offset=weight_offset),
    rms_norm(k, k_weight, eps, weight_offset=weight_offset), cos, sin, unsqueeze_dim=unsqueeze_dim,
    interleaved=interleaved)``, the normalised values kept in float32 (not rounded) before the rotation.

    Args:
        q, k, cos, sin, unsqueeze_dim, interleaved: as for :func:`rotary_embedding` (head_dim at least 1).
        q_weight, k_weight: ``[head_dim]`` of q's dtype, or float32 with 16-bit q.
        eps, weight_offset: as for :func:`rms_norm` (Gemma's ``1 + w`` is ``weight_offset=1.0``).

    Returns:
        Two new tensors of q's and k's shapes and dtype, in their layouts as :func:`rotary_embedding` keeps them.

    Differentiable in q, k, q_weight and k_weight (deterministic weight gradients), to any order under
    ``create_graph=True`` and in forward mode, also under ``torch.func``. Works under ``torch.compile``,
    ``torch.export``, TorchScript (as ``torch.ops.myns.qk_norm_rope``) and AOTInductor.
    """
    try:
        return _qk_norm_rope_c(q, k, q_weight, k_weight, cos, sin, eps, weight_offset, unsqueeze_dim, interleaved)
    except RuntimeError:
        return _failed(_qk_norm_rope_c, _qk_norm_rope, q, k, q_weight, k_weight, cos, sin, eps, weight_offset,
                       unsqueeze_dim, interleaved)


@traced_as(qk_norm_rope)
def _qk_norm_rope_traced(q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, cos: Tensor, sin: Tensor,
                         eps: float = 1e-6, *, weight_offset: float = 0.0, unsqueeze_dim: int = 1,
                         interleaved: bool = False) -> tuple[Tensor, Tensor]:
    return _qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, weight_offset, unsqueeze_dim, interleaved)
