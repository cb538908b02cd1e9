"""torch.func transforms (grad, vjp, jacrev, jvp, jacfwd, hessian, vmap) and forward-mode AD through the myns
ops, against the same math in PyTorch's own ops, in float64.

The Autograd kernels record graph nodes the way PyTorch's generated kernels do (csrc/core/autograd_node.h),
which is what lets functorch's wrapped tensors through; vmap runs the ops through PyTorch's batching fallback
(one call per batch element).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

import torchops
from helpers import REPO_ROOT

D = torch.float64

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=D, generator=_gen(seed))


# A 4 x 3 CSR matrix with an empty row and a repeated column.
CROW = torch.tensor([0, 2, 2, 3, 5])
COL = torch.tensor([0, 2, 1, 0, 2])
ROWS = torch.repeat_interleave(torch.arange(4), CROW.diff())


def dense_of(values: torch.Tensor) -> torch.Tensor:
    """The CSR matrix (CROW, COL, values) as a dense 4 x 3 matrix, differentiable in values."""
    return torch.zeros(4, 3, dtype=values.dtype).index_put((ROWS, COL), values, accumulate=True)


@dataclass
class Case:
    name: str
    op: Callable[..., torch.Tensor]
    ref: Callable[..., torch.Tensor]
    inputs: Callable[[], tuple[torch.Tensor, ...]]  # the differentiable arguments, float64


CASES = [
    Case("vector_add", torchops.vector_add, torch.add, lambda: (_randn(3, 4, seed=0), _randn(3, 4, seed=1))),
    Case("swiglu", torchops.swiglu, lambda g, u: F.silu(g) * u, lambda: (_randn(3, 4, seed=2), _randn(3, 4, seed=3))),
    Case("gelu_and_mul", torchops.gelu_and_mul, lambda g, u: F.gelu(g) * u,
         lambda: (_randn(3, 4, seed=11), _randn(3, 4, seed=12))),
    Case("gelu_and_mul_tanh", lambda g, u: torchops.gelu_and_mul(g, u, approximate="tanh"),
         lambda g, u: F.gelu(g, approximate="tanh") * u, lambda: (_randn(3, 4, seed=13), _randn(3, 4, seed=14))),
    Case("csr_spmm", lambda v, d: torchops.csr_spmm(CROW, COL, v, d), lambda v, d: dense_of(v) @ d,
         lambda: (_randn(5, seed=4), _randn(3, 2, seed=5))),
    Case("rms_norm", lambda x, w: torchops.rms_norm(x, w, eps=1e-6),
         lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps=1e-6), lambda: (_randn(3, 4, seed=6), _randn(4, seed=7))),
    Case("rms_norm_offset", lambda x, w: torchops.rms_norm(x, w, eps=1e-6, weight_offset=1.0),
         lambda x, w: F.rms_norm(x, (x.shape[-1],), w + 1.0, eps=1e-6),
         lambda: (_randn(2, 3, 5, seed=8), _randn(5, seed=9))),
]
IDS = [c.name for c in CASES]


def _sum_sq(f: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    return lambda *args: f(*args).pow(2).sum()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grad(case: Case) -> None:
    args = case.inputs()
    got = grad(_sum_sq(case.op), argnums=(0, 1))(*args)
    want = grad(_sum_sq(case.ref), argnums=(0, 1))(*args)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_vjp(case: Case) -> None:
    args = case.inputs()
    out, vjp_fn = vjp(case.op, *args)
    ref_out, ref_vjp_fn = vjp(case.ref, *args)
    torch.testing.assert_close(out, ref_out)
    cotangent = torch.randn_like(out, generator=_gen(10))
    torch.testing.assert_close(vjp_fn(cotangent), ref_vjp_fn(cotangent))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_jacrev(case: Case) -> None:
    args = case.inputs()
    torch.testing.assert_close(jacrev(case.op, argnums=(0, 1))(*args), jacrev(case.ref, argnums=(0, 1))(*args))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_jvp(case: Case) -> None:
    args = case.inputs()
    tangents = tuple(torch.randn_like(a, generator=_gen(20 + i)) for i, a in enumerate(args))
    out, tangent = jvp(case.op, args, tangents)
    ref_out, ref_tangent = jvp(case.ref, args, tangents)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(tangent, ref_tangent)
    # One tangent missing (a zero tangent for the other argument).
    _, only_second = jvp(lambda b: case.op(args[0], b), (args[1],), (tangents[1],))
    _, ref_only_second = jvp(lambda b: case.ref(args[0], b), (args[1],), (tangents[1],))
    torch.testing.assert_close(only_second, ref_only_second)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_jacfwd(case: Case) -> None:
    args = case.inputs()
    torch.testing.assert_close(jacfwd(case.op, argnums=(0, 1))(*args), jacrev(case.ref, argnums=(0, 1))(*args))


@pytest.mark.parametrize("case", [c for c in CASES if c.name != "vector_add"], ids=lambda c: c.name)
def test_hessian(case: Case) -> None:
    """jacfwd(jacrev(.)): forward mode through the backward ops (vector_add's Hessian is zero, skipped)."""
    args = case.inputs()
    f = _sum_sq(case.op)
    ref = _sum_sq(case.ref)
    torch.testing.assert_close(hessian(f, argnums=(0, 1))(*args), hessian(ref, argnums=(0, 1))(*args))
    torch.testing.assert_close(jacrev(jacrev(f))(*args), hessian(ref)(*args))
    torch.testing.assert_close(jacfwd(jacfwd(f))(*args), hessian(ref)(*args))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_vmap(case: Case) -> None:
    args = case.inputs()
    batched = tuple(torch.stack([a, 2 * a + 1, -a]) for a in args)
    got = vmap(case.op)(*batched)
    want = torch.stack([case.ref(*(b[i] for b in batched)) for i in range(3)])
    torch.testing.assert_close(got, want)
    # Only the second argument batched.
    got = vmap(case.op, in_dims=(None, 0))(args[0], batched[1])
    want = torch.stack([case.ref(args[0], batched[1][i]) for i in range(3)])
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_vmap_of_grad(case: Case) -> None:
    """Per-sample gradients: grad inside vmap."""
    args = case.inputs()
    batched = tuple(torch.stack([a, 2 * a + 1]) for a in args)
    got = vmap(grad(_sum_sq(case.op), argnums=(0, 1)))(*batched)
    want = vmap(grad(_sum_sq(case.ref), argnums=(0, 1)))(*batched)
    torch.testing.assert_close(got, want)


def test_sparse_tensor_components_taken_outside_the_transform() -> None:
    """PyTorch can't take a sparse CSR tensor's components inside a torch.func transform ("Sparse CSR tensors
    do not have strides", also from torchops.spmm there): take them outside and call csr_spmm."""
    values, dense, td = _randn(5, seed=30), _randn(3, 2, seed=31), _randn(3, 2, seed=32)
    A = torch.sparse_csr_tensor(CROW, COL, values, (4, 3))
    crow, col, vals = A.crow_indices(), A.col_indices(), A.values()
    ref = lambda d: dense_of(values) @ d  # noqa: E731
    f = lambda d: torchops.csr_spmm(crow, col, vals, d)  # noqa: E731
    torch.testing.assert_close(jvp(f, (dense,), (td,)), jvp(ref, (dense,), (td,)))
    torch.testing.assert_close(jacrev(f)(dense), jacrev(ref)(dense))
    torch.testing.assert_close(vmap(f)(torch.stack([dense, td])), torch.stack([ref(dense), ref(td)]))


# Forward-mode AD without torch.func (torch.autograd.forward_ad), the reproducer among them.

def test_forward_ad_csr_spmm_tangent_is_not_dropped() -> None:
    values, dense = _randn(5, seed=40), _randn(3, 2, seed=41)
    tv, td = _randn(5, seed=42), _randn(3, 2, seed=43)
    with fwAD.dual_level():
        out = torchops.csr_spmm(CROW, COL, fwAD.make_dual(values, tv), fwAD.make_dual(dense, td))
        tangent = fwAD.unpack_dual(out).tangent
    assert tangent is not None
    torch.testing.assert_close(tangent, dense_of(tv) @ dense + dense_of(values) @ td)
    _, via_func = jvp(lambda v, d: torchops.csr_spmm(CROW, COL, v, d), (values, dense), (tv, td))
    assert via_func.abs().sum() > 0
    torch.testing.assert_close(via_func, tangent)


def test_forward_ad_spmm_with_cached_transpose() -> None:
    values, dense, td = _randn(5, seed=50), _randn(3, 2, seed=51), _randn(3, 2, seed=52)
    A = torch.sparse_csr_tensor(CROW, COL, values, (4, 3))
    with fwAD.dual_level():
        out = torchops.spmm(A, fwAD.make_dual(dense, td))
        tangent = fwAD.unpack_dual(out).tangent
    torch.testing.assert_close(tangent, dense_of(values) @ td)


def test_gradcheck_forward_and_double_backward_csr() -> None:
    values = _randn(5, seed=60).requires_grad_()
    dense = _randn(3, 2, seed=61).requires_grad_()
    grad_out = _randn(4, 2, seed=62).requires_grad_()
    spmm = lambda v, d: torch.ops.myns.csr_spmm(CROW, COL, v, d)  # noqa: E731
    sddmm = lambda g, d: torch.ops.myns.sddmm(CROW, COL, g, d)  # noqa: E731
    t_crow, t_col, t_perm = torch.ops.myns._csr_transpose(CROW, COL, 3)
    with_t = lambda v, d: torch.ops.myns._csr_spmm_with_transpose(CROW, COL, v, d, t_crow, t_col, t_perm)  # noqa: E731
    for f, args in ((spmm, (values, dense)), (sddmm, (grad_out, dense)), (with_t, (values, dense))):
        assert torch.autograd.gradcheck(f, args, check_forward_ad=True, check_backward_ad=True)
        assert torch.autograd.gradgradcheck(f, args, check_fwd_over_rev=True, check_rev_over_rev=True)


def test_gradcheck_forward_over_reverse_swiglu() -> None:
    gate, up = _randn(3, 4, seed=70).requires_grad_(), _randn(3, 4, seed=71).requires_grad_()
    assert torch.autograd.gradcheck(torchops.swiglu, (gate, up), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(torchops.swiglu, (gate, up), check_fwd_over_rev=True)
    grad_out = _randn(3, 4, seed=72).requires_grad_()
    assert torch.autograd.gradcheck(torch.ops.myns.swiglu_backward, (grad_out, gate, up), check_forward_ad=True)


# rms_norm without a weight, and through the backward recorded under create_graph=True (ATen math, so
# derivatives of any order), against F.rms_norm in float64.

def test_rms_norm_without_weight() -> None:
    x, tx = _randn(3, 6, seed=90), _randn(3, 6, seed=91)
    op = lambda a: torchops.rms_norm(a, eps=1e-5)  # noqa: E731
    ref = lambda a: F.rms_norm(a, (6,), eps=1e-5)  # noqa: E731
    torch.testing.assert_close(grad(_sum_sq(op))(x), grad(_sum_sq(ref))(x))
    torch.testing.assert_close(jvp(op, (x,), (tx,)), jvp(ref, (x,), (tx,)))
    torch.testing.assert_close(hessian(_sum_sq(op))(x), hessian(_sum_sq(ref))(x))


@pytest.mark.parametrize("weight_offset", [0.0, 0.5])
def test_gradcheck_rms_norm_all_modes(weight_offset: float) -> None:
    x = _randn(3, 5, seed=92).requires_grad_()
    w = _randn(5, seed=93).requires_grad_()
    f = lambda a, b: torchops.rms_norm(a, b, eps=1e-6, weight_offset=weight_offset)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, w), check_forward_ad=True, check_backward_ad=True)
    assert torch.autograd.gradgradcheck(f, (x, w), check_fwd_over_rev=True, check_rev_over_rev=True)
    g = lambda a, b: torch.ops.myns._rms_norm_forward(a, b, 1e-6, weight_offset)[0]  # noqa: E731
    assert torch.autograd.gradcheck(g, (x, w), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(g, (x, w))


def test_rms_norm_create_graph_matches_the_kernel_backward() -> None:
    """create_graph=False runs the _rms_norm_backward kernel, create_graph=True the ATen math: same gradients."""
    x = _randn(4, 7, seed=94).requires_grad_()
    w = _randn(7, seed=95).requires_grad_()
    plain = torch.autograd.grad(torchops.rms_norm(x, w, weight_offset=0.25).pow(2).sum(), (x, w))
    recorded = torch.autograd.grad(torchops.rms_norm(x, w, weight_offset=0.25).pow(2).sum(), (x, w),
                                   create_graph=True)
    assert all(g.requires_grad for g in recorded)
    torch.testing.assert_close(recorded, plain)


def test_rms_norm_rstd_is_not_differentiable() -> None:
    x = _randn(3, 4, seed=96).requires_grad_()
    out, rstd = torch.ops.myns._rms_norm_forward(x, None, 1e-6)
    assert out.requires_grad and not rstd.requires_grad and rstd.grad_fn is None
    with fwAD.dual_level():
        out, rstd = torch.ops.myns._rms_norm_forward(fwAD.make_dual(x.detach(), torch.ones_like(x)), None, 1e-6)
        assert fwAD.unpack_dual(out).tangent is not None and fwAD.unpack_dual(rstd).tangent is None


def test_rms_norm_backward_op_refuses_its_own_derivatives_by_name() -> None:
    x, w = _randn(3, 4, seed=97), _randn(4, seed=98)
    _, rstd = torch.ops.myns._rms_norm_forward(x, w, 1e-6)
    dy = _randn(3, 4, seed=99).requires_grad_()
    gx, _ = torch.ops.myns._rms_norm_backward(dy, x, w, rstd, True, False)
    assert gx.grad_fn.name() == "RmsNormBackwardBackward"
    with pytest.raises(RuntimeError, match=r"myns::_rms_norm_backward: double backward .* is not supported"):
        gx.sum().backward()
    with fwAD.dual_level(), pytest.raises(RuntimeError, match=r"myns::_rms_norm_backward: forward-mode AD"):
        torch.ops.myns._rms_norm_backward(fwAD.make_dual(dy.detach(), dy.detach()), x, w, rstd, True, False)


# add_rms_norm: residual_out = input + residual, out = rms_norm(residual_out), against torch ops in float64.

def add_rms_norm_reference(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float,
                           weight_offset: float) -> tuple[torch.Tensor, torch.Tensor]:
    h = x + r
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * (w + weight_offset), h


def _add_inputs() -> tuple[torch.Tensor, ...]:
    return _randn(3, 5, seed=100), _randn(3, 5, seed=101), _randn(5, seed=102)


def _add_ops(weight_offset: float) -> tuple[Callable[..., tuple[torch.Tensor, ...]], ...]:
    op = lambda x, r, w: torchops.ops.add_rms_norm(x, r, w, eps=1e-6, weight_offset=weight_offset)  # noqa: E731
    ref = lambda x, r, w: add_rms_norm_reference(x, r, w, 1e-6, weight_offset)  # noqa: E731
    return op, ref


def _loss(f: Callable[..., tuple[torch.Tensor, ...]]) -> Callable[..., torch.Tensor]:
    """Both outputs reach the loss (residual_out's gradient passes through the add)."""
    scale = _randn(3, 5, seed=103)

    def loss(*args: torch.Tensor) -> torch.Tensor:
        out, residual_out = f(*args)
        return out.pow(2).sum() + (residual_out * scale).sum()

    return loss


OFFSETS = [0.0, 1.0]


@pytest.mark.parametrize("weight_offset", OFFSETS)
def test_add_rms_norm_grad(weight_offset: float) -> None:
    op, ref = _add_ops(weight_offset)
    args = _add_inputs()
    got = grad(_loss(op), argnums=(0, 1, 2))(*args)
    torch.testing.assert_close(got, grad(_loss(ref), argnums=(0, 1, 2))(*args))
    # out alone (no gradient reaching residual_out) and residual_out alone.
    for pick in (0, 1):
        f = lambda g: (lambda *a: g(*a)[pick].pow(2).sum())  # noqa: E731
        torch.testing.assert_close(grad(f(op), argnums=(0, 1, 2))(*args), grad(f(ref), argnums=(0, 1, 2))(*args))


@pytest.mark.parametrize("weight_offset", OFFSETS)
def test_add_rms_norm_vjp(weight_offset: float) -> None:
    op, ref = _add_ops(weight_offset)
    args = _add_inputs()
    outs, vjp_fn = vjp(op, *args)
    ref_outs, ref_vjp_fn = vjp(ref, *args)
    torch.testing.assert_close(outs, ref_outs)
    cotangents = (_randn(3, 5, seed=104), _randn(3, 5, seed=105))
    torch.testing.assert_close(vjp_fn(cotangents), ref_vjp_fn(cotangents))


@pytest.mark.parametrize("weight_offset", OFFSETS)
def test_add_rms_norm_jacrev(weight_offset: float) -> None:
    op, ref = _add_ops(weight_offset)
    args = _add_inputs()
    torch.testing.assert_close(jacrev(op, argnums=(0, 1, 2))(*args), jacrev(ref, argnums=(0, 1, 2))(*args))


@pytest.mark.parametrize("weight_offset", OFFSETS)
def test_add_rms_norm_jvp_and_jacfwd(weight_offset: float) -> None:
    op, ref = _add_ops(weight_offset)
    args = _add_inputs()
    tangents = tuple(torch.randn_like(a, generator=_gen(110 + i)) for i, a in enumerate(args))
    torch.testing.assert_close(jvp(op, args, tangents), jvp(ref, args, tangents))
    # Only the residual's tangent.
    only_r = lambda f: (lambda r: f(args[0], r, args[2]))  # noqa: E731
    torch.testing.assert_close(jvp(only_r(op), (args[1],), (tangents[1],)),
                               jvp(only_r(ref), (args[1],), (tangents[1],)))
    torch.testing.assert_close(jacfwd(op, argnums=(0, 1, 2))(*args), jacrev(ref, argnums=(0, 1, 2))(*args))


def test_add_rms_norm_vmap_of_grad() -> None:
    op, ref = _add_ops(0.0)
    batched = tuple(torch.stack([a, 2 * a + 1]) for a in _add_inputs())
    got = vmap(grad(_loss(op), argnums=(0, 1, 2)))(*batched)
    torch.testing.assert_close(got, vmap(grad(_loss(ref), argnums=(0, 1, 2)))(*batched))


def test_add_rms_norm_second_derivatives_are_refused_by_name() -> None:
    """Its backward is the _add_rms_norm_backward kernel, which has no derivatives of its own."""
    op, _ = _add_ops(0.0)
    with pytest.raises(RuntimeError, match=r"myns::_add_rms_norm_backward: double backward .* is not supported"):
        jacrev(jacrev(_loss(op)))(*_add_inputs())
    with pytest.raises(RuntimeError, match=r"myns::_add_rms_norm_backward: forward-mode AD is not supported"):
        hessian(_loss(op))(*_add_inputs())  # forward mode over the backward


def test_add_rms_norm_node() -> None:
    x, r, w = (a.requires_grad_() for a in _add_inputs())
    out, residual_out = torchops.ops.add_rms_norm(x, r, w)
    assert out.grad_fn is residual_out.grad_fn and out.grad_fn.name() == "AddRmsNormBackward"
    assert {e[0] for e in out.grad_fn.next_functions} == {_accumulator(a) for a in (x, r, w)}
    with torch.no_grad():
        assert torchops.ops.add_rms_norm(x, r, w)[0].grad_fn is None
    rstd = torch.ops.myns._add_rms_norm_forward(x, r, w, 1e-6)[2]
    assert not rstd.requires_grad
    # residual_out is saved for backward: changing it in place first is caught.
    out, residual_out = torchops.ops.add_rms_norm(x, r, w)
    loss = out.sum()
    with torch.no_grad():
        residual_out.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


# The graph nodes keep autograd's usual behaviour.

NODE_CASES = CASES[:4]  # one case per op


@pytest.mark.parametrize("case", NODE_CASES, ids=lambda c: c.name)
def test_no_node_without_grad_and_named_node_with(case: Case) -> None:
    args = case.inputs()
    assert case.op(*args).grad_fn is None
    with torch.no_grad():
        assert case.op(*(a.requires_grad_() for a in args)).grad_fn is None
    out = case.op(*args)
    assert out.requires_grad and out.grad_fn.name().endswith("Backward")
    next_nodes = {e[0] for e in out.grad_fn.next_functions if e[0] is not None}
    assert next_nodes == {a.grad_fn or _accumulator(a) for a in args}


def _accumulator(t: torch.Tensor) -> object:
    return t.view_as(t).grad_fn.next_functions[0][0]


@pytest.mark.parametrize("case", [c for c in NODE_CASES if c.name != "vector_add"], ids=lambda c: c.name)
def test_saved_input_modified_in_place_raises(case: Case) -> None:
    args = tuple(a.requires_grad_() for a in case.inputs())
    out = case.op(*args)
    with torch.no_grad():
        args[1].mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@pytest.mark.parametrize("case", [c for c in NODE_CASES if c.name != "vector_add"], ids=lambda c: c.name)
def test_second_backward_without_retain_graph_raises(case: Case) -> None:
    args = tuple(a.requires_grad_() for a in case.inputs())
    out = case.op(*args).sum()
    out.backward(retain_graph=True)
    out.backward()  # retained: fine
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward()


# The nodes' compiled-autograd support uses compiled autograd's C++ interface as torch 2.14 has it.
COMPILED_AUTOGRAD_SUPPORTED = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 14)


