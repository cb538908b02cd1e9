"""Fake kernels for myns::rms_norm, myns::add_rms_norm and their internal forward / backward ops.

The checks are csrc/norm/norm.cpp's, in the same order (messages: meta_kernels._checks.MESSAGES).
"""

from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, check, check_elementwise, dtype_in, same_device

_REDUCED = (torch.float16, torch.bfloat16)


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of rstd (and of dweight accumulation): float64 for float64 input, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_norm_input(
    op: str, input: torch.Tensor, weight: torch.Tensor | None, weight_offset: float = 0.0, name: str = "input"
) -> None:
    check(input.dim() >= 1, op, "at_least_1d", x=name)
    dtype_in(op, (name, input), FLOAT_DTYPES)
    n = input.shape[-1]
    check(n >= 1, op, "normalised_dim_empty", x=name, shape=list(input.shape))
    if weight is None:
        check(weight_offset == 0.0, op, "offset_without_weight")
        return
    check_norm_param(op, (name, input), ("weight", weight))


def check_norm_param(op: str, input: tuple[str, torch.Tensor], param: tuple[str, torch.Tensor]) -> None:
    """A per-column parameter (weight, bias): 1-D of input's last size, its device, its dtype or (16-bit) float32."""
    name, x = input
    pname, w = param
    same_device(op, input, param)
    n = x.shape[-1]
    check(w.dim() == 1 and w.shape[0] == n, op, "param_shape", param=pname, n=n, x=name, shape=list(w.shape))
    reduced = x.dtype in _REDUCED
    check(w.dtype == x.dtype or (reduced and w.dtype == torch.float32), op,
          "param_dtype_or_float" if reduced else "param_dtype", param=pname, x=name, dtype=x.dtype, param_dtype=w.dtype)


def check_norm_input_pair(
    op: str, input: tuple[str, torch.Tensor], other: tuple[str, torch.Tensor], weight: torch.Tensor | None,
    weight_offset: float,
) -> None:
    check_norm_input(op, input[1], weight, weight_offset, input[0])
    check_elementwise(op, [input, other], FLOAT_DTYPES)


def check_norm_backward(
    op: str,
    grad_out: torch.Tensor,
    input: tuple[str, torch.Tensor],
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    weight_grad: bool,
    weight_offset: float,
) -> None:
    name, x = input
    check_norm_input(op, x, weight, weight_offset, name)
    check_elementwise(op, [input, ("grad_out", grad_out)], FLOAT_DTYPES)
    check_norm_stat(op, input, ("rstd", rstd))
    check(not weight_grad or weight is not None, op, "weight_grad_without_weight")


def check_norm_stat(op: str, input: tuple[str, torch.Tensor], stat: tuple[str, torch.Tensor]) -> None:
    """A per-row statistic (rstd, mean): input's leading shape and the stat dtype, on input's device."""
    name, x = input
    stat_name, t = stat
    same_device(op, input, stat)
    leading = list(x.shape[:-1])
    want = stat_dtype(x.dtype)
    check(list(t.shape) == leading and t.dtype == want, op, "stat_shape_dtype", stat=stat_name, shape=leading, x=name,
          dtype=want, got_shape=list(t.shape), got_dtype=t.dtype)


@torch.library.register_fake("myns::rms_norm")
def rms_norm(
    input: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6, weight_offset: float = 0.0
) -> torch.Tensor:
    check_norm_input("rms_norm", input, weight, weight_offset)
    return input.new_empty(input.shape)  # dense, like the real kernels' output


@torch.library.register_fake("myns::_rms_norm_forward")
def _rms_norm_forward(
    input: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, weight_offset: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    check_norm_input("_rms_norm_forward", input, weight, weight_offset)
    return input.new_empty(input.shape), input.new_empty(input.shape[:-1], dtype=stat_dtype(input.dtype))


@torch.library.register_fake("myns::_rms_norm_backward")
def _rms_norm_backward(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    input_grad: bool,
    weight_grad: bool,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    check_norm_backward("_rms_norm_backward", grad_out, ("input", input), weight, rstd, weight_grad, weight_offset)
    weight_dtype = weight.dtype if weight is not None else input.dtype
    grad_input = input.new_empty(input.shape if input_grad else (0,))
    grad_weight = input.new_empty(weight.shape if weight_grad else (0,), dtype=weight_dtype)
    return grad_input, grad_weight


@torch.library.register_fake("myns::add_rms_norm")
def add_rms_norm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    check_norm_input_pair("add_rms_norm", ("input", input), ("residual", residual), weight, weight_offset)
    return input.new_empty(input.shape), input.new_empty(input.shape)


@torch.library.register_fake("myns::_add_rms_norm_forward")
def _add_rms_norm_forward(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_norm_input_pair("_add_rms_norm_forward", ("input", input), ("residual", residual), weight, weight_offset)
    rstd = input.new_empty(input.shape[:-1], dtype=stat_dtype(input.dtype))
    return input.new_empty(input.shape), input.new_empty(input.shape), rstd


@torch.library.register_fake("myns::_add_rms_norm_backward")
def _add_rms_norm_backward(
    grad_out: torch.Tensor,
    grad_residual_out: torch.Tensor | None,
    residual_out: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    weight_grad: bool,
    weight_offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    op = "_add_rms_norm_backward"
    check_norm_backward(op, grad_out, ("residual_out", residual_out), weight, rstd, weight_grad, weight_offset)
    if grad_residual_out is not None:
        check_norm_input_pair(op, ("residual_out", residual_out), ("grad_residual_out", grad_residual_out), weight,
                              weight_offset)
    weight_dtype = weight.dtype if weight is not None else residual_out.dtype
    grad_weight = residual_out.new_empty(weight.shape if weight_grad else (0,), dtype=weight_dtype)
    return residual_out.new_empty(residual_out.shape), grad_weight
