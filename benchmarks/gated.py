"""The gated-activation family as bench data: one GatedOp per gated op (``act(gate) * up``). A new gated op is
a row of OPS; ``benchmarks/bench_gated.py`` measures every row, and the family's bars in
``benchmarks/bars.py`` can be built from the rows (case names: ``GatedOp.cases``).

Kept free of the harness (torch and its functional ops only), so bars.py can read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

BAR_SHAPE = (16384, 14336)  # where benchmarks/bars.py judges the family (a LLaMA-3-8B MLP at 16k tokens)
LAYOUTS = ("chunk", "contiguous")


@dataclass(frozen=True)
class GatedOp:
    op: str  # the torchops function, e.g. "swiglu"
    eager: str  # the name of the eager baseline in the results, e.g. "eager silu*mul"
    reference: Callable[..., torch.Tensor]  # reference(gate, up, **{form_arg: form}): eager math
    gpu_shapes: tuple[tuple[int, int], ...]  # (tokens, hidden) on the GPU without --quick/--shapes
    form_arg: str = ""  # the keyword that selects a form ("approximate"), "" when the op has one form
    forms: tuple[str, ...] = ()

    def case(self, base: str, form: str | None) -> str:
        """A case name: "<fwd|bwd> <layout>", then the form when the op has forms."""
        return base if form is None else f"{base} {form}"

    def cases(self, *bases: str) -> tuple[str, ...]:
        """Every form's case of each base ("fwd chunk", ...), as the bench names them."""
        return tuple(self.case(base, form) for form in self.forms or (None,) for base in bases)


OPS: list[GatedOp] = [
    GatedOp(
        op="swiglu",
        eager="eager silu*mul",
        reference=lambda gate, up: F.silu(gate) * up,
        # LLaMA-7B/8B/70B-style intermediate sizes
        gpu_shapes=tuple((t, h) for t in (4096, 8192, 16384) for h in (11008, 14336, 28672)),
    ),
    GatedOp(
        op="gelu_and_mul",
        eager="eager gelu*mul",
        reference=lambda gate, up, approximate="none": F.gelu(gate, approximate=approximate) * up,
        gpu_shapes=(BAR_SHAPE,),
        form_arg="approximate",
        forms=("none", "tanh"),
    ),
]
OPS_BY_NAME = {spec.op: spec for spec in OPS}
