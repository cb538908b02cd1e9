"""What the norm forward tuning scripts share (norm_kernel_time.py, norm_forward_env_variants.py,
norm_forward_block_rows_variants.py; run from the repository root with PYTHONPATH=., each finds this file beside
it): kernel time with the host held ahead, the float64 reference, the kernels one call launches, and the
environment variables through which an experiment build picks a variant."""
import json
import os

import torch

from benchmarks.harness import flushed_events_ms

_flush: torch.Tensor | None = None  # zeroed before each timed call, to evict L2 (made on first use)


def kernel_us(fn, reps: int) -> float:
    """Median µs of `reps` calls of fn, each after an L2 flush and between two events, with a sleep kernel holding
    the GPU while the host queues them all (3e7 cycles, ~15 ms: longer than the host takes to queue the calls)."""
    global _flush
    if _flush is None:
        _flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    return flushed_events_ms(fn, _flush, reps, hold_cycles=30_000_000) * 1e3


def rms_reference(h: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = h.double()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def launches(fn) -> list[str]:
    """The kernels one call of fn launches: name, grid, block, registers, shared memory, µs (a profiler trace)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    path = "/tmp/trace.json"
    prof.export_chrome_trace(path)
    out = []
    for e in json.load(open(path))["traceEvents"]:
        if e.get("cat") == "kernel":
            a = e.get("args", {})
            out.append(f"{e['name'][:70]} grid={a.get('grid')} block={a.get('block')} "
                       f"regs={a.get('registers per thread')} smem={a.get('shared memory')} dur={e.get('dur')}")
    return out


def set_env(names: list[str], env: dict) -> None:
    """Sets the experiment build's variables in `env` and clears the rest of `names`."""
    for k in names:
        os.environ.pop(k, None)
    os.environ.update({k: str(v) for k, v in env.items()})
