"""op_db rows of the norm ops."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from helpers import FLOAT_DTYPES, HALF_DTYPES, make_layout, random_tensor
from op_db.core import ErrorInput, OpInfo, Sample, _grad, expect  # noqa: F401
from op_db.elementwise import _CUDA_VS_CPU  # noqa: F401


# ------------------------------------------------------------------------------------------------ rms_norm
# (shape, input layout, weight, eps, weight_offset). Layouts beyond make_layout's: "row_sliced" (rows of a wider tensor:
# a row stride, dense last dim, read in place) and "offset" rows (misaligned for 16-byte vectors). Weights:
# None, "same" (input's dtype), "f32" (float32 with 16-bit input; input's dtype otherwise), "strided".
# N covers 1, odd sizes missing every vector width, both sides of the CUDA warp/block-per-row switch
# (2048 elements for 16-bit, 1024 f32, 512 f64), a large N (8192 + 3) and rows the CUDA backward splits over
# a thread-block cluster (16400: 3 blocks for 16-bit and f32), so the generic and sanitizer runs reach it.
_RMS_NORM_CASES: list[tuple[tuple[int, ...], str, str | None, float, float]] = [
    ((4, 1), "contiguous", "same", 1e-6, 0.0),
    ((3, 7), "contiguous", None, 1e-6, 0.0),
    ((5, 33), "contiguous", "same", 1e-5, 0.0),
    ((6, 64), "contiguous", "f32", 1e-6, 1.0),
    ((3, 1000), "contiguous", "same", 1e-6, 0.0),
    ((2, 1001), "offset", "f32", 1e-6, -0.5),
    ((3, 2048), "contiguous", "same", 1e-6, 1.0),
    ((2, 2056), "contiguous", "f32", 1e-6, 0.0),
    ((2, 8195), "contiguous", "same", 1e-6, 0.0),
    ((2, 8192), "row_sliced", "f32", 0.1, 1.0),
    ((3, 16400), "contiguous", "same", 1e-6, 0.5),
    ((300, 16), "contiguous", "same", 1e-6, -0.5),
    ((0, 16), "contiguous", "same", 1e-6, 0.0),
    ((2, 0, 8), "contiguous", None, 1e-6, 0.0),
    ((16,), "contiguous", "same", 1e-6, 1.0),
    ((2, 3, 40), "contiguous", "same", 0.0, 0.0),
    ((2, 3, 40), "permuted", "same", 1e-6, 0.0),
    ((24, 10), "transposed", "strided", 1e-6, 1.0),
    ((9, 48), "row_sliced", None, 1e-6, 0.0),
    ((5, 24), "expanded", "same", 1e-6, 0.0),
]


def _rms_norm_input(shape: tuple[int, ...], dtype: torch.dtype, device: str, layout: str) -> torch.Tensor:
    if layout == "row_sliced":
        return random_tensor(shape[:-1] + (shape[-1] + 5,), dtype, device)[..., : shape[-1]]
    return make_layout(shape, dtype, device, layout)


def _rms_norm_weight(kind: str | None, n: int, dtype: torch.dtype, device: str) -> torch.Tensor | None:
    if kind is None:
        return None
    if kind == "f32" and dtype in HALF_DTYPES:
        return random_tensor((n,), torch.float32, device)
    if kind == "strided":
        return random_tensor((2 * n,), dtype, device)[::2]
    return random_tensor((n,), dtype, device)


def _rms_norm_args(device: str, dtype: torch.dtype, requires_grad: bool):
    for shape, layout, weight_kind, eps, offset in _RMS_NORM_CASES:
        x = _grad(_rms_norm_input(shape, dtype, device, layout), requires_grad)
        w = _rms_norm_weight(weight_kind, shape[-1], dtype, device)
        w = None if w is None else _grad(w, requires_grad)
        wdesc = "no weight" if w is None else f"weight {str(w.dtype).removeprefix('torch.')}"
        yield x, w, eps, offset, f"{shape} {layout}, {wdesc}, eps={eps}, weight_offset={offset}"


def rms_norm_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    x = _grad(random_tensor((4, 12), dtype, device), requires_grad)
    w = _grad(random_tensor((12,), dtype, device), requires_grad)
    return rms_norm_forward_samples(device, dtype, requires_grad) + [
        Sample((x,), desc="(4, 12), weight, eps and weight_offset defaulted"),
        Sample((x, w, 1e-6, 0.0), desc="(4, 12), weight_offset 0 given"),
    ]


def rms_norm_reference(input: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
                       weight_offset: float = 0.0) -> torch.Tensor:
    rstd = torch.rsqrt(input.pow(2).mean(-1, keepdim=True) + eps)
    out = input * rstd
    return out if weight is None else out * (weight + weight_offset)


def rms_norm_forward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    return [Sample((x, w, eps, offset), desc=desc)
            for x, w, eps, offset, desc in _rms_norm_args(device, dtype, requires_grad)]


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def rms_norm_forward_reference(input: torch.Tensor, weight: torch.Tensor | None, eps: float,
                               weight_offset: float = 0.0) -> tuple[torch.Tensor, ...]:
    rstd = torch.rsqrt(input.pow(2).mean(-1) + eps)
    return rms_norm_reference(input, weight, eps, weight_offset), rstd


def rms_norm_forward_dtypes(sample: Sample) -> tuple[torch.dtype, ...]:
    dtype = sample.args[0].dtype
    return dtype, _stat_dtype(dtype)


def _rstd(x: torch.Tensor, eps: float) -> torch.Tensor:
    xs = x.detach().to(_stat_dtype(x.dtype))
    return torch.rsqrt(xs.pow(2).mean(-1) + eps)


def rms_norm_backward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    masks = [(True, True), (True, False), (False, True), (False, False)]
    for i, (x, w, eps, offset, desc) in enumerate(_rms_norm_args(device, dtype, False)):
        # grad_out in the other layout family, so dy and x take different paths when one is copied.
        dy = _rms_norm_input(tuple(x.shape), dtype, device, "row_sliced" if x.is_contiguous() else "contiguous")
        input_grad, weight_grad = masks[i % len(masks)]
        weight_grad = weight_grad and w is not None
        samples.append(Sample((dy, x, w, _rstd(x, eps), input_grad, weight_grad, offset),
                              desc=f"{desc}, input_grad={input_grad}, weight_grad={weight_grad}"))
    return samples


def _rms_norm_grads(grad_out, input, weight, rstd, weight_offset):
    n = input.shape[-1]
    r = rstd.unsqueeze(-1)
    g = grad_out if weight is None else grad_out * (weight + weight_offset)
    s = (g * input).sum(-1, keepdim=True)
    return r * g - input * r.pow(3) / n * s, (grad_out * input * r).reshape(-1, n).sum(0)


def rms_norm_backward_reference(grad_out, input, weight, rstd, input_grad, weight_grad, weight_offset=0.0):
    grad_input, grad_weight = _rms_norm_grads(grad_out, input, weight, rstd, weight_offset)
    return (grad_input if input_grad else input.new_empty(0)), (grad_weight if weight_grad else input.new_empty(0))


def rms_norm_backward_dtypes(sample: Sample) -> tuple[torch.dtype, ...]:
    x, w = sample.args[1], sample.args[2]
    return x.dtype, (x.dtype if w is None else w.dtype)


def rms_norm_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return (random_tensor((n, 16), dtype, device), random_tensor((16,), dtype, device), 1e-6, 1.0)


def rms_norm_backward_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    x = random_tensor((n, 16), dtype, device)
    return (random_tensor((n, 16), dtype, device), x, random_tensor((16,), dtype, device), _rstd(x, 1e-6), True, True,
            1.0)


def _rms_norm_input_errors(op: str, device: str, extra: tuple = ()) -> list[ErrorInput]:
    """Bad input / weight for an op taking (input, weight, eps, ...)."""
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    e = functools.partial(expect, op)
    f16, bf16, f64 = torch.float16, torch.bfloat16, torch.float64
    cases = [
        e(Sample((f32(()), None, 1e-6) + extra), "at_least_1d", x="input"),
        e(Sample((f32(4, 8).to(torch.int32), None, 1e-6) + extra), "dtype_in", x="input", dtype=torch.int32,
          supported=FLOAT_DTYPES),
        e(Sample((f32(3, 0), None, 1e-6) + extra), "normalised_dim_empty", x="input", shape=[3, 0]),
        e(Sample((f32(4, 8), f32(9), 1e-6) + extra), "param_shape", param="weight", n=8, x="input", shape=[9]),
        e(Sample((f32(4, 8), f32(1, 8), 1e-6) + extra), "param_shape", param="weight", n=8, x="input", shape=[1, 8]),
        e(Sample((f32(4, 8), f32(8).double(), 1e-6) + extra), "param_dtype", param="weight", x="input", dtype=torch.float32,
          param_dtype=f64),
        e(Sample((f32(4, 8).half(), f32(8).bfloat16(), 1e-6) + extra), "param_dtype_or_float", param="weight", x="input", dtype=f16,
          param_dtype=bf16),
        e(Sample((f32(4, 8).double(), f32(8), 1e-6) + extra), "param_dtype", param="weight", x="input", dtype=f64,
          param_dtype=torch.float32),
    ]
    if not extra:  # ops whose next argument is weight_offset
        cases.append(e(Sample((f32(4, 8), None, 1e-6, 0.5)), "offset_without_weight"))
    if device == "cuda":
        cases.append(e(Sample((f32(4, 8), torch.randn(8), 1e-6) + extra), "same_device", x="input", y="weight",
                       **_CUDA_VS_CPU))
        # a row longer than the CUDA kernels take (an expanded view: refused before anything is allocated)
        long_row = torch.zeros(1, 1, device=device, dtype=torch.bfloat16).expand(1, CUDA_MAX_ROW + 1)
        cases.append(e(Sample((long_row, None, 1e-6) + extra), "row_limit", on_fake=False, x="input",
                       n=CUDA_MAX_ROW + 1, max=CUDA_MAX_ROW))
    return cases


CUDA_MAX_ROW = (1 << 31) - (1 << 16) - 1  # CudaNorm::kMaxRow (csrc/cuda/norm.cu)


def rms_norm_backward_errors(device: str) -> list[ErrorInput]:
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    x, w = f32(4, 8), f32(8)
    e = functools.partial(expect, "_rms_norm_backward")
    rstd = dict(stat="rstd", shape=[4], x="input", dtype=torch.float32)
    cases = [
        e(Sample((f32(4, 8), f32(()), None, f32(()), True, False)), "at_least_1d", x="input"),
        e(Sample((f32(4, 8), x, f32(7), f32(4), True, True)), "param_shape", param="weight", n=8, x="input", shape=[7]),
        e(Sample((f32(4, 9), x, w, f32(4), True, True)), "same_shape", x="input", y="grad_out", x_shape=[4, 8],
          y_shape=[4, 9]),
        e(Sample((f32(4, 8).half(), x, w, f32(4), True, True)), "same_dtype", x="input", y="grad_out",
          x_dtype=torch.float32, y_dtype=torch.float16),
        e(Sample((f32(4, 8), x, w, f32(4).double(), True, True)), "stat_shape_dtype", **rstd, got_shape=[4],
          got_dtype=torch.float64),
        e(Sample((f32(4, 8), x, w, f32(4, 1), True, True)), "stat_shape_dtype", **rstd, got_shape=[4, 1],
          got_dtype=torch.float32),
        e(Sample((f32(4, 8), x, None, f32(4), True, True)), "weight_grad_without_weight"),
    ]
    if device == "cuda":
        cases.append(e(Sample((torch.randn(4, 8), x, w, f32(4), True, True)), "same_device", x="input", y="grad_out",
                       **_CUDA_VS_CPU))
    return cases


# --------------------------------------------------------------------------------------------- add_rms_norm
# The rms_norm cases, each with a residual in the other layout family (so input and residual take different
# paths when one is copied), and the residual's own misaligned start for the "offset" rows. Input and
# residual are multiples of 1/16 in [-3, 3], so input + residual is exact in every dtype: the kernels
# normalise residual_out rounded to the input's dtype, the float64 reference the exact sum, and rstd (float32
# for 16-bit inputs) would otherwise differ by a 16-bit rounding.
def _on_sixteenths_(t: torch.Tensor) -> torch.Tensor:
    base = t._base if t._base is not None else t  # the layouts are views of one dense tensor
    with torch.no_grad():
        base.mul_(16).round_().div_(16)
    return t


def _add_rms_norm_args(device: str, dtype: torch.dtype, requires_grad: bool):
    for (x, w, eps, offset, desc), (shape, x_layout, *_) in zip(_rms_norm_args(device, dtype, False), _RMS_NORM_CASES):
        layout = "offset" if x_layout == "offset" else "row_sliced" if x.is_contiguous() else "contiguous"
        r = _on_sixteenths_(_rms_norm_input(tuple(x.shape), dtype, device, layout))
        x = _on_sixteenths_(x)
        w = None if w is None else _grad(w, requires_grad)
        yield _grad(x, requires_grad), _grad(r, requires_grad), w, eps, offset, f"{desc}, residual {layout}"


def add_rms_norm_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    x = _grad(_on_sixteenths_(random_tensor((4, 12), dtype, device)), requires_grad)
    r = _grad(_on_sixteenths_(random_tensor((4, 12), dtype, device)), requires_grad)
    return add_rms_norm_forward_samples(device, dtype, requires_grad) + [
        Sample((x, r), desc="(4, 12), weight, eps and weight_offset defaulted"),
        Sample((x, x), desc="(4, 12), input and residual the same tensor, no weight"),
    ]


def add_rms_norm_forward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    return [Sample((x, r, w, eps, offset), desc=desc)
            for x, r, w, eps, offset, desc in _add_rms_norm_args(device, dtype, requires_grad)]


def add_rms_norm_reference(input, residual, weight=None, eps=1e-6, weight_offset=0.0):
    h = input + residual
    return rms_norm_reference(h, weight, eps, weight_offset), h


def add_rms_norm_forward_reference(input, residual, weight, eps=1e-6, weight_offset=0.0):
    h = input + residual
    out, rstd = rms_norm_forward_reference(h, weight, eps, weight_offset)
    return out, h, rstd


def add_rms_norm_forward_dtypes(sample: Sample) -> tuple[torch.dtype, ...]:
    dtype = sample.args[0].dtype
    return dtype, dtype, _stat_dtype(dtype)


def add_rms_norm_backward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for i, (x, r, w, eps, offset, desc) in enumerate(_add_rms_norm_args(device, dtype, False)):
        h = (x + r).contiguous() if i % 2 else x  # residual_out as the forward makes it, or in x's layout
        dy = _rms_norm_input(tuple(x.shape), dtype, device, "row_sliced" if h.is_contiguous() else "contiguous")
        dres = None if i % 3 == 0 else r  # grad_residual_out absent (unused residual_out) or in r's layout
        weight_grad = w is not None and i % 4 != 1
        samples.append(Sample((dy, dres, h, w, _rstd(h, eps), weight_grad, offset),
                              desc=f"{desc}, grad_residual_out {'None' if dres is None else 'given'}, "
                                   f"weight_grad={weight_grad}"))
    return samples


def add_rms_norm_backward_reference(grad_out, grad_residual_out, residual_out, weight, rstd, weight_grad,
                                    weight_offset=0.0):
    grad_input, grad_weight = _rms_norm_grads(grad_out, residual_out, weight, rstd, weight_offset)
    if grad_residual_out is not None:
        grad_input = grad_input + grad_residual_out
    return grad_input, (grad_weight if weight_grad else residual_out.new_empty(0))


def add_rms_norm_backward_dtypes(sample: Sample) -> tuple[torch.dtype, ...]:
    h, w = sample.args[2], sample.args[3]
    return h.dtype, (h.dtype if w is None else w.dtype)


def add_rms_norm_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return (random_tensor((n, 16), dtype, device), random_tensor((n, 16), dtype, device),
            random_tensor((16,), dtype, device), 1e-6, 1.0)


def add_rms_norm_backward_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    h = random_tensor((n, 16), dtype, device)
    return (random_tensor((n, 16), dtype, device), random_tensor((n, 16), dtype, device), h,
            random_tensor((16,), dtype, device), _rstd(h, 1e-6), True, 1.0)


def _add_rms_norm_errors(op: str, device: str) -> list[ErrorInput]:
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    x, w = f32(4, 8), f32(8)
    e = functools.partial(expect, op)
    pair = dict(x="input", y="residual")
    cases = [
        e(Sample((f32(()), f32(()), None, 1e-6, 0.0)), "at_least_1d", x="input"),
        e(Sample((x.to(torch.int32), x.to(torch.int32), None, 1e-6, 0.0)), "dtype_in", x="input", dtype=torch.int32,
          supported=FLOAT_DTYPES),
        e(Sample((x, f32(4, 8), f32(9), 1e-6, 0.0)), "param_shape", param="weight", n=8, x="input", shape=[9]),
        e(Sample((x, f32(4, 9), w, 1e-6, 0.0)), "same_shape", **pair, x_shape=[4, 8], y_shape=[4, 9]),
        e(Sample((x, f32(8), w, 1e-6, 0.0)), "same_shape", **pair, x_shape=[4, 8], y_shape=[8]),
        e(Sample((x, f32(4, 8).half(), w, 1e-6, 0.0)), "same_dtype", **pair, x_dtype=torch.float32,
          y_dtype=torch.float16),
        e(Sample((x, f32(4, 8), None, 1e-6, 1.0)), "offset_without_weight"),
    ]
    if device == "cuda":
        cases.append(e(Sample((x, torch.randn(4, 8), w, 1e-6, 0.0)), "same_device", **pair, **_CUDA_VS_CPU))
    return cases


def add_rms_norm_backward_errors(device: str) -> list[ErrorInput]:
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    h, w, r = f32(4, 8), f32(8), f32(4)
    e = functools.partial(expect, "_add_rms_norm_backward")
    cases = [
        e(Sample((f32(4, 8), None, f32(()), None, f32(()), False, 0.0)), "at_least_1d", x="residual_out"),
        e(Sample((f32(4, 9), None, h, w, r, True, 0.0)), "same_shape", x="residual_out", y="grad_out",
          x_shape=[4, 8], y_shape=[4, 9]),
        e(Sample((f32(4, 8), f32(4, 9), h, w, r, True, 0.0)), "same_shape", x="residual_out", y="grad_residual_out",
          x_shape=[4, 8], y_shape=[4, 9]),
        e(Sample((f32(4, 8), f32(4, 8).double(), h, w, r, True, 0.0)), "same_dtype", x="residual_out",
          y="grad_residual_out", x_dtype=torch.float32, y_dtype=torch.float64),
        e(Sample((f32(4, 8), None, h, w, f32(4).double(), True, 0.0)), "stat_shape_dtype", stat="rstd", shape=[4],
          x="residual_out", dtype=torch.float32, got_shape=[4], got_dtype=torch.float64),
        e(Sample((f32(4, 8), None, h, None, r, True, 0.0)), "weight_grad_without_weight"),
        e(Sample((f32(4, 8), None, h, None, r, False, 1.0)), "offset_without_weight"),
    ]
    if device == "cuda":
        cases.append(e(Sample((torch.randn(4, 8), None, h, w, r, True, 0.0)), "same_device", x="residual_out",
                       y="grad_out", **_CUDA_VS_CPU))
    return cases


# ------------------------------------------------------------------------------------------- layer_norm
# (shape, input layout, weight, bias, eps): the rms_norm shapes and layouts (N of 1, odd sizes, long rows,
# empty, 1-D, non-contiguous), with weight and bias each None, "same" (input's dtype), "f32" (float32 with
# 16-bit input; input's dtype otherwise) or "strided"; weight and bias share a dtype when both are given.
_LAYER_NORM_CASES: list[tuple[tuple[int, ...], str, str | None, str | None, float]] = [
    ((4, 1), "contiguous", "same", "same", 1e-5),
    ((3, 7), "contiguous", None, None, 1e-5),
    ((5, 33), "contiguous", "same", None, 1e-6),
    ((6, 64), "contiguous", None, "f32", 1e-5),
    ((3, 1000), "contiguous", "f32", "f32", 1e-5),
    ((2, 1001), "offset", "f32", None, 1e-5),
    ((2, 2056), "contiguous", None, "same", 1e-5),
    ((2, 8195), "contiguous", "same", "same", 1e-5),
    ((2, 8192), "row_sliced", "f32", "f32", 0.1),
    ((300, 16), "contiguous", "same", "same", 1e-5),
    ((0, 16), "contiguous", "same", "same", 1e-5),
    ((2, 0, 8), "contiguous", None, "same", 1e-5),
    ((16,), "contiguous", "same", "same", 1e-5),
    ((2, 3, 40), "contiguous", "same", "same", 0.0),
    ((2, 3, 40), "permuted", None, None, 1e-5),
    ((24, 10), "transposed", "strided", "strided", 1e-5),
    ((9, 48), "row_sliced", "strided", None, 1e-5),
    ((5, 24), "expanded", None, "strided", 1e-5),
]


def _layer_norm_args(device: str, dtype: torch.dtype, requires_grad: bool):
    for shape, layout, weight_kind, bias_kind, eps in _LAYER_NORM_CASES:
        x = _grad(_rms_norm_input(shape, dtype, device, layout), requires_grad)
        w, b = (_rms_norm_weight(kind, shape[-1], dtype, device) for kind in (weight_kind, bias_kind))
        w, b = (None if t is None else _grad(t, requires_grad) for t in (w, b))
        desc = ", ".join(f"{name} {'None' if t is None else str(t.dtype).removeprefix('torch.')}"
                         for name, t in (("weight", w), ("bias", b)))
        yield x, w, b, eps, f"{shape} {layout}, {desc}, eps={eps}"


def layer_norm_forward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    return [Sample((x, w, b, eps), desc=desc) for x, w, b, eps, desc in _layer_norm_args(device, dtype, requires_grad)]


def layer_norm_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    x = _grad(random_tensor((4, 12), dtype, device), requires_grad)
    w = _grad(random_tensor((12,), dtype, device), requires_grad)
    return layer_norm_forward_samples(device, dtype, requires_grad) + [
        Sample((x,), desc="(4, 12), weight, bias and eps defaulted"),
        Sample((x, w), desc="(4, 12), weight, bias and eps defaulted"),
    ]


def _layer_norm_stats(input: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    mean = input.mean(-1, keepdim=True)
    return mean.squeeze(-1), torch.rsqrt((input - mean).pow(2).mean(-1) + eps)


def layer_norm_reference(input: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                         eps: float = 1e-5) -> torch.Tensor:
    return torch.nn.functional.layer_norm(input, input.shape[-1:], weight, bias, eps)


def layer_norm_forward_reference(input, weight, bias, eps=1e-5):
    return (layer_norm_reference(input, weight, bias, eps), *_layer_norm_stats(input, eps))


def layer_norm_forward_dtypes(sample: Sample) -> tuple[torch.dtype, ...]:
    dtype = sample.args[0].dtype
    return dtype, _stat_dtype(dtype), _stat_dtype(dtype)


def _stats_of(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """mean and rstd of x's rows in the stat dtype, as _layer_norm_forward saves them."""
    mean, rstd = _layer_norm_stats(x.detach().to(torch.float64), eps)
    return mean.to(_stat_dtype(x.dtype)), rstd.to(_stat_dtype(x.dtype))


