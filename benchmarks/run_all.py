"""Run every ``benchmarks/bench_*.py`` with the same arguments; exit non-zero if any of them fails.

A bench fails on a wrong result, a missed bar of ``benchmarks/bars.py`` or a bar whose cases did not run;
``--quick`` (small sizes, a smoke run) skips the bars and says so in each bench's output.

One entry point for ``make bench`` and ``scripts/gpu_check.sh``:

    python benchmarks/run_all.py [--device cuda|cpu] [--quick] [--dtypes ...] [--out-dir DIR]
    python -m benchmarks.run_all ...
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
    scripts = sorted(BENCH_DIR.glob("bench_*.py"))
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
