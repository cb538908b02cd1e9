"""Property tests (hypothesis) for every public op: random shapes, dtypes, layouts and values against a
float64 reference, random bad inputs that must raise a named RuntimeError, and the repros of the bugs these
properties exist to catch.

What is drawn:
- shapes of rank 0-5 with zero sizes; layouts as arbitrary strides over a storage buffer: dims stored in any
  order, steps (gaps) per dim, stride-0 (expanded) dims and a storage offset (misaligned starts);
- dtypes: every supported one; values: moderate, or spread over the whole exponent range of the dtype, with
  NaN, +-inf, +-0, the largest finite, the smallest normal and subnormal numbers sprinkled in;
- bad inputs: mismatched shapes/dtypes/devices ("meta" is the second device on a CPU-only machine),
  unsupported dtypes, wrong ranks and lengths, malformed CSR structure, out= views that overlap the inputs or
  carry the negative bit.

Properties that could crash the interpreter (malformed CSR read by the CPU kernels, out= with overlap or math
bits) run in a fresh interpreter (helpers.run_python), so a crash is a failed exit status, not a dead run.

Profiles (HYPOTHESIS_PROFILE, registered in helpers.py):
- ``ci`` (the default): derandomized (a fixed seed: every run draws the same examples), a bounded number of
  examples per property; the whole file takes well under two minutes on two cores.
- ``long``: many more examples, from a fresh random seed each run, for a deeper search:
  ``HYPOTHESIS_PROFILE=long python -m pytest tests/test_properties.py -n 0`` (the README's command adds the
  loss's and the rotary ops' properties, which follow the same profiles). A failure prints the
  ``@reproduce_failure`` blob and the falsifying example; add it as an explicit test.
"""

from __future__ import annotations

import math
import os
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

import torchops
from helpers import (DEVICES, FLOAT_DTYPES, HALF_DTYPES, INT_DTYPES, TOLERANCES, assert_close_to_reference,
                     assert_close_to_sum, exact_gelu, run_python, ulp)
from op_db import upcast


MYNS = torch.ops.myns
HAS_ADD_RMS_NORM = hasattr(MYNS, "add_rms_norm")
HAS_WEIGHT_OFFSET = "weight_offset" in [a.name for a in MYNS.rms_norm.default._schema.arguments]
# The device a mismatched tensor goes to: another GPU kind is not available here, meta always is.
OTHER_DEVICE = {"cpu": "meta", "cuda": "cpu"}


# ------------------------------------------------------------------------------------------- strategies

@dataclass(frozen=True)
class Layout:
    """Strides over a storage buffer: `order` lists the dims from outermost to innermost in memory, `steps`
    leaves gaps between neighbours, `expanded` dims get stride 0, `offset` is the storage offset."""
    order: tuple[int, ...]
    steps: tuple[int, ...]
    expanded: tuple[bool, ...]
    offset: int

    def strides(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        strides = [0] * len(shape)
        running = 1
        for d in reversed(self.order):
            if self.expanded[d]:
                continue
            strides[d] = running * self.steps[d]
            running = strides[d] * max(shape[d], 1)
        return tuple(strides)


@dataclass(frozen=True)
class Values:
    """How a tensor's elements are drawn (a torch generator seeded by `seed`, so big tensors stay cheap to
    draw): "moderate" (uniform in [-3, 3]) or "wide" (log-uniform over the dtype's whole exponent range),
    with a fraction `special_rate` of NaN, +-inf, +-0, the largest finite, smallest normal and subnormal
    numbers."""
    seed: int
    kind: str
    special_rate: float


@dataclass(frozen=True)
class Spec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: Layout
    values: Values


def _specials(dtype: torch.dtype, *, huge: bool = True) -> list[float]:
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return [info.min, info.max, 0, -1, 1]
    fi = torch.finfo(dtype)
    subnormal = fi.smallest_normal * fi.eps
    out = [math.nan, math.inf, -math.inf, 0.0, -0.0, fi.smallest_normal, -fi.smallest_normal, subnormal,
           -subnormal, 7 * subnormal]
    return out + ([fi.max, -fi.max, fi.max / 3] if huge else [])


def fill(n: int, dtype: torch.dtype, values: Values, *, huge: bool = True) -> torch.Tensor:
    """n elements drawn as `values` says, on the CPU."""
    g = torch.Generator().manual_seed(values.seed)
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        lo, hi = (-1000, 1000) if values.kind == "moderate" else (info.min, info.max)
        x = torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)
    elif values.kind == "moderate" or not huge:
        x = (torch.rand(n, generator=g, dtype=torch.float64) * 6 - 3).to(dtype)
    else:
        fi = torch.finfo(dtype)
        lo, hi = math.log2(fi.smallest_normal * fi.eps), math.log2(fi.max)
        e = torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo
        sign = torch.randint(0, 2, (n,), generator=g, dtype=torch.float64) * 2 - 1
        x = (sign * torch.exp2(e)).to(dtype)
    if values.special_rate and n:
        specials = torch.tensor(_specials(dtype, huge=huge), dtype=torch.float64 if dtype.is_floating_point else torch.int64)
        mask = torch.rand(n, generator=g) < values.special_rate
        pick = torch.randint(0, specials.numel(), (n,), generator=g)
        x[mask] = specials[pick[mask]].to(dtype)
    return x


def make(spec: Spec, device: str, *, huge: bool = True, poison: bool = False) -> torch.Tensor:
    """The tensor `spec` describes: a view of a fresh storage buffer (poisoned, for out= tensors)."""
    strides = spec.layout.strides(spec.shape)
    extent = 0 if 0 in spec.shape else 1 + sum((s - 1) * st for s, st in zip(spec.shape, strides))
    size = spec.layout.offset + extent
    if poison:
        buf = torch.full((size,), math.nan if spec.dtype.is_floating_point else torch.iinfo(spec.dtype).min, dtype=spec.dtype)
    else:
        buf = fill(size, spec.dtype, spec.values, huge=huge)
    return buf.to(device).as_strided(spec.shape, strides, spec.layout.offset)


@st.composite
def shapes(draw, min_rank: int = 0, max_rank: int = 5, min_last: int = 0, max_numel: int = 3000) -> tuple[int, ...]:
    rank = draw(st.integers(min_rank, max_rank))
    side = st.one_of(st.integers(0, 6), st.integers(7, 70)) if rank <= 3 else st.integers(0, 5)
    shape = [draw(side) for _ in range(rank)]
    if rank and min_last:
        shape[-1] = max(shape[-1], min_last)
    while math.prod(shape) > max_numel:  # keep examples cheap: halve the largest dim
        i = max(range(rank), key=lambda j: shape[j])
        shape[i] = max(shape[i] // 2, min_last if i == rank - 1 else 0)
    return tuple(shape)


@st.composite
def layouts(draw, rank: int, expand: bool = True) -> Layout:
    order = tuple(draw(st.permutations(range(rank))))
    steps = tuple(draw(st.sampled_from((1, 1, 1, 2, 3))) for _ in range(rank))
    expanded = tuple(expand and draw(st.integers(0, 5)) == 0 for _ in range(rank))
    return Layout(order, steps, expanded, draw(st.sampled_from((0, 0, 1, 3))))


def values(kinds: tuple[str, ...] = ("moderate", "wide")) -> st.SearchStrategy[Values]:
    return st.builds(Values, st.integers(0, 2**31 - 1), st.sampled_from(kinds), st.sampled_from((0.0, 0.0, 0.05, 0.3)))


@st.composite
def specs(draw, shape: tuple[int, ...], dtype: torch.dtype, expand: bool = True,
          kinds: tuple[str, ...] = ("moderate", "wide")) -> Spec:
    return Spec(shape, dtype, draw(layouts(len(shape), expand)), draw(values(kinds)))


devices = st.sampled_from(DEVICES)


def _check_new_output(out: torch.Tensor, expected: torch.Tensor, device: str) -> None:
    assert out.device.type == device and out.shape == expected.shape and out.is_contiguous()
    assert_close_to_reference(out.cpu(), expected)


# -------------------------------------------------------------------------------------------- vector_add

@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES + INT_DTYPES), device=devices, use_out=st.booleans())
def test_vector_add_matches_float64_reference(data, dtype, device, use_out) -> None:
    shape = data.draw(shapes(), label="shape")
    a = make(data.draw(specs(shape, dtype), label="a"), device)
    b = make(data.draw(specs(shape, dtype), label="b"), device)
    expected = upcast((a,))[0] + upcast((b,))[0]  # ints: int arithmetic, wrapping like the op
    if not use_out:
        _check_new_output(torchops.vector_add(a, b), expected, device)
        return
    out_spec = data.draw(specs(shape, dtype, expand=False), label="out")
    out = make(out_spec, device, poison=True)
    storage = out.as_strided((out.untyped_storage().nbytes() // out.element_size(),), (1,), 0)
    outside = torch.ones_like(storage, dtype=torch.bool)
    outside.as_strided(out.shape, out.stride(), out.storage_offset()).fill_(False)
    before = storage[outside].clone()
    assert torchops.vector_add(a, b, out=out) is out
    assert_close_to_reference(out.cpu(), expected)
    # Storage around out's elements (the gaps of a strided out) is never written.
    torch.testing.assert_close(storage[outside], before, rtol=0, atol=0, equal_nan=True)


# ------------------------------------------------------------------------------------------------ swiglu

def _silu_underflow_pairs(gate: torch.Tensor, up: torch.Tensor, compute: torch.dtype, atol: float) -> torch.Tensor:
    """Where the op's silu(gate) is below the normal range of its compute precision (float32 for 16- and
    32-bit input, float64 for float64), or exp(-gate) overflows there, the op (like torch's own silu) gets
    silu(gate) only to within that precision's smallest normal number, or as -0: correct to the tolerances on
    its own, but a huge or infinite `up` multiplies that into a visible difference (-0 * -inf is NaN, not
    inf). Those (gate, up) pairs are left out of the domain (the caller sets up = 1 there) instead of
    loosening the tolerance for every element."""
    g, u = upcast((gate, up))
    fi = torch.finfo(compute)
    silu = torch.nn.functional.silu(g)
    band = (g != 0) & ((g < -math.log(fi.max)) | (silu.abs() < fi.smallest_normal))
    error = torch.maximum(silu.abs(), torch.full_like(silu, fi.smallest_normal)) * u.abs()
    return band & ~(error <= atol / 4)


def _gated_inputs(data, dtype: torch.dtype, device: str, chunked: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """gate and up for a gated op: the halves of x.chunk(2, -1) (the layout the ops exist for), or two
    tensors of any layout."""
    if chunked:
        shape = data.draw(shapes(min_rank=1, min_last=1), label="shape")
        x = make(data.draw(specs(shape[:-1] + (2 * shape[-1],), dtype), label="x"), device)
        return x.chunk(2, dim=-1)
    shape = data.draw(shapes(), label="shape")
    return (make(data.draw(specs(shape, dtype), label="gate"), device),
            make(data.draw(specs(shape, dtype), label="up"), device))


@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), device=devices, chunked=st.booleans())
def test_swiglu_matches_float64_reference(data, dtype, device, chunked) -> None:
    gate, up = _gated_inputs(data, dtype, device, chunked)
    left_out = _silu_underflow_pairs(gate, up, _stat_dtype(dtype), TOLERANCES[dtype][1])
    if left_out.any():
        up = up.clone()  # dense now; still a valid input
        up[left_out.to(up.device)] = 1
    g, u = upcast((gate, up))
    _check_new_output(torchops.swiglu(gate, up), torch.nn.functional.silu(g) * u, device)


# ------------------------------------------------------------------------------------------ gelu_and_mul

def _gelu_imprecise_pairs(gate: torch.Tensor, up: torch.Tensor, approximate: str, compute: torch.dtype,
                          atol: float) -> torch.Tensor:
    """As _silu_underflow_pairs, for gelu: the op gets gelu(gate) to within |gate| eps of its compute
    precision in the erf form (0.5 (1 + erf) cancels below zero, as in torch's own gelu), to (|w| + 4) eps
    relative in the tanh form (sigmoid(w) of a rounded w = 2u), and to the smallest normal number where it
    underflows (gelu of a subnormal gate is half of it): correct to the tolerances on its own, but a huge
    `up` multiplies that into a visible difference. Those pairs are left out (the caller sets up = 1 there)."""
    g, u = upcast((gate, up))
    fi = torch.finfo(compute)
    value = exact_gelu(g, approximate)[0]
    w = 2 * math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)
    if approximate == "none":
        error = g.abs() * fi.eps
    else:
        error = value.abs() * (w.abs() + 4) * fi.eps
    error = error + fi.smallest_normal * torch.maximum(g.abs(), torch.ones_like(g))
    band = (g < 0) | ((g != 0) & (value.abs() < fi.smallest_normal))
    return band & ~(error * u.abs() <= atol / 4)


