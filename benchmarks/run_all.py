"""Run every ``benchmarks/bench_*.py`` with the same arguments; exit non-zero if any of them fails.

A bench fails on a wrong result, a missed bar of ``benchmarks/bars.py`` or a bar whose cases did not run;
``--quick`` (small sizes, a smoke run) skips the bars and says so in each bench's output.

One entry point for ``make bench`` and ``scripts/gpu_check.sh``:

    python benchmarks/run_all.py [--only vector_add,swiglu] [--device cuda|cpu] [--quick] [--dtypes ...] [--out-dir DIR]
    python -m benchmarks.run_all ...

Every argument but ``--only`` is passed to each bench.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

BENCH_DIR = Path(__file__).resolve().parent


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    only: set[str] = set()
    while "--only" in args:
        i = args.index("--only")
        if i + 1 >= len(args):
            print("--only needs a comma-separated list of ops", file=sys.stderr)
            return 2
        only |= {name.strip() for name in args[i + 1].split(",") if name.strip()}
        del args[i:i + 2]
    scripts = sorted(BENCH_DIR.glob("bench_*.py"))
    if only:
        unknown = only - {s.stem.removeprefix("bench_") for s in scripts}
        if unknown:
            print(f"--only: no bench for {sorted(unknown)}", file=sys.stderr)
            return 2
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in only]
    if not scripts:
        print(f"no bench_*.py under {BENCH_DIR}", file=sys.stderr)
        return 1
    failed: list[str] = []
    for script in scripts:
        print(f"\n=== {script.stem} {' '.join(args)} ===", flush=True)
        t0 = time.perf_counter()
        # A fresh interpreter per op: one op's crash or CUDA error cannot poison the others' numbers.
        # `-m` from the repo root imports the package `benchmarks` the same way for every script.
        rc = subprocess.call([sys.executable, "-m", f"benchmarks.{script.stem}", *args], cwd=BENCH_DIR.parent)
        print(f"=== {script.stem}: exit {rc} in {time.perf_counter() - t0:.0f} s ===", flush=True)
        if rc != 0:
            failed.append(f"{script.stem} (exit {rc})")
    if failed:
        print(f"\nFAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"\nall {len(scripts)} benchmark(s) passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
