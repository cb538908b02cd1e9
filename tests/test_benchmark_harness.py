"""The benchmark harness: its CPU timer (on a fake clock, so no assertion depends on how busy the machine
is) and its bar checks (a missed bar and a bar without data both fail)."""
import itertools
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness as H  # noqa: E402
from benchmarks.bars import BARS, Bar  # noqa: E402


class FakeClock:
    """A clock that moves only when a timed function says it took time."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(H, "CLOCK", fake)
    return fake


def test_cpu_times_interleave_the_functions_and_measure_one_call(clock):
    calls: list[str] = []

    def taking(name: str, seconds: float):
        def fn():
            calls.append(name)
            clock.now += seconds
        return fn

    times = H.time_all_ms({"short": taking("short", 0.001), "long": taking("long", 0.004)}, "cpu", quick=True)

    assert times == pytest.approx({"short": 1.0, "long": 4.0}, rel=1e-9)  # ms per call, not per block
    # Each round times every function in a stretch of calls: one stretch per round and function, not all
    # of one function's rounds before the other's (warm-up calls alternate one by one).
    timed = [name for name, stretch in itertools.groupby(calls) if len(list(stretch)) >= 3]
    assert timed == ["short", "long"] * H.CPU_ROUNDS_QUICK
    assert calls[:6] == ["short", "long"] * 3  # the warm-up alternates call by call


def test_single_function_cpu_time_goes_through_the_same_timer(clock):
    def fn():
        clock.now += 0.002

    assert H.time_ms(fn, "cpu", quick=True) == pytest.approx(2.0, rel=1e-9)


def _rows(op: str, case: str, dtype: str, shape: str, ms: dict[str, float], pct_copy: float | None = None,
          nbytes: int | None = None) -> list[H.Result]:
    return [H.Result(op=op, case=case, dtype=dtype, shape=shape, numel=1, impl=impl, device="cuda", ms=t,
                     nbytes=nbytes, pct_copy=pct_copy if impl == "torchops" else None) for impl, t in ms.items()]


BAR = Bar("toy", "cuda", "vs eager", 0.99, ("fwd", "bwd"), ("f32",), "test", shapes=("8x8",))


def test_bar_met_missed_and_without_data():
    met = _rows("toy", "fwd", "f32", "8x8", {"eager": 1.0, "torchops": 1.0}) + \
        _rows("toy", "bwd", "f32", "8x8", {"eager": 2.0, "torchops": 1.9})
    assert [v.status for v in H.check_bars(met, "toy", "cuda", [BAR])] == ["ok"]

    slow = _rows("toy", "fwd", "f32", "8x8", {"eager": 1.0, "torchops": 1.02}) + met[2:]
    (verdict,) = H.check_bars(slow, "toy", "cuda", [BAR])
    assert verdict.status == "MISSED" and "fwd 8x8" in verdict.detail

    # The bwd case did not run, and fwd ran at another shape only: neither may pass quietly.
    partial = _rows("toy", "fwd", "f32", "4x4", {"eager": 1.0, "torchops": 0.5})
    (verdict,) = H.check_bars(partial, "toy", "cuda", [BAR])
    assert verdict.status == "NO DATA"
    assert "fwd 8x8" in verdict.detail and "bwd 8x8" in verdict.detail


def test_bar_geomean_and_size_floor():
    bar = Bar("toy", "cuda", "pct_copy", 90.0, ("fwd",), ("bf16",), "test", reduce="geomean", min_nbytes=100)
    rows = (_rows("toy", "fwd", "bf16", "big", {"torchops": 1.0}, pct_copy=95.0, nbytes=200)
            + _rows("toy", "fwd", "bf16", "huge", {"torchops": 1.0}, pct_copy=88.0, nbytes=400)
            + _rows("toy", "fwd", "bf16", "small", {"torchops": 1.0}, pct_copy=10.0, nbytes=50))  # below the floor
    (verdict,) = H.check_bars(rows, "toy", "cuda", [bar])
    assert verdict.status == "ok", verdict  # geomean(95, 88) = 91.4; the small input does not count
    (verdict,) = H.check_bars(rows[1:], "toy", "cuda", [bar])
    assert verdict.status == "MISSED"  # 88% alone
    (verdict,) = H.check_bars(rows[2:], "toy", "cuda", [bar])
    assert verdict.status == "NO DATA"  # only an input below the floor ran


def test_main_exits_non_zero_on_a_missed_bar_and_on_a_wrong_result(tmp_path, monkeypatch):
    monkeypatch.setattr(H, "copy_bandwidth", lambda device, nbytes, quick=False: 1e10)
    bars = [Bar("toy", "cpu", "vs eager", 1.0, ("fwd",), ("f32",), "test")]
    monkeypatch.setattr("benchmarks.bars.BARS", bars)  # what bar_table.bars_for reads

    def run_with(ms_ours: float, wrong: bool = False):
        def run(args, ctx):
            yield from (H.Result(op="toy", case="fwd", dtype="f32", shape="4", numel=4, impl=impl, device="cpu",
                                 ms=t) for impl, t in (("eager", 1.0), ("torchops", ms_ours)))
            if wrong:
                raise AssertionError("Tensor-likes are not close!")
        return H.Bench(op="toy", description="toy", run=run)

    # --threads: parse_args sets the process's thread count; leave this test process's as it was.
    argv = ["--device", "cpu", "--out-dir", str(tmp_path), "--threads", str(torch.get_num_threads())]
    assert H.main(run_with(0.5), argv) == 0
    assert H.main(run_with(2.0), argv) == 1  # 0.5x eager
    assert H.main(run_with(0.5, wrong=True), argv) == 1
    assert H.main(run_with(2.0), argv + ["--quick"]) == 0  # bars skipped, and the output says so
    assert H.main(run_with(2.0), argv + ["--no-bars"]) == 0
    doc, _ = H.load(tmp_path / "toy_cpu.json")
    assert doc["bars_note"].startswith("NOT CHECKED")


def test_every_bar_names_a_known_metric_and_reduction():
    for bar in BARS:
        assert bar.device in ("cuda", "cpu"), bar
        assert bar.metric == "pct_copy" or bar.metric.startswith("vs "), bar
        assert bar.reduce in ("min", "geomean"), bar
        assert bar.cases and bar.dtypes and bar.at_least > 0 and bar.why, bar
