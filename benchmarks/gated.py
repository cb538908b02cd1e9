"""The gated-activation family's bench (swiglu, gelu_and_mul): ``op(gate, up)`` against eager and
``torch.compile`` of its math, forward and backward. Each ``bench_<op>.py`` declares a :class:`GatedOp`.

Gate and up are the two halves of one fused projection, ``x.chunk(2, -1)`` of a (tokens, 2*hidden) tensor
(``--layouts contiguous`` adds separate dense tensors). On the same tensors in the same run, for each form
of the op (gelu's ``approximate``): forward (3 tensors moved: gate, up read, out written) and backward
through autograd (5 tensors: grad_out, gate, up read, grad_gate, grad_up written; each implementation's own
backward: eager runs the activation's and mul's backward kernels, compile the Inductor backward of the
compiled function, torchops its ``<op>_backward``), bandwidth against a device-to-device copy measured in
the same run, and the peak memory of forward+backward from a leaf x (CUDA). Cases are named
"<fwd|bwd> <layout>[ <form>]".
"""

from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from benchmarks import harness as H

IMPL = "torchops"
COMPILED = "torch.compile"
LAYOUTS = ("chunk", "contiguous")
# Tolerances of the pre-timing check against eager (eager rounds the activation to the dtype before the product).
CHECK_TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3), torch.float32: (1e-5, 1e-5),
             torch.float64: (1e-10, 1e-10)}
BAR_SHAPE = (16384, 14336)  # where benchmarks/bars.py judges the family (a LLaMA-3-8B MLP at 16k tokens)


@dataclass(frozen=True)
class GatedOp:
    op: str  # the torchops function, e.g. "swiglu"
    eager: str  # the name of the eager baseline in the results, e.g. "eager silu*mul"
    reference: Callable[..., torch.Tensor]  # reference(gate, up, **{form_arg: form}): eager math
    gpu_shapes: tuple[tuple[int, int], ...]  # (tokens, hidden) on the GPU without --quick/--shapes
    form_arg: str = ""  # the keyword that selects a form ("approximate"), "" when the op has one form
    forms: tuple[str, ...] = ()

    def case(self, base: str, form: str | None) -> str:
        return base if form is None else f"{base} {form}"


def shapes(spec: GatedOp, device: str, quick: bool, only: str = "") -> list[tuple[int, int]]:
    """(tokens, hidden): the op's GPU list or a smaller CPU set; `only` ("16384x14336,4096x11008") replaces it."""
    if only:
        return [tuple(int(v) for v in item.lower().split("x")) for item in only.split(",") if item.strip()]
    if quick:
        return [(64, 1024), (128, 2816)]
    if device == "cuda":
        return list(spec.gpu_shapes)
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


def _bench_form(spec: GatedOp, args: argparse.Namespace, impl: Callable, form: str | None, layout: str, gate: torch.Tensor,
                up: torch.Tensor, grad: torch.Tensor, copy_bps: float) -> Iterator[H.Result]:
    tokens, hidden = gate.shape
    shape, n, dtype = f"{tokens}x{hidden}", tokens * hidden, gate.dtype
    kw = {} if form is None else {spec.form_arg: form}
    eager = functools.partial(spec.reference, **kw)
    impls: dict[str, Callable] = {spec.eager: eager, IMPL: functools.partial(impl, **kw)}
    if args.compile:
        torch._dynamo.reset()
        # Static shapes: Inductor's best case for each shape (one compile per shape and form).
        impls[COMPILED] = torch.compile(eager, dynamic=False)
    common = dict(op=spec.op, dtype=dtype, shape=shape, numel=n, device=args.device, copy_bps=copy_bps)
    what = f"{shape}" if form is None else f"{shape} {form}"

    def rows(case: str, times: dict[str, float], tensors_moved: int) -> Iterator[H.Result]:
        for name, ms in times.items():
            r = H.bandwidth_result(case=spec.case(case, form), impl=name, ms=ms,
                                   nbytes=tensors_moved * n * gate.element_size(), baseline=spec.eager,
                                   baseline_ms=times[spec.eager], **common)
            if name == IMPL and COMPILED in times:
                r.extra["vs_compiled"] = H.speedup(times[COMPILED], ms)
            yield r

    # Forward: 2 reads + 1 write.
    want = eager(gate, up)
    for name, fn in impls.items():
        _check(fn(gate, up), want, dtype, f"{name} forward {what}")
    del want
    fwd_ms = H.time_all_ms({name: (lambda fn=fn: fn(gate, up)) for name, fn in impls.items()}, args.device,
                           quick=args.quick)
    yield from rows(f"fwd {layout}", fwd_ms, 3)

    # Backward through autograd: 3 reads + 2 writes.
    runs = {}
    want_grads = None
    for name, fn in impls.items():
        runs[name], grads = _backward_timer(fn, gate, up, grad)
        if want_grads is None:
            want_grads = grads
        else:
            for got, exp in zip(grads, want_grads):
                _check(got, exp, dtype, f"{name} backward {what}")
        del grads
    del want_grads
    bwd_ms = H.time_all_ms(runs, args.device, quick=args.quick)
    del runs
    H.free_memory(args.device)
    yield from rows(f"bwd {layout}", bwd_ms, 5)

    if args.device == "cuda" and layout == "chunk":
        x = gate._base if gate._base is not None else torch.cat([gate, up], dim=-1)
        peaks = {name: peak_fwd_bwd_bytes(fn, x, grad) for name, fn in impls.items()}
        for name, peak in peaks.items():
            yield H.Result(op=spec.op, case=spec.case("peak MiB fwd+bwd", form), dtype=H.DTYPE_NAMES[dtype],
                           shape=shape, numel=n, impl=name, device=args.device, ms=0.0,
                           speedup=peaks[spec.eager] / peak if peak else None, baseline=spec.eager,
                           extra={"peak_bytes": peak, "peak_mib": peak / H.MiB})


