"""Benchmark ``torchops.rms_norm`` against ``F.rms_norm`` and ``torch.compile(F.rms_norm)`` (DESIGN.md §5, §6).

On the same tensors in the same run, for each M×N shape and dtype: the forward, and forward + backward
(``torch.autograd.grad`` of the output for input and weight, so no ``.grad`` accumulation is timed), and the
backward alone (the same ``autograd.grad`` replayed on one forward's graph, ``retain_graph=True``), with
bandwidth against a device-to-device copy. Bytes: forward = read x + write y + read weight; backward = read
dy, x and rstd + write dx + read weight + write dweight (fwd+bwd adds the forward's bytes and its rstd write).

    python benchmarks/bench_rms_norm.py [--device cuda|cpu] [--quick] [--dtypes bf16,f32] [--no-compile]
    python -m benchmarks.bench_rms_norm ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

if __package__ in (None, ""):  # run as a file: make `benchmarks` (and an in-place-built `torchops`) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch._functorch.config  # not loaded by `import torch` alone; set in bench() below
import torch.nn.functional as F

from benchmarks import harness as H

OP = "rms_norm"
BASELINE = "F.rms_norm"
COMPILED = "torch.compile"
IMPL = "torchops"
EPS = 1e-6
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-10}


def shapes(device: str, quick: bool) -> list[tuple[int, int]]:
    """M×N: 64 Mi elements each on the GPU (128-256 MB per tensor, far past L2); 1/8 of that on the CPU."""
    if quick:
        return [(4096, 1024), (1024, 4096)]
    full = [(65536, 1024), (32768, 4096), (16384, 8192), (8192, 16384)]
    return full if device == "cuda" else [(m // 8, n) for m, n in full]


def fwd_bytes(m: int, n: int, dtype: torch.dtype) -> int:
    return 2 * m * n * dtype.itemsize + n * dtype.itemsize


def bwd_bytes(m: int, n: int, dtype: torch.dtype) -> int:
    return 3 * m * n * dtype.itemsize + m * 4 + 2 * n * dtype.itemsize


def bench(args: argparse.Namespace, copy_bps: float) -> list[H.Result]:
    import torchops

    # Timing the backward alone replays one forward's graph (retain_graph=True), which compiled backwards with
    # donated buffers refuse. Donation only lets a compiled backward reuse saved memory; its kernels are the same.
    torch._functorch.config.donated_buffer = False

    out: list[H.Result] = []
    for dtype in args.dtypes:
        for m, n in shapes(args.device, args.quick):
            x = H.rand((m, n), dtype, args.device)
            w = H.rand((n,), dtype, args.device)
            dy = H.rand((m, n), dtype, args.device)
            xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()

            def eager(a, b):
                return F.rms_norm(a, (n,), b, EPS)

            impls: dict[str, Callable] = {BASELINE: eager, IMPL: lambda a, b: torchops.rms_norm(a, b, EPS)}
            if not args.no_compile:
                impls[COMPILED] = torch.compile(eager)
            tol = TOL[dtype]
            with torch.no_grad():
                want = eager(x, w)
                for name, fn in impls.items():  # a wrong kernel must not report a number
                    torch.testing.assert_close(fn(x, w), want, rtol=tol, atol=tol, msg=lambda s: f"{name}: {s}")
            grads_want = torch.autograd.grad(eager(xg, wg), (xg, wg), dy)
            for name, fn in impls.items():
                got = torch.autograd.grad(fn(xg, wg), (xg, wg), dy)
                torch.testing.assert_close(got[0], grads_want[0], rtol=tol, atol=tol, msg=lambda s: f"{name} dx: {s}")
                # dweight sums M rows: compare relative to its scale.
                scale = grads_want[1].abs().max().item()
                torch.testing.assert_close(got[1], grads_want[1], rtol=tol * 4, atol=tol * 4 * scale,
                                           msg=lambda s: f"{name} dw: {s}")

            shape = f"{m}x{n}"
            cases = (("fwd", fwd_bytes(m, n, dtype)), ("bwd", bwd_bytes(m, n, dtype)),
                     ("fwd+bwd", fwd_bytes(m, n, dtype) + m * 4 + bwd_bytes(m, n, dtype)))
            for case, nbytes in cases:
                times: dict[str, float] = {}
                for name, fn in impls.items():
                    if case == "fwd":
                        def run(fn=fn):
                            with torch.no_grad():
                                return fn(x, w)
                    elif case == "bwd":  # the backward graph alone, replayed on one forward's saved tensors
                        y = fn(xg, wg)

                        def run(y=y):
                            return torch.autograd.grad(y, (xg, wg), dy, retain_graph=True)
                    else:
                        def run(fn=fn):
                            return torch.autograd.grad(fn(xg, wg), (xg, wg), dy)
                    times[name] = H.time_ms(run, args.device, quick=args.quick)
                    del run
                    y = None  # the replayed graph holds the saved tensors: let free_memory reclaim them
                for name, ms in times.items():
                    r = H.bandwidth_result(op=OP, case=case, dtype=dtype, shape=shape, numel=m * n, impl=name,
                                           device=args.device, ms=ms, nbytes=nbytes, copy_bps=copy_bps,
                                           baseline=BASELINE, baseline_ms=times[BASELINE])
                    if COMPILED in times:
                        r.extra["speedup_vs_compiled"] = times[COMPILED] / ms
                    out.append(r)
            del x, w, dy, xg, wg, impls
            H.free_memory(args.device)
            print(f"  {H.DTYPE_NAMES[dtype]} {m}x{n} done", file=sys.stderr, flush=True)
    return out


# Issue 4's bars per pass: (x F.rms_norm, x compiled, % of copy at N >= WIDE_N); None = no bar.
BARS = {"fwd": (1.5, 1.0, None), "bwd": (None, None, 85.0), "fwd+bwd": (None, 1.0, None)}
WIDE_N = 4096


def summarize(results: Sequence[H.Result], device: str) -> str:
    """Per (pass, dtype): geomean and worst speedups of torchops vs eager and vs compiled, % of copy, bars."""
    gpu = device == "cuda"
    parts = []
    for case, (eager_bar, comp_bar, copy_bar) in BARS.items():
        for dt in ("bf16", "f32"):
            rows = [r for r in results if r.impl == IMPL and r.case == case and r.dtype == dt]
            if not rows:
                continue
            vs_eager = [r.speedup for r in rows]
            vs_comp = [r.extra["speedup_vs_compiled"] for r in rows if "speedup_vs_compiled" in r.extra]
            wide = [r.pct_copy for r in rows if int(r.shape.split("x")[1]) >= WIDE_N]
            text = f"{case} {dt}: {H.geomean(vs_eager):.3f}× eager (min {min(vs_eager):.3f})"
            if vs_comp:
                text += f", {H.geomean(vs_comp):.3f}× compiled (min {min(vs_comp):.3f})"
            if gpu:
                text += f", {sum(r.pct_copy for r in rows) / len(rows):.1f}% of copy"
                if wide:
                    text += f" (min {min(wide):.1f}% at N>={WIDE_N})"
                checks = [(eager_bar, min(vs_eager), f">={eager_bar}x eager"),
                          (comp_bar, min(vs_comp) if vs_comp else None, f">={comp_bar}x compiled"),
                          (copy_bar, min(wide) if wide else None, f">={copy_bar}% of copy at N>={WIDE_N}")]
                missed = [want for bar, got, want in checks if bar is not None and got is not None and got < bar]
                text += f" (bar MISSED: {', '.join(missed)})" if missed else " (bar ok)"
            parts.append(text)
    shapes_run = sorted({r.shape for r in results if r.op == OP}, key=lambda s: int(s.split("x")[1]))
    return f"Summary (rms_norm, shapes {', '.join(shapes_run)}; speedup > 1 = faster): " + "; ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = H.make_parser(__doc__.splitlines()[0], default_dtypes=("bf16", "f32"))
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    args = H.parse_args(parser, argv)
    try:
        import torchops  # noqa: F401
    except ImportError as e:
        print(f"torchops is not importable ({e}); build it first (see README / `make`).", file=sys.stderr)
        return 2

    floor = H.GPU_COPY_MIN_BYTES if args.device == "cuda" else H.CPU_COPY_MIN_BYTES
    largest = max(m * n for m, n in shapes(args.device, args.quick)) * max(d.itemsize for d in args.dtypes)
    copy_bytes = max(floor, largest)
    copy_bps = H.copy_bandwidth(args.device, copy_bytes, quick=args.quick)
    copy_row = H.Result(op="copy_", case="copy", dtype="u8", shape=f"{copy_bytes >> 20} MiB", numel=copy_bytes,
                        impl="dst.copy_(src)", device=args.device, ms=2 * copy_bytes / copy_bps * 1e3,
                        nbytes=2 * copy_bytes, tbps=copy_bps / 1e12, pct_copy=100.0)
    results = [copy_row] + bench(args, copy_bps)
    summary = summarize(results, args.device)
    H.emit(results, f"{OP}_{args.device}" + ("_quick" if args.quick else ""), out_dir=args.out_dir, summary=summary,
           meta={"copy_bytes": copy_bytes, "copy_tbps": copy_bps / 1e12, "eps": EPS})
    return 0


if __name__ == "__main__":
    sys.exit(main())
