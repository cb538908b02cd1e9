"""Shared benchmark harness: the CLI, timing, the copy reference, result records, output and bar checks.

A ``bench_<op>.py`` declares only what it measures (a ``Bench``: its options, its cases, the size of its
largest operand) and calls ``main(BENCH)``; its bars live in ``benchmarks/bars.py``. ``main`` parses the
shared options, measures a large device copy (the plots' roofline), runs the cases, gives every row that moves
bytes its copy of the same bytes, writes JSON (+ a PNG plot when matplotlib imports) and a Markdown table, then
checks the bars of the bench's ops for that device and exits non-zero on a missed bar, a bar without data or a
wrong result. Timing follows one rule for every op: GPU kernels with ``triton.testing.do_bench`` (median) or
CUDA events, CPU code with ``torch.utils.benchmark.Timer``. "% of copy" (``Result.pct_copy``) is always
against a device copy of the same bytes in the row's dtype, timed in the same run (``same_bytes_copy``): beside
the case when the bench times it so (``time_beside_copy``), else by ``main`` after the cases. CPU figures are
ratios.

    python -m benchmarks.harness results/vector_add_cuda.json ...   # re-print table + bars, re-draw plot
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import platform
import os
import shlex
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from benchmarks import bars as bar_table

# The names of the implementations a bench's rows compare (Result.impl; bars.py names them too).
IMPL, EAGER, COMPILED, LIGER = "torchops", "eager", "torch.compile", "liger"

RESULTS_DIR = Path(__file__).resolve().parent / "results"

DTYPES: dict[str, torch.dtype] = {
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f32": torch.float32,
    "f64": torch.float64,
    "i32": torch.int32,
    "i64": torch.int64,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}

MiB = 1 << 20
GPU_COPY_MIN_BYTES = bar_table.LARGE  # bandwidth figures need buffers far larger than the L2 (50 MB on an H200)
CPU_COPY_MIN_BYTES = 64 * MiB  # well past the last-level cache of a typical CPU.
# CPU timing (time_all_ms): seconds of warm-up calls, then rounds of at least this many seconds per function.
CPU_WARMUP_S, CPU_WARMUP_S_QUICK = 1.0, 0.1
CPU_ROUNDS, CPU_ROUNDS_QUICK = 6, 2
CPU_ROUND_S, CPU_ROUND_S_QUICK = 0.1, 0.025
# CUDA timing (time_all_ms): this many interleaved do_bench rounds per function, each with its share of the budget.
CUDA_ROUNDS = 3
# The CPU timer's clock (warm-up deadline and timed blocks); tests replace it with a fake one.
CLOCK: Callable[[], float] = time.perf_counter
# --profile N: after time_all_ms has timed its functions, each one's N costliest kernels (torch.profiler) on stderr.
PROFILE_ROWS = 0
# --memory-breakdown N: peak_cuda_bytes also prints the N largest sources of what was live at the peak, on stderr.
MEMORY_ROWS = 0


# --------------------------------------------------------------------------------------------------- CLI


def make_parser(description: str, default_dtypes: Sequence[str] = ("f32", "bf16", "f16"),
                cpu_dtypes: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The options every bench script shares; scripts may add their own before parsing. Without --dtypes, the
    CPU measures cpu_dtypes where given (default_dtypes otherwise)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where to run (default: cuda if available)",
    )
    p.add_argument("--quick", action="store_true", help="small sizes only: a smoke run that finishes fast")
    on_cpu = f"; on the CPU: {','.join(cpu_dtypes)}" if cpu_dtypes else ""
    p.add_argument(
        "--dtypes",
        help=f"comma-separated subset of {','.join(DTYPES)} (default: {','.join(default_dtypes)}{on_cpu})",
    )
    p.set_defaults(device_dtypes={"cuda": ",".join(default_dtypes), "cpu": ",".join(cpu_dtypes or default_dtypes)})
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR, help="where JSON/PNG go (default: %(default)s)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,  # torch Timer's own default; several threads on a busy small machine stall on each other
        help="CPU threads for timed code (default: %(default)s)",
    )
    return p


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate: resolves ``args.dtypes`` to a list of torch dtypes."""
    args = parser.parse_args(argv)
    given = args.dtypes if args.dtypes is not None else args.device_dtypes[args.device]
    del args.device_dtypes
    names = [n.strip() for n in given.split(",") if n.strip()]
    unknown = [n for n in names if n not in DTYPES]
    if unknown or not names:
        parser.error(f"--dtypes: unknown {unknown}, choose from {list(DTYPES)}")
    args.dtypes = [DTYPES[n] for n in names]
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but no CUDA device is visible")
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    torch.set_num_threads(args.threads)  # also what the CPU timer uses, see time_ms
    return args


# ----------------------------------------------------------------------------------------------- timing


def _triton_do_bench() -> Callable[..., float] | None:
    # Imported lazily: triton is optional and its import is slow.
    try:
        from triton.testing import do_bench
    except Exception:  # ImportError, or a triton that cannot initialise on this machine
        return None
    return do_bench


