"""Fake kernels for myns::layer_norm and its internal forward / backward ops.

The checks are csrc/norm/norm.cpp's, in the same order (messages: meta_kernels._checks.MESSAGES).
"""

from __future__ import annotations

import torch

from ._checks import check, check_elementwise, same_dtype
from .rms_norm import check_norm_input, check_norm_param, check_norm_stat, stat_dtype


def check_layer_norm_input(op: str, input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> None:
    check_norm_input(op, input, None)
    if weight is not None:
        check_norm_param(op, ("input", input), ("weight", weight))
    if bias is not None:
        check_norm_param(op, ("input", input), ("bias", bias))
    if weight is not None and bias is not None:
        same_dtype(op, ("weight", weight), ("bias", bias))


@torch.library.register_fake("myns::layer_norm")
def layer_norm(
    input: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, eps: float = 1e-5
) -> torch.Tensor:
    check_layer_norm_input("layer_norm", input, weight, bias)
    return input.new_empty(input.shape)


@torch.library.register_fake("myns::_layer_norm_forward")
def _layer_norm_forward(
    input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float = 1e-5
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_layer_norm_input("_layer_norm_forward", input, weight, bias)
    stat = input.new_empty(input.shape[:-1], dtype=stat_dtype(input.dtype))
    return input.new_empty(input.shape), stat, torch.empty_like(stat)


@torch.library.register_fake("myns::_layer_norm_backward")
def _layer_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor | None, mean: torch.Tensor,
                         rstd: torch.Tensor, input_grad: bool, weight_grad: bool,
                         bias_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    op = "_layer_norm_backward"
    check_layer_norm_input(op, input, weight, None)
    check_elementwise(op, [("input", input), ("grad_out", grad_out)], [input.dtype])
    check_norm_stat(op, ("input", input), ("mean", mean))
    check_norm_stat(op, ("input", input), ("rstd", rstd))
    check(not weight_grad or weight is not None, op, "weight_grad_without_weight")
    n = input.shape[-1]
    weight_dtype = weight.dtype if weight is not None else input.dtype
    bias_dtype = weight.dtype if weight is not None else stat_dtype(input.dtype)
    grad_input = input.new_empty(input.shape if input_grad else (0,))
    grad_weight = input.new_empty((n,) if weight_grad else (0,), dtype=weight_dtype)
    grad_bias = input.new_empty((n,) if bias_grad else (0,), dtype=bias_dtype)
    return grad_input, grad_weight, grad_bias
