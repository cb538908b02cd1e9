"""Benchmark ``torchops.swiglu`` (forward and backward) against eager ``F.silu(g) * u`` and ``torch.compile`` of it.

LLaMA MLP shapes; what is measured and how: benchmarks/gated.py (the gated-activation family's bench).

    python benchmarks/bench_swiglu.py [--device cuda|cpu] [--quick] [--dtypes bf16,f32] [--threads N]
                                      [--layouts chunk,contiguous] [--shapes TxH,...] [--no-compile]
                                      [--out-dir DIR]
    python -m benchmarks.bench_swiglu ...
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
    op="swiglu",
    eager="eager silu*mul",
    reference=lambda gate, up: F.silu(gate) * up,
    # LLaMA-7B/8B/70B-style intermediate sizes
    gpu_shapes=tuple((t, h) for t in (4096, 8192, 16384) for h in (11008, 14336, 28672)),
)
BENCH = gated.make_bench(SPEC, __doc__.splitlines()[0])


def main(argv: Sequence[str] | None = None) -> int:
    return H.main(BENCH, argv)


if __name__ == "__main__":
    sys.exit(main())
