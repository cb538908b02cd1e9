"""op_db rows of the elementwise ops."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from helpers import FLOAT_DTYPES, INT_DTYPES, make_layout, poison_, random_tensor
from meta_kernels import _checks
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
    return _binary_metadata_errors("vector_add", device, lambda a, b: (a, b), _checks.FLOAT_AND_INT_DTYPES)


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
    cases = _binary_metadata_errors(op, device, lambda a, b: (a, b, torch.empty_like(a)), _checks.FLOAT_AND_INT_DTYPES)
    cases += [
        e(Sample((f32(4, 8), f32(4, 8), f32(4, 9))), "same_shape", x="a", y="out", x_shape=[4, 8], y_shape=[4, 9]),
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


# ---------------------------------------------------------------------------------------------- swiglu
# The gate/up layouts: _ELEMENTWISE_CASES, plus the halves of x.chunk(2, -1) (rows with a row stride,
# read in place) built in _chunk_halves.

# (leading shape, H, storage offset in elements): odd H (rows never 16-byte aligned: the scalar rows
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


def _chunk_halves(lead: tuple[int, ...], h: int, offset: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """gate, up = x.chunk(2, -1) for x of shape (*lead, 2h) starting `offset` elements into its storage."""
    n = 2 * h
    for s in lead:
        n *= s
    x = random_tensor((n + offset,), dtype, device)[offset:].view(*lead, 2 * h)
    gate, up = x.chunk(2, dim=-1)
    return gate, up


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


def _swiglu_pairs(device: str, dtype: torch.dtype, requires_grad: bool) -> list[tuple[torch.Tensor, torch.Tensor, str]]:
    """(gate, up, description) for every swiglu layout; non-finite values only without grads (finite
    differences of inf/NaN mean nothing)."""
    pairs = [(make_layout(shape, dtype, device, lg), make_layout(shape, dtype, device, lu), f"{shape} {lg}+{lu}")
             for shape, lg, lu in _ELEMENTWISE_CASES]
    for lead, h, offset in _CHUNK_CASES:
        gate, up = _chunk_halves(lead, h, offset, dtype, device)
        pairs.append((gate, up, f"chunk halves of {(*lead, 2 * h)}, offset {offset}"))
    pairs.append((_large_gate((9, 40), dtype, device), random_tensor((9, 40), dtype, device), "|gate| up to 1e4"))
    pairs.append((_large_gate((3, 24), dtype, device).t(), random_tensor((24, 3), dtype, device), "|gate| up to 1e4, transposed"))
    if not requires_grad:
        gate, up = _nonfinite_gate_up(dtype, device)
        pairs.append((gate, up, "inf/nan"))
        gate, up = _nonfinite_gate_up(dtype, device)
        pairs.append((gate.repeat(2)[::2], up, "inf/nan, strided"))
    return [(_grad(g, requires_grad), _grad(u, requires_grad), desc) for g, u, desc in pairs]


def swiglu_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    return [Sample((gate, up), desc=desc) for gate, up, desc in _swiglu_pairs(device, dtype, requires_grad)]


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


def swiglu_errors(device: str) -> list[ErrorInput]:
    cases = _binary_metadata_errors("swiglu", device, lambda a, b: (a, b), FLOAT_DTYPES, names=("gate", "up"))
    i32 = lambda *s: torch.randint(-5, 5, s, dtype=torch.int32, device=device)  # noqa: E731
    cases.append(expect("swiglu", Sample((i32(4), i32(4))), "dtype_in", x="gate", dtype=torch.int32,
                        supported=FLOAT_DTYPES))
    return cases


def swiglu_backward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for gate, up, desc in _swiglu_pairs(device, dtype, requires_grad):
        grad_out = _grad(random_tensor(gate.shape, dtype, device), requires_grad)
        samples.append(Sample((grad_out, gate, up), desc=desc))
    # The grad of out.sum(): ones expanded (stride 0 everywhere), next to chunk halves.
    gate, up = _chunk_halves((6,), 16, 0, dtype, device)
    ones = torch.ones((), dtype=dtype, device=device).expand(6, 16)
    samples.append(Sample((ones, _grad(gate, requires_grad), _grad(up, requires_grad)), desc="expanded grad_out, chunk halves"))
    gate, up = _chunk_halves((5,), 7, 1, dtype, device)
    grad_out = make_layout((7, 5), dtype, device, "contiguous").t()
    samples.append(Sample((_grad(grad_out, requires_grad), _grad(gate, requires_grad), _grad(up, requires_grad)),
                          desc="transposed grad_out, odd chunk halves"))
    if not requires_grad:
        gate, up = _nonfinite_gate_up(dtype, device)
        grad_out = torch.tensor([1.0, 2.0, -1.0, 0.5, 1.0, float("inf"), float("nan"), 1.0, 2.0, 3.0, -3.0, 1.0, 1.0],
                                dtype=dtype, device=device)
        samples.append(Sample((grad_out, gate, up), desc="inf/nan in grad_out too"))
    return samples


def swiglu_backward_reference(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # torch's own silu derivative, sigmoid(x) * (1 + x * (1 - sigmoid(x))), in float64.
    s = torch.sigmoid(gate)
    return grad_out * up * (s * (1 + gate * (1 - s))), grad_out * torch.nn.functional.silu(gate)


def swiglu_backward_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return tuple(random_tensor((n, 3), dtype, device) for _ in range(3))


def swiglu_backward_errors(device: str) -> list[ErrorInput]:
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    op = "swiglu_backward"
    e = functools.partial(expect, op)
    cases = _binary_metadata_errors(op, device, lambda a, b: (a, b, a.clone()), FLOAT_DTYPES, names=("grad_out", "gate"))
    cases += [
        e(Sample((f32(4, 8), f32(4, 8), f32(4, 9))), "same_shape", x="grad_out", y="up", x_shape=[4, 8], y_shape=[4, 9]),
        e(Sample((f32(4), f32(4), f32(4).double())), "same_dtype", x="grad_out", y="up", x_dtype=torch.float32,
          y_dtype=torch.float64),
        e(Sample(tuple(torch.randint(-5, 5, (4,), device=device) for _ in range(3))), "dtype_in", x="grad_out",
          dtype=torch.int64, supported=FLOAT_DTYPES),
    ]
    return cases


# ---------------------------------------------------------------------------------------- gelu_and_mul
# swiglu's layouts, the erf and tanh forms alternating over them (non-finite values in both forms).
_GELU_FORMS = ("none", "tanh")


def gelu_and_mul_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    pairs = _swiglu_pairs(device, dtype, requires_grad)
    samples = [Sample((gate, up), {"approximate": _GELU_FORMS[i % 2]}, desc=f"{desc}, {_GELU_FORMS[i % 2]}")
               for i, (gate, up, desc) in enumerate(pairs)]
    if not requires_grad:
        gate, up = _nonfinite_gate_up(dtype, device)
        samples.append(Sample((gate, up), {"approximate": "tanh"}, desc="inf/nan, tanh"))
        gate, up = _nonfinite_gate_up(dtype, device)
        samples.append(Sample((gate, up), {"approximate": "none"}, desc="inf/nan, none"))
    return samples


def gelu_and_mul_reference(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return torch.nn.functional.gelu(gate, approximate=approximate) * up


def gelu_and_mul_errors(device: str) -> list[ErrorInput]:
    op = "gelu_and_mul"
    cases = _binary_metadata_errors(op, device, lambda a, b: (a, b), FLOAT_DTYPES, names=("gate", "up"))
    i32 = lambda *s: torch.randint(-5, 5, s, dtype=torch.int32, device=device)  # noqa: E731
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    cases += [
        expect(op, Sample((i32(4), i32(4))), "dtype_in", x="gate", dtype=torch.int32, supported=FLOAT_DTYPES),
        expect(op, Sample((f32(4), f32(4)), {"approximate": "fast"}), "approximate", got="fast"),
    ]
    return cases


def gelu_and_mul_backward_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for i, sample in enumerate(swiglu_backward_samples(device, dtype, requires_grad)):
        form = _GELU_FORMS[i % 2]
        samples.append(Sample(sample.args, {"approximate": form}, desc=f"{sample.desc}, {form}"))
    return samples


def gelu_and_mul_backward_reference(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                                    approximate: str = "none") -> tuple[torch.Tensor, torch.Tensor]:
    # torch's own gelu derivative (aten::gelu_backward), in float64.
    grad_gate = torch.ops.aten.gelu_backward(grad_out * up, gate, approximate=approximate)
    return grad_gate, grad_out * torch.nn.functional.gelu(gate, approximate=approximate)


def gelu_and_mul_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return (*pair_sized(device, dtype, n), "tanh")  # every schema argument; the non-default form


def gelu_and_mul_backward_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return (*swiglu_backward_sized(device, dtype, n), "tanh")


def gelu_and_mul_backward_errors(device: str) -> list[ErrorInput]:
    op = "gelu_and_mul_backward"
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    cases = _binary_metadata_errors(op, device, lambda a, b: (a, b, a.clone()), FLOAT_DTYPES,
                                    names=("grad_out", "gate"))
    cases += [
        expect(op, Sample((f32(4, 8), f32(4, 8), f32(4, 9))), "same_shape", x="grad_out", y="up", x_shape=[4, 8],
               y_shape=[4, 9]),
        expect(op, Sample((f32(4), f32(4), f32(4)), {"approximate": "Tanh"}), "approximate", got="Tanh"),
    ]
    return cases


OPS: list[OpInfo] = [
    OpInfo(
        name="vector_add",
        dtypes=FLOAT_DTYPES + INT_DTYPES,
        sample_inputs=vector_add_samples,
        reference=vector_add_reference,
        error_inputs=vector_add_errors,
        sized_inputs=pair_sized,
    ),
    OpInfo(
        name="vector_add_out",
        dtypes=FLOAT_DTYPES + INT_DTYPES,
        sample_inputs=vector_add_out_samples,
        reference=vector_add_out_reference,
        error_inputs=vector_add_out_errors,
        sized_inputs=vector_add_out_sized,
        differentiable=False,
        mutated_arg=2,
    ),
    OpInfo(
        name="swiglu",
        dtypes=FLOAT_DTYPES,
        sample_inputs=swiglu_samples,
        reference=swiglu_reference,
        error_inputs=swiglu_errors,
        sized_inputs=pair_sized,
    ),
    # Differentiable: its double backward (ATen math in csrc/autograd/gated.cpp) is gradchecked here.
    OpInfo(
        name="swiglu_backward",
        dtypes=FLOAT_DTYPES,
        sample_inputs=swiglu_backward_samples,
        reference=swiglu_backward_reference,
        error_inputs=swiglu_backward_errors,
        sized_inputs=swiglu_backward_sized,
    ),
    OpInfo(
        name="gelu_and_mul",
        dtypes=FLOAT_DTYPES,
        sample_inputs=gelu_and_mul_samples,
        reference=gelu_and_mul_reference,
        error_inputs=gelu_and_mul_errors,
        sized_inputs=gelu_and_mul_sized,
    ),
    OpInfo(
        name="gelu_and_mul_backward",
        dtypes=FLOAT_DTYPES,
        sample_inputs=gelu_and_mul_backward_samples,
        reference=gelu_and_mul_backward_reference,
        error_inputs=gelu_and_mul_backward_errors,
        sized_inputs=gelu_and_mul_backward_sized,
    ),
]