def _cuda_events_ms(fn: Callable[[], Any], warmup_ms: float, rep_ms: float) -> float:
    """do_bench's method without triton: flush L2, time each call with events, take the median."""
    flush = torch.empty(GPU_COPY_MIN_BYTES, dtype=torch.int8, device="cuda")  # evicts L2 so every rep is cold
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-3)
    n_warm, n_rep = max(1, int(warmup_ms / est)), max(10, int(rep_ms / est))
    for _ in range(n_warm):
        fn()
    return flushed_events_ms(fn, flush, n_rep)


def flushed_events_ms(fn: Callable[[], Any], flush: torch.Tensor, n_rep: int, *, hold_cycles: int = 0) -> float:
    """Median ms of ``n_rep`` calls of ``fn``, each after zeroing ``flush`` (to evict L2) and between two events.
    ``hold_cycles`` > 0: a sleep kernel of that many GPU cycles first holds the GPU while the host queues every
    call, so that each event pair brackets the call's kernels alone and not the host's time between them (set it
    longer than the host takes to queue the calls)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    if hold_cycles > 0:
        torch.cuda._sleep(hold_cycles)
    for s, e in zip(starts, ends):
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_ms(fn: Callable[[], Any], device: str, *, quick: bool = False, share: int = 1) -> float:
    """Median time of one ``fn()`` call in milliseconds (device time on CUDA, wall time on CPU). CUDA: ``share``
    splits the timing budget, for one of that many interleaved rounds (time_all_ms)."""
    if device == "cuda":
        warmup, rep = (10, 40) if quick else (25, 100)
        warmup, rep = max(5, warmup // share), max(10, rep // share)
        do_bench = _triton_do_bench()
        if do_bench is not None:
            return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
        return _cuda_events_ms(fn, warmup, rep)
    return time_all_ms({"fn": fn}, device, quick=quick)["fn"]


def time_all_ms(fns: dict[str, Callable[[], Any]], device: str, *, quick: bool = False) -> dict[str, float]:
    """Median time of one call of each function in milliseconds, timed against each other.

    Both devices time in interleaved rounds, so that a change in the machine's state (memory the allocator or
    the hypervisor holds, other load, the host's clock) falls on every function alike. CUDA: CUDA_ROUNDS rounds
    of ``time_ms``, each with its share of the budget, and the median of the rounds' medians: device time
    follows the host wherever the host is the bottleneck (small inputs under autograd), and one after the
    other, the same code's fwd+bwd of a 4096x2048 bf16 rms_norm measured 69 us in one run and 120 us in the
    next, beside its eager peer at 77 and 117 us. CPU: the median is over every timed block of every round.
    Before timing, the functions run in turns for a warm-up time rather than a call count: on a VM with free
    page reporting, such as this project's, the first calls after a pause re-fault memory the hypervisor
    took back while it lay free, and ran 3-4x slower than a loop's steady state for ~0.4 s, long enough to
    fill a whole measurement (docs/design-decisions.md, "CPU timer").
    """
    if PROFILE_ROWS > 0:
        print_profiles(fns, device, PROFILE_ROWS)
    if device == "cuda":
        rounds: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(CUDA_ROUNDS):
            for name, fn in fns.items():
                rounds[name].append(time_ms(fn, device, quick=quick, share=CUDA_ROUNDS))
        return {name: statistics.median(times) for name, times in rounds.items()}
    import torch.utils.benchmark as torch_benchmark  # lazy: it pulls in cpp_extension, which GPU runs never need

    clock = CLOCK
    deadline = clock() + (CPU_WARMUP_S_QUICK if quick else CPU_WARMUP_S)
    while True:
        for fn in fns.values():
            fn()
        if clock() >= deadline:
            break
    # num_threads: Timer defaults to 1 thread; measure with the process setting (--threads) instead.
    # timer: only when replaced, so real runs keep Timer's own default clock.
    timer_kw = {} if clock is time.perf_counter else {"timer": clock}
    timers = {name: torch_benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads(),
                                          **timer_kw)
              for name, fn in fns.items()}
    blocks: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(CPU_ROUNDS_QUICK if quick else CPU_ROUNDS):
        for name, timer in timers.items():
            blocks[name] += timer.blocked_autorange(min_run_time=CPU_ROUND_S_QUICK if quick else CPU_ROUND_S).times
    return {name: statistics.median(times) * 1e3 for name, times in blocks.items()}


def liger_peer(device: str, load: Callable[[], tuple[Any, str]]) -> Any:
    """A bench's Liger-Kernel functions, as its `load()` gives them (the functions, or None and why not), on CUDA
    only (they are Triton kernels); where they cannot be loaded there a note says why, since their bars will then
    report no data."""
    if device != "cuda":
        return None
    peer, why = load()
    if peer is None:
        print(f"NOTE: Liger-Kernel skipped ({why}; pip install liger-kernel==0.8.5): its bars report no data",
              file=sys.stderr)
    return peer


def raise_recompile_limit(limit: int = 1024) -> None:
    """Let torch.compile baselines compile afresh for every shape (and form) of a run: past dynamo's
    recompile limit a function silently falls back to eager, and the baseline would be eager's."""
    import torch._dynamo

    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), limit))


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def print_profiles(fns: dict[str, Callable[[], Any]], device: str, rows: int) -> None:
    """Each function's `rows` costliest kernels (self time, device time on CUDA) over 3 calls after one warm-up
    call, on stderr: where a missed bar's time goes, from the same run that measures it."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    for name, fn in fns.items():
        fn()
        synchronize(device)
        with profile(activities=activities) as prof:
            for _ in range(3):
                fn()
            synchronize(device)
        key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
        print(f"profile of {name!r}, 3 calls:\n{prof.key_averages().table(sort_by=key, row_limit=rows)}",
              file=sys.stderr, flush=True)


def host_cost_us(
    fns: dict[str, Callable[[], Any]], device: str, *, calls: int = 1000, rounds: int = 15, warmup: int = 100
) -> dict[str, float]:
    """Host (dispatch + launch) cost of one call in µs for each callable: wall time of ``calls`` back-to-back
    calls / calls.

    On CUDA the calls are only enqueued and the stream is synchronised once per round, so for tiny inputs the
    GPU keeps up and the wall time is the CPU-side cost. Rounds alternate between the callables, so drift
    in the machine's state hits all of them alike, and the minimum over rounds is reported: interference
    only ever adds time.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    synchronize(device)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection inside a round would be charged to whichever op ran then
    best = {name: math.inf for name in fns}
    try:
        for _ in range(rounds):
            for name, fn in fns.items():
                synchronize(device)
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                synchronize(device)
                best[name] = min(best[name], (time.perf_counter() - t0) / calls)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: t * 1e6 for name, t in best.items()}


