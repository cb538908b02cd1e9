"""op_db rows of the rotary ops: rotary_embedding (transformers' apply_rotary_pos_emb) and its backward,
rotary_embedding_ (vLLM's in-place call), qk_norm_rope and its backward.

The references are written here from their definitions, in float64: transformers' rotate_half formula (GPT-J's
rotate_every_two for interleaved pairs), vLLM's cache rows (the cos of each pair, then its sin), and rms_norm then
the rotation for qk_norm_rope; the backward ops' references are the float64 vector-Jacobian products of those.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from helpers import FLOAT_DTYPES, HALF_DTYPES, INT_DTYPES, random_tensor
from op_db.core import ErrorInput, OpInfo, Sample, _grad, expect
from op_db.elementwise import _CUDA_VS_CPU
from op_db.norm import rms_norm_reference


# --------------------------------------------------------------------------------------------- references
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' rotate_half: (-x2, x1) of x's halves."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """GPT-J's interleaved form: (-x_{2i+1}, x_{2i}) at (2i, 2i + 1)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def rotary_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1,
                     interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' apply_rotary_pos_emb, with partial rotary (the features past cos.shape[-1] pass through)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rot = cos.shape[-1]
    turn = rotate_every_two if interleaved else rotate_half

    def one(x: torch.Tensor) -> torch.Tensor:
        x_rot, x_pass = x[..., :rot], x[..., rot:]
        return torch.cat(((x_rot * cos) + (turn(x_rot) * sin), x_pass), dim=-1)

    return one(q), one(k)


def rotary_backward_reference(grad_q, grad_k, cos, sin, unsqueeze_dim=1, interleaved=False):
    """The vector-Jacobian product of rotary_reference (linear: taken at any q, k)."""
    q = torch.zeros_like(grad_q, requires_grad=True)
    k = torch.zeros_like(grad_k, requires_grad=True)
    outs = rotary_reference(q, k, cos, sin, unsqueeze_dim, interleaved)
    return torch.autograd.grad(outs, (q, k), (grad_q, grad_k))


