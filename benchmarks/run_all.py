"""Run every ``benchmarks/bench_*.py`` with the same arguments; exit non-zero if any of them fails.

A bench fails on a wrong result, a missed bar of ``benchmarks/bars.py`` or a bar whose cases did not run;
``--quick`` (small sizes, a smoke run) skips the bars and says so in each bench's output.

One entry point for ``make bench`` and ``scripts/gpu_check.sh``:

    python benchmarks/run_all.py [--only vector_add,layer_norm] [--device cuda|cpu] [--quick] [--dtypes ...]
                                 [--out-dir DIR]
    python -m benchmarks.run_all ...

``--only`` takes op names or bench names (``bench_norm.py`` is "norm" and measures rms_norm, add_rms_norm and
layer_norm): a bench of several ops named by some of its ops alone measures those (its ``--ops``). Every other
argument is passed to each bench.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

BENCH_DIR = Path(__file__).resolve().parent


def bench_ops(script: Path) -> tuple[str, ...]:
    """The ops a bench script measures, from its ``BENCH`` declaration."""
    if str(BENCH_DIR.parent) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR.parent))
    return importlib.import_module(f"benchmarks.{script.stem}").BENCH.ops


def select(scripts: Sequence[Path], only: set[str]) -> list[tuple[Path, list[str]]] | str:
    """The scripts ``--only`` names, each with the ``--ops`` arguments it then takes (none: all its ops); or what
    names no bench."""
    chosen: list[tuple[Path, list[str]]] = []
    known: set[str] = set()
    for script in scripts:
        name, ops = script.stem.removeprefix("bench_"), bench_ops(script)
        known |= {name, *ops}
        picked = [op for op in ops if op in only]
        if name in only or len(picked) == len(ops):
            chosen.append((script, []))
        elif picked:
            chosen.append((script, ["--ops", ",".join(picked)]))
    unknown = only - known
    return f"--only: no bench for {sorted(unknown)}" if unknown else chosen


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
    runs: list[tuple[Path, list[str]]] | str = [(s, []) for s in sorted(BENCH_DIR.glob("bench_*.py"))]
    if only:
        runs = select([s for s, _ in runs], only)
        if isinstance(runs, str):
            print(runs, file=sys.stderr)
            return 2
    if not runs:
        print(f"no bench_*.py under {BENCH_DIR}", file=sys.stderr)
        return 1
    failed: list[str] = []
    for script, ops_args in runs:
        script_args = [*ops_args, *args]
        print(f"\n=== {script.stem} {' '.join(script_args)} ===", flush=True)
        t0 = time.perf_counter()
        # A fresh interpreter per bench: one op's crash or CUDA error cannot poison the others' numbers.
        # `-m` from the repo root imports the package `benchmarks` the same way for every script.
        rc = subprocess.call([sys.executable, "-m", f"benchmarks.{script.stem}", *script_args],
                             cwd=BENCH_DIR.parent)
        print(f"=== {script.stem}: exit {rc} in {time.perf_counter() - t0:.0f} s ===", flush=True)
        if rc != 0:
            failed.append(f"{script.stem} (exit {rc})")
    if failed:
        print(f"\nFAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"\nall {len(runs)} benchmark(s) passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
