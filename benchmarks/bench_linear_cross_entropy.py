"""Benchmark the LM-head losses: linear_cross_entropy (the logits never held whole) and cross_entropy (logits given),
against eager PyTorch, torch.compile and Liger-Kernel.

On the same tensors in the same run, per shape and dtype:
  - linear_cross_entropy, case "fwd+bwd": one forward and one ``torch.autograd.grad`` for input and weight of
    ``torchops.linear_cross_entropy(x, W, t)`` against eager ``F.cross_entropy(F.linear(x, W), t)``,
    ``torch.compile`` of that function (static shapes, compiled afresh per shape) and Liger-Kernel's
    ``LigerFusedLinearCrossEntropyFunction`` (through its ``LigerFusedLinearCrossEntropyLoss``). Shapes are
    "tokens x H x V": H = 4096, V = 128256 and 4096 ... 32768 tokens on the GPU; 512 x 1024 x 32000 on the CPU.
  - cross_entropy, case "fwd+bwd": ``torchops.cross_entropy(z, t)`` on given logits ("tokens x V": 8192 x 128256
    on the GPU, 512 x 32000 on the CPU) against ``F.cross_entropy``, its compiled twin and Liger's
    ``LigerCrossEntropyFunction`` (``LigerCrossEntropyLoss``).
  - case "peak memory fwd+bwd" (CUDA): the peak of ``torch.cuda.max_memory_allocated`` over one such step,
    after ``reset_peak_memory_stats``, beyond the resident tensors (inputs, target, and the gradients the step
    returns); the row's ``extra["peak_bytes"]``, its ``speedup`` the peer's peak over ours.
Targets are random classes with every 16th token ignore_index (padding). Every implementation's loss and
gradients are first checked against eager's math in float32 on the same values (float32 runs within 1e-4;
16-bit ones within three times eager's own 16-bit error or 1e-2), so a wrong kernel reports
no number. torch.compile and Liger run on the GPU
only (CPU figures are ratios to eager); Liger is optional: without it the run says so and the bars against it
report no data.

Bars: benchmarks/bars.py. The time bars (``BARS``) are checked by the harness; the memory bars
(``MEMORY_BARS``) by this bench, which prints their verdicts after the table. A missed bar, a peer that did not
run or a wrong result exits non-zero.

    python -m benchmarks.bench_linear_cross_entropy [--device cuda|cpu] [--quick] [--dtypes bf16]
        [--ops linear_cross_entropy,cross_entropy] [--tokens 4096,8192] [--chunk-size N] [--no-compile] [--no-bars]
"""

from __future__ import annotations

import argparse
import gc
import sys
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from benchmarks import harness as H
from benchmarks.harness import COMPILED, EAGER, IMPL, LIGER
from benchmarks.bars import LCE_CPU_SHAPE, LCE_GPU_HEAD, LCE_GPU_TOKENS, CE_GPU_SHAPE, memory_bars_for

TIME_CASE = "fwd+bwd"
MEMORY_CASE = "peak memory fwd+bwd"
IGNORE_EVERY = 16  # every 16th target is ignore_index