def copy_bandwidth(device: str, nbytes: int, *, quick: bool = False) -> float:
    """Bytes/s of ``dst.copy_(src)`` on ``device`` for an ``nbytes`` buffer, counting bytes read + written: the
    large copy drawn as the plots' roofline (rows are judged against ``same_bytes_copy`` instead)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 256)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, quick=quick)
    del src, dst
    free_memory(device)
    return 2 * nbytes / (ms * 1e-3)


SAME_BYTES_COPY = "copy of the same bytes"  # its name among the functions timed beside a case


def same_bytes_copy(nbytes: int, dtype: torch.dtype, device: str) -> Callable[[], Any]:
    """``dst.copy_(src)`` of ``dtype`` tensors moving ``nbytes`` (half read, half written) on ``device``: what a
    row moving ``nbytes`` in ``dtype`` is compared against (``Result.pct_copy``). Its tensors live as long as the
    returned function."""
    src = rand((max(1, nbytes // 2 // dtype.itemsize),), dtype, device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def time_beside_copy(fns: dict[str, Callable[[], Any]], nbytes: int, dtype: torch.dtype, device: str, *,
                     quick: bool = False) -> tuple[dict[str, float], float]:
    """``time_all_ms`` of ``fns`` with a copy of the same bytes (``same_bytes_copy``) in their rounds:
    (each function's ms, the copy's ms)."""
    times = time_all_ms({**fns, SAME_BYTES_COPY: same_bytes_copy(nbytes, dtype, device)}, device, quick=quick)
    copy_ms = times.pop(SAME_BYTES_COPY)
    free_memory(device)
    return times, copy_ms


def fill_same_bytes_copies(results: Sequence[Result], device: str, *, quick: bool = False) -> None:
    """Give every row that moves bytes in a known dtype and has no copy of the same bytes yet its own, timed now
    (one copy per dtype and byte count), and its ``pct_copy`` from it."""
    copies: dict[tuple[str, int], float] = {}
    for r in results:
        if r.copy_ms is not None or not r.nbytes or not r.ms or r.dtype not in DTYPES:
            continue
        key = (r.dtype, r.nbytes)
        if key not in copies:
            copies[key] = time_ms(same_bytes_copy(r.nbytes, DTYPES[r.dtype], device), device, quick=quick)
            free_memory(device)
        r.copy_ms, r.pct_copy = copies[key], pct_of_copy(copies[key], r.ms)


def free_memory(device: str) -> None:
    """Return cached blocks between sizes so large shapes never fail on fragmentation (CPU frees on refcount)."""
    if device == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def peak_cuda_bytes(fn: Callable[[], Any], label: str = "") -> tuple[int, Any]:
    """How far the CUDA allocator's peak rose above what was allocated before fn() ran, and fn's result (drop it
    before measuring again). With --memory-breakdown N, also prints what fn had allocated and still held at that
    peak, by source (peak_breakdown)."""
    free_memory("cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    if MEMORY_ROWS:
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    try:
        result = fn()
        torch.cuda.synchronize()
    finally:
        if MEMORY_ROWS:
            snapshot = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            print(f"memory at the peak of {label or 'the call'}, beyond the {before / MiB:.0f} MiB allocated before:\n"
                  f"{peak_breakdown(snapshot['device_traces'][torch.cuda.current_device()], MEMORY_ROWS)}",
                  file=sys.stderr)
    return torch.cuda.max_memory_allocated() - before, result


def _source(frames: Sequence[dict[str, Any]]) -> str:
    """The innermost frame outside torch's own package (torch's, where every frame is), as file:line function."""
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    ours = [f for f in frames if not f["filename"].startswith(torch_dir)] or list(frames)
    if not ours:
        return "(no Python frame)"
    f = ours[0]
    return f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}"


def peak_breakdown(trace: Sequence[dict[str, Any]], rows: int) -> str:
    """The allocations of a recorded trace (torch.cuda.memory._snapshot()'s device_traces[device]) live at the
    moment their total was highest, summed by source (_source; allocations autograd's engine makes in backward
    name the frame that called backward()), the `rows` largest, then the last allocations made before that
    moment: one line each."""
    live: dict[int, tuple[int, str, int]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str, int]] = {}
    for i, event in enumerate(trace):
        if event["action"] == "alloc":
            live[event["addr"]] = (event["size"], _source(event.get("frames", [])), i)
            total += event["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif event["action"] == "free_completed" and event["addr"] in live:
            total -= live.pop(event["addr"])[0]
    by_source: dict[str, list[int]] = {}
    for size, source, _ in at_peak.values():
        entry = by_source.setdefault(source, [0, 0])
        entry[0] += size
        entry[1] += 1
    lines = [f"  {peak / MiB:10.1f} MiB live at the peak"]
    for source, (size, count) in sorted(by_source.items(), key=lambda kv: -kv[1][0])[:rows]:
        lines.append(f"  {size / MiB:10.1f} MiB in {count:4d} from {source}")
    lines.append("  last allocations before the peak:")
    for size, source, i in sorted(at_peak.values(), key=lambda v: v[2])[-min(rows, 8):]:
        lines.append(f"  {size / MiB:10.1f} MiB (event {i}) from {source}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- inputs


def rand(shape: Sequence[int], dtype: torch.dtype, device: str) -> torch.Tensor:
    """Random test data of any supported dtype (never zeros/ones, which can hide bugs or fast paths)."""
    if dtype.is_floating_point:
        return torch.randn(*shape, dtype=dtype, device=device)
    return torch.randint(-1000, 1000, tuple(shape), dtype=dtype, device=device)


def pow2_label(n: int) -> str:
    """``2^k`` when n is a power of two, else the number itself."""
    return f"2^{n.bit_length() - 1}" if n > 0 and n & (n - 1) == 0 else str(n)


# ---------------------------------------------------------------------------------------------- metrics


def tbps(nbytes: int, ms: float) -> float:
    """Terabytes (1e12 bytes) per second moved by ``nbytes`` in ``ms`` milliseconds."""
    return nbytes / (ms * 1e-3) / 1e12


def pct_of_copy(copy_ms: float, ms: float) -> float:
    """A row's speed as a % of a copy of the same bytes that took ``copy_ms`` (``Result.pct_copy``)."""
    return 100.0 * copy_ms / ms


def speedup(baseline_ms: float, ms: float) -> float:
    """How many times faster than the baseline (> 1 is faster)."""
    return baseline_ms / ms


def geomean(xs: Iterable[float]) -> float:
    vals = list(xs)
    return math.exp(sum(math.log(x) for x in vals) / len(vals)) if vals else float("nan")


# ---------------------------------------------------------------------------------------------- records


@dataclasses.dataclass
class Result:
    """One measurement. ``speedup`` is relative to ``baseline`` measured on the same tensors in the same run."""

    op: str  # e.g. "vector_add"
    case: str  # layout / variant, e.g. "contiguous", "transposed", "host-cost fwd"
    dtype: str  # short name, e.g. "bf16"
    shape: str  # human label, e.g. "2^28" or "16384x16384"
    numel: int  # for sorting and plotting
    impl: str  # who ran it, e.g. "torchops", "torch.add"
    device: str
    ms: float  # median time per call in milliseconds
    nbytes: int | None = None  # bytes that must move (each input read once + each output written once)
    tbps: float | None = None
    copy_ms: float | None = None  # a device copy of the same nbytes in this row's dtype, timed in the same run
    pct_copy: float | None = None  # 100 * copy_ms / ms: this row's speed as a % of that copy's
    speedup: float | None = None
    baseline: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def bandwidth_result(
    *, op: str, case: str, dtype: torch.dtype, shape: str, numel: int, impl: str, device: str, ms: float,
    nbytes: int, copy_ms: float | None = None, baseline: str | None = None, baseline_ms: float | None = None,
    copy_bps: float | None = None,
) -> Result:
    """A Result with TB/s, speedup and, given the time of a copy of the same bytes (``time_beside_copy``), % of
    copy filled in from a byte count and a time; without ``copy_ms``, ``main`` times that copy after the cases.
    ``copy_bps`` (the large copy's bandwidth) is not used: accepted until the benches that still pass it stop."""
    del copy_bps
    return Result(
        op=op, case=case, dtype=DTYPE_NAMES.get(dtype, str(dtype)), shape=shape, numel=numel, impl=impl,
        device=device, ms=ms, nbytes=nbytes, tbps=tbps(nbytes, ms), copy_ms=copy_ms,
        pct_copy=None if copy_ms is None else pct_of_copy(copy_ms, ms),
        speedup=None if baseline_ms is None else speedup(baseline_ms, ms), baseline=baseline,
    )


# ----------------------------------------------------------------------------------------------- output


def _device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:  # /proc/cpuinfo names the CPU model on Linux; platform.processor() is often empty there
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _command_line() -> str:
    """How this run was started, as one would retype it (``python -m pkg.mod`` when run as a module)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = ["-m", spec.name] if spec is not None else [sys.argv[0]]
    return shlex.join([Path(sys.executable).name, *head, *sys.argv[1:]])


def environment(device: str) -> dict[str, Any]:
    """Everything RESULTS.md needs to say where a number came from."""
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "device_name": _device_name(device),
        "gpu": _device_name("cuda") if device == "cuda" else None,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "command": _command_line(),
    }
    try:
        import torchops

        info["torchops_build"] = torchops.build_info()
    except Exception as e:  # record why instead of failing the whole run over metadata
        info["torchops_build"] = f"unavailable: {e!r}"
    if device == "cuda":
        info["timer"] = "triton.testing.do_bench" if _triton_do_bench() else "cuda events"
        try:
            import triton

            info["triton"] = triton.__version__
        except Exception:
            info["triton"] = None
    else:
        info["timer"] = "torch.utils.benchmark.Timer.blocked_autorange"
    return info


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "–" if x is None else f"{x:{spec}}{suffix}"


def markdown_table(results: Sequence[Result], *, ratios_only: bool) -> str:
    """Long-format table; absolute times/bandwidths are left out when ``ratios_only`` (CPU runs)."""
    cols = ["op", "case", "dtype", "shape", "impl"]
    if not ratios_only:
        cols += ["time (µs)", "TB/s"]
    cols += ["% copy", "speedup"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in results:
        row = [r.op, r.case, r.dtype, r.shape, r.impl]
        if not ratios_only:  # a peak-memory row has no time: its peak stands there
            time = f"{r.extra['peak_mib']:.0f} MiB peak" if "peak_mib" in r.extra else _fmt(r.ms * 1e3, ".2f")
            row += [time, _fmt(r.tbps, ".3f")]
        vs = "–" if r.speedup is None else f"{r.speedup:.3f}× vs {r.baseline}"
        row += [_fmt(r.pct_copy, ".1f", "%"), vs]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _plot(results: Sequence[Result], path: Path, *, ratios_only: bool, title: str, copy_tbps: float | None) -> bool:
    """Bandwidth (GPU) or speedup (CPU) against size, one panel per (op, case). False if matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # headless machines have no display
        import matplotlib.pyplot as plt
    except Exception:
        return False
    metric = "speedup" if ratios_only else "tbps"
    panels: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        # In ratio plots the baseline is the flat line at 1 drawn below, not a curve of its own.
        if getattr(r, metric) is not None and not (ratios_only and r.impl == r.baseline):
            panels.setdefault((r.op, r.case), []).append(r)
    panels = {k: v for k, v in panels.items() if len({r.shape for r in v}) >= 2}  # a single point is no curve
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, ((op, case), rows) in zip(axes[0], panels.items()):
        # Shapes of equal size (an M x N grid at one element count) would stack on a size axis: then the x
        # axis is the shapes themselves, in order of size and of first measurement.
        by_shape = len({r.shape for r in rows}) > len({r.numel for r in rows})
        shapes_by_size = dict.fromkeys(r.shape for r in sorted(rows, key=lambda r: r.numel))
        order = {shape: i for i, shape in enumerate(shapes_by_size)}
        lines: dict[str, list[Result]] = {}
        for r in rows:
            lines.setdefault(f"{r.impl} {r.dtype}", []).append(r)
        for label, pts in sorted(lines.items()):
            pts.sort(key=lambda r: order[r.shape] if by_shape else r.numel)
            xs = [order[r.shape] for r in pts] if by_shape else [r.numel for r in pts]
            ax.plot(xs, [getattr(r, metric) for r in pts], marker="o", label=label)
        ref = (1.0, f"{rows[0].baseline} (baseline)") if ratios_only else (copy_tbps, "device copy")
        if ref[0] is not None:
            ax.axhline(ref[0], color="black", linestyle="--", linewidth=1, label=ref[1])
        if by_shape:
            ax.set_xticks(range(len(order)), list(order), rotation=45, ha="right", fontsize=7)
        else:
            ax.set_xscale("log", base=2)
        ax.set_title(f"{op} {case}")
        ax.set_xlabel("shape" if by_shape else "elements")
        ax.set_ylabel("speedup vs baseline" if ratios_only else "TB/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def emit(
    results: Sequence[Result],
    name: str,
    *,
    out_dir: Path | None = None,
    summary: str = "",
    meta: dict[str, Any] | None = None,
    ratios_only: bool | None = None,
    bars: Sequence[Verdict] | None = None,
    bars_note: str = "",
) -> None:
    """Write ``<out_dir>/<name>.json`` (+ ``.png`` when matplotlib imports), then print the Markdown table.

    The table (then ``summary``, then the bar verdicts or ``bars_note``) is printed last so it is what a
    reader sees at the end of the log. ``ratios_only`` defaults to True when every result is from the CPU
    (CPU numbers are ratios: the machines are small and shared).
    """
    out_dir = Path(out_dir) if out_dir is not None else RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    device = "cuda" if any(r.device == "cuda" for r in results) else "cpu"
    if ratios_only is None:
        ratios_only = device == "cpu"
    env = environment(device)
    doc = {
        "name": name,
        "env": env,
        "ratios_only": ratios_only,
        "meta": meta or {},
        "summary": summary,
        "bars": [dataclasses.asdict(v) for v in bars or ()],
        "bars_note": bars_note,
        "results": [dataclasses.asdict(r) for r in results],
    }
    json_path = out_dir / f"{name}.json"
    json_path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"wrote {json_path}", file=sys.stderr)
    png_path = out_dir / f"{name}.png"
    try:  # the plot is a convenience: it must never cost the measured numbers or the exit status
        title = f"{name} on {env['device_name']}"
        copy_tbps = (meta or {}).get("copy_tbps")  # drawn as the roofline of bandwidth plots
        if _plot(results, png_path, ratios_only=ratios_only, title=title, copy_tbps=copy_tbps):
            print(f"wrote {png_path}", file=sys.stderr)
    except Exception as e:
        print(f"plot skipped: {e!r}", file=sys.stderr)
    sys.stderr.flush()  # keep the table after the file notices in a combined log
    print(f"\n## {name} — {env['device_name']}, torch {env['torch']}, {env['date']}\n")
    print(markdown_table(results, ratios_only=ratios_only))
    if summary:
        print(f"\n{summary}")
    if bars or bars_note:
        print("\n" + format_bars(bars or (), bars_note))
    sys.stdout.flush()


