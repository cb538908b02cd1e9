"""Benchmark the message-passing ops (spmm_reduce, sddmm, csr_softmax and a GAT layer built from them) against
what a user would otherwise run; bars: benchmarks/bars.py.

Graphs: bench_csr_spmm's (synthetic, seeded, power-law row lengths sized like ogbn-arxiv, ogbn-proteins and
Reddit; square, int32 indices; columns sorted and distinct within a row), one random weight per edge. On the
same tensors in the same run, at features N = 64 and 128 (the GPU) or 32..512 (the CPU), f32 and bf16:

  <graph> sum fwd          spmm_reduce "sum"  vs  cuSPARSE (torch sparse CSR @ dense);
  <graph> <r> fwd          (CPU) spmm_reduce r  vs  torch.sparse.mm(A, dense, r) for every reduce torch has;
  <graph> mean|max fwd+bwd gradients of weights and dense  vs  the gather + scatter_reduce path of plain torch
                           (out.scatter_reduce_(0, row, dense[col] * values[:, None], r, include_self=False));
                           our peak memory beyond inputs and outputs is checked: no nnz x N tensor (below);
  <graph> sddmm fwd+bwd    sddmm "dot", 8 heads x 64  vs  the gather path ((a[row] * b[col]).sum(-1));
  <graph> softmax fwd+bwd  csr_softmax over 8 heads  vs  torch_geometric.utils.softmax (and the plain
                           scatter path);
  <graph> gat fwd+bwd      the demo's GATLayer (in 128, 8 heads x 64)  vs  torch_geometric.nn.GATConv on the
                           same graph, at no more than half of GATConv's peak memory (checked).

The fwd+bwd peers gather a row per edge: where one would not fit in the GPU's memory the case is left out (and
the bars that name it report NO DATA). torch_geometric is imported only when installed (the bars naming it
report NO DATA otherwise, with the import error). A memory check that fails, like a wrong result, fails the
run. Peak memory beyond inputs and outputs allowed to torchops' fwd+bwd: M x N in the dtype and M x N indices
(max/min's selected positions) plus 64 bytes per nonzero (the transpose, weights in its order, per-edge
gradients) and 64 MiB of scratch, always far below one nnz x N tensor.

    python -m benchmarks.bench_spmm_reduce [--device cuda|cpu] [--quick] [--dtypes f32,bf16] [--graphs ...]
                                           [--ops spmm_reduce,sddmm,csr_softmax,gat_layer]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable, Iterator, Sequence

import torch

from benchmarks import harness as H
from benchmarks.bench_csr_spmm import (GraphSpec, check_forward, graph_bench, make_graph, reference_product,
                                      torch_spmm_supports)
from benchmarks.bench_csr_spmm import graphs as csr_graphs

OP, OPS = "spmm_reduce", ("spmm_reduce", "sddmm", "csr_softmax", "gat_layer")
IMPL = "torchops"
CUSPARSE = "cuSPARSE (torch sparse CSR @ dense)"
SCATTER = "gather + scatter_reduce"
GATHER = "gather"
PYG_SOFTMAX = "torch_geometric.utils.softmax"
PYG_GAT = "torch_geometric.nn.GATConv"
TORCH_REDUCE = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}
HEADS, HEAD_FEATURES, GAT_IN = 8, 64, 128


def graphs(device: str, quick: bool, only: str = "") -> list[GraphSpec]:
    """The csr_spmm bench's graphs: on the GPU its three power-law ones (the bars name them)."""
    return [s for s in csr_graphs(device, quick, only)
            if device != "cuda" or quick or (s.in_forward_summary and s.max_degree)]


def widths(device: str, quick: bool) -> list[int]:
    return [32, 128] if quick else [64, 128] if device == "cuda" else [32, 64, 128, 256, 512]