@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), device=devices, chunked=st.booleans(),
       approximate=st.sampled_from(("none", "tanh")))
def test_gelu_and_mul_matches_float64_reference(data, dtype, device, chunked, approximate) -> None:
    gate, up = _gated_inputs(data, dtype, device, chunked)
    left_out = _gelu_imprecise_pairs(gate, up, approximate, _stat_dtype(dtype), TOLERANCES[dtype][1])
    if left_out.any():
        up = up.clone()  # dense now; still a valid input
        up[left_out.to(up.device)] = 1
    g, u = upcast((gate, up))
    expected = exact_gelu(g, approximate)[0] * u
    _check_new_output(torchops.gelu_and_mul(gate, up, approximate=approximate), expected, device)


# ---------------------------------------------------------------------------------------------- rms_norm

def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float, weight_offset: float = 0.0) -> torch.Tensor:
    """float64 math, except where the op's documented statistics precision (float32 for 16- and 32-bit input,
    as F.rms_norm) decides the result, not just its rounding: each square is formed in that precision (so
    squares of tiny values underflow as in the op), the mean square is rounded to it, and so is x * rstd
    before the weight scales it (a product that underflows there is 0, and 0 times an infinite weight NaN,
    as in F.rms_norm). Where the mean square overflows although the row's values are finite, the op
    recomputes the row's statistics exactly: so does this, over the row scaled by its largest magnitude
    (float64 squares overflow too, for float64 input). Rows holding inf or NaN get a mean square of inf or
    NaN (rstd 0 or NaN), as in the op. The weight offset is added in that precision."""
    stat = _stat_dtype(x.dtype)
    xd = x.detach().cpu().double()
    sq = x.detach().cpu().to(stat).pow(2)
    mean_sq = (sq.double().sum(-1, keepdim=True) / x.shape[-1]).to(stat).double()
    xhat = xd * torch.rsqrt(mean_sq + eps)
    exact = ~torch.isfinite(mean_sq) & torch.isfinite(xd).all(-1, keepdim=True)
    if exact.any():
        largest = xd.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
        scaled = xd / largest
        xhat = torch.where(exact, scaled * torch.rsqrt(scaled.pow(2).mean(-1, keepdim=True) + eps / largest.pow(2)), xhat)
    out = xhat.to(stat).double()
    if weight is not None:
        out = out * (weight.detach().cpu().to(stat) + weight_offset).double()
    return out


def _rms_norm_weight(data, n: int, dtype: torch.dtype, device: str) -> torch.Tensor | None:
    kind = data.draw(st.sampled_from(("none", "same", "f32")), label="weight kind")
    if kind == "none":
        return None
    wdtype = torch.float32 if kind == "f32" and dtype in HALF_DTYPES else dtype
    return make(data.draw(specs((n,), wdtype), label="weight"), device)


def _away_from_overflow(x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float) -> torch.Tensor | None:
    """The weight, except in the columns where some output lies within a few of its dtype's ulps of the
    largest finite number (a weight near it times an x * rstd near 1): whether that output rounds to the
    largest finite number or to inf depends on the last bit of x * rstd, which is correct either way (a
    different summation order flips it). Those columns are left out of the domain: their weight becomes
    1 - offset (a dense copy of the weight, still a valid input)."""
    if weight is None:
        return None
    expected = rms_norm_reference(x, weight, eps, offset)
    fi = torch.finfo(x.dtype)
    near = (expected.abs() > fi.max * (1 - 16 * fi.eps)).reshape(-1, x.shape[-1]).any(0)
    if not near.any():
        return weight
    weight = weight.clone()
    weight[near.to(weight.device)] = 1 - offset
    return weight


_EPS = st.sampled_from((1e-6, 1e-5, 0.0, 0.1, 1.0))
_OFFSETS = st.sampled_from((0.0, 1.0, -0.5))


@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), device=devices, eps=_EPS)
def test_rms_norm_matches_float64_reference(data, dtype, device, eps) -> None:
    shape = data.draw(shapes(min_rank=1, min_last=1), label="shape")
    x = make(data.draw(specs(shape, dtype), label="input"), device)
    weight = _rms_norm_weight(data, shape[-1], dtype, device)
    kwargs: dict[str, Any] = {}
    if HAS_WEIGHT_OFFSET and weight is not None:
        kwargs["weight_offset"] = data.draw(_OFFSETS, label="weight_offset")
    weight = _away_from_overflow(x, weight, eps, kwargs.get("weight_offset", 0.0))
    out = MYNS.rms_norm.default(x, weight, eps, **kwargs)
    _check_new_output(out, rms_norm_reference(x, weight, eps, kwargs.get("weight_offset", 0.0)), device)
    assert out.dtype == dtype


@pytest.mark.skipif(not HAS_ADD_RMS_NORM, reason="myns::add_rms_norm is not in this build")
@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), device=devices, eps=_EPS)
def test_add_rms_norm_matches_float64_reference(data, dtype, device, eps) -> None:
    shape = data.draw(shapes(min_rank=1, min_last=1), label="shape")
    x = make(data.draw(specs(shape, dtype), label="input"), device)
    residual = make(data.draw(specs(shape, dtype), label="residual"), device)
    weight = _rms_norm_weight(data, shape[-1], dtype, device)
    offset = data.draw(_OFFSETS, label="weight_offset") if weight is not None else 0.0
    # The contract: residual_out is input + residual rounded to input's dtype, and out normalises that
    # rounded tensor (what the next layer reads back), so the reference normalises the rounded sum too.
    rounded = (upcast((x,))[0] + upcast((residual,))[0]).to(dtype)
    weight = _away_from_overflow(rounded, weight, eps, offset)
    out, residual_out = MYNS.add_rms_norm.default(x, residual, weight, eps, offset)
    _check_new_output(residual_out, rounded.double(), device)
    assert residual_out.dtype == dtype and out.dtype == dtype
    _check_new_output(out, rms_norm_reference(rounded, weight, eps, offset), device)


# -------------------------------------------------------------------------------------------- layer_norm

def layer_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                         eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, allowance): float64 math where the op's statistics precision (float32 for 16- and 32-bit input,
    as F.layer_norm) decides the result, as rms_norm_reference: the mean is a number of that precision, each
    deviation x - mean and its square are formed in it, the variance and (x - mean) * rstd are rounded to
    it; where the mean or variance overflows although the row's values are finite, the op recomputes the
    row's statistics exactly, and so does this (over the row scaled by its largest magnitude). The allowance
    is what the mean's own rounding may move the output by (an ulp of the mean, times rstd and the weight),
    beyond the output dtype's tolerance."""
    stat = _stat_dtype(x.dtype)
    xd = x.detach().cpu().double()
    n = x.shape[-1]
    first = xd[..., :1]  # the mean shifted by the first value, so a row of equal values has exactly that mean
    mean = (first + (xd - first).sum(-1, keepdim=True) / n).to(stat).double()
    dev = (xd - mean).to(stat)
    var = (dev.pow(2).double().sum(-1, keepdim=True) / n).to(stat).double()
    rstd = torch.rsqrt(var + eps)
    xhat = dev.double() * rstd
    exact = ~(torch.isfinite(mean) & torch.isfinite(var)) & torch.isfinite(xd).all(-1, keepdim=True)
    if exact.any():
        largest = xd.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
        scaled = xd / largest
        centred = scaled - scaled.mean(-1, keepdim=True)
        # eps / largest^2 may underflow: it only counts where every deviation is 0, and there x̂ = 0.
        denom = centred.pow(2).mean(-1, keepdim=True) + eps / largest.pow(2)
        xhat = torch.where(exact, torch.where(denom > 0, centred * denom.rsqrt(), 0.0), xhat)
        rstd = torch.where(exact, torch.where(denom > 0, denom.rsqrt() / largest, 1 / math.sqrt(eps)), rstd)
        mean = torch.where(exact, scaled.mean(-1, keepdim=True) * largest, mean)
    out = xhat.to(stat).double()
    scale = rstd
    if weight is not None:
        w = weight.detach().cpu().double()
        out, scale = out * w, scale * w.abs()
    if bias is not None:
        out = out + bias.detach().cpu().double()
    allowance = 2 * ulp(mean.nan_to_num(), stat) * scale.nan_to_num()
    return out, allowance


