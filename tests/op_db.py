"""The table that drives the generic tests: one OpInfo per myns operator.

Adding an op means adding its OpInfo here (samples, reference, error inputs); test_ops.py, test_pt2.py
and test_registration.py then cover it on every path.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from helpers import FLOAT_DTYPES, INT_DTYPES, make_layout, poison_, random_tensor
from meta_kernels import _checks


@dataclass
class Sample:
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    desc: str = ""


@dataclass
class ErrorInput:
    """A bad call and the error it must raise: a message of the one table (meta_kernels._checks.MESSAGES),
    by key and fields, never re-typed here."""

    sample: Sample
    op: str  # the op the message names
    key: str  # in meta_kernels._checks.MESSAGES
    fields: dict[str, Any]
    on_fake: bool = True  # the fake kernel raises it too (metadata errors, not memory-overlap or structure ones)

    @property
    def message(self) -> str:
        """The exact RuntimeError text."""
        return _checks.message(self.op, self.key, **self.fields)

    @property
    def match(self) -> str:
        """A regex matching exactly the message (for pytest.raises)."""
        return "^" + re.escape(self.message) + "$"


def expect(op: str, sample: Sample, key: str, *, on_fake: bool = True, **fields: Any) -> ErrorInput:
    return ErrorInput(sample, op, key, fields, on_fake)


@dataclass
class OpInfo:
    name: str
    dtypes: tuple[torch.dtype, ...]
    # (device, dtype, requires_grad) -> samples; every sample's tensors are fresh.
    sample_inputs: Callable[[str, torch.dtype, bool], list[Sample]]
    # Same math on the samples' args upcast to float64 (or the ints themselves), on the CPU.
    reference: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]]
    error_inputs: Callable[[str], list[ErrorInput]]
    # (device, dtype, n) -> args whose sizes scale with n: used to check one compiled graph serves all n.
    sized_inputs: Callable[[str, torch.dtype, int], tuple[Any, ...]]
    differentiable: bool = True
    mutated_arg: int | None = None  # out= ops: index of the argument written (the op returns nothing)
    # dtype of each output for a sample; None: every output has the sample's dtype.
    output_dtypes: Callable[[Sample], tuple[torch.dtype, ...]] | None = None

    @property
    def op(self) -> torch._ops.OpOverload:
        return getattr(torch.ops.myns, self.name).default

    @property
    def qualname(self) -> str:
        return f"myns::{self.name}"


def _grad(t: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    return t.requires_grad_(requires_grad) if t.dtype.is_floating_point else t


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


# ------------------------------------------------------------------------------------------------ csr_spmm
# A CSR matrix is given by its rows' column lists; values are random. The cases: an empty row, unsorted and
# duplicate columns within a row, one row much longer than the others (several CUDA work units, so the
# carry path runs), nnz = 0, M = 0, K = 0, N = 0 / 1 / odd / a multiple of 4 / wide (column tiles), and
# dense transposed, column-sliced (copied) and row-sliced (read in place through its row stride).
def _rows_random(m: int, k: int, max_len: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, max_len + 1, (m,), generator=g).tolist()
    return [torch.randint(0, k, (n,), generator=g).tolist() if k else [] for n in lens]


def _rows_long(m: int, k: int, long_len: int) -> list[list[int]]:
    rows = [[(3 * i + 1) % k] for i in range(m)]
    rows[2] = [(7 * j) % k for j in range(long_len)]  # wraps around: duplicates too
    rows[4] = []
    return rows


_CSR_CASES: list[tuple[str, list[list[int]], int, int, str]] = [  # desc, rows, K, N, dense layout
    ("general", [[1, 4, 2], [], [6, 0, 6], [3], [5, 1, 0, 2]], 7, 8, "contiguous"),  # unsorted, duplicates, empty row
    ("odd N", [[1, 4, 2], [], [6, 0, 6], [3], [5, 1, 0, 2]], 7, 3, "contiguous"),
    ("N=1", [[0, 2], [1], [], [2, 2]], 3, 1, "contiguous"),
    ("nnz=0", [[], [], [], []], 3, 5, "contiguous"),
    ("M=0", [], 3, 4, "contiguous"),
    ("K=0", [[], []], 0, 4, "contiguous"),
    ("N=0", [[0], [1, 0]], 2, 0, "contiguous"),
    ("long row", _rows_long(9, 20, 150), 20, 4, "contiguous"),
    ("random", _rows_random(40, 30, 9, 1), 30, 33, "contiguous"),
    ("random N=64", _rows_random(37, 25, 12, 2), 25, 64, "contiguous"),
    ("random wide N", _rows_random(12, 10, 6, 3), 10, 520, "contiguous"),
    ("dense transposed", _rows_random(9, 11, 5, 4), 11, 6, "transposed"),
    ("dense column-sliced", _rows_random(9, 11, 5, 5), 11, 8, "sliced"),
    ("dense row-sliced", _rows_random(9, 11, 5, 6), 11, 12, "row-sliced"),
    ("dense misaligned", _rows_random(9, 11, 5, 7), 11, 16, "offset"),
]


def _csr_indices(rows: list[list[int]], index_dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    lens = torch.tensor([0] + [len(r) for r in rows], dtype=torch.int64)
    crow = torch.cumsum(lens, 0).to(index_dtype)
    col = torch.tensor([c for r in rows for c in r], dtype=index_dtype)
    return crow.to(device), col.to(device)


def _dense(k: int, n: int, dtype: torch.dtype, device: str, layout: str) -> torch.Tensor:
    if layout == "row-sliced":  # columns contiguous, row stride n + 5, misaligned start
        return random_tensor((k, n + 5), dtype, device)[:, 3:3 + n]
    return make_layout((k, n), dtype, device, layout)


def _index_dtype(i: int) -> torch.dtype:
    return INT_DTYPES[i % 2]  # the cases alternate int32 and int64 indices


def csr_spmm_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for i, (desc, rows, k, n, layout) in enumerate(_CSR_CASES):
        crow, col = _csr_indices(rows, _index_dtype(i), device)
        values = _grad(random_tensor((col.numel(),), dtype, device), requires_grad)
        dense = _grad(_dense(k, n, dtype, device, layout), requires_grad)
        samples.append(Sample((crow, col, values, dense), desc=f"{desc} ({col.dtype})"))
    return samples


def _csr_rows(crow: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(crow.numel() - 1), (crow[1:] - crow[:-1]).long())


def csr_spmm_reference(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, dense: torch.Tensor,
                       *transpose: torch.Tensor) -> torch.Tensor:
    a = torch.zeros(crow.numel() - 1, dense.shape[0], dtype=values.dtype)
    a.index_put_((_csr_rows(crow), col.long()), values, accumulate=True)  # duplicates add up
    return a @ dense


def csr_transpose_reference(crow: torch.Tensor, col: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    perm = torch.sort(col, stable=True).indices
    counts = torch.bincount(col.long(), minlength=k)
    t_crow = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
    return t_crow.to(crow.dtype), _csr_rows(crow)[perm].to(crow.dtype), perm.to(crow.dtype)


def csr_spmm_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    """n rows, K = n + 1 columns, 3 nonzeros per row: every size but N = 4 scales with n."""
    crow, col = _csr_indices([[i, (i + 1) % (n + 1), (2 * i + 3) % (n + 1)] for i in range(n)], torch.int64, device)
    return (crow, col, random_tensor((3 * n,), dtype, device), random_tensor((n + 1, 4), dtype, device))


def _csr_example(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A valid (crow, col, values, dense): 2 x 3 with 3 nonzeros, dense 3 x 4, int64 indices."""
    crow, col = torch.tensor([0, 2, 3], device=device), torch.tensor([0, 2, 1], device=device)
    return crow, col, torch.randn(3, device=device), torch.randn(3, 4, device=device)