# ------------------------------------------------------------------------------------------------- bars


@dataclasses.dataclass
class Verdict:
    """One bar judged for one dtype: ``status`` is "ok", "MISSED" or "NO DATA" (rows the bar needs are absent)."""

    bar: str
    dtype: str
    status: str
    detail: str


def _bar_value(bar: Any, row: Result, index: dict[tuple, Result]) -> tuple[float | None, str]:
    """The bar's metric on one of torchops' rows, and what it was measured against; None and what did not run
    (the absent peers, or the copy of the same bytes) when the metric has no value."""
    if bar.metric == "pct_copy":
        return row.pct_copy, SAME_BYTES_COPY
    peers = bar.peers if bar.metric == "vs best peer" else (bar.metric.removeprefix("vs "),)
    others = {p: index.get((row.op, row.case, row.dtype, row.shape, p)) for p in peers}
    absent = [p for p, r in others.items() if r is None]
    if absent or not row.ms:
        return None, ", ".join(absent)
    best = min(others, key=lambda p: others[p].ms)  # the fastest peer sets the ratio
    return others[best].ms / row.ms, best


def check_bars(results: Sequence[Result], op: str, device: str, bars: Sequence[Any] | None = None) -> list[Verdict]:
    """Judge ``op``'s bars for ``device`` (``benchmarks/bars.py``, unless ``bars`` is given) on these results.

    Every (case, dtype, shape, peer) a bar names must have been measured; what is absent is reported as NO DATA
    rather than passing quietly.
    """
    if bars is None:
        bars = bar_table.bars_for(op, device)
    index = {(r.op, r.case, r.dtype, r.shape, r.impl): r for r in results}
    verdicts: list[Verdict] = []
    for bar in bars:
        for dtype in bar.dtypes:
            itemsize = DTYPES[dtype].itemsize if dtype in DTYPES else 0
            values: list[tuple[float, Result, str]] = []
            missing: list[str] = []
            for case in bar.cases:
                rows = [r for r in results if r.op == bar.op and r.case == case and r.dtype == dtype
                        and r.impl == bar.impl and (r.nbytes or 0) >= bar.min_nbytes
                        and bar.selects(r.shape, itemsize)]  # with the metric's own size rule
                found: dict[str, tuple[float, Result, str]] = {}
                lacking: dict[str, str] = {}
                for r in rows:
                    v, against = _bar_value(bar, r, index)
                    if v is None:
                        lacking[r.shape] = against
                    else:
                        found[r.shape] = (v, r, against)
                if bar.shapes:
                    wanted = [s for s in bar.shapes if bar.selects(s, itemsize)]
                else:
                    wanted = sorted(found.keys() | lacking.keys()) or ["any size"]  # a peer absent anywhere counts
                absent = [s for s in wanted if s not in found]
                for why in dict.fromkeys(lacking.get(s, "") for s in absent):  # one phrase per reason
                    where = [s for s in absent if lacking.get(s, "") == why]
                    what = f"{case} " + ("every shape" if len(where) == len(wanted) > 1 else ", ".join(where))
                    missing.append(f"{what} ({why} not run)" if why else what)
                values += [found[s] for s in wanted if s in found]
            unit = "%" if bar.metric == "pct_copy" else "x"
            if missing:
                verdicts.append(Verdict(bar.label, dtype, "NO DATA", "not measured: " + "; ".join(missing)))
                continue
            if not values:  # the filters select nothing for this dtype: the bar does not apply to it
                continue
            worst_v, worst, against = min(values, key=lambda vr: vr[0])
            at = f"{worst.case} {worst.shape}" + (f" vs {against}" if bar.metric == "vs best peer" else "")
            if bar.reduce == "geomean":
                got = geomean(v for v, _, _ in values)
                detail = f"geomean {got:.3f}{unit} over {len(values)} (worst {worst_v:.3f}{unit} at {at})"
                met = got >= bar.at_least
            else:
                detail = f"worst {worst_v:.3f}{unit} at {at}" + (f" ({len(values)} cases)" if len(values) > 1 else "")
                short = [(v, r) for v, r, _ in values if v < bar.at_least]
                met = not short
                if bar.tolerate is not None and short:
                    floor, count = bar.tolerate
                    met = len(short) <= count and all(v >= floor for v, _ in short)
                    detail += (f"; {len(short)} below {bar.at_least:g}{unit} (allowed: {count} at >= {floor:g}{unit}): "
                               + ", ".join(f"{r.case} {r.shape} {v:.3f}{unit}" for v, r in short))
            verdicts.append(Verdict(bar.label, dtype, "ok" if met else "MISSED", detail))
    return verdicts


