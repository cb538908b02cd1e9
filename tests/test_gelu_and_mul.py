"""gelu_and_mul specifics the generic tables don't express: the wrapper and its `approximate` argument, chunk
halves read in place, large |gate|, inf/NaN as torch's F.gelu gives them, closeness in ulps to a float64
reference (every 16-bit gate too), layouts giving the same bits, double backward and forward-mode AD, and
CUDA-only layouts (rows, tiles, alignments). Both forms (erf "none" and "tanh") throughout."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torchops
from helpers import DEVICES, assert_close_to_reference, chunk_halves, exact_gelu, random_tensor, requires_cuda, ulp

ALL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FORMS = ("none", "tanh")


def reference(gate: torch.Tensor, up: torch.Tensor, approximate: str) -> torch.Tensor:
    gate, up = gate.detach().cpu().double(), up.detach().cpu().double()
    return F.gelu(gate, approximate=approximate) * up


def reference_backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                       approximate: str) -> tuple[torch.Tensor, torch.Tensor]:
    grad, gate, up = (t.detach().cpu().double() for t in (grad, gate, up))
    return (torch.ops.aten.gelu_backward(grad * up, gate, approximate=approximate),
            grad * F.gelu(gate, approximate=approximate))


def derivative(x: torch.Tensor, approximate: str) -> torch.Tensor:
    return torch.ops.aten.gelu_backward(torch.ones_like(x), x, approximate=approximate)




# ------------------------------------------------------------------------------------------- wrapper


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", FORMS)
def test_wrapper_is_the_op(device: str, approximate: str) -> None:
    gate, up = random_tensor((5, 6), torch.float32, device), random_tensor((5, 6), torch.float32, device)
    out = torchops.gelu_and_mul(gate, up, approximate=approximate)
    assert torch.equal(out, torch.ops.myns.gelu_and_mul(gate, up, approximate=approximate))
    assert torch.equal(out, torch.ops.myns.gelu_and_mul(gate, up, approximate))
    assert out.is_contiguous() and out.shape == gate.shape
    assert_close_to_reference(out.cpu(), reference(gate, up, approximate))


def test_default_is_the_erf_form() -> None:
    gate, up = random_tensor((64,), torch.float32, "cpu"), random_tensor((64,), torch.float32, "cpu")
    assert torch.equal(torchops.gelu_and_mul(gate, up), torchops.gelu_and_mul(gate, up, "none"))
    assert not torch.equal(torchops.gelu_and_mul(gate, up), torchops.gelu_and_mul(gate, up, "tanh"))


@pytest.mark.parametrize("device", DEVICES)
def test_errors_name_op_and_argument(device: str) -> None:
    x = torch.randn(4, device=device)
    with pytest.raises(RuntimeError, match=r"^myns::gelu_and_mul: approximate must be 'none' or 'tanh', got 'erf'$"):
        torchops.gelu_and_mul(x, x, approximate="erf")
    with pytest.raises(RuntimeError, match=r"^myns::gelu_and_mul_backward: approximate must be 'none' or 'tanh', got ''"):
        torch.ops.myns.gelu_and_mul_backward(x, x, x, "")
    with pytest.raises(RuntimeError, match=r"myns::gelu_and_mul: gate and up must have the same shape, got \[4, 8\] and \[4, 9\]"):
        torchops.gelu_and_mul(torch.randn(4, 8, device=device), torch.randn(4, 9, device=device))
    with pytest.raises(RuntimeError, match=r"myns::gelu_and_mul: gate has unsupported dtype Long"):
        torchops.gelu_and_mul(torch.arange(4, device=device), torch.arange(4, device=device))
    # The fake kernel raises the same message (torch.compile / export meet it there).
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fake = torch.empty(4, device=device)
        with pytest.raises(RuntimeError, match=r"myns::gelu_and_mul: approximate must be 'none' or 'tanh', got 'erf'"):
            torch.ops.myns.gelu_and_mul(fake, fake, "erf")


# -------------------------------------------------------------------------------------- chunk halves


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("h", [1, 7, 8, 33, 257])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("approximate", FORMS)
def test_chunk_halves_forward_and_backward(device: str, dtype: torch.dtype, h: int, offset: int,
                                           approximate: str) -> None:
    x, gate, up = chunk_halves(9, h, dtype, device, offset=offset)
    x_before = x.clone()
    out = torchops.gelu_and_mul(gate, up, approximate)
    assert out.is_contiguous() and out.shape == (9, h)
    assert_close_to_reference(out.cpu(), reference(gate, up, approximate))
    grad = random_tensor((9, h), dtype, device)
    grad_gate, grad_up = torch.ops.myns.gelu_and_mul_backward(grad, gate, up, approximate)
    ref_gate, ref_up = reference_backward(grad, gate, up, approximate)
    assert_close_to_reference(grad_gate.cpu(), ref_gate)
    assert_close_to_reference(grad_up.cpu(), ref_up)
    assert torch.equal(x, x_before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", FORMS)
def test_chunk_halves_autograd_reaches_the_fused_input(device: str, approximate: str) -> None:
    x = random_tensor((6, 2 * 24), torch.float64, device).requires_grad_()
    torchops.gelu_and_mul(*x.chunk(2, dim=-1), approximate=approximate).pow(2).sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    g, u = x_ref.chunk(2, dim=-1)
    (F.gelu(g, approximate=approximate) * u).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)


# --------------------------------------------------------------------------------- large |gate|, inf, NaN


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("approximate", FORMS)
def test_large_gate_does_not_overflow(device: str, dtype: torch.dtype, approximate: str) -> None:
    # The tanh form's x^3 overflows f32 past |x| ~ 7e12 and its derivative's x^2 past 1.8e19: the result
    # saturates to x (or 0) and the derivative to 1 (or 0), never inf or NaN.
    values = [1e4, -1e4, 1e3, -1e3, 100.0, -100.0, 30.0, -30.0, 10.0, -10.0, 5.5, -5.5, 3.0, -3.0, 1.0, -1.0]
    if dtype in (torch.bfloat16, torch.float32):
        values[:4] = [1e30, -1e30, 1e20, -1e20]
    gate = torch.tensor(values * 3, dtype=dtype, device=device)  # 48: vector body and scalar tail
    up = random_tensor(gate.shape, dtype, device)
    grad = random_tensor(gate.shape, dtype, device)
    out = torchops.gelu_and_mul(gate, up, approximate)
    grad_gate, grad_up = torch.ops.myns.gelu_and_mul_backward(grad, gate, up, approximate)
    for t in (out, grad_gate, grad_up):
        assert bool(t.isfinite().all()), t
    exact_out = reference(gate, up, approximate)
    assert_close_to_reference(out.cpu(), exact_out)
    # The derivative at the gate, exactly 1 or 0 once saturated.
    d = derivative(gate.cpu().double(), approximate)
    ref_gate = grad.cpu().double() * up.cpu().double() * d
    assert_close_to_reference(grad_gate.cpu(), ref_gate)
    assert_close_to_reference(grad_up.cpu(), grad.cpu().double() * F.gelu(gate.cpu().double(), approximate=approximate))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("approximate", FORMS)
def test_inf_and_nan_like_torch_gelu(device: str, dtype: torch.dtype, approximate: str) -> None:
    inf, nan = math.inf, math.nan
    specials = [inf, -inf, nan, 1e4, -1e4, 0.0, -0.0, 1.0, -1.0]
    # Every (gate, up) pair of special values, 81 elements: through the vector loops and the tails.
    gate = torch.tensor([g for g in specials for _ in specials], dtype=dtype, device=device)
    up = torch.tensor([u for _ in specials for u in specials], dtype=dtype, device=device)
    grad = torch.tensor([1.5, -2.0, 0.5] * 27, dtype=dtype, device=device)
    # F.gelu in float64: gelu(+inf) = inf, gelu(-inf) = NaN (-inf * 0); torch's gelu_backward: NaN at +-inf.
    expected = reference(gate, up, approximate)
    got = torchops.gelu_and_mul(gate, up, approximate).cpu().double()
    assert torch.equal(got.isnan(), expected.isnan())
    torch.testing.assert_close(got, expected.to(dtype).double(), equal_nan=True, rtol=1e-2, atol=0)
    got_grads = torch.ops.myns.gelu_and_mul_backward(grad, gate, up, approximate)
    for got_g, exp_g in zip(got_grads, reference_backward(grad, gate, up, approximate)):
        got_g = got_g.cpu().double()
        assert torch.equal(got_g.isnan(), exp_g.isnan())
        torch.testing.assert_close(got_g, exp_g.to(dtype).double(), equal_nan=True, rtol=1e-2, atol=0)


# ----------------------------------------------------------------------------------- ulp-level accuracy
# 16-bit: computed in f32 and rounded once: within 1 ulp of the exact value (times up, one more rounding).
# f32/f64: erf/erfc or exp within a few ulp, plus two products: 8 ulp; plus a term relative to the size of
# the terms where the derivative's Phi + x phi cancels (x ~ -0.75) or the value is tiny (far below zero,
# bounded by the absolute error of Phi).


def _ulp_bounds(dtype: torch.dtype) -> tuple[float, float]:
    if dtype in (torch.float16, torch.bfloat16):
        return 1.0, 2.0**-23
    return 8.0, 2.0**-23 if dtype == torch.float32 else 2.0**-52


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("approximate", FORMS)
def test_within_ulps_of_float64(device: str, dtype: torch.dtype, approximate: str) -> None:
    n = (1 << 16) + 5
    gate = random_tensor((n,), dtype, device, low=-8, high=8)
    up, grad = torch.ones_like(gate), random_tensor((n,), dtype, device)
    g64, d64 = gate.cpu().double(), grad.cpu().double()
    ulps, eps = _ulp_bounds(dtype)
    # The terms' size: |x| Phi(x) + |x| |Phi| bounds the value's rounding; |Phi| + |x phi| + ... the derivative's.
    cdf = 0.5 * (1 + torch.erf(g64 / math.sqrt(2)))
    pdf = torch.exp(-0.5 * g64 * g64) / math.sqrt(2 * math.pi)
    value_scale = g64.abs() * torch.maximum(cdf, torch.full_like(cdf, 1.0)) * (1 + g64.abs())
    # The erf form's Phi = (1 + erf) / 2 is accurate to ~eps absolute, not relative (as torch's is): 1 + erf
    # cancels far below zero (f64 on every device, f32 on CUDA; the CPU's 8-lane f32 form uses erfc).
    slope_scale = cdf + g64.abs() * pdf * (1 + g64 * g64) + 1

    value, slope = exact_gelu(gate, approximate)
    out = torchops.gelu_and_mul(gate, up, approximate).cpu().double()
    exact = value
    bound = ulps * ulp(exact, dtype) + 16 * eps * value_scale
    assert bool(((out - exact).abs() <= bound).all()), ((out - exact).abs() / bound).max()

    grad_gate, grad_up = (t.cpu().double() for t in torch.ops.myns.gelu_and_mul_backward(grad, gate, up, approximate))
    exact_gate, exact_up = d64 * slope, d64 * value
    bound = ulps * ulp(exact_gate, dtype) + 16 * eps * d64.abs() * slope_scale
    assert bool(((grad_gate - exact_gate).abs() <= bound).all()), ((grad_gate - exact_gate).abs() / bound).max()
    bound = ulps * ulp(exact_up, dtype) + 16 * eps * d64.abs() * value_scale
    assert bool(((grad_up - exact_up).abs() <= bound).all()), ((grad_up - exact_up).abs() / bound).max()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("approximate", FORMS)
def test_every_16_bit_gate(device: str, dtype: torch.dtype, approximate: str) -> None:
    # All 65536 bit patterns as the gate (the CPU looks 16-bit activations up in tables built from them):
    # gelu within 1 ulp of float64 where the f32 math resolves it, NaN exactly where F.gelu gives NaN; the
    # backward's grad_up likewise. Far below zero gelu's value (~1e-9 at -6) is below the f32 math's
    # absolute resolution of Phi (~6e-8 relative to 1): bounded by |x| times that.
    gate = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype).to(device)
    ones = torch.ones_like(gate)
    exact = exact_gelu(gate, approximate)[0]
    g64 = gate.cpu().double()
    exact[g64.isnan() | (g64 == -math.inf)] = math.nan  # -inf * 0, as F.gelu gives it
    checked = exact.isfinite()
    for got in (torchops.gelu_and_mul(gate, ones, approximate),
                torch.ops.myns.gelu_and_mul_backward(ones, gate, ones, approximate)[1]):
        got = got.cpu().double()
        assert torch.equal(got.isnan(), exact.isnan())
        assert torch.equal(got[exact.isinf()], exact[exact.isinf()])
        err = (got[checked] - exact[checked]).abs()
        bound = ulp(exact[checked], dtype) + 2.0**-22 * g64[checked].abs()
        assert bool((err <= bound).all()), (err / bound).max()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("approximate", FORMS)
def test_layout_does_not_change_the_bits(device: str, dtype: torch.dtype, approximate: str) -> None:
    # Contiguous, chunk halves, transposed and strided inputs run different loops; same values, same bits.
    _, gate, up = chunk_halves(37, 41, dtype, device)
    dense = torchops.gelu_and_mul(gate.contiguous(), up.contiguous(), approximate)
    assert torch.equal(torchops.gelu_and_mul(gate, up, approximate), dense)
    assert torch.equal(torchops.gelu_and_mul(gate.t().contiguous().t(), up, approximate), dense)
    grads_dense = torch.ops.myns.gelu_and_mul_backward(dense, gate.contiguous(), up.contiguous(), approximate)
    for got, want in zip(torch.ops.myns.gelu_and_mul_backward(dense, gate, up, approximate), grads_dense):
        assert torch.equal(got, want)


# --------------------------------------------------------------------------------- autograd extras


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", FORMS)
def test_gradcheck_forward_and_double_backward(device: str, approximate: str) -> None:
    gate = random_tensor((4, 7), torch.float64, device).requires_grad_()
    up = random_tensor((4, 7), torch.float64, device).requires_grad_()
    f = lambda g, u: torchops.gelu_and_mul(g, u, approximate)  # noqa: E731
    assert torch.autograd.gradcheck(f, (gate, up), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(f, (gate, up), check_fwd_over_rev=True)
    grad_out = random_tensor((4, 7), torch.float64, device).requires_grad_()
    b = lambda g, x, u: torch.ops.myns.gelu_and_mul_backward(g, x, u, approximate)  # noqa: E731
    assert torch.autograd.gradcheck(b, (grad_out, gate, up), check_forward_ad=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", FORMS)
def test_hessian_vector_product_matches_torch(device: str, approximate: str) -> None:
    gate = random_tensor((3, 5), torch.float64, device).requires_grad_()
    up = random_tensor((3, 5), torch.float64, device).requires_grad_()
    v = (random_tensor((3, 5), torch.float64, device), random_tensor((3, 5), torch.float64, device))

    def hvp(f):
        grads = torch.autograd.grad(f(gate, up).pow(2).sum(), (gate, up), create_graph=True)
        return torch.autograd.grad(grads, (gate, up), v)

    got = hvp(lambda g, u: torchops.gelu_and_mul(g, u, approximate))
    want = hvp(lambda g, u: F.gelu(g, approximate=approximate) * u)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", FORMS)
def test_torch_func_transforms(device: str, approximate: str) -> None:
    gate, up = random_tensor((3, 4), torch.float64, device), random_tensor((3, 4), torch.float64, device)
    f = lambda g, u: torchops.gelu_and_mul(g, u, approximate)  # noqa: E731
    ref = lambda g, u: F.gelu(g, approximate=approximate) * u  # noqa: E731
    torch.testing.assert_close(torch.func.jacrev(f, argnums=(0, 1))(gate, up),
                               torch.func.jacrev(ref, argnums=(0, 1))(gate, up))
    torch.testing.assert_close(torch.func.jacfwd(f, argnums=(0, 1))(gate, up),
                               torch.func.jacrev(ref, argnums=(0, 1))(gate, up))
    batched = (torch.stack([gate, 2 * gate]), torch.stack([up, -up]))
    torch.testing.assert_close(torch.func.vmap(f)(*batched), ref(*batched))
    s = lambda g, u: f(g, u).pow(2).sum()  # noqa: E731
    torch.testing.assert_close(torch.func.hessian(s)(gate, up),
                               torch.func.hessian(lambda g, u: ref(g, u).pow(2).sum())(gate, up))


def test_exported_graph_holds_the_op() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torchops.gelu_and_mul(*x.chunk(2, dim=-1), approximate="tanh")

    ep = torch.export.export(M(), (torch.randn(4, 16),))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "myns.gelu_and_mul.default" in targets, targets
    node = next(n for n in ep.graph.nodes if str(n.target) == "myns.gelu_and_mul.default")
    assert "tanh" in node.args or node.kwargs.get("approximate") == "tanh", node


# ------------------------------------------------------------------------------------------ CUDA only


@requires_cuda
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("h", [1, 7, 9, 17, 255, 1001, 11008])
@pytest.mark.parametrize("offset", [0, 1, 3])
@pytest.mark.parametrize("approximate", FORMS)
def test_cuda_chunk_halves_rows_paths(dtype: torch.dtype, h: int, offset: int, approximate: str) -> None:
    from helpers import poison_cuda_cache

    x, gate, up = chunk_halves(33, h, dtype, "cuda", offset=offset)
    grad = random_tensor((33, h), dtype, "cuda")
    poison_cuda_cache()
    out = torchops.gelu_and_mul(gate, up, approximate)
    grad_gate, grad_up = torch.ops.myns.gelu_and_mul_backward(grad, gate, up, approximate)
    assert_close_to_reference(out.cpu(), reference(gate, up, approximate))
    ref_gate, ref_up = reference_backward(grad, gate, up, approximate)
    assert_close_to_reference(grad_gate.cpu(), ref_gate)
    assert_close_to_reference(grad_up.cpu(), ref_up)


@requires_cuda
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("approximate", FORMS)
def test_cuda_transposed_tiles_and_alignments(dtype: torch.dtype, approximate: str) -> None:
    # Transposed gate and/or up (the tiled path, partial tiles), 1-D slices at every alignment (head and
    # tail elements around the 16-byte vectors), strided 1-D gates (strided loads, vector stores).
    for rows, cols in ((3, 5), (64, 33), (130, 257)):
        gate_t = random_tensor((cols, rows), dtype, "cuda").t()
        up = random_tensor((rows, cols), dtype, "cuda")
        for g, u in ((gate_t, up), (up, gate_t), (gate_t, gate_t.clone())):
            assert_close_to_reference(torchops.gelu_and_mul(g, u, approximate).cpu(), reference(g, u, approximate))
            grad = random_tensor((cols, rows), dtype, "cuda").t()
            for got, want in zip(torch.ops.myns.gelu_and_mul_backward(grad, g, u, approximate),
                                 reference_backward(grad, g, u, approximate)):
                assert_close_to_reference(got.cpu(), want)
    for offset in range(8):
        for n in (1, 7, 9, 17, 257, 1025, 4096 * 4 + 5):
            gate = random_tensor((n + 8,), dtype, "cuda")[offset:offset + n]
            up = random_tensor((n + 8,), dtype, "cuda")[(offset * 3) % 8:(offset * 3) % 8 + n]
            assert_close_to_reference(torchops.gelu_and_mul(gate, up, approximate).cpu(), reference(gate, up, approximate))
    gate = random_tensor((2 * 4099,), dtype, "cuda")[::2]
    up = random_tensor((4099,), dtype, "cuda")
    assert_close_to_reference(torchops.gelu_and_mul(gate, up, approximate).cpu(), reference(gate, up, approximate))


@requires_cuda
def test_cuda_matches_cpu_closely() -> None:
    for approximate in FORMS:
        for dtype in ALL_DTYPES:
            _, gate, up = chunk_halves(64, 11008 // 8, dtype, "cuda", low=-8, high=8)
            got, want = torchops.gelu_and_mul(gate, up, approximate).cpu(), torchops.gelu_and_mul(gate.cpu(), up.cpu(), approximate)
            assert_close_to_reference(got, want.double())


@requires_cuda
def test_cuda_current_stream_and_graph_capture() -> None:
    gate, up = random_tensor((256, 512), torch.bfloat16, "cuda"), random_tensor((256, 512), torch.bfloat16, "cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = torchops.gelu_and_mul(gate, up, "tanh")
    stream.synchronize()
    assert_close_to_reference(out.cpu(), reference(gate, up, "tanh"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = torchops.gelu_and_mul(gate, up)
    gate.copy_(random_tensor((256, 512), torch.bfloat16, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to_reference(captured.cpu(), reference(gate, up, "none"))