_LAYER_NORM_EPS = st.sampled_from((1e-5, 1e-6, 0.1, 1.0))  # eps 0 makes rows of equal values 0 / 0


@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), device=devices, eps=_LAYER_NORM_EPS,
       affine=st.sampled_from(("none", "weight", "bias", "both")), f32_params=st.booleans())
def test_layer_norm_matches_float64_reference(data, dtype, device, eps, affine, f32_params) -> None:
    """Any values in the input (huge, tiny, inf, NaN, in any layout); weight and bias moderate (a special
    value there multiplies or adds the same way for any implementation, but whether a product near 0 or
    near the largest finite number rounds one way or the other decides between 0 and NaN or inf)."""
    shape = data.draw(shapes(min_rank=1, min_last=1), label="shape")
    x = make(data.draw(specs(shape, dtype), label="input"), device)
    pdtype = torch.float32 if f32_params and dtype in HALF_DTYPES else dtype
    params = []
    for name in ("weight", "bias"):
        spec = data.draw(specs(shape[-1:], pdtype), label=name) if affine in (name, "both") else None
        params.append(None if spec is None else make(Spec(spec.shape, pdtype, spec.layout, Values(spec.values.seed, "moderate", 0.0)), device))
    out, mean, rstd = MYNS._layer_norm_forward.default(x, *params, eps)
    assert out.dtype == dtype and out.device.type == device and out.is_contiguous()
    expected, allowance = layer_norm_reference(x, *params, eps)
    rtol, atol = TOLERANCES[dtype]
    expected_rounded = expected.to(dtype).double()
    got = out.double().cpu()
    same_nan = torch.isnan(got) == torch.isnan(expected_rounded)
    assert bool(same_nan.all()), "NaN where the reference has none, or the reverse"
    excess = ((got - expected_rounded).abs() - (atol + rtol * expected_rounded.abs() + allowance)).nan_to_num(0.0)
    both_inf = torch.isinf(got) & (got == expected_rounded)
    assert bool((excess <= 0).logical_or(both_inf).all()), f"off by {excess.max().item():.3g} past the tolerance"
    torch.testing.assert_close(MYNS.layer_norm.default(x, *params, eps), out, rtol=0, atol=0, equal_nan=True)
    assert mean.dtype == rstd.dtype == _stat_dtype(dtype) and mean.shape == rstd.shape == shape[:-1]


# ---------------------------------------------------------------------------------------------- csr_spmm

@dataclass(frozen=True)
class Csr:
    rows: tuple[tuple[int, ...], ...]  # each row's column indices (any order, duplicates add up)
    k: int
    index_dtype: torch.dtype

    def indices(self, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        lens = torch.tensor([0] + [len(r) for r in self.rows], dtype=torch.int64)
        crow = torch.cumsum(lens, 0).to(self.index_dtype)
        col = torch.tensor([c for r in self.rows for c in r], dtype=self.index_dtype)
        return crow.to(device), col.to(device)


@st.composite
def csrs(draw, max_m: int = 12, max_k: int = 12, unique: bool = False) -> Csr:
    """Rows with columns in any order and duplicates, or (`unique`) sorted and distinct, as torch's own
    sparse CSR tensors require (their autograd merges duplicates)."""
    m, k = draw(st.integers(0, max_m)), draw(st.integers(0, max_k))
    row_len = st.one_of(st.integers(0, 6), st.integers(7, 70))
    rows = tuple(tuple(draw(st.lists(st.integers(0, k - 1), max_size=draw(row_len)))) if k else () for _ in range(m))
    if unique:
        rows = tuple(tuple(sorted(set(r))) for r in rows)
    return Csr(rows, k, draw(st.sampled_from(INT_DTYPES)))


_CSR_N = st.one_of(st.integers(0, 9), st.integers(10, 80))


def _csr_operands(data, dtype: torch.dtype, device: str, kinds=("moderate",), special=True, unique=False):
    """(csr, crow, col, values, dense): values and dense in any layout; NaN/inf/0/tiny/subnormal sprinkled
    in (not the largest finite numbers: a sum of huge terms is ill-conditioned, and its result depends on
    summation order; test_csr_spmm_scales_exactly_to_huge_and_tiny covers that range)."""
    csr = data.draw(csrs(unique=unique), label="csr")
    crow, col = csr.indices(device)
    if data.draw(st.booleans(), label="strided indices"):
        crow, col = torch.stack([crow, crow]).t()[:, 1], torch.stack([col, col]).t()[:, 0]
    vspec = data.draw(specs((col.numel(),), dtype, kinds=kinds), label="values")
    dspec = data.draw(specs((csr.k, data.draw(_CSR_N, label="N")), dtype, kinds=kinds), label="dense")
    if not special:
        vspec = Spec(vspec.shape, dtype, vspec.layout, Values(vspec.values.seed, "moderate", 0.0))
        dspec = Spec(dspec.shape, dtype, dspec.layout, Values(dspec.values.seed, "moderate", 0.0))
    return csr, crow, col, make(vspec, device, huge=False), make(dspec, device, huge=False)


@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), device=devices, via_sparse_tensor=st.booleans())
def test_csr_spmm_and_spmm_match_float64_reference(data, dtype, device, via_sparse_tensor) -> None:
    csr, crow, col, v, d = _csr_operands(data, dtype, device)
    expected = csr_reference(*upcast((crow, col, v, d)))
    if via_sparse_tensor:
        A = torch.sparse_csr_tensor(crow, col, v, (len(csr.rows), csr.k))
        out = torchops.spmm(A, d)
    else:
        out = torchops.csr_spmm(crow, col, v, d, check_invariants=data.draw(st.booleans(), label="check_invariants"))
    _check_new_output(out, expected, device)


@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), device=devices)
def test_csr_spmm_scales_exactly_to_huge_and_tiny(data, dtype, device) -> None:
    """values * 2**kv and dense * 2**kd anywhere in the range where no sum overflows and results of the
    tolerance's size stay normal numbers: multiplying by a power of two is exact, so (out / 2**(kv + kd))
    is compared with the float64 reference of the unscaled problem at the per-dtype tolerances."""
    csr, crow, col, v, d = _csr_operands(data, dtype, device, special=False)
    fi, acc = torch.finfo(dtype), torch.finfo(_stat_dtype(dtype))
    rtol, atol = TOLERANCES[dtype]
    longest = max([len(r) for r in csr.rows] + [1])
    k_max = math.floor(math.log2(fi.max / (9 * longest))) - 1  # |v|, |d| <= 3
    k_min = math.ceil(math.log2(max(fi.smallest_normal, acc.smallest_normal) / atol)) + 1
    # The powers of two each operand takes exactly: its largest magnitude stays below 3 * 2**s <= max, and its
    # smallest nonzero one stays a normal number (a drawn value can be tiny, even subnormal in float16, and
    # scaling it down then drops bits).
    (v_lo, v_hi), (d_lo, d_hi) = (_exact_scalings(t, fi) for t in (v, d))
    assume(max(k_min, v_lo + d_lo) <= min(k_max, v_hi + d_hi))  # both operands tiny: no exact scaling left
    k = data.draw(st.integers(max(k_min, v_lo + d_lo), min(k_max, v_hi + d_hi)), label="k = kv + kd")
    kv = data.draw(st.integers(max(v_lo, k - d_hi), min(v_hi, k - d_lo)), label="kv")
    vs, ds = v * 2.0**kv, d * 2.0**(k - kv)
    assert torch.equal(vs / 2.0**kv, v) and torch.equal(ds / 2.0**(k - kv), d), "the scaled operands must be exact"
    out = torchops.csr_spmm(crow, col, vs, ds)
    expected = csr_reference(*upcast((crow, col, v, d)))
    assert out.shape == expected.shape
    assert_close_to_reference((out / 2.0**k).cpu(), expected)


def _exact_scalings(t: torch.Tensor, fi: torch.finfo) -> tuple[int, int]:
    """The powers s for which t * 2**s is exact for values up to 3 in magnitude: every nonzero element stays a
    normal number, none passes the largest finite one."""
    nonzero = t[t != 0].abs().double()
    smallest = nonzero.min().item() if nonzero.numel() else fi.smallest_normal
    return math.ceil(math.log2(fi.smallest_normal / smallest)), math.floor(math.log2(fi.max / 3)) - 1


def _csr_grads(fn, v: torch.Tensor, d: torch.Tensor, g: torch.Tensor):
    v, d = v.detach().requires_grad_(), d.detach().requires_grad_()
    out = fn(v, d)
    return (out, *torch.autograd.grad(out, (v, d), g, allow_unused=True))


@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), device=devices, via_sparse_tensor=st.booleans())
def test_csr_spmm_gradients_match_float64_reference(data, dtype, device, via_sparse_tensor) -> None:
    csr, crow, col, v, d = _csr_operands(data, dtype, device, special=False, unique=via_sparse_tensor)
    m = len(csr.rows)
    gspec = data.draw(specs((m, d.shape[1]), dtype, kinds=("moderate",)), label="grad_out")
    g = make(Spec(gspec.shape, dtype, gspec.layout, Values(gspec.values.seed, "moderate", 0.0)), device)
    if via_sparse_tensor:
        def fn(v, d):
            return torchops.spmm(torch.sparse_csr_tensor(crow, col, v, (m, csr.k)), d)
    else:
        def fn(v, d):
            return torchops.csr_spmm(crow, col, v, d)
    _, gv, gd = _csr_grads(fn, v, d, g)
    c64, col64 = upcast((crow, col))
    _, ev, ed = _csr_grads(lambda v, d: csr_reference(c64, col64, v, d), *upcast((v, d, g)))
    # grad values: a dot product of N terms a nonzero; grad dense: a column's nonzeros' terms (cancellation)
    _, mv, md = _csr_grads(lambda v, d: csr_reference(c64, col64, v, d), *(t.abs() for t in upcast((v, d, g))))
    assert_close_to_sum(gv, ev, mv, max(d.shape[1], 1))
    assert_close_to_sum(gd, ed, md, max(v.shape[0], 1))


