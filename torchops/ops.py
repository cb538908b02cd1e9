"""Typed Python wrappers over the torch.ops.myns operators.

Each wrapper is a thin call into the dispatcher: argument checking happens once, in C++ (and in the fake
kernels under meta_kernels), so errors read the same however the op is reached.

One pattern for every wrapper, two bodies with the same logic:

- the public one calls the C++ entry behind each OpOverload (``OpOverload._op``, bound once below as
  ``_<op>_c``). OpOverload.__call__ only adds a Python frame and a check for ops with Python-level
  dispatch, which ours are not (torch function and dispatch modes are still honoured in C++), and a small
  call can't afford either; nor can it afford a runtime ``torch.compiler.is_compiling()`` branch (~0.4 us).
- a twin decorated ``@traced_as(<public>)`` calls the OpOverloads themselves (``_<op>``): torch.compile
  can't see into ``._op``, so it traces the twin instead and the OpOverloads land in the graph. Eager-only
  work (spmm's transpose cache) lives in the public body only.

``traced_as`` (torchops/_polyfills.py) registers the twin with ``torch.compiler.substitute_in_graph`` once
torch._dynamo is imported, so ``import torchops`` does not import it. A new op's wrapper is thus::

    _rms_norm, _rms_norm_c = _entries(torch.ops.myns.rms_norm.default)

    def rms_norm(input: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
        ...  # docstring
        return _rms_norm_c(input, weight, eps)

    @traced_as(rms_norm)
    def _rms_norm_traced(input: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
        return _rms_norm(input, weight, eps)

Keyword-only schema arguments are passed by keyword to both entries (``..., weight_offset=weight_offset)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from meta_kernels._checks import INT_DTYPES
from torchops._polyfills import traced_as

__all__ = ["add_rms_norm", "csr_spmm", "gelu_and_mul", "rms_norm", "spmm", "swiglu", "vector_add"]
__all__ += ["apply_rotary_pos_emb", "qk_norm_rope", "rotary_embedding_"]


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
_csr_spmm, _csr_spmm_c = _entries(torch.ops.myns.csr_spmm.default)
_csr_spmm_with_transpose, _csr_spmm_with_transpose_c = _entries(torch.ops.myns._csr_spmm_with_transpose.default)
_csr_transpose = torch.ops.myns._csr_transpose.default
_rotary_embedding, _rotary_embedding_c = _entries(torch.ops.myns.rotary_embedding.default)
_rotary_embedding_inplace, _rotary_embedding_inplace_c = _entries(torch.ops.myns.rotary_embedding_.default)
_qk_norm_rope, _qk_norm_rope_c = _entries(torch.ops.myns.qk_norm_rope.default)


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


@traced_as(vector_add)
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


@traced_as(swiglu)
def _swiglu_traced(gate: Tensor, up: Tensor) -> Tensor:
    return _swiglu(gate, up)


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
    TorchScript (as ``torch.ops.myns.gelu_and_mul``) and AOTInductor.

    Example::

        >>> x = torch.randn(4, 2 * 16384)                                   # fused gate/up projection
        >>> y = torchops.gelu_and_mul(*x.chunk(2, dim=-1), approximate="tanh")  # (4, 16384)
    """
    return _gelu_and_mul_c(gate, up, approximate)


@traced_as(gelu_and_mul)
def _gelu_and_mul_traced(gate: Tensor, up: Tensor, approximate: str = "none") -> Tensor:
    return _gelu_and_mul(gate, up, approximate)


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
    TorchScript (as ``torch.ops.myns.rms_norm``) and AOTInductor.
    """
    return _rms_norm_c(input, weight, eps, weight_offset)


@traced_as(rms_norm)
def _rms_norm_traced(input: Tensor, weight: Tensor | None = None, eps: float = 1e-6, *,
                     weight_offset: float = 0.0) -> Tensor:
    return _rms_norm(input, weight, eps, weight_offset)


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
    transforms; first derivatives only: a second derivative raises; both summands receive the same gradient: rms_norm's input gradient of ``residual_out`` plus ``residual_out``'s own gradient). Works under
    ``torch.compile``, ``torch.export``, TorchScript (as ``torch.ops.myns.add_rms_norm``) and AOTInductor.
    """
    return _add_rms_norm_c(input, residual, weight, eps, weight_offset)