def format_bars(verdicts: Sequence[Verdict], note: str = "") -> str:
    lines = ["Bars (benchmarks/bars.py):"]
    if note:
        lines.append(f"  {note}")
    for v in verdicts:
        lines.append(f"  [{v.status}] {v.bar} ({v.dtype}): {v.detail}")
    if verdicts and not note:
        bad = sum(v.status != "ok" for v in verdicts)
        lines.append(f"  {len(verdicts) - bad}/{len(verdicts)} met" + (f", {bad} NOT MET" if bad else ""))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- main


@dataclasses.dataclass
class Context:
    """What a bench's cases get besides the parsed options: the large copy's bandwidth (the plots' roofline) and a
    place to report failures."""

    device: str
    quick: bool
    copy_bps: float | None = None
    failures: list[str] = dataclasses.field(default_factory=list)

    def fail(self, what: str) -> None:
        """Record a wrong result (or other failure) and carry on measuring; the run will exit non-zero."""
        print(f"FAILED: {what}", file=sys.stderr, flush=True)
        self.failures.append(what.splitlines()[0] if what.strip() else what)


@dataclasses.dataclass
class Bench:
    """What a ``bench_<op>.py`` declares; ``main`` does everything else.

    run              (args, ctx) -> the Result rows; may be a generator, so rows measured before a failure count
    largest_operand  (args) -> bytes of the largest tensor read, so the copy buffer is at least as large
    add_arguments    adds the script's own options to the shared parser
    check_arguments  (parser, args): validates/converts them (call parser.error on bad input)
    summarize        (results, args, ctx) -> one line for the log, after the table
    meta             (args) -> extra fields for the JSON
    copy_reference   False: the op reports no bandwidth, so no large copy is measured
    more_ops         other ops whose rows the bench also measures; their bars are checked too. Such a bench takes
                     --ops (a subset of its ops, read from args.ops; the others' bars are then not checked)
    name             the bench's name in file names and messages (default: op)
    """

    op: str
    run: Callable[[argparse.Namespace, Context], Iterable[Result]]
    description: str = ""  # --help's text; default: the first paragraph of the module that defines run
    largest_operand: Callable[[argparse.Namespace], int] = lambda args: 0
    default_dtypes: Sequence[str] = ("f32", "bf16", "f16")
    cpu_dtypes: Sequence[str] | None = None  # the CPU's dtypes without --dtypes (default: default_dtypes)
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    check_arguments: Callable[[argparse.ArgumentParser, argparse.Namespace], None] | None = None
    summarize: Callable[[Sequence[Result], argparse.Namespace, Context], str] | None = None
    meta: Callable[[argparse.Namespace], dict[str, Any]] | None = None
    copy_reference: bool = True
    more_ops: Sequence[str] = ()
    name: str = ""

    @property
    def ops(self) -> tuple[str, ...]:
        return (self.op, *self.more_ops)


