"""What the norm forward tuning scripts share (norm_kernel_time.py, norm_forward_env_variants.py,
norm_forward_block_rows_variants.py, norm_forward_state.py, norm_forward_clock.py, norm_add_register_occupancy.py;
run from the repository root with PYTHONPATH=., each finds this file beside it): kernel time with the host held
ahead, an idle GPU, the float64 reference, the kernels one call launches, and the environment variables through which
an experiment build picks a variant."""
import json
import os
import time

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


def idle_gpu() -> None:
    """Half a second with the GPU idle (the "idle" predecessor of norm_forward_state.py and norm_forward_clock.py)."""
    torch.cuda.synchronize()
    time.sleep(0.5)


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


# The variant scripts' calls: name -> (call, float64 reference of its first output or None, the environment it
# runs under), `names` the experiment build's variables.
def check_variants(fns: dict, names: list[str], tol: float, label: str) -> None:
    """Prints "WRONG" for each call whose first output is off its reference by `tol` or more (relative)."""
    with torch.no_grad():
        for name, (fn, want, env) in fns.items():
            set_env(names, env)
            if want is not None:
                out = fn()
                out = out[0] if isinstance(out, tuple) else out
                err = ((out.double() - want).abs() / (want.abs() + 1)).max().item()
                if not err < tol:
                    print(f"WRONG {name} {label}: relative error {err:.2e}")
    set_env(names, {})


def time_variants(fns: dict, names: list[str], reps: int, rounds: int = 3) -> dict[str, list[float]]:
    """kernel_us of every call, in `rounds` interleaved rounds: name -> one time a round."""
    times = {name: [] for name in fns}
    with torch.no_grad():
        for _ in range(rounds):
            for name, (fn, _, env) in fns.items():
                set_env(names, env)
                times[name].append(kernel_us(fn, reps))
    set_env(names, {})
    return times
