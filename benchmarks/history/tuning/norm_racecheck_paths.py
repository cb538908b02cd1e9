"""Every CUDA rms_norm / add_rms_norm kernel path once on a few rows, for compute-sanitizer (racecheck,
memcheck): warp, block, cluster and long-block forwards, the backward with dweight in shared memory and
the column fallback. Checks each result against float64 on the way.

    compute-sanitizer --tool racecheck python benchmarks/history/tuning/norm_racecheck_paths.py
"""

import torch
import torch.nn.functional as F

import torchops  # noqa: F401

EPS = 1e-6
bad = 0
for dt, ns in ((torch.bfloat16, (1000, 1024, 8192, 32768, 65536, 131080)), (torch.float32, (1024, 8192, 16384, 65536, 70000))):
    for n in ns:
        x, r, w, dy = (torch.randn(*s, device="cuda", dtype=dt) for s in ((5, n), (5, n), (n,), (5, n)))
        out, rstd = torch.ops.myns._rms_norm_forward(x, w, EPS, 0.0)
        tol = 2e-2 if dt == torch.bfloat16 else 2e-5
        ok = torch.allclose(out.double(), F.rms_norm(x.double(), (n,), w.double(), EPS), rtol=tol, atol=tol)
        o2, h, rs2 = torch.ops.myns._add_rms_norm_forward(x, r, w, EPS, 0.0)
        ok &= torch.allclose(o2.double(), F.rms_norm((x + r).double(), (n,), w.double(), EPS), rtol=tol, atol=tol)
        dx, dw = torch.ops.myns._rms_norm_backward(dy, x, w, rstd, True, True, 0.0)
        xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
        rx, rw = torch.autograd.grad(F.rms_norm(xd, (n,), wd, EPS), (xd, wd), dy.double())
        ok &= torch.allclose(dx.double(), rx, rtol=tol, atol=tol) and torch.allclose(dw.double(), rw, rtol=4 * tol, atol=20 * tol)
        torch.cuda.synchronize()
        print(dt, n, "ok" if ok else "WRONG", flush=True)
        bad += not ok
print("paths done, wrong:", bad)
