"""The gated family (act(gate) * up: swiglu, gelu_and_mul, ...) beyond the generic tables, run over every form
of every row of op_db's GATED: the wrapper, chunk halves read in place, large |gate|, inf/NaN as torch gives
them, closeness in ulps to a float64 reference (every 16-bit gate too), layouts giving the same bits, double
backward, forward-mode AD and torch.func, the exported and joint graphs, and CUDA-only layouts and sizes.
A new gated op is a new row of GATED; what is particular to one op stands at the end."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import torchops
from helpers import (DEVICES, FLOAT_DTYPES, HALF_DTYPES, HAS_CUDA, assert_close_to_reference, called_ops,
                     chunk_halves, needs_gpu_memory, poison_cuda_cache, random_tensor, requires_cuda, ulp)
from torchops._meta_kernels import _checks
from op_db.elementwise import GATED, GatedInfo, gated_forms

FORMS = [pytest.param(row, form, id="-".join([row.name, *form.values()])) for row, form in gated_forms()]


def wrapper(row: GatedInfo):
    return getattr(torchops, row.name)


def op(row: GatedInfo):
    return getattr(torch.ops.myns, row.name)


def backward_op(row: GatedInfo):
    return getattr(torch.ops.myns, row.backward_name)


def reference(row: GatedInfo, form: dict[str, Any], gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return row.reference(gate.detach().cpu().double(), up.detach().cpu().double(), **form)


def reference_backward(row: GatedInfo, form: dict[str, Any], grad: torch.Tensor, gate: torch.Tensor,
                       up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return row.backward_reference(*(t.detach().cpu().double() for t in (grad, gate, up)), **form)


def assert_forward_and_backward_close(row: GatedInfo, form: dict[str, Any], grad: torch.Tensor, gate: torch.Tensor,
                                      up: torch.Tensor) -> None:
    assert_close_to_reference(op(row)(gate, up, **form).cpu(), reference(row, form, gate, up))
    for got, want in zip(backward_op(row)(grad, gate, up, **form), reference_backward(row, form, grad, gate, up)):
        assert_close_to_reference(got.cpu(), want)


# ------------------------------------------------------------------------------------------- wrapper


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_wrapper_is_the_op(row: GatedInfo, form: dict[str, Any], device: str) -> None:
    gate, up = random_tensor((5, 6), torch.float32, device), random_tensor((5, 6), torch.float32, device)
    out = wrapper(row)(gate, up, **form)
    assert torch.equal(out, op(row)(gate, up, **form))
    assert torch.equal(out, op(row)(gate, up, *form.values()))  # extra arguments by position too
    assert out.is_contiguous() and out.shape == gate.shape
    assert_close_to_reference(out.cpu(), reference(row, form, gate, up))


@pytest.mark.parametrize("row", [r for r in GATED if len(r.forms) > 1], ids=lambda r: r.name)
def test_default_is_the_first_form(row: GatedInfo) -> None:
    gate, up = random_tensor((64,), torch.float32, "cpu"), random_tensor((64,), torch.float32, "cpu")
    assert torch.equal(wrapper(row)(gate, up), wrapper(row)(gate, up, **row.forms[0]))
    for form in row.forms[1:]:
        assert not torch.equal(wrapper(row)(gate, up), wrapper(row)(gate, up, **form))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row", GATED, ids=lambda r: r.name)
def test_errors_name_op_and_argument(row: GatedInfo, device: str) -> None:
    # Through the wrapper: the table's messages (op_db runs the ops themselves on every error input).
    x = torch.randn(4, device=device)
    msg = _checks.message(row.name, "same_shape", x="gate", y="up", x_shape=[4, 8], y_shape=[4, 9])
    with pytest.raises(RuntimeError, match=f"^{re.escape(msg)}$"):
        wrapper(row)(torch.randn(4, 8, device=device), torch.randn(4, 9, device=device))
    with pytest.raises(RuntimeError, match=f"^myns::{row.name}: gate has unsupported dtype Long"):
        wrapper(row)(torch.arange(4, device=device), torch.arange(4, device=device))
    with pytest.raises(RuntimeError, match=f"^myns::{row.backward_name}: grad_out and gate must have the same dtype"):
        backward_op(row)(x, x.double(), x.double())
    for kwargs, key, fields in row.form_errors:
        for name, call in ((row.name, lambda t: wrapper(row)(t, t, **kwargs)),
                           (row.backward_name, lambda t: backward_op(row)(t, t, t, **kwargs))):
            expected = _checks.message(name, key, **fields)
            with pytest.raises(RuntimeError) as real:
                call(x)
            assert str(real.value) == expected
            with FakeTensorMode() as mode, pytest.raises(RuntimeError) as fake:  # what compile and export meet
                call(mode.from_tensor(x))
            assert str(fake.value) == expected


# -------------------------------------------------------------------------------------- chunk halves


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("h", [1, 7, 8, 33, 64, 257])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_chunk_halves_forward_and_backward(row: GatedInfo, form: dict[str, Any], device: str, dtype: torch.dtype,
                                           h: int, offset: int) -> None:
    x, gate, up = chunk_halves(9, h, dtype, device, offset=offset)
    x_before = x.clone()
    out = op(row)(gate, up, **form)
    assert out.is_contiguous() and out.shape == (9, h)
    assert_forward_and_backward_close(row, form, random_tensor((9, h), dtype, device), gate, up)
    assert torch.equal(x, x_before), "inputs must not be written"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_chunk_halves_autograd_reaches_the_fused_input(row: GatedInfo, form: dict[str, Any], device: str) -> None:
    # The LLaMA pattern: one projection, chunked; grads flow back into x through both views.
    x = random_tensor((6, 2 * 40), torch.float64, device).requires_grad_()
    weight = random_tensor((6, 40), torch.float64, device)
    (wrapper(row)(*x.chunk(2, dim=-1), **form) * weight).pow(2).sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    (row.reference(*x_ref.chunk(2, dim=-1), **form) * weight).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)


@pytest.mark.parametrize("row,form", FORMS)
def test_chunk_halves_are_not_copied_cpu(row: GatedInfo, form: dict[str, Any]) -> None:
    # The only allocation of the call is the output: the strided halves are read in place.
    _, gate, up = chunk_halves(64, 96, torch.float32, "cpu")
    wrapper(row)(gate, up, **form)  # warm up
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        wrapper(row)(gate, up, **form)
    allocated = [e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0]
    assert sum(allocated) == 64 * 96 * 4, allocated


# --------------------------------------------------------------------------------- large |gate|, inf, NaN


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_large_gate_does_not_overflow(row: GatedInfo, form: dict[str, Any], device: str, dtype: torch.dtype) -> None:
    # exp(-gate) overflows f32 below -88.72, a cubed gate (gelu's tanh form) past |x| ~ 7e12 and its square
    # past 1.8e19: the results saturate (to x or 0, derivatives to 1 or 0), never inf or NaN.
    values = [1e4, -1e4, 1e3, -1e3, 100.0, -100.0, 89.0, -89.0, 88.7, -88.7, 87.0, -87.0, 50.0, -50.0, 30.0, -30.0,
              20.0, -20.0, 10.0, -10.0, 5.5, -5.5, 3.0, -3.0, 1.0, -1.0]
    if torch.finfo(dtype).max > 1e30:  # every dtype with at least f32's range
        values += [1e30, -1e30, 1e20, -1e20]
    gate = torch.tensor(values * 3, dtype=dtype, device=device)  # vector body and scalar tail
    up, grad = random_tensor(gate.shape, dtype, device), random_tensor(gate.shape, dtype, device)
    out = op(row)(gate, up, **form)
    grads = backward_op(row)(grad, gate, up, **form)
    for t in (out, *grads):
        assert bool(t.isfinite().all()), t
    assert_forward_and_backward_close(row, form, grad, gate, up)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_inf_and_nan_like_torch(row: GatedInfo, form: dict[str, Any], device: str, dtype: torch.dtype) -> None:
    inf, nan = math.inf, math.nan
    specials = [inf, -inf, nan, 1e4, -1e4, 0.0, -0.0, 1.0, -1.0]
    # Every (gate, up) pair of special values, 81 elements: through the vector loops and the tails.
    gate = torch.tensor([g for g in specials for _ in specials], dtype=dtype, device=device)
    up = torch.tensor([u for _ in specials for u in specials], dtype=dtype, device=device)
    grad = torch.tensor([1.5, -2.0, 0.5] * 27, dtype=dtype, device=device)
    # torch's math in float64: silu(+inf) = inf, silu(-inf) = NaN (-inf * 0), gelu_backward NaN at +-inf.
    pairs = [(op(row)(gate, up, **form), reference(row, form, gate, up))]
    pairs += zip(backward_op(row)(grad, gate, up, **form), reference_backward(row, form, grad, gate, up))
    for got, expected in pairs:
        got = got.cpu().double()
        assert torch.equal(got.isnan(), expected.isnan())
        torch.testing.assert_close(got, expected.to(dtype).double(), equal_nan=True, rtol=1e-2, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_autograd_matches_torch_at_infinities(row: GatedInfo, form: dict[str, Any], device: str) -> None:
    # torch's own autograd through act(g) * u, in float64 (torch's f32 CPU gelu gives NaN at +inf).
    gate = torch.tensor([math.inf, -math.inf, 1e4, -1e4, 3.0], device=device, requires_grad=True)
    up = torch.tensor([2.0, 2.0, 2.0, 2.0, 2.0], device=device, requires_grad=True)
    got = torch.autograd.grad(wrapper(row)(gate, up, **form).sum(), (gate, up))
    g64, u64 = (t.detach().double().requires_grad_() for t in (gate, up))
    expected = torch.autograd.grad(row.reference(g64, u64, **form).sum(), (g64, u64))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e.float(), equal_nan=True)


# ----------------------------------------------------------------------------------- ulp-level accuracy
# 16-bit: computed in f32 and rounded once, so within 1 ulp of the exact value. f32/f64: a few roundings
# (exp, erf <= 2 ulp, a division, two products): 8 ulp. Plus, where act or act' cancels, a term relative to
# the size of what cancels (the row's error_scales).


def assert_within_ulps_of_float64(row: GatedInfo, form: dict[str, Any], device: str, dtype: torch.dtype,
                                  n: int) -> None:
    r = row.ulp_gate_range
    gate = random_tensor((n,), dtype, device, low=-r, high=r)
    up, grad = random_tensor((n,), dtype, device), random_tensor((n,), dtype, device)
    g64, u64, d64 = (t.cpu().double() for t in (gate, up, grad))
    ulps = 1.0 if dtype in HALF_DTYPES else 8.0
    eps = 2.0**-52 if dtype == torch.float64 else 2.0**-23
    value, slope = row.exact(g64, **form)
    value_scale, slope_scale = row.error_scales(g64, **form)
    got_out = op(row)(gate, up, **form).cpu().double()
    got_gate, got_up = (t.cpu().double() for t in backward_op(row)(grad, gate, up, **form))
    for what, got, exact, scale in (("out", got_out, value * u64, u64.abs() * value_scale),
                                    ("grad_gate", got_gate, d64 * u64 * slope, (d64 * u64).abs() * slope_scale),
                                    ("grad_up", got_up, d64 * value, d64.abs() * value_scale)):
        bound = ulps * ulp(exact, dtype) + 16 * eps * scale
        err = (got - exact).abs()
        assert bool((err <= bound).all()), f"{what}: {(err / bound).max()} of the bound"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_within_ulps_of_float64(row: GatedInfo, form: dict[str, Any], device: str, dtype: torch.dtype) -> None:
    assert_within_ulps_of_float64(row, form, device, dtype, (1 << 16) + 5)


@pytest.mark.parametrize("row,form", FORMS)
def test_cpu_outputs_over_32_mib_within_ulps(row: GatedInfo, form: dict[str, Any]) -> None:
    # f32 outputs of 32 MiB + 20 bytes: the CPU kernels allocate them with huge-page advice (core/empty.h).
    assert_within_ulps_of_float64(row, form, "cpu", torch.float32, (1 << 23) + 5)


def every_16_bit(dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """All 65536 bit patterns of a 16-bit float type."""
    return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype).to(device)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_every_16_bit_gate(row: GatedInfo, form: dict[str, Any], device: str, dtype: torch.dtype) -> None:
    # Every 16-bit gate (the CPU looks 16-bit activations up in tables built from them): within 1 ulp of
    # float64 (plus the f32 math's absolute resolution where the row has one), NaN exactly where torch gives
    # NaN, infinities exact; the backward's grad_up likewise. Below the row's flush point the f32 result is
    # exactly 0, as torch's own is in bf16 and f32 (the exact value, ~1e-37 at -89, is a bf16 number).
    gate = every_16_bit(dtype, device)
    ones = torch.ones_like(gate)
    g64 = gate.cpu().double()
    exact = row.exact(g64, **form)[0]
    exact[g64.isnan() | (g64 == -math.inf)] = math.nan  # -inf * 0
    flushed = g64 < row.flushes_below if row.flushes_below is not None else torch.zeros_like(g64, dtype=torch.bool)
    checked = exact.isfinite() & ~flushed
    for got in (op(row)(gate, ones, **form), backward_op(row)(ones, gate, ones, **form)[1]):
        got = got.cpu().double()
        assert torch.equal(got.isnan(), exact.isnan())
        assert torch.equal(got[exact.isinf()], exact[exact.isinf()])
        assert bool((got[flushed & ~exact.isnan()] == 0).all())
        err = (got[checked] - exact[checked]).abs()
        bound = ulp(exact[checked], dtype) + row.f32_abs_error(g64[checked])
        assert bool((err <= bound).all()), (err / bound).max()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_layout_does_not_change_the_bits(row: GatedInfo, form: dict[str, Any], device: str, dtype: torch.dtype) -> None:
    # Contiguous, chunk halves, transposed and strided inputs run different loops; same values, same bits.
    _, gate, up = chunk_halves(37, 41, dtype, device)
    dense = op(row)(gate.contiguous(), up.contiguous(), **form)
    assert torch.equal(op(row)(gate, up, **form), dense)
    assert torch.equal(op(row)(gate.t().contiguous().t(), up, **form), dense)
    grads_dense = backward_op(row)(dense, gate.contiguous(), up.contiguous(), **form)
    for got, want in zip(backward_op(row)(dense, gate, up, **form), grads_dense):
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("row,form", FORMS)
def test_cpu_short_runs_match_the_vector_loop_bit_for_bit(row: GatedInfo, form: dict[str, Any],
                                                          dtype: torch.dtype) -> None:
    # Rows of 5 (row stride 8) go through the CPU driver's tail buffer, a contiguous tensor through its
    # 8-lane loop: the same conversions either way, compared as bits over every 16-bit gate (NaN payloads
    # included, which torch.equal cannot see). A NaN's sign is left out: IEEE 754 leaves it unspecified, and
    # some compilers' f16 tail and loop give NaNs of opposite sign (same payload).
    gate = every_16_bit(dtype).view(-1, 8)
    up, grad = random_tensor(gate.shape, dtype, "cpu"), random_tensor(gate.shape, dtype, "cpu")

    def assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
        assert torch.equal(got.isnan(), want.isnan())
        keep = torch.where(got.isnan(), 0x7FFF, -1).to(torch.int16)  # every bit, but a NaN's sign
        assert torch.equal(got.contiguous().view(torch.int16) & keep, want.contiguous().view(torch.int16) & keep)

    assert_same_bits(op(row)(gate[:, :5], up[:, :5], **form), op(row)(gate, up, **form)[:, :5])
    short = backward_op(row)(grad[:, :5], gate[:, :5], up[:, :5], **form)
    for got, want in zip(short, backward_op(row)(grad, gate, up, **form)):
        assert_same_bits(got, want[:, :5])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_any_rank_forward_and_backward(row: GatedInfo, form: dict[str, Any], device: str, dtype: torch.dtype) -> None:
    # 17 dims of size 2 stored in a scrambled order, which no stride pattern merges (more than the 16
    # the strided kernels take): the front ends hand the kernels dense copies.
    rank = 17
    order = list(range(rank))[1::2] + list(range(rank))[0::2]
    gate = random_tensor((2,) * rank, dtype, device).permute(*order)
    up = random_tensor((2,) * rank, dtype, device)
    assert op(row)(gate, up, **form).is_contiguous()
    grad = random_tensor((2,) * rank, dtype, device).permute(*order[::-1])
    assert_forward_and_backward_close(row, form, grad, gate, up)


# --------------------------------------------------------------------------------- autograd extras


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_gradcheck_forward_and_double_backward(row: GatedInfo, form: dict[str, Any], device: str) -> None:
    gate = random_tensor((4, 7), torch.float64, device).requires_grad_()
    up = random_tensor((4, 7), torch.float64, device).requires_grad_()
    f = lambda g, u: wrapper(row)(g, u, **form)  # noqa: E731
    assert torch.autograd.gradcheck(f, (gate, up), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(f, (gate, up), check_fwd_over_rev=True)
    grad_out = random_tensor((4, 7), torch.float64, device).requires_grad_()
    b = lambda g, x, u: backward_op(row)(g, x, u, **form)  # noqa: E731
    assert torch.autograd.gradcheck(b, (grad_out, gate, up), check_forward_ad=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_hessian_vector_products_match_torch(row: GatedInfo, form: dict[str, Any], device: str) -> None:
    gate = random_tensor((4, 7), torch.float64, device)
    up = random_tensor((4, 7), torch.float64, device)
    v = (random_tensor((4, 7), torch.float64, device), random_tensor((4, 7), torch.float64, device))

    def hvp(f, loss):
        g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
        grads = torch.autograd.grad(loss(f(g, u)), (g, u), create_graph=True)
        return torch.autograd.grad(grads, (g, u), v)

    for loss in (torch.sum, lambda y: y.pow(2).sum()):  # linear in the output, and not
        got = hvp(lambda g, u: wrapper(row)(g, u, **form), loss)
        want = hvp(lambda g, u: row.reference(g, u, **form), loss)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_forward_mode_ad(row: GatedInfo, form: dict[str, Any], device: str) -> None:
    gate, up = random_tensor((3, 5), torch.float64, device), random_tensor((3, 5), torch.float64, device)
    tg, tu = random_tensor((3, 5), torch.float64, device), random_tensor((3, 5), torch.float64, device)
    f = lambda g, u: wrapper(row)(g, u, **form)  # noqa: E731
    ref = lambda g, u: row.reference(g, u, **form)  # noqa: E731
    torch.testing.assert_close(torch.func.jvp(f, (gate, up), (tg, tu)), torch.func.jvp(ref, (gate, up), (tg, tu)))
    _, only_up = torch.func.jvp(lambda u: f(gate, u), (up,), (tu,))
    torch.testing.assert_close(only_up, row.act(gate, **form) * tu)
    # Forward mode through the backward op too (what torch.func.hessian of the op needs).
    grad_out = random_tensor((3, 5), torch.float64, device)
    ref_backward = lambda g, x, u: torch.func.vjp(ref, x, u)[1](g)  # noqa: E731
    got = torch.func.jvp(lambda g, x, u: backward_op(row)(g, x, u, **form), (grad_out, gate, up), (tg, tu, tg))
    torch.testing.assert_close(got, torch.func.jvp(ref_backward, (grad_out, gate, up), (tg, tu, tg)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_torch_func_transforms(row: GatedInfo, form: dict[str, Any], device: str) -> None:
    gate, up = random_tensor((3, 4), torch.float64, device), random_tensor((3, 4), torch.float64, device)
    f = lambda g, u: wrapper(row)(g, u, **form)  # noqa: E731
    ref = lambda g, u: row.reference(g, u, **form)  # noqa: E731
    want = torch.func.jacrev(ref, argnums=(0, 1))(gate, up)
    torch.testing.assert_close(torch.func.jacrev(f, argnums=(0, 1))(gate, up), want)
    torch.testing.assert_close(torch.func.jacfwd(f, argnums=(0, 1))(gate, up), want)
    batched = (torch.stack([gate, 2 * gate]), torch.stack([up, -up]))
    torch.testing.assert_close(torch.func.vmap(f)(*batched), ref(*batched))
    torch.testing.assert_close(torch.func.hessian(lambda g, u: f(g, u).pow(2).sum())(gate, up),
                               torch.func.hessian(lambda g, u: ref(g, u).pow(2).sum())(gate, up))


# ------------------------------------------------------------------------------------- traced graphs


def _myns_lines(called: str) -> str:
    return "\n".join(line for line in called.splitlines() if line.startswith("myns."))


@pytest.mark.parametrize("row,form", FORMS)
def test_exported_mlp_holds_the_op_on_chunk_views(row: GatedInfo, form: dict[str, Any]) -> None:
    class GatedMLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_up = torch.nn.Linear(8, 32, bias=False)
            self.down = torch.nn.Linear(16, 8, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(wrapper(row)(*self.gate_up(x).chunk(2, dim=-1), **form))

    ep = torch.export.export(GatedMLP(), (torch.randn(4, 8),))
    # Only the myns lines: how chunk is spelled (aten.chunk / aten.split) differs between releases; no
    # clone/contiguous between the chunk and the op either way.
    called = called_ops(ep.graph_module)
    assert "clone" not in called and "contiguous" not in called, called
    assert _myns_lines(called) == f"myns.{row.name}.default"
    node = next(n for n in ep.graph.nodes if str(n.target) == f"myns.{row.name}.default")
    for name, value in form.items():  # the form's arguments reach the graph (a default may be left out)
        assert value in node.args or node.kwargs.get(name, row.forms[0][name]) == value, node


@pytest.mark.parametrize("row,form", FORMS)
def test_joint_graph_calls_the_backward_op(row: GatedInfo, form: dict[str, Any]) -> None:
    # What torch.compile traces for training: the backward is one myns.<op>_backward node.
    from functorch.compile import aot_function, make_boxed_func

    graphs: list[torch.fx.GraphModule] = []

    def keep(gm, _inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    fn = aot_function(lambda g, u: wrapper(row)(g, u, **form), fw_compiler=keep, bw_compiler=keep)
    fn(torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)).sum().backward()
    forward, backward = graphs
    assert _myns_lines(called_ops(forward)) == f"myns.{row.name}.default"
    assert _myns_lines(called_ops(backward)) == f"myns.{row.backward_name}.default"


def _mlp_inputs(device: str) -> list[torch.Tensor]:
    """x, W1, W2, W3 of a two-layer gated MLP (float64 leaves)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=g, dtype=torch.float64).to(device).requires_grad_()
            for s in ((37, 16), (16, 24), (16, 24), (24, 16))]