@pytest.mark.parametrize("case", NODE_CASES, ids=lambda c: c.name)
def test_compiled_autograd(case: Case) -> None:
    import torch._dynamo.compiled_autograd as compiled_autograd

    args = tuple(a.requires_grad_() for a in case.inputs())
    want = torch.autograd.grad(_sum_sq(case.op)(*args), args)
    torch._dynamo.reset()
    if not COMPILED_AUTOGRAD_SUPPORTED:  # older torch: a clear error naming the op's node
        with pytest.raises(NotImplementedError, match="compiled_args not implemented: .*Backward"):
            with compiled_autograd._enable(torch.compile(backend="eager")):
                _sum_sq(case.op)(*args).backward()
        return
    with compiled_autograd._enable(torch.compile(backend="eager")):
        _sum_sq(case.op)(*args).backward()
    torch.testing.assert_close(tuple(a.grad for a in args), want)


@pytest.mark.skipif(not COMPILED_AUTOGRAD_SUPPORTED, reason="compiled autograd's C++ interface of torch >= 2.14")
def test_compiled_autograd_traces_a_node_again() -> None:
    """A node is bound once per process: re-traced graphs (a new shape, after a reset) reuse it."""
    import torch._dynamo.compiled_autograd as compiled_autograd

    for shape in ((3, 4), (5, 7), (3, 4)):
        torch._dynamo.reset()
        gate, up = _randn(*shape, seed=90).requires_grad_(), _randn(*shape, seed=91).requires_grad_()
        want = torch.autograd.grad(_sum_sq(torchops.swiglu)(gate, up), (gate, up))
        with compiled_autograd._enable(torch.compile(backend="eager", dynamic=False)):
            _sum_sq(torchops.swiglu)(gate, up).backward()
        torch.testing.assert_close((gate.grad, up.grad), want)


def test_vmap_of_out_variant_fails_naming_the_op() -> None:
    a, b = _randn(2, 3, seed=80), _randn(2, 3, seed=81)
    with pytest.raises(RuntimeError, match="myns::vector_add_out"):
        vmap(lambda x, y, o: torch.ops.myns.vector_add_out(x, y, o))(a, b, torch.empty_like(a))


def test_grad_under_functorch_in_fresh_process() -> None:
    """The first use in a process (nothing cached, no warm dispatcher state) works too."""
    code = textwrap.dedent("""
        import torch, torchops
        x = torch.randn(4, dtype=torch.float64); y = torch.randn(4, dtype=torch.float64)
        g = torch.func.grad(lambda a: torchops.swiglu(a, y).sum())(x)
        s = torch.sigmoid(x)
        torch.testing.assert_close(g, y * s * (1 + x * (1 - s)))
        print("ok")
    """)
    with warnings.catch_warnings():
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT,
                             env={"PYTHONPATH": REPO_ROOT, "PATH": "/usr/bin:/bin"}, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]