def bench(spec: GatedOp, args: argparse.Namespace, impl: Callable, copy_bps: float) -> Iterator[H.Result]:
    for dtype in args.dtypes:
        for layout in args.layouts:
            for tokens, hidden in shapes(spec, args.device, args.quick, args.shapes):
                gate, up = make_inputs(layout, tokens, hidden, dtype, args.device)
                grad = H.rand((tokens, hidden), dtype, args.device)
                out: list[H.Result] = []  # this shape's rows, handed on once the shape is done
                for form in args.forms or [None]:
                    out.extend(_bench_form(spec, args, impl, form, layout, gate, up, grad, copy_bps))
                    H.free_memory(args.device)
                del gate, up, grad
                H.free_memory(args.device)
                print(f"  {H.DTYPE_NAMES[dtype]} {layout} {tokens}x{hidden} done", file=sys.stderr, flush=True)
                yield from out


def summarize(spec: GatedOp, results: Sequence[H.Result], device: str, copy_bps: float) -> str:
    """The figures the bars are about (vs eager, vs compiled, % of copy) at BAR_SHAPE when measured, else at
    the largest shape measured; the bars themselves are checked by the harness."""
    measured = {r.numel for r in results if r.op == spec.op}
    top = BAR_SHAPE[0] * BAR_SHAPE[1] if BAR_SHAPE[0] * BAR_SHAPE[1] in measured else max(measured, default=0)
    at_top = [r for r in results if r.numel == top and r.op == spec.op]
    parts: list[str] = []
    for dt in ("bf16", "f32"):
        for form in spec.forms or (None,):
            for base in ("fwd chunk", "bwd chunk", "fwd contiguous", "bwd contiguous"):
                case = spec.case(base, form)
                r = next((r for r in at_top if r.dtype == dt and r.case == case and r.impl == IMPL), None)
                if r is None:
                    continue
                text = f"{dt} {case} {r.speedup:.2f}× eager"
                if (vs_c := r.extra.get("vs_compiled")) is not None:
                    text += f", {vs_c:.2f}× compiled"
                if device == "cuda":
                    text += f", {r.pct_copy:.1f}% of copy"
                parts.append(text)
            peak = {r.impl: r for r in at_top if r.dtype == dt and r.case == spec.case("peak MiB fwd+bwd", form)}
            if IMPL in peak and spec.eager in peak:
                parts.append(f"{dt} {spec.case('peak fwd+bwd', form)} {peak[IMPL].extra['peak_mib']:.0f} MiB vs eager "
                             f"{peak[spec.eager].extra['peak_mib']:.0f} MiB" +
                             (f", compiled {peak[COMPILED].extra['peak_mib']:.0f} MiB" if COMPILED in peak else ""))
    if device == "cuda":
        parts.append(f"copy {copy_bps / 1e12:.2f} TB/s")
    shape = at_top[0].shape if at_top else "?"
    return f"Summary {spec.op} ({shape}; speedup > 1 = faster): " + "; ".join(parts)


def make_bench(spec: GatedOp, description: str) -> H.Bench:
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--layouts", default="chunk",
                            help="comma-separated subset of chunk,contiguous (default: %(default)s)")
        parser.add_argument("--shapes", default="", help="comma-separated TOKENSxHIDDEN list replacing the default shapes")
        if spec.forms:
            parser.add_argument("--forms", default=",".join(spec.forms),
                                help=f"comma-separated subset of {','.join(spec.forms)} (default: %(default)s)")
        parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile baseline")

    def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        args.layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
        if not args.layouts or any(s not in LAYOUTS for s in args.layouts):
            parser.error(f"--layouts: choose from {', '.join(LAYOUTS)}")
        args.forms = [s.strip() for s in getattr(args, "forms", "").split(",") if s.strip()]
        if spec.forms and (not args.forms or any(s not in spec.forms for s in args.forms)):
            parser.error(f"--forms: choose from {', '.join(spec.forms)}")

    def run(args: argparse.Namespace, ctx: H.Context) -> Iterator[H.Result]:
        import torchops

        H.raise_recompile_limit()
        yield from bench(spec, args, getattr(torchops, spec.op), ctx.copy_bps)

    def meta(args: argparse.Namespace) -> dict:
        return {"layouts": args.layouts, "compile": args.compile, **({"forms": args.forms} if spec.forms else {})}

    return H.Bench(
        op=spec.op,
        description=description,
        run=run,
        largest_operand=lambda args: (max(t * h for t, h in shapes(spec, args.device, args.quick, args.shapes))
                                      * max(d.itemsize for d in args.dtypes)),
        default_dtypes=("bf16", "f32"),
        add_arguments=add_arguments,
        check_arguments=check_arguments,
        summarize=lambda results, args, ctx: summarize(spec, results, args.device, ctx.copy_bps),
        meta=meta,
    )