def check_all_bars(results: Sequence[Result], ops: Sequence[str], device: str) -> list[Verdict]:
    """``check_bars`` for each op a bench measures, in order."""
    return [v for op in ops for v in check_bars(results, op, device)]


def copy_result(device: str, nbytes: int, *, quick: bool = False) -> tuple[Result, float]:
    """The copy reference row (``dst.copy_(src)`` of ``nbytes``) and its bandwidth in bytes/s."""
    bps = copy_bandwidth(device, nbytes, quick=quick)
    ms = 2 * nbytes / bps * 1e3
    row = Result(op="copy_", case="copy", dtype="u8", shape=f"{nbytes >> 20} MiB", numel=nbytes,
                 impl="dst.copy_(src)", device=device, ms=ms, nbytes=2 * nbytes, tbps=bps / 1e12, copy_ms=ms,
                 pct_copy=100.0)
    return row, bps


def main(bench: Bench, argv: Sequence[str] | None = None) -> int:
    """Parse, measure the large copy, run the cases, time the copies of the same bytes the cases did not time
    beside them, write and print the results, check the bars.

    Exit status: 0 when every bar of the bench's ops on this device is met (or bars were skipped on request and
    nothing failed), 1 on a missed bar, a bar without data, a wrong result or an error while measuring (the rows
    measured before it are kept), 2 when torchops is not built.
    """
    name = bench.name or bench.op
    description = bench.description or (sys.modules[bench.run.__module__].__doc__ or "").split("\n\n")[0]
    parser = make_parser(description, bench.default_dtypes, bench.cpu_dtypes)
    parser.add_argument("--no-bars", action="store_true", help="measure only; do not check benchmarks/bars.py")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print each timed implementation's N costliest kernels (torch.profiler) on stderr")
    parser.add_argument("--memory-breakdown", type=int, default=0, metavar="N",
                        help="where a bench measures a CUDA peak, print the N largest sources of what was live at it")
    if bench.more_ops:
        parser.add_argument("--ops", default=",".join(bench.ops),
                            help="comma-separated subset of the ops to measure (default: %(default)s)")
    if bench.add_arguments is not None:
        bench.add_arguments(parser)
    args = parse_args(parser, argv)
    if bench.more_ops:
        args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
        if not args.ops or set(args.ops) - set(bench.ops):
            parser.error(f"--ops: a comma-separated subset of {','.join(bench.ops)}")
        args.ops = [o for o in bench.ops if o in args.ops]
    else:
        args.ops = [bench.op]
    if bench.check_arguments is not None:
        bench.check_arguments(parser, args)
    global PROFILE_ROWS, MEMORY_ROWS
    PROFILE_ROWS, MEMORY_ROWS = args.profile, args.memory_breakdown
    try:
        import torchops  # noqa: F401
    except ImportError as e:
        print(f"torchops is not importable ({e}); build it first (see README / `make`).", file=sys.stderr)
        return 2

    ctx = Context(device=args.device, quick=args.quick)
    results: list[Result] = []
    meta: dict[str, Any] = {"bench": name, "op": bench.op, "ops": args.ops, "quick": args.quick}
    if bench.copy_reference:
        # Far past the caches, and at least as large as the largest operand.
        floor = GPU_COPY_MIN_BYTES if args.device == "cuda" else CPU_COPY_MIN_BYTES
        copy_bytes = max(floor, bench.largest_operand(args))
        row, ctx.copy_bps = copy_result(args.device, copy_bytes, quick=args.quick)
        results.append(row)
        meta.update(copy_bytes=copy_bytes, copy_tbps=ctx.copy_bps / 1e12)
    try:
        for r in bench.run(args, ctx):
            results.append(r)
    except AssertionError as e:  # a wrong result: keep what was measured, fail at the end
        ctx.fail(f"wrong result: {e}")
    except Exception as e:  # e.g. an op with no kernel for this device: keep what was measured, fail at the end
        traceback.print_exc()
        ctx.fail(f"{type(e).__name__}: {e}")
    for op in args.ops:
        if not any(r.op == op for r in results):
            ctx.fail(f"no {op} case ran")
    fill_same_bytes_copies(results, args.device, quick=args.quick)

    if args.quick:
        verdicts, note = [], "NOT CHECKED: --quick measures small sizes only, where the bars do not apply"
    elif args.no_bars:
        verdicts, note = [], "NOT CHECKED: --no-bars"
    else:
        verdicts, note = check_all_bars(results, meta["ops"], args.device), ""
    if bench.meta is not None:
        meta.update(bench.meta(args))
    summary = bench.summarize(results, args, ctx) if bench.summarize is not None else ""
    emit(results, f"{name}_{args.device}" + ("_quick" if args.quick else ""), out_dir=args.out_dir,
         summary=summary, meta=meta, bars=verdicts, bars_note=note)
    return _verdict(name, verdicts, ctx.failures)


