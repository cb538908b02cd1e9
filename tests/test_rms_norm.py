"""rms_norm and add_rms_norm specifics the generic tables don't express: agreement with F.rms_norm (outputs
and grads, weight_offset as an offset weight, add_rms_norm as an add then F.rms_norm), torchops.nn.RMSNorm
as a drop-in for torch.nn.RMSNorm (scripted too, with a residual), f32 accuracy over long rows,
deterministic dweight as accurate as torch's, rows whose float32 sum of squares overflows (the exact
answer), the autograd contract (higher derivatives and forward AD; the backward op refuses its own by
name), the exported graph, and CUDA paths (row per warp / per block, vector and element-wise access, long
rows, misaligned rows, streams, graphs)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from expecttest import TestCase

import torchops
from helpers import (FLOAT_DTYPES, HALF_DTYPES, TOLERANCES, called_ops, DEVICES, HAS_CUDA, assert_close_to_reference,
                     poison_cuda_cache, random_tensor, requires_cuda)
from op_db import OPS_BY_NAME, rms_norm_reference

# (rtol, atol) against F.rms_norm / torch's autograd, which round differently in places (sum order).
VS_TORCH = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2), torch.float32: (1e-5, 1e-5),
            torch.float64: (1e-10, 1e-10)}


def _weights(n: int, dtype: torch.dtype, device: str):
    yield None
    yield random_tensor((n,), dtype, device)
    if dtype in HALF_DTYPES:
        yield random_tensor((n,), torch.float32, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matches_f_rms_norm(device: str, dtype: torch.dtype) -> None:
    rtol, atol = VS_TORCH[dtype]
    for shape in [(7, 1), (5, 3, 33), (64, 1024), (4, 4099), (2, 16384)]:
        n = shape[-1]
        x = random_tensor(shape, dtype, device)
        for w in _weights(n, dtype, device):
            for eps in (1e-6, 1e-2):
                got = torchops.rms_norm(x, w, eps)
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # mixed dtypes: F.rms_norm's unfused path
                    want = F.rms_norm(x, (n,), w, eps)
                assert got.dtype == dtype == want.dtype
                torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{shape} {eps}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_16bit_rounding_order(device: str, dtype: torch.dtype) -> None:
    # (x * rstd) * weight in f32, rounded once; not (x * rstd) rounded to 16 bits and then scaled.
    x = random_tensor((32, 256), dtype, device)
    w = random_tensor((256,), torch.float32, device)
    xf = x.double()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    once = (xf * rstd * w.double()).to(dtype)
    got = torchops.rms_norm(x, w)
    mismatches_once = (got != once).float().mean().item()
    twice = ((xf * rstd).to(dtype).double() * w.double()).to(dtype)
    mismatches_twice = (got != twice).float().mean().item()
    assert mismatches_once < 0.01 and mismatches_twice > 0.05, (mismatches_once, mismatches_twice)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,weight_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                (torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                                (torch.float64, torch.float64)])
def test_grads_match_torch_autograd(device: str, dtype: torch.dtype, weight_dtype: torch.dtype) -> None:
    rtol, atol = VS_TORCH[dtype]
    for shape in [(3, 1), (6, 40), (2, 3, 1000), (3, 5000)]:
        n = shape[-1]
        x = random_tensor(shape, dtype, device)
        w = random_tensor((n,), weight_dtype, device)
        dy = random_tensor(shape, dtype, device)
        xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
        ws = [w.clone().requires_grad_(), w.clone().requires_grad_()]
        torchops.rms_norm(xs[0], ws[0], 1e-5).backward(dy)
        # The float64 math as the reference (torch's own backward rounds 16-bit grads in its own order).
        xd, wd = xs[1].double().detach().requires_grad_(), ws[1].double().detach().requires_grad_()
        rms_norm_reference(xd, wd, 1e-5).backward(dy.double())
        assert xs[0].grad.dtype == dtype and ws[0].grad.dtype == weight_dtype
        assert_close_to_reference(xs[0].grad.cpu(), xd.grad.cpu())
        torch.testing.assert_close(ws[0].grad.double().cpu(), wd.grad.cpu(), rtol=max(rtol, 1e-5) * 4,
                                   atol=max(atol, 1e-5) * shape[0] * 4, msg=lambda m: f"{shape}: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_grad_of_input_only_and_weight_only(device: str) -> None:
    x, w = random_tensor((8, 24), torch.float32, device), random_tensor((24,), torch.float32, device)
    dy = random_tensor((8, 24), torch.float32, device)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.rms_norm(xr, (24,), wr, 1e-6).backward(dy)
    xi = x.clone().requires_grad_()
    torchops.rms_norm(xi, w).backward(dy)
    torch.testing.assert_close(xi.grad, xr.grad)
    wi = w.clone().requires_grad_()
    torchops.rms_norm(x, wi).backward(dy)
    torch.testing.assert_close(wi.grad, wr.grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1000, 64), (64, 3000), (257, 1031)])
def test_dweight_is_deterministic(device: str, dtype: torch.dtype, shape) -> None:
    x, dy = random_tensor(shape, dtype, device), random_tensor(shape, dtype, device)
    w = random_tensor((shape[-1],), dtype, device)
    rstd = torch.ops.myns._rms_norm_forward(x, w, 1e-6)[1]
    runs = [torch.ops.myns._rms_norm_backward(dy, x, w, rstd, True, True) for _ in range(3)]
    for dx, dw in runs[1:]:
        assert torch.equal(dx, runs[0][0]) and torch.equal(dw, runs[0][1])
    if device == "cpu":  # the row split is fixed, not the thread count's
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            single = torch.ops.myns._rms_norm_backward(dy, x, w, rstd, True, True)
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(single[1], runs[0][1])


@pytest.mark.parametrize("rows,n", [(400_000, 64), (100_000, 256), (20_000, 1024), (1000, 64)])
def test_float32_dweight_error_within_2x_of_torchs(rows: int, n: int) -> None:
    # Issue 40 item 7: the float32 weight gradient summed over many rows stays as accurate as torch's own
    # (F.rms_norm's autograd on the CPU), both measured against float64.
    gen = torch.Generator().manual_seed(rows + n)
    x, dy, w = torch.randn(rows, n, generator=gen), torch.randn(rows, n, generator=gen), torch.randn(n, generator=gen)

    def dweight(fn, x, w):
        w = w.detach().clone().requires_grad_()
        return torch.autograd.grad(fn(x, w), w, dy.to(x.dtype))[0].double()

    exact = dweight(lambda x, w: F.rms_norm(x, (n,), w, 1e-6), x.double(), w.double())
    ours = (dweight(lambda x, w: torchops.rms_norm(x, w, 1e-6), x, w) - exact).abs().max().item()
    torchs = (dweight(lambda x, w: F.rms_norm(x, (n,), w, 1e-6), x, w) - exact).abs().max().item()
    assert ours <= 2 * torchs, f"dweight off by {ours:.3g} against float64, torch's by {torchs:.3g}"


def _rows_whose_squares_overflow(dtype: torch.dtype) -> list[torch.Tensor]:
    """Issue 40 item 1's rows: every square fits float32, their sum does not. 16 elements with two large
    values at positions 0 and 1, then 0 and 8 (the same vector lane), and rows of equal large values below
    and above 16 elements."""
    big = 1.5e19  # squared 2.25e38: two of them pass float32's largest finite number
    rows = []
    for where in ((0, 1), (0, 8)):
        row = torch.linspace(-2, 2, 16, dtype=torch.float64)
        row[list(where)] = big
        rows.append(row)
    rows += [torch.full((n,), big, dtype=torch.float64) for n in (8, 15, 16, 17, 64)]
    return [row.to(dtype) for row in rows]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm"])
def test_rows_whose_sum_of_squares_overflows_get_the_exact_answer(device: str, dtype: torch.dtype, op: str) -> None:
    # Issue 40 item 1: the answer is float64 math's, wherever the large values sit and whatever the row
    # length; rstd too (saved for the backward), and the gradients computed from it.
    for row in _rows_whose_squares_overflow(dtype):
        n = row.numel()
        x = row.view(1, n).to(device)
        w = random_tensor((n,), dtype, device)
        xd, wd = x.double().cpu(), w.double().cpu()
        if op == "rms_norm":
            out, rstd = torch.ops.myns._rms_norm_forward(x, w, 1e-6)
        else:
            zeros = torch.zeros_like(x)
            out, residual_out, rstd = torch.ops.myns._add_rms_norm_forward(x, zeros, w, 1e-6)
            assert torch.equal(residual_out, x)
            assert torch.equal(_add_rms_norm(x, zeros, w, 1e-6)[0], out)
        assert_close_to_reference(out.cpu(), F.rms_norm(xd, (n,), wd, 1e-6), msg=lambda m: f"n={n}: {m}")
        want_rstd = torch.rsqrt(xd.pow(2).mean(-1) + 1e-6)
        torch.testing.assert_close(rstd.double().cpu(), want_rstd, rtol=1e-6, atol=0, msg=lambda m: f"n={n}: {m}")
        dy = random_tensor((1, n), dtype, device)
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = torchops.rms_norm(xr, wr, 1e-6) if op == "rms_norm" else _add_rms_norm(xr, torch.zeros_like(x), wr, 1e-6)[0]
        gx, gw = torch.autograd.grad(y, (xr, wr), dy)
        xe, we = xd.clone().requires_grad_(), wd.clone().requires_grad_()
        want_gx, want_gw = torch.autograd.grad(F.rms_norm(xe, (n,), we, 1e-6), (xe, we), dy.double().cpu())
        rtol = TOLERANCES[dtype][0]
        for got, want in ((gx, want_gx), (gw, want_gw)):  # relative to each gradient's scale (dx ~ 1e-19)
            torch.testing.assert_close(got.double().cpu(), want, rtol=rtol, atol=rtol * want.abs().max().item(),
                                       msg=lambda m: f"n={n}: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_higher_derivatives_and_forward_ad(device: str) -> None:
    x = random_tensor((4, 8), torch.float64, device).requires_grad_()
    w = random_tensor((8,), torch.float64, device).requires_grad_()
    # create_graph=False runs the _rms_norm_backward kernel; create_graph=True records the same gradient in ATen
    # ops, which differentiate again (any order).
    (gx,) = torch.autograd.grad(torchops.rms_norm(x, w).pow(2).sum(), x, create_graph=True)
    assert gx.requires_grad
    torch.testing.assert_close(gx, torch.autograd.grad(torchops.rms_norm(x, w).pow(2).sum(), x)[0])
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    (gr,) = torch.autograd.grad(F.rms_norm(xr, (8,), wr, eps=1e-6).pow(2).sum(), xr, create_graph=True)
    torch.testing.assert_close(torch.autograd.grad(gx.sum(), (x, w)), torch.autograd.grad(gr.sum(), (xr, wr)))
    # The backward op itself has no derivatives: refused by name.
    _, rstd = torch.ops.myns._rms_norm_forward(x.detach(), w.detach())
    dy = torch.randn_like(x).requires_grad_()
    gk, _ = torch.ops.myns._rms_norm_backward(dy, x.detach(), w.detach(), rstd, True, False)
    with pytest.raises(RuntimeError, match=r"myns::_rms_norm_backward: double backward .* is not supported"):
        gk.sum().backward()
    import torch.autograd.forward_ad as fwAD

    tx = torch.randn_like(x)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(torchops.rms_norm(fwAD.make_dual(x.detach(), tx), w.detach())).tangent
    _, want = torch.func.jvp(lambda a: F.rms_norm(a, (8,), w.detach(), eps=1e-6), (x.detach(),), (tx,))
    torch.testing.assert_close(tangent, want)


@pytest.mark.parametrize("device", DEVICES)
def test_no_grad_and_inference_mode_use_the_plain_kernel(device: str) -> None:
    x = random_tensor((5, 16), torch.float32, device).requires_grad_()
    w = random_tensor((16,), torch.float32, device).requires_grad_()
    with torch.no_grad():
        a = torchops.rms_norm(x, w)
    with torch.inference_mode():
        b = torchops.rms_norm(x, w)
    assert not a.requires_grad and not b.requires_grad
    torch.testing.assert_close(a, b)
    c = torchops.rms_norm(x, w)
    assert c.requires_grad and c.grad_fn.name() == "RmsNormBackward"
    torch.testing.assert_close(c.detach(), a)


# ------------------------------------------------------------------------------------- nn.RMSNorm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("affine", [True, False])
def test_nn_rmsnorm_is_a_drop_in(device: str, dtype: torch.dtype, affine: bool) -> None:
    theirs = torch.nn.RMSNorm(48, eps=1e-6, elementwise_affine=affine, device=device, dtype=dtype)
    ours = torchops.nn.RMSNorm(48, eps=1e-6, elementwise_affine=affine, device=device, dtype=dtype)
    assert repr(ours).removeprefix("RMSNorm") == repr(theirs).removeprefix("RMSNorm")
    assert list(ours.state_dict()) == list(theirs.state_dict())
    if affine:
        assert torch.equal(ours.weight, torch.ones(48, device=device, dtype=dtype))
        with torch.no_grad():
            theirs.weight.copy_(random_tensor((48,), dtype, device))
        ours.load_state_dict(theirs.state_dict())  # and back: the keys and shapes agree both ways
        theirs.load_state_dict(ours.state_dict())
    x = random_tensor((3, 7, 48), dtype, device)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa), theirs(xb)
    rtol, atol = VS_TORCH[dtype]
    torch.testing.assert_close(ya, yb, rtol=rtol, atol=atol)
    dy = random_tensor(x.shape, dtype, device)
    ya.backward(dy)
    yb.backward(dy)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=rtol * 2, atol=atol * 2)
    if affine:
        torch.testing.assert_close(ours.weight.grad.float(), theirs.weight.grad.float(), rtol=rtol * 4, atol=atol * 40)


def test_nn_rmsnorm_arguments() -> None:
    assert torchops.nn.RMSNorm([16]).normalized_shape == (16,)
    assert torchops.nn.RMSNorm(torch.Size([16])).normalized_shape == (16,)
    m = torchops.nn.RMSNorm(16, eps=None)
    x = random_tensor((2, 16), torch.float32, "cpu")
    torch.testing.assert_close(m(x), torch.nn.RMSNorm(16)(x))  # eps None: the dtype's machine epsilon
    m.weight.data.mul_(3)
    m.reset_parameters()
    assert torch.equal(m.weight, torch.ones(16))
    assert torchops.nn.RMSNorm((4, 16)).weight.shape == (4, 16)  # several trailing dims, as torch's
    with pytest.raises(ValueError, match="at least 1"):
        torchops.nn.RMSNorm(0)
    with pytest.raises(RuntimeError, match=r"Given normalized_shape=\[16\], expected input with shape \[\*, 16\], "
                                           r"but got input of size\[2, 15\]"):
        m(random_tensor((2, 15), torch.float32, "cpu"))
    bf16_input_f32_weight = torchops.nn.RMSNorm(16)(random_tensor((2, 16), torch.bfloat16, "cpu"))
    assert bf16_input_f32_weight.dtype == torch.bfloat16


@pytest.mark.parametrize("device", DEVICES)
def test_nn_rmsnorm_compiled_training_matches_eager(device: str) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torchops.nn.RMSNorm(64), torch.nn.Linear(64, 8)).to(device)
    twin = torch.nn.Sequential(torch.nn.Linear(32, 64), torchops.nn.RMSNorm(64), torch.nn.Linear(64, 8)).to(device)
    twin.load_state_dict(model.state_dict())
    compiled = torch.compile(twin, fullgraph=True, dynamic=True)
    for batch in (8, 13):
        x = random_tensor((batch, 32), torch.float32, device)
        model(x).square().mean().backward()
        compiled(x).square().mean().backward()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_weight_offset_is_an_offset_weight_in_f32(device: str, dtype: torch.dtype) -> None:
    # out = x * rstd * (w + offset), the sum formed in f32 (f64 for f64): equal to F.rms_norm with the
    # offset weight computed in float64, within the output dtype's rounding.
    for n in (7, 1024, 4099):
        x = random_tensor((5, n), dtype, device)
        w = random_tensor((n,), dtype, device) / 8  # Gemma's weights sit near 0: 1 + w is what scales
        for offset in (1.0, -0.25):
            got = torchops.rms_norm(x, w, 1e-6, weight_offset=offset) if _has_wrapper("rms_norm") else \
                torch.ops.myns.rms_norm(x, w, 1e-6, offset)
            want = F.rms_norm(x.double(), (n,), w.double() + offset, 1e-6)
            assert_close_to_reference(got.cpu(), want.cpu())
    with pytest.raises(RuntimeError, match=r"myns::rms_norm: weight_offset is non-zero but weight is None"):
        torch.ops.myns.rms_norm(x, None, 1e-6, 1.0)


def _has_wrapper(name: str) -> bool:
    import inspect

    fn = getattr(torchops, name, None)
    return fn is not None and "weight_offset" in inspect.signature(fn).parameters


def _add_rms_norm(x, r, w=None, eps=1e-6, offset=0.0):
    if _has_wrapper("add_rms_norm"):
        return torchops.add_rms_norm(x, r, w, eps, weight_offset=offset)
    return torch.ops.myns.add_rms_norm(x, r, w, eps, offset)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_add_rms_norm_is_add_then_rms_norm(device: str, dtype: torch.dtype) -> None:
    rtol, atol = VS_TORCH[dtype]
    for shape in [(7, 1), (5, 3, 33), (64, 1024), (4, 4099), (2, 16384)]:
        n = shape[-1]
        x, r = random_tensor(shape, dtype, device), random_tensor(shape, dtype, device)
        for w in _weights(n, dtype, device):
            out, residual_out = _add_rms_norm(x, r, w, 1e-5)
            assert torch.equal(residual_out, x + r)  # rounded to the input's dtype, as torch's add rounds
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                want = F.rms_norm(x + r, (n,), w, 1e-5)
            torch.testing.assert_close(out, want, rtol=rtol, atol=atol, msg=lambda m: f"{shape}: {m}")
            # normalised from the rounded sum: our own rms_norm of residual_out, up to the row sum's order (on
            # CUDA the two ops may split a row over threads differently)
            torch.testing.assert_close(out, torchops.rms_norm(residual_out, w, 1e-5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_add_rms_norm_grads_match_torch_autograd(device: str, dtype: torch.dtype) -> None:
    rtol, atol = VS_TORCH[dtype]
    n = 96
    x0, r0 = random_tensor((4, 5, n), dtype, device), random_tensor((4, 5, n), dtype, device)
    w0 = random_tensor((n,), dtype, device)
    g_out, g_res = random_tensor(x0.shape, dtype, device), random_tensor(x0.shape, dtype, device)
    for use_residual_out in (True, False):
        x, r, w = (t.clone().requires_grad_() for t in (x0, r0, w0))
        xt, rt, wt = (t.clone().requires_grad_() for t in (x0, r0, w0))
        out, res = _add_rms_norm(x, r, w, 1e-6, 0.5)
        h = xt + rt
        want = F.rms_norm(h, (n,), wt + 0.5, 1e-6)
        if use_residual_out:
            torch.autograd.backward([out, res], [g_out, g_res])
            torch.autograd.backward([want, h], [g_out, g_res])
        else:
            out.backward(g_out)
            want.backward(g_out)
        for ours, theirs in ((x.grad, xt.grad), (r.grad, rt.grad), (w.grad, wt.grad)):
            torch.testing.assert_close(ours.float(), theirs.float(), rtol=rtol * 4, atol=atol * 40)
        assert torch.equal(x.grad, r.grad)  # one gradient reaches both summands
        assert x.grad.data_ptr() != r.grad.data_ptr()  # but as separate tensors: .grad may be modified in place
    # only the residual needs a gradient; only residual_out is used
    r = r0.clone().requires_grad_()
    out, res = _add_rms_norm(x0, r, w0)
    (g, ) = torch.autograd.grad(res, r, g_res)
    assert torch.equal(g, g_res)


def test_nn_rmsnorm_scripted_with_residual_and_offset() -> None:
    torch.manual_seed(0)
    for m in (torchops.nn.RMSNorm(8), torchops.nn.RMSNorm(8, eps=1e-5, weight_offset=1.0),
              torchops.nn.RMSNorm(8, elementwise_affine=False)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated, still supported
            scripted = torch.jit.script(m)
        x, r = random_tensor((3, 8), torch.float32, "cpu"), random_tensor((3, 8), torch.float32, "cpu")
        assert torch.equal(scripted(x), m(x))
        out, res = m(x, r)
        s_out, s_res = scripted(x, r)
        assert torch.equal(s_out, out) and torch.equal(s_res, res) and torch.equal(res, x + r)
        assert torch.equal(out, m(res))
    gemma = torchops.nn.RMSNorm(8, weight_offset=1.0)
    assert torch.equal(gemma.weight, torch.zeros(8))  # scale 1 + 0 at first
    assert list(gemma.state_dict()) == ["weight"]
    x = random_tensor((3, 8), torch.float32, "cpu")
    torch.testing.assert_close(gemma(x), torch.nn.RMSNorm(8)(x))
    # eps None: as torch, the epsilon of the computation dtype (float32 for 16-bit inputs), at each call.
    # Tiny inputs, where an eps of the wrong size changes the output.
    for dtype in FLOAT_DTYPES:
        m = torchops.nn.RMSNorm(8, dtype=dtype)
        xd = random_tensor((3, 8), dtype, "cpu") * 1e-3
        torch.testing.assert_close(m(xd), torch.nn.RMSNorm(8, dtype=dtype)(xd), rtol=VS_TORCH[dtype][0], atol=0)
    with pytest.raises(ValueError, match="weight_offset needs elementwise_affine=True"):
        torchops.nn.RMSNorm(8, elementwise_affine=False, weight_offset=1.0)


def _worst_relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    keep = want.abs() >= 1e-2  # relative error of the values that carry it (not of near-zero ones)
    return ((got.double() - want).abs()[keep] / want.abs()[keep]).max().item()


def _check_long_row_accuracy(device: str) -> None:
    # Over the row's length a running f32 sum of squares loses bits (at N = 2^22 ours once had a worst
    # relative error of 1.0e-5 against torch's 1.1e-7). Now within 4x of torch's error up to N = 2^24.
    gen = torch.Generator(device="cpu").manual_seed(0)
    for k in (12, 18, 22, 24):
        n = 2**k
        x = (torch.randn((1, n), generator=gen) * 3 + 1).to(device)  # all-positive bias: errors would add up
        want = F.rms_norm(x.double(), (n,), None, 1e-6)
        theirs = _worst_relative_error(F.rms_norm(x, (n,), None, 1e-6), want)
        ours = _worst_relative_error(torchops.rms_norm(x, None, 1e-6), want)
        assert ours <= 4 * max(theirs, 2.0**-24), f"N = 2^{k}: worst relative error {ours:.3g}, torch {theirs:.3g}"
        r = torch.randn((1, n), generator=gen).to(device)
        out, res = _add_rms_norm(x, r, None, 1e-6)
        want = F.rms_norm(res.double(), (n,), None, 1e-6)
        assert _worst_relative_error(out, want) <= 4 * max(theirs, 2.0**-24), f"add_rms_norm, N = 2^{k}"


def test_f32_accuracy_does_not_degrade_over_long_rows() -> None:
    _check_long_row_accuracy("cpu")


@requires_cuda
def test_cuda_f32_accuracy_does_not_degrade_over_long_rows() -> None:
    _check_long_row_accuracy("cuda")



class ExportedGraph(TestCase):
    def test_exported_graph_holds_the_myns_op(self) -> None:
        ep = torch.export.export(torchops.nn.RMSNorm(8), (torch.randn(4, 8),))
        self.assertExpectedInline(called_ops(ep.graph_module), """myns.rms_norm.default""")
        self.assertExpectedInline(called_ops(ep.run_decompositions().graph_module), """myns.rms_norm.default""")


# ------------------------------------------------------------------------------------------- CUDA

def _dweight_rtol(dtype: torch.dtype) -> float:
    """dweight's tolerance against float64 (with atol = rtol x rows): a sum over rows in f32 partials."""
    return {torch.float64: 1e-9, torch.float32: 1e-4}.get(dtype, 2e-2)


