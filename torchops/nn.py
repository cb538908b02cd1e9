"""nn.Modules built on torchops operators: drop-in replacements for their torch.nn counterparts."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn

__all__ = ["RMSNorm"]
__all__ += ["LinearCrossEntropyLoss"]


def _default_eps(dtype: torch.dtype) -> float:
    """The eps torch.nn.RMSNorm uses for eps=None: the machine epsilon of the dtype it computes in
    (float64 for float64 input, else float32 -- also for float16/bfloat16 inputs, whatever torch's docs say
    about "the input's dtype"). Spelled out: TorchScript can't call torch.finfo."""
    if dtype == torch.float64:
        return 2.220446049250313e-16  # 2^-52
    return 1.1920928955078125e-07  # 2^-23


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last dimension, computed by ``torchops.rms_norm``.

    A drop-in for ``torch.nn.RMSNorm`` normalising over one (the last) dimension: same constructor
    arguments, parameter name (``weight``, initialised to ones) and ``state_dict`` keys, so weights load
    either way. ``eps=None`` (the default, as in torch) means the machine epsilon of the dtype the norm is
    computed in, at each call, as torch does: float32's for float16/bfloat16/float32 inputs, float64's for float64.
    Scriptable (``torch.jit.script``), and works under ``torch.compile`` and ``torch.export``.

    ``forward(input)`` returns the normalised input. ``forward(input, residual)`` fuses the residual add of a
    pre-norm transformer block: it returns ``(out, residual_out)`` with ``residual_out = input + residual``
    (rounded to input's dtype) and ``out`` the normalised ``residual_out`` (``torchops.add_rms_norm``).

    Args:
        normalized_shape: size of the last dimension, as an int or a 1-element sequence.
        eps: added to the mean of squares; ``None`` for the machine epsilon (see above).
        elementwise_affine: learn a per-element ``weight`` (ones at first).
        device, dtype: of the weight. With float16/bfloat16 inputs the weight may be float32.
        weight_offset: the output is scaled by ``weight + weight_offset``, the sum formed in float32 (Gemma
            stores ``w`` and scales by ``1 + w``: ``weight_offset=1.0``; the weight then starts at zeros).
            Needs ``elementwise_affine=True``.
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine", "weight_offset"]
    normalized_shape: Tuple[int]
    eps: Optional[float]
    elementwise_affine: bool
    weight_offset: float

    def __init__(
        self,
        normalized_shape: int | Sequence[int] | torch.Size,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        weight_offset: float = 0.0,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            shape = (int(normalized_shape),)
        else:
            shape = tuple(int(d) for d in normalized_shape)
            if len(shape) != 1:
                raise ValueError(
                    "torchops.nn.RMSNorm normalises over the last dimension only: normalized_shape must be an int "
                    f"or a 1-element sequence, got {tuple(normalized_shape)}"
                )
        if shape[0] < 1:
            raise ValueError(f"torchops.nn.RMSNorm: normalized_shape must be at least 1, got {shape[0]}")
        if weight_offset != 0.0 and not elementwise_affine:
            raise ValueError("torchops.nn.RMSNorm: weight_offset needs elementwise_affine=True (it offsets the weight)")
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight_offset = float(weight_offset)
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight to 1 - weight_offset: the scale starts at 1 (ones; zeros for Gemma's offset of 1)."""
        if self.weight is not None:
            nn.init.constant_(self.weight, 1.0 - self.weight_offset)

    def forward(self, input: Tensor, residual: Optional[Tensor] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        eps = self.eps
        if eps is None:
            eps = _default_eps(input.dtype)
        # torch.ops.myns.* by name: TorchScript resolves those (not torchops.ops' C++ entry points).
        if residual is None:
            return torch.ops.myns.rms_norm(input, self.weight, eps, self.weight_offset)
        return torch.ops.myns.add_rms_norm(input, residual, self.weight, eps, self.weight_offset)

    def extra_repr(self) -> str:
        s = "{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}".format(**self.__dict__)
        return s + (f", weight_offset={self.weight_offset}" if self.weight_offset != 0.0 else "")


class LinearCrossEntropyLoss(nn.Module):
    """The cross-entropy loss of an LM head's logits without the logits: ``torchops.linear_cross_entropy``.

    ``forward(input, linear_weight, target, linear_bias=None)`` returns
    ``F.cross_entropy(F.linear(input, linear_weight, linear_bias), target, ...)`` over the last dimension,
    computed a chunk of tokens at a time (see :func:`torchops.linear_cross_entropy` for shapes, dtypes, the
    memory it saves and what invalid targets give). The head's weight is an argument, not a parameter of this
    module, so the model keeps owning it (tied embeddings included).

    Args:
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: target value of tokens left out of the loss (``None``: -100).
        label_smoothing: in ``[0, 1]``.
        softcap: cap the logits to ``softcap * tanh(logits / softcap)`` first (Gemma 2), or ``None``.
        chunk_size: tokens per chunk, or ``None`` to choose from the sizes.

    Scriptable (``torch.jit.script``); works under ``torch.compile`` and ``torch.export``.
    """

    __constants__ = ["reduction", "ignore_index", "label_smoothing", "softcap", "chunk_size"]
    reduction: str
    ignore_index: int
    label_smoothing: float
    softcap: Optional[float]
    chunk_size: Optional[int]

    def __init__(self, reduction: str = "mean", ignore_index: Optional[int] = -100, label_smoothing: float = 0.0,
                 softcap: Optional[float] = None, chunk_size: Optional[int] = None) -> None:
        super().__init__()
        self.reduction = reduction
        self.ignore_index = -100 if ignore_index is None else int(ignore_index)
        self.label_smoothing = float(label_smoothing)
        self.softcap = None if softcap is None else float(softcap)
        self.chunk_size = None if chunk_size is None else int(chunk_size)

    def forward(self, input: Tensor, linear_weight: Tensor, target: Tensor,
                linear_bias: Optional[Tensor] = None) -> Tensor:
        # torch.ops.myns.* by name: TorchScript resolves those (not torchops.ops' C++ entry points).
        chunk_size = self.chunk_size
        if chunk_size is None:
            return torch.ops.myns.linear_cross_entropy(input, linear_weight, target, linear_bias, self.reduction,
                                                       self.ignore_index, self.label_smoothing, self.softcap)
        return torch.ops.myns._linear_cross_entropy_chunked(input, linear_weight, target, linear_bias, self.reduction,
                                                            self.ignore_index, self.label_smoothing, self.softcap,
                                                            chunk_size)

    def extra_repr(self) -> str:
        s = f"reduction={self.reduction!r}, ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing}"
        if self.softcap is not None:
            s += f", softcap={self.softcap}"
        if self.chunk_size is not None:
            s += f", chunk_size={self.chunk_size}"
        return s
