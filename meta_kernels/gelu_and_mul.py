"""Fake kernels for myns::gelu_and_mul and myns::gelu_and_mul_backward."""

from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, check, check_elementwise


def _check_approximate(op: str, approximate: str) -> None:
    check(approximate in ("none", "tanh"), op, "approximate", got=approximate)


@torch.library.register_fake("myns::gelu_and_mul")
def gelu_and_mul(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    _check_approximate("gelu_and_mul", approximate)
    check_elementwise("gelu_and_mul", [("gate", gate), ("up", up)], FLOAT_DTYPES)
    return gate.new_empty(gate.shape)  # dense, like the real kernels' output


@torch.library.register_fake("myns::gelu_and_mul_backward")
def gelu_and_mul_backward(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                          approximate: str = "none") -> tuple[torch.Tensor, torch.Tensor]:
    _check_approximate("gelu_and_mul_backward", approximate)
    check_elementwise("gelu_and_mul_backward", [("grad_out", grad_out), ("gate", gate), ("up", up)], FLOAT_DTYPES)
    return grad_out.new_empty(grad_out.shape), grad_out.new_empty(grad_out.shape)
