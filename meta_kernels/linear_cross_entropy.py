"""Fake kernels for the loss family: myns::linear_cross_entropy, myns::cross_entropy and their internal ops.

The checks are csrc/loss/loss.cpp's, in the same order (messages: meta_kernels._checks.MESSAGES). Target
values are data: the CPU kernels check them, fake kernels cannot.
"""

from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, INT_DTYPES, check, dtype_in, same_device, same_dtype


def math_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of the per-token losses and lse: float64 for float64 scores, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _float(value: float) -> str:
    # As C++ prints a double (std::ostream: 6 significant digits, "2" for 2.0), so both kernels raise one text.
    return f"{value:g}"


def _float_scores(op: str, scores: tuple[str, torch.Tensor]) -> None:
    name, x = scores
    check(x.dim() >= 1, op, "at_least_1d", x=name)
    dtype_in(op, scores, FLOAT_DTYPES)


def _target(op: str, scores: tuple[str, torch.Tensor], target: torch.Tensor) -> None:
    name, x = scores
    same_device(op, scores, ("target", target))
    dtype_in(op, ("target", target), INT_DTYPES)
    leading = list(x.shape[:-1])
    check(target.dim() == len(leading) and all(a == b for a, b in zip(target.shape, leading)), op, "target_shape",
          shape=leading, x=name, got=list(target.shape))


def _options(op: str, label_smoothing: float, softcap: float | None) -> None:
    check(0.0 <= label_smoothing <= 1.0, op, "label_smoothing", got=_float(label_smoothing))
    if softcap is not None:
        check(softcap > 0.0 and softcap < float("inf"), op, "softcap", got=_float(softcap))


def check_linear_cross_entropy_args(op: str, input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor,
                                    linear_bias: torch.Tensor | None, label_smoothing: float,
                                    softcap: float | None) -> None:
    x, w = ("input", input), ("linear_weight", linear_weight)
    _float_scores(op, x)
    same_device(op, x, w)
    check(linear_weight.dim() == 2, op, "two_d", x="linear_weight", shape=list(linear_weight.shape))
    same_dtype(op, x, w)
    check(linear_weight.shape[1] == input.shape[-1], op, "in_features", h=input.shape[-1], x="input",
          shape=list(linear_weight.shape))
    check(linear_weight.shape[0] >= 1, op, "no_classes", x="linear_weight", dim="first",
          shape=list(linear_weight.shape))
    _target(op, x, target)
    if linear_bias is not None:
        b = ("linear_bias", linear_bias)
        same_device(op, x, b)
        check(linear_bias.dim() == 1 and linear_bias.shape[0] == linear_weight.shape[0], op, "bias_shape",
              n=linear_weight.shape[0], shape=list(linear_bias.shape))
        same_dtype(op, x, b)
    _options(op, label_smoothing, softcap)


def check_cross_entropy_args(op: str, logits: torch.Tensor, target: torch.Tensor, label_smoothing: float,
                             softcap: float | None) -> None:
    z = ("logits", logits)
    _float_scores(op, z)
    check(logits.shape[-1] >= 1, op, "no_classes", x="logits", dim="last", shape=list(logits.shape))
    _target(op, z, target)
    _options(op, label_smoothing, softcap)


def check_reduction(op: str, reduction: str) -> None:
    check(reduction in ("none", "mean", "sum"), op, "reduction", got=reduction)


def _chunk_size(op: str, chunk_size: int) -> None:
    check(chunk_size >= 0, op, "chunk_size", got=chunk_size)


def _grad_flags(op: str, linear_bias: torch.Tensor | None, bias_grad: bool) -> None:
    check(not bias_grad or linear_bias is not None, op, "bias_grad_without_bias")


def _per_token(op: str, target: torch.Tensor, t: tuple[str, torch.Tensor]) -> None:
    name, x = t
    same_device(op, ("target", target), t)
    dtype_in(op, t, FLOAT_DTYPES)
    check(x.dim() == target.dim() and all(a == b for a, b in zip(x.shape, target.shape)), op, "same_shape",
          x="target", y=name, x_shape=list(target.shape), y_shape=list(x.shape))


def _reduced(scores: torch.Tensor, target: torch.Tensor, reduction: str) -> torch.Tensor:
    return scores.new_empty(target.shape if reduction == "none" else ())


@torch.library.register_fake("myns::linear_cross_entropy")
def linear_cross_entropy(input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor,
                         linear_bias: torch.Tensor | None = None, reduction: str = "mean", ignore_index: int = -100,
                         label_smoothing: float = 0.0, softcap: float | None = None) -> torch.Tensor:
    op = "linear_cross_entropy"
    check_linear_cross_entropy_args(op, input, linear_weight, target, linear_bias, label_smoothing, softcap)
    check_reduction(op, reduction)
    return _reduced(input, target, reduction)