def import_torch_geometric() -> tuple[Any, str]:
    """(torch_geometric or None, why not)."""
    try:
        import torch_geometric
        import torch_geometric.nn  # noqa: F401
        import torch_geometric.utils  # noqa: F401
        return torch_geometric, ""
    except Exception as e:  # not installed, or a dependency it imports is missing
        return None, f"{type(e).__name__}: {e}"


# ------------------------------------------------------------------------------------------ measuring

def fits(device: str, nbytes: float) -> bool:
    """Whether a computation needing about nbytes more fits the GPU (with room to spare)."""
    if device != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info()
    return nbytes < 0.8 * free


def peak_extra_bytes(fn: Callable[[], Any], device: str) -> int:
    """How far above what was allocated before the call the allocator's peak went during fn() (CUDA);
    the call's results are dropped before the next measurement."""
    return H.peak_cuda_bytes(fn)[0] if device == "cuda" else 0


def fwd_bwd(forward: Callable[[], torch.Tensor], inputs: Sequence[torch.Tensor], g: torch.Tensor) -> Callable[[], Any]:
    return lambda: torch.autograd.grad(forward(), list(inputs), g)


def result_rows(op: str, case: str, dtype: torch.dtype, shape: str, numel: int, device: str, baseline: str,
                times: dict[str, float], extra: dict[str, dict] | None = None) -> list[H.Result]:
    """A row per implementation, speedups against `baseline` (torchops' row first among the others)."""
    base_ms = times[baseline]
    rows = [H.Result(op=op, case=case, dtype=H.DTYPE_NAMES[dtype], shape=shape, numel=numel, impl=impl, device=device,
                     ms=ms, speedup=H.speedup(base_ms, ms), baseline=baseline, extra=(extra or {}).get(impl, {}))
            for impl, ms in times.items()]
    return rows


# ---------------------------------------------------------------------------------------------- cases

