"""Benchmark ``torchops.rms_norm`` and ``torchops.add_rms_norm`` against F.rms_norm, torch.compile and Liger.

On the same tensors in the same run, for each M×N shape and dtype (weight of the input's dtype):
  - rms_norm forward and forward + backward (one ``torch.autograd.grad`` of one forward's graph, for input and
    weight) against ``F.rms_norm``, ``torch.compile(F.rms_norm)`` (compiled afresh per shape, static shapes,
    dynamo's recompile limit raised so no shape falls back to eager) and Liger-Kernel's
    ``LigerRMSNormFunction`` (Llama casting, offset 0);
  - add_rms_norm forward and forward + backward (grads of input, residual and weight from both outputs)
    against eager ``x + r`` then ``F.rms_norm``, the same compiled, and Liger's ``LigerFusedAddRMSNormFunction``;
with bandwidth against a device-to-device copy measured in the same run, and against a copy of the same
bytes as each case (the ceiling at that size: launch and ramp-up weigh on small inputs, the copy's too). Liger is optional: without it the
run says so and the bars against it report no data. Bytes: each input read once and each output written once.

Bars: benchmarks/bars.py (checked by the harness; a missed bar, a peer that did not run or a wrong result
exits non-zero).

    python -m benchmarks.bench_rms_norm [--device cuda|cpu] [--quick] [--dtypes bf16,f32] [--no-compile]
                                       [--shapes MxN,...] [--no-bars] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Iterator, Sequence

if __package__ in (None, ""):  # run as a file: make `benchmarks` (and an in-place-built `torchops`) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from benchmarks import harness as H
from benchmarks.bars import NORM_GRID

OP = "rms_norm"
ADD_OP = "add_rms_norm"
BASELINE = "eager"
COMPILED = "torch.compile"
LIGER = "liger"
IMPL = "torchops"
SAME_BYTES_COPY = "copy of the same bytes"
EPS = 1e-6
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-10}


def shapes(device: str, quick: bool, only: str = "") -> list[tuple[int, int]]:
    """The LLM grid the bars are set at on the GPU; 1/8 of the rows on the CPU (2 cores).
    `only` ("256x1024,64x4096") replaces the list."""
    if only:
        return [tuple(int(v) for v in item.lower().split("x")) for item in only.split(",") if item.strip()]
    if quick:
        return [(4096, 1024), (1024, 8192)]
    return list(NORM_GRID) if device == "cuda" else [(m // 8, n) for m, n in NORM_GRID]


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


def bench(args: argparse.Namespace, copy_bps: float, liger) -> Iterator[H.Result]:
    import torchops

    add_rms_norm = getattr(torchops, "add_rms_norm", None) or (
        lambda x, r, w, eps: torch.ops.myns.add_rms_norm(x, r, w, eps, 0.0))
    gpu = args.device == "cuda"
    for dtype in args.dtypes:
        s = dtype.itemsize
        for m, n in shapes(args.device, args.quick, args.shapes):
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
                runs += [(ADD_OP, "fwd", add_fwd, {name: af}),
                         (ADD_OP, "fwd+bwd", add_fwd + m * 4 + add_bwd, {name: afb})]
            shape = f"{m}x{n}"
            out: list[H.Result] = []  # this shape's rows, handed on once the shape is done
            for op, case in ((OP, "fwd"), (OP, "fwd+bwd"), (ADD_OP, "fwd"), (ADD_OP, "fwd+bwd")):
                fns = {k: v for o, c, _, d in runs if o == op and c == case for k, v in d.items()}
                nbytes = next(b for o, c, b, _ in runs if o == op and c == case)
                # A device copy moving the same bytes, timed beside them: the ceiling for this size, which
                # for small inputs sits well below the large copy that "% of copy" is measured against.
                src, dst = (torch.empty(nbytes // 2, dtype=torch.uint8, device=args.device) for _ in range(2))
                fns[SAME_BYTES_COPY] = lambda: dst.copy_(src)
                times = H.time_all_ms(fns, args.device, quick=args.quick)
                copy_ms = times.pop(SAME_BYTES_COPY)
                del src, dst
                # one progress line per (op, pass, shape): a run cut short still reports what it measured
                peers = ", ".join(f"{k} {times[k] / times[IMPL]:.3f}x" for k in times if k != IMPL)
                pct = H.pct_of(H.tbps(nbytes, times[IMPL]) * 1e12, copy_bps)
                print(f"  {op} {case} {H.DTYPE_NAMES[dtype]} {shape}: ours {times[IMPL] * 1e3:.1f} us, {pct:.1f}% of "
                      f"copy ({100 * copy_ms / times[IMPL]:.1f}% of a copy of the same bytes, {copy_ms * 1e3:.1f} us); "
                      f"vs {peers}", file=sys.stderr, flush=True)
                for name, ms in times.items():
                    res = H.bandwidth_result(op=op, case=case, dtype=dtype, shape=shape, numel=m * n, impl=name,
                                             device=args.device, ms=ms, nbytes=nbytes, copy_bps=copy_bps,
                                             baseline=BASELINE, baseline_ms=times[BASELINE])
                    for peer in (COMPILED, LIGER):
                        if peer in times:
                            res.extra[f"speedup_vs_{peer}"] = times[peer] / ms
                    res.extra["pct_same_bytes_copy"] = 100 * copy_ms / ms
                    out.append(res)
            del x, r, w, dy, dres, xg, rg, wg, norm, add, runs
            H.free_memory(args.device)
            if gpu:
                torch._dynamo.reset()  # compiled graphs of this shape hold memory and count toward the limit
            print(f"  {H.DTYPE_NAMES[dtype]} {m}x{n} done", file=sys.stderr, flush=True)
            yield from out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers (their bars: no data)")
    parser.add_argument("--shapes", default="", help="comma-separated MxN list replacing the default shapes")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    try:
        got = shapes(args.device, args.quick, args.shapes)
    except ValueError:
        got = []
    if not got or any(len(mn) != 2 or min(mn) < 1 for mn in got):
        parser.error("--shapes: a comma-separated list of MxN, e.g. 256x1024,64x4096")


def run(args: argparse.Namespace, ctx: H.Context) -> Iterator[H.Result]:
    H.raise_recompile_limit()  # a fresh compile per shape, each specialised
    liger, why = _liger() if args.device == "cuda" else (None, "CPU run")
    if liger is None and args.device == "cuda":
        print(f"NOTE: Liger-Kernel skipped ({why}; pip install liger-kernel==0.8.5): its bars report no data",
              file=sys.stderr)
    yield from bench(args, ctx.copy_bps, liger)


BENCH = H.Bench(
    op=OP,
    description=__doc__.splitlines()[0],
    run=run,
    largest_operand=lambda args: (max(m * n for m, n in shapes(args.device, args.quick, args.shapes))
                                  * max(d.itemsize for d in args.dtypes)),
    default_dtypes=("bf16", "f32"),
    more_ops=(ADD_OP,),
    add_arguments=add_arguments,
    check_arguments=check_arguments,
    meta=lambda args: {"eps": EPS, "compile": not args.no_compile,
                       "liger": args.device == "cuda" and _liger()[0] is not None},
)


def main(argv: Sequence[str] | None = None) -> int:
    return H.main(BENCH, argv)


if __name__ == "__main__":
    sys.exit(main())
