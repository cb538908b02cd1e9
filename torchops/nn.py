"""nn.Modules built on torchops operators: drop-in replacements for their torch.nn counterparts.

The ops normalise the last dimension; a module normalising several trailing dimensions (``normalized_shape``
a tuple, as torch's) checks them as torch does and flattens them into one row, its parameters with them.
Each forward is one module-level function wrapped for torch.fx (``torch.fx.wrap``), so symbolic tracing
records it as one call instead of tracing Python decisions on the input (its dtype, an optional residual);
TorchScript compiles the same function, and torch.compile traces through it to the ops.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from torchops.ops import add_rms_norm, layer_norm, rms_norm

__all__ = ["LayerNorm", "LinearCrossEntropyLoss", "RMSNorm"]

_Shape = Union[int, Sequence[int], torch.Size]


def _normalized_shape(module: str, normalized_shape: _Shape) -> Tuple[int, ...]:
    """The trailing sizes a module normalises over, as torch.nn's norms take them: an int or a sequence."""
    if isinstance(normalized_shape, numbers.Integral):
        shape = (int(normalized_shape),)
    else:
        shape = tuple(int(d) for d in normalized_shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"torchops.nn.{module}: normalized_shape must hold at least one size, each at least 1, "
                         f"got {shape}")
    return shape


def _rows(input: Tensor, normalized_shape: List[int]) -> Tensor:
    """``input`` with its trailing ``normalized_shape`` checked (torch's message) and flattened into one."""
    k = len(normalized_shape)
    lead = input.dim() - k
    if lead < 0 or input.shape[lead:] != normalized_shape:
        shape = str(list(normalized_shape))
        raise RuntimeError(f"Given normalized_shape={shape}, expected input with shape [*, {shape[1:]}, but got "
                           f"input of size{list(input.shape)}")
    return input if k == 1 else input.flatten(lead)


def _flat(param: Optional[Tensor]) -> Optional[Tensor]:
    """A parameter of the normalised shape as the ops take it: one row (a view, so gradients reach it)."""
    return None if param is None else param.reshape(-1)


def _default_eps(dtype: torch.dtype) -> float:
    """The eps torch.nn.RMSNorm uses for eps=None: the machine epsilon of the dtype it computes in
    (float64 for float64 input, else float32 -- also for float16/bfloat16 inputs, whatever torch's docs say
    about "the input's dtype"). Spelled out: TorchScript can't call torch.finfo."""
    if dtype == torch.float64:
        return 2.220446049250313e-16  # 2^-52
    return 1.1920928955078125e-07  # 2^-23


def _rms_norm(input: Tensor, residual: Optional[Tensor], normalized_shape: List[int], weight: Optional[Tensor],
              eps: Optional[float], weight_offset: float) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """RMSNorm.forward: rms_norm, or add_rms_norm with a residual, over the flattened normalized_shape."""
    x = _rows(input, normalized_shape)
    e = _default_eps(input.dtype) if eps is None else eps
    several = len(normalized_shape) != 1
    w = _flat(weight) if several else weight
    if residual is None:
        out = rms_norm(x, w, e, weight_offset=weight_offset)
        return out.view(input.shape) if several else out
    out, residual_out = add_rms_norm(x, _rows(residual, normalized_shape), w, e, weight_offset=weight_offset)
    if several:
        return out.view(input.shape), residual_out.view(input.shape)
    return out, residual_out


def _layer_norm(input: Tensor, normalized_shape: List[int], weight: Optional[Tensor], bias: Optional[Tensor],
                eps: float) -> Tensor:
    """LayerNorm.forward: layer_norm over the flattened normalized_shape."""
    x = _rows(input, normalized_shape)
    if len(normalized_shape) == 1:
        return layer_norm(x, weight, bias, eps)
    return layer_norm(x, _flat(weight), _flat(bias), eps).view(input.shape)