# Around every warp/block switch and vector width: 16-bit (8 per vector, warp up to 2048), f32 (4, 1024), f64
# (2, 512); beyond a block's register cache and beyond shared memory for the backward's dweight accumulator (f32
# N = 70000 -> the column kernel); f32 N = 12288: the dweight row is exactly 48 KiB, past the default limit with
# the block's static shared memory (the launch must opt in). Block rows keep up to 512 threads x 8 vectors in
# registers (16-bit N <= 32768, f32 16384, f64 8192), longer ones 1024 x 4 and read the rest twice; the backward
# keeps 512 x 4, and its rows of whole 16-byte vectors from 256 to 2048 vectors (16-bit 2048-16384, f32
# 1024-8192; from 64 with add_rms_norm's grad_residual_out: 16-bit 512, f32 256; 2040 and 1016 just below) take
# the staged blocks, longer ones a cluster of up to 8 staged blocks of 8192 elements each on sm_90+ (16-bit
# 16392-65536, f32 8196-65536; 131072: past it). Plain forward rows of exactly 128 or 256 vectors (16-bit N =
# 1024 / 2048, f32 512 / 1024, f64 256 / 512) go a warp a row, four rows a block (37 rows: the last block
# partial); other rows of whole 16-byte vectors from 128 vectors up (1016: 127 vectors; 1032, 2056) take the
# stream blocks, sized 4 vectors a thread up to 2048 vectors (4104: 513 vectors, a partial batch), 512 threads
# up to 4096 vectors (16392) unless the rows in flight overflow L1 (16-bit with a weight at 32768: 1024), 1024
# past them (32776); add_rms_norm's from its 2048 vectors (16-bit 16384, f32 8192, f64 4096), residual_out kept
# in shared memory up to 14336 vectors, longer rows split over a cluster of 2-8 blocks where each block's part
# is exactly 4 or 8 vectors a thread (16-bit 131072, f32 65536 and 131072, f64 32768-131072), else read back
# from L2 (16-bit 131080). Rows of exactly 8 vectors a thread (f32 16384 and 32768, 16-bit 32768 and 65536;
# add_rms_norm's also 4: f32 16384, 16-bit 32768) take the straight-line stream kernel, and so do plain rows of
# exactly 4 in blocks of 128-256 threads (16-bit 4096 / 8192, f32 2048 / 4096, f64 1024 / 2048) and
# add_rms_norm's rows that read input and residual twice: 128-512 vectors in whole warps, one a thread (16-bit
# 1024-4096, f32 512-2048, f64 256-1024), and exactly 1024 or 2048 (16-bit 8192 / 16384, f32 4096 / 8192, f64
# 2048 / 4096). Shorter warp rows of whole vectors go two to a warp up to 4 vectors a lane (16-bit N <= 1016,
# f32 508, f64 254; add_rms_norm up to 1: 256, 128, 64), 37 rows leaving the last warp one.
_CUDA_NS = [1, 2, 3, 8, 31, 32, 33, 255, 256, 257, 512, 513, 1016, 1024, 1025, 1032, 2040, 2048, 2056, 4096, 4104,
            8192, 8192 + 3, 8196, 12288, 16384, 16388, 16392, 32768, 32776, 40000, 65536, 131072, 131080]
