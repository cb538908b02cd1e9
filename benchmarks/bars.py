"""The performance bars every benchmark is judged by: one table, read by ``harness.check_bars``.

A bar is a floor on one metric of torchops' rows, per dtype:

    metric    "vs <impl>"     the other implementation's time / torchops' time on the same case, dtype and shape
                              (> 1: torchops is faster),
              "vs best peer"  the same against the fastest of ``peers`` at each shape (every peer must have run), or
              "pct_copy"      torchops' speed as a % of a device copy of the same bytes in the row's dtype, timed in
                              the same run (``Result.pct_copy``), judged only where the input (a tensor of the
                              row's shape label, "MxN" or "2^k", in its dtype) is of COPY_BAR_MIN_INPUT_BYTES or
                              more; smaller inputs are bound by launches, and only the peers judge them
    reduce    "min"           every selected row must reach the floor (the worst one is reported); ``tolerate``
                              (floor, count) lets up to count rows fall short of it if they reach that floor, or
              "geomean"       the geometric mean of the selected rows must
    select    cases (each must have rows), dtypes (each must have rows), shapes (empty: all measured; given:
              each must have been measured, unless the metric's own rule leaves it out), min_nbytes (only rows
              moving at least this many bytes: "at large sizes" means past the caches), and n_range (from an
              "MxN" shape label: the last dimension within [lo, hi])

A bar whose rows are missing (a case, dtype, shape or peer that did not run) fails as "no data", never passes.
GPU bars are for the H200 class of GPU the project targets; a CPU run checks only the CPU bars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from benchmarks.gated import BAR_SHAPE, OPS as GATED_OPS

MiB = 1 << 20
LARGE = 256 * MiB  # past the 50 MB L2 of an H200 by 5x: only there is bandwidth a memory-wall figure
COPY_BAR_MIN_INPUT_BYTES = LARGE  # the inputs a "% of copy" bar judges


@dataclass(frozen=True)
class Bar:
    op: str
    device: str  # "cuda" or "cpu"
    metric: str  # "vs <impl>", "vs best peer" or "pct_copy"
    at_least: float
    cases: tuple[str, ...]
    dtypes: tuple[str, ...]
    why: str  # what the floor stands for, so a reader can judge a miss
    reduce: str = "min"
    shapes: tuple[str, ...] = ()
    min_nbytes: int = 0
    impl: str = "torchops"
    peers: tuple[str, ...] = ()  # for metric "vs best peer"
    tolerate: tuple[float, int] | None = None  # (floor, count), reduce "min" only
    n_range: tuple[int, int] | None = None

    def selects(self, shape: str, itemsize: int) -> bool:
        """Whether a shape label of a dtype this large falls under the bar: its metric's rule (pct_copy: inputs of
        COPY_BAR_MIN_INPUT_BYTES or more) and its n_range. A label they cannot read is never counted."""
        dims = shape_dims(shape)
        if self.metric == "pct_copy" and (dims is None or math.prod(dims) * itemsize < COPY_BAR_MIN_INPUT_BYTES):
            return False
        return self.n_range is None or (dims is not None and self.n_range[0] <= dims[-1] <= self.n_range[1])

    @property
    def label(self) -> str:
        unit = "%" if self.metric == "pct_copy" else "x"
        what = "of a same-bytes copy" if self.metric == "pct_copy" else self.metric
        if self.metric == "vs best peer":
            what = f"vs best of {', '.join(self.peers)}"
        scope = "geomean" if self.reduce == "geomean" else "every case"
        shapes = "/".join(self.shapes) if len(self.shapes) <= 3 else f"{len(self.shapes)} shapes"
        where = ", ".join(self.cases) + (f" at {shapes}" if self.shapes else "")
        if self.n_range is not None:
            low = f"{self.n_range[0]} <= " if self.n_range[0] > 1 else ""
            where += f", {low}N <= {self.n_range[1]}"
        if self.metric == "pct_copy":
            where += f", inputs >= {COPY_BAR_MIN_INPUT_BYTES // MiB} MiB"
        if self.min_nbytes:
            where += f", moving >= {self.min_nbytes // MiB} MiB"
        impl = "" if self.impl == "torchops" else f"{self.impl} "
        grace = ""
        if self.tolerate is not None:
            grace = f" ({self.tolerate[0]:g}{unit} allowed at <= {self.tolerate[1]})"
        return f"{self.op} [{self.device}] {impl}{where}: {scope} >= {self.at_least:g}{unit} {what}{grace}"


def shape_dims(shape: str) -> tuple[int, ...] | None:
    """(M, N) of an "MxN" label (any number of dimensions), (2^k,) of a "2^k" one; None for others ("N=64")."""
    try:
        if shape.startswith("2^"):
            return (1 << int(shape[2:]),)
        return tuple(int(d) for d in shape.lower().split("x"))
    except ValueError:
        return None

# The norms' LLM grid (M rows of N) on the GPU, and the peers they are judged against; bench_norm measures it.
NORM_GRID: tuple[tuple[int, int], ...] = ((4096, 2048), (65536, 1024), (32768, 4096), (16384, 8192), (8192, 16384),
                                          (4096, 32768), (2048, 65536))
NORM_SHAPES = tuple(f"{m}x{n}" for m, n in NORM_GRID)
NORM_PEERS = ("eager", "torch.compile", "liger")

# The rotary ops' shapes on the GPU (bench_rotary_embedding measures them): q's [batch, heads, seq, head_dim].
ROTARY_TRAIN_SHAPES = ("4x32x4096x128", "8x32x4096x128")
ROTARY_DECODE_SHAPES = ("1x32x1x128", "8x32x1x128", "64x32x1x128")

_ELEMENTWISE_WALL = "an elementwise op sits at the memory wall, so parity with the best baseline is the physics"
_CPU_EAGER = "on the CPU every op must at least match eager PyTorch, or it is not worth calling"
_SPMM_SUM_FWD = ("arxiv-like sum fwd", "proteins-like sum fwd", "reddit-like sum fwd")


def _gated_bars(spec) -> list[Bar]:
    """swiglu's bars for a gated op of benchmarks/gated.py, on every form's cases of the chunk layout."""
    at, both = (f"{BAR_SHAPE[0]}x{BAR_SHAPE[1]}",), spec.cases("fwd chunk", "bwd chunk")
    act = spec.eager.removeprefix("eager ").removesuffix("*mul")
    return [
        Bar(spec.op, "cuda", "vs torch.compile", 0.99, both, ("bf16", "f32"),
            _ELEMENTWISE_WALL + f"; Inductor fuses {act}*mul into one kernel too", shapes=at),
        Bar(spec.op, "cuda", f"vs {spec.eager}", 1.7, both, ("bf16", "f32"),
            f"eager runs {act} and mul as separate kernels (forward moves 5 tensors, not 3); fusing must show",
            shapes=at),
        Bar(spec.op, "cuda", "pct_copy", 90.0, spec.cases("fwd chunk"), ("bf16", "f32"), _ELEMENTWISE_WALL, shapes=at),
        Bar(spec.op, "cuda", "pct_copy", 85.0, spec.cases("bwd chunk"), ("bf16", "f32"),
            "the backward reads 3 tensors and writes 2 in one kernel", shapes=at),
        Bar(spec.op, "cpu", f"vs {spec.eager}", 1.0, both, ("bf16", "f32"), _CPU_EAGER, reduce="geomean"),
    ]


BARS: list[Bar] = [
    # vector_add
    Bar("vector_add", "cuda", "vs torch.add", 0.99, ("contiguous",), ("f32", "bf16", "f16"), _ELEMENTWISE_WALL,
        min_nbytes=LARGE),
    Bar("vector_add", "cuda", "pct_copy", 93.0, ("contiguous",), ("f32", "bf16", "f16"), _ELEMENTWISE_WALL),
    Bar("vector_add", "cuda", "vs torch.add", 1.0, ("host-cost fwd",), ("f32",),
        "a small call must cost no more host time than torch.add's, or small-batch models get slower"),
    Bar("vector_add", "cpu", "vs torch.add", 1.0, ("contiguous", "transposed", "sliced"), ("f32", "bf16", "f16"),
        _CPU_EAGER, reduce="geomean"),
    # the gated ops (benchmarks/gated.py's rows): gate and up are the two halves of one LLaMA projection (the
    # "chunk" layout), every form of each op (gelu's erf "none" and "tanh")
    *(bar for spec in GATED_OPS for bar in _gated_bars(spec)),
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
    # The message-passing ops (bench_spmm_reduce; issue 44) on the power-law graphs of bench_csr_spmm, N = 64 and
    # 128 (shape "N=<n>"), f32 and bf16. The fwd+bwd peers gather a row per edge: a case whose peer does not fit
    # in the H200's memory is left out by the bench, so the bars name the graphs where the peer runs (sddmm and
    # GAT gather edges x 512: arxiv-like only; the scatter path of mean/max: arxiv- and proteins-like).
    Bar("spmm_reduce", "cuda", "vs cuSPARSE (torch sparse CSR @ dense)", 1.5, _SPMM_SUM_FWD, ("f32", "bf16"),
        "the sum path is csr_spmm's kernel: it must keep csr_spmm's lead over cuSPARSE", reduce="geomean"),
    Bar("spmm_reduce", "cuda", "vs cuSPARSE (torch sparse CSR @ dense)", 1.0, _SPMM_SUM_FWD, ("f32", "bf16"),
        "no graph and width may fall behind cuSPARSE"),
    Bar("spmm_reduce", "cuda", "vs gather + scatter_reduce", 2.0,
        tuple(f"{g} {r} fwd+bwd" for g in ("arxiv-like", "proteins-like") for r in ("mean", "max")), ("f32", "bf16"),
        "plain torch materialises a row per edge (several edges x features tensors); the fused op reads each "
        "source row once per edge and writes M x features"),
    Bar("sddmm", "cuda", "vs gather", 2.0, ("arxiv-like sddmm fwd+bwd",), ("f32", "bf16"),
        "the gather path builds two edges x heads x features tensors forward and scatters them backward"),
    Bar("csr_softmax", "cuda", "vs torch_geometric.utils.softmax", 2.0,
        tuple(f"{g} softmax fwd+bwd" for g in ("arxiv-like", "proteins-like", "reddit-like")), ("f32", "bf16"),
        "PyG's softmax is four scatter/gather passes plus autograd's; one pass per direction must show"),
    Bar("gat_layer", "cuda", "vs torch_geometric.nn.GATConv", 1.5, ("arxiv-like gat fwd+bwd",), ("f32", "bf16"),
        "GATConv gathers edges x heads x features messages; the three ops never do (its peak memory is checked "
        "by the bench: at most half of GATConv's)"),
    *(Bar("spmm_reduce", "cpu", "vs torch.sparse.mm", 1.0, (f"arxiv-like/8 {r} fwd", f"uniform/8 {r} fwd"), ("f32",),
          _CPU_EAGER, reduce="geomean") for r in ("sum", "mean", "max", "min")),
    # rms_norm and add_rms_norm: cases "fwd" and "fwd+bwd" (one autograd.grad of one forward's graph) over the
    # norm grid, weight of the input's dtype; peers: eager, torch.compile (static, per shape) and Liger-Kernel
    Bar("rms_norm", "cuda", "vs best peer", 1.0, ("fwd",), ("bf16", "f32"),
        "Inductor and Liger reach 92-98% of copy on this forward: the op must be the one a user would pick; "
        "two shapes may sit within 2% for noise", shapes=NORM_SHAPES, peers=NORM_PEERS, tolerate=(0.98, 2)),
    Bar("rms_norm", "cuda", "pct_copy", 90.0, ("fwd",), ("bf16", "f32"),
        "the forward reads x once and writes y once: it sits at the memory wall up to rows of 32k",
        shapes=NORM_SHAPES, n_range=(1, 32768)),
    Bar("rms_norm", "cuda", "vs best peer", 1.0, ("fwd+bwd",), ("bf16", "f32"),
        "training calls the forward and the backward: both together must beat every peer",
        shapes=NORM_SHAPES, peers=NORM_PEERS),
    Bar("rms_norm", "cuda", "pct_copy", 85.0, ("fwd+bwd",), ("bf16", "f32"),
        "past the caches and at LLM widths fwd+bwd is bandwidth-bound; small inputs are bound by launches and "
        "autograd, where the bar is the peers alone", shapes=NORM_SHAPES, n_range=(1024, 16384)),
    Bar("add_rms_norm", "cuda", "vs torch.compile", 1.0, ("fwd", "fwd+bwd"), ("bf16", "f32"),
        "Inductor fuses x + r into the norm too: the hand-fused op must be at least as fast",
        shapes=NORM_SHAPES),
    Bar("add_rms_norm", "cuda", "vs liger", 1.0, ("fwd", "fwd+bwd"), ("bf16", "f32"),
        "Liger's fused add + RMSNorm is what LLM trainers use today", shapes=NORM_SHAPES),
    Bar("add_rms_norm", "cuda", "pct_copy", 90.0, ("fwd",), ("bf16", "f32"),
        "one pass reads x and r once and writes both outputs: it sits at the memory wall", shapes=NORM_SHAPES),
    # layer_norm: the same grid and cases, with weight and bias; peers: F.layer_norm, torch.compile of it, and
    # Liger-Kernel's LigerLayerNormFunction
    Bar("layer_norm", "cuda", "vs best peer", 0.98, ("fwd", "fwd+bwd"), ("bf16", "f32"),
        "LayerNorm is a configuration of the rms_norm engine: it must be the one a user would pick, within noise",
        shapes=NORM_SHAPES, peers=NORM_PEERS),
    Bar("layer_norm", "cuda", "pct_copy", 90.0, ("fwd",), ("bf16", "f32"),
        "the forward reads x once and writes y once: it sits at the memory wall", shapes=NORM_SHAPES),
    # rotary_embedding (bench_rotary_embedding): q [b, 32, s, 128] and k [b, 8, s, 128] in transformers' layout
    # (shape labels are q's), bf16; peers: the eager transformers formula, torch.compile of it, Liger-Kernel's
    # LigerRopeFunction. The 90% of copy is judged where q alone reaches the house's size for that metric
    # (batch 8); at the batch-4 training shape (160 MiB of q and k) the bench prints it beside the peers.
    Bar("rotary_embedding", "cuda", "vs best peer", 1.0, ("fwd", "fwd+bwd"), ("bf16",),
        "the op must be the one a user would pick for training: one pass each way, no copies of the transposed views",
        shapes=ROTARY_TRAIN_SHAPES, peers=("eager", "torch.compile", "liger")),
    Bar("rotary_embedding", "cuda", "pct_copy", 90.0, ("fwd", "fwd+bwd"), ("bf16",),
        "each direction reads q and k once and writes them once (cos and sin are small beside them): the memory wall",
        shapes=ROTARY_TRAIN_SHAPES),
    Bar("rotary_embedding", "cuda", "vs liger", 2.0, ("decode fwd",), ("bf16",),
        "decode rotates a token per sequence: Triton's launch cost dominates Liger there, one lean kernel must show",
        shapes=ROTARY_DECODE_SHAPES),
    Bar("rotary_embedding", "cuda", "vs eager", 1.5, ("decode fwd",), ("bf16",),
        "the eager formula launches a kernel per multiply, negation and concatenation; one launch must show",
        shapes=ROTARY_DECODE_SHAPES),
    Bar("rotary_embedding_", "cuda", "pct_copy", 90.0, ("fwd",), ("bf16",),
        "vLLM's in-place call reads and writes query and key once (a cache row a token): the memory wall",
        shapes=("16384x4096", "32768x4096")),
    Bar("qk_norm_rope", "cuda", "vs torch.compile", 1.0, ("fwd+bwd",), ("bf16",),
        "Inductor fuses the per-head norm and the rotation too: the hand-fused op must be at least as fast",
        shapes=("4x32x4096x128",)),
    Bar("qk_norm_rope", "cuda", "vs torchops rms_norm+rotary", 1.3, ("fwd+bwd",), ("bf16",),
        "fusing saves the normalised q and k a round trip through memory each way: it must show",
        shapes=("4x32x4096x128",)),
    Bar("rotary_embedding", "cpu", "vs eager", 1.0, ("fwd", "fwd+bwd"), ("bf16",), _CPU_EAGER,
        shapes=("1x32x2048x128",)),
    Bar("qk_norm_rope", "cpu", "vs eager", 1.0, ("fwd", "fwd+bwd"), ("bf16",), _CPU_EAGER, shapes=("1x32x2048x128",)),
    Bar("rms_norm", "cpu", "vs eager", 1.0, ("fwd", "fwd+bwd"), ("bf16", "f32"), _CPU_EAGER),
    Bar("add_rms_norm", "cpu", "vs eager", 1.0, ("fwd", "fwd+bwd"), ("bf16", "f32"), _CPU_EAGER),
    Bar("layer_norm", "cpu", "vs eager", 1.0, ("fwd", "fwd+bwd"), ("bf16", "f32"), _CPU_EAGER),
]


# linear_cross_entropy and cross_entropy (bench_linear_cross_entropy): an LLM's head (H = 4096, a 128k vocabulary) at
# 4k to 32k tokens in bf16 on the GPU; 512 tokens, H = 1024, V = 32000 on the CPU.
LCE_GPU_HEAD = (4096, 128256)  # (H, V)
LCE_GPU_TOKENS = (4096, 8192, 16384, 32768)
LCE_SHAPES = tuple(f"{n}x{LCE_GPU_HEAD[0]}x{LCE_GPU_HEAD[1]}" for n in LCE_GPU_TOKENS)
LCE_CPU_SHAPE = (512, 1024, 32000)  # (tokens, H, V)
CE_GPU_SHAPE = (8192, 128256)  # (tokens, V): cross_entropy on given logits
LCE_PEERS = ("eager", "torch.compile", "liger")

BARS += [
    Bar("linear_cross_entropy", "cuda", "vs eager", 1 / 1.05, ("fwd+bwd",), ("bf16",),
        "the same three matmuls as eager, a chunk at a time: chunking may cost at most 5%", shapes=LCE_SHAPES),
    Bar("linear_cross_entropy", "cuda", "vs torch.compile", 1.0, ("fwd+bwd",), ("bf16",),
        "Inductor fuses the softmax into fewer passes too, but keeps the logits", shapes=LCE_SHAPES),
    Bar("linear_cross_entropy", "cuda", "vs liger", 1.5, ("fwd+bwd",), ("bf16",),
        "Liger's fused linear cross-entropy is slower than eager (small chunks, a host sync): the fused op must "
        "not be", shapes=LCE_SHAPES),
    Bar("cross_entropy", "cuda", "vs best peer", 1.0, ("fwd+bwd",), ("bf16",),
        "with the logits given, one pass forward and one backward must beat every peer", shapes=(f"{CE_GPU_SHAPE[0]}x"
                                                                                                 f"{CE_GPU_SHAPE[1]}",),
        peers=LCE_PEERS),
    Bar("linear_cross_entropy", "cpu", "vs eager", 1.0, ("fwd+bwd",), ("f32",), _CPU_EAGER,
        shapes=("x".join(map(str, LCE_CPU_SHAPE)),)),
]


@dataclass(frozen=True)
class MemoryBar:
    """A floor on a peer's peak memory over torchops' (beyond the resident tensors, bytes in the "peak memory
    fwd+bwd" rows' ``extra["peak_bytes"]``) at every one of ``shapes``. The harness judges times only: the bench
    that measures the memory rows judges these (bench_linear_cross_entropy.judge_memory_bars)."""

    op: str
    device: str
    peer: str
    at_least: float
    dtypes: tuple[str, ...]
    shapes: tuple[str, ...]
    why: str
    case: str = "peak memory fwd+bwd"

    @property
    def label(self) -> str:
        where = "/".join(self.shapes) if len(self.shapes) <= 2 else f"{len(self.shapes)} shapes"
        return f"{self.op} [{self.device}] {self.case} at {where}: {self.peer}'s peak >= {self.at_least:g}x ours"


MEMORY_BARS: list[MemoryBar] = [
    MemoryBar("linear_cross_entropy", "cuda", "eager", 4.0, ("bf16",), (LCE_SHAPES[1],),
              "eager keeps several tokens x vocabulary buffers through backward; one chunk of logits must be all "
              "the fused op adds"),
    MemoryBar("linear_cross_entropy", "cuda", "eager", 10.0, ("bf16",), (LCE_SHAPES[3],),
              "the saving grows with the tokens: the chunk does not"),
    MemoryBar("linear_cross_entropy", "cuda", "liger", 1.0, ("bf16",), LCE_SHAPES,
              "memory is why people use Liger's version: the fused op must need no more"),
    MemoryBar("cross_entropy", "cuda", "eager", 2.0, ("bf16",), (f"{CE_GPU_SHAPE[0]}x{CE_GPU_SHAPE[1]}",),
              "no log-softmax buffer and no second gradient buffer: at most the logits' gradient beyond them"),
]


def memory_bars_for(op: str, device: str) -> list[MemoryBar]:
    return [b for b in MEMORY_BARS if b.op == op and b.device == device]


def bars_for(op: str, device: str) -> list[Bar]:
    return [b for b in BARS if b.op == op and b.device == device]


# torchops.transformers.patch end to end (bench_transformers): a LLaMA-3-style model from a random config in bf16 on the
# H200, one training step (forward, backward, AdamW) and greedy generation. Liger-Kernel patches transformers' module
# globals, so its peer is timed after the others, beside the torchops-patched model again (case HF_TRAIN_VS_LIGER).
HF_LLAMA = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=8192, vocab_size=128256)
HF_TRAIN_BATCH = (4, 2048)  # sequences x tokens
HF_GENERATE = (512, 128)  # prompt tokens, new tokens (batch 1)
HF_TRAIN_SHAPE = f"{HF_TRAIN_BATCH[0]}x{HF_TRAIN_BATCH[1]}"
HF_GENERATE_SHAPE = f"1x{HF_GENERATE[0]}+{HF_GENERATE[1]}"
HF_TRAIN, HF_TRAIN_VS_LIGER, HF_GENERATE_CASE = "train step", "train step beside liger", "generate"
HF_TRAIN_MEMORY = "peak memory train step"
HF_PATCHED_COMPILED = "torchops + torch.compile"

BARS += [
    Bar("transformers", "cuda", "vs eager", 1.05, (HF_TRAIN,), ("bf16",),
        "the patched model must be worth the line that patches it", shapes=(HF_TRAIN_SHAPE,)),
    Bar("transformers", "cuda", "vs liger", 1.0, (HF_TRAIN_VS_LIGER,), ("bf16",),
        "Liger's one line is what users pick today", shapes=(HF_TRAIN_SHAPE,)),
    Bar("transformers", "cuda", "vs torch.compile", 1.0, (HF_TRAIN,), ("bf16",),
        "compiled, the patched model must not lose to Inductor's own fusions of the unpatched one",
        shapes=(HF_TRAIN_SHAPE,), impl=HF_PATCHED_COMPILED),
    Bar("transformers", "cuda", "vs eager", 1.15, (HF_GENERATE_CASE,), ("bf16",),
        "decode is launch-bound: fewer, fused kernels per layer must show in tokens per second",
        shapes=(HF_GENERATE_SHAPE,)),
]

MEMORY_BARS += [
    MemoryBar("transformers", "cuda", "eager", 1.25, ("bf16",), (HF_TRAIN_SHAPE,),
              "at most 0.8x the unpatched step's peak: the logits (4 x 2048 x 128256) are never held",
              case=HF_TRAIN_MEMORY),
    MemoryBar("transformers", "cuda", "liger", 1.0, ("bf16",), (HF_TRAIN_SHAPE,),
              "no more memory than the Liger-patched model", case=HF_TRAIN_MEMORY),
]

# Several GPUs of one host (multigpu.py, under torchrun; judged at world size 2). The tensor-parallel sub-layer is
# LLaMA-3-8B's MLP with its pre-norm at 8192 tokens; the FSDP2 step is bench_transformers' model and batch per rank.
MULTI_GPU_TP_SIZES = (8192, 4096, 14336)  # tokens, dim, hidden
MULTI_GPU_TP_SHAPE = "x".join(map(str, MULTI_GPU_TP_SIZES))
MULTI_GPU_TP, MULTI_GPU_FSDP = "tp mlp fwd+bwd", "fsdp2 train step"
MULTI_GPU_FSDP_MEMORY = "fsdp2 peak memory per GPU"
MULTI_GPU_NATIVE, MULTI_GPU_UNPATCHED = "native", "unpatched"

BARS += [
    Bar("multigpu", "cuda", f"vs {MULTI_GPU_NATIVE}", 1.0, (MULTI_GPU_TP,), ("bf16",),
        "sharded, the ops must still beat the native ops of the same plan", shapes=(MULTI_GPU_TP_SHAPE,)),
    Bar("multigpu", "cuda", f"vs {MULTI_GPU_NATIVE} + torch.compile", 1.0, (MULTI_GPU_TP,), ("bf16",),
        "and under torch.compile of the parallelised module", shapes=(MULTI_GPU_TP_SHAPE,),
        impl="torchops + torch.compile"),
    Bar("multigpu", "cuda", f"vs {MULTI_GPU_UNPATCHED}", 1.0, (MULTI_GPU_FSDP,), ("bf16",),
        "the patch must pay under FSDP2 as on one GPU", shapes=(HF_TRAIN_SHAPE,)),
]

MEMORY_BARS += [
    MemoryBar("multigpu", "cuda", MULTI_GPU_UNPATCHED, 1.0, ("bf16",), (HF_TRAIN_SHAPE,),
              "no more memory on any GPU than the unpatched model", case=MULTI_GPU_FSDP_MEMORY),
]