torch.fx.wrap("_rms_norm")
torch.fx.wrap("_layer_norm")


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the trailing ``normalized_shape``, computed by ``torchops.rms_norm``.

    A drop-in for ``torch.nn.RMSNorm``: same constructor arguments, parameter name (``weight``, initialised
    to ones) and ``state_dict`` keys, so weights load either way; an input whose trailing sizes are not
    ``normalized_shape`` raises as torch's does. ``eps=None`` (the default, as in torch) means the machine
    epsilon of the dtype the norm is computed in, at each call, as torch does: float32's for
    float16/bfloat16/float32 inputs, float64's for float64. Scriptable (``torch.jit.script``), traceable by
    ``torch.fx.symbolic_trace``, and works under ``torch.compile`` and ``torch.export``.

    ``forward(input)`` returns the normalised input. ``forward(input, residual)`` fuses the residual add of a
    pre-norm transformer block: it returns ``(out, residual_out)`` with ``residual_out = input + residual``
    (rounded to input's dtype) and ``out`` the normalised ``residual_out`` (``torchops.add_rms_norm``).

    Args:
        normalized_shape: the trailing sizes normalised over, as an int or a sequence (several trailing
            dimensions are normalised as one row of their product).
        eps: added to the mean of squares; ``None`` for the machine epsilon (see above).
        elementwise_affine: learn a per-element ``weight`` of shape ``normalized_shape`` (ones at first).
        device, dtype: of the weight. With float16/bfloat16 inputs the weight may be float32.
        weight_offset: the output is scaled by ``weight + weight_offset``, the sum formed in float32 (Gemma
            stores ``w`` and scales by ``1 + w``: ``weight_offset=1.0``; the weight then starts at zeros).
            Needs ``elementwise_affine=True``.
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine", "weight_offset"]
    normalized_shape: Tuple[int, ...]
    eps: Optional[float]
    elementwise_affine: bool
    weight_offset: float

    def __init__(
        self,
        normalized_shape: _Shape,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        weight_offset: float = 0.0,
    ) -> None:
        super().__init__()
        if weight_offset != 0.0 and not elementwise_affine:
            raise ValueError("torchops.nn.RMSNorm: weight_offset needs elementwise_affine=True (it offsets the weight)")
        self.normalized_shape = _normalized_shape("RMSNorm", normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight_offset = float(weight_offset)
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight to 1 - weight_offset: the scale starts at 1 (ones; zeros for Gemma's offset of 1)."""
        if self.weight is not None:
            nn.init.constant_(self.weight, 1.0 - self.weight_offset)

    def forward(self, input: Tensor, residual: Optional[Tensor] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        return _rms_norm(input, residual, self.normalized_shape, self.weight, self.eps, self.weight_offset)

    def extra_repr(self) -> str:
        s = "{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}".format(**self.__dict__)
        return s + (f", weight_offset={self.weight_offset}" if self.weight_offset != 0.0 else "")


class LayerNorm(nn.Module):
    """Layer normalisation over the trailing ``normalized_shape``, computed by ``torchops.layer_norm``.

    A drop-in for ``torch.nn.LayerNorm``: same constructor arguments, parameters (``weight`` initialised to
    ones, ``bias`` to zeros; none without ``elementwise_affine``, no bias with ``bias=False``), ``state_dict``
    keys and repr, so weights load either way; an input whose trailing sizes are not ``normalized_shape``
    raises as torch's does. Scriptable (``torch.jit.script``), traceable by ``torch.fx.symbolic_trace``, and
    works under ``torch.compile`` and ``torch.export``.

    Args:
        normalized_shape: the trailing sizes normalised over, as an int or a sequence (several trailing
            dimensions are normalised as one row of their product).
        eps: added to the variance.
        elementwise_affine: learn a per-element ``weight`` (and ``bias``) of shape ``normalized_shape``.
        bias: with ``elementwise_affine``, learn a ``bias`` too.
        device, dtype: of the parameters. With float16/bfloat16 inputs they may be float32.
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]
    normalized_shape: Tuple[int, ...]
    eps: float
    elementwise_affine: bool

    def __init__(
        self,
        normalized_shape: _Shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = _normalized_shape("LayerNorm", normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        if elementwise_affine and bias:
            self.bias = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight to ones, bias to zeros."""
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return _layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return "{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}, bias={bias}".format(
            normalized_shape=self.normalized_shape, eps=self.eps, elementwise_affine=self.elementwise_affine,
            bias=self.bias is not None)


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
