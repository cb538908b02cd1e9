"""Benchmark the gated ops (every row of ``benchmarks/gated.py``: swiglu, gelu_and_mul, ...) against eager and ``torch.compile`` of their math.

Gate and up are the two halves of one fused projection, ``x.chunk(2, -1)`` of a (tokens, 2*hidden) tensor
(``--layouts contiguous`` adds separate dense tensors). On the same tensors in the same run, for each op and
each of its forms (gelu's ``approximate``): forward (3 tensors moved: gate, up read, out written) and
backward through autograd (5 tensors: grad_out, gate, up read, grad_gate, grad_up written; each
implementation's own backward: eager runs the activation's and mul's backward kernels, compile the Inductor
backward of the compiled function, torchops its ``<op>_backward``), bandwidth against a device-to-device copy
measured in the same run, and the peak memory of forward+backward from a leaf x (CUDA). Cases are named
"<fwd|bwd> <layout>[ <form>]"; the results of every op go to ``<first op>_<device>.json``.

    python -m benchmarks.bench_gated [--device cuda|cpu] [--quick] [--dtypes bf16,f32] [--threads N]
                                     [--ops swiglu,gelu_and_mul] [--layouts chunk,contiguous] [--forms none,tanh]
                                     [--shapes TxH,...] [--no-compile] [--out-dir DIR]
    (from the repository root, as benchmarks/run_all.py runs it)
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Callable, Iterator, Sequence

import torch

from benchmarks import harness as H
from benchmarks.gated import BAR_SHAPE, LAYOUTS, OPS, OPS_BY_NAME, GatedOp

IMPL = "torchops"
COMPILED = "torch.compile"
# Tolerances of the pre-timing check against eager (eager rounds the activation to the dtype before the product).
CHECK_TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3), torch.float32: (1e-5, 1e-5),
             torch.float64: (1e-10, 1e-10)}


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
    peak, _ = H.peak_cuda_bytes(lambda: fn(*leaf.chunk(2, dim=-1)).backward(grad))
    return peak


def _bench_form(spec: GatedOp, args: argparse.Namespace, form: str | None, layout: str, gate: torch.Tensor,
                up: torch.Tensor, grad: torch.Tensor, copy_bps: float) -> Iterator[H.Result]:
    import torchops

    tokens, hidden = gate.shape
    shape, n, dtype = f"{tokens}x{hidden}", tokens * hidden, gate.dtype
    kw = {} if form is None else {spec.form_arg: form}
    eager = functools.partial(spec.reference, **kw)
    impls: dict[str, Callable] = {spec.eager: eager, IMPL: functools.partial(getattr(torchops, spec.op), **kw)}
    if args.compile:
        torch._dynamo.reset()
        # Static shapes: Inductor's best case for each shape (one compile per shape and form).
        impls[COMPILED] = torch.compile(eager, dynamic=False)
    common = dict(op=spec.op, dtype=dtype, shape=shape, numel=n, device=args.device, copy_bps=copy_bps)
    what = f"{spec.op} {shape}" if form is None else f"{spec.op} {shape} {form}"

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


def bench(spec: GatedOp, args: argparse.Namespace, copy_bps: float) -> Iterator[H.Result]:
    forms = [f for f in args.forms if f in spec.forms] if spec.forms else [None]
    for dtype in args.dtypes:
        for layout in args.layouts:
            for tokens, hidden in shapes(spec, args.device, args.quick, args.shapes):
                gate, up = make_inputs(layout, tokens, hidden, dtype, args.device)
                grad = H.rand((tokens, hidden), dtype, args.device)
                out: list[H.Result] = []  # this shape's rows, handed on once the shape is done
                for form in forms:
                    out.extend(_bench_form(spec, args, form, layout, gate, up, grad, copy_bps))
                    H.free_memory(args.device)
                del gate, up, grad
                H.free_memory(args.device)
                print(f"  {spec.op} {H.DTYPE_NAMES[dtype]} {layout} {tokens}x{hidden} done", file=sys.stderr, flush=True)
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


def _names(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    all_forms = sorted({f for spec in OPS for f in spec.forms})
    parser.add_argument("--layouts", default="chunk", help="comma-separated subset of chunk,contiguous (default: %(default)s)")
    parser.add_argument("--forms", default=",".join(all_forms),
                        help="comma-separated forms of the ops that have several (default: %(default)s)")
    parser.add_argument("--shapes", default="", help="comma-separated TOKENSxHIDDEN list replacing the default shapes")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile baseline")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.layouts, args.forms = _names(args.layouts), _names(args.forms)  # args.ops: the harness's --ops
    if not args.layouts or any(s not in LAYOUTS for s in args.layouts):
        parser.error(f"--layouts: choose from {', '.join(LAYOUTS)}")
    for op in args.ops:
        spec = OPS_BY_NAME[op]
        if spec.forms and not any(f in spec.forms for f in args.forms):
            parser.error(f"--forms: {op} needs one of {', '.join(spec.forms)}")


def make_bench(ops: Sequence[str]) -> H.Bench:
    """The bench of these gated ops (the harness's --ops picks among them; the bars of those it runs are checked)."""
    specs = [OPS_BY_NAME[op] for op in ops]

    def run(args: argparse.Namespace, ctx: H.Context) -> Iterator[H.Result]:
        H.raise_recompile_limit()
        for spec in specs:
            if spec.op in args.ops:
                yield from bench(spec, args, ctx.copy_bps)

    return H.Bench(
        op=specs[0].op,
        more_ops=tuple(spec.op for spec in specs[1:]),
        name="gated",
        run=run,
        largest_operand=lambda args: (max(t * h for spec in specs for t, h in shapes(spec, args.device, args.quick, args.shapes))
                                      * max(d.itemsize for d in args.dtypes)),
        default_dtypes=("bf16", "f32"),
        add_arguments=add_arguments,
        check_arguments=check_arguments,
        summarize=lambda results, args, ctx: "\n".join(summarize(spec, results, args.device, ctx.copy_bps)
                                                       for spec in specs if spec.op in args.ops),
        meta=lambda args: {"layouts": args.layouts, "compile": args.compile, "forms": args.forms},
    )


BENCH = make_bench([spec.op for spec in OPS])


def main(argv: Sequence[str] | None = None) -> int:
    return H.main(BENCH, argv)


if __name__ == "__main__":
    sys.exit(main())