def _csr_metadata_errors(op: str, device: str, make: Callable[..., tuple], device_of: str = "values") -> list[ErrorInput]:
    """Argument errors for ops taking (crow, col, values-like, dense, ...): `make(crow, col, values, dense)`;
    `device_of`: the argument whose device the others are checked against."""
    i32, i64 = torch.int32, torch.int64
    crow, col, v, d = _csr_example(device)
    e = functools.partial(expect, op)
    cases = [
        e(Sample(make(crow.to(i32), col.to(i64), v, d)), "same_dtype", x="crow_indices", y="col_indices",
          x_dtype=i32, y_dtype=i64),
        e(Sample(make(crow.float(), col.float(), v, d)), "dtype_in", x="crow_indices", dtype=torch.float32,
          supported=INT_DTYPES),
        e(Sample(make(crow.view(1, 3), col, v, d)), "one_d", x="crow_indices", shape=[1, 3]),
        e(Sample(make(crow[:0], col, v, d)), "crow_empty", x="crow_indices"),
        e(Sample(make(crow, col.view(3, 1), v, d)), "one_d", x="col_indices", shape=[3, 1]),
    ]
    if device == "cuda":
        cases.append(e(Sample(make(crow.cpu(), col, v, d)), "same_device", x=device_of, y="crow_indices",
                       **_CUDA_VS_CPU))
        cases.append(e(Sample(make(crow, col, v, d.cpu())), "same_device", x=device_of, y="dense",
                       **_CUDA_VS_CPU))
    return cases


