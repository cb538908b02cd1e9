"""op_db rows of the loss ops: linear_cross_entropy (and its chunked twin), cross_entropy and their internal ops."""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F

from helpers import FLOAT_DTYPES, INT_DTYPES, random_tensor
from op_db.core import ErrorInput, OpInfo, Sample, _grad, expect  # noqa: F401
from op_db.elementwise import _CUDA_VS_CPU  # noqa: F401

_I32, _I64 = torch.int32, torch.int64


def _math_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _targets(shape: tuple[int, ...], classes: int, ignored: str, ignore_index: int, dtype: torch.dtype,
             device: str, layout: str = "contiguous") -> torch.Tensor:
    """Class indices; `ignored`: "none", "some" (every third token) or "all" are ignore_index. "strided": every
    other element of a tensor whose others are out of range (a wrong stride would read them)."""
    n = math.prod(shape)
    t = torch.randint(0, classes, (n,), dtype=torch.int64)
    if ignored == "some":
        t[1::3] = ignore_index
    elif ignored == "all":
        t[:] = ignore_index
    if layout == "strided":
        wide = torch.full((2 * n,), -7, dtype=dtype)
        wide[::2] = t.to(dtype)
        return wide.to(device)[::2].view(shape)
    return t.to(dtype).to(device).view(shape)


# ------------------------------------------------------------------------------------ linear_cross_entropy
# (input shape, V, bias, reduction, ignored, label_smoothing, softcap, target dtype, ignore_index, input layout).
# Zero tokens, one token, a 1-D input (0-dim target), 3-D input, V = 1003 (no 16-byte rows, the scalar paths)
# and 1024 (the vector paths), H = 0 (logits = bias), ignore_index a valid class, label_smoothing 1, a
# transposed input, every option together. A mean over no token is NaN (test_linear_cross_entropy.py checks
# it): numerical gradients of NaN mean nothing, so the zero-token and all-ignored rows here sum or keep tokens.
_LCE_CASES: list[tuple[tuple[int, ...], int, bool, str, str, float, float | None, torch.dtype, int, str]] = [
    ((5, 8), 11, True, "mean", "none", 0.0, None, _I64, -100, "contiguous"),
    ((2, 3, 8), 7, False, "sum", "some", 0.1, None, _I32, -100, "contiguous"),
    ((6, 12), 9, True, "none", "some", 0.0, 2.0, _I64, -100, "contiguous"),
    ((1, 6), 5, True, "mean", "none", 0.0, None, _I64, -100, "contiguous"),
    ((0, 6), 5, False, "sum", "none", 0.1, 1.0, _I32, -100, "contiguous"),
    ((0, 6), 5, True, "none", "none", 0.0, None, _I64, -100, "contiguous"),
    ((4, 6), 5, True, "none", "all", 0.0, None, _I64, -100, "contiguous"),
    ((4, 6), 5, False, "sum", "all", 0.2, 3.0, _I32, -100, "contiguous"),
    ((7, 16), 33, True, "mean", "some", 0.2, 5.0, _I32, -100, "contiguous"),
    ((8,), 6, True, "mean", "none", 0.0, None, _I64, -100, "contiguous"),
    ((6, 10), 1003, False, "none", "some", 0.1, None, _I64, -100, "contiguous"),
    ((5, 16), 1024, True, "mean", "some", 0.0, 4.0, _I32, -100, "contiguous"),
    ((12, 8), 10, True, "sum", "some", 0.0, None, _I64, -100, "transposed"),
    ((6, 8), 10, False, "mean", "some", 0.0, None, _I64, 3, "contiguous"),
    ((6, 8), 10, True, "sum", "none", 1.0, None, _I32, -100, "contiguous"),
    ((4, 0), 5, True, "mean", "some", 0.1, None, _I64, -100, "contiguous"),
]


