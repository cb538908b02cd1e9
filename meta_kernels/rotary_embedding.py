"""Fake kernels for the rotary ops: myns::rotary_embedding, myns::rotary_embedding_ (vLLM's in-place call),
myns::qk_norm_rope and their internal backward ops.

The checks are csrc/rotary/rotary.cpp's, in the same order (messages: meta_kernels._checks.MESSAGES). What needs
the tensors' memory or data (rotary_embedding_'s overlap checks, its positions' range) is the real kernels' alone.
"""

from __future__ import annotations

import torch

try:  # the newer name; older releases have it without the suffix
    from torch._prims_common import is_non_overlapping_and_dense_or_false as _non_overlapping_and_dense
except ImportError:
    from torch._prims_common import is_non_overlapping_and_dense as _non_overlapping_and_dense

from ._checks import FLOAT_DTYPES, INT_DTYPES, check, dtype_in, same_device, same_dtype
from .rms_norm import check_norm_param

_LAYOUTS = {1: "[batch, heads, seq, head_dim]", 2: "[batch, seq, heads, head_dim]"}


def _check_4d(op: str, name: str, t: torch.Tensor, unsqueeze_dim: int) -> None:
    check(t.dim() == 4, op, "rotary_4d", x=name, layout=_LAYOUTS[unsqueeze_dim], unsqueeze_dim=unsqueeze_dim,
          shape=list(t.shape))


def check_rotary(op: str, q: tuple[str, torch.Tensor], k: tuple[str, torch.Tensor], cos: torch.Tensor,
                 sin: torch.Tensor, unsqueeze_dim: int) -> None:
    """rotary_embedding's arguments (csrc/rotary/rotary.cpp's check_rotary)."""
    (qn, qt), (kn, kt) = q, k
    dtype_in(op, q, FLOAT_DTYPES)
    check(unsqueeze_dim in (1, 2), op, "unsqueeze_dim", got=unsqueeze_dim)
    _check_4d(op, qn, qt, unsqueeze_dim)
    same_device(op, q, k)
    same_dtype(op, q, k)
    _check_4d(op, kn, kt, unsqueeze_dim)
    heads = unsqueeze_dim
    check(all(d == heads or qt.shape[d] == kt.shape[d] for d in range(4)), op, "rotary_heads_only", y=kn, x=qn,
          dim=heads, x_shape=list(qt.shape), y_shape=list(kt.shape))
    batch, seq = qt.shape[0], qt.shape[3 - heads]
    for name, t in (("cos", cos), ("sin", sin)):
        same_device(op, q, (name, t))
        same_dtype(op, q, (name, t))
        check(t.dim() == 3 and (t.shape[0] == 1 or t.shape[0] == batch) and (t.shape[1] == 1 or t.shape[1] == seq),
              op, "rotary_cos_shape", x=name, batch=batch, seq=seq, shape=list(t.shape))
    check(cos.shape == sin.shape, op, "same_shape", x="cos", y="sin", x_shape=list(cos.shape), y_shape=list(sin.shape))
    rot, head_dim = cos.shape[2], qt.shape[3]
    check(rot % 2 == 0 and rot <= head_dim, op, "rotary_dim", x="cos", limit="head_dim", n=head_dim, rot=rot)


def check_qk_norm(op: str, q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int) -> None:
    check_rotary(op, ("q", q), ("k", k), cos, sin, unsqueeze_dim)
    check(q.shape[-1] >= 1, op, "normalised_dim_empty", x="q", shape=list(q.shape))
    check_norm_param(op, ("q", q), ("q_weight", q_weight))
    check_norm_param(op, ("k", k), ("k_weight", k_weight))


def _check_gradient_of(op: str, like: tuple[str, torch.Tensor], grad: tuple[str, torch.Tensor]) -> None:
    same_device(op, like, grad)
    same_dtype(op, like, grad)
    (ln, lt), (gn, gt) = like, grad
    check(lt.shape == gt.shape, op, "same_shape", x=ln, y=gn, x_shape=list(lt.shape), y_shape=list(gt.shape))


def _in_layout_of(t: torch.Tensor) -> torch.Tensor:
    """A new tensor in t's layout, as the kernels allocate outputs and gradients (csrc/rotary/rotary_ops.h
    empty_in_layout_of): t's strides when they are a permutation of dense ones with the features last, else
    contiguous."""
    if (t.numel() != 0 and not t.is_contiguous() and _non_overlapping_and_dense(t)
            and (t.shape[-1] <= 1 or t.stride(-1) == 1)):
        return t.new_empty_strided(t.shape, t.stride())
    return t.new_empty(t.shape)