def vllm_rotary_reference(positions: torch.Tensor, x: torch.Tensor, head_size: int, cos_sin_cache: torch.Tensor,
                          is_neox: bool = True) -> torch.Tensor:
    """vLLM's rotary_embedding of one of query / key, from its description: token t rotated by cache row positions[t]
    (rot / 2 cos, then rot / 2 sin, one per pair), pairs (i, i + rot / 2) (neox) or (2i, 2i + 1), first rot features."""
    rot = cos_sin_cache.shape[1]
    half = rot // 2
    rows = cos_sin_cache[positions.long()]
    cos, sin = rows[:, None, :half], rows[:, None, half:]
    heads = x.reshape(x.shape[0], math.prod(x.shape[1:]) // head_size, head_size).clone()
    part = heads[..., :rot]
    a, b = (part[..., :half], part[..., half:]) if is_neox else (part[..., 0::2], part[..., 1::2])
    ya, yb = a * cos - b * sin, b * cos + a * sin
    heads[..., :rot] = torch.cat((ya, yb), -1) if is_neox else torch.stack((ya, yb), -1).flatten(-2)
    return heads.reshape(x.shape)


def rotary_inplace_reference(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    """What rotary_embedding_ writes into query (op_db compares the argument an in-place op writes; key is
    checked in tests/test_rotary_embedding.py)."""
    return vllm_rotary_reference(positions, query, head_size, cos_sin_cache, is_neox)


def qk_norm_rope_reference(q, k, q_weight, k_weight, cos, sin, eps=1e-6, weight_offset=0.0, unsqueeze_dim=1,
                           interleaved=False):
    return rotary_reference(rms_norm_reference(q, q_weight, eps, weight_offset),
                            rms_norm_reference(k, k_weight, eps, weight_offset), cos, sin, unsqueeze_dim, interleaved)


def qk_norm_rope_backward_reference(grad_q_out, grad_k_out, q, k, q_weight, k_weight, cos, sin, eps, weight_offset,
                                    unsqueeze_dim, interleaved, input_grad, weight_grad):
    leaves = [t.detach().requires_grad_() for t in (q, k, q_weight, k_weight)]
    outs = qk_norm_rope_reference(*leaves, cos, sin, eps, weight_offset, unsqueeze_dim, interleaved)
    total = sum((o * g).sum() for o, g in zip(outs, (grad_q_out, grad_k_out)) if g is not None)
    grads = torch.autograd.grad(total, leaves, allow_unused=True)
    given = (grad_q_out is not None, grad_k_out is not None)
    wanted = (given[0] and input_grad, given[1] and input_grad, given[0] and weight_grad, given[1] and weight_grad)
    return tuple(g if w else leaf.new_empty(0) for g, w, leaf in zip(grads, wanted, leaves))


# ---------------------------------------------------------------------------------------------- samples
# (batch, heads_q, heads_k, seq, head_dim, rot, unsqueeze_dim, interleaved, cos batch ("1" or "b"), q/k layout,
# cos layout). Layouts of q and k: "hf" (transformers' x.view(b, s, h, d).transpose(1, 2) for unsqueeze_dim 1, the
# same transposition of [b, h, s, d] for 2: read in place), "contiguous", "sliced" (every other element of the last
# dimension: copied), "offset" (one element into its storage: misses 16-byte vectors). cos: "contiguous", "sliced",
# "seq1" (one position broadcast over seq), "angles" (real cos and sin of transformers' frequencies, halves equal).
# head_dim covers the AVX2 blocks of 8 pairs and their tails, partial rotary (64 of 128, 32 of 80, 4 of 10),
# rot 0, GQA, decode (seq 1), no tokens and no batch.
_CASES: list[tuple] = [
    (2, 4, 2, 5, 16, 16, 1, False, "1", "hf", "contiguous"),
    (2, 3, 3, 3, 8, 8, 2, False, "b", "contiguous", "contiguous"),
    (1, 2, 1, 3, 128, 64, 1, False, "1", "hf", "angles"),
    (2, 2, 1, 2, 80, 32, 2, False, "b", "hf", "angles"),
    (2, 2, 2, 4, 32, 32, 1, True, "b", "hf", "angles"),
    (1, 3, 1, 3, 24, 16, 2, True, "1", "contiguous", "sliced"),
    (2, 2, 1, 3, 6, 6, 1, False, "b", "offset", "contiguous"),
    (2, 1, 2, 3, 10, 4, 1, True, "1", "sliced", "seq1"),
    (1, 4, 2, 7, 128, 128, 1, False, "1", "hf", "angles"),
    (3, 2, 1, 1, 16, 16, 1, False, "b", "hf", "contiguous"),
    (2, 2, 2, 3, 8, 0, 2, False, "1", "contiguous", "contiguous"),
    (2, 2, 1, 0, 8, 8, 1, False, "1", "hf", "contiguous"),
    (0, 2, 1, 3, 8, 8, 2, False, "1", "contiguous", "contiguous"),
]


def _heads_tensor(b: int, h: int, s: int, d: int, u: int, layout: str, dtype: torch.dtype, device: str) -> torch.Tensor:
    shape = (b, h, s, d) if u == 1 else (b, s, h, d)
    if layout == "hf":
        return random_tensor((shape[0], shape[2], shape[1], d), dtype, device).transpose(1, 2)
    if layout == "sliced":
        return random_tensor(shape[:-1] + (2 * d,), dtype, device)[..., ::2]
    if layout == "offset":
        return random_tensor((math.prod(shape) + 1,), dtype, device)[1:].view(shape)
    return random_tensor(shape, dtype, device)


def _angles(b: int, s: int, rot: int, interleaved: bool, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, ...]:
    """transformers' cos and sin: frequencies base^(-2i/rot) at positions 0..s-1 (+ 7 per batch entry)."""
    inv = 10000.0 ** (-torch.arange(0, rot, 2, dtype=torch.float64) / max(rot, 1))
    pos = torch.arange(s, dtype=torch.float64)[None, :] + 7 * torch.arange(b, dtype=torch.float64)[:, None]
    freqs = pos[..., None] * inv
    emb = freqs.repeat_interleave(2, -1) if interleaved else torch.cat((freqs, freqs), -1)
    return emb.cos().to(dtype=dtype, device=device), emb.sin().to(dtype=dtype, device=device)


def _cos_sin(b: int, s: int, rot: int, interleaved: bool, layout: str, dtype: torch.dtype,
             device: str) -> tuple[torch.Tensor, torch.Tensor]:
    if layout == "angles":
        return _angles(b, s, rot, interleaved, dtype, device)
    if layout == "sliced":
        return tuple(random_tensor((b, s, 2 * rot), dtype, device)[..., ::2] for _ in range(2))
    s = 1 if layout == "seq1" else s
    return random_tensor((b, s, rot), dtype, device), random_tensor((b, s, rot), dtype, device)


def _rotary_case(case: tuple, device: str, dtype: torch.dtype, requires_grad: bool) -> Sample:
    """One row of _CASES as rotary_embedding's sample (q, k, cos, sin, unsqueeze_dim, interleaved)."""
    b, hq, hk, s, d, rot, u, inter, cb, layout, cos_layout = case
    q = _grad(_heads_tensor(b, hq, s, d, u, layout, dtype, device), requires_grad)
    k = _grad(_heads_tensor(b, hk, s, d, u, layout, dtype, device), requires_grad)
    cos, sin = _cos_sin(b if cb == "b" else 1, s, rot, inter, cos_layout, dtype, device)
    return Sample((q, k, cos, sin, u, inter), desc=f"b={b} heads={hq}/{hk} seq={s} head_dim={d} rot={rot} "
                  f"unsqueeze_dim={u} interleaved={inter} cos batch {cb}, {layout} q/k, {cos_layout} cos")


def rotary_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = [_rotary_case(case, device, dtype, requires_grad) for case in _CASES]
    q = _grad(_heads_tensor(2, 2, 3, 8, 1, "hf", dtype, device), requires_grad)
    k = _grad(_heads_tensor(2, 2, 3, 8, 1, "hf", dtype, device), requires_grad)
    cos, sin = _cos_sin(1, 3, 8, False, "contiguous", dtype, device)
    return samples + [Sample((q, k, cos, sin), desc="unsqueeze_dim and interleaved defaulted")]


def rotary_backward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    # The incoming gradients in the layout the forward's inputs had (a loss over a transposed view hands back
    # non-dense ones too).
    return rotary_samples(device, dtype, requires_grad)


def rotary_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    q = random_tensor((n, 4, 3, 8), dtype, device).transpose(1, 2)
    k = random_tensor((n, 4, 2, 8), dtype, device).transpose(1, 2)
    return (q, k, random_tensor((n, 4, 6), dtype, device), random_tensor((n, 4, 6), dtype, device), 1, False)


# rotary_embedding_: (tokens, heads_q, heads_k (0: key None), head_size, rot, is_neox, query/key layout, cache
# dtype "same" or "f32" (float32 with 16-bit query), positions dtype). Layouts: "2d" [tokens, heads * head_size],
# "3d" [tokens, heads, head_size], "qkv" (query and key slices of one fused [tokens, (hq + 2 hk) * head_size]
# projection: a token stride past their width), "heads_strided" (3-D, a head stride of 2 head_size).
_CACHE_CASES: list[tuple] = [
    (5, 4, 2, 16, 16, True, "2d", "same", torch.int64),
    (5, 4, 2, 16, 16, False, "3d", "same", torch.int64),
    (3, 2, 1, 128, 64, True, "qkv", "f32", torch.int64),
    (4, 3, 0, 80, 32, False, "2d", "f32", torch.int32),
    (4, 2, 2, 12, 8, True, "heads_strided", "same", torch.int64),
    (6, 2, 1, 6, 6, True, "qkv", "same", torch.int64),
    (0, 2, 1, 16, 16, True, "2d", "same", torch.int64),
]
_MAX_POSITION = 37


def _cache_rows(tokens: int, heads: int, head_size: int, layout: str, dtype: torch.dtype, device: str) -> torch.Tensor:
    if layout == "3d":
        return random_tensor((tokens, heads, head_size), dtype, device)
    if layout == "heads_strided":
        return random_tensor((tokens, heads, 2 * head_size), dtype, device)[..., :head_size]
    return random_tensor((tokens, heads * head_size), dtype, device)


def rotary_inplace_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for tokens, hq, hk, hs, rot, neox, layout, cache_kind, pos_dtype in _CACHE_CASES:
        if layout == "qkv":
            qkv = random_tensor((tokens, (hq + 2 * hk) * hs), dtype, device)
            query, key = qkv[:, : hq * hs], qkv[:, hq * hs: (hq + hk) * hs]
        else:
            query = _cache_rows(tokens, hq, hs, layout, dtype, device)
            key = _cache_rows(tokens, hk, hs, layout, dtype, device) if hk else None
        cache_dtype = torch.float32 if cache_kind == "f32" and dtype in HALF_DTYPES else dtype
        cache = random_tensor((_MAX_POSITION, rot), cache_dtype, device)
        positions = torch.randint(0, _MAX_POSITION, (tokens,), dtype=pos_dtype, device=device)
        samples.append(Sample((positions, query, key, hs, cache, neox),
                              desc=f"{tokens} tokens, heads {hq}/{hk}, head_size {hs}, rot {rot}, is_neox={neox}, "
                                   f"{layout}, cache {cache_kind}, positions {pos_dtype}"))
    query = random_tensor((3, 32), dtype, device)
    samples.append(Sample((torch.tensor([0, 5, 2], device=device), query, None, 16,
                           random_tensor((8, 16), dtype, device)), desc="is_neox defaulted, key None"))
    return samples


def rotary_inplace_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    positions = torch.randint(0, 16, (n,), device=device)
    return (positions, random_tensor((n, 24), dtype, device), random_tensor((n, 16), dtype, device), 8,
            random_tensor((16, 8), dtype, device), True)


# qk_norm_rope: the rotary cases with weights ("same" dtype, or "f32" with 16-bit q), eps and weight_offset.
_NORM_CASES: list[tuple] = [
    (0, "same", 1e-6, 0.0),
    (1, "same", 1e-6, 1.0),
    (2, "f32", 1e-6, 0.0),
    (3, "same", 1e-5, -0.5),
    (4, "f32", 1e-6, 1.0),
    (5, "same", 0.1, 0.0),
    (6, "f32", 1e-6, 0.5),
    (7, "same", 1e-6, 0.0),
    (8, "same", 1e-6, 1.0),
    (11, "same", 1e-6, 0.0),
    (12, "f32", 1e-6, 0.0),
]


def _weight(kind: str, n: int, dtype: torch.dtype, device: str, requires_grad: bool) -> torch.Tensor:
    wdtype = torch.float32 if kind == "f32" and dtype in HALF_DTYPES else dtype
    return _grad(random_tensor((n,), wdtype, device), requires_grad)


def _qk_norm_args(device: str, dtype: torch.dtype, requires_grad: bool):
    for case, kind, eps, offset in _NORM_CASES:
        rotary = _rotary_case(_CASES[case], device, dtype, requires_grad)
        q, k, cos, sin, u, inter = rotary.args
        desc = rotary.desc
        qw = _weight(kind, q.shape[-1], dtype, device, requires_grad)
        kw = _weight(kind, k.shape[-1], dtype, device, requires_grad)
        yield q, k, qw, kw, cos, sin, eps, offset, u, inter, f"{desc}, weights {kind}, eps={eps}, weight_offset={offset}"


def qk_norm_rope_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = [Sample((q, k, qw, kw, cos, sin, eps, offset, u, inter), desc=desc)
               for q, k, qw, kw, cos, sin, eps, offset, u, inter, desc in _qk_norm_args(device, dtype, requires_grad)]
    q = _grad(_heads_tensor(2, 2, 3, 8, 1, "hf", dtype, device), requires_grad)
    k = _grad(_heads_tensor(2, 1, 3, 8, 1, "hf", dtype, device), requires_grad)
    qw, kw = (_grad(random_tensor((8,), dtype, device), requires_grad) for _ in range(2))
    cos, sin = _cos_sin(1, 3, 8, False, "contiguous", dtype, device)
    return samples + [Sample((q, k, qw, kw, cos, sin), desc="eps and the rest defaulted")]


def qk_norm_rope_backward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    # (grad_q_out given, grad_k_out given, input_grad, weight_grad) in turn
    masks = [(True, True, True, True), (True, False, True, True), (False, True, True, False), (True, True, False, True),
             (True, True, True, False)]
    for i, (q, k, qw, kw, cos, sin, eps, offset, u, inter, desc) in enumerate(_qk_norm_args(device, dtype, False)):
        has_q, has_k, input_grad, weight_grad = masks[i % len(masks)]
        gq = _heads_tensor(q.shape[0], q.shape[u], q.shape[3 - u], q.shape[3], u, "hf", dtype, device) if has_q else None
        gk = random_tensor(k.shape, dtype, device) if has_k else None
        samples.append(Sample((gq, gk, q, k, qw, kw, cos, sin, eps, offset, u, inter, input_grad, weight_grad),
                              desc=f"{desc}, grads given {has_q}/{has_k}, input_grad={input_grad}, "
                                   f"weight_grad={weight_grad}"))
    return samples


def output_layout(x: torch.Tensor) -> tuple[int, ...]:
    """The strides of the outputs (and gradients) made from x, as the README states them: x's own when they are a
    permutation of dense ones with the features last (non-empty, not contiguous), else contiguous."""
    contiguous = torch.empty(x.shape).stride()
    if x.is_contiguous() or x.numel() == 0 or (x.shape[-1] > 1 and x.stride(-1) != 1):
        return contiguous
    expected = 1
    for st, size in sorted((st, size) for st, size in zip(x.stride(), x.shape) if size > 1):
        if st != expected:
            return contiguous
        expected *= size
    return x.stride()


def _layouts_of(first: int):
    """output_strides of an op whose two outputs are made from args[first] and args[first + 1]."""
    return lambda sample: (output_layout(sample.args[first]), output_layout(sample.args[first + 1]))


def qk_norm_rope_backward_strides(sample: Sample) -> tuple[tuple[int, ...] | None, ...]:
    given_q, given_k, q, k = sample.args[:4]
    input_grad = sample.args[12]
    return (output_layout(q) if given_q is not None and input_grad else None,
            output_layout(k) if given_k is not None and input_grad else None, None, None)


def qk_norm_rope_backward_dtypes(sample: Sample) -> tuple[torch.dtype, ...]:
    q, k, qw, kw = sample.args[2:6]
    return q.dtype, k.dtype, qw.dtype, kw.dtype


def qk_norm_rope_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    q, k, cos, sin, u, inter = rotary_sized(device, dtype, n)
    return (q, k, random_tensor((8,), dtype, device), random_tensor((8,), dtype, device), cos, sin, 1e-6, 1.0, u,
            inter)


def qk_norm_rope_backward_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    q, k, qw, kw, cos, sin, eps, offset, u, inter = qk_norm_rope_sized(device, dtype, n)
    return (random_tensor(q.shape, dtype, device), random_tensor(k.shape, dtype, device), q, k, qw, kw, cos, sin, eps,
            offset, u, inter, True, True)


# ----------------------------------------------------------------------------------------------- errors
def _rotary_errors(op: str, device: str, names: tuple[str, str], extra: tuple = ()) -> list[ErrorInput]:
    """Bad (q, k, cos, sin, unsqueeze_dim) for rotary_embedding and its backward (q and k named `names`)."""
    t = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    e = functools.partial(expect, op)
    qn, kn = names
    q, k, c = t(2, 4, 3, 8), t(2, 2, 3, 8), t(1, 3, 8)
    layout = "[batch, heads, seq, head_dim]"
    cases = [
        e(Sample((q.int(), k, c, c, 1) + extra), "dtype_in", x=qn, dtype=torch.int32, supported=FLOAT_DTYPES),
        e(Sample((q, k, c, c, 3) + extra), "unsqueeze_dim", got=3),
        e(Sample((t(4, 3, 8), k, c, c, 1) + extra), "rotary_4d", x=qn, layout=layout, unsqueeze_dim=1, shape=[4, 3, 8]),
        e(Sample((q, k.double(), c, c, 1) + extra), "same_dtype", x=qn, y=kn, x_dtype=torch.float32,
          y_dtype=torch.float64),
        e(Sample((q, t(2, 2, 3, 8, 1), c, c, 1) + extra), "rotary_4d", x=kn, layout=layout, unsqueeze_dim=1,
          shape=[2, 2, 3, 8, 1]),
        e(Sample((q, t(2, 2, 4, 8), c, c, 1) + extra), "rotary_heads_only", y=kn, x=qn, dim=1, x_shape=[2, 4, 3, 8],
          y_shape=[2, 2, 4, 8]),
        e(Sample((t(2, 3, 4, 8), t(2, 3, 2, 8), t(1, 4, 8), c, 2) + extra), "rotary_cos_shape", x="cos", batch=2,
          seq=3, shape=[1, 4, 8]),
        e(Sample((q, k, t(3, 3, 8), c, 1) + extra), "rotary_cos_shape", x="cos", batch=2, seq=3, shape=[3, 3, 8]),
        e(Sample((q, k, t(3, 8), c, 1) + extra), "rotary_cos_shape", x="cos", batch=2, seq=3, shape=[3, 8]),
        e(Sample((q, k, c, c.half(), 1) + extra), "same_dtype", x=qn, y="sin", x_dtype=torch.float32,
          y_dtype=torch.float16),
        e(Sample((q, k, c, t(2, 3, 8), 1) + extra), "same_shape", x="cos", y="sin", x_shape=[1, 3, 8],
          y_shape=[2, 3, 8]),
        e(Sample((q, k, t(1, 3, 7), t(1, 3, 7), 1) + extra), "rotary_dim", x="cos", limit="head_dim", n=8, rot=7),
        e(Sample((q, k, t(1, 3, 10), t(1, 3, 10), 1) + extra), "rotary_dim", x="cos", limit="head_dim", n=8, rot=10),
        e(Sample((q, k, c.clone().requires_grad_(), c, 1) + extra), "rotary_constant", x="cos", why="requires grad"),
        e(Sample((q, k, c, c.clone().requires_grad_(), 1) + extra), "rotary_constant", x="sin", why="requires grad"),
    ]
    if device == "cuda":
        cases.append(e(Sample((q, torch.randn(2, 2, 3, 8), c, c, 1) + extra), "same_device", x=qn, y=kn,
                       **_CUDA_VS_CPU))
    return cases


def rotary_errors(device: str) -> list[ErrorInput]:
    return _rotary_errors("rotary_embedding", device, ("q", "k"), (False,))


def rotary_backward_errors(device: str) -> list[ErrorInput]:
    return _rotary_errors("_rotary_embedding_backward", device, ("grad_q", "grad_k"), (True,))


def rotary_inplace_errors(device: str) -> list[ErrorInput]:
    t = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    e = functools.partial(expect, "rotary_embedding_")
    pos = torch.tensor([0, 3, 1], device=device)
    query, key, cache = t(3, 32), t(3, 16), t(8, 16)
    memory = functools.partial(e, on_fake=False)  # decided from the storage: real kernels only
    cases = [
        e(Sample((pos.float(), query, key, 16, cache)), "dtype_in", x="positions", dtype=torch.float32,
          supported=INT_DTYPES),
        e(Sample((pos.view(3, 1), query, key, 16, cache)), "one_d", x="positions", shape=[3, 1]),
        e(Sample((pos, query.int(), key, 16, cache)), "dtype_in", x="query", dtype=torch.int32, supported=FLOAT_DTYPES),
        e(Sample((pos, t(3, 30), key, 16, cache)), "rotary_heads", x="query", head_size=16, shape=[3, 30]),
        e(Sample((pos, t(3, 2, 8), key, 16, cache)), "rotary_heads", x="query", head_size=16, shape=[3, 2, 8]),
        e(Sample((pos, query, key, 0, cache)), "rotary_heads", x="query", head_size=0, shape=[3, 32]),
        e(Sample((pos, t(4, 32), key, 16, cache)), "rotary_tokens", x="query", tokens=3, shape=[4, 32]),
        e(Sample((pos, t(32, 3).t(), key, 16, cache)), "rotary_inner_stride", x="query", strides=[1, 3]),
        e(Sample((pos, query, key.double(), 16, cache)), "same_dtype", x="query", y="key", x_dtype=torch.float32,
          y_dtype=torch.float64),
        e(Sample((pos, query, t(3, 17), 16, cache)), "rotary_heads", x="key", head_size=16, shape=[3, 17]),
        e(Sample((pos, query, t(2, 16), 16, cache)), "rotary_tokens", x="key", tokens=3, shape=[2, 16]),
        e(Sample((pos, query, key, 16, t(16))), "two_d", x="cos_sin_cache", shape=[16]),
        e(Sample((pos, query, key, 16, cache.double())), "param_dtype", param="cos_sin_cache", x="query",
          dtype=torch.float32, param_dtype=torch.float64),
        e(Sample((pos, query.half(), key.half(), 16, cache.bfloat16())), "param_dtype_or_float", param="cos_sin_cache",
          x="query", dtype=torch.float16, param_dtype=torch.bfloat16),
        e(Sample((pos, query, key, 16, t(8, 15))), "rotary_dim", x="cos_sin_cache", limit="head_size", n=16, rot=15),
        e(Sample((pos, query, key, 16, t(8, 18))), "rotary_dim", x="cos_sin_cache", limit="head_size", n=16, rot=18),
        e(Sample((pos, query.clone().requires_grad_(), key, 16, cache)), "rotary_inference_only", x="query",
          why="requires grad"),
        e(Sample((pos, query, key, 16, cache.clone().requires_grad_())), "rotary_inference_only", x="cos_sin_cache",
          why="requires grad"),
        memory(Sample((pos, t(1, 32).expand(3, 32), key, 16, cache)), "internal_overlap", x="query"),
        memory(Sample((pos, query, query, 16, cache)), "rotary_same_memory"),
        memory(Sample((pos, query, query[:, 8:24], 16, cache)), "partial_overlap", x="key", y="query"),
    ]
    if device == "cpu":  # CUDA never synchronises to check: an out-of-range token is left as it is
        cases.append(memory(Sample((torch.tensor([0, 8, 1]), query, key, 16, cache)), "rotary_position", max=8, i=1,
                            got=8))
        cases.append(memory(Sample((torch.tensor([0, 2, -1]), query, key, 16, cache)), "rotary_position", max=8, i=2,
                            got=-1))
    if device == "cuda":
        cases.append(e(Sample((pos, query, key, 16, torch.randn(8, 16))), "same_device", x="query", y="cos_sin_cache",
                       **_CUDA_VS_CPU))
    return cases


def qk_norm_rope_errors(device: str, op: str = "qk_norm_rope", grads: tuple = ()) -> list[ErrorInput]:
    t = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    e = functools.partial(expect, op)
    q, k, c, w = t(2, 4, 3, 8), t(2, 2, 3, 8), t(1, 3, 8), t(8)
    tail = (1e-6, 0.0, 1, False) + ((True, True) if grads else ())

    def call(*args: Any) -> Sample:
        return Sample(grads + args + tail)

    cases = [
        e(call(q.int(), k, w, w, c, c), "dtype_in", x="q", dtype=torch.int32, supported=FLOAT_DTYPES),
        e(call(q, k, w, w, c, c.double()), "same_dtype", x="q", y="sin", x_dtype=torch.float32, y_dtype=torch.float64),
        e(call(t(2, 4, 3, 0), t(2, 2, 3, 0), w, w, t(1, 3, 0), t(1, 3, 0)), "normalised_dim_empty", x="q",
          shape=[2, 4, 3, 0]),
        e(call(q, k, t(7), w, c, c), "param_shape", param="q_weight", n=8, x="q", shape=[7]),
        e(call(q, k, w, t(1, 8), c, c), "param_shape", param="k_weight", n=8, x="k", shape=[1, 8]),
        e(call(q, k, w, w.double(), c, c), "param_dtype", param="k_weight", x="k", dtype=torch.float32,
          param_dtype=torch.float64),
        e(call(q.half(), k.half(), w.bfloat16(), w, c.half(), c.half()), "param_dtype_or_float", param="q_weight",
          x="q", dtype=torch.float16, param_dtype=torch.bfloat16),
        e(call(q, k, w, w, c, c.clone().requires_grad_()), "rotary_constant", x="sin", why="requires grad"),
    ]
    if device == "cuda":
        cases.append(e(call(q, k, torch.randn(8), w, c, c), "same_device", x="q", y="q_weight", **_CUDA_VS_CPU))
        # the CUDA kernels' longest head (rows held per group of lanes): the real kernels' limit only
        big = t(1, 1, 1, 4097)
        cases.append(e(call(big, big, t(4097), t(4097), t(1, 1, 8), t(1, 1, 8)), "row_limit", on_fake=False, x="q",
                       n=4097, max=4096))
    return cases


def qk_norm_rope_backward_errors(device: str) -> list[ErrorInput]:
    t = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    op = "_qk_norm_rope_backward"
    e = functools.partial(expect, op)
    cases = qk_norm_rope_errors(device, op, (t(2, 4, 3, 8), t(2, 2, 3, 8)))[:4]
    q, k, c, w = t(2, 4, 3, 8), t(2, 2, 3, 8), t(1, 3, 8), t(8)
    tail = (q, k, w, w, c, c, 1e-6, 0.0, 1, False, True, True)
    cases += [
        e(Sample((t(2, 4, 3, 7), None) + tail), "same_shape", x="q", y="grad_q_out", x_shape=[2, 4, 3, 8],
          y_shape=[2, 4, 3, 7]),
        e(Sample((None, t(2, 2, 3, 8).half()) + tail), "same_dtype", x="k", y="grad_k_out", x_dtype=torch.float32,
          y_dtype=torch.float16),
    ]
    return cases


# rotary_embedding, its backward and qk_norm_rope are differentiable in their rows (and weights) but not in cos and
# sin, which are constants (an error if they require grad); the generic compiled-backward test makes every float
# argument require grad, so these rows say differentiable=False and tests/test_rotary_embedding.py runs their
# gradchecks (first and second order), opcheck with gradients and compiled backward over these same samples.

OPS: list[OpInfo] = [
    OpInfo("rotary_embedding", FLOAT_DTYPES, rotary_samples, rotary_reference, rotary_errors, rotary_sized,
           differentiable=False, output_strides=_layouts_of(0)),  # in q and k (and weights) only: see above
    OpInfo("_rotary_embedding_backward", FLOAT_DTYPES, rotary_backward_samples, rotary_backward_reference,
           rotary_backward_errors, rotary_sized, differentiable=False, output_strides=_layouts_of(0)),
    # inference only: its Autograd kernel refuses inputs that require grad; query is written (key too:
    # tests/test_rotary_embedding.py)
    OpInfo("rotary_embedding_", FLOAT_DTYPES, rotary_inplace_samples, rotary_inplace_reference,
           rotary_inplace_errors, rotary_inplace_sized, differentiable=False, mutated_args=(1,)),
    OpInfo("qk_norm_rope", FLOAT_DTYPES, qk_norm_rope_samples, qk_norm_rope_reference, qk_norm_rope_errors,
           qk_norm_rope_sized, differentiable=False, output_strides=_layouts_of(0)),
    # double backward is refused by its Autograd kernel
    OpInfo("_qk_norm_rope_backward", FLOAT_DTYPES, qk_norm_rope_backward_samples, qk_norm_rope_backward_reference,
           qk_norm_rope_backward_errors, qk_norm_rope_backward_sized, differentiable=False,
           output_dtypes=qk_norm_rope_backward_dtypes, output_strides=qk_norm_rope_backward_strides),
]