def _on_grid(t: torch.Tensor, steps: int) -> torch.Tensor:
    """t rounded to multiples of 1 / steps. Inputs in halves, weights in quarters and biases in eighths (|x|, |w|,
    |b| <= 1) make every logit of these H <= 16 a multiple of 1/8 below 18: exact in float16 and bfloat16 too, so
    the float64 reference sees the very logits the op's 16-bit matmul rounds to (the per-token losses and lse,
    float32 for 16-bit inputs, are then compared at float32's tolerance)."""
    with torch.no_grad():
        return t.mul_(steps).round_().div_(steps)


def _lce_args(device: str, dtype: torch.dtype, requires_grad: bool):
    for i, (shape, v, bias, reduction, ignored, ls, cap, tdtype, ignore_index, layout) in enumerate(_LCE_CASES):
        h = shape[-1]
        x = (_on_grid(random_tensor(shape[::-1], dtype, device, low=-1, high=1), 2).t() if layout == "transposed"
             else _on_grid(random_tensor(shape, dtype, device, low=-1, high=1), 2))
        x = _grad(x, requires_grad)
        w = _grad(_on_grid(random_tensor((v, h), dtype, device, low=-1, high=1), 4), requires_grad)
        b = _grad(_on_grid(random_tensor((v,), dtype, device, low=-1, high=1), 8), requires_grad) if bias else None
        t = _targets(shape[:-1], v, ignored, ignore_index, tdtype, device, "strided" if i % 5 == 4 else "contiguous")
        desc = (f"{shape} {layout}, V={v}, {'bias' if bias else 'no bias'}, {reduction}, {ignored} ignored "
                f"(ignore_index {ignore_index}), label_smoothing={ls}, softcap={cap}, target {tdtype}")
        yield x, w, t, b, reduction, ignore_index, ls, cap, desc


def linear_cross_entropy_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = [Sample((x, w, t, b, red, ii, ls, cap), desc=desc)
               for x, w, t, b, red, ii, ls, cap, desc in _lce_args(device, dtype, requires_grad)]
    x = _grad(random_tensor((4, 8), dtype, device, low=-1, high=1), requires_grad)
    w = _grad(random_tensor((6, 8), dtype, device, low=-1, high=1), requires_grad)
    t = torch.tensor([1, 5, 0, 2], device=device)
    samples.append(Sample((x, w, t), desc="(4, 8), V=6, everything defaulted"))
    return samples