@torch.library.register_fake("myns::rotary_embedding")
def rotary_embedding(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1,
                     interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    check_rotary("rotary_embedding", ("q", q), ("k", k), cos, sin, unsqueeze_dim)
    return _in_layout_of(q), _in_layout_of(k)


@torch.library.register_fake("myns::_rotary_embedding_backward")
def _rotary_embedding_backward(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                               unsqueeze_dim: int = 1, interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    check_rotary("_rotary_embedding_backward", ("grad_q", grad_q), ("grad_k", grad_k), cos, sin, unsqueeze_dim)
    return _in_layout_of(grad_q), _in_layout_of(grad_k)


@torch.library.register_fake("myns::qk_norm_rope")
def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, eps: float = 1e-6, weight_offset: float = 0.0, unsqueeze_dim: int = 1,
                 interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    check_qk_norm("qk_norm_rope", q, k, q_weight, k_weight, cos, sin, unsqueeze_dim)
    return _in_layout_of(q), _in_layout_of(k)


@torch.library.register_fake("myns::_qk_norm_rope_backward")
def _qk_norm_rope_backward(grad_q_out: torch.Tensor | None, grad_k_out: torch.Tensor | None, q: torch.Tensor,
                           k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos: torch.Tensor,
                           sin: torch.Tensor, eps: float, weight_offset: float, unsqueeze_dim: int, interleaved: bool,
                           input_grad: bool, weight_grad: bool
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    op = "_qk_norm_rope_backward"
    check_qk_norm(op, q, k, q_weight, k_weight, cos, sin, unsqueeze_dim)
    if grad_q_out is not None:
        _check_gradient_of(op, ("q", q), ("grad_q_out", grad_q_out))
    if grad_k_out is not None:
        _check_gradient_of(op, ("k", k), ("grad_k_out", grad_k_out))

    def weight_out(given: bool, weight: torch.Tensor) -> torch.Tensor:
        return q.new_empty(weight.shape if given else (0,), dtype=weight.dtype)

    def input_out(given: bool, x: torch.Tensor) -> torch.Tensor:
        return _in_layout_of(x) if given else x.new_empty((0,))

    has_q, has_k = grad_q_out is not None, grad_k_out is not None
    return (input_out(has_q and input_grad, q), input_out(has_k and input_grad, k),
            weight_out(has_q and weight_grad, q_weight), weight_out(has_k and weight_grad, k_weight))


def _check_cache_rows(op: str, x: tuple[str, torch.Tensor], tokens: int, head_size: int) -> None:
    name, t = x
    split = head_size >= 1 and ((t.dim() == 2 and t.shape[1] % head_size == 0) or
                                (t.dim() == 3 and t.shape[2] == head_size))
    check(split, op, "rotary_heads", x=name, head_size=head_size, shape=list(t.shape))
    check(t.shape[0] == tokens, op, "rotary_tokens", x=name, tokens=tokens, shape=list(t.shape))
    check(t.shape[-1] <= 1 or t.stride(-1) == 1, op, "rotary_inner_stride", x=name, strides=list(t.stride()))


@torch.library.register_fake("myns::rotary_embedding_")
def rotary_embedding_(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None, head_size: int,
                      cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    op = "rotary_embedding_"
    dtype_in(op, ("positions", positions), INT_DTYPES)
    check(positions.dim() == 1, op, "one_d", x="positions", shape=list(positions.shape))
    q = ("query", query)
    dtype_in(op, q, FLOAT_DTYPES)
    same_device(op, q, ("positions", positions))
    tokens = positions.shape[0]
    _check_cache_rows(op, q, tokens, head_size)
    if key is not None:
        same_device(op, q, ("key", key))
        same_dtype(op, q, ("key", key))
        _check_cache_rows(op, ("key", key), tokens, head_size)
    same_device(op, q, ("cos_sin_cache", cos_sin_cache))
    check(cos_sin_cache.dim() == 2, op, "two_d", x="cos_sin_cache", shape=list(cos_sin_cache.shape))
    reduced = query.dtype in (torch.float16, torch.bfloat16)
    check(cos_sin_cache.dtype == query.dtype or (reduced and cos_sin_cache.dtype == torch.float32), op,
          "param_dtype_or_float" if reduced else "param_dtype", param="cos_sin_cache", x="query", dtype=query.dtype,
          param_dtype=cos_sin_cache.dtype)
    rot = cos_sin_cache.shape[1]
    check(rot % 2 == 0 and rot <= head_size, op, "rotary_dim", x="cos_sin_cache", limit="head_size", n=head_size,
          rot=rot)
