"""Kernel time of the rms_norm / add_rms_norm forwards with the host kept ahead of the GPU: torchops against
`torch.compile` (in two forms for add_rms_norm), Liger-Kernel 0.8.5 and a device copy of the same bytes.

The bench times with `do_bench`, where a peer whose Python costs more per call than its kernel (Inductor's
and Liger's wrappers at 4096x2048) is timed with the GPU waiting on the host. Here a sleep kernel holds the
GPU while the host queues every call (an L2 flush, a start event, the call, an end event), so each event pair
brackets only the kernel. Outputs are checked against float64 first; three interleaved rounds of 80 calls,
the median of each round.

add_rms_norm's compiled forms: "bench form" is the bench's peer (`h = x + r`, then `F.rms_norm(h)`,
returning both); "fused form" returns `F.rms_norm(x + r), x + r`, for which Inductor writes another kernel
(in 16-bit it also normalises the unrounded sum: a different result from the op's).

    PYTHONPATH=. python benchmarks/history/tuning/norm_kernel_time.py [MxN ...]   # default: 4096x2048 16384x8192
"""
import statistics
import sys

import torch
import torch.nn.functional as F
from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
from liger_kernel.ops.rms_norm import LigerRMSNormFunction

import torchops
from norm_timing import kernel_us, rms_reference

torch._dynamo.config.recompile_limit = 1024
torch._dynamo.config.cache_size_limit = 1024
EPS = 1e-6
REPS = 80


shapes = [tuple(map(int, a.split("x"))) for a in sys.argv[1:]] or [(4096, 2048), (16384, 8192)]
for dtype in (torch.float32, torch.bfloat16):
    for m, n in shapes:
        x, r = torch.randn(m, n, dtype=dtype, device="cuda"), torch.randn(m, n, dtype=dtype, device="cuda")
        w = torch.randn(n, dtype=dtype, device="cuda")

        def bench_form(a, res, b):
            h = a + res
            return F.rms_norm(h, (n,), b, EPS), h

        compiled = torch.compile(lambda a, b: F.rms_norm(a, (n,), b, EPS), dynamic=False)
        compiled_add = torch.compile(bench_form, dynamic=False)
        compiled_fused = torch.compile(lambda a, c, b: (F.rms_norm(a + c, (n,), b, EPS), a + c), dynamic=False)
        src2, dst2 = (torch.empty(m * n, dtype=dtype, device="cuda") for _ in range(2))  # rms_norm's bytes
        src4, dst4 = (torch.empty(2 * m * n, dtype=dtype, device="cuda") for _ in range(2))  # add_rms_norm's
        want, want_add = rms_reference(x, w, EPS), rms_reference(x + r, w, EPS)
        fns = {  # name: (call, float64 reference of its first output, or None for the copies)
            "torchops rms_norm": (lambda: torchops.rms_norm(x, w, EPS), want),
            "compile rms_norm": (lambda: compiled(x, w), want),
            "liger rms_norm": (lambda: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False), want),
            "copy, rms_norm's bytes": (lambda: dst2.copy_(src2), None),
            "torchops add_rms_norm": (lambda: torchops.add_rms_norm(x, r, w, EPS), want_add),
            "compile add, bench form": (lambda: compiled_add(x, r, w), want_add),
            "compile add, fused form": (lambda: compiled_fused(x, r, w), want_add),
            "liger add_rms_norm": (lambda: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS, 0.0, "llama", False),
                                   want_add),
            "copy, add_rms_norm's bytes": (lambda: dst4.copy_(src4), None),
        }
        tol = 2e-2 if dtype == torch.bfloat16 else 2e-5
        times = {name: [] for name in fns}
        with torch.no_grad():
            for name, (fn, ref) in fns.items():
                if ref is not None:
                    out = fn()
                    out = out[0] if isinstance(out, tuple) else out
                    err = ((out.double() - ref).abs() / (ref.abs() + 1)).max().item()
                    assert err < tol, f"{name} {dtype} {m}x{n}: relative error {err:.2e}"
            for _ in range(3):
                for name, (fn, _) in fns.items():
                    times[name].append(kernel_us(fn, REPS))
        print(f"\n{dtype} {m}x{n}, µs (three rounds, then their median)")
        for name, ts in times.items():
            print(f"  {name:28s} " + " ".join(f"{t:7.2f}" for t in ts) + f"   {statistics.median(ts):7.2f}")
        torch._dynamo.reset()
        del x, r, w, src2, dst2, src4, dst4
        torch.cuda.empty_cache()