# _CUDA_NS in runs of four, one test each: parallel workers share them out (under compute-sanitizer one
# dtype's whole list took more than five minutes).
_CUDA_N_RUNS = [_CUDA_NS[i:i + 4] for i in range(0, len(_CUDA_NS), 4)]


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("weight_kind", ["same", "f32", None])
@pytest.mark.parametrize("ns", _CUDA_N_RUNS, ids=lambda ns: f"n{ns[0]}-{ns[-1]}")
def test_cuda_every_path_forward_and_backward(ns: list[int], weight_kind, dtype: torch.dtype) -> None:
    if weight_kind == "f32" and dtype not in HALF_DTYPES:
        pytest.skip("float32 weight is for 16-bit inputs")
    for n in ns:
        rows = 3 if n > 4096 else 37
        for layout in ("dense", "aligned_stride", "offset", "row_stride"):
            if layout == "dense":
                x = random_tensor((rows, n), dtype, "cuda")
            elif layout == "aligned_stride":  # rows of a wider tensor: 16-byte aligned where n is whole vectors
                x = random_tensor((rows, n + 16 // dtype.itemsize), dtype, "cuda")[:, :n]
            elif layout == "offset":  # every row misaligned for 16-byte vectors
                x = random_tensor((rows * n + 1,), dtype, "cuda")[1:].view(rows, n)
            else:  # rows of a wider tensor, row stride not a multiple of the vector width
                x = random_tensor((rows, n + 3), dtype, "cuda")[:, :n]
            wdtype = torch.float32 if weight_kind == "f32" else dtype
            w = None if weight_kind is None else random_tensor((n,), wdtype, "cuda")
            dy = random_tensor((rows, n), dtype, "cuda")
            _check_cuda_add_rms_norm(x, w, dy, f"n={n} {layout}")
            poison_cuda_cache()
            out, rstd = torch.ops.myns._rms_norm_forward(x, w, 1e-6)
            xd, wd = x.double().cpu(), None if w is None else w.double().cpu()
            assert_close_to_reference(out.cpu(), rms_norm_reference(xd, wd, 1e-6))
            torch.testing.assert_close(torchops.rms_norm(x, w), out, rtol=0, atol=0)  # same kernel without rstd
            want_rstd = torch.rsqrt(xd.pow(2).mean(-1) + 1e-6)
            torch.testing.assert_close(rstd.cpu().double(), want_rstd, rtol=1e-5 if dtype != torch.float64 else 1e-10, atol=0)
            poison_cuda_cache()
            dx, dw = torch.ops.myns._rms_norm_backward(dy, x, w, rstd, True, w is not None)
            ref_dx, ref_dw = OPS_BY_NAME["_rms_norm_backward"].reference(
                dy.double().cpu(), xd, wd, rstd.double().cpu(), True, w is not None)
            _assert_dx_close(dx, ref_dx, dy, x, w, rstd, 0.0, f"dx n={n} {layout}")
            if w is not None:
                rtol = _dweight_rtol(dw.dtype)
                torch.testing.assert_close(dw.cpu().double(), ref_dw, rtol=rtol, atol=rtol * rows,
                                           msg=lambda m: f"dw n={n} {layout}: {m}")


def _assert_dx_close(dx: torch.Tensor, ref_dx: torch.Tensor, dy: torch.Tensor, h: torch.Tensor,
                     w: torch.Tensor | None, rstd: torch.Tensor, offset: float, where: str) -> None:
    """dx against its float64 reference, allowing the output dtype's rounding of dx's two terms, rstd * g and
    h * rstd^3 / N * sum(g * h): they cancel where rstd is large (N = 1 and a small h: each term near
    rstd * |g|, their difference near eps * rstd * |g|), so the terms' rounding bounds the error there, not the
    result's. Where the terms are of the result's size this adds less than the dtype's atol."""
    rtol, atol = TOLERANCES[dx.dtype]
    h64, dy64, r64 = h.double().cpu(), dy.double().cpu(), rstd.double().cpu().unsqueeze(-1)
    g = dy64 if w is None else dy64 * (w.double().cpu() + offset)
    c3h = r64.pow(3) / h.shape[-1] * (g * h64).sum(-1, keepdim=True) * h64
    bound = atol + rtol * ref_dx.abs() + 4 * torch.finfo(dx.dtype).eps * ((r64 * g).abs() + c3h.abs())
    excess = (dx.double().cpu() - ref_dx).abs() - bound
    assert bool((excess <= 0).all()), f"{where}: dx off by {excess.max().item():.3g} past the bound"


def _check_cuda_add_rms_norm(x: torch.Tensor, w: torch.Tensor | None, dy: torch.Tensor, where: str) -> None:
    """add_rms_norm's forward and backward on x's layout (the residual dense), against float64 on the CPU."""
    r = random_tensor(tuple(x.shape), x.dtype, "cuda")
    offset = 0.0 if w is None else 1.0
    poison_cuda_cache()
    out, res, rstd = torch.ops.myns._add_rms_norm_forward(x, r, w, 1e-6, offset)
    assert torch.equal(res, x + r), where
    resd, wd = res.double().cpu(), None if w is None else w.double().cpu()
    assert_close_to_reference(out.cpu(), rms_norm_reference(resd, wd, 1e-6, offset), msg=lambda m: f"{where}: {m}")
    assert torch.equal(torch.ops.myns.add_rms_norm(x, r, w, 1e-6, offset)[0], out)
    poison_cuda_cache()
    dres = random_tensor(tuple(x.shape), x.dtype, "cuda")
    dx, dw = torch.ops.myns._add_rms_norm_backward(dy, dres, res, w, rstd, w is not None, offset)
    ref_dx, ref_dw = OPS_BY_NAME["_add_rms_norm_backward"].reference(
        dy.double().cpu(), dres.double().cpu(), resd, wd, rstd.double().cpu(), w is not None, offset)
    _assert_dx_close(dx, ref_dx, dy, res, w, rstd, offset, f"add dx {where}")
    if w is not None:
        rtol = _dweight_rtol(dw.dtype)
        torch.testing.assert_close(dw.cpu().double(), ref_dw, rtol=rtol, atol=rtol * x.shape[0],
                                   msg=lambda m: f"add dw {where}: {m}")


@requires_cuda
def test_cuda_dweight_column_fallback_and_weight_only() -> None:
    # f32 N = 70000: the block's shared-memory dweight row (280 KB) doesn't fit, the column kernel runs.
    for n, rows in ((70000, 5), (1000, 3000)):
        x, dy = random_tensor((rows, n), torch.float32, "cuda"), random_tensor((rows, n), torch.float32, "cuda")
        w = random_tensor((n,), torch.float32, "cuda")
        rstd = torch.ops.myns._rms_norm_forward(x, w, 1e-6)[1]
        both = torch.ops.myns._rms_norm_backward(dy, x, w, rstd, True, True)
        only_w = torch.ops.myns._rms_norm_backward(dy, x, w, rstd, False, True)
        only_x = torch.ops.myns._rms_norm_backward(dy, x, w, rstd, True, False)
        assert only_w[0].shape == (0,) and only_x[1].shape == (0,)
        assert torch.equal(only_w[1], both[1]) and torch.equal(only_x[0], both[0])
        ref = (dy.double() * x.double() * rstd.double().unsqueeze(-1)).sum(0)
        torch.testing.assert_close(both[1].double(), ref, rtol=1e-4, atol=1e-3)
        again = torch.ops.myns._rms_norm_backward(dy, x, w, rstd, True, True)
        assert torch.equal(again[1], both[1])


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n_vectors, rows", [(64, 5001), (256, 4001), (257, 4001), (1000, 1500), (2048, 700),
                                             (2049, 600), (6001, 200), (16384, 40)])
