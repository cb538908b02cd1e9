"""What fresh output memory costs on this project's CPU machine, per way of faulting it in.

Each call makes two new 1024 x 14336 f32 tensors (59 MB each, so glibc gives each its own mmap) and
writes them with a 2-thread `torch.mul(..., out=)`, as a large-output op like `swiglu_backward` does. The
strategies:
  plain          4 KiB page faults (what eager PyTorch gets);
  huge           madvise(MADV_HUGEPAGE) first, so the faults come 2 MiB at a time (what
                 `torchops::advise_huge_pages` does for outputs above 32 MiB);
  populate       madvise(MADV_POPULATE_WRITE): the kernel faults the range in up front, on one thread;
  huge+populate  both.
Prints, per strategy, the per-call times of a 4 s loop and then of five calls that each follow a 2.5 s
pause. The machine is a Firecracker VM with virtio free page reporting: memory left free for ~2 s goes
back to the host and costs a host fault when touched again (benchmarks/history/log.md, "swiglu — CPU").

    .venv/bin/python benchmarks/history/tuning/cpu_fresh_pages.py
"""
import ctypes
import statistics
import time

import torch

MADV_HUGEPAGE, MADV_POPULATE_WRITE = 14, 23  # <sys/mman.h> on Linux
HUGE_PAGE = 2 << 20
NUMEL = 1024 * 14336

libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def fresh_outputs(strategy: str, a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
    outs = []
    for _ in range(2):
        t = torch.empty(NUMEL)
        lo = (t.data_ptr() + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
        hi = (t.data_ptr() + t.nbytes) & ~(HUGE_PAGE - 1)
        for flag, advice in (("huge", MADV_HUGEPAGE), ("populate", MADV_POPULATE_WRITE)):
            if flag in strategy and libc.madvise(lo, hi - lo, advice) != 0:
                raise OSError(ctypes.get_errno(), f"madvise {flag}")
        torch.mul(a, b, out=t)
        outs.append(t)
    return outs


def call_ms(strategy: str, a: torch.Tensor, b: torch.Tensor) -> float:
    t0 = time.perf_counter()
    fresh_outputs(strategy, a, b)
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    torch.set_num_threads(2)
    a, b = torch.randn(NUMEL), torch.randn(NUMEL)
    for strategy in ("plain", "huge", "populate", "huge+populate"):
        loop = []
        start = time.perf_counter()
        while time.perf_counter() - start < 4.0:
            loop.append(call_ms(strategy, a, b))
        after_pause = []
        for _ in range(5):
            time.sleep(2.5)
            after_pause.append(call_ms(strategy, a, b))
        print(f"{strategy:14s} 4 s loop: {len(loop)} calls, median {statistics.median(loop):.1f} ms, first "
              f"{' '.join(f'{t:.0f}' for t in loop[:8])}; after 2.5 s pauses: "
              f"{' '.join(f'{t:.0f}' for t in after_pause)} ms")


if __name__ == "__main__":
    main()