def _verdict(name: str, verdicts: Sequence[Verdict], failures: Sequence[str]) -> int:
    problems = list(failures) + [f"{v.status}: {v.bar} ({v.dtype})" for v in verdicts if v.status != "ok"]
    if problems:
        print(f"\n{name}: FAILED\n" + "\n".join(f"  {p}" for p in problems), flush=True)
        return 1
    return 0


def load(path: Path) -> tuple[dict[str, Any], list[Result]]:
    """A JSON written by ``emit``: the whole document and its rows as Results."""
    doc = json.loads(Path(path).read_text())
    return doc, [Result(**r) for r in doc["results"]]


def _rerender(paths: Sequence[str]) -> int:
    """Print each JSON's table and bar verdicts again and redraw its PNG beside it; non-zero if a bar fails."""
    rc = 0
    for path in map(Path, paths):
        doc, results = load(path)
        env = doc["env"]
        meta = doc.get("meta", {})
        op = meta.get("op") or doc["name"].split("_cuda")[0].split("_cpu")[0]
        print(f"\n## {doc['name']} — {env['device_name']}, torch {env['torch']}, {env['date']}\n")
        print(f"Command: `{env['command']}`\n")
        print(markdown_table(results, ratios_only=doc["ratios_only"]))
        if doc.get("summary"):
            print(f"\n{doc['summary']}")
        quick = meta.get("quick", doc["name"].endswith("_quick"))
        verdicts = [] if quick else check_all_bars(results, meta.get("ops") or [op], env["device"])
        print("\n" + format_bars(verdicts, "NOT CHECKED: a --quick run" if quick else ""))
        title = f"{doc['name']} on {env['device_name']}"
        if _plot(results, path.with_suffix(".png"), ratios_only=doc["ratios_only"], title=title,
                 copy_tbps=meta.get("copy_tbps")):
            print(f"wrote {path.with_suffix('.png')}", file=sys.stderr)
        rc |= _verdict(meta.get("bench") or op, verdicts, [])
    return rc


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(2)
    sys.exit(_rerender(sys.argv[1:]))
