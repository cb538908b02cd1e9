"""Every CUDA rms_norm / add_rms_norm kernel path once on a few rows, for compute-sanitizer (racecheck,
memcheck): warp, block, cluster and long-block forwards (the warp rows, the register rows, and the stream
kernel's straight-line, read-twice and loop forms), the backward with dweight in shared memory and the column
fallback. Inputs made and references computed on the CPU (float64), so that the sanitizer sees almost only our
kernels.

    compute-sanitizer --tool racecheck --kernel-regex kns=norm python benchmarks/history/tuning/norm_racecheck_paths.py
"""

import torch
import torch.nn.functional as F

import torchops  # noqa: F401

EPS = 1e-6
bad = 0
# Rows of 256 or 512 vectors on few rows are kept in registers (bf16 N = 2048 / 4096, f32 1024 / 2048): the
# kernels of those N on many rows once more, on just over 32 rows an SM.
many = 32 * torch.cuda.get_device_properties(0).multi_processor_count + 1
cases = ((torch.bfloat16, (1000, 1024, 2048, 3072, 4096, 8192, 16384, 32768, 40000, 65536, 131072, 131080)),
         (torch.float32, (512, 1024, 2048, 4096, 8192, 16384, 16388, 65536, 70000, 131072)),
         (torch.bfloat16, (2048, 4096), many), (torch.float32, (1024, 2048), many))
for dt, ns, *rows in cases:
    rows = rows[0] if rows else 5
    for n in ns:
        x, r, w, dy = (torch.randn(*s).to(dt) for s in ((rows, n), (rows, n), (n,), (rows, n)))
        xd, rd, wd, dyd = (t.double() for t in (x, r, w, dy))
        xc, rc, wc, dyc = (t.cuda() for t in (x, r, w, dy))
        tol = 2e-2 if dt == torch.bfloat16 else 2e-5
        close = lambda got, want, k=1: torch.allclose(got.cpu().double(), want, rtol=k * tol, atol=k * tol)  # noqa: E731
        out, rstd = torch.ops.myns._rms_norm_forward(xc, wc, EPS, 0.0)
        ok = close(out, F.rms_norm(xd, (n,), wd, EPS))
        o2, h, _ = torch.ops.myns._add_rms_norm_forward(xc, rc, wc, EPS, 0.0)
        hd = h.cpu().double()
        ok &= torch.equal(h.cpu(), x + r) and close(o2, F.rms_norm(hd, (n,), wd, EPS))
        if rows == 5:  # the many-rows cases are there for the forward
            dx, dw = torch.ops.myns._rms_norm_backward(dyc, xc, wc, rstd, True, True, 0.0)
            xg, wg = xd.clone().requires_grad_(), wd.clone().requires_grad_()
            rx, rw = torch.autograd.grad(F.rms_norm(xg, (n,), wg, EPS), (xg, wg), dyd)
            ok &= close(dx, rx) and close(dw, rw, 20)
        torch.cuda.synchronize()
        print(dt, n, rows, "ok" if ok else "WRONG", flush=True)
        bad += not ok
print("paths done, wrong:", bad)
