"""Benchmark the norms (rms_norm, add_rms_norm, layer_norm) against eager PyTorch, torch.compile and Liger-Kernel.

On the same tensors in the same run, for each M×N shape and dtype (weight, and layer_norm's bias, of the input's
dtype), each op's forward and forward + backward (one ``torch.autograd.grad`` of one forward's graph, for every
input) against its peers:
  - rms_norm: ``torchops.rms_norm`` against ``F.rms_norm``, ``torch.compile`` of it and Liger-Kernel's
    ``LigerRMSNormFunction`` (Llama casting, offset 0);
  - add_rms_norm: ``torchops.add_rms_norm`` against eager ``x + r`` then ``F.rms_norm`` (both returned), the same
    compiled, and Liger's ``LigerFusedAddRMSNormFunction``;
  - layer_norm: ``torch.ops.myns.layer_norm`` against ``F.layer_norm``, the same compiled, and Liger's
    ``LigerLayerNormFunction``.
``torch.compile`` compiles afresh per shape (static shapes; dynamo's recompile limit raised so no shape falls back
to eager); it and Liger run on the GPU only (CPU figures are ratios to eager). Liger is optional: without it the
run says so and the bars against it report no data. torchops' outputs and gradients are first checked against
float64 (the eager math on float64 copies of the same tensors), each peer's against eager's, so a wrong kernel
reports no number. Each case is timed beside a device copy of the same bytes in its dtype (its "% of copy");
bytes: each input read once and each output written once (the saved row statistics too, in fwd+bwd).

Bars: benchmarks/bars.py (checked by the harness; a missed bar, a peer that did not run or a wrong result
exits non-zero).

    python -m benchmarks.bench_norm [--device cuda|cpu] [--quick] [--dtypes bf16,f32]
                                    [--ops rms_norm,add_rms_norm,layer_norm] [--no-compile] [--shapes MxN,...]
                                    [--no-bars] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from benchmarks import harness as H
from benchmarks.harness import COMPILED, EAGER, IMPL, LIGER
from benchmarks.bars import NORM_GRID

RMS_EPS = 1e-6
LN_EPS = 1e-5  # F.layer_norm's default
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-10}


def _add_rms_norm(n: int, x, r, w):
    h = x + r
    return F.rms_norm(h, (n,), w, RMS_EPS), h


@dataclasses.dataclass(frozen=True)
class NormOp:
    """One op of the bench.

    args         the tensors it takes, by name: x (input), r (residual), w (weight), b (bias); all differentiated
    grads_out    the gradients handed to its outputs: dy (the output's), dres (add_rms_norm's residual_out's)
    eager        (n, *args) -> outputs, in the args' dtype (float64 for the references)
    ours         (the torchops module) -> (*args) -> outputs
    liger        (the op's Liger autograd Function) -> (*args) -> outputs
    fwd_bytes    (m, n, itemsize) -> bytes the forward moves
    train_bytes  (m, n, itemsize) -> bytes forward + backward move (the forward's saved row statistics too)
    """

    args: tuple[str, ...]
    grads_out: tuple[str, ...]
    eager: Callable[..., Any]
    ours: Callable[[Any], Callable[..., Any]]
    liger: Callable[[Any], Callable[..., Any]]
    fwd_bytes: Callable[[int, int, int], int]
    train_bytes: Callable[[int, int, int], int]


OPS: dict[str, NormOp] = {
    # fwd: x read, y written, w read; bwd: dy, x, rstd, w read, dx, dw written
    "rms_norm": NormOp(
        args=("x", "w"), grads_out=("dy",),
        eager=lambda n, x, w: F.rms_norm(x, (n,), w, RMS_EPS),
        ours=lambda t: lambda x, w: t.rms_norm(x, w, RMS_EPS),
        liger=lambda f: lambda x, w: f.apply(x, w, RMS_EPS, 0.0, "llama", False),
        fwd_bytes=lambda m, n, s: 2 * m * n * s + n * s,
        train_bytes=lambda m, n, s: (2 * m * n * s + n * s + 4 * m) + (3 * m * n * s + 4 * m + 2 * n * s)),
    # fwd: x, r read, y, residual_out written, w read; bwd: dy, dres, residual_out, rstd, w read, dx written
    # (handed to both inputs), dw written
    "add_rms_norm": NormOp(
        args=("x", "r", "w"), grads_out=("dy", "dres"),
        eager=_add_rms_norm,
        ours=lambda t: lambda x, r, w: t.add_rms_norm(x, r, w, RMS_EPS),
        liger=lambda f: lambda x, r, w: f.apply(x, r, w, RMS_EPS, 0.0, "llama", False),
        fwd_bytes=lambda m, n, s: 4 * m * n * s + n * s,
        train_bytes=lambda m, n, s: (4 * m * n * s + n * s + 4 * m) + (4 * m * n * s + 4 * m + 2 * n * s)),
    # fwd: x read, y written, w, b read; bwd: dy, x, mean, rstd, w read, dx, dw, db written. torchops through
    # the dispatcher op, so the bench does not depend on the Python wrapper.
    "layer_norm": NormOp(
        args=("x", "w", "b"), grads_out=("dy",),
        eager=lambda n, x, w, b: F.layer_norm(x, (n,), w, b, LN_EPS),
        ours=lambda t: lambda x, w, b: torch.ops.myns.layer_norm(x, w, b, LN_EPS),
        liger=lambda f: lambda x, w, b: f.apply(x, w, b, LN_EPS),
        fwd_bytes=lambda m, n, s: 2 * m * n * s + 2 * n * s,
        train_bytes=lambda m, n, s: (2 * m * n * s + 2 * n * s + 8 * m) + (3 * m * n * s + 8 * m + 3 * n * s)),
}
OP_NAMES = tuple(OPS)


def shapes(device: str, quick: bool, only: str = "") -> list[tuple[int, int]]:
    """The norm grid the bars are set at on the GPU; 1/8 of the rows on the CPU (2 cores).
    `only` ("256x1024,64x4096") replaces the list."""
    if only:
        return [tuple(int(v) for v in item.lower().split("x")) for item in only.split(",") if item.strip()]
    if quick:
        return [(4096, 1024), (1024, 8192)]
    return list(NORM_GRID) if device == "cuda" else [(m // 8, n) for m, n in NORM_GRID]


def _liger() -> tuple[dict[str, Any] | None, str]:
    """Liger's autograd Function of each op, or a reason why not."""
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception as e:  # noqa: BLE001 - any import failure means: no Liger in this run
        return None, f"{type(e).__name__}: {e}"
    return {"rms_norm": LigerRMSNormFunction, "add_rms_norm": LigerFusedAddRMSNormFunction,
            "layer_norm": LigerLayerNormFunction}, ""


def _eager(op: NormOp, n: int) -> Callable[..., Any]:
    """The op's eager math for rows of n (what torch.compile compiles, per shape)."""
    def eager(*args):
        return op.eager(n, *args)
    return eager


def _as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def _check_close(name: str, got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], tol: float) -> None:
    """Each result against its reference, compared in float64; a 1-D result (dweight, dbias: sums over M rows)
    relative to its largest value."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        w = w.detach().double()
        scale = w.abs().max().item() if w.dim() == 1 else 1.0
        rtol, atol = (4 * tol, 4 * tol * scale) if w.dim() == 1 else (tol, tol)
        torch.testing.assert_close(g.double(), w, rtol=rtol, atol=atol, msg=lambda s: f"{name} output {i}: {s}")


def _measure(name: str, op: NormOp, impls: dict[str, Callable], t: dict[str, torch.Tensor], m: int, n: int,
             dtype: torch.dtype, args: argparse.Namespace) -> Iterator[H.Result]:
    """One op at one shape and dtype: every implementation checked against float64, then timed."""
    inputs = tuple(t[a] for a in op.args)
    leaves = tuple(x.detach().requires_grad_() for x in inputs)
    grads = tuple(t[g] for g in op.grads_out)
    grad_out = grads[0] if len(grads) == 1 else grads  # autograd.grad's form for one output or several

    # A wrong kernel must not report a number: torchops' outputs and gradients against float64, each peer's
    # against eager's in the input dtype (the same math as the baseline's: torch's own CPU bf16 layer_norm
    # backward, for one, is ~7% of dweight's scale off float64).
    wide = tuple(x.to(torch.float64, copy=True).requires_grad_() for x in inputs)
    for impl, fn in impls.items():
        if impl == EAGER:
            continue
        ref_args, ref_grad_out = (wide, tuple(g.double() for g in grads)) if impl == IMPL else (leaves, grads)
        outs = _as_tuple(op.eager(n, *ref_args))
        want_grads = torch.autograd.grad(outs, ref_args, ref_grad_out)
        with torch.no_grad():
            _check_close(f"{name} {impl}", _as_tuple(fn(*inputs)), outs, TOL[dtype])
        _check_close(f"{name} {impl} grads", torch.autograd.grad(fn(*leaves), leaves, grad_out), want_grads,
                     TOL[dtype])
        del outs, want_grads
    del wide

    def forward(fn):
        def run():
            with torch.no_grad():
                return fn(*inputs)
        return run

    def train(fn):
        return lambda: torch.autograd.grad(fn(*leaves), leaves, grad_out)

    shape, s = f"{m}x{n}", dtype.itemsize
    for case, nbytes, timed in (("fwd", op.fwd_bytes(m, n, s), forward),
                                ("fwd+bwd", op.train_bytes(m, n, s), train)):
        times, copy_ms = H.time_beside_copy({impl: timed(fn) for impl, fn in impls.items()}, nbytes, dtype,
                                            args.device, quick=args.quick)
        # one progress line per (op, pass, shape): a run cut short still reports what it measured
        peers = ", ".join(f"{k} {times[k] / times[IMPL]:.3f}x" for k in times if k != IMPL)
        print(f"  {name} {case} {H.DTYPE_NAMES[dtype]} {shape}: ours {times[IMPL] * 1e3:.1f} us, "
              f"{H.pct_of_copy(copy_ms, times[IMPL]):.1f}% of a copy of the same bytes ({copy_ms * 1e3:.1f} us); "
              f"vs {peers}", file=sys.stderr, flush=True)
        for impl, ms in times.items():
            res = H.bandwidth_result(op=name, case=case, dtype=dtype, shape=shape, numel=m * n, impl=impl,
                                     device=args.device, ms=ms, nbytes=nbytes, copy_ms=copy_ms, baseline=EAGER,
                                     baseline_ms=times[EAGER])
            for peer in (COMPILED, LIGER):
                if peer in times:
                    res.extra[f"speedup_vs_{peer}"] = times[peer] / ms
            yield res


def bench(args: argparse.Namespace, liger: dict[str, Any] | None) -> Iterator[H.Result]:
    import torchops

    gpu = args.device == "cuda"
    ops = {name: OPS[name] for name in args.ops}
    needed = {a for op in ops.values() for a in (*op.args, *op.grads_out)}
    for dtype in args.dtypes:
        for m, n in shapes(args.device, args.quick, args.shapes):
            t = {a: H.rand((n,) if a in ("w", "b") else (m, n), dtype, args.device) for a in sorted(needed)}
            for name, op in ops.items():
                eager = _eager(op, n)
                impls: dict[str, Callable] = {EAGER: eager, IMPL: op.ours(torchops)}
                if gpu and not args.no_compile:
                    impls[COMPILED] = torch.compile(eager, dynamic=False)
                if liger is not None:
                    impls[LIGER] = op.liger(liger[name])
                rows = list(_measure(name, op, impls, t, m, n, dtype, args))
                del impls
                H.free_memory(args.device)
                yield from rows  # this op's rows at this shape, handed on once all are measured
            del t
            H.free_memory(args.device)
            if gpu:
                torch._dynamo.reset()  # compiled graphs of this shape hold memory and count toward the limit
            print(f"  {H.DTYPE_NAMES[dtype]} {m}x{n} done", file=sys.stderr, flush=True)


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
    liger = H.liger_peer(args.device, _liger)
    yield from bench(args, liger)


BENCH = H.Bench(
    op=OP_NAMES[0],
    more_ops=OP_NAMES[1:],
    name="norm",
    run=run,
    largest_operand=lambda args: (max(m * n for m, n in shapes(args.device, args.quick, args.shapes))
                                  * max(d.itemsize for d in args.dtypes)),
    default_dtypes=("bf16", "f32"),
    add_arguments=add_arguments,
    check_arguments=check_arguments,
    meta=lambda args: {"eps": {"rms_norm": RMS_EPS, "add_rms_norm": RMS_EPS, "layer_norm": LN_EPS},
                       "compile": not args.no_compile,
                       "liger": args.device == "cuda" and _liger()[0] is not None},
)


def main(argv: Sequence[str] | None = None) -> int:
    return H.main(BENCH, argv)


if __name__ == "__main__":
    sys.exit(main())
