"""Fake kernels for myns::gelu_and_mul, myns::gelu_and_mul_backward and myns::gelu_and_mul_backward_out."""

from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, check, check_elementwise, write_out


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


@torch.library.register_fake("myns::gelu_and_mul_backward_out")
def gelu_and_mul_backward_out(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, approximate: str,
                              grad_gate: torch.Tensor, grad_up: torch.Tensor) -> None:
    op = "gelu_and_mul_backward_out"
    _check_approximate(op, approximate)
    check_elementwise(op, [("grad_out", grad_out), ("gate", gate), ("up", up)], FLOAT_DTYPES)
    write_out(op, ("grad_out", grad_out), ("grad_gate", grad_gate))
    write_out(op, ("grad_out", grad_out), ("grad_up", grad_up))
