"""Benchmark ``torchops.gelu_and_mul`` (forward and backward, erf and tanh forms) against eager ``F.gelu(g) * u`` and ``torch.compile`` of it.

GeGLU MLP shapes; what is measured and how: benchmarks/gated.py (the gated-activation family's bench).
Cases are named "<fwd|bwd> <layout> <form>", form "none" (erf) or "tanh".

    python benchmarks/bench_gelu_and_mul.py [--device cuda|cpu] [--quick] [--dtypes bf16,f32] [--threads N]
                                            [--layouts chunk,contiguous] [--forms none,tanh] [--shapes TxH,...]
                                            [--no-compile] [--out-dir DIR]
    python -m benchmarks.bench_gelu_and_mul ...
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

if __package__ in (None, ""):  # run as a file: make `benchmarks` (and an in-place-built `torchops`) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch.nn.functional as F

from benchmarks import gated
from benchmarks import harness as H

SPEC = gated.GatedOp(
    op="gelu_and_mul",
    eager="eager gelu*mul",
    reference=lambda gate, up, approximate="none": F.gelu(gate, approximate=approximate) * up,
    gpu_shapes=(gated.BAR_SHAPE,),
    form_arg="approximate",
    forms=("none", "tanh"),
)
BENCH = gated.make_bench(SPEC, __doc__.splitlines()[0])


def main(argv: Sequence[str] | None = None) -> int:
    return H.main(BENCH, argv)


if __name__ == "__main__":
    sys.exit(main())
