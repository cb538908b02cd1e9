"""Fake kernels for myns::swiglu and myns::swiglu_backward."""

from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, check_elementwise


@torch.library.register_fake("myns::swiglu")
def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    check_elementwise("swiglu", [("gate", gate), ("up", up)], FLOAT_DTYPES)
    return gate.new_empty(gate.shape)  # dense, like the real kernels' output


@torch.library.register_fake("myns::swiglu_backward")
def swiglu_backward(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    check_elementwise("swiglu_backward", [("grad_out", grad_out), ("gate", gate), ("up", up)], FLOAT_DTYPES)
    return grad_out.new_empty(grad_out.shape), grad_out.new_empty(grad_out.shape)
