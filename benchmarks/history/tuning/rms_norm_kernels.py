"""Kernel-only timing of torchops' rms_norm ops on CUDA, against a device-to-device copy in the same run.

Times `myns::_rms_norm_forward` and `myns::_rms_norm_backward` (dx and dweight) directly, without autograd or
baselines, at the four bench shapes in bf16 and f32 (weight of the input's dtype), after checking the
backward against float64 autograd of F.rms_norm. Used to compare kernel variants quickly on the GPU; the full
comparison with F.rms_norm and torch.compile is benchmarks/bench_rms_norm.py. Bytes: fwd = x read + y
written; bwd = x and dy read + dx written (the weight, rstd and dweight are < 0.1%).

    PYTHONPATH=$PWD python3 benchmarks/history/tuning/rms_norm_kernels.py
"""
import torch, triton
import torchops
print("torchops from", torchops.__file__, flush=True)
src = torch.empty(1 << 29, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
tc = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median"); copy = 2 * src.numel() / tc / 1e9
del src, dst
out = [f"copy {copy:.2f} TB/s"]
for dt in (torch.bfloat16, torch.float32):
    for m, n in ((65536, 1024), (32768, 4096), (16384, 8192), (8192, 16384)):
        x = torch.randn(m, n, device="cuda", dtype=dt); w = torch.randn(n, device="cuda", dtype=dt); dy = torch.randn_like(x)
        y, r = torch.ops.myns._rms_norm_forward(x, w, 1e-6)
        # correctness vs autograd of F.rms_norm
        xg, wg = x.double().requires_grad_(), w.double().requires_grad_()
        gx, gw = torch.autograd.grad(torch.nn.functional.rms_norm(xg, (n,), wg, 1e-6), (xg, wg), dy.double())
        dx, dw = torch.ops.myns._rms_norm_backward(dy, x, w, r, True, True)
        tol = 2e-2 if dt == torch.bfloat16 else 1e-4
        torch.testing.assert_close(dx.double(), gx, rtol=tol, atol=tol)
        torch.testing.assert_close(dw.double(), gw, rtol=tol, atol=tol * float(gw.abs().max()))
        del xg, wg, gx, gw
        tf = triton.testing.do_bench(lambda: torch.ops.myns._rms_norm_forward(x, w, 1e-6), return_mode="median")
        tb = triton.testing.do_bench(lambda: torch.ops.myns._rms_norm_backward(dy, x, w, r, True, True), return_mode="median")
        bf = 2 * m * n * dt.itemsize; bb = 3 * m * n * dt.itemsize
        out.append(f"{str(dt)[6:]} {m}x{n} fwd {tf*1e3:.1f}us {bf/tf/1e9/copy*100:.1f}% bwd {tb*1e3:.1f}us {bb/tb/1e9/copy*100:.1f}%")
        del x, w, dy, y, r, dx, dw
print("\n".join(out))