@traced_as(add_rms_norm)
def _add_rms_norm_traced(input: Tensor, residual: Tensor, weight: Tensor | None = None, eps: float = 1e-6, *,
                         weight_offset: float = 0.0) -> tuple[Tensor, Tensor]:
    return _add_rms_norm(input, residual, weight, eps, weight_offset)


def _check_csr_invariants(op: str, crow: Tensor, col: Tensor, dense: Tensor) -> None:
    """The CPU kernels' structure checks, on any device (reads the indices: synchronises with the GPU).

    Arguments whose metadata is wrong (not 1-D, not integers, a dense that is not 2-D, ...) are left to the
    op, which names them. Meta and fake tensors (torch.compile, torch.export, FakeTensorMode) have no data
    to read: they are not checked.
    """
    if (crow.dim() != 1 or col.dim() != 1 or crow.numel() < 1 or crow.dtype not in INT_DTYPES
            or dense.dim() != 2):
        return
    if crow.is_meta or col.is_meta or torch._guards.detect_fake_mode((crow, col)) is not None:
        return
    nnz, M, K = col.numel(), crow.numel() - 1, dense.size(0)

    def fail(msg: str) -> None:
        raise RuntimeError(f"myns::{op}: {msg}")

    if (first := int(crow[0])) != 0:
        fail(f"crow_indices[0] must be 0, got {first}")
    if M > 0:
        down = torch.nonzero(crow[:-1] > crow[1:])
        if down.numel():
            i = int(down[0, 0])
            fail(f"crow_indices must be non-decreasing, got crow_indices[{i}] = {int(crow[i])} > "
                 f"crow_indices[{i + 1}] = {int(crow[i + 1])}")
    if (last := int(crow[-1])) != nnz:
        fail(f"crow_indices[-1] must equal nnz = {nnz} (the length of col_indices), got {last}")
    if nnz:
        bad = torch.nonzero((col < 0) | (col >= K))
        if bad.numel():
            p = int(bad[0, 0])
            fail(f"col_indices must lie in [0, K) with K = {K}, got col_indices[{p}] = {int(col[p])}")


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
    ``torch.export``, TorchScript (as ``torch.ops.myns.csr_spmm``) and AOTInductor.
    """
    if check_invariants:
        _check_csr_invariants("csr_spmm", crow_indices, col_indices, dense)
    return _csr_spmm_c(crow_indices, col_indices, values, dense)


@traced_as(csr_spmm)
def _csr_spmm_traced(crow_indices: Tensor, col_indices: Tensor, values: Tensor, dense: Tensor, *,
                     check_invariants: bool = False) -> Tensor:
    if check_invariants:
        _check_csr_invariants("csr_spmm", crow_indices, col_indices, dense)
    return _csr_spmm(crow_indices, col_indices, values, dense)


class _Transpose(NamedTuple):
    # Private copies of the structure the transpose was computed from, compared on every hit: an in-place
    # change to A's indices through another tensor sharing their memory (the tensors A was built from, a
    # numpy view, .data) bumps no version counter that A can see, so nothing short of the contents proves
    # the entry current.
    crow: Tensor
    col: Tensor
    K: int
    tensors: tuple[Tensor, Tensor, Tensor]  # t_crow_indices, t_col_indices, t_perm

    def computed_from(self, crow: Tensor, col: Tensor, K: int) -> bool:
        return K == self.K and _same_contents(crow, self.crow) and _same_contents(col, self.col)


def _same_contents(a: Tensor, b: Tensor) -> bool:
    return a.dtype == b.dtype and a.device == b.device and a.shape == b.shape and torch.equal(a, b)


# One transpose per sparse tensor, dropped with it. Keyed by identity: a CSR tensor built anew each call
# (even from the same index tensors) misses the cache.
_TRANSPOSE_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _cached_transpose(A: Tensor, crow: Tensor, col: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    K = A.size(1)
    entry = _TRANSPOSE_CACHE.get(A)
    if entry is None or not entry.computed_from(crow, col, K):
        entry = _Transpose(crow.clone(), col.clone(), K, tuple(_csr_transpose(crow, col, K)))
        _TRANSPOSE_CACHE[A] = entry
    return entry.tensors


def _csr_parts(A: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    try:
        return A.crow_indices(), A.col_indices(), A.values()
    except RuntimeError as e:  # torch.func transforms cannot take a sparse tensor apart ("no strides")
        raise RuntimeError(
            "torchops.spmm: cannot read the sparse CSR tensor's parts here (inside torch.func transforms, e.g. "
            "grad, vjp, jvp / forward-mode AD, vmap, PyTorch cannot); take A.crow_indices(), A.col_indices() "
            f"and A.values() outside the transform and call torchops.csr_spmm ({e})") from e


def _check_spmm_args(A: Tensor, dense: Tensor) -> None:
    if A.layout != torch.sparse_csr or A.dim() != 2:
        raise RuntimeError(f"torchops.spmm: A must be a 2-D sparse CSR tensor, got layout {A.layout} with {A.dim()} dims")
    if dense.dim() == 2 and A.size(1) != dense.size(0):
        raise RuntimeError(f"torchops.spmm: A is {A.size(0)} x {A.size(1)} but dense has {dense.size(0)} rows")


def spmm(A: Tensor, dense: Tensor) -> Tensor:
    """``A @ dense`` for a 2-D ``torch.sparse_csr_tensor`` ``A`` (M x K) and a K x N ``dense``; see :func:`csr_spmm`.

    Gradients flow to ``dense`` and to ``A`` (through ``A.values()``; ``A.grad`` is then a sparse CSR
    tensor with A's structure). When ``dense`` needs a gradient, the transposed structure of ``A`` (a
    stable sort of its nonzeros by column) is computed once and cached on ``A`` (dropped with it), with a
    private copy of A's indices: each later call compares A's indices with that copy (one pass over them;
    on CUDA a synchronisation) and recomputes the transpose if they changed in place by any route. A GNN
    layer that multiplies by the same adjacency every step then pays for the transpose once, and each
    backward is one SDDMM plus one SpMM. ``torch.compile`` does not take sparse tensors: it breaks the
    graph at ``A`` and this function runs eagerly there; in compiled code, call :func:`csr_spmm` with A's
    index tensors. Traced code never caches.
    """
    _check_spmm_args(A, dense)
    crow, col, values = _csr_parts(A)
    if torch.is_grad_enabled() and dense.requires_grad:
        return _csr_spmm_with_transpose_c(crow, col, values, dense, *_cached_transpose(A, crow, col))
    return _csr_spmm_c(crow, col, values, dense)


@traced_as(spmm)
def _spmm_traced(A: Tensor, dense: Tensor) -> Tensor:
    _check_spmm_args(A, dense)
    return _csr_spmm(A.crow_indices(), A.col_indices(), A.values(), dense)


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None,
                         unsqueeze_dim: int = 1, *, interleaved: bool = False) -> tuple[Tensor, Tensor]:
    """transformers' ``apply_rotary_pos_emb``: rotary position embeddings of q and k in one pass.

    Returns ``(q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin)`` over the first
    ``rot = cos.shape[-1]`` features of each head (``rotate_half(x) = cat(-x2, x1)`` of its halves), the features
    past ``rot`` passed through unchanged (partial rotary, as Phi / GLM apply it), cos and sin unsqueezed at
    ``unsqueeze_dim`` and broadcast as in transformers.

    Args:
        q, k: ``[batch, heads, seq, head_dim]`` (``unsqueeze_dim=1``) or ``[batch, seq, heads, head_dim]``
            (``unsqueeze_dim=2``), float16, bfloat16, float32 or float64, same dtype and device; k's heads may
            differ from q's (GQA). Any strides: the usual ``x.view(b, s, h, d).transpose(1, 2)`` is read in place
            (a last dimension that is not dense is copied first).
        cos, sin: ``[1 or batch, 1 or seq, rot]`` of q's dtype, ``rot`` even and at most head_dim; constants (an
            error if either requires grad: no gradient flows to them).
        position_ids: accepted and ignored, as in transformers (cos and sin are already per position).
        unsqueeze_dim: 1 or 2, as above.
        interleaved: GPT-J's rotate-every-two: pairs ``(2i, 2i + 1)`` with cos and sin in that layout.

    Returns:
        Two new contiguous tensors of q's and k's shapes and dtype; float16/bfloat16 computed in float32, rounded
        once.

    Differentiable in q and k (the backward, ``myns::_rotary_embedding_backward``, rotates by the negative angle),
    to any order and in forward mode, also under ``torch.func``. Works under ``torch.compile``, ``torch.export``,
    TorchScript (as ``torch.ops.myns.rotary_embedding``) and AOTInductor.
    """
    return _rotary_embedding_c(q, k, cos, sin, unsqueeze_dim, interleaved)


@traced_as(apply_rotary_pos_emb)
def _apply_rotary_pos_emb_traced(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None,
                                 unsqueeze_dim: int = 1, *, interleaved: bool = False) -> tuple[Tensor, Tensor]:
    return _rotary_embedding(q, k, cos, sin, unsqueeze_dim, interleaved)


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
    _rotary_embedding_inplace_c(positions, query, key, head_size, cos_sin_cache, is_neox)


@traced_as(rotary_embedding_)
def _rotary_embedding__traced(positions: Tensor, query: Tensor, key: Tensor | None, head_size: int,
                              cos_sin_cache: Tensor, is_neox: bool = True) -> None:
    _rotary_embedding_inplace(positions, query, key, head_size, cos_sin_cache, is_neox)


def qk_norm_rope(q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, cos: Tensor, sin: Tensor,
                 eps: float = 1e-6, *, weight_offset: float = 0.0, unsqueeze_dim: int = 1,
                 interleaved: bool = False) -> tuple[Tensor, Tensor]:
    """Per-head RMSNorm of q and k followed by their rotary embedding (Qwen3, Gemma 3), in one pass per tensor.

    Equal to ``apply_rotary_pos_emb(rms_norm(q, q_weight, eps, weight_offset=weight_offset),
    rms_norm(k, k_weight, eps, weight_offset=weight_offset), cos, sin, unsqueeze_dim=unsqueeze_dim,
    interleaved=interleaved)``, the normalised values kept in float32 (not rounded) before the rotation.

    Args:
        q, k, cos, sin, unsqueeze_dim, interleaved: as for :func:`apply_rotary_pos_emb` (head_dim at least 1).
        q_weight, k_weight: ``[head_dim]`` of q's dtype, or float32 with 16-bit q.
        eps, weight_offset: as for :func:`rms_norm` (Gemma's ``1 + w`` is ``weight_offset=1.0``).

    Returns:
        Two new contiguous tensors of q's and k's shapes and dtype.

    Differentiable in q, k, q_weight and k_weight (deterministic weight gradients), to any order under
    ``create_graph=True`` and in forward mode, also under ``torch.func``. Works under ``torch.compile``,
    ``torch.export``, TorchScript (as ``torch.ops.myns.qk_norm_rope``) and AOTInductor.
    """
    return _qk_norm_rope_c(q, k, q_weight, k_weight, cos, sin, eps, weight_offset, unsqueeze_dim, interleaved)


@traced_as(qk_norm_rope)
def _qk_norm_rope_traced(q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, cos: Tensor, sin: Tensor,
                         eps: float = 1e-6, *, weight_offset: float = 0.0, unsqueeze_dim: int = 1,
                         interleaved: bool = False) -> tuple[Tensor, Tensor]:
    return _qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, weight_offset, unsqueeze_dim, interleaved)