def _capped(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return logits if softcap is None else softcap * torch.tanh(logits / softcap)


def _token_losses(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float,
                  softcap: float | None) -> torch.Tensor:
    """Per-token losses (target's shape) by F.cross_entropy over the last dimension."""
    v = logits.shape[-1]
    z = _capped(logits, softcap).reshape(-1, v)
    loss = F.cross_entropy(z, target.reshape(-1).long(), reduction="none", ignore_index=ignore_index,
                           label_smoothing=label_smoothing)
    return loss.reshape(target.shape)


def _reduce(loss: torch.Tensor, target: torch.Tensor, reduction: str, ignore_index: int) -> torch.Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (target != ignore_index).sum()


def linear_cross_entropy_reference(input, linear_weight, target, linear_bias=None, reduction="mean",
                                   ignore_index=-100, label_smoothing=0.0, softcap=None, chunk_size=0):
    logits = F.linear(input, linear_weight, linear_bias)
    return _reduce(_token_losses(logits, target, ignore_index, label_smoothing, softcap), target, reduction,
                   ignore_index)


def linear_cross_entropy_chunked_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    # Chunks of 1, 2, 3 and 5 tokens (token counts that are no multiple of them) and 0 (chosen).
    chunks = (1, 2, 3, 0, 5)
    return [Sample(s.args + (chunks[i % len(chunks)],) if len(s.args) == 8 else s.args, desc=f"{s.desc}, chunk "
                   f"{chunks[i % len(chunks)] if len(s.args) == 8 else 'defaulted'}")
            for i, s in enumerate(linear_cross_entropy_samples(device, dtype, requires_grad))]


def _lce_forward_args(device: str, dtype: torch.dtype, requires_grad: bool):
    masks = [(True, True, True), (True, False, False), (False, True, True), (False, False, False)]
    chunks = (0, 2, 3, 1)
    for i, (x, w, t, b, _red, ii, ls, cap, desc) in enumerate(_lce_args(device, dtype, requires_grad)):
        ig, wg, bg = masks[i % len(masks)]
        bg = bg and b is not None
        scale = None if i % 3 == 0 else torch.tensor(0.25 + i / 8, dtype=torch.float32 if i % 2 else dtype,
                                                      device=device)
        yield (x, w, t, b, ii, ls, cap, scale, ig, wg, bg, chunks[i % len(chunks)]), \
            f"{desc}, grad_scale={None if scale is None else round(scale.item(), 3)}, grads {ig, wg, bg}, " \
            f"chunk {chunks[i % len(chunks)]}"


def linear_cross_entropy_forward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    return [Sample(args, desc=desc) for args, desc in _lce_forward_args(device, dtype, requires_grad)]


def _gradients(total: torch.Tensor, tensors: list[torch.Tensor | None], wanted: list[bool]) -> list[torch.Tensor]:
    inputs = [t for t, want in zip(tensors, wanted) if want and t is not None]
    grads = iter(torch.autograd.grad(total, inputs, allow_unused=True) if inputs else ())
    out = []
    for t, want in zip(tensors, wanted):
        if want and t is not None:
            g = next(grads)
            out.append(torch.zeros_like(t) if g is None else g)
        else:
            out.append(torch.empty(0, dtype=torch.float64))
    return out


def _losses_and_gradients(input, linear_weight, linear_bias, target, ignore_index, label_smoothing, softcap,
                          total, wanted):
    """The per-token losses and the gradients (where `wanted`) of total(losses) for input, weight and bias."""
    tensors = [t.detach().requires_grad_() if t is not None else None for t in (input, linear_weight, linear_bias)]
    with torch.enable_grad():
        loss = _token_losses(F.linear(*tensors), target, ignore_index, label_smoothing, softcap)
        return loss.detach(), _gradients(total(loss), tensors, wanted)


def linear_cross_entropy_forward_reference(input, linear_weight, target, linear_bias, ignore_index, label_smoothing,
                                           softcap, grad_scale, input_grad, weight_grad, bias_grad, chunk_size=0):
    scale = 1.0 if grad_scale is None else grad_scale
    loss, grads = _losses_and_gradients(input, linear_weight, linear_bias, target, ignore_index, label_smoothing,
                                        softcap, lambda losses: losses.sum() * scale,
                                        [input_grad, weight_grad, bias_grad])
    return (loss, *grads)


def linear_cross_entropy_forward_dtypes(sample: Sample) -> tuple[torch.dtype, ...]:
    dtype = sample.args[0].dtype
    return _math_dtype(dtype), dtype, dtype, dtype


def linear_cross_entropy_backward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for i, (args, desc) in enumerate(_lce_forward_args(device, dtype, False)):
        x, w, t, b, ii, ls, cap, _scale, ig, wg, bg, chunk = args
        if i % 4 == 3:  # what sum / mean hand the per-token losses: one value, broadcast
            g = random_tensor((), _math_dtype(dtype), device).expand(t.shape)
        else:
            g = random_tensor(t.shape, _math_dtype(dtype) if i % 2 else dtype, device)
        ig, wg, bg = (True, True, b is not None) if i % 4 == 3 else (ig, wg, bg)
        samples.append(Sample((g, x, w, t, b, ii, ls, cap, ig, wg, bg, chunk),
                              desc=f"{desc}, grad_loss {g.dtype}{' broadcast' if i % 4 == 3 else ''}"))
    return samples


def linear_cross_entropy_backward_reference(grad_loss, input, linear_weight, target, linear_bias, ignore_index,
                                            label_smoothing, softcap, input_grad, weight_grad, bias_grad, chunk_size=0):
    _, grads = _losses_and_gradients(input, linear_weight, linear_bias, target, ignore_index, label_smoothing, softcap,
                                     lambda losses: (losses * grad_loss).sum(), [input_grad, weight_grad, bias_grad])
    return tuple(grads)


def linear_cross_entropy_backward_dtypes(sample: Sample) -> tuple[torch.dtype, ...]:
    dtype = sample.args[1].dtype
    return dtype, dtype, dtype


def _lce_sized_parts(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    x = random_tensor((n, 16), dtype, device, low=-1, high=1)
    w = random_tensor((24, 16), dtype, device, low=-1, high=1)
    t = torch.randint(0, 24, (n,), device=device)
    t[1] = -100
    return x, w, t, random_tensor((24,), dtype, device, low=-1, high=1)


def linear_cross_entropy_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return (*_lce_sized_parts(device, dtype, n), "mean", -100, 0.1, None)


def linear_cross_entropy_chunked_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return (*_lce_sized_parts(device, dtype, n), "sum", -100, 0.0, 3.0, 3)


def linear_cross_entropy_forward_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return (*_lce_sized_parts(device, dtype, n), -100, 0.1, None, None, True, True, True, 2)


def linear_cross_entropy_backward_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    x, w, t, b = _lce_sized_parts(device, dtype, n)
    return (random_tensor((n,), _math_dtype(dtype), device), x, w, t, b, -100, 0.0, 2.0, True, True, True, 3)


def _lce_errors(op: str, device: str, *, tail: tuple = (), reduction: bool = True) -> list[ErrorInput]:
    """Bad input / weight / target / bias / options for an op taking (input, linear_weight, target, linear_bias, ...)."""
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    e = functools.partial(expect, op)
    x, w, b = f32(4, 8), f32(5, 8), f32(5)
    t = torch.tensor([0, 4, -100, 1], device=device)

    def call(x_=x, w_=w, t_=t, b_=b, red="mean", ii=-100, ls=0.0, cap=None):
        opts = (red, ii, ls, cap) if reduction else (ii, ls, cap)
        return Sample((x_, w_, t_, b_) + opts + tail)

    cases = [
        e(call(x_=f32(())), "at_least_1d", x="input"),
        e(call(x_=x.to(torch.int32)), "dtype_in", x="input", dtype=torch.int32, supported=FLOAT_DTYPES),
        e(call(w_=f32(8)), "two_d", x="linear_weight", shape=[8]),
        e(call(w_=w.double()), "same_dtype", x="input", y="linear_weight", x_dtype=torch.float32,
          y_dtype=torch.float64),
        e(call(w_=f32(5, 7)), "in_features", h=8, x="input", shape=[5, 7]),
        e(call(w_=f32(0, 8), b_=None), "no_classes", x="linear_weight", dim="first", shape=[0, 8]),
        e(call(t_=t.float()), "dtype_in", x="target", dtype=torch.float32, supported=INT_DTYPES),
        e(call(t_=t[:3]), "target_shape", shape=[4], x="input", got=[3]),
        e(call(t_=t.view(4, 1)), "target_shape", shape=[4], x="input", got=[4, 1]),
        e(call(b_=f32(6)), "bias_shape", n=5, shape=[6]),
        e(call(b_=f32(1, 5)), "bias_shape", n=5, shape=[1, 5]),
        e(call(b_=b.half()), "same_dtype", x="input", y="linear_bias", x_dtype=torch.float32, y_dtype=torch.float16),
        e(call(ls=1.5), "label_smoothing", got="1.5"),
        e(call(ls=-0.5), "label_smoothing", got="-0.5"),
        e(call(cap=-1.5), "softcap", got="-1.5"),
        e(call(cap=math.inf), "softcap", got="inf"),
    ]
    if reduction:
        cases.append(e(call(red="avg"), "reduction", got="avg"))
    if device == "cpu":  # target values: the CPU kernels read them (CUDA never synchronises to check)
        cases += [
            e(call(t_=torch.tensor([0, 5, 1, 2])), "target_range", on_fake=False, n=5, ignore_index=-100, got=5, i=1),
            e(call(t_=torch.tensor([0, 1, 2, -3], dtype=torch.int32)), "target_range", on_fake=False, n=5,
              ignore_index=-100, got=-3, i=3),
            e(call(t_=torch.tensor([0, 1, -100, 2]), ii=3), "target_range", on_fake=False, n=5, ignore_index=3,
              got=-100, i=2),
        ]
    if device == "cuda":
        cases += [
            e(call(w_=torch.randn(5, 8)), "same_device", x="input", y="linear_weight", **_CUDA_VS_CPU),
            e(call(t_=torch.tensor([0, 4, -100, 1])), "same_device", x="input", y="target", **_CUDA_VS_CPU),
        ]
    return cases


def linear_cross_entropy_errors(device: str) -> list[ErrorInput]:
    return _lce_errors("linear_cross_entropy", device)


def linear_cross_entropy_chunked_errors(device: str) -> list[ErrorInput]:
    op = "_linear_cross_entropy_chunked"
    x, w, t = torch.randn(4, 8, device=device), torch.randn(5, 8, device=device), torch.zeros(4, dtype=_I64, device=device)
    return _lce_errors(op, device, tail=(2,)) + [
        expect(op, Sample((x, w, t, None, "mean", -100, 0.0, None, -1)), "chunk_size", got=-1)]


def linear_cross_entropy_forward_errors(device: str) -> list[ErrorInput]:
    op = "_linear_cross_entropy_forward"
    x, w, t = torch.randn(4, 8, device=device), torch.randn(5, 8, device=device), torch.zeros(4, dtype=_I64, device=device)
    e = functools.partial(expect, op)
    head = (x, w, t, None, -100, 0.0, None)
    return _lce_errors(op, device, tail=(None, True, True, False, 0), reduction=False) + [
        e(Sample(head + (torch.ones(1, device=device), True, True, False, 0)), "zero_dim", x="grad_scale", shape=[1]),
        e(Sample(head + (torch.tensor(1, device=device), True, True, False, 0)), "dtype_in", x="grad_scale",
          dtype=torch.int64, supported=FLOAT_DTYPES),
        e(Sample(head + (None, True, True, True, 0)), "bias_grad_without_bias"),
        e(Sample(head + (None, True, True, False, -2)), "chunk_size", got=-2),
    ]


def linear_cross_entropy_backward_errors(device: str) -> list[ErrorInput]:
    op = "_linear_cross_entropy_backward"
    x, w, t = torch.randn(4, 8, device=device), torch.randn(5, 8, device=device), torch.zeros(4, dtype=_I64, device=device)
    e = functools.partial(expect, op)
    tail = (-100, 0.0, None, True, True, False, 0)
    return [
        e(Sample((torch.ones(4, device=device), torch.randn((), device=device), w, t, None) + tail), "at_least_1d",
          x="input"),
        e(Sample((torch.ones(4, device=device), x, torch.randn(5, 7, device=device), t, None) + tail), "in_features",
          h=8, x="input", shape=[5, 7]),
        e(Sample((torch.ones(3, device=device), x, w, t, None) + tail), "same_shape", x="target", y="grad_loss",
          x_shape=[4], y_shape=[3]),
        e(Sample((torch.ones(4, dtype=_I64, device=device), x, w, t, None) + tail), "dtype_in", x="grad_loss",
          dtype=torch.int64, supported=FLOAT_DTYPES),
        e(Sample((torch.ones(4, device=device), x, w, t, None, -100, 0.0, None, True, True, True, 0)),
          "bias_grad_without_bias"),
        e(Sample((torch.ones(4, device=device), x, w, t, None, -100, 0.0, None, True, True, False, -1)), "chunk_size",
          got=-1),
    ]


# ------------------------------------------------------------------------------------------- cross_entropy
# (logits shape, layout, reduction, ignored, label_smoothing, softcap, target dtype, ignore_index). Layouts beyond
# make_layout's: "row_sliced" (rows of a wider tensor: a row stride, read in place), "offset" (misaligned rows)
# and "expanded" (every row the same memory: row stride 0).
_CE_CASES: list[tuple[tuple[int, ...], str, str, str, float, float | None, torch.dtype, int]] = [
    ((5, 11), "contiguous", "mean", "none", 0.0, None, _I64, -100),
    ((2, 3, 7), "contiguous", "sum", "some", 0.1, None, _I32, -100),
    ((6, 9), "contiguous", "none", "some", 0.0, 2.0, _I64, -100),
    ((1, 5), "contiguous", "mean", "none", 0.0, None, _I64, -100),
    ((0, 5), "contiguous", "sum", "none", 0.0, None, _I64, -100),
    ((0, 5), "contiguous", "none", "none", 0.2, 1.0, _I32, -100),
    ((4, 5), "contiguous", "none", "all", 0.0, None, _I64, -100),
    ((7,), "contiguous", "mean", "none", 0.1, None, _I64, -100),
    ((6, 1003), "contiguous", "none", "some", 0.1, 30.0, _I64, -100),
    ((4, 1024), "contiguous", "mean", "some", 0.0, None, _I32, -100),
    ((3, 4096 + 8), "contiguous", "sum", "none", 0.0, None, _I64, -100),
    ((8, 12), "transposed", "sum", "some", 0.0, None, _I64, -100),
    ((5, 40), "row_sliced", "mean", "some", 0.3, 3.0, _I64, 7),
    ((5, 40), "offset", "none", "none", 0.0, None, _I32, -100),
    ((5, 24), "expanded", "sum", "some", 0.0, None, _I64, -100),
    ((6, 10), "contiguous", "sum", "none", 1.0, None, _I64, -100),
]


def _ce_logits(shape: tuple[int, ...], dtype: torch.dtype, device: str, layout: str) -> torch.Tensor:
    if layout == "row_sliced":
        return random_tensor(shape[:-1] + (shape[-1] + 5,), dtype, device, low=-4, high=4)[..., : shape[-1]]
    if layout == "offset":
        return random_tensor((math.prod(shape) + 1,), dtype, device, low=-4, high=4)[1:].view(shape)
    if layout == "expanded":
        return random_tensor((1, shape[-1]), dtype, device, low=-4, high=4).expand(shape)
    if layout == "transposed":
        return random_tensor((shape[-1], shape[0]), dtype, device, low=-4, high=4).t()
    return random_tensor(shape, dtype, device, low=-4, high=4)


def _ce_args(device: str, dtype: torch.dtype, requires_grad: bool):
    for i, (shape, layout, reduction, ignored, ls, cap, tdtype, ignore_index) in enumerate(_CE_CASES):
        z = _grad(_ce_logits(shape, dtype, device, layout), requires_grad)
        t = _targets(shape[:-1], shape[-1], ignored, ignore_index, tdtype, device,
                     "strided" if i % 4 == 1 else "contiguous")
        desc = (f"{shape} {layout}, {reduction}, {ignored} ignored (ignore_index {ignore_index}), "
                f"label_smoothing={ls}, softcap={cap}, target {tdtype}")
        yield z, t, reduction, ignore_index, ls, cap, desc


def cross_entropy_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = [Sample((z, t, red, ii, ls, cap), desc=desc)
               for z, t, red, ii, ls, cap, desc in _ce_args(device, dtype, requires_grad)]
    z = _grad(random_tensor((4, 9), dtype, device, low=-4, high=4), requires_grad)
    samples.append(Sample((z, torch.tensor([3, 8, 0, -100], device=device)), desc="(4, 9), everything defaulted"))
    return samples


def cross_entropy_reference(logits, target, reduction="mean", ignore_index=-100, label_smoothing=0.0, softcap=None):
    return _reduce(_token_losses(logits, target, ignore_index, label_smoothing, softcap), target, reduction,
                   ignore_index)


def cross_entropy_forward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    return [Sample((z, t, ii, ls, cap), desc=desc)
            for z, t, _red, ii, ls, cap, desc in _ce_args(device, dtype, requires_grad)]


def _lse(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return torch.logsumexp(_capped(logits.to(_math_dtype(logits.dtype)), softcap), dim=-1)


def cross_entropy_forward_reference(logits, target, ignore_index, label_smoothing, softcap):
    return _token_losses(logits, target, ignore_index, label_smoothing, softcap), _lse(logits, softcap)


def cross_entropy_forward_dtypes(sample: Sample) -> tuple[torch.dtype, ...]:
    m = _math_dtype(sample.args[0].dtype)
    return m, m


def cross_entropy_backward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for i, (z, t, _red, ii, ls, cap, desc) in enumerate(_ce_args(device, dtype, False)):
        if i % 4 == 3:
            g = random_tensor((), _math_dtype(dtype), device).expand(t.shape)
        else:
            g = random_tensor(t.shape, _math_dtype(dtype) if i % 2 else dtype, device)
        samples.append(Sample((g, z, t, _lse(z.detach(), cap), ii, ls, cap), desc=f"{desc}, grad_loss {g.dtype}"))
    return samples


def cross_entropy_backward_reference(grad_loss, logits, target, lse, ignore_index, label_smoothing, softcap):
    z = logits.detach().requires_grad_()
    with torch.enable_grad():
        loss = _token_losses(z, target, ignore_index, label_smoothing, softcap)
        (g,) = torch.autograd.grad((loss * grad_loss).sum(), (z,), allow_unused=True)
    return torch.zeros_like(z) if g is None else g


def _ce_sized_parts(device: str, dtype: torch.dtype, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    z = random_tensor((n, 24), dtype, device, low=-4, high=4)
    t = torch.randint(0, 24, (n,), device=device)
    t[2] = -100
    return z, t


def cross_entropy_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return (*_ce_sized_parts(device, dtype, n), "mean", -100, 0.1, None)


def cross_entropy_forward_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return (*_ce_sized_parts(device, dtype, n), -100, 0.0, 2.0)


def cross_entropy_backward_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    z, t = _ce_sized_parts(device, dtype, n)
    return (random_tensor((n,), _math_dtype(dtype), device), z, t, _lse(z, None), -100, 0.1, None)


def _ce_errors(op: str, device: str, *, reduction: bool = True) -> list[ErrorInput]:
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    e = functools.partial(expect, op)
    z = f32(4, 6)
    t = torch.tensor([0, 5, -100, 1], device=device)

    def call(z_=z, t_=t, red="mean", ii=-100, ls=0.0, cap=None):
        return Sample((z_, t_) + ((red, ii, ls, cap) if reduction else (ii, ls, cap)))

    cases = [
        e(call(z_=f32(())), "at_least_1d", x="logits"),
        e(call(z_=z.to(torch.int64)), "dtype_in", x="logits", dtype=torch.int64, supported=FLOAT_DTYPES),
        e(call(z_=f32(4, 0)), "no_classes", x="logits", dim="last", shape=[4, 0]),
        e(call(t_=t.double()), "dtype_in", x="target", dtype=torch.float64, supported=INT_DTYPES),
        e(call(t_=t[:2]), "target_shape", shape=[4], x="logits", got=[2]),
        e(call(ls=2.5), "label_smoothing", got="2.5"),
        e(call(cap=-0.5), "softcap", got="-0.5"),
    ]
    if reduction:
        cases.append(e(call(red="Mean"), "reduction", got="Mean"))
    if device == "cpu":
        cases.append(e(call(t_=torch.tensor([0, 6, 1, 2])), "target_range", on_fake=False, n=6, ignore_index=-100,
                       got=6, i=1))
    if device == "cuda":
        cases.append(e(call(t_=torch.tensor([0, 5, -100, 1])), "same_device", x="logits", y="target", **_CUDA_VS_CPU))
    return cases


def cross_entropy_errors(device: str) -> list[ErrorInput]:
    return _ce_errors("cross_entropy", device)


def cross_entropy_forward_errors(device: str) -> list[ErrorInput]:
    return _ce_errors("_cross_entropy_forward", device, reduction=False)


def cross_entropy_backward_errors(device: str) -> list[ErrorInput]:
    op = "_cross_entropy_backward"
    e = functools.partial(expect, op)
    z, t = torch.randn(4, 6, device=device), torch.tensor([0, 5, -100, 1], device=device)
    g, lse = torch.ones(4, device=device), torch.zeros(4, device=device)
    tail = (-100, 0.0, None)
    stat = dict(stat="lse", shape=[4], x="logits", dtype=torch.float32)
    return [
        e(Sample((g, torch.randn((), device=device), t, lse) + tail), "at_least_1d", x="logits"),
        e(Sample((torch.ones(5, device=device), z, t, lse) + tail), "same_shape", x="target", y="grad_loss",
          x_shape=[4], y_shape=[5]),
        e(Sample((g, z, t, lse.double()) + tail), "stat_shape_dtype", **stat, got_shape=[4], got_dtype=torch.float64),
        e(Sample((g, z, t, torch.zeros(4, 1, device=device)) + tail), "stat_shape_dtype", **stat, got_shape=[4, 1],
          got_dtype=torch.float32),
        e(Sample((g, z, t, lse, -100, 0.0, 0.0)), "softcap", got="0"),
    ]


OPS: list[OpInfo] = [
    OpInfo("linear_cross_entropy", FLOAT_DTYPES, linear_cross_entropy_samples, linear_cross_entropy_reference,
           linear_cross_entropy_errors, linear_cross_entropy_sized),
    OpInfo("_linear_cross_entropy_chunked", FLOAT_DTYPES, linear_cross_entropy_chunked_samples,
           linear_cross_entropy_reference, linear_cross_entropy_chunked_errors, linear_cross_entropy_chunked_sized),
    OpInfo("_linear_cross_entropy_forward", FLOAT_DTYPES, linear_cross_entropy_forward_samples,
           linear_cross_entropy_forward_reference, linear_cross_entropy_forward_errors,
           linear_cross_entropy_forward_sized, output_dtypes=linear_cross_entropy_forward_dtypes),
    # double backward is refused by its Autograd kernel
    OpInfo("_linear_cross_entropy_backward", FLOAT_DTYPES, linear_cross_entropy_backward_samples,
           linear_cross_entropy_backward_reference, linear_cross_entropy_backward_errors,
           linear_cross_entropy_backward_sized, differentiable=False,
           output_dtypes=linear_cross_entropy_backward_dtypes),
    OpInfo("cross_entropy", FLOAT_DTYPES, cross_entropy_samples, cross_entropy_reference, cross_entropy_errors,
           cross_entropy_sized),
    OpInfo("_cross_entropy_forward", FLOAT_DTYPES, cross_entropy_forward_samples, cross_entropy_forward_reference,
           cross_entropy_forward_errors, cross_entropy_forward_sized, output_dtypes=cross_entropy_forward_dtypes),
    # double backward is refused by its Autograd kernel
    OpInfo("_cross_entropy_backward", FLOAT_DTYPES, cross_entropy_backward_samples, cross_entropy_backward_reference,
           cross_entropy_backward_errors, cross_entropy_backward_sized, differentiable=False),
]