def layer_norm_backward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    masks = [(True, True, True), (True, False, False), (False, True, False), (False, False, True), (False, False, False)]
    for i, (x, w, b, eps, desc) in enumerate(_layer_norm_args(device, dtype, False)):
        # grad_out in the other layout family, so dy and x take different paths when one is copied.
        dy = _rms_norm_input(tuple(x.shape), dtype, device, "row_sliced" if x.is_contiguous() else "contiguous")
        input_grad, weight_grad, bias_grad = masks[i % len(masks)]
        weight_grad = weight_grad and w is not None
        samples.append(Sample((dy, x, w, *_stats_of(x, eps), input_grad, weight_grad, bias_grad),
                              desc=f"{desc}, input_grad={input_grad}, weight_grad={weight_grad}, "
                                   f"bias_grad={bias_grad}"))
    return samples


def layer_norm_backward_reference(grad_out, input, weight, mean, rstd, input_grad, weight_grad, bias_grad):
    n = input.shape[-1]
    xhat = (input - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    g = grad_out if weight is None else grad_out * weight
    grad_input = rstd.unsqueeze(-1) * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    columns = lambda t: t.reshape(-1, n).sum(0)  # noqa: E731
    empty = input.new_empty(0)
    return (grad_input if input_grad else empty, columns(grad_out * xhat) if weight_grad else empty,
            columns(grad_out) if bias_grad else empty)


def layer_norm_backward_dtypes(sample: Sample) -> tuple[torch.dtype, ...]:
    x, w = sample.args[1], sample.args[2]
    return x.dtype, (x.dtype if w is None else w.dtype), (_stat_dtype(x.dtype) if w is None else w.dtype)


def layer_norm_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return (random_tensor((n, 16), dtype, device), random_tensor((16,), dtype, device),
            random_tensor((16,), dtype, device), 1e-5)


def layer_norm_backward_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    x = random_tensor((n, 16), dtype, device)
    return (random_tensor((n, 16), dtype, device), x, random_tensor((16,), dtype, device), *_stats_of(x, 1e-5), True,
            True, True)


def layer_norm_input_errors(op: str, device: str) -> list[ErrorInput]:
    """Bad input / weight / bias for an op taking (input, weight, bias, eps): layer_norm, _layer_norm_forward."""
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    e = functools.partial(expect, op)
    f16, bf16, f64 = torch.float16, torch.bfloat16, torch.float64
    x = f32(4, 8)
    cases = [
        e(Sample((f32(()), None, None, 1e-5)), "at_least_1d", x="input"),
        e(Sample((x.to(torch.int32), None, None, 1e-5)), "dtype_in", x="input", dtype=torch.int32,
          supported=FLOAT_DTYPES),
        e(Sample((f32(3, 0), None, None, 1e-5)), "normalised_dim_empty", x="input", shape=[3, 0]),
        e(Sample((x, f32(9), None, 1e-5)), "param_shape", param="weight", n=8, x="input", shape=[9]),
        e(Sample((x, None, f32(2, 8), 1e-5)), "param_shape", param="bias", n=8, x="input", shape=[2, 8]),
        e(Sample((x, f32(8), f32(8).double(), 1e-5)), "param_dtype", param="bias", x="input",
          dtype=torch.float32, param_dtype=f64),
        e(Sample((x.half(), None, f32(8).bfloat16(), 1e-5)), "param_dtype_or_float", param="bias", x="input",
          dtype=f16, param_dtype=bf16),
        e(Sample((x.bfloat16(), f32(8), f32(8).bfloat16(), 1e-5)), "same_dtype", x="weight", y="bias",
          x_dtype=torch.float32, y_dtype=bf16),
    ]
    if device == "cuda":
        cases.append(e(Sample((x, None, torch.randn(8), 1e-5)), "same_device", x="input", y="bias", **_CUDA_VS_CPU))
    return cases


def layer_norm_backward_errors(device: str) -> list[ErrorInput]:
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    x, w, s = f32(4, 8), f32(8), f32(4)
    e = functools.partial(expect, "_layer_norm_backward")
    stat = dict(shape=[4], x="input", dtype=torch.float32)
    cases = [
        e(Sample((f32(4, 8), f32(()), None, f32(()), f32(()), True, False, False)), "at_least_1d", x="input"),
        e(Sample((f32(4, 8), x, f32(7), s, s, True, True, True)), "param_shape", param="weight", n=8, x="input",
          shape=[7]),
        e(Sample((f32(4, 9), x, w, s, s, True, True, True)), "same_shape", x="input", y="grad_out", x_shape=[4, 8],
          y_shape=[4, 9]),
        e(Sample((f32(4, 8).half(), x, w, s, s, True, True, True)), "same_dtype", x="input", y="grad_out",
          x_dtype=torch.float32, y_dtype=torch.float16),
        e(Sample((f32(4, 8), x, w, f32(4, 1), s, True, True, True)), "stat_shape_dtype", stat="mean", **stat,
          got_shape=[4, 1], got_dtype=torch.float32),
        e(Sample((f32(4, 8), x, w, s, s.double(), True, True, True)), "stat_shape_dtype", stat="rstd", **stat,
          got_shape=[4], got_dtype=torch.float64),
        e(Sample((f32(4, 8), x, None, s, s, True, True, False)), "weight_grad_without_weight"),
    ]
    if device == "cuda":
        cases.append(e(Sample((torch.randn(4, 8), x, w, s, s, True, True, True)), "same_device", x="input",
                       y="grad_out", **_CUDA_VS_CPU))
    return cases


def _norm_op_infos(op: str, input_errors: Callable[..., list[ErrorInput]]) -> list[OpInfo]:
    """A norm's three OpInfos, from this module's functions named after it: the op, its internal forward (out and
    the saved statistics) and backward (differentiating it raises, by name, from its Autograd kernel)."""
    row = lambda suffix, kind: globals()[f"{op}{suffix}_{kind}"]  # noqa: E731
    forward, backward = f"_{op}_forward", f"_{op}_backward"
    return [
        OpInfo(op, FLOAT_DTYPES, row("", "samples"), row("", "reference"), functools.partial(input_errors, op),
               row("", "sized")),
        OpInfo(forward, FLOAT_DTYPES, row("_forward", "samples"), row("_forward", "reference"),
               functools.partial(input_errors, forward), row("", "sized"), output_dtypes=row("_forward", "dtypes")),
        OpInfo(backward, FLOAT_DTYPES, row("_backward", "samples"), row("_backward", "reference"),
               row("_backward", "errors"), row("_backward", "sized"), differentiable=False,
               output_dtypes=row("_backward", "dtypes")),
    ]


OPS: list[OpInfo] = (_norm_op_infos("rms_norm", _rms_norm_input_errors)
                     + _norm_op_infos("add_rms_norm", _add_rms_norm_errors)
                     + _norm_op_infos("layer_norm", layer_norm_input_errors))
