"""The performance bars every benchmark is judged by: one table, read by ``harness.check_bars``.

A bar is a floor on one metric of torchops' rows, per dtype:

    metric    "vs <impl>"  the other implementation's time / torchops' time on the same case, dtype and shape
                           (> 1: torchops is faster), or
              "pct_copy"   torchops' bandwidth as a % of the device copy measured in the same run
    reduce    "min"        every selected row must reach the floor (the worst one is reported), or
              "geomean"    the geometric mean of the selected rows must
    select    cases (each must have rows), dtypes (each must have rows), shapes (empty: all measured),
              min_nbytes (only inputs at least this large: "at large sizes" means past the caches)

A bar whose rows are missing (a case or dtype that did not run) fails as "no data", never passes.
GPU bars are for the H200 class of GPU the project targets; a CPU run checks only the CPU bars.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
LARGE = 256 * MiB  # past the 50 MB L2 of an H200 by 5x: only there is bandwidth a memory-wall figure


@dataclass(frozen=True)
class Bar:
    op: str
    device: str  # "cuda" or "cpu"
    metric: str  # "vs <impl>" or "pct_copy"
    at_least: float
    cases: tuple[str, ...]
    dtypes: tuple[str, ...]
    why: str  # what the floor stands for, so a reader can judge a miss
    reduce: str = "min"
    shapes: tuple[str, ...] = ()
    min_nbytes: int = 0
    impl: str = "torchops"

    @property
    def label(self) -> str:
        unit = "%" if self.metric == "pct_copy" else "x"
        what = "of copy" if self.metric == "pct_copy" else self.metric
        scope = "geomean" if self.reduce == "geomean" else "every case"
        where = ", ".join(self.cases) + (f" at {'/'.join(self.shapes)}" if self.shapes else "")
        if self.min_nbytes:
            where += f", inputs >= {self.min_nbytes // MiB} MiB"
        impl = "" if self.impl == "torchops" else f"{self.impl} "
        return f"{self.op} [{self.device}] {impl}{where}: {scope} >= {self.at_least:g}{unit} {what}"


_ELEMENTWISE_WALL = "an elementwise op sits at the memory wall, so parity with the best baseline is the physics"
_CPU_EAGER = "on the CPU every op must at least match eager PyTorch, or it is not worth calling"

BARS: list[Bar] = [
    # vector_add
    Bar("vector_add", "cuda", "vs torch.add", 0.99, ("contiguous",), ("f32", "bf16", "f16"), _ELEMENTWISE_WALL,
        min_nbytes=LARGE),
    Bar("vector_add", "cuda", "pct_copy", 93.0, ("contiguous",), ("f32", "bf16", "f16"), _ELEMENTWISE_WALL,
        min_nbytes=LARGE),
    Bar("vector_add", "cuda", "vs torch.add", 1.0, ("host-cost fwd",), ("f32",),
        "a small call must cost no more host time than torch.add's, or small-batch models get slower"),
    Bar("vector_add", "cpu", "vs torch.add", 1.0, ("contiguous", "transposed", "sliced"), ("f32", "bf16", "f16"),
        _CPU_EAGER, reduce="geomean"),
    # swiglu: gate and up are the two halves of one LLaMA projection (the "chunk" layout)
    Bar("swiglu", "cuda", "vs torch.compile", 0.99, ("fwd chunk", "bwd chunk"), ("bf16", "f32"),
        _ELEMENTWISE_WALL + "; Inductor fuses silu*mul into one kernel too", shapes=("16384x14336",)),
    Bar("swiglu", "cuda", "vs eager silu*mul", 1.7, ("fwd chunk", "bwd chunk"), ("bf16", "f32"),
        "eager runs silu and mul as separate kernels (forward moves 5 tensors, not 3); fusing must show",
        shapes=("16384x14336",)),
    Bar("swiglu", "cuda", "pct_copy", 90.0, ("fwd chunk",), ("bf16", "f32"), _ELEMENTWISE_WALL,
        shapes=("16384x14336",)),
    Bar("swiglu", "cuda", "pct_copy", 85.0, ("bwd chunk",), ("bf16", "f32"),
        "the backward reads 3 tensors and writes 2 in one kernel", shapes=("16384x14336",)),
    Bar("swiglu", "cpu", "vs eager silu*mul", 1.0, ("fwd chunk", "bwd chunk"), ("bf16", "f32"), _CPU_EAGER,
        reduce="geomean"),
    # csr_spmm: forward against cuSPARSE on power-law graphs (GNN adjacency), backward against torch autograd
    Bar("csr_spmm", "cuda", "vs cuSPARSE (torch sparse CSR @ dense)", 1.25,
        ("arxiv-like fwd", "proteins-like fwd", "reddit-like fwd"), ("f32",),
        "power-law graphs are where a row-split kernel should beat cuSPARSE's CSR algorithm", reduce="geomean"),
    Bar("csr_spmm", "cuda", "vs cuSPARSE (torch sparse CSR @ dense)", 0.9,
        ("arxiv-like fwd", "proteins-like fwd", "reddit-like fwd"), ("f32",),
        "no single graph and width may fall far behind cuSPARSE"),
    Bar("csr_spmm", "cuda", "vs torch autograd (sparse CSR @ dense)", 2.0,
        ("arxiv-like fwd+bwd(d)", "proteins-like fwd+bwd(d)", "reddit-like fwd+bwd(d)", "uniform fwd+bwd(d)",
         "arxiv-like/4 fwd+bwd(d)"), ("f32",),
        "a GCN step (gradient of the features) needs the transposed product, which torch computes the slow way",
        reduce="geomean"),
    Bar("csr_spmm", "cuda", "vs torch autograd (sparse CSR @ dense)", 2.0, ("arxiv-like/4 fwd+bwd",), ("f32",),
        "torch's values gradient builds a dense M x K matrix; ours touches only the nonzeros", reduce="geomean"),
    Bar("csr_spmm", "cpu", "vs torch.sparse.mm", 1.0, ("arxiv-like/8 fwd", "uniform/8 fwd"), ("f32",), _CPU_EAGER,
        reduce="geomean"),
    # rms_norm: the cases bench_rms_norm measures ("fwd", "bwd", "fwd+bwd"); wide rows are N >= 4096
    Bar("rms_norm", "cuda", "vs F.rms_norm", 1.5, ("fwd",), ("bf16", "f32"),
        "one fused pass against F.rms_norm's several kernels"),
    Bar("rms_norm", "cuda", "vs torch.compile", 1.0, ("fwd", "fwd+bwd"), ("bf16", "f32"),
        "the norm must be at least as fast as what Inductor generates for the same math"),
    Bar("rms_norm", "cuda", "pct_copy", 85.0, ("bwd",), ("bf16", "f32"),
        "the backward is bandwidth-bound once rows are wide", shapes=("32768x4096", "16384x8192", "8192x16384")),
    Bar("rms_norm", "cpu", "vs F.rms_norm", 1.0, ("fwd", "bwd", "fwd+bwd"), ("bf16", "f32"), _CPU_EAGER,
        reduce="geomean"),
]


def bars_for(op: str, device: str) -> list[Bar]:
    return [b for b in BARS if b.op == op and b.device == device]