def _csr_structure_errors(op: str, device: str, make: Callable[..., tuple]) -> list[ErrorInput]:
    """Malformed CSR structure: raised by the CPU kernels (which read the indices), not by fake kernels."""
    if device != "cpu":
        return []  # CUDA kernels don't validate (no sync); see test_csr_spmm.py for what they guarantee
    v, d = torch.randn(3), torch.randn(3, 4)
    t = torch.tensor
    e = functools.partial(expect, op, on_fake=False)
    return [
        e(Sample(make(t([1, 2, 3]), t([0, 2, 1]), v, d)), "crow_first", got=1),
        e(Sample(make(t([0, 3, 2, 3]), t([0, 2, 1]), v, d)), "crow_decreasing", i=1, a=3, j=2, b=2),
        e(Sample(make(t([0, 2, 2]), t([0, 2, 1]), v, d)), "crow_last", nnz=3, got=2),
        e(Sample(make(t([0, 2, 3]), t([0, 3, 1]), v, d)), "col_out_of_range", K=3, p=1, got=3),
        e(Sample(make(t([0, 2, 3]), t([0, 1, -1]), v, d)), "col_out_of_range", K=3, p=2, got=-1),
    ]


def csr_spmm_errors(device: str) -> list[ErrorInput]:
    op = "csr_spmm"
    make = lambda crow, col, v, d: (crow, col, v, d)  # noqa: E731
    crow, col, v, d = _csr_example(device)
    e = functools.partial(expect, op)
    cases = _csr_metadata_errors(op, device, make) + _csr_structure_errors(op, device, make) + [
        e(Sample((crow, col, v, d.double())), "same_dtype", x="values", y="dense", x_dtype=torch.float32,
          y_dtype=torch.float64),
        e(Sample((crow, col, torch.randn(4, device=device), d)), "nnz_mismatch", col=3, values=4),
        e(Sample((crow, col, v, torch.randn(3, device=device))), "two_d", x="dense", shape=[3]),
        e(Sample((crow, col, v.view(3, 1), d)), "one_d", x="values", shape=[3, 1]),
        e(Sample((crow, col, v.int(), d.int())), "dtype_in", x="values", dtype=torch.int32, supported=FLOAT_DTYPES),
    ]
    if device == "cuda":
        cases.append(e(Sample((crow, col, v.cpu(), d)), "same_device", x="values", y="crow_indices",
                       x_device="cpu", y_device="cuda:0"))
    return cases


def _with_transpose_args(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, dense: torch.Tensor) -> tuple:
    t = csr_transpose_reference(crow.cpu(), col.cpu(), dense.shape[0])
    return (crow, col, values, dense, *(x.to(crow.device) for x in t))


def csr_spmm_with_transpose_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    return [Sample(_with_transpose_args(*s.args), desc=s.desc) for s in csr_spmm_samples(device, dtype, requires_grad)]


def csr_spmm_with_transpose_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    return _with_transpose_args(*csr_spmm_sized(device, dtype, n))


