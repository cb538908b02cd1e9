"""Benchmark ``torchops.rms_norm`` and ``torchops.add_rms_norm`` against their peers, and check issue 16's bars.

On the same tensors in the same run, for each M×N shape and dtype (weight of the input's dtype):
  - rms_norm forward and forward + backward (one ``torch.autograd.grad`` of one forward's graph, for input and
    weight) against ``F.rms_norm``, ``torch.compile(F.rms_norm)`` (compiled afresh per shape, static shapes,
    dynamo's recompile limit raised so no shape falls back to eager) and Liger-Kernel's
    ``LigerRMSNormFunction`` (Llama casting, offset 0);
  - add_rms_norm forward and forward + backward (grads of input, residual and weight from both outputs)
    against eager ``x + r`` then ``F.rms_norm``, the same compiled, and Liger's ``LigerFusedAddRMSNormFunction``;
with bandwidth against a device-to-device copy measured in the same run. Liger is optional: without it the
run says so and its bars count as unchecked. Bytes: each input read once and each output written once.

Bars (GPU; issue 16): forward >= 1.00x the best peer at every shape (0.98x tolerated at <= 2 shapes) and >= 90%
of copy for N <= 32768; fwd+bwd >= 1.00x the best peer and >= 85% of copy for 1024 <= N <= 16384 at inputs of
256 MB or more; add_rms_norm fwd and fwd+bwd >= 1.00x compiled add + rms_norm and Liger's fused add, forward
>= 90% of copy for N <= 32768. CPU: >= 1.00x eager at every shape. Exit status: 0 all bars met, 1 a bar missed,
3 a bar could not be checked (missing data: a peer that did not run).

    python -m benchmarks.bench_rms_norm [--device cuda|cpu] [--quick] [--dtypes bf16,f32] [--no-compile]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

if __package__ in (None, ""):  # run as a file: make `benchmarks` (and an in-place-built `torchops`) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from benchmarks import harness as H

OP = "rms_norm"
ADD_OP = "add_rms_norm"
BASELINE = "eager"
COMPILED = "torch.compile"
LIGER = "liger"
IMPL = "torchops"
EPS = 1e-6
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-10}
GRID = [(4096, 2048), (65536, 1024), (32768, 4096), (16384, 8192), (8192, 16384), (4096, 32768), (2048, 65536)]


def shapes(device: str, quick: bool) -> list[tuple[int, int]]:
    """Issue 16's grid on the GPU; 1/8 of the rows on the CPU (2 cores)."""
    if quick:
        return [(4096, 1024), (1024, 8192)]
    return GRID if device == "cuda" else [(m // 8, n) for m, n in GRID]


def _liger():
    """(LigerRMSNormFunction, LigerFusedAddRMSNormFunction), or a reason why not."""
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception as e:  # noqa: BLE001 - any import failure means: no Liger in this run
        return None, f"{type(e).__name__}: {e}"
    return (LigerRMSNormFunction, LigerFusedAddRMSNormFunction), ""


def _compile(fn: Callable) -> Callable:
    return torch.compile(fn, dynamic=False)


def _check_close(name: str, got, want, tol: float) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        scale = w.abs().max().item() if w.dim() == 1 else 1.0  # dweight sums M rows: relative to its scale
        torch.testing.assert_close(g, w, rtol=tol * (4 if w.dim() == 1 else 1), atol=tol * (4 * scale if w.dim() == 1 else 1),
                                   msg=lambda s: f"{name} output {i}: {s}")


def bench(args: argparse.Namespace, copy_bps: float, liger) -> list[H.Result]:
    import torchops

    add_rms_norm = getattr(torchops, "add_rms_norm", None) or (
        lambda x, r, w, eps: torch.ops.myns.add_rms_norm(x, r, w, eps, 0.0))
    gpu = args.device == "cuda"
    out: list[H.Result] = []
    for dtype in args.dtypes:
        s = dtype.itemsize
        for m, n in shapes(args.device, args.quick):
            x, r = H.rand((m, n), dtype, args.device), H.rand((m, n), dtype, args.device)
            w = H.rand((n,), dtype, args.device)
            dy, dres = H.rand((m, n), dtype, args.device), H.rand((m, n), dtype, args.device)
            xg, rg, wg = (t.detach().requires_grad_() for t in (x, r, w))

            def eager(a, b):
                return F.rms_norm(a, (n,), b, EPS)

            def eager_add(a, res, b):
                h = a + res
                return F.rms_norm(h, (n,), b, EPS), h

            norm: dict[str, Callable] = {BASELINE: eager, IMPL: lambda a, b: torchops.rms_norm(a, b, EPS)}
            add: dict[str, Callable] = {BASELINE: eager_add, IMPL: lambda a, res, b: add_rms_norm(a, res, b, EPS)}
            if gpu and not args.no_compile:
                norm[COMPILED], add[COMPILED] = _compile(eager), _compile(eager_add)
            if liger is not None:
                rms_fn, add_fn = liger
                norm[LIGER] = lambda a, b: rms_fn.apply(a, b, EPS, 0.0, "llama", False)
                add[LIGER] = lambda a, res, b: add_fn.apply(a, res, b, EPS, 0.0, "llama", False)

            tol = TOL[dtype]
            want = eager(x, w)
            want_g = torch.autograd.grad(eager(xg, wg), (xg, wg), dy)
            want_add = eager_add(x, r, w)
            want_add_g = torch.autograd.grad(eager_add(xg, rg, wg), (xg, rg, wg), (dy, dres))
            for name, fn in norm.items():  # a wrong kernel must not report a number
                with torch.no_grad():
                    _check_close(f"{OP} {name}", (fn(x, w),), (want,), tol)
                _check_close(f"{OP} {name} grads", torch.autograd.grad(fn(xg, wg), (xg, wg), dy), want_g, tol)
            for name, fn in add.items():
                with torch.no_grad():
                    _check_close(f"{ADD_OP} {name}", fn(x, r, w), want_add, tol)
                _check_close(f"{ADD_OP} {name} grads", torch.autograd.grad(fn(xg, rg, wg), (xg, rg, wg), (dy, dres)),
                             want_add_g, tol)

            fwd = 2 * m * n * s + n * s
            bwd = 3 * m * n * s + m * 4 + 2 * n * s  # dy, x, rstd read; dx, dw written; w read
            add_fwd = 4 * m * n * s + n * s
            add_bwd = 4 * m * n * s + m * 4 + 2 * n * s  # dy, dres, h, rstd read; dx written (handed to both)
            runs: list[tuple[str, str, int, dict[str, Callable]]] = []
            for name, fn in norm.items():
                def f(fn=fn):
                    with torch.no_grad():
                        return fn(x, w)

                def fb(fn=fn):
                    return torch.autograd.grad(fn(xg, wg), (xg, wg), dy)
                runs += [(OP, "fwd", fwd, {name: f}), (OP, "fwd+bwd", fwd + m * 4 + bwd, {name: fb})]
            for name, fn in add.items():
                def af(fn=fn):
                    with torch.no_grad():
                        return fn(x, r, w)

                def afb(fn=fn):
                    return torch.autograd.grad(fn(xg, rg, wg), (xg, rg, wg), (dy, dres))
                runs += [(ADD_OP, "fwd", add_fwd, {name: af}), (ADD_OP, "fwd+bwd", add_fwd + m * 4 + add_bwd, {name: afb})]
            shape = f"{m}x{n}"
            for op, case in ((OP, "fwd"), (OP, "fwd+bwd"), (ADD_OP, "fwd"), (ADD_OP, "fwd+bwd")):
                fns = {k: v for o, c, _, d in runs if o == op and c == case for k, v in d.items()}
                nbytes = next(b for o, c, b, _ in runs if o == op and c == case)
                times = H.time_all_ms(fns, args.device, quick=args.quick)
                # one progress line per (op, pass, shape): a run cut short still reports what it measured
                peers = ", ".join(f"{k} {times[k] / times[IMPL]:.3f}x" for k in times if k != IMPL)
                pct = H.pct_of(H.tbps(nbytes, times[IMPL]) * 1e12, copy_bps)
                print(f"  {op} {case} {H.DTYPE_NAMES[dtype]} {shape}: ours {times[IMPL] * 1e3:.1f} us, {pct:.1f}% of "
                      f"copy; vs {peers}", file=sys.stderr, flush=True)
                for name, ms in times.items():
                    res = H.bandwidth_result(op=op, case=case, dtype=dtype, shape=shape, numel=m * n, impl=name,
                                             device=args.device, ms=ms, nbytes=nbytes, copy_bps=copy_bps,
                                             baseline=BASELINE, baseline_ms=times[BASELINE])
                    res.extra["input_bytes"] = m * n * s
                    for peer in (COMPILED, LIGER):
                        if peer in times:
                            res.extra[f"speedup_vs_{peer}"] = times[peer] / ms
                    out.append(res)
            del x, r, w, dy, dres, xg, rg, wg, norm, add, runs
            H.free_memory(args.device)
            if gpu:
                torch._dynamo.reset()  # compiled graphs of this shape hold memory and count toward the limit
            print(f"  {H.DTYPE_NAMES[dtype]} {m}x{n} done", file=sys.stderr, flush=True)
    return out


def check_bars(results: Sequence[H.Result], device: str, have_liger: bool, compiled: bool) -> tuple[list[str], int]:
    """Lines saying each bar's state, and the exit status (0 met, 1 missed, 3 unchecked)."""
    gpu = device == "cuda"
    lines: list[str] = []
    missed = unchecked = False
    peers = [BASELINE] + ([COMPILED] if gpu else []) + ([LIGER] if gpu else [])
    for op in (OP, ADD_OP):
        for case in ("fwd", "fwd+bwd"):
            for dt in sorted({r.dtype for r in results if r.op == op}):
                rows = [r for r in results if r.op == op and r.case == case and r.dtype == dt and r.impl == IMPL]
                if not rows:
                    continue
                # vs the best peer (the add bars name compiled and Liger; eager is a peer of both anyway)
                worst, shortfalls = [], 0
                for r in rows:
                    ratios = [r.speedup] + [r.extra[f"speedup_vs_{p}"] for p in (COMPILED, LIGER)
                                            if f"speedup_vs_{p}" in r.extra]
                    best = min(ratios)
                    worst.append((best, r.shape))
                    if best < 1.0:
                        shortfalls += 1
                    if best < (0.98 if case == "fwd" and op == OP else 1.0):
                        shortfalls += 100  # past the noise allowance
                ok = shortfalls <= (2 if case == "fwd" and op == OP else 0)
                lo, lo_shape = min(worst)
                text = f"{op} {case} {dt}: worst {lo:.3f}x best peer (at {lo_shape})"
                lacking = [p for p in peers[1:] if not all(f"speedup_vs_{p}" in r.extra for r in rows)]
                if lacking:
                    unchecked = True
                    text += f" [UNCHECKED vs {', '.join(lacking)}: not run]"
                if gpu:
                    if case == "fwd":
                        wide = [r for r in rows if int(r.shape.split("x")[1]) <= 32768]
                        copy_bar, cond = 90.0, "N <= 32768"
                    else:
                        wide = [r for r in rows if 1024 <= int(r.shape.split("x")[1]) <= 16384
                                and r.extra["input_bytes"] >= 256 << 20] if op == OP else []
                        copy_bar, cond = 85.0, "1024 <= N <= 16384, inputs >= 256 MB"
                    if wide:
                        low = min(wide, key=lambda r: r.pct_copy)
                        text += f", min {low.pct_copy:.1f}% of copy at {cond} ({low.shape})"
                        if low.pct_copy < copy_bar:
                            ok = False
                            text += f" < {copy_bar:.0f}%"
                missed |= not ok
                lines.append(text + (" -> bar ok" if ok else " -> bar MISSED"))
    if not have_liger and gpu:
        lines.append("Liger-Kernel not importable: its bars are unchecked (pip install liger-kernel==0.8.5)")
    if gpu and not compiled:
        lines.append("--no-compile: the torch.compile bars are unchecked")
        unchecked = True
    status = 1 if missed else 3 if unchecked else 0
    return lines, status


def main(argv: Sequence[str] | None = None) -> int:
    parser = H.make_parser(__doc__.splitlines()[0], default_dtypes=("bf16", "f32"))
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers")
    args = H.parse_args(parser, argv)
    try:
        import torchops  # noqa: F401
    except ImportError as e:
        print(f"torchops is not importable ({e}); build it first (see README / `make`).", file=sys.stderr)
        return 2
    # A fresh compile per shape, each specialised: no shape may fall back to eager for hitting the limit.
    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 1024))
    liger, why = _liger() if args.device == "cuda" else (None, "CPU run")
    if liger is None and args.device == "cuda":
        print(f"NOTE: Liger-Kernel skipped ({why})", file=sys.stderr)

    floor = H.GPU_COPY_MIN_BYTES if args.device == "cuda" else H.CPU_COPY_MIN_BYTES
    largest = max(m * n for m, n in shapes(args.device, args.quick)) * max(d.itemsize for d in args.dtypes)
    copy_bytes = max(floor, largest)
    copy_bps = H.copy_bandwidth(args.device, copy_bytes, quick=args.quick)
    copy_row = H.Result(op="copy_", case="copy", dtype="u8", shape=f"{copy_bytes >> 20} MiB", numel=copy_bytes,
                        impl="dst.copy_(src)", device=args.device, ms=2 * copy_bytes / copy_bps * 1e3,
                        nbytes=2 * copy_bytes, tbps=copy_bps / 1e12, pct_copy=100.0)
    results = [copy_row] + bench(args, copy_bps, liger)
    lines, status = check_bars(results, args.device, liger is not None, not args.no_compile)
    summary = "Bars (issue 16): " + "; ".join(lines)
    H.emit(results, f"{OP}_{args.device}" + ("_quick" if args.quick else ""), out_dir=args.out_dir, summary=summary,
           meta={"copy_bytes": copy_bytes, "copy_tbps": copy_bps / 1e12, "eps": EPS, "liger": liger is not None})
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