def lce_shapes(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(tokens, H, V) of linear_cross_entropy."""
    if args.quick:
        return [(1024, 512, 8192)] if args.device == "cuda" else [(128, 256, 4096)]
    if args.device == "cpu":
        return [LCE_CPU_SHAPE]
    h, v = LCE_GPU_HEAD
    return [(n, h, v) for n in (args.tokens or LCE_GPU_TOKENS)]


def ce_shapes(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(tokens, V) of cross_entropy."""
    if args.quick:
        return [(1024, 8192)] if args.device == "cuda" else [(128, 4096)]
    if args.device == "cpu":
        return [(LCE_CPU_SHAPE[0], LCE_CPU_SHAPE[2])]
    return [CE_GPU_SHAPE]


def _targets(n: int, v: int, device: str) -> torch.Tensor:
    t = torch.randint(0, v, (n,), device=device)
    t[::IGNORE_EVERY] = -100
    return t


def _liger() -> tuple[dict[str, Callable[..., Any]] | None, str]:
    """Liger's two losses as (x, W, t) -> loss and (z, t) -> loss, or a reason why not."""
    try:
        from liger_kernel.transformers.cross_entropy import LigerCrossEntropyLoss
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
    except Exception as e:  # noqa: BLE001 - any import failure means: no Liger in this run
        return None, f"{type(e).__name__}: {e}"
    flce, ce = LigerFusedLinearCrossEntropyLoss(), LigerCrossEntropyLoss()
    return {"linear_cross_entropy": lambda x, w, t: flce(w, x, t), "cross_entropy": lambda z, t: ce(z, t)}, ""


def _rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double(), want.detach().double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def _check_against_float32(op: str, impls: dict[str, Callable[..., torch.Tensor]], leaves: Sequence[torch.Tensor],
                           t: torch.Tensor, shape: str, dtype: torch.dtype) -> None:
    """Every implementation's loss and gradients against eager's math in float32 on the same values, as relative
    (Frobenius) errors: float32 runs within 1e-4; 16-bit ones within three times eager's own 16-bit error (eager
    rounds its log-softmax to 16 bits) or 1e-2, whichever is larger."""
    wide = [x.detach().float().requires_grad_() for x in leaves]
    out = impls[EAGER](*wide, t)
    want = [out.detach(), *torch.autograd.grad(out, wide)]
    del out, wide
    errors: dict[str, list[float]] = {}
    for name, fn in impls.items():
        out = fn(*leaves, t)
        errors[name] = [_rel_error(g, w) for g, w in zip([out, *torch.autograd.grad(out, leaves)], want)]
        del out
    del want
    for name, errs in errors.items():
        for i, err in enumerate(errs):
            bound = 1e-4 if dtype == torch.float32 else max(3 * errors[EAGER][i], 1e-2)
            assert err <= bound, (f"{op} {name} {shape}: output {i} (0: loss, then gradients) has a relative error "
                                  f"of {err:.3g} against float32 > {bound:.3g}")
    print(f"  {op} {shape} relative errors against float32 (loss, gradients): "
          + "; ".join(f"{n} " + ", ".join(f"{e:.2e}" for e in errs) for n, errs in errors.items()),
          file=sys.stderr, flush=True)


def _step(fn: Callable[..., torch.Tensor], leaves: Sequence[torch.Tensor], t: torch.Tensor) -> Callable[[], Any]:
    return lambda: torch.autograd.grad(fn(*leaves, t), leaves)


def peak_extra_bytes(fn: Callable[..., torch.Tensor], leaves: Sequence[torch.Tensor], t: torch.Tensor) -> int:
    """Peak CUDA memory of one forward + autograd.grad beyond what was allocated before it (the inputs and the
    target) and the gradients it returns."""
    peak, grads = H.peak_cuda_bytes(lambda: torch.autograd.grad(fn(*leaves, t), leaves))
    return peak - sum(g.nbytes for g in grads)


def _rows(op: str, impls: dict[str, Callable[..., torch.Tensor]], leaves: Sequence[torch.Tensor], t: torch.Tensor,
          shape: str, numel: int, nbytes: int | None, dtype: torch.dtype, args: argparse.Namespace) -> Iterator[H.Result]:
    """Checks every implementation against float32, times one fwd+bwd of each, then (CUDA) their peak memory."""
    _check_against_float32(op, impls, leaves, t, shape, dtype)
    H.free_memory(args.device)
    times = H.time_all_ms({name: _step(fn, leaves, t) for name, fn in impls.items()}, args.device, quick=args.quick)
    peers = ", ".join(f"{k} {times[k] / times[IMPL]:.3f}x" for k in times if k != IMPL)
    print(f"  {op} {TIME_CASE} {H.DTYPE_NAMES[dtype]} {shape}: ours {times[IMPL]:.3f} ms; vs {peers}",
          file=sys.stderr, flush=True)
    for name, ms in times.items():
        if nbytes is None:
            yield H.Result(op=op, case=TIME_CASE, dtype=H.DTYPE_NAMES[dtype], shape=shape, numel=numel, impl=name,
                           device=args.device, ms=ms, speedup=times[EAGER] / ms, baseline=EAGER)
        else:
            yield H.bandwidth_result(op=op, case=TIME_CASE, dtype=dtype, shape=shape, numel=numel, impl=name,
                                     device=args.device, ms=ms, nbytes=nbytes, baseline=EAGER,
                                     baseline_ms=times[EAGER])
    if args.device != "cuda":
        return
    peaks = {name: peak_extra_bytes(fn, leaves, t) for name, fn in impls.items()}
    print(f"  {op} {MEMORY_CASE} {H.DTYPE_NAMES[dtype]} {shape}: "
          + ", ".join(f"{k} {v / H.MiB:.0f} MiB" for k, v in peaks.items()), file=sys.stderr, flush=True)
    for name, peak in peaks.items():
        yield H.Result(op=op, case=MEMORY_CASE, dtype=H.DTYPE_NAMES[dtype], shape=shape, numel=numel, impl=name,
                       device=args.device, ms=0.0, speedup=peaks[EAGER] / max(peak, 1),
                       baseline=EAGER, extra={"peak_bytes": peak, "peak_mib": peak / H.MiB})


def _compiled(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)  # static shapes: Inductor's best case for each shape


def bench_linear_cross_entropy(args: argparse.Namespace, liger: dict | None) -> Iterator[H.Result]:
    import torchops

    def eager(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(F.linear(x, w), t)

    for dtype in args.dtypes:
        for n, h, v in lce_shapes(args):
            x = (torch.randn(n, h, device=args.device) * 0.5).to(dtype)
            w = (torch.randn(v, h, device=args.device) / h ** 0.5).to(dtype)
            t = _targets(n, v, args.device)
            ours = lambda x, w, t: torchops.linear_cross_entropy(x, w, t, chunk_size=args.chunk_size)  # noqa: E731
            impls: dict[str, Callable[..., torch.Tensor]] = {EAGER: eager, IMPL: ours}
            if args.device == "cuda" and args.compile:
                impls[COMPILED] = _compiled(eager)
            if args.device == "cuda" and liger is not None:
                impls[LIGER] = liger["linear_cross_entropy"]
            leaves = (x.requires_grad_(), w.requires_grad_())
            yield from _rows("linear_cross_entropy", impls, leaves, t, f"{n}x{h}x{v}", n * v, None, dtype, args)
            del x, w, t, leaves, impls
            H.free_memory(args.device)


def bench_cross_entropy(args: argparse.Namespace, liger: dict | None) -> Iterator[H.Result]:
    import torchops

    def eager(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(z, t)

    for dtype in args.dtypes:
        for n, v in ce_shapes(args):
            z = (torch.randn(n, v, device=args.device) * 2).to(dtype).requires_grad_()
            t = _targets(n, v, args.device)
            impls: dict[str, Callable[..., torch.Tensor]] = {
                EAGER: eager, IMPL: lambda z, t: torchops.cross_entropy(z, t)}
            if args.device == "cuda" and args.compile:
                impls[COMPILED] = _compiled(eager)
            if args.device == "cuda" and liger is not None:
                impls[LIGER] = liger["cross_entropy"]
            # The least a fwd+bwd moves: the logits read by the forward, read again and their gradient written by
            # the backward.
            nbytes = 3 * n * v * dtype.itemsize
            yield from _rows("cross_entropy", impls, (z,), t, f"{n}x{v}", n * v, nbytes, dtype, args)
            del z, t, impls
            H.free_memory(args.device)


def run(args: argparse.Namespace, ctx: H.Context) -> Iterator[H.Result]:
    H.raise_recompile_limit()
    liger = H.liger_peer(args.device, _liger)
    results: list[H.Result] = []
    try:
        if "linear_cross_entropy" in args.ops:
            for r in bench_linear_cross_entropy(args, liger):
                results.append(r)
                yield r
        if "cross_entropy" in args.ops:
            for r in bench_cross_entropy(args, liger):
                results.append(r)
                yield r
    finally:
        gc.collect()
        if not args.quick and not args.no_bars:  # the verdicts are printed by summarize, after the table
            for op in args.ops:
                for line, ok in judge_memory_bars(results, op, args.device):
                    if not ok:
                        ctx.fail(line.strip())


def judge_memory_bars(results: Sequence[H.Result], op: str, device: str) -> list[tuple[str, bool]]:
    """Each memory bar of `op` on `device` (benchmarks/bars.py MEMORY_BARS): (verdict line, met)."""
    out = []
    for bar in memory_bars_for(op, device):
        for dtype in bar.dtypes:
            rows = {(r.shape, r.impl): r for r in results
                    if r.op == op and r.case == bar.case and r.dtype == dtype}
            missing = [s for s in bar.shapes if (s, "torchops") not in rows or (s, bar.peer) not in rows]
            if missing:
                out.append((f"  [NO DATA] {bar.label} ({dtype}): not measured: {', '.join(missing)}", False))
                continue
            ratios = {s: rows[(s, bar.peer)].extra["peak_bytes"] / max(rows[(s, "torchops")].extra["peak_bytes"], 1)
                      for s in bar.shapes}
            worst = min(ratios, key=ratios.get)
            ok = ratios[worst] >= bar.at_least
            out.append((f"  [{'ok' if ok else 'MISSED'}] {bar.label} ({dtype}): worst {ratios[worst]:.2f}x at {worst} "
                        f"({rows[(worst, 'torchops')].extra['peak_mib']:.0f} MiB vs {bar.peer}'s "
                        f"{rows[(worst, bar.peer)].extra['peak_mib']:.0f} MiB)", ok))
    return out


def summarize(results: Sequence[H.Result], args: argparse.Namespace, ctx: H.Context) -> str:
    lines = []
    for r in results:
        if r.case == MEMORY_CASE:
            lines.append(f"{r.op} {r.dtype} {r.shape} {r.impl}: peak {r.extra['peak_mib']:.0f} MiB beyond the "
                         "resident tensors")
    verdicts = [] if args.quick or args.no_bars else \
        [line for op in args.ops for line, _ in judge_memory_bars(results, op, args.device)]
    if verdicts:
        lines += ["Memory bars (benchmarks/bars.py MEMORY_BARS, judged by this bench):", *verdicts]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-compile", dest="compile", action="store_false", help="leave torch.compile out")
    p.add_argument("--tokens", default="", help="linear_cross_entropy's token counts on the GPU, e.g. 4096,8192 "
                                                "(the bars need the default set)")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="tokens per chunk of linear_cross_entropy (default: its own choice): memory against time")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    try:
        args.tokens = [int(n) for n in args.tokens.split(",") if n.strip()]
    except ValueError:
        parser.error("--tokens: comma-separated integers")


# The bars' dtypes: an LLM's head in bf16 on the GPU, f32 on the CPU; time and memory only (no copy).
BENCH = H.Bench(op="linear_cross_entropy", more_ops=("cross_entropy",), run=run, add_arguments=add_arguments,
                check_arguments=check_arguments, summarize=summarize, default_dtypes=("bf16",), cpu_dtypes=("f32",),
                copy_reference=False)


if __name__ == "__main__":
    sys.exit(H.main(BENCH))
