"""Benchmark ``torchops.vector_add`` against ``torch.add`` (bars: benchmarks/bars.py).

Measures, on the same tensors in the same run: contiguous and strided (transposed, sliced) inputs over a range
of sizes, bandwidth against a device-to-device copy, and the host cost of tiny calls (forward and fwd+bwd).

    python -m benchmarks.bench_vector_add [--device cuda|cpu] [--quick] [--dtypes f32,bf16,f16] [--out-dir DIR]
    (from the repository root, as benchmarks/run_all.py runs it)
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Iterator, Sequence

import torch

from benchmarks import harness as H

OP = "vector_add"
BASELINE = "torch.add"
IMPL = "torchops"
Maker = Callable[[], "tuple[torch.Tensor, torch.Tensor]"]  # builds (a, b) on demand


def sizes(device: str, quick: bool) -> list[int]:
    """Element counts 2^10, 2^12, ...: up to 2^28 on GPU (GiB-sized, far past L2), 2^24 on CPU; quick: 2^10..2^16."""
    if quick:
        return [1 << 10, 1 << 13, 1 << 16]  # three points keep the smoke run short
    hi = 28 if device == "cuda" else 24
    return [1 << k for k in range(10, hi + 1, 2)]


def layouts(n: int, dtype: torch.dtype, device: str) -> list[tuple[str, str, Maker]]:
    """(case, shape label, maker) per memory layout; makers build tensors lazily so only one case is alive."""
    rows = 1 << ((n.bit_length() - 1) // 2)  # an R×C view with R ≈ C, so both strides matter
    cols = n // rows
    return [
        ("contiguous", H.pow2_label(n), lambda: (H.rand((n,), dtype, device), H.rand((n,), dtype, device))),
        # b is the transpose of a C×R contiguous tensor: same logical R×C shape, column-major strides.
        ("transposed", f"{rows}x{cols}", lambda: (H.rand((rows, cols), dtype, device),
                                                  H.rand((cols, rows), dtype, device).t())),
        # a reads every other column of an R×2C tensor: inner stride 2.
        ("sliced", f"{rows}x{cols}", lambda: (H.rand((rows, 2 * cols), dtype, device)[:, ::2],
                                              H.rand((rows, cols), dtype, device))),
    ]


def bench_sizes(args: argparse.Namespace, vector_add: Callable, copy_bps: float) -> Iterator[H.Result]:
    for dtype in args.dtypes:
        for n in sizes(args.device, args.quick):
            for case, shape, make in layouts(n, dtype, args.device):
                a, b = make()
                # A benchmark of a wrong kernel is worthless: check against the baseline on these very tensors.
                torch.testing.assert_close(vector_add(a, b), torch.add(a, b))
                nbytes = 3 * n * a.element_size()  # read a, read b, write out
                ms = H.time_all_ms({"base": lambda: torch.add(a, b), "ops": lambda: vector_add(a, b)}, args.device,
                                   quick=args.quick)
                base_ms, ops_ms = ms["base"], ms["ops"]
                common = dict(op=OP, case=case, dtype=dtype, shape=shape, numel=n, device=args.device,
                              nbytes=nbytes, copy_bps=copy_bps)
                yield H.bandwidth_result(impl=BASELINE, ms=base_ms, baseline=BASELINE, baseline_ms=base_ms, **common)
                yield H.bandwidth_result(impl=IMPL, ms=ops_ms, baseline=BASELINE, baseline_ms=base_ms, **common)
                del a, b
                H.free_memory(args.device)
            print(f"  {H.DTYPE_NAMES[dtype]} {H.pow2_label(n)} done", file=sys.stderr, flush=True)


def bench_host_cost(args: argparse.Namespace, vector_add: Callable) -> list[H.Result]:
    """µs per call at 1k elements, where dispatch + launch overhead dominates the (tiny) kernel."""
    n, dtype = 1 << 10, torch.float32
    calls, rounds = (200, 5) if args.quick else (1000, 15)
    myns_add = torch.ops.myns.vector_add  # bound once: we time the call, not the attribute lookup
    a, b = H.rand((n,), dtype, args.device), H.rand((n,), dtype, args.device)
    ga, gb = a.clone().requires_grad_(), b.clone().requires_grad_()
    cases: dict[str, dict[str, Callable[[], object]]] = {
        "host-cost fwd": {
            BASELINE: lambda: torch.add(a, b),
            IMPL: lambda: vector_add(a, b),
            "torch.ops.myns.vector_add": lambda: myns_add(a, b),
        },
        # grads accumulate into ga/gb across calls; both impls pay the same accumulation.
        "host-cost fwd+bwd": {
            BASELINE: lambda: torch.add(ga, gb).sum().backward(),
            IMPL: lambda: vector_add(ga, gb).sum().backward(),
        },
    }
    out: list[H.Result] = []
    for case, fns in cases.items():
        us = H.host_cost_us(fns, args.device, calls=calls, rounds=rounds)
        for impl, t in us.items():
            out.append(H.Result(op=OP, case=case, dtype=H.DTYPE_NAMES[dtype], shape=H.pow2_label(n), numel=n,
                                impl=impl, device=args.device, ms=t / 1e3,
                                speedup=H.speedup(us[BASELINE], t), baseline=BASELINE))
    return out


def summarize(results: Sequence[H.Result], device: str, copy_bps: float) -> str:
    """One line with the figures the bars are about, at the largest size measured (the bars are checked by
    the harness)."""
    def pick(case: str, dtype: str, impl: str = IMPL, numel: int | None = None) -> H.Result | None:
        rows = [r for r in results if r.case == case and r.dtype == dtype and r.impl == impl
                and (numel is None or r.numel == numel)]
        return max(rows, key=lambda r: r.numel) if rows else None

    ratios_only = device == "cpu"
    parts: list[str] = []
    top = max((r.numel for r in results if r.op == OP and r.case == "contiguous"), default=0)
    for dt in ("f32", "bf16"):
        r = pick("contiguous", dt, numel=top)
        if r is not None:
            parts.append(f"{dt} contiguous {r.speedup:.3f}× torch.add, {r.pct_copy:.1f}% of copy")
    strided = [f"{case} {dt} {r.speedup:.3f}×" for case in ("transposed", "sliced") for dt in ("f32", "bf16")
               if (r := pick(case, dt, numel=top)) is not None]
    if strided:
        parts.append("strided vs torch.add: " + ", ".join(strided))
    host = []
    host_rows = (("host-cost fwd", IMPL), ("host-cost fwd+bwd", IMPL), ("host-cost fwd", "torch.ops.myns.vector_add"))
    for case, impl in host_rows:
        r, base = pick(case, "f32", impl), pick(case, "f32", BASELINE)
        if r is not None and base is not None:
            label = case.removeprefix("host-cost ") + ("" if impl == IMPL else f" ({impl})")
            abs_us = "" if ratios_only else f" ({r.ms * 1e3:.2f} vs {base.ms * 1e3:.2f} µs)"
            host.append(f"{label} {r.speedup:.3f}×{abs_us}")
    if host:
        parts.append("host cost vs torch.add at 2^10: " + ", ".join(host))
    if not ratios_only:
        parts.append(f"copy {copy_bps / 1e12:.2f} TB/s")
    return f"Summary (n={H.pow2_label(top)}; speedup > 1 = faster than torch.add): " + "; ".join(parts)


def run(args: argparse.Namespace, ctx: H.Context) -> Iterator[H.Result]:
    import torchops

    yield from bench_sizes(args, torchops.vector_add, ctx.copy_bps)
    yield from bench_host_cost(args, torchops.vector_add)


BENCH = H.Bench(
    op=OP,
    run=run,
    largest_operand=lambda args: max(sizes(args.device, args.quick)) * max(d.itemsize for d in args.dtypes),
    summarize=lambda results, args, ctx: summarize(results, args.device, ctx.copy_bps),
)


def main(argv: Sequence[str] | None = None) -> int:
    return H.main(BENCH, argv)


if __name__ == "__main__":
    sys.exit(main())
