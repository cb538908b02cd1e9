"""nn.Modules built on torchops operators: drop-in replacements for their torch.nn counterparts."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from torchops.ops import rms_norm

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last dimension, computed by ``torchops.rms_norm``.

    A drop-in for ``torch.nn.RMSNorm`` normalising over one (the last) dimension: same constructor
    arguments, parameter name (``weight``, initialised to ones) and ``state_dict`` keys, so weights load
    either way. ``eps=None`` (torch's default) means ``torch.finfo(input.dtype).eps``, as in torch.

    Args:
        dim: size of the last dimension, as an int or a 1-element sequence (torch's ``normalized_shape``).
        eps: added to the mean of squares; ``None`` for the input dtype's machine epsilon.
        elementwise_affine: learn a per-element ``weight`` (ones at first).
        device, dtype: of the weight. With float16/bfloat16 inputs the weight may be float32.
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]
    normalized_shape: tuple[int, ...]
    eps: float | None
    elementwise_affine: bool

    def __init__(
        self,
        dim: int | Sequence[int] | torch.Size,
        eps: float | None = 1e-6,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if isinstance(dim, numbers.Integral):
            shape = (int(dim),)
        else:
            shape = tuple(int(d) for d in dim)
            if len(shape) != 1:
                raise ValueError(
                    f"torchops.nn.RMSNorm normalises over the last dimension only: dim must be an int or a "
                    f"1-element sequence, got {tuple(dim)}"
                )
        if shape[0] < 1:
            raise ValueError(f"torchops.nn.RMSNorm: dim must be at least 1, got {shape[0]}")
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, input: Tensor) -> Tensor:
        eps = self.eps if self.eps is not None else torch.finfo(input.dtype).eps
        return rms_norm(input, self.weight, eps)

    def extra_repr(self) -> str:
        return "{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}".format(**self.__dict__)