class Graph:
    """One generated graph on the device and what every case needs of it."""

    def __init__(self, spec: GraphSpec, device: str) -> None:
        t0 = time.perf_counter()
        self.spec, self.device = spec, device
        self.crow, self.col = make_graph(spec, device)
        self.m, self.nnz = self.crow.numel() - 1, self.col.numel()
        self.row = torch.repeat_interleave(torch.arange(self.m, device=device), self.crow.diff().long())
        H.synchronize(device)
        print(f"  {spec.name}: {self.m} rows, {self.nnz} nnz, generated in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)


def scatter_path(g: Graph, values: torch.Tensor, dense: torch.Tensor, reduce: str) -> torch.Tensor:
    """What a user writes in plain torch: one row per edge, scattered onto its target."""
    messages = dense[g.col.long()] * values[:, None]
    index = g.row[:, None].expand_as(messages)
    out = torch.zeros(g.m, dense.size(1), dtype=dense.dtype, device=dense.device)
    return out.scatter_reduce(0, index, messages, TORCH_REDUCE[reduce], include_self=False)


def first_position_grads(g: Graph, values: torch.Tensor, dense: torch.Tensor, grad: torch.Tensor,
                         reduce: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of a max / min in plain torch, ties given to the row's first position as torchops does
    (scatter_reduce's backward splits them instead: in f32, equal products of random weights still occur).
    Features are independent: a few columns at a time, so the nnz x columns temporaries stay small."""
    col = g.col.long()
    grad_values = torch.zeros_like(values)
    grad_dense = torch.zeros_like(dense)
    positions = torch.arange(g.nnz, device=values.device)[:, None]
    for j in range(0, dense.size(1), 8):
        d = dense[:, j:j + 8]
        messages = d[col] * values[:, None]
        out = scatter_path(g, values, d, reduce)
        index = g.row[:, None].expand_as(messages)
        hit = torch.where(messages == out[g.row], positions, g.nnz)
        first = torch.full_like(out, g.nnz, dtype=torch.long).scatter_reduce(0, index, hit, "amin")
        chosen = grad[:, j:j + 8][g.row] * (first[g.row] == positions)  # each (row, column)'s gradient, once
        grad_values += (chosen * d[col]).sum(-1)
        grad_dense[:, j:j + 8].index_add_(0, col, chosen * values[:, None])
    return grad_values, grad_dense


def bench_spmm_reduce(args, ctx: H.Context, g: Graph, dtype: torch.dtype) -> Iterator[H.Result]:
    import torchops

    dev = args.device
    values = torch.randn(g.nnz, device=dev, dtype=dtype)
    A = torch.sparse_csr_tensor(g.crow, g.col, values, (g.m, g.m))
    for n in widths(dev, args.quick):
        dense = torch.randn(g.m, n, device=dev, dtype=dtype)
        shape, numel = f"N={n}", g.nnz * n
        # Forward: against torch's sparse CSR product (cuSPARSE) for sum; on the CPU against every reduce
        # torch.sparse.mm has.
        for reduce in ("sum",) if dev == "cuda" else ("sum", "mean", "max", "min"):
            reference = reference_product(g.crow, g.col, values, dense) if dev == "cuda" else \
                scatter_path(g, values.float(), dense.float(), reduce)
            check_forward(torchops.spmm_reduce(g.crow, g.col, values, dense, reduce), reference,
                          f"{g.spec.name} {reduce} N={n}")
            del reference
            if dev == "cuda":
                peers = {CUSPARSE: lambda: A @ dense}
                baseline = CUSPARSE
            else:
                baseline = "torch.sparse.mm"
                peers = {baseline: lambda r=TORCH_REDUCE[reduce]: torch.sparse.mm(A, dense, r)}
            ours = {IMPL: lambda r=reduce: torchops.spmm_reduce(g.crow, g.col, values, dense, r)}
            times = H.time_all_ms({**peers, **ours}, dev, quick=args.quick)
            yield from result_rows(OP, f"{g.spec.name} {reduce} fwd", dtype, shape, numel, dev, baseline, times)
        if dev == "cuda":
            yield from bench_reduce_fwd_bwd(args, ctx, g, values, dense)
        del dense
        H.free_memory(dev)
        print(f"  {g.spec.name} spmm_reduce {H.DTYPE_NAMES[dtype]} N={n} done", file=sys.stderr, flush=True)


def allowed_extra_bytes(g: Graph, n: int, dtype: torch.dtype) -> int:
    """What torchops' fwd+bwd may hold beyond inputs and outputs (see the module docstring)."""
    return g.m * n * (dtype.itemsize + g.crow.element_size()) + 64 * g.nnz + 64 * H.MiB


def bench_reduce_fwd_bwd(args, ctx: H.Context, g: Graph, values: torch.Tensor, dense: torch.Tensor) -> Iterator[H.Result]:
    """mean and max, gradients of the weights and dense, against the scatter path (which holds several
    nnz x N tensors)."""
    import torchops

    dev, n, dtype = args.device, dense.size(1), dense.dtype
    if not fits(dev, 6 * g.nnz * n * dtype.itemsize):
        print(f"  {g.spec.name} N={n}: the scatter path needs ~{6 * g.nnz * n * dtype.itemsize / 2**30:.0f} GiB: "
              f"mean/max fwd+bwd left out", file=sys.stderr)
        return
    grad = torch.randn(g.m, n, device=dev, dtype=dtype)
    for reduce in ("mean", "max"):
        v, d = values.detach().clone().requires_grad_(), dense.detach().clone().requires_grad_()
        ours = fwd_bwd(lambda: torchops.spmm_reduce(g.crow, g.col, v, d, reduce), (v, d), grad)
        theirs = fwd_bwd(lambda: scatter_path(g, v, d, reduce), (v, d), grad)
        if dtype == torch.float32:  # the same math: compare (bf16 rounds the peer's scattered sums)
            if reduce == "mean":
                want = theirs()  # autograd.grad: under no_grad its forward would have no graph
            else:
                with torch.no_grad():
                    want = first_position_grads(g, v, d, grad, reduce)
            for name, a, b in zip(("values", "dense"), ours(), want):
                check_forward(a, b, f"{g.spec.name} {reduce} N={n} grad of {name}")
            del want
        extra = peak_extra_bytes(ours, dev) - (g.nnz + g.m * n) * dtype.itemsize  # less the gradients
        if extra > allowed_extra_bytes(g, n, dtype):
            ctx.fail(f"{g.spec.name} {reduce} N={n} {H.DTYPE_NAMES[dtype]}: torchops' fwd+bwd held {extra / H.MiB:.0f} "
                     f"MiB beyond inputs and outputs, over {allowed_extra_bytes(g, n, dtype) / H.MiB:.0f} MiB")
        times = H.time_all_ms({SCATTER: theirs, IMPL: ours}, dev, quick=args.quick)
        yield from result_rows(OP, f"{g.spec.name} {reduce} fwd+bwd", dtype, f"N={n}", g.nnz * n, dev, SCATTER, times,
                               {IMPL: {"peak_extra_mib": extra / H.MiB}})
        del v, d
        H.free_memory(dev)


def bench_sddmm(args, ctx: H.Context, g: Graph, dtype: torch.dtype) -> Iterator[H.Result]:
    import torchops

    dev = args.device
    if not fits(dev, 5 * g.nnz * HEADS * HEAD_FEATURES * dtype.itemsize):
        print(f"  {g.spec.name}: the gather path of sddmm does not fit: left out", file=sys.stderr)
        return
    a = torch.randn(g.m, HEADS, HEAD_FEATURES, device=dev, dtype=dtype, requires_grad=True)
    b = torch.randn(g.m, HEADS, HEAD_FEATURES, device=dev, dtype=dtype, requires_grad=True)
    grad = torch.randn(g.nnz, HEADS, device=dev, dtype=dtype)
    col = g.col.long()
    ours = fwd_bwd(lambda: torchops.sddmm(g.crow, g.col, a, b), (a, b), grad)
    theirs = fwd_bwd(lambda: (a[g.row] * b[col]).sum(-1), (a, b), grad)
    if dtype == torch.float32:
        check_forward(torchops.sddmm(g.crow, g.col, a, b), (a[g.row] * b[col]).sum(-1), f"{g.spec.name} sddmm")
        for name, x, y in zip(("a", "b"), ours(), theirs()):
            check_forward(x, y, f"{g.spec.name} sddmm grad of {name}")
    times = H.time_all_ms({GATHER: theirs, IMPL: ours}, dev, quick=args.quick)
    yield from result_rows("sddmm", f"{g.spec.name} sddmm fwd+bwd", dtype, f"{HEADS}x{HEAD_FEATURES}",
                           g.nnz * HEADS * HEAD_FEATURES, dev, GATHER, times)


def plain_softmax(g: Graph, e: torch.Tensor) -> torch.Tensor:
    index = g.row[:, None].expand_as(e)
    top = torch.zeros(g.m, e.size(1), dtype=e.dtype, device=e.device).scatter_reduce(0, index, e, "amax",
                                                                                      include_self=False)
    w = torch.exp(e - top[g.row])
    return w / torch.zeros_like(top).index_add(0, g.row, w)[g.row]


def bench_softmax(args, ctx: H.Context, g: Graph, dtype: torch.dtype, pyg: Any, why: str) -> Iterator[H.Result]:
    import torchops

    dev = args.device
    e = torch.randn(g.nnz, HEADS, device=dev, dtype=dtype, requires_grad=True)
    grad = torch.randn(g.nnz, HEADS, device=dev, dtype=dtype)
    fns = {"gather + scatter (plain torch)": fwd_bwd(lambda: plain_softmax(g, e), (e,), grad)}
    baseline = "gather + scatter (plain torch)"
    if pyg is not None:
        fns[PYG_SOFTMAX] = fwd_bwd(lambda: pyg.utils.softmax(e, g.row, num_nodes=g.m), (e,), grad)
        baseline = PYG_SOFTMAX
    else:
        print(f"  torch_geometric not importable ({why}): csr_softmax's bar has no peer", file=sys.stderr)
    fns[IMPL] = fwd_bwd(lambda: torchops.csr_softmax(g.crow, e), (e,), grad)
    # Against plain torch in f32 on the same inputs, at the tolerance of the dtype (bf16: torchops rounds once)
    wide = e.detach().float().requires_grad_()
    (want_grad,) = fwd_bwd(lambda: plain_softmax(g, wide), (wide,), grad.float())()
    check_forward(torchops.csr_softmax(g.crow, e), plain_softmax(g, wide), f"{g.spec.name} softmax")
    check_forward(fns[IMPL]()[0], want_grad, f"{g.spec.name} softmax grad")
    del wide, want_grad
    times = H.time_all_ms(fns, dev, quick=args.quick)
    yield from result_rows("csr_softmax", f"{g.spec.name} softmax fwd+bwd", dtype, f"{HEADS} heads", g.nnz * HEADS,
                           dev, baseline, times)


def bench_gat(args, ctx: H.Context, g: Graph, dtype: torch.dtype, pyg: Any, why: str) -> Iterator[H.Result]:
    """The demo's GATLayer against GATConv on the graph's edges (self-loops as the graph has them)."""
    from torchops.demo import GATLayer

    dev = args.device
    if pyg is None:
        print(f"  torch_geometric not importable ({why}): the GAT layer has no peer", file=sys.stderr)
        return
    if not fits(dev, 8 * g.nnz * HEADS * HEAD_FEATURES * dtype.itemsize):
        print(f"  {g.spec.name}: GATConv's messages (edges x {HEADS * HEAD_FEATURES}) do not fit: GAT left out",
              file=sys.stderr)
        return
    torch.manual_seed(0)
    conv = pyg.nn.GATConv(GAT_IN, HEAD_FEATURES, heads=HEADS, add_self_loops=False).to(dev, dtype)
    ours = GATLayer(GAT_IN, HEADS, HEAD_FEATURES, use_torchops=True).to(dev, dtype)
    with torch.no_grad():
        ours.lin.weight.copy_(conv.lin.weight)
        ours.att_src.copy_(conv.att_src.view(HEADS, HEAD_FEATURES))
        ours.att_dst.copy_(conv.att_dst.view(HEADS, HEAD_FEATURES))
        ours.bias.copy_(conv.bias)
    edge_index = torch.stack([g.col.long(), g.row])  # PyG: sources first, targets second
    x = torch.randn(g.m, GAT_IN, device=dev, dtype=dtype, requires_grad=True)
    grad = torch.randn(g.m, HEADS * HEAD_FEATURES, device=dev, dtype=dtype)
    fn_ours = fwd_bwd(lambda: ours(g.crow, g.col, x), (x, *ours.parameters()), grad)
    fn_pyg = fwd_bwd(lambda: conv(x, edge_index), (x, *conv.parameters()), grad)
    if dtype == torch.float32:  # the same math (in bf16 GATConv rounds its scattered sums over long rows)
        check_forward(ours(g.crow, g.col, x), conv(x, edge_index), f"{g.spec.name} GAT")
        for a, b in zip(fn_ours(), fn_pyg()):  # parameters in the same order; GATConv's att_* are (1, H, F)
            check_forward(a, b.view(a.shape), f"{g.spec.name} GAT gradients")
    mem_ours, mem_pyg = peak_extra_bytes(fn_ours, dev), peak_extra_bytes(fn_pyg, dev)
    if dev == "cuda" and mem_ours > 0.5 * mem_pyg:
        ctx.fail(f"{g.spec.name} GAT {H.DTYPE_NAMES[dtype]}: torchops' peak {mem_ours / H.MiB:.0f} MiB is over half of "
                 f"GATConv's {mem_pyg / H.MiB:.0f} MiB")
    times = H.time_all_ms({PYG_GAT: fn_pyg, IMPL: fn_ours}, dev, quick=args.quick)
    yield from result_rows("gat_layer", f"{g.spec.name} gat fwd+bwd", dtype, f"{GAT_IN}->{HEADS}x{HEAD_FEATURES}",
                           g.nnz * HEADS * HEAD_FEATURES, dev, PYG_GAT, times,
                           {IMPL: {"peak_mib": mem_ours / H.MiB}, PYG_GAT: {"peak_mib": mem_pyg / H.MiB}})


# ------------------------------------------------------------------------------------------------ bench

def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """sddmm, csr_softmax and the GAT layer have GPU cases only (their bars are the H200's); on the CPU the bench
    measures spmm_reduce against torch.sparse.mm."""
    if args.device != "cuda":
        left_out = [o for o in args.ops if o != OP]
        if left_out:
            print(f"  {', '.join(left_out)}: GPU cases only, not run on {args.device}", file=sys.stderr)
        args.ops = [OP]


def run(args: argparse.Namespace, ctx: H.Context) -> Iterator[H.Result]:
    pyg, why = import_torch_geometric() if args.device == "cuda" else (None, "not used on the CPU")
    if pyg is None and args.device == "cuda" and {"csr_softmax", "gat_layer"} & set(args.ops):
        ctx.fail(f"torch_geometric is not importable ({why}): csr_softmax's and the GAT layer's bars have no peer; "
                 f"pip install its wheel (pure Python, e.g. /work/main/.whl/torch_geometric-*.whl) and run again")
    dtypes = [d for d in args.dtypes if d.is_floating_point]
    for spec in graphs(args.device, args.quick, args.graphs):
        g = Graph(spec, args.device)
        for dtype in dtypes:
            if not torch_spmm_supports(dtype, args.device):
                print(f"  torch sparse CSR @ dense does not support {dtype} on {args.device}: skipped", file=sys.stderr)
                continue
            sections = [("spmm_reduce", lambda: bench_spmm_reduce(args, ctx, g, dtype))]
            if args.device == "cuda":
                sections += [("sddmm", lambda: bench_sddmm(args, ctx, g, dtype)),
                             ("csr_softmax", lambda: bench_softmax(args, ctx, g, dtype, pyg, why)),
                             ("gat_layer", lambda: bench_gat(args, ctx, g, dtype, pyg, why))]
            for op, section in sections:
                if op not in args.ops:
                    continue
                try:
                    yield from section()
                except AssertionError as e:  # a wrong result: report it, keep what the others measure
                    ctx.fail(f"wrong result on {spec.name} ({op}): {e}")
                except torch.OutOfMemoryError as e:
                    print(f"  {spec.name} {op}: out of memory ({str(e).splitlines()[0]})", file=sys.stderr)
                H.free_memory(args.device)
        del g
        H.free_memory(args.device)


def summary(results: Sequence[H.Result], args: argparse.Namespace, ctx: H.Context) -> str:
    parts = []
    for (op, case_end) in (("spmm_reduce", "fwd"), ("spmm_reduce", "fwd+bwd"), ("sddmm", "fwd+bwd"),
                           ("csr_softmax", "fwd+bwd"), ("gat_layer", "fwd+bwd")):
        rows = [r for r in results if r.op == op and r.impl == IMPL and r.case.endswith(" " + case_end)]
        for dt in sorted({r.dtype for r in rows}):
            sel = [r for r in rows if r.dtype == dt]
            worst = min(sel, key=lambda r: r.speedup)
            parts.append(f"{op} {case_end} {dt} vs {sel[0].baseline}: geomean {H.geomean(r.speedup for r in sel):.3f}x "
                         f"(worst {worst.speedup:.3f}x at {worst.case} {worst.shape}, {len(sel)} cases)")
    return "Summary (speedup > 1 = faster than the peer): " + "; ".join(parts)


BENCH = graph_bench(graphs, op=OP, more_ops=OPS[1:], name="spmm_reduce", run=run, check_arguments=check_arguments,
                    summarize=summary)


if __name__ == "__main__":
    sys.exit(H.main(BENCH))