def csr_spmm_with_transpose_errors(device: str) -> list[ErrorInput]:
    def make(crow, col, v, d):
        return (crow, col, v, d, torch.tensor([0, 1, 2, 3], dtype=crow.dtype, device=crow.device),
                col.new_zeros(col.shape), col.new_zeros(col.shape))

    op = "_csr_spmm_with_transpose"
    crow, col, v, d = _csr_example(device)
    t_col = torch.zeros(3, dtype=torch.int64, device=device)
    e = functools.partial(expect, op)
    return _csr_metadata_errors(op, device, make) + _csr_structure_errors(op, device, make) + [
        e(Sample((crow, col, v, d, torch.tensor([0, 1, 3], device=device), t_col, t_col)), "t_crow_size",
          k_plus_1=4, got=3),
        e(Sample((crow, col, v, d, torch.tensor([0, 1, 2, 3], device=device), t_col[:2], t_col)), "t_nnz",
          nnz=3, t_col=2, t_perm=3),
        e(Sample((crow, col, v, d, torch.tensor([0, 1, 2, 3], device=device, dtype=torch.int32), t_col.int(),
                  t_col.int())), "same_dtype", x="crow_indices", y="t_crow_indices", x_dtype=torch.int64,
          y_dtype=torch.int32),
    ]


def csr_sddmm_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    samples = []
    for i, (desc, rows, k, n, layout) in enumerate(_CSR_CASES):
        crow, col = _csr_indices(rows, _index_dtype(i), device)
        grad_out = _grad(make_layout((len(rows), n), dtype, device, "transposed" if layout == "transposed" else "contiguous"), requires_grad)
        dense = _grad(_dense(k, n, dtype, device, layout), requires_grad)
        samples.append(Sample((crow, col, grad_out, dense), desc=f"{desc} ({col.dtype})"))
    crow, col = _csr_indices([[0, 1], [2], [1, 1, 0]], torch.int64, device)
    grad_out = random_tensor((1, 5), dtype, device).expand(3, 5)  # stride-0 rows, as from out.sum().backward()
    samples.append(Sample((crow, col, grad_out, _grad(random_tensor((3, 5), dtype, device), requires_grad)), desc="expanded grad_out"))
    return samples


def csr_sddmm_reference(crow: torch.Tensor, col: torch.Tensor, grad_out: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    return (grad_out[_csr_rows(crow)] * dense[col.long()]).sum(-1)


def csr_sddmm_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    crow, col, _, dense = csr_spmm_sized(device, dtype, n)
    return (crow, col, random_tensor((n, 4), dtype, device), dense)


def csr_sddmm_errors(device: str) -> list[ErrorInput]:
    def make(crow, col, v, d):  # grad_out on col's device, so each device error names the tensor it is about
        m = crow.numel() - 1 if crow.dim() == 1 and crow.numel() else 2
        return (crow, col, torch.randn(m, d.shape[-1], dtype=d.dtype, device=col.device), d)

    op = "_csr_sddmm"
    crow, col, _, d = _csr_example(device)
    e = functools.partial(expect, op)
    return _csr_metadata_errors(op, device, make, device_of="grad_out") + _csr_structure_errors(op, device, make) + [
        e(Sample((crow, col, torch.randn(3, 4, device=device), d)), "grad_out_rows", m=2, rows=3),
        e(Sample((crow, col, torch.randn(2, 5, device=device), d)), "grad_out_columns", x_columns=5, y_columns=4),
        e(Sample((crow, col, torch.randn(2, 4, device=device), d.double())), "same_dtype", x="grad_out", y="dense",
          x_dtype=torch.float32, y_dtype=torch.float64),
        e(Sample((crow, col, torch.randn(2, 4, 1, device=device), d)), "two_d", x="grad_out", shape=[2, 4, 1]),
    ]


def csr_transpose_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> list[Sample]:
    index_dtype = dtype if dtype in INT_DTYPES else torch.int64  # generic tests also ask with float dtypes
    samples = []
    for desc, rows, k, _, _ in _CSR_CASES:
        crow, col = _csr_indices(rows, index_dtype, device)
        samples.append(Sample((crow, col, k), desc=desc))
    return samples


def csr_transpose_sized(device: str, dtype: torch.dtype, n: int) -> tuple[Any, ...]:
    """n rows; K stays 5 (an int argument: export specialises it)."""
    crow, col = _csr_indices([[i % 5, (2 * i + 1) % 5] for i in range(n)], torch.int64, device)
    return (crow, col, 5)


def csr_transpose_errors(device: str) -> list[ErrorInput]:
    def make(crow, col, v, d):
        return (crow, col, 3)

    op = "_csr_transpose"
    crow, col, _, _ = _csr_example(device)
    cases = _csr_metadata_errors(op, device, make) + _csr_structure_errors(op, device, make) + [
        expect(op, Sample((crow, col, -1)), "negative_K", K=-1),
    ]
    cases = [c for c in cases if c.key != "same_device"]  # (crow's device is the reference here)
    if device == "cuda":
        cases.append(expect(op, Sample((crow.cpu(), col, 3)), "same_device", x="crow_indices", y="col_indices",
                            x_device="cpu", y_device="cuda:0"))
    return cases


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
    if kind == "f32" and dtype in (torch.float16, torch.bfloat16):
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
        e(Sample((f32(4, 8), f32(9), 1e-6) + extra), "weight_shape", n=8, x="input", shape=[9]),
        e(Sample((f32(4, 8), f32(1, 8), 1e-6) + extra), "weight_shape", n=8, x="input", shape=[1, 8]),
        e(Sample((f32(4, 8), f32(8).double(), 1e-6) + extra), "weight_dtype", x="input", dtype=torch.float32,
          weight_dtype=f64),
        e(Sample((f32(4, 8).half(), f32(8).bfloat16(), 1e-6) + extra), "weight_dtype_or_float", x="input", dtype=f16,
          weight_dtype=bf16),
        e(Sample((f32(4, 8).double(), f32(8), 1e-6) + extra), "weight_dtype", x="input", dtype=f64,
          weight_dtype=torch.float32),
    ]
    if not extra:  # ops whose next argument is weight_offset
        cases.append(e(Sample((f32(4, 8), None, 1e-6, 0.5)), "offset_without_weight"))
    if device == "cuda":
        cases.append(e(Sample((f32(4, 8), torch.randn(8), 1e-6) + extra), "same_device", x="input", y="weight",
                       **_CUDA_VS_CPU))
    return cases


