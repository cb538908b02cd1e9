"""The benchmark harness's CPU timer: the functions it compares are timed in turns, and each time is one call's."""
import itertools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness as H  # noqa: E402


def test_cpu_times_interleave_the_functions_and_measure_one_call():
    calls: list[str] = []

    def sleeper(name: str, seconds: float):
        def fn():
            calls.append(name)
            time.sleep(seconds)
        return fn

    times = H.time_all_ms({"short": sleeper("short", 0.001), "long": sleeper("long", 0.004)}, "cpu", quick=True)

    assert set(times) == {"short", "long"}
    assert 0.9 <= times["short"] < 4.0  # ms: a sleep never ends early; a loaded machine may add some
    assert 3.6 <= times["long"] < 10.0
    # Each round times every function in a stretch of calls: one stretch per round and function, not all
    # of one function's rounds before the other's (warm-up calls alternate one by one).
    timed = [name for name, stretch in itertools.groupby(calls) if len(list(stretch)) >= 3]
    assert timed == ["short", "long"] * H.CPU_ROUNDS_QUICK


def test_single_function_cpu_time_goes_through_the_same_timer():
    assert 1.8 <= H.time_ms(lambda: time.sleep(0.002), "cpu", quick=True) < 6.0
