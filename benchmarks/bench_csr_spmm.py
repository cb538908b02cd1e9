"""Benchmark ``torchops.csr_spmm`` against torch's sparse CSR matmul (cuSPARSE on CUDA); bars: benchmarks/bars.py.

Graphs are synthetic, seeded and generated on the device with torch ops: power-law row lengths (a few rows
of 10^4..10^5 nonzeros, most short) sized like ogbn-arxiv (169,343 rows / 1.17M nnz), ogbn-proteins
(132,534 / 39.6M) and Reddit (232,965 / 114.6M), plus a uniform-random graph; square (K = M), columns
random, sorted and without duplicates within a row; int32 indices. For each graph and N in 32..512, on the
same tensors in the same run:
  fwd          torchops.csr_spmm  vs  torch.sparse_csr_tensor(...) @ dense  (cuSPARSE; torch.sparse.mm on CPU);
  fwd+bwd      gradients of values and dense, torchops (transpose computed in backward, and the transpose
               precomputed as torchops.spmm caches it)  vs  torch autograd through the same sparse CSR matmul;
  fwd+bwd(d)   the gradient of dense only (a GCN: fixed adjacency, learned features), same three.
torch's autograd computes the values gradient as a dense M x K matrix (grad_out @ dense^T) before masking
it, ~M K 5 bytes: 143 GB at arxiv size, more than the H200 has. So fwd+bwd runs where that fits (the
"arxiv-like/4" graph, used for nothing else) and fwd+bwd(d) on every graph.
The CPU run uses the arxiv-like and uniform graphs scaled down 8x (ratios only).

    python -m benchmarks.bench_csr_spmm [--device cuda|cpu] [--quick] [--dtypes f32,bf16] [--threads 2]
                                        [--graphs arxiv-like,reddit-like]
    (from the repository root, as benchmarks/run_all.py runs it)
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from benchmarks import harness as H

OP = "csr_spmm"
IMPL = "torchops"
IMPL_CACHED = "torchops (cached transpose)"


@dataclass(frozen=True)
class GraphSpec:
    name: str
    rows: int
    nnz: int
    max_degree: int | None  # None: uniform random
    in_forward_summary: bool = True  # False: a graph there only for the fwd+bwd comparison


GPU_GRAPHS = [
    GraphSpec("arxiv-like", 169_343, 1_170_000, 20_000),
    GraphSpec("proteins-like", 132_534, 39_600_000, 50_000),
    GraphSpec("reddit-like", 232_965, 114_600_000, 100_000),
    GraphSpec("uniform", 169_343, 10_000_000, None),
    GraphSpec("arxiv-like/4", 169_343 // 4, 1_170_000 // 4, 5_000, in_forward_summary=False),
]
CPU_GRAPHS = [
    GraphSpec("arxiv-like/8", 169_343 // 8, 1_170_000 // 8, 2_500),
    GraphSpec("uniform/8", 169_343 // 8, 1_170_000 // 8, None),
]
QUICK_GRAPHS = [GraphSpec("arxiv-like/64", 169_343 // 64, 1_170_000 // 64, 400)]


def make_graph(spec: GraphSpec, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(crow_indices, col_indices) as int32, built with torch ops on `device` (seconds even for Reddit size)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    m = spec.rows
    if spec.max_degree is None:
        rows = torch.randint(0, m, (spec.nnz,), device=device, generator=gen)
    else:
        # Degrees max_degree * rank^-a (at least 1), with a found by bisection so that they sum to ~nnz.
        rank = torch.arange(1, m + 1, device=device, dtype=torch.float64)
        lo, hi = 0.0, 4.0
        for _ in range(40):
            a = (lo + hi) / 2
            total = float((spec.max_degree * rank ** -a).clamp(min=1).floor().sum())
            lo, hi = (a, hi) if total > spec.nnz else (lo, a)
        degree = (spec.max_degree * rank ** -hi).clamp(min=1).floor().long()
        degree = degree[torch.randperm(m, device=device, generator=gen)]
        rows = torch.repeat_interleave(torch.arange(m, device=device), degree)
    cols = torch.randint(0, m, (rows.numel(),), device=device, generator=gen)
    keys = torch.unique(rows * m + cols)  # sorted by (row, col), duplicates dropped
    del rows, cols
    rows, cols = keys // m, keys % m
    crow = torch.zeros(m + 1, dtype=torch.int64, device=device)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=m), 0)
    return crow.int(), cols.int()


def widths(device: str, quick: bool) -> list[int]:
    return [32, 128] if quick else [32, 64, 128, 256, 512]


def graphs(device: str, quick: bool, only: str = "") -> list[GraphSpec]:
    specs = QUICK_GRAPHS if quick else GPU_GRAPHS if device == "cuda" else CPU_GRAPHS
    names = {n.strip() for n in only.split(",") if n.strip()}
    return [s for s in specs if not names or s.name in names]


def torch_spmm_supports(dtype: torch.dtype, device: str) -> bool:
    crow, col = torch.tensor([0, 1], device=device), torch.tensor([0], device=device)
    try:
        a = torch.sparse_csr_tensor(crow.int(), col.int(), torch.ones(1, dtype=dtype, device=device), (1, 1))
        (a @ torch.ones(1, 4, dtype=dtype, device=device)).sum().item()
        return True
    except RuntimeError:
        return False


def check_forward(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """A benchmark of a wrong kernel is worthless: compare with a reference (f32 or better), relative to its
    scale, with a tolerance for `ours`' dtype."""
    scale = float(ref.detach().abs().max()) if ref.numel() else 1.0
    rtol = 1e-3 if ours.dtype in (torch.float32, torch.float64) else 3e-2
    torch.testing.assert_close(ours.float(), ref.float(), rtol=rtol, atol=rtol * scale, msg=lambda m: f"{what}: {m}")


