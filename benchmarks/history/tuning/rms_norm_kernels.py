"""Kernel-only timing of torchops' rms_norm ops on CUDA, against a device-to-device copy in the same run.

Times `myns::_rms_norm_forward`, `myns::_rms_norm_backward` (dx and dweight), `myns::_add_rms_norm_forward` and
`myns::_add_rms_norm_backward` directly, without autograd or baselines, at the bench grid's shapes in bf16 and
f32 (weight of the input's dtype), after checking the forward against float64 `F.rms_norm` (and the op without
rstd against it bit for bit), the backward ops against float64 autograd and the add forward against `x + r`
and float64 `F.rms_norm`. Used to compare kernel variants quickly on the GPU; the full
comparison with the peers is benchmarks/bench_rms_norm.py. Bytes: fwd = x read + y written; bwd = x and dy
read + dx written; add fwd = input and residual read + out and residual_out written; add bwd = x, dy and
grad_residual_out read + dx written (the weight, rstd and dweight are < 0.1%). `--shapes MxN,...` picks
shapes, `--dtypes bf16,f32` dtypes.

    PYTHONPATH=$PWD python3 benchmarks/history/tuning/rms_norm_kernels.py [--shapes 8192x16384] [--dtypes bf16]
"""
import argparse

import torch
import triton

import torchops

parser = argparse.ArgumentParser()
parser.add_argument("--shapes", default="4096x2048,65536x1024,32768x4096,16384x8192,8192x16384,4096x32768,2048x65536")
parser.add_argument("--dtypes", default="bf16,f32")
args = parser.parse_args()
dtypes = [{"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[d] for d in args.dtypes.split(",")]
shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
print("torchops from", torchops.__file__, flush=True)
src = torch.empty(1 << 29, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
tc = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median"); copy = 2 * src.numel() / tc / 1e9
del src, dst
out = [f"copy {copy:.2f} TB/s"]
for dt in dtypes:
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda", dtype=dt); w = torch.randn(n, device="cuda", dtype=dt)
        dy = torch.randn_like(x); dres = torch.randn_like(x)
        y, r = torch.ops.myns._rms_norm_forward(x, w, 1e-6)
        # correctness vs autograd of F.rms_norm (x plays add_rms_norm's residual_out: dx gains dres)
        xg, wg = x.double().requires_grad_(), w.double().requires_grad_()
        gx, gw = torch.autograd.grad(torch.nn.functional.rms_norm(xg, (n,), wg, 1e-6), (xg, wg), dy.double())
        dx, dw = torch.ops.myns._rms_norm_backward(dy, x, w, r, True, True)
        adx, adw = torch.ops.myns._add_rms_norm_backward(dy, dres, x, w, r, True, 0.0)
        tol = 2e-2 if dt == torch.bfloat16 else 1e-4
        y_ref = torch.nn.functional.rms_norm(x.double(), (n,), w.double(), 1e-6)
        torch.testing.assert_close(y.double(), y_ref, rtol=tol, atol=tol)
        torch.testing.assert_close(torch.ops.myns.rms_norm(x, w, 1e-6), y, rtol=0, atol=0)  # the no-rstd op
        del y_ref
        torch.testing.assert_close(dx.double(), gx, rtol=tol, atol=tol)
        torch.testing.assert_close(adx.double(), gx + dres.double(), rtol=tol, atol=tol)
        torch.testing.assert_close(dw.double(), gw, rtol=tol, atol=tol * float(gw.abs().max()))
        torch.testing.assert_close(adw.double(), gw, rtol=tol, atol=tol * float(gw.abs().max()))
        del xg, wg, gx, gw
        ao, ah, _ = torch.ops.myns._add_rms_norm_forward(x, dres, w, 1e-6)
        h_ref = x + dres  # residual_out, rounded to the input's dtype as the op stores it
        torch.testing.assert_close(ah, h_ref, rtol=0, atol=0)
        torch.testing.assert_close(ao.double(), torch.nn.functional.rms_norm(h_ref.double(), (n,), w.double(), 1e-6),
                                   rtol=tol, atol=tol)
        del ao, ah, h_ref
        tf = triton.testing.do_bench(lambda: torch.ops.myns._rms_norm_forward(x, w, 1e-6), return_mode="median")
        tb = triton.testing.do_bench(lambda: torch.ops.myns._rms_norm_backward(dy, x, w, r, True, True),
                                     return_mode="median")
        ta = triton.testing.do_bench(lambda: torch.ops.myns._add_rms_norm_backward(dy, dres, x, w, r, True, 0.0),
                                     return_mode="median")
        taf = triton.testing.do_bench(lambda: torch.ops.myns._add_rms_norm_forward(x, dres, w, 1e-6),
                                      return_mode="median")
        b = m * n * dt.itemsize
        pct = lambda nbytes, t: nbytes / t / 1e9 / copy * 100
        out.append(f"{str(dt)[6:]} {m}x{n} fwd {tf*1e3:.1f}us {pct(2 * b, tf):.1f}% bwd {tb*1e3:.1f}us "
                   f"{pct(3 * b, tb):.1f}% add-fwd {taf*1e3:.1f}us {pct(4 * b, taf):.1f}% add-bwd {ta*1e3:.1f}us "
                   f"{pct(4 * b, ta):.1f}%")
        print(out[-1], flush=True)
        del x, w, dy, dres, y, r, dx, dw, adx, adw
print("\n".join(out))
