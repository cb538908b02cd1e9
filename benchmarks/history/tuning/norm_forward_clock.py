"""Is the SM clock what moves the register rows' time with the kernel before them (norm_forward_state.py)? For
rms_norm f32 and add_rms_norm bf16 at 4096x2048: torchops (the register rows), Liger-Kernel 0.8.5 and a device copy of
the same bytes, each timed right after a batch of each other one or after half a second idle, as in
norm_forward_state.py (norm_timing.kernel_us), and beside each timed batch the SM clock, read as a sleep kernel's
cycles over its event time, right before the batch and right after it. history/log.md, "a seventeenth session",
item 6. On the shipped build:

    PYTHONPATH=. python benchmarks/history/tuning/norm_forward_clock.py"""
import torch
from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
from liger_kernel.ops.rms_norm import LigerRMSNormFunction

import torchops
from norm_timing import check_variants, idle_gpu, kernel_us, rms_reference

EPS = 1e-6
REPS = 80
PROBE = 1_000_000  # cycles: ~0.5 ms at the H200's top clock


def sm_mhz() -> float:
    """The SM clock now: a sleep kernel's cycles over its event time."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    torch.cuda._sleep(PROBE)
    e.record()
    e.synchronize()
    return PROBE / (s.elapsed_time(e) * 1e3)


def clocked_batch(fn) -> tuple[float, float, float]:
    """kernel_us of fn, and the SM clock in MHz right before and right after its batch."""
    before = sm_mhz()
    us = kernel_us(fn, REPS)
    return us, before, sm_mhz()


for op, dtype in (("plain", torch.float32), ("add", torch.bfloat16)):
    m, n = 4096, 2048
    x, r = torch.randn(m, n, dtype=dtype, device="cuda"), torch.randn(m, n, dtype=dtype, device="cuda")
    w = torch.randn(n, dtype=dtype, device="cuda")
    src, dst = (torch.empty((1 if op == "plain" else 2) * m * n, dtype=dtype, device="cuda") for _ in range(2))
    want = rms_reference(x if op == "plain" else x + r, w, EPS)
    if op == "plain":
        fns = {"torchops": lambda: torchops.rms_norm(x, w, EPS),
               "liger": lambda: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False)}
    else:
        fns = {"torchops": lambda: torchops.add_rms_norm(x, r, w, EPS),
               "liger": lambda: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS, 0.0, "llama", False)}
    check_variants({k: (f, want, {}) for k, f in fns.items()}, [], 2e-2 if dtype == torch.bfloat16 else 2e-5, op)
    fns["copy"] = lambda: dst.copy_(src)
    with torch.no_grad():
        for f in fns.values():  # warm-up (Triton compiles)
            f()
        print(f"\n{op} {dtype} {m}x{n}: the timed call after a batch of the predecessor's; three rounds of "
              f"µs [SM MHz right before / right after]")
        for before in ("idle", "torchops", "liger", "copy"):
            for target in ("torchops", "liger"):
                cells = []
                for _ in range(3):
                    idle_gpu() if before == "idle" else clocked_batch(fns[before])
                    us, a, b = clocked_batch(fns[target])
                    cells.append(f"{us:6.2f} [{a:4.0f}/{b:4.0f}]")
                print(f"  {target:9s} after {before:9s}" + "  ".join(cells))