@torch.library.register_fake("myns::_linear_cross_entropy_chunked")
def linear_cross_entropy_chunked(input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor,
                                 linear_bias: torch.Tensor | None = None, reduction: str = "mean",
                                 ignore_index: int = -100, label_smoothing: float = 0.0, softcap: float | None = None,
                                 chunk_size: int = 0) -> torch.Tensor:
    op = "_linear_cross_entropy_chunked"
    check_linear_cross_entropy_args(op, input, linear_weight, target, linear_bias, label_smoothing, softcap)
    check_reduction(op, reduction)
    _chunk_size(op, chunk_size)
    return _reduced(input, target, reduction)


@torch.library.register_fake("myns::_linear_cross_entropy_forward")
def linear_cross_entropy_forward(input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor,
                                 linear_bias: torch.Tensor | None, ignore_index: int, label_smoothing: float,
                                 softcap: float | None, grad_scale: torch.Tensor | None, input_grad: bool,
                                 weight_grad: bool, bias_grad: bool,
                                 chunk_size: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    op = "_linear_cross_entropy_forward"
    check_linear_cross_entropy_args(op, input, linear_weight, target, linear_bias, label_smoothing, softcap)
    if grad_scale is not None:
        s = ("grad_scale", grad_scale)
        same_device(op, ("input", input), s)
        check(grad_scale.dim() == 0, op, "zero_dim", x="grad_scale", shape=list(grad_scale.shape))
        dtype_in(op, s, FLOAT_DTYPES)
    _grad_flags(op, linear_bias, bias_grad)
    _chunk_size(op, chunk_size)
    loss = input.new_empty(target.shape, dtype=math_dtype(input.dtype))
    grad_input = input.new_empty(input.shape if input_grad else (0,))
    grad_weight = input.new_empty(linear_weight.shape if weight_grad else (0,))
    grad_bias = input.new_empty(linear_bias.shape if bias_grad and linear_bias is not None else (0,))
    return loss, grad_input, grad_weight, grad_bias


@torch.library.register_fake("myns::_linear_cross_entropy_backward")
def linear_cross_entropy_backward(grad_loss: torch.Tensor, input: torch.Tensor, linear_weight: torch.Tensor,
                                  target: torch.Tensor, linear_bias: torch.Tensor | None, ignore_index: int,
                                  label_smoothing: float, softcap: float | None, input_grad: bool, weight_grad: bool,
                                  bias_grad: bool, chunk_size: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    op = "_linear_cross_entropy_backward"
    check_linear_cross_entropy_args(op, input, linear_weight, target, linear_bias, label_smoothing, softcap)
    _per_token(op, target, ("grad_loss", grad_loss))
    _grad_flags(op, linear_bias, bias_grad)
    _chunk_size(op, chunk_size)
    grad_input = input.new_empty(input.shape if input_grad else (0,))
    grad_weight = input.new_empty(linear_weight.shape if weight_grad else (0,))
    grad_bias = input.new_empty(linear_bias.shape if bias_grad and linear_bias is not None else (0,))
    return grad_input, grad_weight, grad_bias


@torch.library.register_fake("myns::cross_entropy")
def cross_entropy(logits: torch.Tensor, target: torch.Tensor, reduction: str = "mean", ignore_index: int = -100,
                  label_smoothing: float = 0.0, softcap: float | None = None) -> torch.Tensor:
    op = "cross_entropy"
    check_cross_entropy_args(op, logits, target, label_smoothing, softcap)
    check_reduction(op, reduction)
    return _reduced(logits, target, reduction)


@torch.library.register_fake("myns::_cross_entropy_forward")
def cross_entropy_forward(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float,
                          softcap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    check_cross_entropy_args("_cross_entropy_forward", logits, target, label_smoothing, softcap)
    math = math_dtype(logits.dtype)
    return logits.new_empty(target.shape, dtype=math), logits.new_empty(target.shape, dtype=math)


@torch.library.register_fake("myns::_cross_entropy_backward")
def cross_entropy_backward(grad_loss: torch.Tensor, logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor,
                           ignore_index: int, label_smoothing: float, softcap: float | None) -> torch.Tensor:
    op = "_cross_entropy_backward"
    check_cross_entropy_args(op, logits, target, label_smoothing, softcap)
    _per_token(op, target, ("grad_loss", grad_loss))
    same_device(op, ("logits", logits), ("lse", lse))
    leading = list(logits.shape[:-1])
    want = math_dtype(logits.dtype)
    check(lse.dim() == len(leading) and all(a == b for a, b in zip(lse.shape, leading)) and lse.dtype == want, op,
          "stat_shape_dtype", stat="lse", shape=leading, x="logits", dtype=want, got_shape=list(lse.shape),
          got_dtype=lse.dtype)
    return logits.new_empty(logits.shape)