def csr_reference(crow, col, values, dense):
    """out[i] = sum of values[p] * dense[col[p]] over row i's nonzeros p. Unlike a dense matmul (op_db's
    reference), an entry of A that is not stored does not multiply: NaN or inf in a dense row that no
    nonzero refers to stays out of the result, as in torch.sparse.mm. No in-place ops, so torch.func
    transforms run through it."""
    rows = torch.repeat_interleave(torch.arange(crow.numel() - 1), (crow[1:] - crow[:-1]).long())
    terms = values.unsqueeze(-1) * dense[col.long()]
    return torch.zeros(crow.numel() - 1, dense.shape[1], dtype=values.dtype).index_add(0, rows, terms)


@given(data=st.data(), device=devices, change=st.sampled_from(("col", "crow and col", "col via A", "values")))
def test_spmm_gradients_follow_in_place_structure_changes(data, device, change) -> None:
    """torchops.spmm caches A's transpose for the dense gradient. Whatever is changed in place (through the
    tensors A was built from, or through A's own index tensors) its gradients stay those of csr_spmm on
    A's current structure: a cache must never return a wrong answer (issue item 1)."""
    csr = data.draw(csrs(max_m=8, max_k=8), label="csr")
    crow, col = csr.indices(device)
    m, k, nnz = len(csr.rows), csr.k, col.numel()
    values = torch.randn(nnz, dtype=torch.float64, device=device)
    A = torch.sparse_csr_tensor(crow, col, values, (m, k))
    dense = torch.randn(k, 3, dtype=torch.float64, device=device, requires_grad=True)
    torchops.spmm(A, dense).sum().backward()  # fills the cache
    # A new valid structure with the same M, K and nnz.
    new_col = torch.tensor(data.draw(st.lists(st.integers(0, max(k - 1, 0)), min_size=nnz, max_size=nnz), label="new col"),
                           dtype=col.dtype, device=device)
    if change == "col":
        col.copy_(new_col)
    elif change == "col via A":
        A.col_indices().copy_(new_col)
    elif change == "values":
        values.copy_(torch.randn(nnz, dtype=torch.float64))
    else:
        cuts = sorted(data.draw(st.lists(st.integers(0, nnz), min_size=max(m - 1, 0), max_size=max(m - 1, 0)), label="new crow"))
        crow.copy_(torch.tensor([0] + cuts + [nnz] if m else [0], dtype=crow.dtype))
        col.copy_(new_col)
    note(f"crow={A.crow_indices().tolist()} col={A.col_indices().tolist()}")
    g = torch.randn(m, 3, dtype=torch.float64, device=device)
    dense.grad = None
    (torchops.spmm(A, dense) * g).sum().backward()
    d_ref = dense.detach().clone().requires_grad_()
    (torchops.csr_spmm(A.crow_indices(), A.col_indices(), A.values(), d_ref) * g).sum().backward()
    torch.testing.assert_close(dense.grad, d_ref.grad, rtol=1e-12, atol=1e-12)
    _, _, expected = _csr_grads(lambda v, d: csr_reference(*upcast((A.crow_indices(), A.col_indices())), v, d),
                                A.values().cpu(), dense.detach().cpu(), g.cpu())
    assert_close_to_reference(dense.grad.cpu(), expected)


# ----------------------------------------------------------------------- spmm_reduce, sddmm, csr_softmax

REDUCES = ("sum", "mean", "max", "min")
HEAD_LAYOUTS = ("1-D", "heads", "shared")  # values (nnz,) & dense (K, D); (nnz, H) & (K, H, D); (nnz,) & (K, H, D)


def _spmm_reduce_operands(data, dtype: torch.dtype, device: str, special: bool = True):
    """(csr, crow, col, values or None, dense, layout): any structure, dense and values in any layout, maybe
    with heads, NaN/inf/0/tiny/subnormal sprinkled in (as _csr_operands)."""
    csr, crow, col, v, d = _csr_operands(data, dtype, device, special=special)
    layout = data.draw(st.sampled_from(HEAD_LAYOUTS), label="heads")
    if layout != "1-D":
        h = data.draw(st.integers(1, 4), label="H")
        dspec = data.draw(specs((csr.k, h, d.shape[1]), dtype, kinds=("moderate",)), label="3-D dense")
        if not special:
            dspec = Spec(dspec.shape, dtype, dspec.layout, Values(dspec.values.seed, "moderate", 0.0))
        d = make(dspec, device, huge=False)
        if layout == "heads":
            vspec = data.draw(specs((col.numel(), h), dtype, kinds=("moderate",)), label="2-D values")
            if not special:
                vspec = Spec(vspec.shape, dtype, vspec.layout, Values(vspec.values.seed, "moderate", 0.0))
            v = make(vspec, device, huge=False)
    if layout != "heads" and data.draw(st.booleans(), label="values None"):
        v = None
    return csr, crow, col, v, d


def spmm_reduce_reference(crow, col, values, dense, reduce):
    """Row i reduces values[p] * dense[col[p]] over its nonzeros (0 for an empty row), functional (no in-place
    ops, so torch.func transforms run through it)."""
    rows = torch.repeat_interleave(torch.arange(crow.numel() - 1), (crow[1:] - crow[:-1]).long())
    x = dense[col.long()]
    if values is not None:
        x = values.view(values.shape + (1,) * (x.dim() - values.dim())) * x
    index = rows.view((-1,) + (1,) * (x.dim() - 1)).expand_as(x)
    out = torch.zeros((crow.numel() - 1,) + tuple(dense.shape[1:]), dtype=dense.dtype)
    how = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}[reduce]
    return out.scatter_reduce(0, index, x, how, include_self=False)


@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), device=devices, reduce=st.sampled_from(REDUCES))
def test_spmm_reduce_matches_float64_reference(data, dtype, device, reduce) -> None:
    csr, crow, col, v, d = _spmm_reduce_operands(data, dtype, device)
    expected = spmm_reduce_reference(*upcast((crow, col, v, d)), reduce)
    check = data.draw(st.booleans(), label="check_invariants")
    _check_new_output(torchops.spmm_reduce(crow, col, v, d, reduce, check_invariants=check), expected, device)


@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), device=devices, reduce=st.sampled_from(REDUCES))
def test_spmm_reduce_gradients_match_float64_reference(data, dtype, device, reduce) -> None:
    """Sum and mean against float64 autograd; max and min against the float64 form of their rule (the first
    nonzero of the row reaching the extreme takes the gradient)."""
    from op_db.csr import spmm_reduce_arg_reference, spmm_reduce_backward_reference

    csr, crow, col, v, d = _spmm_reduce_operands(data, dtype, device, special=False)
    m = len(csr.rows)
    gspec = data.draw(specs((m,) + tuple(d.shape[1:]), dtype, kinds=("moderate",)), label="grad_out")
    g = make(Spec(gspec.shape, dtype, gspec.layout, Values(gspec.values.seed, "moderate", 0.0)), device)
    leaves = [t.detach().requires_grad_() for t in (v, d) if t is not None]
    out = torchops.spmm_reduce(crow, col, leaves[0] if v is not None else None, leaves[-1], reduce)
    got = torch.autograd.grad(out, leaves, g, allow_unused=True, materialize_grads=True)
    c64, col64, v64, d64, g64 = upcast((crow, col, v, d, g))
    if reduce in ("sum", "mean"):
        ref_leaves = [t.requires_grad_() for t in (v64, d64) if t is not None]
        ref = spmm_reduce_reference(c64, col64, ref_leaves[0] if v is not None else None, ref_leaves[-1], reduce)
        expected = torch.autograd.grad(ref, ref_leaves, g64, allow_unused=True, materialize_grads=True)
    else:
        arg = spmm_reduce_arg_reference(c64, col64, v64, d64, reduce)
        gv, gd = spmm_reduce_backward_reference(g64, c64, col64, v64, d64, arg, None, None, None, v is not None, True)
        expected = (gv, gd) if v is not None else (gd,)
    for a, e in zip(got, expected, strict=True):
        assert_close_to_reference(a.cpu(), e)


@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), device=devices, op=st.sampled_from(("dot", "add", "mul")))
def test_sddmm_and_its_gradients_match_float64_reference(data, dtype, device, op) -> None:
    csr = data.draw(csrs(), label="csr")
    crow, col = csr.indices(device)
    heads = data.draw(st.sampled_from((None, 1, 3)), label="H")
    n = data.draw(_CSR_N, label="D") if op == "dot" else None
    tail = tuple(t for t in (heads, n) if t is not None)
    aspec = data.draw(specs((len(csr.rows),) + tail, dtype, kinds=("moderate",)), label="a")
    bspec = data.draw(specs((csr.k,) + tail, dtype, kinds=("moderate",)), label="b")
    a, b = make(aspec, device, huge=False), make(bspec, device, huge=False)
    out = torchops.sddmm(crow, col, a, b, op, check_invariants=data.draw(st.booleans(), label="check_invariants"))
    rows = torch.repeat_interleave(torch.arange(len(csr.rows)), (crow[1:] - crow[:-1]).long().cpu())

    def reference(x, y):
        xs, ys = x[rows], y[col.long().cpu()]
        return (xs * ys).sum(-1) if op == "dot" else xs + ys if op == "add" else xs * ys

    a64, b64 = (t.requires_grad_() for t in upcast((a, b)))
    expected = reference(a64, b64)
    _check_new_output(out, expected, device)
    if any(t.isnan().any() or t.isinf().any() for t in (a, b)):
        return
    g = fill(out.numel(), dtype, Values(data.draw(st.integers(0, 2**31 - 1), label="g seed"), "moderate", 0.0))
    g = g.view(out.shape)
    leaves = [t.detach().requires_grad_() for t in (a, b)]
    got = torch.autograd.grad(torchops.sddmm(crow, col, *leaves, op), leaves, g.to(device))
    for x, e in zip(got, torch.autograd.grad(expected, (a64, b64), g.double())):
        assert_close_to_reference(x.cpu(), e)


def csr_softmax_reference(crow, values):
    rows = torch.repeat_interleave(torch.arange(crow.numel() - 1), (crow[1:] - crow[:-1]).long())
    index = rows.view((-1,) + (1,) * (values.dim() - 1)).expand_as(values)
    top = torch.zeros((crow.numel() - 1,) + tuple(values.shape[1:]), dtype=values.dtype)
    top = top.scatter_reduce(0, index, values, "amax", include_self=False)
    e = torch.exp(values - top[rows])
    return e / torch.zeros_like(top).index_add(0, rows, e)[rows]


