"""Benchmark the rotary ops (rotary_embedding, rotary_embedding_, qk_norm_rope) against their peers.

On the same tensors in the same run (bf16 by default; cos and sin real angles, so in-place peers keep their values
bounded however often they rotate the same tensor):
  - rotary_embedding (``torchops.apply_rotary_pos_emb``): q and k in transformers' layout (a projection viewed
    [b, s, h, d] and transposed), 32 q heads, 8 kv heads, head_dim 128, cos and sin of batch b, against the eager
    transformers formula (``q * cos + rotate_half(q) * sin``), ``torch.compile`` of it and Liger-Kernel 0.8.5's
    ``LigerRopeFunction`` (which rotates its input in place). Cases "fwd" and "fwd+bwd" (one ``autograd.grad`` of one
    forward's graph for q and k) at the training shape (batch 4, seq 4096) and at batch 8 (q alone 256 MiB, where a
    % of copy is judged), "decode fwd" at batch 1, 8 and 64 with seq 1.
  - rotary_embedding_ (vLLM's in-place call): 16384 and 32768 tokens, query [tokens, 32 * 128], key [tokens, 8 * 128],
    is_neox, a bf16 cache, against an eager in-place formula; "fwd" (% of copy: query and key read and written).
  - qk_norm_rope: Qwen3-style weights of head_dim, "fwd" and "fwd+bwd" (q, k and both weights) at the training shape,
    against eager ``F.rms_norm`` then the transformers formula, ``torch.compile`` of that composition, and torchops'
    own ``rms_norm`` then ``apply_rotary_pos_emb`` ("torchops rms_norm+rotary").
On the CPU: batch 1, seq 2048 (2048 tokens for rotary_embedding_), the same heads; ratios to eager.
torchops' outputs and gradients are first checked against float64 (the eager math on float64 copies), each peer's
against eager's in the input dtype, so a wrong kernel reports no number. Bytes: each input read once and each output
written once (the backward's reads of the saved inputs and incoming gradients too).

Bars: benchmarks/bars.py (checked by the harness; a missed bar, a peer that did not run or a wrong result exits
non-zero). Liger is optional: without it the run says so and the bars against it report no data.

    python -m benchmarks.bench_rotary_embedding [--device cuda|cpu] [--quick] [--dtypes bf16]
                                                [--ops rotary_embedding,rotary_embedding_,qk_norm_rope] [--no-compile]
                                                [--no-bars] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

if __package__ in (None, ""):  # run as a file: make `benchmarks` (and an in-place-built `torchops`) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from benchmarks import harness as H

BASELINE = "eager"
COMPILED = "torch.compile"
LIGER = "liger"
IMPL = "torchops"
COMPOSED = "torchops rms_norm+rotary"
HEADS_Q, HEADS_K, HEAD_DIM = 32, 8, 128
EPS = 1e-6
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-10}
OP_NAMES = ("rotary_embedding", "rotary_embedding_", "qk_norm_rope")


# ------------------------------------------------------------------------------------------- the math
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_rotary(q, k, cos, sin):
    """transformers' apply_rotary_pos_emb (unsqueeze_dim 1)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def hf_qk_norm_rope(q, k, qw, kw, cos, sin):
    n = q.shape[-1]
    return hf_rotary(F.rms_norm(q, (n,), qw, EPS), F.rms_norm(k, (n,), kw, EPS), cos, sin)


def vllm_inplace(positions, query, key, cache):
    """vLLM's rotary_embedding in eager PyTorch, is_neox, whole heads rotated, in place."""
    half = cache.shape[1] // 2
    rows = cache[positions]
    cos, sin = rows[:, None, :half], rows[:, None, half:]
    for x in (query, key):
        heads = x.view(x.shape[0], -1, HEAD_DIM)
        a, b = heads[..., :half], heads[..., half:]
        heads.copy_(torch.cat((a * cos - b * sin, b * cos + a * sin), -1))


