"""The CUDA norm engine's plans (csrc/norm/norm_plan.h) branch by branch, for layer_norm and the engine-wide
facts: every forward form (register rows of each group size, stream rows of each kind, clusters) and backward
form (kept rows in a warp or a block, accumulators in shared or global memory; staged rows on a block or a
cluster) against float64, with and without weight and bias, 16-byte vectors and element accesses; rms_norm
rows whose sum of squares overflows give the exact answer whatever their layout; float32 dweight as accurate as
torch's. rms_norm's and add_rms_norm's own paths are in test_rms_norm.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import FLOAT_DTYPES, HALF_DTYPES, TOLERANCES, poison_cuda_cache, random_tensor, requires_cuda

_VECTOR = {torch.float64: 2, torch.float32: 4, torch.float16: 8, torch.bfloat16: 8}

# In 16-byte vectors: sub-warp groups (1-31), warp rows (128, 256), 128-thread rows (512), the generic
# register rows up to 1024 vectors (640, 1000), stream rows from there: 4 a thread (1032), the loop (1100, 3000),
# 512 threads (3072), 1024 threads (5000), 8 a thread (8192); f32 65536 elements: staged cluster backward.
_N_VECTORS = [1, 3, 16, 31, 128, 256, 512, 640, 1000, 1032, 1100, 3000, 3072, 5000, 8192]


def _layer_reference(x: torch.Tensor, w, b, eps: float):
    xd = x.double().cpu()
    mean = xd.mean(-1)
    rstd = torch.rsqrt(xd.var(-1, unbiased=False) + eps)
    y = (xd - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    if w is not None:
        y = y * w.double().cpu()
    if b is not None:
        y = y + b.double().cpu()
    return y, mean, rstd


def _layer_grads(dy, x, w, mean, rstd):
    dyd, xd = dy.double().cpu(), x.double().cpu()
    xhat = (xd - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    g = dyd if w is None else dyd * w.double().cpu()
    n = x.shape[-1]
    dx = rstd.unsqueeze(-1) * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    dw = (dyd * xhat).reshape(-1, n).sum(0)
    db = dyd.reshape(-1, n).sum(0)
    return dx, dw, db


def _close(got: torch.Tensor, want: torch.Tensor, where: str, scale: float = 1.0) -> None:
    rtol, atol = TOLERANCES[got.dtype]
    torch.testing.assert_close(got.double().cpu(), want, rtol=rtol, atol=atol * scale,
                               msg=lambda m: f"{where}: {m}")


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("params", ["weight+bias", "weight", "bias", "none", "f32"])
def test_cuda_layer_norm_every_plan_branch(dtype: torch.dtype, params: str) -> None:
    if params == "f32" and dtype not in HALF_DTYPES:
        pytest.skip("float32 parameters are for 16-bit inputs")
    for nv in _N_VECTORS:
        for aligned in (True, False):
            n = nv * _VECTOR[dtype] + (0 if aligned else 1)
            rows = 3 if n > 8192 else 37
            x = random_tensor((rows, n), dtype, "cuda") * 3 + 2  # an offset mean: the shifted sums matter
            pdtype = torch.float32 if params == "f32" else dtype
            w = random_tensor((n,), pdtype, "cuda") if params in ("weight+bias", "weight", "f32") else None
            b = random_tensor((n,), pdtype, "cuda") if params in ("weight+bias", "bias", "f32") else None
            where = f"n={n} {params}"
            poison_cuda_cache()
            out, mean, rstd = torch.ops.myns._layer_norm_forward(x, w, b, 1e-5)
            ref, ref_mean, ref_rstd = _layer_reference(x, w, b, 1e-5)
            _close(out, ref, where, scale=4)
            torch.testing.assert_close(mean.double().cpu(), ref_mean, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(rstd.double().cpu(), ref_rstd, rtol=1e-4, atol=0)
            assert torch.equal(torch.ops.myns.layer_norm(x, w, b, 1e-5), out), where
            dy = random_tensor((rows, n), dtype, "cuda")
            poison_cuda_cache()
            dx, dw, db = torch.ops.myns._layer_norm_backward(dy, x, w, mean, rstd, True, w is not None, True)
            ref_dx, ref_dw, ref_db = _layer_grads(dy, x, w, mean.double().cpu(), rstd.double().cpu())
            _close(dx, ref_dx, f"dx {where}", scale=8)
            if w is not None:
                _close(dw, ref_dw, f"dw {where}", scale=rows)
            _close(db, ref_db, f"db {where}", scale=rows)
            only = torch.ops.myns._layer_norm_backward(dy, x, w, mean, rstd, False, w is not None, True)
            assert only[0].shape == (0,), where
            _close(only[2], ref_db, f"db alone {where}", scale=rows)  # another plan without dx: its own order


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_layer_norm_long_rows_and_many_rows(dtype: torch.dtype) -> None:
    # staged backward over many rows a block (the ring wrapping), a cluster of blocks a row (16-bit 16392-65536,
    # f32 8196-65536), rows past a cluster (kept block rows, accumulators in global memory past shared memory)
    for n, rows in ((4096, 3000), (16384, 200), (65536, 20), (131072, 4), (70000, 4)):
        x = random_tensor((rows, n), dtype, "cuda")
        w, b = random_tensor((n,), dtype, "cuda"), random_tensor((n,), dtype, "cuda")
        out, mean, rstd = torch.ops.myns._layer_norm_forward(x, w, b, 1e-5)
        _close(out, _layer_reference(x, w, b, 1e-5)[0], f"n={n}", scale=4)
        dy = random_tensor((rows, n), dtype, "cuda")
        dx, dw, db = torch.ops.myns._layer_norm_backward(dy, x, w, mean, rstd, True, True, True)
        ref_dx, ref_dw, ref_db = _layer_grads(dy, x, w, mean.double().cpu(), rstd.double().cpu())
        _close(dx, ref_dx, f"dx n={n}", scale=8)
        _close(dw, ref_dw, f"dw n={n}", scale=rows)
        _close(db, ref_db, f"db n={n}", scale=rows)
        again = torch.ops.myns._layer_norm_backward(dy, x, w, mean, rstd, True, True, True)
        assert all(torch.equal(p, q) for p, q in zip(again, (dx, dw, db))), f"n={n}: not deterministic"


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [16, 64, 1024, 4096, 32768])
def test_cuda_rms_norm_overflow_gives_the_exact_answer_whatever_the_layout(dtype: torch.dtype, n: int) -> None:
    # Every square fits the working precision but their sum does not: the exact answer (the CPU's too), wherever
    # the large values sit and whatever the row length, on every form (few rows and many: other plans).
    big = 1.5e19
    rows = []
    for positions in ((0, 1), (0, 8), (0, n // 2), (n - 2, n - 1)):
        row = torch.randn(n, dtype=torch.float64)
        row[list(positions)] = big
        rows.append(row)
    rows.append(torch.full((n,), big, dtype=torch.float64))
    x = torch.stack(rows).to(dtype)
    xs = x.double() / big  # the same rows scaled into range
    want = (xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True))).to(dtype)
    x = x.cuda()
    for many in (1, 3000):
        xs_many = x.repeat(many, 1)
        got = torch.ops.myns.rms_norm(xs_many, None, 1e-6)[: len(rows)].cpu()
        torch.testing.assert_close(got, want, **_tol(dtype), msg=lambda m: f"rms_norm x{many}: {m}")
        got = torch.ops.myns.add_rms_norm(xs_many, torch.zeros_like(xs_many), None, 1e-6)[0][: len(rows)].cpu()
        torch.testing.assert_close(got, want, **_tol(dtype), msg=lambda m: f"add_rms_norm x{many}: {m}")


def _tol(dtype: torch.dtype) -> dict:
    rtol, atol = TOLERANCES[dtype]
    return {"rtol": rtol, "atol": atol}


@requires_cuda
@pytest.mark.parametrize("rows, n", [(400_000, 64), (100_000, 256), (20_000, 4096)])
def test_cuda_f32_dweight_error_within_twice_torchs(rows: int, n: int) -> None:
    x = torch.randn(rows, n, device="cuda")
    w = torch.randn(n, device="cuda")
    dy = torch.randn(rows, n, device="cuda")
    xd, wd, dyd = x.double().requires_grad_(), w.double().requires_grad_(), dy.double()
    ref = torch.autograd.grad(F.rms_norm(xd, (n,), wd, 1e-6), wd, dyd)[0]
    wt = w.clone().requires_grad_()
    torch_dw = torch.autograd.grad(F.rms_norm(x, (n,), wt, 1e-6), wt, dy)[0]
    wo = w.clone().requires_grad_()
    ours = torch.autograd.grad(torch.ops.myns.rms_norm(x, wo, 1e-6), wo, dy)[0]
    err = lambda d: ((d.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    assert err(ours) <= 2 * err(torch_dw) + 1e-12, (err(ours), err(torch_dw))
    wl, bl = w.clone().requires_grad_(), torch.randn(n, device="cuda").requires_grad_()
    ref_l = torch.autograd.grad(F.layer_norm(xd, (n,), wd, bl.double(), 1e-5), wd, dyd)[0]
    torch_l = torch.autograd.grad(F.layer_norm(x, (n,), wl, bl, 1e-5), wl, dy)[0]
    wl2 = w.clone().requires_grad_()
    ours_l = torch.autograd.grad(torch.ops.myns.layer_norm(x, wl2, bl, 1e-5), wl2, dy)[0]
    err_l = lambda d: ((d.double() - ref_l).norm() / ref_l.norm()).item()  # noqa: E731
    assert err_l(ours_l) <= 2 * err_l(torch_l) + 1e-12, (err_l(ours_l), err_l(torch_l))