def _mlp_backward(row: GatedInfo, form: dict[str, Any], device: str, combine: str = "", hold: bool = False,
                  retain: bool = False) -> tuple[list[torch.Tensor], list[str], list[tuple[torch.Tensor, torch.Tensor]]]:
    """The MLP's gradients (x, W1, W2, W3) of sum((op(x W1, x W2) W3)^2), the backward ops that ran, and (hold)
    each gradient reaching the op with a copy taken when it arrived. combine: two such ops, "add"ed (the add
    hands both the same gradient tensor) or "cat"enated by rows (each gets a view of one gradient); retain:
    two backwards over one graph, summed."""
    leaves = _mlp_inputs(device)
    x, w1, w2, w3 = leaves
    held: list[tuple[torch.Tensor, torch.Tensor]] = []

    def gated(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = wrapper(row)(a, b, **form)
        if hold:
            y.register_hook(lambda grad: held.append((grad, grad.clone())))
        return y

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        h = gated(x @ w1, x @ w2)
        if combine == "add":
            h = h + gated(x @ w2, x @ w1)
        elif combine == "cat":
            h = torch.cat([h, gated(x @ w2, x @ w1)])
        loss = (h @ w3).pow(2).sum()
        grads = torch.autograd.grad(loss, leaves, retain_graph=retain)
        if retain:
            grads = tuple(a + b for a, b in zip(grads, torch.autograd.grad(loss, leaves)))
    ran = sorted(e.name for e in prof.events() if e.name.startswith(f"myns::{row.backward_name}"))
    return list(grads), ran, held


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row,form", FORMS)
def test_backward_writes_grad_gate_over_an_incoming_gradient_nothing_else_holds(row: GatedInfo, form: dict[str, Any],
                                                                                 device: str) -> None:
    # One new buffer instead of two: the out= form, grad_gate written into the incoming gradient, runs when only
    # the backward holds that gradient, with the functional backward's bits; a gradient a hook keeps, the one
    # the add hands to two ops, or a view while another view of its base waits, is never written (the
    # functional op runs for it).
    out_op, functional_op = f"myns::{row.backward_name}_out", f"myns::{row.backward_name}"
    plain, ran, _ = _mlp_backward(row, form, device)
    assert ran == [out_op]
    x, w1, w2, w3 = (t.detach().requires_grad_() for t in _mlp_inputs(device))
    ref = torch.autograd.grad((row.reference(x @ w1, x @ w2, **form) @ w3).pow(2).sum(), [x, w1, w2, w3])
    for a, b in zip(plain, ref):
        torch.testing.assert_close(a, b)
    kept, ran, held = _mlp_backward(row, form, device, hold=True)
    assert ran == [functional_op]
    assert all(torch.equal(a, b) for a, b in zip(plain, kept))
    assert held and all(torch.equal(grad, copy) for grad, copy in held)
    for combine in ("add", "cat"):
        both, ran, _ = _mlp_backward(row, form, device, combine=combine)
        assert ran == sorted([functional_op, out_op]), combine
        kept, _, held = _mlp_backward(row, form, device, combine=combine, hold=True)
        assert all(torch.equal(a, b) for a, b in zip(both, kept)), combine
        assert len(held) == 2 and all(torch.equal(grad, copy) for grad, copy in held), combine
    twice, ran, _ = _mlp_backward(row, form, device, retain=True)  # the saved gate and up are never written
    assert ran == [out_op, out_op]
    assert all(torch.equal(a, 2 * b) for a, b in zip(twice, plain))


# ------------------------------------------------------------------------------------------ CUDA only


@requires_cuda
@pytest.mark.parametrize("offset", [0, 1, 3])
@pytest.mark.parametrize("h", [1, 3, 7, 9, 15, 17, 255, 1001, 11008])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("row,form", FORMS)
def test_cuda_chunk_halves_rows_paths(row: GatedInfo, form: dict[str, Any], dtype: torch.dtype, h: int,
                                      offset: int) -> None:
    # Odd H: rows never 16-byte aligned (scalar rows path); H % 8 == 0 and offset 0: the vector path;
    # offset != 0: misaligned bases. Outputs poisoned through the caching allocator first.
    _, gate, up = chunk_halves(33, h, dtype, "cuda", offset=offset)
    grad = random_tensor((33, h), dtype, "cuda")
    poison_cuda_cache()
    assert_forward_and_backward_close(row, form, grad, gate, up)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("row,form", FORMS)
def test_cuda_dense_every_alignment_and_tail(row: GatedInfo, form: dict[str, Any], dtype: torch.dtype) -> None:
    # 1-D slices at every alignment (head and tail elements around the 16-byte vectors), up aligned alike or
    # not, and strided 1-D gates (strided loads, vector stores).
    for offset in range(8):
        for n in (1, 7, 8, 9, 15, 16, 17, 255, 256, 257, 1023, 1025, 4096 * 4 + 5):
            gate = random_tensor((n + 8,), dtype, "cuda")[offset:offset + n]
            for up_offset in (offset, (offset * 3) % 8):
                up = random_tensor((n + 8,), dtype, "cuda")[up_offset:up_offset + n]
                assert_close_to_reference(op(row)(gate, up, **form).cpu(), reference(row, form, gate, up),
                                          msg=f"{offset} {up_offset} {n}")
    gate = random_tensor((2 * 4099,), dtype, "cuda")[::2]
    up = random_tensor((4099,), dtype, "cuda")
    assert_close_to_reference(op(row)(gate, up, **form).cpu(), reference(row, form, gate, up))


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("row,form", FORMS)
def test_cuda_transposed_tiles(row: GatedInfo, form: dict[str, Any], dtype: torch.dtype) -> None:
    # Transposed gate and/or up: the tiled path, partial tiles included.
    for rows, cols in ((3, 5), (64, 33), (130, 257)):
        gate_t = random_tensor((cols, rows), dtype, "cuda").t()
        up = random_tensor((rows, cols), dtype, "cuda")
        for g, u in ((gate_t, up), (up, gate_t), (gate_t, gate_t.clone())):
            assert_forward_and_backward_close(row, form, random_tensor((cols, rows), dtype, "cuda").t(), g, u)


@requires_cuda
@pytest.mark.parametrize("row,form", FORMS)
def test_cuda_matches_cpu_closely(row: GatedInfo, form: dict[str, Any]) -> None:
    # Same formula on both devices (CPU: AVX2 exp/erf, CUDA: expf/erff): within a few f32 ulp of each other.
    for dtype in FLOAT_DTYPES:
        _, gate, up = chunk_halves(64, 11008 // 8, dtype, "cuda", low=-8, high=8)
        rtol, atol = row.cuda_vs_cpu[dtype]
        torch.testing.assert_close(op(row)(gate, up, **form).cpu(), op(row)(gate.cpu(), up.cpu(), **form),
                                   rtol=rtol, atol=atol)


@requires_cuda
@pytest.mark.parametrize("row,form", FORMS)
def test_cuda_current_stream_and_graph_capture(row: GatedInfo, form: dict[str, Any]) -> None:
    _, gate, up = chunk_halves(128, 64, torch.bfloat16, "cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    src = gate.clone()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        gate.copy_(src * 2)
        out = op(row)(gate, up, **form)
    side.synchronize()
    assert_close_to_reference(out.cpu(), reference(row, form, src * 2, up))
    op(row)(gate, up, **form)  # warm up outside capture
    graph = torch.cuda.CUDAGraph()
    grad = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    with torch.cuda.graph(graph):
        out = op(row)(gate, up, **form)
        grads = backward_op(row)(grad, gate, up, **form)
    for _ in range(2):
        gate.copy_(torch.randn_like(gate))
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_reference(out.cpu(), reference(row, form, gate, up))
        for got, want in zip(grads, reference_backward(row, form, grad, gate, up)):
            assert_close_to_reference(got.cpu(), want)


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("row,form", FORMS)
def test_cuda_second_gpu(row: GatedInfo, form: dict[str, Any]) -> None:
    torch.cuda.set_device(0)
    _, gate, up = chunk_halves(16, 24, torch.float32, "cuda:1")
    out = op(row)(gate, up, **form)
    assert out.device == torch.device("cuda:1")
    assert_close_to_reference(out.cpu(), reference(row, form, gate, up))


@needs_gpu_memory(40)
@pytest.mark.parametrize("row,form", FORMS[:1])  # the engine's 64-bit paths: one op covers them
def test_cuda_more_than_2_pow_31_elements(row: GatedInfo, form: dict[str, Any]) -> None:
    # Chunk halves with odd H past 2^31 elements: the scalar rows path with 64-bit indices; then even H
    # (16-byte vectors, 2^31+ elements), then a transposed gate (strided path, 64-bit offsets).
    rows, h = (1 << 16) + 1, (1 << 15) + 1  # > 2^31 elements per half
    x = torch.empty(rows, 2 * h, dtype=torch.bfloat16, device="cuda").uniform_(-4, 4)
    gate, up = x.chunk(2, dim=-1)
    assert gate.numel() > 1 << 31
    out = op(row)(gate, up, **form)
    sample = torch.randint(0, gate.numel(), (1 << 16,), device="cuda")
    sample = torch.cat([sample, torch.tensor([0, gate.numel() - 1], device="cuda")])
    r, c = sample // h, sample % h
    assert_close_to_reference(out[r, c].cpu(), reference(row, form, gate[r, c], up[r, c]))
    del out, x, gate, up
    torch.cuda.empty_cache()
    n = (1 << 31) + 4099
    gate = torch.empty(n, dtype=torch.bfloat16, device="cuda").uniform_(-4, 4)
    up = torch.empty(n, dtype=torch.bfloat16, device="cuda").uniform_(-4, 4)
    grad_gate, grad_up = backward_op(row)(up, gate, up, **form)
    idx = torch.cat([torch.randint(0, n, (1 << 16,), device="cuda"), torch.arange(n - 20, n, device="cuda")])
    ref_gate, ref_up = reference_backward(row, form, up[idx], gate[idx], up[idx])
    assert_close_to_reference(grad_gate[idx].cpu(), ref_gate)
    assert_close_to_reference(grad_up[idx].cpu(), ref_up)
    del grad_gate, grad_up, up
    torch.cuda.empty_cache()
    cols = n // (1 << 16) + 1
    gate_t = torch.empty(cols, 1 << 16, dtype=torch.bfloat16, device="cuda").uniform_(-4, 4).t()
    up2 = torch.empty(1 << 16, cols, dtype=torch.bfloat16, device="cuda").uniform_(-4, 4)
    out = op(row)(gate_t, up2, **form)
    r = torch.cat([torch.randint(0, 1 << 16, (1 << 14,), device="cuda"), torch.tensor([(1 << 16) - 1], device="cuda")])
    c = torch.cat([torch.randint(0, cols, (1 << 14,), device="cuda"), torch.tensor([cols - 1], device="cuda")])
    assert_close_to_reference(out[r, c].cpu(), reference(row, form, gate_t[r, c], up2[r, c]))


# ------------------------------------------------------------------------------------- one op's own


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_swiglu_saturates_at_large_gate(device: str, dtype: torch.dtype) -> None:
    # silu(-1e4) * up is a (signed) zero, not NaN (exp(1e4) overflows, 1 / inf = 0); silu(1e4) * up = 1e4 * up.
    gate = torch.tensor([1e4, -1e4], dtype=dtype, device=device)
    up = random_tensor(gate.shape, dtype, device)
    out = torchops.swiglu(gate, up)
    assert out[1].item() == 0.0 and out[0].item() == pytest.approx(gate[0].item() * up[0].item(), rel=1e-2)