@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), device=devices)
def test_csr_softmax_and_its_gradient_match_float64_reference(data, dtype, device) -> None:
    """Values spread over the dtype's whole range with NaN, +-inf and the rest sprinkled in: the row's
    maximum keeps exp from overflowing; a NaN (or +inf, which leaves inf - inf) makes the row NaN, as in
    torch.softmax."""
    csr = data.draw(csrs(), label="csr")
    crow, _ = csr.indices(device)
    nnz = sum(len(r) for r in csr.rows)
    shape = (nnz,) if data.draw(st.booleans(), label="1-D") else (nnz, data.draw(st.integers(1, 5), label="H"))
    values = make(data.draw(specs(shape, dtype), label="values"), device, huge=True)
    out = torchops.csr_softmax(crow, values, check_invariants=data.draw(st.booleans(), label="check_invariants"))
    c64, v64 = upcast((crow, values))
    _check_new_output(out, csr_softmax_reference(c64, v64), device)
    moderate = make(Spec(shape, dtype, data.draw(layouts(len(shape)), label="layout"),
                         Values(data.draw(st.integers(0, 2**31 - 1), label="seed"), "moderate", 0.0)), device)
    g = fill(math.prod(shape), dtype, Values(data.draw(st.integers(0, 2**31 - 1), label="g seed"), "moderate", 0.0))
    g = g.view(shape)
    leaf = moderate.detach().requires_grad_()
    (got,) = torch.autograd.grad(torchops.csr_softmax(crow, leaf), leaf, g.to(device))
    ref_leaf = upcast((moderate,))[0].requires_grad_()
    (expected,) = torch.autograd.grad(csr_softmax_reference(c64, ref_leaf), ref_leaf, g.double())
    assert_close_to_reference(got.cpu(), expected)


# ------------------------------------------------------------------------------------------ forward-mode AD

def _op_cases(data, device):
    """(name, op, reference, primals): one random case of each op for the forward-mode property."""
    shape = data.draw(shapes(max_rank=3, max_numel=200), label="shape")
    rshape = data.draw(shapes(min_rank=1, max_rank=3, min_last=1, max_numel=200), label="rms shape")
    x = lambda s: torch.randn(s, dtype=torch.float64, device=device)  # noqa: E731
    csr = data.draw(csrs(max_m=6, max_k=6), label="csr")
    crow, col = csr.indices(device)
    n = data.draw(st.integers(0, 5), label="N")
    c64, col64 = upcast((crow, col))
    values = x(col.numel())
    cases = [
        ("vector_add", torchops.vector_add, lambda a, b: a + b, (x(shape), x(shape))),
        ("swiglu", torchops.swiglu, lambda g, u: torch.nn.functional.silu(g) * u, (x(shape), x(shape))),
        ("gelu_and_mul", lambda g, u: torchops.gelu_and_mul(g, u, "tanh"),
         lambda g, u: torch.nn.functional.gelu(g, approximate="tanh") * u, (x(shape), x(shape))),
        ("rms_norm", lambda a, w: torchops.rms_norm(a, w), lambda a, w: rms_norm_reference_functional(a, w, 1e-6),
         (x(rshape), x(rshape[-1:]))),
        ("csr_spmm", lambda v, d: torchops.csr_spmm(crow, col, v, d),
         lambda v, d: csr_reference(c64, col64, v, d), (x(col.numel()), x((csr.k, n)))),
        # torch's sparse CSR constructor has no forward AD of its own (and fails inside torch.func transforms,
        # before torchops is reached): A is built outside, the tangent goes through dense only.
        ("spmm", lambda d, A=torch.sparse_csr_tensor(crow, col, values, (len(csr.rows), csr.k)): torchops.spmm(A, d),
         lambda d: csr_reference(c64, col64, values.cpu(), d), (x((csr.k, n)),)),
    ]
    heads = data.draw(st.integers(1, 3), label="H")
    hvalues, hdense = x((col.numel(), heads)), x((csr.k, heads, n))
    for reduce in ("sum", "mean", "max"):
        cases.append(("spmm_reduce", lambda v, d, r=reduce: torchops.spmm_reduce(crow, col, v, d, r),
                      lambda v, d, r=reduce: spmm_reduce_reference(c64, col64, v, d, r), (hvalues, hdense)))
    cases.append(("spmm_reduce", lambda d: torchops.spmm_reduce(crow, col, None, d, "min"),
                  lambda d: spmm_reduce_reference(c64, col64, None, d, "min"), (x((csr.k, n)),)))
    rows = torch.repeat_interleave(torch.arange(len(csr.rows)), (c64[1:] - c64[:-1]).long())
    cases.append(("sddmm", lambda a, b: torchops.sddmm(crow, col, a, b),
                  lambda a, b: (a[rows] * b[col64.long()]).sum(-1), (x((len(csr.rows), heads, n)), hdense)))
    cases.append(("sddmm", lambda a, b: torchops.sddmm(crow, col, a, b, "add"),
                  lambda a, b: a[rows] + b[col64.long()], (x((len(csr.rows), heads)), x((csr.k, heads)))))
    cases.append(("csr_softmax", lambda v: torchops.csr_softmax(crow, v), lambda v: csr_softmax_reference(c64, v),
                  (hvalues,)))
    cases.append(("layer_norm", lambda a, w, b: torchops_layer_norm(a, w, b),
                  lambda a, w, b: torch.nn.functional.layer_norm(a, a.shape[-1:], w, b, 1e-5),
                  (x(rshape), x(rshape[-1:]), x(rshape[-1:]))))
    if HAS_ADD_RMS_NORM:
        cases.append(("add_rms_norm", lambda a, r, w: MYNS.add_rms_norm.default(a, r, w)[0],
                      lambda a, r, w: rms_norm_reference_functional(a + r, w, 1e-6), (x(rshape), x(rshape), x(rshape[-1:]))))
    return cases


def torchops_layer_norm(x, weight, bias):
    return MYNS.layer_norm.default(x, weight, bias, 1e-5)