def rms_norm_errors(device: str) -> list[ErrorInput]:
    return _rms_norm_input_errors("rms_norm", device)


def rms_norm_forward_errors(device: str) -> list[ErrorInput]:
    return _rms_norm_input_errors("_rms_norm_forward", device)


def rms_norm_backward_errors(device: str) -> list[ErrorInput]:
    f32 = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    x, w = f32(4, 8), f32(8)
    e = functools.partial(expect, "_rms_norm_backward")
    rstd = dict(stat="rstd", shape=[4], x="input", dtype=torch.float32)
    cases = [
        e(Sample((f32(4, 8), f32(()), None, f32(()), True, False)), "at_least_1d", x="input"),
        e(Sample((f32(4, 8), x, f32(7), f32(4), True, True)), "weight_shape", n=8, x="input", shape=[7]),
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
        e(Sample((x, f32(4, 8), f32(9), 1e-6, 0.0)), "weight_shape", n=8, x="input", shape=[9]),
        e(Sample((x, f32(4, 9), w, 1e-6, 0.0)), "same_shape", **pair, x_shape=[4, 8], y_shape=[4, 9]),
        e(Sample((x, f32(8), w, 1e-6, 0.0)), "same_shape", **pair, x_shape=[4, 8], y_shape=[8]),
        e(Sample((x, f32(4, 8).half(), w, 1e-6, 0.0)), "same_dtype", **pair, x_dtype=torch.float32,
          y_dtype=torch.float16),
        e(Sample((x, f32(4, 8), None, 1e-6, 1.0)), "offset_without_weight"),
    ]
    if device == "cuda":
        cases.append(e(Sample((x, torch.randn(4, 8), w, 1e-6, 0.0)), "same_device", **pair, **_CUDA_VS_CPU))
    return cases


def add_rms_norm_errors(device: str) -> list[ErrorInput]:
    return _add_rms_norm_errors("add_rms_norm", device)


def add_rms_norm_forward_errors(device: str) -> list[ErrorInput]:
    return _add_rms_norm_errors("_add_rms_norm_forward", device)


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


