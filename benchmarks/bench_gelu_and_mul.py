"""Benchmark ``torchops.gelu_and_mul`` (forward and backward, erf and tanh forms) against eager ``F.gelu(g) * u`` and ``torch.compile`` of it.

GeGLU MLP shapes: gate and up are the two halves of one fused projection, ``x.chunk(2, -1)`` of a
(tokens, 2*hidden) tensor (``--layouts contiguous`` adds separate dense tensors). On the same tensors in
the same run, for each form ("none": erf, "tanh"): forward (3 tensors moved: gate, up read, out written)
and backward through autograd (5 tensors: grad_out, gate, up read, grad_gate, grad_up written; each impl's
own backward), bandwidth against a device-to-device copy measured in the same run, and the peak memory of
forward+backward from a leaf x (CUDA). Cases are named "<fwd|bwd> <layout> <form>".

    python benchmarks/bench_gelu_and_mul.py [--device cuda|cpu] [--quick] [--dtypes bf16,f32] [--threads N]
                                            [--layouts chunk,contiguous] [--forms none,tanh] [--no-compile]
                                            [--out-dir DIR]
    python -m benchmarks.bench_gelu_and_mul ...
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Callable, Iterator, Sequence

if __package__ in (None, ""):  # run as a file: make `benchmarks` (and an in-place-built `torchops`) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from benchmarks import harness as H

OP = "gelu_and_mul"
IMPL = "torchops"
EAGER = "eager gelu*mul"
COMPILED = "torch.compile"
# Tolerances of the pre-timing check against eager (eager rounds gelu to the dtype before the product).
CHECK_TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3), torch.float32: (1e-5, 1e-5),
             torch.float64: (1e-10, 1e-10)}


def reference_math(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return F.gelu(gate, approximate=approximate) * up


BAR_SHAPE = (16384, 14336)  # where benchmarks/bars.py judges gelu_and_mul, as swiglu
FORMS = ("none", "tanh")


def shapes(device: str, quick: bool, only: str = "") -> list[tuple[int, int]]:
    """(tokens, hidden): LLaMA-7B/8B/70B-style intermediate sizes on the GPU; a smaller CPU set.
    `only` ("16384x14336,4096x11008") replaces the list."""
    if only:
        return [tuple(int(v) for v in item.lower().split("x")) for item in only.split(",") if item.strip()]
    if quick:
        return [(64, 1024), (128, 2816)]
    if device == "cuda":
        return [BAR_SHAPE]
    return [(512, 11008), (1024, 14336)]


def make_inputs(layout: str, tokens: int, hidden: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    if layout == "chunk":
        gate, up = H.rand((tokens, 2 * hidden), dtype, device).chunk(2, dim=-1)
        return gate, up
    return H.rand((tokens, hidden), dtype, device), H.rand((tokens, hidden), dtype, device)


def _check(got, want, dtype: torch.dtype, what: str) -> None:
    rtol, atol = CHECK_TOL[dtype]
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def _backward_timer(fn: Callable, gate: torch.Tensor, up: torch.Tensor, grad: torch.Tensor) -> tuple[Callable[[], object], tuple]:
    """A callable running only the backward of fn(gate, up) (graph kept), and its first result."""
    g, u = gate.detach().requires_grad_(), up.detach().requires_grad_()  # leaves, still views of x
    out = fn(g, u)
    run = lambda: torch.autograd.grad(out, (g, u), grad, retain_graph=True)  # noqa: E731
    return run, run()


def peak_fwd_bwd_bytes(fn: Callable, x: torch.Tensor, grad: torch.Tensor) -> int:
    """Peak CUDA memory above what was allocated before one forward+backward from the leaf x."""
    leaf = x.detach().requires_grad_()
    H.free_memory("cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn(*leaf.chunk(2, dim=-1)).backward(grad)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del leaf
    return peak


def bench(args: argparse.Namespace, gelu_and_mul: Callable, copy_bps: float) -> Iterator[H.Result]:
    for dtype in args.dtypes:
        for layout in args.layouts:
            for tokens, hidden in shapes(args.device, args.quick, args.shapes):
                shape = f"{tokens}x{hidden}"
                n = tokens * hidden
                gate, up = make_inputs(layout, tokens, hidden, dtype, args.device)
                grad = H.rand((tokens, hidden), dtype, args.device)
                out: list[H.Result] = []  # this shape's rows, handed on once the shape is done
                for form in args.forms:
                    eager = functools.partial(reference_math, approximate=form)
                    impls: dict[str, Callable] = {EAGER: eager,
                                                  IMPL: functools.partial(gelu_and_mul, approximate=form)}
                    if args.compile:
                        torch._dynamo.reset()
                        # Static shapes: Inductor's best case for each shape (one compile per shape and form).
                        impls[COMPILED] = torch.compile(eager, dynamic=False)
                    common = dict(op=OP, dtype=dtype, shape=shape, numel=n, device=args.device, copy_bps=copy_bps)

                    def emit(case: str, times: dict[str, float], tensors_moved: int) -> None:
                        for name, ms in times.items():
                            out.append(H.bandwidth_result(case=case, impl=name, ms=ms,
                                                          nbytes=tensors_moved * n * gate.element_size(),
                                                          baseline=EAGER, baseline_ms=times[EAGER], **common))
                            if name == IMPL and COMPILED in times:
                                out[-1].extra["vs_compiled"] = H.speedup(times[COMPILED], ms)

                    # Forward: 2 reads + 1 write.
                    want = eager(gate, up)
                    for name, fn in impls.items():
                        _check(fn(gate, up), want, dtype, f"{name} forward {shape} {form}")
                    del want
                    fwd_ms = H.time_all_ms({name: (lambda fn=fn: fn(gate, up)) for name, fn in impls.items()},
                                           args.device, quick=args.quick)
                    emit(f"fwd {layout} {form}", fwd_ms, 3)

                    # Backward through autograd: 3 reads + 2 writes.
                    runs = {}
                    want_grads = None
                    for name, fn in impls.items():
                        runs[name], grads = _backward_timer(fn, gate, up, grad)
                        if want_grads is None:
                            want_grads = grads
                        else:
                            for got, exp in zip(grads, want_grads):
                                _check(got, exp, dtype, f"{name} backward {shape} {form}")
                        del grads
                    del want_grads
                    bwd_ms = H.time_all_ms(runs, args.device, quick=args.quick)
                    del runs
                    H.free_memory(args.device)
                    emit(f"bwd {layout} {form}", bwd_ms, 5)

                    if args.device == "cuda" and layout == "chunk":
                        x = gate._base if gate._base is not None else torch.cat([gate, up], dim=-1)
                        peaks = {name: peak_fwd_bwd_bytes(fn, x, grad) for name, fn in impls.items()}
                        for name, peak in peaks.items():
                            out.append(H.Result(op=OP, case=f"peak MiB fwd+bwd {form}", dtype=H.DTYPE_NAMES[dtype],
                                                shape=shape, numel=n, impl=name, device=args.device, ms=0.0,
                                                speedup=peaks[EAGER] / peak if peak else None, baseline=EAGER,
                                                extra={"peak_bytes": peak, "peak_mib": peak / H.MiB}))
                    del impls
                    H.free_memory(args.device)
                del gate, up, grad
                H.free_memory(args.device)
                print(f"  {H.DTYPE_NAMES[dtype]} {layout} {shape} done", file=sys.stderr, flush=True)
                yield from out


def summarize(results: Sequence[H.Result], device: str, copy_bps: float) -> str:
    """The figures the bars are about (vs eager, vs compiled, % of copy) at 16384 x 14336 when measured, else at
    the largest shape measured; the bars themselves are checked by the harness."""
    measured = {r.numel for r in results if r.op == OP}
    top = BAR_SHAPE[0] * BAR_SHAPE[1] if BAR_SHAPE[0] * BAR_SHAPE[1] in measured else max(measured, default=0)
    parts: list[str] = []
    for dt in ("bf16", "f32"):
        for form in FORMS:
            for case in ("fwd chunk", "bwd chunk", "fwd contiguous", "bwd contiguous"):
                r = next((r for r in results if r.numel == top and r.dtype == dt and r.case == f"{case} {form}"
                          and r.impl == IMPL), None)
                if r is None:
                    continue
                vs_c = r.extra.get("vs_compiled")
                text = f"{dt} {case} {form} {r.speedup:.2f}× eager"
                if vs_c is not None:
                    text += f", {vs_c:.2f}× compiled"
                if device == "cuda":
                    text += f", {r.pct_copy:.1f}% of copy"
                parts.append(text)
    if device == "cuda":
        parts.append(f"copy {copy_bps / 1e12:.2f} TB/s")
    shape = next((r.shape for r in results if r.numel == top and r.op == OP), "?")
    return f"Summary gelu_and_mul ({shape}; speedup > 1 = faster): " + "; ".join(parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layouts", default="chunk", help="comma-separated subset of chunk,contiguous (default: %(default)s)")
    parser.add_argument("--shapes", default="", help="comma-separated TOKENSxHIDDEN list replacing the default shapes")
    parser.add_argument("--forms", default="none,tanh", help="comma-separated subset of none,tanh (default: %(default)s)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile baseline")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
    if not args.layouts or any(s not in ("chunk", "contiguous") for s in args.layouts):
        parser.error("--layouts: choose from chunk, contiguous")
    args.forms = [s.strip() for s in args.forms.split(",") if s.strip()]
    if not args.forms or any(s not in FORMS for s in args.forms):
        parser.error("--forms: choose from none, tanh")


def run(args: argparse.Namespace, ctx: H.Context) -> Iterator[H.Result]:
    import torchops

    # A fresh compile per shape and form, each specialised: none may fall back to eager for hitting the limit.
    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 1024))

    yield from bench(args, torchops.gelu_and_mul, ctx.copy_bps)


BENCH = H.Bench(
    op=OP,
    description=__doc__.splitlines()[0],
    run=run,
    largest_operand=lambda args: (max(t * h for t, h in shapes(args.device, args.quick, args.shapes))
                                  * max(d.itemsize for d in args.dtypes)),
    default_dtypes=("bf16", "f32"),
    add_arguments=add_arguments,
    check_arguments=check_arguments,
    summarize=lambda results, args, ctx: summarize(results, args.device, ctx.copy_bps),
    meta=lambda args: {"layouts": args.layouts, "forms": args.forms, "compile": args.compile},
)


def main(argv: Sequence[str] | None = None) -> int:
    return H.main(BENCH, argv)


if __name__ == "__main__":
    sys.exit(main())
