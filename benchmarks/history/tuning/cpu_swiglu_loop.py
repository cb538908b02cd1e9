"""Per-call times of the swiglu f32 backward in a loop on the CPU, eager and torchops in turns.

The bench reports medians; this prints means too, which count the occasional slow call that re-faults
memory the VM's host took back (benchmarks/history/tuning/cpu_fresh_pages.py). Both backward callables replay
one forward's graph (as benchmarks/bench_swiglu.py does), 1024 x 14336, 2 threads, for 10 s:

    .venv/bin/python benchmarks/history/tuning/cpu_swiglu_loop.py
"""
import statistics
import time

import torch
import torch.nn.functional as F

import torchops


def backward_of(fn, gate, up, grad):
    g, u = gate.detach().requires_grad_(), up.detach().requires_grad_()
    out = fn(g, u)
    return lambda: torch.autograd.grad(out, (g, u), grad, retain_graph=True)


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    gate, up = torch.randn(1024, 2 * 14336).chunk(2, -1)
    grad = torch.randn(1024, 14336)
    fns = {"eager": backward_of(lambda g, u: F.silu(g) * u, gate, up, grad),
           "torchops": backward_of(torchops.swiglu, gate, up, grad)}
    times: dict[str, list[float]] = {name: [] for name in fns}
    start = time.perf_counter()
    while time.perf_counter() - start < 10.0:
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    for name, ts in times.items():
        print(f"{name:9s} {len(ts)} calls: median {statistics.median(ts):.1f} ms, mean {statistics.mean(ts):.1f}, "
              f"max {max(ts):.0f}, first {' '.join(f'{t:.0f}' for t in ts[:6])}")
    e, o = times["eager"], times["torchops"]
    print(f"torchops vs eager: {statistics.median(e) / statistics.median(o):.2f}x by medians, "
          f"{statistics.mean(e) / statistics.mean(o):.2f}x by means")


if __name__ == "__main__":
    main()
