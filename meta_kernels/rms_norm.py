"""Fake kernels for myns::rms_norm, myns::_rms_norm_forward and myns::_rms_norm_backward.

The checks mirror csrc/common/norm.cpp message for message.
"""

from __future__ import annotations

import torch

from meta_kernels._checks import FLOAT_DTYPES, _dtype_name, check, check_elementwise, dtype_in, same_device

_REDUCED = (torch.float16, torch.bfloat16)


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of rstd (and of dweight accumulation): float64 for float64 input, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_norm_input(op: str, input: torch.Tensor, weight: torch.Tensor | None) -> None:
    check(input.dim() >= 1, op, "input must have at least 1 dimension, got a 0-dim tensor")
    dtype_in(op, ("input", input), FLOAT_DTYPES)
    n = input.shape[-1]
    check(n >= 1, op, f"input's last dimension (the normalised one) must be at least 1, got shape {list(input.shape)}")
    if weight is None:
        return
    same_device(op, ("input", input), ("weight", weight))
    check(
        weight.dim() == 1 and weight.shape[0] == n,
        op,
        f"weight must be 1-D of size {n} (input's last dimension), got shape {list(weight.shape)}",
    )
    reduced = input.dtype in _REDUCED
    check(
        weight.dtype == input.dtype or (reduced and weight.dtype == torch.float32),
        op,
        f"weight must have input's dtype ({_dtype_name(input.dtype)}){' or Float' if reduced else ''}, "
        f"got {_dtype_name(weight.dtype)}",
    )


@torch.library.register_fake("myns::rms_norm")
def rms_norm(input: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    check_norm_input("rms_norm", input, weight)
    return input.new_empty(input.shape)  # dense, like the real kernels' output


@torch.library.register_fake("myns::_rms_norm_forward")
def _rms_norm_forward(
    input: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    check_norm_input("_rms_norm_forward", input, weight)
    return input.new_empty(input.shape), input.new_empty(input.shape[:-1], dtype=stat_dtype(input.dtype))


@torch.library.register_fake("myns::_rms_norm_backward")
def _rms_norm_backward(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    input_grad: bool,
    weight_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    op = "_rms_norm_backward"
    check_norm_input(op, input, weight)
    check_elementwise(op, [("input", input), ("grad_out", grad_out)], FLOAT_DTYPES)
    same_device(op, ("input", input), ("rstd", rstd))
    leading = list(input.shape[:-1])
    want = stat_dtype(input.dtype)
    check(
        rstd.dim() == len(leading) and all(a == b for a, b in zip(rstd.shape, leading)) and rstd.dtype == want,
        op,
        f"rstd must have shape {leading} (input's leading dimensions) and dtype {_dtype_name(want)}, "
        f"got shape {list(rstd.shape)} and dtype {_dtype_name(rstd.dtype)}",
    )
    check(not weight_grad or weight is not None, op, "weight_grad is true but weight is None")
    weight_dtype = weight.dtype if weight is not None else input.dtype
    grad_input = input.new_empty(input.shape if input_grad else (0,))
    grad_weight = input.new_empty(weight.shape if weight_grad else (0,), dtype=weight_dtype)
    return grad_input, grad_weight