def test_cuda_staged_backward_many_rows_per_block(n_vectors: int, rows: int, dtype: torch.dtype) -> None:
    # The staged backward (rows of 256 to 2048 16-byte vectors on one block, from 64 with add_rms_norm's
    # grad_residual_out, two a thread up to 256; longer ones split over a cluster of up to 8 blocks) runs each
    # block or cluster over a chunk of rows with the next rows' copies in flight in a ring of shared-memory
    # buffers, and sums dweight in registers (16-bit inputs on one block: in the first sweep, with dx's bits
    # the same whether dweight is wanted or not): rows enough for many rows per block
    # (the ring wrapping around, a short last chunk), rows split over clusters of 2 to 8 blocks (some with
    # a shorter last part) and rows too long for a cluster (the kept kernel), with and without the weight,
    # plain and with add_rms_norm's grad_residual_out, only dx, and dweight the same bits every run.
    per_vector = 16 // torch.empty((), dtype=dtype).element_size()
    n = n_vectors * per_vector
    x, dy = random_tensor((rows, n), dtype, "cuda"), random_tensor((rows, n), dtype, "cuda")
    for w in (random_tensor((n,), dtype, "cuda"), None):
        rstd = torch.ops.myns._rms_norm_forward(x, w, 1e-6)[1]
        xd, wd, rd = x.double().cpu(), None if w is None else w.double().cpu(), rstd.double().cpu()
        poison_cuda_cache()
        dx, dw = torch.ops.myns._rms_norm_backward(dy, x, w, rstd, True, w is not None)
        ref_dx, ref_dw = OPS_BY_NAME["_rms_norm_backward"].reference(dy.double().cpu(), xd, wd, rd, True,
                                                                     w is not None)
        assert_close_to_reference(dx.cpu(), ref_dx, msg=lambda m: f"dx n={n}: {m}")
        only_dx = torch.ops.myns._rms_norm_backward(dy, x, w, rstd, True, False)[0]
        assert torch.equal(only_dx, dx), f"n={n}"
        if w is not None:
            rtol = _dweight_rtol(dw.dtype)
            torch.testing.assert_close(dw.cpu().double(), ref_dw, rtol=rtol, atol=rtol * rows,
                                       msg=lambda m: f"dw n={n}: {m}")
            again = torch.ops.myns._rms_norm_backward(dy, x, w, rstd, True, True)
            assert torch.equal(again[1], dw) and torch.equal(again[0], dx), f"n={n}"
        dres = random_tensor((rows, n), dtype, "cuda")
        poison_cuda_cache()
        adx, adw = torch.ops.myns._add_rms_norm_backward(dy, dres, x, w, rstd, w is not None, 0.0)
        ref_adx, _ = OPS_BY_NAME["_add_rms_norm_backward"].reference(
            dy.double().cpu(), dres.double().cpu(), xd, wd, rd, w is not None, 0.0)
        assert_close_to_reference(adx.cpu(), ref_adx, msg=lambda m: f"add dx n={n}: {m}")
        if w is not None:  # (its own bits: add_rms_norm's three staged tensors may take another grid)
            torch.testing.assert_close(adw.cpu().double(), ref_dw, rtol=rtol, atol=rtol * rows,
                                       msg=lambda m: f"add dw n={n}: {m}")


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_long_rows_forward_many_rows(dtype: torch.dtype) -> None:
    # The forward's long rows (stream blocks, a row per block at a time; add_rms_norm's keep residual_out's
    # row in shared memory, each thread its own chunks, split over a cluster's blocks where one block's does
    # not hold it (16384 vectors: f32 65536, 16-bit 131072), and read it back from L2 where no split fits):
    # more rows than blocks, rows whose chunks do not divide evenly over the threads or are exactly 2, 4 or 8
    # a thread (the straight-line kernel: plain rows of 512, 1024, 4096 and 8192 vectors; add_rms_norm's of
    # 128-512 vectors in whole warps, one a thread, and 1024 and 2048, 2 and 4 a thread, read twice); plain
    # rows of 128 and 256 vectors a warp a row, 5000 and 3000 rows over blocks of 4; rows of 512 vectors (and
    # add_rms_norm's of 256) on at most 32 rows an SM kept in registers by 128-thread blocks (3000 and 2000
    # rows), on more rows (6000: more than 32 an SM up to 187 SMs) the kernels above; plain rms_norm and
    # add_rms_norm, with and without the weight and its offset, rstd included.
    per_vector = 16 // torch.empty((), dtype=dtype).element_size()
    for n_vectors, rows in ((128, 5000), (256, 3000), (256, 6000), (384, 2000), (512, 2000), (512, 6000), (1024, 1000),
                            (2048, 600), (2049, 600), (4096, 300), (4100, 300), (6001, 200), (8192, 100), (16384, 40)):
        n = n_vectors * per_vector
        x, r = random_tensor((rows, n), dtype, "cuda"), random_tensor((rows, n), dtype, "cuda")
        for w in (random_tensor((n,), dtype, "cuda"), None):
            offset = 0.0 if w is None else 0.5
            wd = None if w is None else w.double().cpu()
            poison_cuda_cache()
            out, res, rstd = torch.ops.myns._add_rms_norm_forward(x, r, w, 1e-6, offset)
            assert torch.equal(res, x + r), f"n={n}"
            resd = res.double().cpu()
            assert_close_to_reference(out.cpu(), rms_norm_reference(resd, wd, 1e-6, offset),
                                      msg=lambda m: f"add n={n}: {m}")
            torch.testing.assert_close(rstd.cpu().double(), torch.rsqrt(resd.pow(2).mean(-1) + 1e-6), rtol=1e-5,
                                       atol=0, msg=lambda m: f"add rstd n={n}: {m}")
            poison_cuda_cache()
            out, rstd = torch.ops.myns._rms_norm_forward(x, w, 1e-6, offset)
            xd = x.double().cpu()
            assert_close_to_reference(out.cpu(), rms_norm_reference(xd, wd, 1e-6, offset), msg=lambda m: f"n={n}: {m}")
            torch.testing.assert_close(rstd.cpu().double(), torch.rsqrt(xd.pow(2).mean(-1) + 1e-6), rtol=1e-5,
                                       atol=0, msg=lambda m: f"rstd n={n}: {m}")