def rms_norm_reference_functional(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


# torchops.spmm is a Python wrapper: its errors come from the ops it calls (csr_spmm, and for dense's
# gradient _csr_transpose / _csr_spmm_with_transpose) or from its own checks ("torchops.spmm: ...").
SPMM_ERROR_PREFIXES = ("myns::csr_spmm: ", "myns::_csr_transpose: ", "myns::_csr_spmm_with_transpose: ", "torchops.spmm: ")


# Through autograd, max and min run _spmm_reduce_forward below spmm_reduce (its structure errors name it).
SPMM_REDUCE_ERROR_PREFIXES = ("myns::spmm_reduce: ", "myns::_spmm_reduce_forward: ")


def _prefixes(name: str) -> tuple[str, ...]:
    if name == "spmm":
        return SPMM_ERROR_PREFIXES + SPMM_REDUCE_ERROR_PREFIXES
    return SPMM_REDUCE_ERROR_PREFIXES if name == "spmm_reduce" else (f"myns::{name}: ",)


@given(data=st.data(), device=devices, api=st.sampled_from(("torch.func.jvp", "forward_ad")))
def test_forward_mode_ad_is_right_or_refused(data, device, api) -> None:
    """Every op either gives the right tangent or raises a RuntimeError naming the op and forward mode:
    never a zero or missing tangent (issue item 2)."""
    import torch.autograd.forward_ad as fwAD

    for name, op, reference, primals in _op_cases(data, device):
        tangents = tuple(torch.randn_like(p) for p in primals)
        _, expected = torch.func.jvp(reference, tuple(p.cpu() for p in primals), tuple(t.cpu() for t in tangents))
        try:
            if api == "torch.func.jvp":
                _, tangent = torch.func.jvp(op, primals, tangents)
            else:
                with fwAD.dual_level():
                    out = op(*(fwAD.make_dual(p, t) for p, t in zip(primals, tangents)))
                    tangent = fwAD.unpack_dual(out).tangent
                    if tangent is None:  # autograd's way of saying "zero"; only right if it is zero
                        tangent = torch.zeros_like(out)
        except RuntimeError as e:
            assert str(e).startswith(_prefixes(name)) and "forward" in str(e), f"{name} ({api}): {e}"
            continue
        torch.testing.assert_close(tangent.cpu(), expected, rtol=1e-9, atol=1e-9, msg=lambda m: f"{name} ({api}): {m}")


# ---------------------------------------------------------------------------------------- bad metadata

_UNSUPPORTED = (torch.bool, torch.int8, torch.uint8, torch.int16, torch.complex64, torch.float8_e4m3fn)


def _bad(dtype: torch.dtype, shape, device) -> torch.Tensor:
    return torch.zeros(shape, device=device).to(dtype) if dtype.is_floating_point or dtype.is_complex else torch.zeros(shape, dtype=dtype, device=device)


@st.composite
def other_shapes(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape different from `shape` (another rank or one dim changed)."""
    new = draw(shapes(max_numel=200))
    if new == shape:
        new = shape + (2,) if len(shape) < 5 else shape[:-1]
    return new


@st.composite
def bad_elementwise_calls(draw, device: str, fault: str):
    """(op name, fault, call, tensors, fakeable) for vector_add (also out=) and swiglu with one bad argument."""
    if fault.startswith("out") or fault == "requires grad":
        name = "vector_add_out"
    elif fault == "int swiglu":
        name = "swiglu"
    else:
        name = draw(st.sampled_from(("vector_add", "vector_add_out", "swiglu")))
    dtypes = FLOAT_DTYPES + (INT_DTYPES if name != "swiglu" else ())
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(max_numel=200))
    a = make(draw(specs(shape, dtype)), device)
    b = make(draw(specs(shape, dtype)), device)
    out = torch.empty(shape, dtype=dtype, device=device)
    which = draw(st.integers(0, 1))
    if fault == "shape":
        bad = torch.zeros(draw(other_shapes(shape)), dtype=dtype, device=device)
        a, b = (bad, b) if which == 0 else (a, bad)
    elif fault == "dtype":
        bad = (a if which == 0 else b).to(draw(st.sampled_from([t for t in dtypes if t != dtype])))
        a, b = (bad, b) if which == 0 else (a, bad)
    elif fault == "unsupported":
        bad_dtype = draw(st.sampled_from(_UNSUPPORTED + (INT_DTYPES if name == "swiglu" else ())))
        a, b = _bad(bad_dtype, shape, device), _bad(bad_dtype, shape, device)
        out = _bad(bad_dtype, shape, device)
    elif fault == "device":
        bad = (a if which == 0 else b).to(OTHER_DEVICE[device])
        a, b = (bad, b) if which == 0 else (a, bad)
    elif fault == "out dtype":
        out = out.to(draw(st.sampled_from([t for t in dtypes if t != dtype])))
    elif fault == "out device":
        out = out.to(OTHER_DEVICE[device])
    elif fault == "requires grad":
        if not dtype.is_floating_point:
            a, b = a.double(), b.double()
            out = out.double()
        a = a.detach().requires_grad_()
    elif fault == "int swiglu":
        t = draw(st.sampled_from(INT_DTYPES))
        a, b = a.to(t), b.to(t)
    calls = {
        "vector_add": lambda: torchops.vector_add(a, b),
        "vector_add_out": lambda: torchops.vector_add(a, b, out=out),
        "swiglu": lambda: torchops.swiglu(a, b),
    }
    fakeable = fault not in ("requires grad",)
    return name, fault, calls[name], (a, b, out), fakeable


@st.composite
def bad_norm_calls(draw, device: str, fault: str):
    if fault.startswith("residual"):
        name = "add_rms_norm"
    elif fault.startswith("bias"):
        name = "layer_norm"
    else:
        name = draw(st.sampled_from(("rms_norm", "layer_norm") + (("add_rms_norm",) if HAS_ADD_RMS_NORM else ())))
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    shape = draw(shapes(min_rank=1, min_last=1, max_numel=200))
    n = shape[-1]
    x = make(draw(specs(shape, dtype)), device)
    residual = make(draw(specs(shape, dtype)), device)
    weight = torch.randn(n, device=device).to(dtype)
    if fault == "0-dim":
        x = residual = torch.randn((), device=device).to(dtype)
    elif fault == "empty rows":
        x = residual = torch.zeros(shape[:-1] + (0,), dtype=dtype, device=device)
    elif fault == "int input":
        x = residual = torch.zeros(shape, dtype=draw(st.sampled_from(INT_DTYPES + _UNSUPPORTED)), device=device)
    elif fault == "weight size":
        weight = torch.randn(draw(st.integers(0, 70).filter(lambda s: s != n)), device=device).to(dtype)
    elif fault == "weight rank":
        weight = weight.view(draw(st.sampled_from(((1, n), (n, 1), ()))) if n == 1 else (1, n))
        if weight.dim() == 1:
            weight = weight.view(1, 1)
    elif fault == "weight dtype":
        allowed = {dtype, torch.float32} if dtype in HALF_DTYPES else {dtype}
        weight = weight.to(draw(st.sampled_from([t for t in FLOAT_DTYPES + INT_DTYPES if t not in allowed])))
    elif fault == "weight device":
        weight = weight.to(OTHER_DEVICE[device])
    elif fault == "input device":
        x = x.to(OTHER_DEVICE[device])
    bias = draw(st.sampled_from((None, weight))) if name == "layer_norm" else None
    if fault == "bias size":
        bias = torch.randn(draw(st.integers(0, 70).filter(lambda s: s != n)), device=device).to(weight.dtype)
    elif fault == "bias dtype":
        allowed = {dtype, torch.float32} if dtype in HALF_DTYPES else {dtype}
        bias = weight.to(draw(st.sampled_from([t for t in FLOAT_DTYPES + INT_DTYPES if t not in allowed])))
        weight = None  # (with a weight of another dtype the pair's own dtype check could speak first)
    elif fault == "residual shape":
        residual = torch.zeros(draw(other_shapes(shape)), dtype=dtype, device=device)
    elif fault == "residual dtype":
        residual = residual.to(draw(st.sampled_from([t for t in FLOAT_DTYPES if t != dtype])))
    elif fault == "residual device":
        residual = residual.to(OTHER_DEVICE[device])
    if name == "rms_norm":
        return name, fault, lambda: MYNS.rms_norm.default(x, weight, 1e-6), (x, weight), True
    if name == "layer_norm":
        return name, fault, lambda: MYNS.layer_norm.default(x, weight, bias, 1e-5), (x, weight, bias), True
    return name, fault, lambda: MYNS.add_rms_norm.default(x, residual, weight, 1e-6), (x, residual, weight), True


@st.composite
def bad_csr_metadata_calls(draw, device: str, fault: str):
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    csr = draw(csrs(max_m=6, max_k=6))
    crow, col = csr.indices(device)
    n = draw(st.integers(0, 5))
    v = torch.randn(col.numel(), device=device).to(dtype)
    d = torch.randn(csr.k, n, device=device).to(dtype)
    other = {torch.int32: torch.int64, torch.int64: torch.int32}[csr.index_dtype]
    if fault == "index dtypes differ":
        col = col.to(other)
    elif fault == "float indices":
        crow, col = crow.float(), col.float()
    elif fault == "crow 2-D":
        crow = crow.view(1, -1)
    elif fault == "crow empty":
        crow = crow[:0]
    elif fault == "col 2-D":
        col, v = col.view(-1, 1), v
    elif fault == "values 2-D":
        v = v.view(-1, 1)
    elif fault == "values length":
        v = torch.randn(col.numel() + draw(st.sampled_from((1, 2, 7))), device=device).to(dtype)
    elif fault == "dense rank":
        d = torch.randn(draw(st.sampled_from(((csr.k,), (csr.k, n, 2), ()))), device=device).to(dtype)
    elif fault == "dtypes differ":
        d = d.to(draw(st.sampled_from([t for t in FLOAT_DTYPES if t != dtype])))
    elif fault == "int values":
        v, d = v.to(torch.int32), d.to(torch.int32)
    elif fault == "unsupported values":
        t = draw(st.sampled_from(_UNSUPPORTED))
        v, d = _bad(t, v.shape, device), _bad(t, d.shape, device)
    elif fault == "values device":
        v = v.to(OTHER_DEVICE[device])
    elif fault == "dense device":
        d = d.to(OTHER_DEVICE[device])
    elif fault == "index device":
        crow, col = crow.to(OTHER_DEVICE[device]), col.to(OTHER_DEVICE[device])
    check = draw(st.booleans())
    return "csr_spmm", fault, lambda: torchops.csr_spmm(crow, col, v, d, check_invariants=check), (crow, col, v, d), not check


@st.composite
def bad_sparse_op_calls(draw, device: str, fault: str):
    """spmm_reduce, sddmm and csr_softmax with one bad argument."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    csr = draw(csrs(max_m=6, max_k=6))
    crow, col = csr.indices(device)
    m, n, nnz = len(csr.rows), draw(st.integers(0, 5)), col.numel()
    other = {torch.int32: torch.int64, torch.int64: torch.int32}[csr.index_dtype]
    v, d = torch.randn(nnz, device=device).to(dtype), torch.randn(csr.k, 2, n, device=device).to(dtype)
    reduce = draw(st.sampled_from(REDUCES))
    if fault.startswith("softmax"):
        values = torch.randn(nnz, 2, device=device).to(dtype)
        if fault == "softmax values 3-D":
            values = values.view(nnz, 2, 1)
        elif fault == "softmax int values":
            values = values.to(draw(st.sampled_from(INT_DTYPES + _UNSUPPORTED)))
        elif fault == "softmax index device":
            crow = crow.to(OTHER_DEVICE[device])
        return "csr_softmax", fault, lambda: torchops.csr_softmax(crow, values), (crow, values), True
    if fault.startswith("sddmm"):
        a, b = torch.randn(m, 2, n, device=device).to(dtype), d
        op = "dot"
        if fault == "sddmm op":
            op = draw(st.sampled_from(("sum", "DOT", "", "matmul")))
        elif fault == "sddmm a rows":
            a = torch.randn(m + draw(st.sampled_from((1, 3))), 2, n, device=device).to(dtype)
        elif fault == "sddmm trailing":
            b = torch.randn(csr.k, 3, n, device=device).to(dtype)
        elif fault == "sddmm b device":
            b = b.to(OTHER_DEVICE[device])
        return "sddmm", fault, lambda: torchops.sddmm(crow, col, a, b, op), (crow, col, a, b), True
    if fault == "index dtypes differ":
        col = col.to(other)
    elif fault == "values 3-D":
        v = v.view(-1, 1, 1)
    elif fault == "values length":
        v = torch.randn(nnz + draw(st.sampled_from((1, 2, 7))), device=device).to(dtype)
    elif fault == "dense rank":
        d = torch.randn(draw(st.sampled_from(((csr.k,), (csr.k, 2, n, 1), ()))), device=device).to(dtype)
    elif fault == "int dense":
        v, d = v.to(torch.int32), d.to(draw(st.sampled_from(INT_DTYPES + _UNSUPPORTED)))
    elif fault == "heads mismatch":
        v = torch.randn(nnz, draw(st.sampled_from((1, 3))), device=device).to(dtype)
    elif fault == "reduce":
        reduce = draw(st.sampled_from(("amax", "avg", "", "SUM")))
    elif fault == "values device":
        v = v.to(OTHER_DEVICE[device])
    check = draw(st.booleans())
    call = lambda: torchops.spmm_reduce(crow, col, v, d, reduce, check_invariants=check)  # noqa: E731
    return "spmm_reduce", fault, call, (crow, col, v, d), not check


# Words the message must hold for each fault: the argument at fault and what is wrong with it.
FAULT_WORDS: dict[str, tuple[str, ...]] = {
    "shape": ("shape",), "dtype": ("dtype",), "unsupported": ("unsupported dtype",), "device": ("device",),
    "out dtype": ("out", "dtype"), "out device": ("out", "device"),
    "requires grad": ("grad",), "int swiglu": ("unsupported dtype",),
    "0-dim": ("input", "dimension"), "empty rows": ("input", "dimension"), "int input": ("input", "unsupported dtype"),
    "weight size": ("weight",), "weight rank": ("weight",), "weight dtype": ("weight", "dtype"),
    "weight device": ("weight", "device"), "input device": ("device",), "residual shape": ("residual", "shape"),
    "residual dtype": ("residual", "dtype"), "residual device": ("residual", "device"), "bias size": ("bias",),
    "bias dtype": ("bias", "dtype"),
    "index dtypes differ": ("crow_indices", "col_indices", "dtype"), "float indices": ("indices", "unsupported dtype"),
    "crow 2-D": ("crow_indices",), "crow empty": ("crow_indices",), "col 2-D": ("col_indices",),
    "values 2-D": ("values",), "values length": ("values",), "dense rank": ("dense",), "dtypes differ": ("dtype",),
    "int values": ("values", "unsupported dtype"), "unsupported values": ("unsupported dtype",),
    "values device": ("device",), "dense device": ("device",), "index device": ("device",),
    "values 3-D": ("values",), "int dense": ("dense", "unsupported dtype"), "heads mismatch": ("values", "dense"),
    "reduce": ("reduce",), "sddmm op": ("op",), "sddmm a rows": ("a", "rows"), "sddmm trailing": ("a", "b"),
    "sddmm b device": ("device",), "softmax values 3-D": ("values",),
    "softmax int values": ("values", "unsupported dtype"), "softmax index device": ("device",),
}


def _assert_named_error(name: str, fault: str, call: Callable[[], Any]) -> None:
    with pytest.raises(RuntimeError) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"myns::{name}: "), f"{fault}: {message}"
    assert all(w in message for w in FAULT_WORDS[fault]), f"{fault}: the message must mention {FAULT_WORDS[fault]}: {message}"


_FAULTS = {
    "elementwise": ("shape", "dtype", "unsupported", "device", "out dtype", "out device", "requires grad",
                    "int swiglu"),  # (an out of another shape is resized, as torch.add(out=) does)
    "norm": ("0-dim", "empty rows", "int input", "weight size", "weight rank", "weight dtype", "weight device",
             "input device", "bias size", "bias dtype")
            + (("residual shape", "residual dtype", "residual device") if HAS_ADD_RMS_NORM else ()),
    "csr": ("index dtypes differ", "float indices", "crow 2-D", "crow empty", "col 2-D", "values 2-D", "values length",
            "dense rank", "dtypes differ", "int values", "unsupported values", "values device", "dense device",
            "index device"),
    "sparse": ("index dtypes differ", "values 3-D", "values length", "dense rank", "int dense", "heads mismatch",
               "reduce", "values device", "sddmm op", "sddmm a rows", "sddmm trailing", "sddmm b device",
               "softmax values 3-D", "softmax int values", "softmax index device"),
}


@pytest.mark.parametrize("kind,fault", [(k, f) for k, faults in _FAULTS.items() for f in faults])
@settings(max_examples=max(settings.default.max_examples // 4, 10))  # per fault: cheap, and many faults
@given(data=st.data(), device=devices)
def test_bad_metadata_raises_a_named_error_also_when_traced(data, device, kind, fault) -> None:
    """Metadata errors (shapes, dtypes, devices, ranks, lengths) raise `myns::<op>: ...` naming the argument
    at fault, in eager mode (also with check_invariants=True) and from the fake kernels (what torch.compile
    and torch.export run)."""
    strategy = {"elementwise": bad_elementwise_calls, "norm": bad_norm_calls, "csr": bad_csr_metadata_calls,
                "sparse": bad_sparse_op_calls}[kind]
    name, fault, call, tensors, fakeable = data.draw(strategy(device, fault), label="call")
    note(f"{name}: {fault}: " + ", ".join(f"{tuple(t.shape)} {t.dtype} {t.device}" for t in tensors if t is not None))
    _assert_named_error(name, fault, call)
    if fakeable and not any(t is not None and t.device.type == "meta" for t in tensors):
        with FakeTensorMode(allow_non_fake_inputs=True):
            _assert_named_error(name, fault, call)


# ------------------------------------------------------------------ crash-prone properties, in a subprocess

def _run_property_in_subprocess(function: str, tmp_path) -> str:
    """Runs `function` (a @given property of this module) in a fresh interpreter with the same profile. Each
    example writes its description to a file first, so a crash still names the example that caused it."""
    case_file = tmp_path / "last_case.txt"
    code = f"""
        import os, sys, faulthandler
        faulthandler.enable()
        sys.path.insert(0, "tests")
        os.environ["TORCHOPS_PROPERTY_CASE_FILE"] = {str(case_file)!r}
        import test_properties
        test_properties.{function}()
        print("ok")
    """
    try:
        return run_python(textwrap.dedent(code), timeout=600)
    except AssertionError as e:
        last = case_file.read_text() if case_file.exists() else "(none recorded)"
        raise AssertionError(f"{e}\nlast example started:\n{last}") from None


def _record(case: str) -> None:
    path = os.environ.get("TORCHOPS_PROPERTY_CASE_FILE")
    if path:
        with open(path, "w") as f:
            f.write(case)


@st.composite
def malformed_csr(draw):
    """(description, crow, col, K): a CSR structure with exactly one kind of damage."""
    csr = draw(csrs(max_m=8, max_k=8))
    crow, col = (t.tolist() for t in csr.indices("cpu"))
    k, m, nnz = csr.k, len(csr.rows), len(col)
    info = torch.iinfo(csr.index_dtype)
    big = st.sampled_from((info.max, info.min, info.max // 2, -1, -2))
    faults = ["crow[0] != 0", "last != nnz", "col too short", "col too long"]
    if m >= 2:
        faults.append("decreasing")
    if nnz:
        faults += ["col >= K", "col < 0"]
    fault = draw(st.sampled_from(faults))
    if fault == "crow[0] != 0":
        delta = draw(st.one_of(st.integers(1, 5), st.integers(-5, -1), big.filter(lambda x: x != 0)))
        crow[0] = max(min(crow[0] + delta, info.max), info.min)
    elif fault == "last != nnz":
        crow[-1] = max(min(crow[-1] + draw(st.one_of(st.integers(1, 5), st.integers(-5, -1), big)), info.max), info.min)
        if crow[-1] == nnz:
            crow[-1] += 1
    elif fault == "col too short":
        if not nnz:
            crow[-1], col = 1, []
        else:
            col = col[: draw(st.integers(0, nnz - 1))]
    elif fault == "col too long":
        col = col + draw(st.lists(st.integers(0, max(k - 1, 0)), min_size=1, max_size=5))
    elif fault == "decreasing":
        i = draw(st.integers(1, m - 1))
        crow[i] = draw(st.one_of(st.integers(crow[i + 1] + 1, crow[i + 1] + 9), st.just(info.max)))
    elif fault == "col >= K":
        col[draw(st.integers(0, nnz - 1))] = draw(st.one_of(st.integers(k, k + 5), st.just(info.max)))
    else:
        col[draw(st.integers(0, nnz - 1))] = draw(st.one_of(st.integers(-5, -1), st.just(info.min)))
    return fault, torch.tensor(crow, dtype=csr.index_dtype), torch.tensor(col, dtype=csr.index_dtype), k


@settings(max_examples=5 * settings.default.max_examples)
@given(case=malformed_csr(), path=st.sampled_from(("csr_spmm", "check_invariants", "spmm", "spmm with grad",
                                                   "_csr_transpose", "sddmm", "check_invariants on meta",
                                                   "spmm_reduce", "spmm_reduce with grad", "spmm max with grad",
                                                   "sddmm check_invariants", "csr_softmax",
                                                   "csr_softmax check_invariants")),
       n=st.integers(0, 5), reduce=st.sampled_from(REDUCES))
def malformed_csr_property(case, path, n, reduce) -> None:
    """Malformed CSR on the CPU raises `myns::<op>: ...`: never a crash, never a result (check_invariants on
    meta tensors may skip the data checks, which need the values, but must not fail in another way).
    csr_softmax reads no columns: damage to col_indices' entries alone leaves it a valid call."""
    fault, crow, col, k = case
    _record(f"{path}: {fault}: crow={crow.tolist()} col={col.tolist()} K={k} N={n} reduce={reduce}")
    values, dense = torch.randn(col.numel(), dtype=torch.float64), torch.randn(k, n, dtype=torch.float64)
    m = crow.numel() - 1
    name = "csr_spmm"
    if path == "csr_spmm":
        call = lambda: torchops.csr_spmm(crow, col, values, dense)  # noqa: E731
    elif path == "check_invariants":
        call = lambda: torchops.csr_spmm(crow, col, values, dense, check_invariants=True)  # noqa: E731
    elif path == "check_invariants on meta":
        meta = [t.to("meta") for t in (crow, col, values, dense)]
        try:
            out = torchops.csr_spmm(*meta, check_invariants=True)
        except RuntimeError as e:
            assert str(e).startswith("myns::csr_spmm: "), f"{fault}: {e}"
            return
        assert out.device.type == "meta"
        return
    elif path in ("spmm", "spmm with grad"):
        A = torch.sparse_csr_tensor(crow, col, values, (max(m, 0), k), check_invariants=False)
        d = dense.requires_grad_(path == "spmm with grad")
        name, call = "spmm", lambda: torchops.spmm(A, d)  # noqa: E731
    elif path == "_csr_transpose":
        name, call = "_csr_transpose", lambda: MYNS._csr_transpose.default(crow, col, k)  # noqa: E731
    elif path.startswith("spmm_reduce") or path == "spmm max with grad":
        d = dense.requires_grad_(path.endswith("with grad"))
        r = "max" if path == "spmm max with grad" else reduce
        name, call = "spmm_reduce", lambda: torchops.spmm_reduce(crow, col, values, d, r)  # noqa: E731
    elif path.startswith("sddmm"):
        a = torch.randn(max(m, 0), n, dtype=torch.float64)
        check = path.endswith("check_invariants")
        name, call = "sddmm", lambda: torchops.sddmm(crow, col, a, dense, check_invariants=check)  # noqa: E731
    else:
        check = path.endswith("check_invariants")
        try:
            torchops.csr_softmax(crow, values, check_invariants=check)
        except RuntimeError as e:
            assert str(e).startswith("myns::csr_softmax: "), f"{fault}: {e}"
            assert fault not in ("col >= K", "col < 0"), f"{fault}: csr_softmax reads no column: {e}"
            return
        assert fault in ("col >= K", "col < 0"), f"{path}: {fault}: no error"
        return
    try:
        call()
    except RuntimeError as e:
        assert str(e).startswith(_prefixes(name)), f"{fault}: {e}"
        return
    raise AssertionError(f"{path}: {fault}: no error")


@st.composite
def out_views(draw):
    """(a, b, out) of one shape, each a fresh tensor or a view into one shared storage buffer (so out may
    be a or b, share no element with them, or overlap them), each maybe carrying the negative bit."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES + INT_DTYPES))
    shape = draw(shapes(max_rank=3, max_numel=60))
    storage = 200
    base = Values(draw(st.integers(0, 2**31 - 1)), "moderate", 0.0)  # the shared buffer's values

    def view(role: str, expand: bool):
        how = draw(st.sampled_from(("fresh", "shared", "shared", "same as a", "same as b") if role == "out" else ("fresh", "shared", "shared")))
        lay = draw(layouts(len(shape), expand=expand))
        strides = lay.strides(shape)
        extent = 0 if 0 in shape else 1 + sum((s - 1) * st for s, st in zip(shape, strides))
        if how == "shared" and lay.offset + extent <= storage:
            offset = draw(st.integers(0, storage - extent)) if extent else 0
            geometry = ("shared", strides, offset)
        elif how.startswith("same as"):
            geometry = how
        else:
            geometry = ("fresh", lay, draw(st.integers(0, 2**31 - 1)))
        neg = dtype.is_floating_point and draw(st.integers(0, 3)) == 0
        return geometry, neg

    a, b = view("a", True), view("b", True)
    out = view("out", draw(st.integers(0, 6)) == 0)
    return dtype, shape, base, a, b, out


def _build(dtype, shape, base, views):
    made = []
    for geometry, neg in views:
        if geometry == "same as a" or geometry == "same as b":
            t = made[0 if geometry == "same as a" else 1]
            t = t.as_strided(t.shape, t.stride(), t.storage_offset())  # another tensor, the same elements
            t = torch._neg_view(t) if neg and not t.is_neg() else t
        elif geometry[0] == "shared":
            t = base.as_strided(shape, geometry[1], geometry[2])
            t = torch._neg_view(t) if neg else t
        else:
            t = make(Spec(shape, dtype, geometry[1], Values(geometry[2], "moderate", 0.0)), "cpu")
            t = torch._neg_view(t) if neg else t
        made.append(t)
    return made


def overlap_besides_identical(e_out: torch.Tensor, inputs, shares) -> bool:
    """Whether out shares elements with an input it is not identical to."""
    return any(s and not torch.equal(e_out, _elements(t)) and torch.isin(e_out, _elements(t)).any()
               for s, t in zip(shares, inputs))


def _elements(t: torch.Tensor) -> torch.Tensor:
    """The storage index of each of t's elements."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.arange(n).as_strided(t.shape, t.stride(), t.storage_offset()).contiguous()


# Cheap examples, each in one fresh interpreter: five times the profile's count.
@settings(max_examples=5 * settings.default.max_examples)
@given(setup=out_views())
def out_overlap_property(setup) -> None:
    """vector_add(a, b, out=...): an out that shares no element with a and b, or that torch.add takes as
    in-place (out is a or b), is accepted and gets a + b; out with internal overlap raises a named error;
    any other overlap raises a named error or gives a + b as if the inputs had been copied first. The
    negative bit on any argument is honoured. Storage outside out's elements is never written."""
    dtype, shape, base, va, vb, vout = setup
    a, b, out = _build(dtype, shape, fill(200, dtype, base), (va, vb, vout))
    _record(f"{dtype} {shape}: a={va} b={vb} out={vout}")
    expected = a.clone().resolve_neg() + b.clone().resolve_neg() if dtype.is_floating_point else a + b

    def raw(t):  # the storage of t as plain numbers, whatever t's bits
        s = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
        return torch._neg_view(s).resolve_neg() if t.is_neg() else s.clone()

    out_raw_before = raw(out)
    e_out = _elements(out)
    shares = [a.untyped_storage().data_ptr() == out.untyped_storage().data_ptr(),
              b.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()]
    overlap = any(s and torch.isin(e_out, _elements(t)).any() for s, t in zip(shares, (a, b)))
    identical = any(s and torch.equal(e_out, _elements(t)) for s, t in zip(shares, (a, b)))
    internal = out.numel() > 1 and torch.unique(e_out).numel() < out.numel()
    in_place = identical and not overlap_besides_identical(e_out, (a, b), shares)
    if in_place:  # accepted where torch.add takes it
        ta, tb, tout = _build(dtype, shape, fill(200, dtype, base), (va, vb, vout))
        try:
            torch.add(ta, tb, out=tout)
        except RuntimeError:
            in_place = False
    must_accept = not internal and (not overlap or in_place)
    try:
        torchops.vector_add(a, b, out=out)
    except RuntimeError as e:
        assert str(e).startswith("myns::vector_add_out: "), e
        assert not must_accept, f"refused an out= that shares no element with the inputs or is one of them: {e}"
        return
    assert not internal, "out with internal overlap must be refused"
    torch.testing.assert_close(out.resolve_neg() if out.is_neg() else out, expected, rtol=0, atol=0, equal_nan=True)
    # Nothing outside out's elements changed.
    out_raw_after = raw(out)
    outside = torch.ones(out_raw_before.shape, dtype=torch.bool)
    outside[e_out.reshape(-1)] = False
    torch.testing.assert_close(out_raw_after[outside], out_raw_before[outside], rtol=0, atol=0, equal_nan=True)


@pytest.mark.slow
def test_malformed_csr_raises_named_errors_in_a_subprocess(tmp_path) -> None:
    assert _run_property_in_subprocess("malformed_csr_property", tmp_path).strip().endswith("ok")


@pytest.mark.slow
def test_out_overlap_and_math_bits_in_a_subprocess(tmp_path) -> None:
    assert _run_property_in_subprocess("out_overlap_property", tmp_path).strip().endswith("ok")


# ------------------------------------------------------------------------ the repros, one by one

def test_item1_spmm_gradient_after_in_place_structure_change() -> None:
    crow = torch.tensor([0, 2, 3, 4])
    col = torch.tensor([0, 1, 2, 0])
    A = torch.sparse_csr_tensor(crow, col, torch.tensor([1.0, 2, 3, 4]), (3, 3))
    d = torch.ones(3, 1, requires_grad=True)
    torchops.spmm(A, d).sum().backward()
    d.grad = None
    col.copy_(torch.tensor([0, 2, 2, 1]))
    torchops.spmm(A, d).sum().backward()
    assert d.grad.flatten().tolist() == [1.0, 4.0, 5.0]


@pytest.mark.parametrize("via", ["csr_spmm", "spmm"])
def test_item2_forward_ad_through_csr_spmm_is_right_or_refused(via) -> None:
    import torch.autograd.forward_ad as fwAD

    crow, col = torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1])
    v, d = torch.randn(3, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    tv, td = torch.randn_like(v), torch.randn_like(d)
    if via == "spmm":  # torch's sparse CSR constructor has no forward AD: the tangent goes through dense
        A = torch.sparse_csr_tensor(crow, col, v, (2, 3))
        op, primals, tangents = (lambda d: torchops.spmm(A, d)), (d,), (td,)
        expected = torchops.csr_spmm(crow, col, v, td)
    else:
        op, primals, tangents = (lambda v, d: torchops.csr_spmm(crow, col, v, d)), (v, d), (tv, td)
        expected = torchops.csr_spmm(crow, col, tv, d) + torchops.csr_spmm(crow, col, v, td)  # bilinear
    assert expected.abs().sum() > 0
    try:
        _, tangent = torch.func.jvp(op, primals, tangents)
    except RuntimeError as e:
        assert str(e).startswith(_prefixes(via)) and "forward" in str(e), e
    else:
        torch.testing.assert_close(tangent, expected)
    try:
        with fwAD.dual_level():
            tangent = fwAD.unpack_dual(op(*(fwAD.make_dual(p, t) for p, t in zip(primals, tangents)))).tangent
    except RuntimeError as e:
        assert str(e).startswith(_prefixes(via)) and "forward" in str(e), e
    else:
        assert tangent is not None, "forward_ad dropped the tangent"
        torch.testing.assert_close(tangent, expected)


def test_item3_check_invariants_messages() -> None:
    crow, col, v = torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1]), torch.randn(3)
    with pytest.raises(RuntimeError) as info:
        torchops.csr_spmm(crow, col, v, torch.randn(3), check_invariants=True)
    assert str(info.value).startswith("myns::csr_spmm: dense must be 2-D, got shape [3]"), info.value
    meta = [t.to("meta") for t in (crow, col, v, torch.randn(3, 4))]
    try:
        out = torchops.csr_spmm(*meta, check_invariants=True)
    except RuntimeError as e:  # either skip the data checks on meta tensors or say why not, naming the op
        assert str(e).startswith("myns::csr_spmm: "), e
    else:
        assert out.shape == (2, 4) and out.device.type == "meta"
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (crow, col, v, torch.randn(3, 4))]
        try:
            out = torchops.csr_spmm(*fake, check_invariants=True)
        except RuntimeError as e:
            assert str(e).startswith("myns::csr_spmm: "), e
        else:
            assert out.shape == (2, 4)


@pytest.mark.slow
def test_item4_out_with_math_bits_in_a_subprocess() -> None:
    out = run_python("""
        import torch, torchops
        a, b = torch.randn(4), torch.randn(4)
        for make in (lambda z: z.conj().imag, lambda z: torch._neg_view(z.real), lambda z: z.conj().real):
            z = torch.zeros(4, dtype=torch.complex64)
            view = make(z)
            assert torchops.vector_add(a, b, out=view) is view
            torch.testing.assert_close(view, a + b, rtol=0, atol=0)
            torchops.vector_add(a, b, out=view)  # the same call again: the process is not left corrupt
            torch.testing.assert_close(view, a + b, rtol=0, atol=0)
            torch.testing.assert_close(torchops.vector_add(a, b), a + b, rtol=0, atol=0)
        # an input with the negative bit is read as its value
        torch.testing.assert_close(torchops.vector_add(torch._neg_view(a), b), b - a, rtol=0, atol=0)
        try:  # a complex out (conjugate bit) is an unsupported dtype, named
            torchops.vector_add(a.to(torch.complex64), b.to(torch.complex64), out=torch.zeros(4, dtype=torch.complex64).conj())
        except RuntimeError as e:
            assert str(e).startswith("myns::vector_add_out: "), e
        else:
            raise AssertionError("complex out accepted")
        print("ok")
    """)
    assert out.strip() == "ok"


def test_item5_out_strided_disjoint_from_input_in_the_same_storage() -> None:
    x = torch.arange(16, dtype=torch.float32)
    y = torch.randn(8)
    expected = x[1::2] + y
    odd = x[1::2].clone()
    assert torchops.vector_add(x[1::2], y, out=x[0::2]) is not None
    torch.testing.assert_close(x[0::2], expected, rtol=0, atol=0)
    torch.testing.assert_close(x[1::2], odd, rtol=0, atol=0)