def reference_product(crow, col, values, dense) -> torch.Tensor:
    """A @ dense through torch in f32 at least: cuSPARSE's own 16-bit result differs from the f32 product by
    up to 10% of an element on long rows (seen on the H200 at bf16 N=256), so it is no reference there."""
    wide = torch.promote_types(values.dtype, torch.float32)
    m = crow.numel() - 1
    return torch.sparse_csr_tensor(crow, col, values.to(wide), (m, dense.size(0))) @ dense.to(wide)


def bench_graph(args: argparse.Namespace, spec: GraphSpec, dtypes: Sequence[torch.dtype]) -> list[H.Result]:
    import torchops

    dev = args.device
    t0 = time.perf_counter()
    crow, col = make_graph(spec, dev)
    H.synchronize(dev)
    nnz, m = col.numel(), crow.numel() - 1
    lengths = (crow[1:] - crow[:-1])
    print(f"  {spec.name}: {m} rows, {nnz} nnz, longest row {int(lengths.max())}, "
          f"generated in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    transpose = torch.ops.myns._csr_transpose(crow, col, m)  # what torchops.spmm caches
    out: list[H.Result] = []
    for dtype in dtypes:
        if not torch_spmm_supports(dtype, dev):
            print(f"  torch sparse CSR @ dense does not support {dtype} on {dev}: skipped", file=sys.stderr)
            continue
        values = torch.randn(nnz, device=dev, dtype=dtype)
        a = torch.sparse_csr_tensor(crow, col, values, (m, m))
        for n in widths(dev, args.quick):
            dense = torch.randn(m, n, device=dev, dtype=dtype)
            baseline = "cuSPARSE (torch sparse CSR @ dense)" if dev == "cuda" else "torch.sparse.mm"
            ref = reference_product(crow, col, values, dense)
            check_forward(torchops.csr_spmm(crow, col, values, dense), ref, f"{spec.name} N={n}")
            if dtype != ref.dtype:
                err = float((a @ dense - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)
                print(f"  {spec.name} {H.DTYPE_NAMES[dtype]} N={n}: {baseline} max error {err:.2e} of the "
                      f"largest |element| (ours passed at 3e-2)", file=sys.stderr)
            del ref
            base_fn = (lambda: a @ dense) if dev == "cuda" else (lambda: torch.sparse.mm(a, dense))
            ms = H.time_all_ms({"base": base_fn, "ops": lambda: torchops.csr_spmm(crow, col, values, dense)}, dev,
                               quick=args.quick)
            base_ms, ops_ms = ms["base"], ms["ops"]
            common = dict(op=OP, case=f"{spec.name} fwd", dtype=H.DTYPE_NAMES[dtype], shape=f"N={n}",
                          numel=nnz * n, device=dev, baseline=baseline)
            out.append(H.Result(impl=baseline, ms=base_ms, speedup=1.0, **common))
            out.append(H.Result(impl=IMPL, ms=ops_ms, speedup=H.speedup(base_ms, ops_ms), **common))
            if dtype == torch.float32:
                out += bench_backward(args, spec, crow, col, values, dense, transpose, nnz, n)
            del dense
            H.free_memory(dev)
            print(f"  {spec.name} {H.DTYPE_NAMES[dtype]} N={n} done", file=sys.stderr, flush=True)
    return out


def torch_values_grad_bytes(m: int, k: int) -> int:
    """What torch's sparse CSR backward allocates for the values gradient: an M x K dense f32 matrix plus an
    M x K bool mask (seen in the out-of-memory message on the H200)."""
    return m * k * 5


def bench_backward(args, spec, crow, col, values, dense, transpose, nnz, n) -> list[H.Result]:
    """fwd+bwd against torch autograd, each implementation on the same tensors: gradients of dense only, and
    of values and dense where torch's backward fits in memory."""
    import torchops

    dev, m = args.device, crow.numel() - 1
    g = torch.randn(m, n, device=dev, dtype=values.dtype)
    results: list[H.Result] = []
    fits = dev != "cuda" or torch_values_grad_bytes(m, m) < 0.5 * torch.cuda.mem_get_info()[0]
    for case, values_grad in ((f"{spec.name} fwd+bwd(d)", False), (f"{spec.name} fwd+bwd", True)):
        if values_grad and not fits:
            print(f"  {spec.name} N={n}: torch autograd for values would allocate "
                  f"{torch_values_grad_bytes(m, m) / 2**30:.0f} GiB: values+dense case skipped", file=sys.stderr)
            continue
        v = values.detach().clone().requires_grad_(values_grad)
        d = dense.detach().clone().requires_grad_()
        inputs = (v, d) if values_grad else (d,)

        def torch_fwd_bwd():
            return torch.autograd.grad(torch.sparse_csr_tensor(crow, col, v, (m, m)) @ d, inputs, g)

        def ours():
            return torch.autograd.grad(torchops.csr_spmm(crow, col, v, d), inputs, g)

        def ours_cached():
            out = torch.ops.myns._csr_spmm_with_transpose(crow, col, v, d, *transpose)
            return torch.autograd.grad(out, inputs, g)

        baseline = "torch autograd (sparse CSR @ dense)"
        try:
            for name, ref, got in zip(("values", "dense")[2 - len(inputs):], torch_fwd_bwd(), ours()):
                check_forward(got, ref, f"{case} N={n} grad {name}")
            base_ms = H.time_ms(torch_fwd_bwd, dev, quick=args.quick)
        except torch.OutOfMemoryError as e:  # record why instead of losing the whole run
            print(f"  torch autograd ran out of memory on {case} N={n}: {str(e).splitlines()[0]}", file=sys.stderr)
            H.free_memory(dev)
            continue
        common = dict(op=OP, case=case, dtype=H.DTYPE_NAMES[values.dtype], shape=f"N={n}", numel=nnz * n,
                      device=dev, baseline=baseline)
        results.append(H.Result(impl=baseline, ms=base_ms, speedup=1.0, **common))
        for impl, fn in ((IMPL, ours), (IMPL_CACHED, ours_cached)):
            ms = H.time_ms(fn, dev, quick=args.quick)
            results.append(H.Result(impl=impl, ms=ms, speedup=H.speedup(base_ms, ms), **common))
    return results


def summarize(results: Sequence[H.Result], device: str, excluded: set[str] = frozenset()) -> str:
    """One line; graphs named in `excluded` are left out of the forward figures (the bars are checked by the
    harness)."""
    def stats(rows: list[H.Result]) -> str:
        if not rows:
            return "n/a"
        worst = min(rows, key=lambda r: r.speedup)
        return (f"geomean {H.geomean(r.speedup for r in rows):.3f}× (worst {worst.speedup:.3f}× at "
                f"{worst.case.split()[0]} {worst.shape}, {len(rows)} cases)")

    parts = []
    for dt in sorted({r.dtype for r in results}):
        fwd = [r for r in results if r.impl == IMPL and r.dtype == dt and r.case.endswith(" fwd")]
        power = [r for r in fwd if not r.case.startswith("uniform") and r.case.split()[0] not in excluded]
        uniform = [r for r in fwd if r.case.startswith("uniform")]
        parts.append(f"{dt} fwd vs {fwd[0].baseline if fwd else 'baseline'}: power-law {stats(power)}; "
                     f"uniform {stats(uniform)}")
        for suffix in ("fwd+bwd", "fwd+bwd(d)"):
            for impl in (IMPL, IMPL_CACHED):
                rows = [r for r in results if r.impl == impl and r.dtype == dt and r.case.endswith(suffix)]
                if rows:
                    parts.append(f"{dt} {suffix} {impl} vs torch autograd: {stats(rows)}")
    return "Summary (csr_spmm; speedup > 1 = faster than torch): " + "; ".join(parts)


def graph_bench(graphs_of: Callable[[str, bool, str], list[GraphSpec]], **fields: Any) -> H.Bench:
    """A bench over the graphs that graphs_of(device, quick, --graphs) picks: f32 and bf16, speedups only (a sparse
    product's bytes depend on the graph, so no copy is measured)."""

    def add_graphs_argument(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--graphs", default="", help="comma-separated subset of graph names (default: all)")

    return H.Bench(default_dtypes=("f32", "bf16"), add_arguments=add_graphs_argument, copy_reference=False,
                   meta=lambda args: {"graphs": [s.__dict__ for s in graphs_of(args.device, args.quick, args.graphs)]},
                   **fields)


def run(args: argparse.Namespace, ctx: H.Context) -> Iterator[H.Result]:
    dtypes = [d for d in args.dtypes if d.is_floating_point]
    for spec in graphs(args.device, args.quick, args.graphs):
        try:
            rows = bench_graph(args, spec, dtypes)
        except AssertionError as e:  # a wrong result: report it, keep what the other graphs measure
            ctx.fail(f"wrong result on {spec.name}: {e}")
            rows = []
        H.free_memory(args.device)
        yield from rows


def summary(results: Sequence[H.Result], args: argparse.Namespace, ctx: H.Context) -> str:
    specs = graphs(args.device, args.quick, args.graphs)
    return summarize(results, args.device, {s.name for s in specs if not s.in_forward_summary})


BENCH = graph_bench(graphs, op=OP, run=run, summarize=summary)


if __name__ == "__main__":
    sys.exit(H.main(BENCH))
