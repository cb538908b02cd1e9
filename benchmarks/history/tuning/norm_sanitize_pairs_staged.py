"""The warp-pair forward and the one-block staged backward under compute-sanitizer, checked against float64:
pairs at 5-38 rows of 8-1024 elements (odd rows leave a warp one row), dense and with an aligned row stride,
in bf16 / f32 / f64 / f16 (`pair`); the staged backward at 500 rows of bf16 16384 / f32 8192, one block an SM,
so each block walks 4 rows and block_row_sum's scratch halves alternate (`staged`); short rows (64-256
16-byte chunks: the staged backward on 32-128 threads, two chunks a thread, and the stream forward on 32-64)
at 2501-5001 rows, more than the blocks an SM holds times the SMs, so blocks walk two rows or more (`short`).
rms_norm and add_rms_norm, forward and backward.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 3 python benchmarks/history/tuning/norm_sanitize_pairs_staged.py pair
    compute-sanitizer --tool racecheck --error-exitcode 3 python benchmarks/history/tuning/norm_sanitize_pairs_staged.py staged
    (and `short` under both tools)
"""
import sys
import torch, torchops
torch.manual_seed(0)
F = torch.nn.functional
def check(m, n, dt, stride_pad=0):
    base = torch.randn(m, n + stride_pad, device="cuda", dtype=dt)
    x = base[:, :n]
    r = torch.randn(m, n, device="cuda", dtype=dt); w = torch.randn(n, device="cuda", dtype=dt)
    dy = torch.randn(m, n, device="cuda", dtype=dt)
    tol = 2e-2 if dt in (torch.bfloat16, torch.float16) else 1e-4
    y, rs = torch.ops.myns._rms_norm_forward(x, w, 1e-6)
    torch.testing.assert_close(y.double(), F.rms_norm(x.double(), (n,), w.double(), 1e-6), rtol=tol, atol=tol)
    o, h, rs2 = torch.ops.myns._add_rms_norm_forward(x, r, w, 1e-6, 0.0)
    assert torch.equal(h, x + r)
    torch.testing.assert_close(o.double(), F.rms_norm(h.double(), (n,), w.double(), 1e-6), rtol=tol, atol=tol)
    xg, wg = x.double().requires_grad_(), w.double().requires_grad_()
    gx, gw = torch.autograd.grad(F.rms_norm(xg, (n,), wg, 1e-6), (xg, wg), dy.double())
    dx, dw = torch.ops.myns._rms_norm_backward(dy, x, w, rs, True, True)
    torch.testing.assert_close(dx.double(), gx, rtol=tol, atol=tol)
    torch.testing.assert_close(dw.double(), gw, rtol=tol, atol=tol * float(gw.abs().max()))
    dres = torch.randn_like(dy)
    adx, adw = torch.ops.myns._add_rms_norm_backward(dy, dres, h, w, rs2, True, 0.0)
    hg = h.double().requires_grad_()
    gh, = torch.autograd.grad(F.rms_norm(hg, (n,), w.double(), 1e-6), (hg,), dy.double())
    torch.testing.assert_close(adx.double(), gh + dres.double(), rtol=tol, atol=tol)
    print("ok", m, n, dt, stride_pad, flush=True)
if sys.argv[1] == "pair":
    for dt in (torch.bfloat16, torch.float32, torch.float64, torch.float16):
        for m, n in [(37, 8), (37, 256), (38, 512), (37, 1024), (5, 128)]:
            check(m, n, dt)
            check(m, n, dt, stride_pad=16 // dt.itemsize)
elif sys.argv[1] == "short":
    for m, n, dt in [(5001, 512, torch.bfloat16), (2501, 1024, torch.bfloat16), (2501, 2048, torch.bfloat16),
                     (2501, 1024, torch.float32), (5001, 256, torch.float32), (2501, 1024, torch.float16)]:
        check(m, n, dt)
else:  # one staged block an SM: 500 rows give each block 4 rows (parity 0, 1, 0, 1)
    check(500, 16384, torch.bfloat16)
    check(500, 8192, torch.float32)
torch.cuda.synchronize()
print("done", sys.argv[1])