def angles(b: int, s: int, d: int, dtype: torch.dtype, device: str, offset: int = 0) -> tuple[torch.Tensor, ...]:
    """transformers' cos and sin rows: frequencies 10000^(-2i/d) at positions offset + 0..s-1 (+ 11 per entry)."""
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)
    pos = torch.arange(s, dtype=torch.float64, device=device)[None] + offset + 11 * torch.arange(
        b, dtype=torch.float64, device=device)[:, None]
    emb = (pos[..., None] * inv).repeat(1, 1, 2)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def heads(b: int, s: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k as attention makes them: one projection's output viewed [b, s, h, d], transposed to [b, h, s, d]."""
    x = H.rand((b, s, (HEADS_Q + HEADS_K) * HEAD_DIM), dtype, device)
    q = x[..., : HEADS_Q * HEAD_DIM].view(b, s, HEADS_Q, HEAD_DIM).transpose(1, 2)
    k = x[..., HEADS_Q * HEAD_DIM:].view(b, s, HEADS_K, HEAD_DIM).transpose(1, 2)
    return q, k


# --------------------------------------------------------------------------------------------- cases
@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    case: str       # "fwd", "fwd+bwd", "decode fwd"
    batch: int
    seq: int        # tokens for rotary_embedding_

    @property
    def shape(self) -> str:
        if self.op == "rotary_embedding_":
            return f"{self.seq}x{HEADS_Q * HEAD_DIM}"  # query [tokens, heads * head_size]
        return f"{self.batch}x{HEADS_Q}x{self.seq}x{HEAD_DIM}"  # q [b, h, s, d]


def cases(device: str, quick: bool, ops: Sequence[str]) -> list[Case]:
    if device == "cpu" or quick:
        b, s = (1, 2048) if not quick else (1, 64)
        out = [Case("rotary_embedding", c, b, s) for c in ("fwd", "fwd+bwd")]
        out += [Case("qk_norm_rope", c, b, s) for c in ("fwd", "fwd+bwd")]
        out += [Case("rotary_embedding_", "fwd", 1, s)]
        if quick:
            out += [Case("rotary_embedding", "decode fwd", 2, 1)]
    else:
        out = [Case("rotary_embedding", c, b, 4096) for b in (4, 8) for c in ("fwd", "fwd+bwd")]
        out += [Case("rotary_embedding", "decode fwd", b, 1) for b in (1, 8, 64)]
        out += [Case("rotary_embedding_", "fwd", 1, t) for t in (16384, 32768)]
        out += [Case("qk_norm_rope", c, 4, 4096) for c in ("fwd", "fwd+bwd")]
    return [c for c in out if c.op in ops]


def _liger() -> tuple[Any, str]:
    """LigerRopeFunction, or why not."""
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except Exception as e:  # noqa: BLE001 - any import failure means: no Liger in this run
        return None, f"{type(e).__name__}: {e}"
    return LigerRopeFunction, ""


def _check_close(name: str, got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], tol: float,
                 scaled: bool = False) -> None:
    """Each result against its reference in float64; a 1-D one (a weight's gradient, a sum over rows), or any one
    when `scaled`, with an absolute tolerance relative to its largest value."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        w = w.detach().double()
        scale = max(1.0, w.abs().max().item()) if w.dim() == 1 or scaled else 1.0
        rtol, atol = (4 * tol, 4 * tol * scale) if w.dim() == 1 else (tol, tol * scale)
        torch.testing.assert_close(g.detach().double(), w, rtol=rtol, atol=atol, msg=lambda m: f"{name} output {i}: {m}")


def _nbytes(case: Case, dtype: torch.dtype) -> int:
    s = dtype.itemsize
    rows = case.batch * case.seq
    qk = rows * (HEADS_Q + HEADS_K) * HEAD_DIM * s  # q and k together
    cs = 2 * case.batch * case.seq * HEAD_DIM * s   # cos and sin of batch b
    if case.op == "rotary_embedding_":              # query and key read and written, positions, one cache row a token
        return 2 * qk + 8 * case.seq + case.seq * HEAD_DIM * s
    weights = 2 * HEAD_DIM * s if case.op == "qk_norm_rope" else 0
    fwd = 2 * qk + cs + weights                     # q, k, cos, sin (weights) read; outputs written
    if case.case != "fwd+bwd":
        return fwd
    # backward: incoming gradients, cos, sin read (and q, k, weights for qk_norm_rope); gradients written
    bwd = 2 * qk + cs + (qk + 2 * weights if case.op == "qk_norm_rope" else 0)
    return fwd + bwd


def _impls(case: Case, torchops: Any, liger: Any, gpu: bool, compile_peers: bool) -> dict[str, Callable[..., Any]]:
    if case.op == "rotary_embedding":
        impls: dict[str, Callable[..., Any]] = {BASELINE: hf_rotary, IMPL: torchops.apply_rotary_pos_emb}
        if gpu and compile_peers:
            impls[COMPILED] = torch.compile(hf_rotary, dynamic=False)
        if liger is not None:
            impls[LIGER] = lambda q, k, cos, sin: liger.apply(q, k, cos, sin)
        return impls
    if case.op == "qk_norm_rope":
        impls = {BASELINE: hf_qk_norm_rope, IMPL: torchops.qk_norm_rope,
                 COMPOSED: lambda q, k, qw, kw, cos, sin: torchops.apply_rotary_pos_emb(
                     torchops.rms_norm(q, qw, EPS), torchops.rms_norm(k, kw, EPS), cos, sin)}
        if gpu and compile_peers:
            impls[COMPILED] = torch.compile(hf_qk_norm_rope, dynamic=False)
        return impls
    return {BASELINE: lambda p, q, k, c: vllm_inplace(p, q, k, c),
            IMPL: lambda p, q, k, c: torchops.rotary_embedding_(p, q, k, HEAD_DIM, c)}


def _measure(case: Case, dtype: torch.dtype, args: argparse.Namespace, liger: Any) -> Iterator[H.Result]:
    import torchops

    device, gpu = args.device, args.device == "cuda"
    impls = _impls(case, torchops, liger, gpu, not args.no_compile)
    tol = TOL[dtype]
    if case.op == "rotary_embedding_":
        positions = torch.randint(0, 2 * case.seq, (case.seq,), device=device)
        cos, sin = angles(1, 2 * case.seq, HEAD_DIM, dtype, device)
        cache = torch.cat((cos[0, :, : HEAD_DIM // 2], sin[0, :, : HEAD_DIM // 2]), -1).contiguous()
        query = H.rand((case.seq, HEADS_Q * HEAD_DIM), dtype, device)
        key = H.rand((case.seq, HEADS_K * HEAD_DIM), dtype, device)
        # Checked on copies (in place): torchops against float64, eager against its own float64 run.
        want = [t.double() for t in (query, key)]
        vllm_inplace(positions, *want, cache.double())
        q1, k1 = query.clone(), key.clone()
        impls[IMPL](positions, q1, k1, cache)
        _check_close(f"{case.op} {IMPL}", (q1, k1), want, tol)
        del q1, k1, want
        timed = {impl: (lambda fn=fn: fn(positions, query, key, cache)) for impl, fn in impls.items()}
    else:
        q, k = heads(case.batch, case.seq, dtype, device)
        cos, sin = angles(case.batch, case.seq, HEAD_DIM, dtype, device)
        inputs: tuple[torch.Tensor, ...] = (q, k)
        if case.op == "qk_norm_rope":
            inputs += (H.rand((HEAD_DIM,), dtype, device), H.rand((HEAD_DIM,), dtype, device))
        constants = (cos, sin)
        train = case.case == "fwd+bwd"

        def call(fn, xs):
            return fn(*xs, *constants)

        # Every implementation checked first: torchops against float64, peers against eager (same dtype). Liger
        # writes into its inputs: it gets copies.
        wide = tuple(x.detach().double().requires_grad_() for x in inputs)
        wide_out = hf_rotary(*wide, *(c.double() for c in constants)) if case.op == "rotary_embedding" else \
            hf_qk_norm_rope(*wide, *(c.double() for c in constants))
        eager_leaves = tuple(x.detach().clone().requires_grad_() for x in inputs)
        eager_out = call(impls[BASELINE], eager_leaves)
        grads_out = tuple(H.rand(o.shape, dtype, device) for o in eager_out)
        for impl, fn in impls.items():
            if impl == BASELINE:
                continue
            # A peer against eager, both rounding in the input dtype, each in its own places: twice the tolerance,
            # absolute relative to the largest output (eager rounds each product of q * cos + rotate_half(q) * sin:
            # where they cancel, its error is a rounding of the terms, not of the small result).
            ref_out, ref_leaves, ref_g, peer_tol = (wide_out, wide, tuple(g.double() for g in grads_out), tol) \
                if impl == IMPL else (eager_out, eager_leaves, grads_out, 2 * tol)
            leaves = tuple(x.detach().clone().requires_grad_() for x in inputs)
            out = call(fn, leaves)
            _check_close(f"{case.op} {impl}", out, ref_out, peer_tol, scaled=impl != IMPL)
            if train:
                got = torch.autograd.grad(out, leaves, grads_out)
                want_g = torch.autograd.grad(ref_out, ref_leaves, ref_g, retain_graph=True)
                _check_close(f"{case.op} {impl} grads", got, want_g, peer_tol, scaled=impl != IMPL)
        del wide, wide_out, eager_leaves, eager_out

        leaves = tuple(x.detach().requires_grad_() for x in inputs)
        if train:
            timed = {impl: (lambda fn=fn: torch.autograd.grad(call(fn, leaves), leaves, grads_out))
                     for impl, fn in impls.items()}
        else:
            def forward(fn):
                def run():
                    with torch.no_grad():
                        return call(fn, inputs)
                return run
            timed = {impl: forward(fn) for impl, fn in impls.items()}

    nbytes = _nbytes(case, dtype)
    times, copy_ms = H.time_beside_copy(timed, nbytes, dtype, device, quick=args.quick)
    peers = ", ".join(f"{k} {times[k] / times[IMPL]:.3f}x" for k in times if k != IMPL)
    print(f"  {case.op} {case.case} {H.DTYPE_NAMES[dtype]} {case.shape}: ours {times[IMPL] * 1e3:.1f} us, "
          f"{H.pct_of_copy(copy_ms, times[IMPL]):.1f}% of a copy of the same bytes; vs {peers}", file=sys.stderr,
          flush=True)
    numel = case.batch * case.seq * HEADS_Q * HEAD_DIM
    for impl, ms in times.items():
        res = H.bandwidth_result(op=case.op, case=case.case, dtype=dtype, shape=case.shape, numel=numel, impl=impl,
                                 device=device, ms=ms, nbytes=nbytes, copy_ms=copy_ms, baseline=BASELINE,
                                 baseline_ms=times[BASELINE])
        for peer in (COMPILED, LIGER, COMPOSED):
            if peer in times:
                res.extra[f"speedup_vs_{peer}"] = times[peer] / ms
        yield res


def run(args: argparse.Namespace, ctx: H.Context) -> Iterator[H.Result]:
    H.raise_recompile_limit()  # a fresh compile per shape, each specialised
    liger = H.liger_peer(args.device, _liger)
    for dtype in args.dtypes:
        for case in cases(args.device, args.quick, args.ops):
            rows = list(_measure(case, dtype, args, liger))
            H.free_memory(args.device)
            if args.device == "cuda":
                torch._dynamo.reset()  # compiled graphs of this shape hold memory and count toward the limit
            yield from rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers (their bars: no data)")


BENCH = H.Bench(
    op=OP_NAMES[0],
    more_ops=OP_NAMES[1:],
    name="rotary_embedding",
    run=run,
    largest_operand=lambda args: max(_nbytes(c, d) for c in cases(args.device, args.quick, args.ops)
                                     for d in args.dtypes) // 2,
    default_dtypes=("bf16",),
    add_arguments=add_arguments,
    meta=lambda args: {"heads": (HEADS_Q, HEADS_K), "head_dim": HEAD_DIM, "eps": EPS, "compile": not args.no_compile,
                       "liger": args.device == "cuda" and _liger()[0] is not None},
)


def main(argv: Sequence[str] | None = None) -> int:
    return H.main(BENCH, argv)


if __name__ == "__main__":
    sys.exit(main())