OP_DB: list[OpInfo] = [
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
    OpInfo(
        name="csr_spmm",
        dtypes=FLOAT_DTYPES,
        sample_inputs=csr_spmm_samples,
        reference=csr_spmm_reference,
        error_inputs=csr_spmm_errors,
        sized_inputs=csr_spmm_sized,
    ),
    OpInfo(
        name="_csr_spmm_with_transpose",
        dtypes=FLOAT_DTYPES,
        sample_inputs=csr_spmm_with_transpose_samples,
        reference=csr_spmm_reference,
        error_inputs=csr_spmm_with_transpose_errors,
        sized_inputs=csr_spmm_with_transpose_sized,
    ),
    OpInfo(
        name="_csr_sddmm",
        dtypes=FLOAT_DTYPES,
        sample_inputs=csr_sddmm_samples,
        reference=csr_sddmm_reference,
        error_inputs=csr_sddmm_errors,
        sized_inputs=csr_sddmm_sized,
    ),
    OpInfo(
        name="_csr_transpose",
        dtypes=INT_DTYPES,  # the index dtype
        sample_inputs=csr_transpose_samples,
        reference=csr_transpose_reference,
        error_inputs=csr_transpose_errors,
        sized_inputs=csr_transpose_sized,
        differentiable=False,
    ),
    OpInfo(
        name="rms_norm",
        dtypes=FLOAT_DTYPES,
        sample_inputs=rms_norm_samples,
        reference=rms_norm_reference,
        error_inputs=rms_norm_errors,
        sized_inputs=rms_norm_sized,
    ),
    OpInfo(
        name="_rms_norm_forward",
        dtypes=FLOAT_DTYPES,
        sample_inputs=rms_norm_forward_samples,
        reference=rms_norm_forward_reference,
        error_inputs=rms_norm_forward_errors,
        sized_inputs=rms_norm_sized,
        output_dtypes=rms_norm_forward_dtypes,
    ),
    OpInfo(
        name="_rms_norm_backward",
        dtypes=FLOAT_DTYPES,
        sample_inputs=rms_norm_backward_samples,
        reference=rms_norm_backward_reference,
        error_inputs=rms_norm_backward_errors,
        sized_inputs=rms_norm_backward_sized,
        differentiable=False,  # double backward is refused by its Autograd kernel
        output_dtypes=rms_norm_backward_dtypes,
    ),
    OpInfo(
        name="add_rms_norm",
        dtypes=FLOAT_DTYPES,
        sample_inputs=add_rms_norm_samples,
        reference=add_rms_norm_reference,
        error_inputs=add_rms_norm_errors,
        sized_inputs=add_rms_norm_sized,
    ),
    OpInfo(
        name="_add_rms_norm_forward",
        dtypes=FLOAT_DTYPES,
        sample_inputs=add_rms_norm_forward_samples,
        reference=add_rms_norm_forward_reference,
        error_inputs=add_rms_norm_forward_errors,
        sized_inputs=add_rms_norm_sized,
        output_dtypes=add_rms_norm_forward_dtypes,
    ),
    OpInfo(
        name="_add_rms_norm_backward",
        dtypes=FLOAT_DTYPES,
        sample_inputs=add_rms_norm_backward_samples,
        reference=add_rms_norm_backward_reference,
        error_inputs=add_rms_norm_backward_errors,
        sized_inputs=add_rms_norm_backward_sized,
        differentiable=False,  # double backward is refused by its Autograd kernel
        output_dtypes=add_rms_norm_backward_dtypes,
    ),
]

OPS_BY_NAME = {info.name: info for info in OP_DB}


def ops(predicate: Callable[[OpInfo], bool] = lambda info: True) -> list[Any]:
    """OpInfos as pytest params, ids = op names."""
    import pytest

    return [pytest.param(info, id=info.name) for info in OP_DB if predicate(info)]


def upcast(args: Sequence[Any]) -> tuple[Any, ...]:
    """Reference inputs: float tensors as float64 on the CPU, detached; others unchanged (ints, on CPU)."""
    out = []
    for x in args:
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu()
            out.append(x.double() if x.dtype.is_floating_point else x)
        else:
            out.append(x)
    return tuple(out)