@requires_cuda
def test_cuda_many_rows_and_empty() -> None:
    x = random_tensor((70000, 8), torch.bfloat16, "cuda")  # more row-warps than one pass of the grid
    w = random_tensor((8,), torch.bfloat16, "cuda")
    assert_close_to_reference(torchops.rms_norm(x, w).cpu(), rms_norm_reference(x.double().cpu(), w.double().cpu()))
    e = torch.empty(0, 3, 64, device="cuda", requires_grad=True)
    we = torch.ones(64, device="cuda", requires_grad=True)
    y = torchops.rms_norm(e, we)
    y.sum().backward()
    assert y.shape == e.shape and e.grad.shape == e.shape and torch.equal(we.grad, torch.zeros(64, device="cuda"))


@requires_cuda
def test_cuda_runs_on_the_current_stream_and_in_graphs() -> None:
    side = torch.cuda.Stream()
    x = torch.zeros(4096, 1024, device="cuda")
    src = random_tensor((4096, 1024), torch.float32, "cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        x.copy_(src)
        out = torchops.rms_norm(x)
    side.synchronize()
    torch.testing.assert_close(out, F.rms_norm(src, (1024,)))

    a = random_tensor((64, 2048), torch.bfloat16, "cuda")
    w = random_tensor((2048,), torch.float32, "cuda")
    torchops.rms_norm(a, w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g = torchops.rms_norm(a, w)
    for _ in range(2):
        a.copy_(random_tensor((64, 2048), torch.bfloat16, "cuda"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(g, F.rms_norm(a, (2048,), w), rtol=1.6e-2, atol=1.6e-2)


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_cuda_second_gpu() -> None:
    torch.cuda.set_device(0)
    x = random_tensor((33, 4100), torch.float32, "cuda:1").requires_grad_()
    w = random_tensor((4100,), torch.float32, "cuda:1").requires_grad_()
    y = torchops.rms_norm(x, w)
    assert y.device == torch.device("cuda:1")
    y.sum().backward()
    torch.testing.assert_close(y.detach(), F.rms_norm(x.detach(), (4100,), w.detach()), rtol=1e-5, atol=1e-5)
