"""op_db rows of the elementwise ops: vector_add's, and the gated family's, generated from one GatedInfo per
gated op (GATED), which tests/test_gated.py runs its family tests over too."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from helpers import (FLOAT_AND_INT_DTYPES, FLOAT_DTYPES, TOLERANCES, chunk_halves, exact_gelu, make_layout, poison_,
                     random_tensor)
from op_db.core import ErrorInput, OpInfo, Sample, _grad, expect  # noqa: F401


# ---------------------------------------------------------------------------------------------- vector_add
# (shape, layout of the first input, layout of the second), shared by the elementwise ops: empty, 0-dim,
# sizes that miss the 16-byte vector width, misaligned starts, transposed, sliced, broadcast (stride 0),
# permuted, 5-D.
_ELEMENTWISE_CASES: list[tuple[tuple[int, ...], str, str]] = [
    ((), "contiguous", "contiguous"),
    ((0,), "contiguous", "contiguous"),
    ((2, 0, 3), "contiguous", "contiguous"),
    ((1,), "contiguous", "contiguous"),
    ((7,), "contiguous", "contiguous"),
    ((4097,), "contiguous", "contiguous"),
    ((33,), "offset", "contiguous"),
    ((1000,), "offset", "offset"),
    ((3, 5), "transposed", "contiguous"),
    ((33, 70), "transposed", "transposed"),
    ((5, 9), "sliced", "contiguous"),
    ((4, 6), "expanded", "contiguous"),
    ((2, 3, 4), "permuted", "contiguous"),
    ((2, 3, 4, 5, 6), "sliced", "permuted"),
]
# vector_add's tiled CUDA path for transposed operands, with partial tiles.
_VECTOR_ADD_CASES = _ELEMENTWISE_CASES + [
    ((64, 33), "contiguous", "transposed"),
    ((130, 257), "transposed", "sliced"),
]


def vector_add_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    return [
        Sample((_grad(make_layout(shape, dtype, device, la), requires_grad),
                _grad(make_layout(shape, dtype, device, lb), requires_grad)), desc=f"{shape} {la}+{lb}")
        for shape, la, lb in _VECTOR_ADD_CASES
    ]


def vector_add_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def vector_add_out_reference(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return a + b


def pair_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    """Two (n, 3) tensors: the sized inputs of the two-operand elementwise ops."""
    return (random_tensor((n, 3), dtype, device), random_tensor((n, 3), dtype, device))


# The devices a same-device error names when the second tensor is on the CPU.
_CUDA_VS_CPU = {"x_device": "cuda:0", "y_device": "cpu"}


def _binary_metadata_errors(op: str, device: str, extra: Callable[[torch.Tensor, torch.Tensor], tuple],
                            supported: Sequence[torch.dtype], names: tuple[str, str] = ("a", "b")) -> list[ErrorInput]:
    """Shape, dtype and device mismatches and unsupported dtypes for an op taking (a, b, ...); `names` are
    the schema's names of a and b, `supported` the op's dtypes."""
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    e = functools.partial(expect, op)
    a, b = names
    cases = [
        e(Sample(extra(f32(4, 8), f32(4, 9))), "same_shape", x=a, y=b, x_shape=[4, 8], y_shape=[4, 9]),
        e(Sample(extra(f32(4), f32(4).half())), "same_dtype", x=a, y=b, x_dtype=torch.float32, y_dtype=torch.float16),
        e(Sample(extra(f32(4) > 0, f32(4) > 0)), "dtype_in", x=a, dtype=torch.bool, supported=supported),
        e(Sample(extra(f32(4).to(torch.complex64), f32(4).to(torch.complex64))), "dtype_in", x=a,
          dtype=torch.complex64, supported=supported),
        e(Sample(extra(f32(4).to(torch.int8), f32(4).to(torch.int8))), "dtype_in", x=a, dtype=torch.int8,
          supported=supported),
    ]
    if device == "cuda":
        cases.append(e(Sample(extra(f32(4), torch.randn(4))), "same_device", x=a, y=b, **_CUDA_VS_CPU))
    return cases


def vector_add_errors(device: str) -> list[ErrorInput]:
    return _binary_metadata_errors("vector_add", device, lambda a, b: (a, b), FLOAT_AND_INT_DTYPES)


def vector_add_out_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for shape, la, lb in _VECTOR_ADD_CASES:
        a, b = make_layout(shape, dtype, device, la), make_layout(shape, dtype, device, lb)
        out_layout = "transposed" if len(shape) >= 2 else "contiguous"
        samples.append(Sample((a, b, poison_(make_layout(shape, dtype, device, out_layout))), desc=f"{shape} {la}+{lb}->{out_layout}"))
    a, b = random_tensor((5, 7), dtype, device), random_tensor((5, 7), dtype, device)
    samples.append(Sample((a, b, a), desc="out is a"))
    a, b = random_tensor((100,), dtype, device), random_tensor((100,), dtype, device)
    samples.append(Sample((a, b, b), desc="out is b"))
    a, b = make_layout((33, 70), dtype, device, "transposed"), make_layout((33, 70), dtype, device, "sliced")
    samples.append(Sample((a, b, a), desc="out is a, transposed"))
    return samples


def vector_add_out_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return (*pair_sized(device, dtype, n), torch.empty((n, 3), dtype=dtype, device=device))


def vector_add_out_errors(device: str) -> list[ErrorInput]:
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    base = f32(9)
    op = "vector_add_out"
    e = functools.partial(expect, op)
    cases = _binary_metadata_errors(op, device, lambda a, b: (a, b, torch.empty_like(a)), FLOAT_AND_INT_DTYPES)
    cases += [  # (an out of another shape is resized: tests/test_vector_add.py)
        e(Sample((f32(4), f32(4), f32(4).double())), "same_dtype", x="a", y="out", x_dtype=torch.float32,
          y_dtype=torch.float64),
        e(Sample((f32(3), f32(3), f32(1).expand(3))), "internal_overlap", x="out", on_fake=False),
        e(Sample((base[:-1], f32(8), base[1:])), "partial_overlap", x="out", y="a", on_fake=False),
        e(Sample((base[2::2], f32(4), base[0:8:2])), "partial_overlap", x="out", y="a", on_fake=False),
        e(Sample((f32(4, 4), f32(4, 4), f32(20).as_strided((4, 4), (2, 1)))), "internal_overlap", x="out",
          on_fake=False),
        e(Sample((f32(3).requires_grad_(), f32(3), f32(3))), "out_requires_grad", x="a"),
    ]
    return cases


# ------------------------------------------------------------------------------------------ gated family
# One GatedInfo per gated op, act(gate) * up: its torch math, its forms (the values of its extra schema
# arguments), and what the family's accuracy tests allow it. Its op and backward op's OpInfos below, and
# every test of tests/test_gated.py, come from the row.


@dataclass(frozen=True)
class GatedInfo:
    name: str  # the op; its backward op is f"{name}_backward", its wrapper torchops.<name>
    act: Callable[..., torch.Tensor]  # act(x, **form), in torch ops
    act_grad: Callable[..., torch.Tensor]  # act_grad(g, x, **form) = g * act'(x), torch's own derivative
    # act and act' in float64, free of the cancellations of torch's formulas (the ulp tests' exact values)
    exact: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    # (value_scale, slope_scale) of x, float64: where act or act' cancels, an f32 computation is accurate to
    # eps times these rather than to a few ulp (zeros where it is not)
    error_scales: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    ulp_gate_range: float  # gates drawn from [-r, r] for the ulp tests
    # the extra absolute error of the f32 math on a 16-bit gate x, beyond 1 ulp
    f32_abs_error: Callable[[torch.Tensor], torch.Tensor | float]
    # bound on |CUDA - CPU|, both computed in f32 from the same formula: (rtol, atol) per dtype
    cuda_vs_cpu: dict[torch.dtype, tuple[float, float]]
    flushes_below: float | None = None  # gates below which the f32 result is exactly 0, as torch's is
    forms: tuple[dict[str, Any], ...] = ({},)  # keyword arguments of each form; the first is the default
    # (kwargs, message key, fields): an extra argument no form has, and the error it raises
    form_errors: tuple[tuple[dict[str, Any], str, dict[str, Any]], ...] = ()

    @property
    def backward_name(self) -> str:
        return f"{self.name}_backward"

    @property
    def written(self) -> tuple[int, int]:
        """The positions of grad_gate and grad_up in the backward's out= form: after the tensors and the form."""
        first = 3 + len(self.forms[0])
        return first, first + 1

    def reference(self, gate: torch.Tensor, up: torch.Tensor, **form: Any) -> torch.Tensor:
        return self.act(gate, **form) * up

    def backward_reference(self, grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                           **form: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.act_grad(grad_out * up, gate, **form), grad_out * self.act(gate, **form)


def _silu_exact(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = torch.sigmoid(x)
    return x * s, s * (1 + x * (1 - s))


def _silu_error_scales(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = torch.sigmoid(x)  # silu' = s (1 + x (1 - s)) cancels near x = -1.28
    return torch.zeros_like(x), s + (x * s * (1 - s)).abs()


def _gelu_error_scales(x: torch.Tensor, approximate: str = "none") -> tuple[torch.Tensor, torch.Tensor]:
    # |x| Phi(x) + |x| |Phi| bounds the value's rounding, |Phi| + |x phi| + ... the derivative's; the erf form's
    # Phi = (1 + erf) / 2 is accurate to ~eps absolute, not relative (as torch's is), far below zero.
    cdf = 0.5 * (1 + torch.erf(x / math.sqrt(2)))
    pdf = torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return x.abs() * torch.maximum(cdf, torch.ones_like(cdf)) * (1 + x.abs()), cdf + x.abs() * pdf * (1 + x * x) + 1


# torch.testing's default tolerances, f32's atol tightened: the same formula on both devices.
_CLOSE_F32 = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (2e-6, 1e-6),
              torch.float64: (1e-7, 1e-7)}

GATED: list[GatedInfo] = [
    GatedInfo(
        name="swiglu",
        act=F.silu,
        act_grad=lambda g, x: g * _silu_exact(x)[1],
        exact=_silu_exact,
        error_scales=_silu_error_scales,
        ulp_gate_range=20.0,
        f32_abs_error=lambda x: 0.0,
        cuda_vs_cpu=_CLOSE_F32,
        flushes_below=-88.72,  # exp(-gate) overflows f32: silu is -0, as torch's F.silu gives in bf16 and f32
    ),
    GatedInfo(
        name="gelu_and_mul",
        act=lambda x, approximate="none": F.gelu(x, approximate=approximate),
        act_grad=lambda g, x, approximate="none": torch.ops.aten.gelu_backward(g, x, approximate=approximate),
        exact=lambda x, approximate="none": exact_gelu(x, approximate),
        error_scales=_gelu_error_scales,
        ulp_gate_range=8.0,
        # far below zero gelu (~1e-9 at -6) is below the f32 math's resolution of Phi (~6e-8 relative to 1)
        f32_abs_error=lambda x: 2.0**-22 * x.abs(),
        cuda_vs_cpu=TOLERANCES,
        forms=({"approximate": "none"}, {"approximate": "tanh"}),
        form_errors=tuple(({"approximate": v}, "approximate", {"got": v}) for v in ("erf", "", "fast", "Tanh")),
    ),
]


def gated_forms() -> list[tuple[GatedInfo, dict[str, Any]]]:
    """(row, form) for every form of every gated op."""
    return [(row, form) for row in GATED for form in row.forms]


# The gate/up layouts: _ELEMENTWISE_CASES, plus the halves of x.chunk(2, -1) (rows with a row stride, read in
# place): (leading shape, H, storage offset in elements): odd H (rows never 16-byte aligned: the scalar rows
# path), H a multiple of every vector width (16-byte vectors), a misaligned base, a 3-D leading shape.
_CHUNK_CASES: list[tuple[tuple[int, ...], int, int]] = [
    ((5,), 7, 0),
    ((3,), 33, 0),
    ((4,), 16, 0),
    ((6,), 64, 0),
    ((5,), 16, 1),
    ((2, 3), 24, 0),
    ((1,), 40, 0),
]


def _large_gate(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """Random gate with |gate| up to 1e4 in places: exp(-gate) overflows f32 (and f64 at -1e4)."""
    gate = random_tensor(shape, dtype, device)
    big = torch.tensor([1e4, -1e4, 100.0, -100.0, 88.5, -88.5, 30.0, -30.0, 1e3, -1e3, 17.0, -17.0], dtype=torch.float64)
    flat = gate.view(-1)
    flat[: big.numel()] = big.to(dtype)
    flat[-big.numel():] = big.flip(0).to(dtype)
    return gate


def _nonfinite_gate_up(dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    inf, nan = float("inf"), float("nan")
    gate = torch.tensor([inf, -inf, nan, 0.0, 1.5, -2.0, inf, -inf, nan, 1e4, -1e4, 0.5, -0.5], dtype=torch.float64)
    up = torch.tensor([1.5, 2.0, 1.0, inf, nan, -inf, 0.0, 0.0, 0.0, inf, inf, -inf, nan], dtype=torch.float64)
    return gate.to(dtype=dtype, device=device), up.to(dtype=dtype, device=device)


def _gated_pairs(device: str, dtype: torch.dtype, requires_grad: bool) -> list[tuple[torch.Tensor, torch.Tensor, str]]:
    """(gate, up, description) for every layout; non-finite values only without grads (finite differences of
    inf/NaN mean nothing)."""
    pairs = [(make_layout(shape, dtype, device, lg), make_layout(shape, dtype, device, lu), f"{shape} {lg}+{lu}")
             for shape, lg, lu in _ELEMENTWISE_CASES]
    for lead, h, offset in _CHUNK_CASES:
        _, gate, up = chunk_halves(lead, h, dtype, device, offset=offset)
        pairs.append((gate, up, f"chunk halves of {(*lead, 2 * h)}, offset {offset}"))
    pairs.append((_large_gate((9, 40), dtype, device), random_tensor((9, 40), dtype, device), "|gate| up to 1e4"))
    pairs.append((_large_gate((3, 24), dtype, device).t(), random_tensor((24, 3), dtype, device), "|gate| up to 1e4, transposed"))
    if not requires_grad:
        gate, up = _nonfinite_gate_up(dtype, device)
        pairs.append((gate, up, "inf/nan"))
        gate, up = _nonfinite_gate_up(dtype, device)
        pairs.append((gate.repeat(2)[::2], up, "inf/nan, strided"))
    return [(_grad(g, requires_grad), _grad(u, requires_grad), desc) for g, u, desc in pairs]


def _with_form(sample: Sample, form: dict[str, Any]) -> Sample:
    return Sample(sample.args, dict(form), desc=", ".join([sample.desc, *map(str, form.values())]))


def _with_forms(row: GatedInfo, samples: list[Sample], requires_grad: bool) -> list[Sample]:
    """The samples with the row's forms taking turns over them; without grads, the non-finite values in
    every form."""
    out = [_with_form(s, row.forms[i % len(row.forms)]) for i, s in enumerate(samples)]
    if not requires_grad and len(row.forms) > 1:
        out += [_with_form(s, form) for s in samples if "inf/nan" in s.desc for form in row.forms]
    return out


def _gated_samples(row: GatedInfo, device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    pairs = [Sample((gate, up), desc=desc) for gate, up, desc in _gated_pairs(device, dtype, requires_grad)]
    return _with_forms(row, pairs, requires_grad)


def _gated_backward_samples(row: GatedInfo, device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for gate, up, desc in _gated_pairs(device, dtype, requires_grad):
        grad_out = _grad(random_tensor(gate.shape, dtype, device), requires_grad)
        samples.append(Sample((grad_out, gate, up), desc=desc))
    # The grad of out.sum(): ones expanded (stride 0 everywhere), next to chunk halves.
    _, gate, up = chunk_halves(6, 16, dtype, device)
    ones = torch.ones((), dtype=dtype, device=device).expand(6, 16)
    samples.append(Sample((ones, _grad(gate, requires_grad), _grad(up, requires_grad)), desc="expanded grad_out, chunk halves"))
    _, gate, up = chunk_halves(5, 7, dtype, device, offset=1)
    grad_out = make_layout((7, 5), dtype, device, "contiguous").t()
    samples.append(Sample((_grad(grad_out, requires_grad), _grad(gate, requires_grad), _grad(up, requires_grad)),
                          desc="transposed grad_out, odd chunk halves"))
    if not requires_grad:
        gate, up = _nonfinite_gate_up(dtype, device)
        grad_out = torch.tensor([1.0, 2.0, -1.0, 0.5, 1.0, float("inf"), float("nan"), 1.0, 2.0, 3.0, -3.0, 1.0, 1.0],
                                dtype=dtype, device=device)
        samples.append(Sample((grad_out, gate, up), desc="inf/nan in grad_out too"))
    return _with_forms(row, samples, requires_grad)


def _gated_errors(row: GatedInfo, device: str) -> list[ErrorInput]:
    op = row.name
    cases = _binary_metadata_errors(op, device, lambda a, b: (a, b), FLOAT_DTYPES, names=("gate", "up"))
    i32 = lambda *s: torch.randint(-5, 5, s, dtype=torch.int32, device=device)  # noqa: E731
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    cases.append(expect(op, Sample((i32(4), i32(4))), "dtype_in", x="gate", dtype=torch.int32, supported=FLOAT_DTYPES))
    cases += [expect(op, Sample((f32(4), f32(4)), kwargs), key, **fields) for kwargs, key, fields in row.form_errors]
    return cases


def _gated_backward_errors(row: GatedInfo, device: str) -> list[ErrorInput]:
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    op = row.backward_name
    e = functools.partial(expect, op)
    cases = _binary_metadata_errors(op, device, lambda a, b: (a, b, a.clone()), FLOAT_DTYPES, names=("grad_out", "gate"))
    cases += [
        e(Sample((f32(4, 8), f32(4, 8), f32(4, 9))), "same_shape", x="grad_out", y="up", x_shape=[4, 8], y_shape=[4, 9]),
        e(Sample((f32(4), f32(4), f32(4).double())), "same_dtype", x="grad_out", y="up", x_dtype=torch.float32,
          y_dtype=torch.float64),
        e(Sample(tuple(torch.randint(-5, 5, (4,), device=device) for _ in range(3))), "dtype_in", x="grad_out",
          dtype=torch.int64, supported=FLOAT_DTYPES),
    ]
    cases += [e(Sample((f32(4), f32(4), f32(4)), kwargs), key, **fields) for kwargs, key, fields in row.form_errors]
    return cases


def _as_out_sample(row: GatedInfo, sample: Sample, grad_gate: torch.Tensor, grad_up: torch.Tensor, desc: str) -> Sample:
    """A backward sample as the out= form takes it: the form's arguments positional, then the two results."""
    form = [sample.kwargs.get(name, default) for name, default in row.forms[0].items()]
    return Sample((*sample.args, *form, grad_gate, grad_up), desc=f"{sample.desc}; {desc}")


def _gated_backward_out_samples(row: GatedInfo, device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    # New poisoned results (transposed where 2-D), then results that are inputs exactly: grad_gate in
    # grad_out (what the backward does with a gradient nothing else holds) and grad_up in up.
    samples = []
    for i, s in enumerate(_gated_backward_samples(row, device, dtype, False)):
        grad_out, gate, up = s.args
        if i % 2 == 0 or 0 in grad_out.stride() or 0 in up.stride():
            new = lambda: poison_(make_layout(tuple(gate.shape), dtype, device,  # noqa: E731
                                              "transposed" if gate.dim() == 2 else "contiguous"))
            samples.append(_as_out_sample(row, s, new(), new(), "new results"))
        else:
            samples.append(_as_out_sample(row, s, grad_out, up, "grad_gate is grad_out, grad_up is up"))
    return samples


def _gated_backward_out_reference(row: GatedInfo, grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                                  *rest: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return row.backward_reference(grad_out, gate, up, **dict(zip(row.forms[0], rest[:-2])))


def _gated_backward_out_errors(row: GatedInfo, device: str) -> list[ErrorInput]:
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    op = f"{row.backward_name}_out"
    e = functools.partial(expect, op)
    form = tuple(row.forms[0].values())
    call = lambda g, x, u, gg, gu: (g, x, u, *form, gg, gu)  # noqa: E731
    cases = _binary_metadata_errors(op, device, lambda a, b: call(a, b, a.clone(), a.clone(), a.clone()), FLOAT_DTYPES,
                                    names=("grad_out", "gate"))
    base = f32(9)
    cases += [
        e(Sample(call(f32(4), f32(4), f32(4), f32(4).double(), f32(4))), "same_dtype", x="grad_out", y="grad_gate",
          x_dtype=torch.float32, y_dtype=torch.float64),
        e(Sample(call(f32(4), f32(4), f32(4), f32(4), f32(4).half())), "same_dtype", x="grad_out", y="grad_up",
          x_dtype=torch.float32, y_dtype=torch.float16),
        e(Sample(call(f32(3), f32(3), f32(3), f32(1).expand(3), f32(3))), "internal_overlap", x="grad_gate",
          on_fake=False),
        e(Sample(call(f32(8), base[1:], f32(8), base[:-1], f32(8))), "partial_overlap", x="grad_gate", y="gate",
          on_fake=False),
        e(Sample(call(f32(9), f32(9), f32(9), base, base)), "outs_share_memory", x="grad_up", y="grad_gate",
          on_fake=False),
        e(Sample(call(f32(3), f32(3).requires_grad_(), f32(3), f32(3), f32(3))), "out_requires_grad", x="gate"),
    ]
    cases += [e(Sample((f32(4),) * 3 + tuple(kwargs.values()) + (f32(4), f32(4))), key, **fields)
              for kwargs, key, fields in row.form_errors]
    return cases


def _gated_sized(row: GatedInfo, tensors: int, device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    """`tensors` (n, 3) tensors, then every extra schema argument in the last (non-default) form."""
    return (*(random_tensor((n, 3), dtype, device) for _ in range(tensors)), *row.forms[-1].values())


def _gated_out_sized(row: GatedInfo, device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return (*_gated_sized(row, 3, device, dtype, n), *(torch.empty((n, 3), dtype=dtype, device=device) for _ in range(2)))


def _gated_op_infos(row: GatedInfo) -> list[OpInfo]:
    """The op, its backward op (differentiable too: the double backward is gradchecked) and the backward's
    out= form."""
    p = functools.partial
    return [
        OpInfo(row.name, FLOAT_DTYPES, p(_gated_samples, row), row.reference, p(_gated_errors, row),
               p(_gated_sized, row, 2)),
        OpInfo(row.backward_name, FLOAT_DTYPES, p(_gated_backward_samples, row), row.backward_reference,
               p(_gated_backward_errors, row), p(_gated_sized, row, 3)),
        OpInfo(f"{row.backward_name}_out", FLOAT_DTYPES, p(_gated_backward_out_samples, row),
               p(_gated_backward_out_reference, row), p(_gated_backward_out_errors, row), p(_gated_out_sized, row),
               differentiable=False, mutated_args=row.written),
    ]


# name, dtypes, samples, reference, errors, sized inputs (op_db.core.OpInfo)
OPS: list[OpInfo] = [
    OpInfo("vector_add", FLOAT_AND_INT_DTYPES, vector_add_samples, vector_add_reference, vector_add_errors,
           pair_sized),
    OpInfo("vector_add_out", FLOAT_AND_INT_DTYPES, vector_add_out_samples, vector_add_out_reference,
           vector_add_out_errors, vector_add_out_sized, differentiable=False, mutated_args=(2,)),
] + [info for row in GATED for info in _gated_op_infos(row)]
