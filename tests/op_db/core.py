"""What an OpInfo is: the records the family modules fill and the generic tests read."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from torchops._meta_kernels import _checks


@dataclass
class Sample:
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    desc: str = ""


@dataclass
class ErrorInput:
    """A bad call and the error it must raise: a message of the one table (meta_kernels._checks.MESSAGES),
    by key and fields, never re-typed here."""

    sample: Sample
    op: str  # the op the message names
    key: str  # in meta_kernels._checks.MESSAGES
    fields: dict[str, Any]
    on_fake: bool = True  # the fake kernel raises it too (metadata errors, not memory-overlap or structure ones)

    @property
    def message(self) -> str:
        """The exact RuntimeError text."""
        return _checks.message(self.op, self.key, **self.fields)

    @property
    def match(self) -> str:
        """A regex matching exactly the message (for pytest.raises)."""
        return "^" + re.escape(self.message) + "$"


def expect(op: str, sample: Sample, key: str, *, on_fake: bool = True, **fields: Any) -> ErrorInput:
    return ErrorInput(sample, op, key, fields, on_fake)


@dataclass
class OpInfo:
    name: str
    dtypes: tuple[torch.dtype, ...]
    # (device, dtype, requires_grad) -> samples; every sample's tensors are fresh.
    sample_inputs: Callable[[str, torch.dtype, bool], list[Sample]]
    # Same math on the samples' args upcast to float64 (or the ints themselves), on the CPU.
    reference: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]]
    error_inputs: Callable[[str], list[ErrorInput]]
    # (device, dtype, n) -> args whose sizes scale with n: used to check one compiled graph serves all n.
    sized_inputs: Callable[[str, torch.dtype, int], tuple[Any, ...]]
    differentiable: bool = True
    mutated_args: tuple[int, ...] = ()  # ops that write arguments: their indices (the op returns nothing)
    # dtype of each output for a sample; None: every output has the sample's dtype.
    output_dtypes: Callable[[Sample], tuple[torch.dtype, ...]] | None = None
    # strides of each output for a sample (None in place of a stride tuple: contiguous); None: every output
    # contiguous. Either way each output is a new dense tensor.
    output_strides: Callable[[Sample], tuple[tuple[int, ...] | None, ...]] | None = None

    @property
    def op(self) -> torch._ops.OpOverload:
        return getattr(torch.ops.myns, self.name).default

    @property
    def qualname(self) -> str:
        return f"myns::{self.name}"


def _grad(t: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    return t.requires_grad_(requires_grad) if t.dtype.is_floating_point else t


def upcast(args: Sequence[Any]) -> tuple[Any, ...]:
    """Reference inputs: float tensors as float64 on the CPU, detached; others unchanged (ints, on CPU)."""
    out = []
    for x in args:
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu()
            out.append(x.double() if x.dtype.is_floating_point else x)
        else:
            out.append(x)
    return tuple(out)
