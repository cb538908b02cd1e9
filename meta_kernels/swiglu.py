"""Fake kernels for myns::swiglu, myns::swiglu_backward and myns::swiglu_backward_out."""

from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, check_elementwise, write_out


@torch.library.register_fake("myns::swiglu")
def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    check_elementwise("swiglu", [("gate", gate), ("up", up)], FLOAT_DTYPES)
    return gate.new_empty(gate.shape)  # dense, like the real kernels' output


@torch.library.register_fake("myns::swiglu_backward")
def swiglu_backward(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    check_elementwise("swiglu_backward", [("grad_out", grad_out), ("gate", gate), ("up", up)], FLOAT_DTYPES)
    return grad_out.new_empty(grad_out.shape), grad_out.new_empty(grad_out.shape)


@torch.library.register_fake("myns::swiglu_backward_out")
def swiglu_backward_out(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, grad_gate: torch.Tensor,
                        grad_up: torch.Tensor) -> None:
    op = "swiglu_backward_out"
    check_elementwise(op, [("grad_out", grad_out), ("gate", gate), ("up", up)], FLOAT_DTYPES)
    write_out(op, ("grad_out", grad_out), ("grad_gate", grad_gate))
    write_out(op, ("grad_out", grad_out), ("grad_up", grad_up))
