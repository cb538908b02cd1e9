"""The benchmark harness: its CPU timer (on a fake clock, so no assertion depends on how busy the machine
is), its bar checks (a missed bar and a bar without data both fail), and benches that produce every case
their bars name."""
import itertools
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness as H  # noqa: E402
from benchmarks.bars import BARS, NORM_SHAPES, Bar, bars_for  # noqa: E402


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


def test_cuda_times_interleave_rounds_and_take_the_median(monkeypatch):
    # No GPU needed: time_ms stands in for do_bench. A host whose state drifts (here: one slow round for
    # "a") must not decide the comparison, and every round times every function with its share of the budget.
    calls: list[tuple[str, int]] = []
    results = {"a": iter([5.0, 1.0, 1.2]), "b": iter([2.0, 2.1, 1.9])}

    def fake_time_ms(fn, device, *, quick=False, share=1):
        name = fn()
        calls.append((name, share))
        return next(results[name])

    monkeypatch.setattr(H, "time_ms", fake_time_ms)
    monkeypatch.setattr(H, "CUDA_ROUNDS", 3)
    times = H.time_all_ms({"a": lambda: "a", "b": lambda: "b"}, "cuda")
    assert times == {"a": 1.2, "b": 2.0}
    assert calls == [("a", 3), ("b", 3)] * 3


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


def test_best_peer_is_the_fastest_peer_and_every_peer_must_have_run():
    bar = Bar("toy", "cuda", "vs best peer", 1.0, ("fwd",), ("f32",), "test", shapes=("8x8",),
              peers=("eager", "compiled", "liger"))
    rows = _rows("toy", "fwd", "f32", "8x8", {"eager": 3.0, "compiled": 1.1, "liger": 2.0, "torchops": 1.0})
    (verdict,) = H.check_bars(rows, "toy", "cuda", [bar])
    assert verdict.status == "ok" and "1.100x" in verdict.detail and "vs compiled" in verdict.detail
    rows = _rows("toy", "fwd", "f32", "8x8", {"eager": 3.0, "compiled": 1.1, "liger": 0.9, "torchops": 1.0})
    (verdict,) = H.check_bars(rows, "toy", "cuda", [bar])
    assert verdict.status == "MISSED" and "vs liger" in verdict.detail  # beating two peers of three is not enough
    # A peer that did not run (Liger not installed) leaves the bar unjudged, and the verdict names it.
    rows = _rows("toy", "fwd", "f32", "8x8", {"eager": 3.0, "compiled": 1.1, "torchops": 1.0})
    (verdict,) = H.check_bars(rows, "toy", "cuda", [bar])
    assert verdict.status == "NO DATA" and "liger not run" in verdict.detail


def test_tolerance_lets_a_few_rows_fall_just_short():
    bar = Bar("toy", "cuda", "vs eager", 1.0, ("fwd",), ("f32",), "test", tolerate=(0.98, 2))
    def run(ratios):
        rows = [r for i, v in enumerate(ratios) for r in _rows("toy", "fwd", "f32", f"{i + 1}x8",
                                                               {"eager": v, "torchops": 1.0})]
        (verdict,) = H.check_bars(rows, "toy", "cuda", [bar])
        return verdict
    assert run([1.1, 0.99, 0.985, 1.0]).status == "ok"  # two shapes within the tolerance
    assert run([1.1, 0.99, 0.985, 0.99]).status == "MISSED"  # three
    missed = run([1.1, 0.97, 1.0])  # one, but below the tolerance's floor
    assert missed.status == "MISSED" and "2x8 0.970x" in missed.detail


def test_shape_filters_select_by_row_length_and_input_size():
    bar = Bar("toy", "cuda", "pct_copy", 85.0, ("fwd",), ("bf16", "f32"), "test",
              shapes=("64x1024", "32x4096", "8x65536"), n_range=(1024, 16384), min_input_bytes=256 * 1024)
    # 64x1024 is 128 KiB in bf16 (below the floor), 256 KiB in f32; 8x65536 is past the N range in both.
    assert [s for s in bar.shapes if bar.selects(s, 2)] == ["32x4096"]
    assert [s for s in bar.shapes if bar.selects(s, 4)] == ["64x1024", "32x4096"]
    rows = []
    for dt in ("bf16", "f32"):
        rows += _rows("toy", "fwd", dt, "64x1024", {"torchops": 1.0}, pct_copy=50.0)  # only counts in f32
        rows += _rows("toy", "fwd", dt, "32x4096", {"torchops": 1.0}, pct_copy=90.0)
        rows += _rows("toy", "fwd", dt, "8x65536", {"torchops": 1.0}, pct_copy=10.0)  # never counts
    bf16, f32 = H.check_bars(rows, "toy", "cuda", [bar])
    assert bf16.status == "ok" and f32.status == "MISSED" and "64x1024" in f32.detail
    # A selected shape that did not run is missing data; an unselected one is not.
    (bf16, f32) = H.check_bars([r for r in rows if r.shape != "64x1024"], "toy", "cuda", [bar])
    assert bf16.status == "ok" and f32.status == "NO DATA" and "fwd 64x1024" in f32.detail


def test_rms_norm_bars_select_what_the_issue_says():
    """The bars are transcribed from prose ("N <= 32768", "1024 <= N <= 16384 at inputs of 256 MB or more"): the
    shapes they end up judging are spelled out here."""
    def selected(bar, itemsize):
        return [s for s in bar.shapes if bar.selects(s, itemsize)]
    by_metric = {(b.op, b.metric, b.cases): b for b in bars_for("rms_norm", "cuda") + bars_for("add_rms_norm", "cuda")}
    fwd_copy = by_metric[("rms_norm", "pct_copy", ("fwd",))]
    assert selected(fwd_copy, 2) == selected(fwd_copy, 4) == [s for s in NORM_SHAPES if s != "2048x65536"]
    train_copy = by_metric[("rms_norm", "pct_copy", ("fwd+bwd",))]
    assert selected(train_copy, 2) == ["32768x4096", "16384x8192", "8192x16384"]
    assert selected(train_copy, 4) == ["65536x1024", "32768x4096", "16384x8192", "8192x16384"]
    fwd_peer = by_metric[("rms_norm", "vs best peer", ("fwd",))]
    assert fwd_peer.tolerate == (0.98, 2) and set(fwd_peer.peers) == {"eager", "torch.compile", "liger"}
    assert by_metric[("rms_norm", "vs best peer", ("fwd+bwd",))].tolerate is None
    for metric in ("vs torch.compile", "vs liger"):
        assert by_metric[("add_rms_norm", metric, ("fwd", "fwd+bwd"))].at_least == 1.0
    assert len(NORM_SHAPES) == 7


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
        assert bool(bar.peers) == (bar.metric == "vs best peer"), bar
        assert bar.reduce in ("min", "geomean"), bar
        assert bar.tolerate is None or (bar.reduce == "min" and 0 < bar.tolerate[0] < bar.at_least), bar
        assert bar.cases and bar.dtypes and bar.at_least > 0 and bar.why, bar
        assert all(d in H.DTYPES for d in bar.dtypes), bar
        for dtype in bar.dtypes:  # a filter that selects none of the bar's shapes would judge nothing
            assert not bar.shapes or any(bar.selects(s, H.DTYPES[dtype].itemsize) for s in bar.shapes), bar


def test_a_bench_of_two_ops_is_judged_on_both(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(H, "copy_bandwidth", lambda device, nbytes, quick=False: 1e10)
    monkeypatch.setattr("benchmarks.bars.BARS", [Bar("toy", "cpu", "vs eager", 1.0, ("fwd",), ("f32",), "test"),
                                                 Bar("toy_add", "cpu", "vs eager", 1.0, ("fwd",), ("f32",), "test")])

    def bench(add_ms: float | None):
        def run(args, ctx):
            for op, ours in (("toy", 0.5), ("toy_add", add_ms)):
                if ours is not None:
                    yield from (H.Result(op=op, case="fwd", dtype="f32", shape="4x4", numel=16, impl=impl,
                                         device="cpu", ms=t) for impl, t in (("eager", 1.0), ("torchops", ours)))
        return H.Bench(op="toy", description="toy", run=run, more_ops=("toy_add",))

    argv = ["--device", "cpu", "--out-dir", str(tmp_path), "--threads", str(torch.get_num_threads())]
    assert H.main(bench(0.5), argv) == 0
    assert H.main(bench(2.0), argv) == 1  # the second op's bar is missed
    assert "MISSED: toy_add" in capsys.readouterr().out
    assert H.main(bench(None), argv) == 1  # the second op did not run at all
    assert "NO DATA: toy_add" in capsys.readouterr().out
    # The JSON re-check judges both ops again.
    assert H._rerender([str(tmp_path / "toy_cpu.json")]) == 1
    H.main(bench(0.5), argv)
    assert H._rerender([str(tmp_path / "toy_cpu.json")]) == 0


@pytest.mark.parametrize("bench", ["bench_swiglu", "bench_gelu_and_mul", "bench_rms_norm"])
def test_a_bench_produces_every_case_its_bars_name(bench, tmp_path, monkeypatch):
    """Run on tiny CPU shapes with a fake timer (torchops 2x every other implementation): the run checks its
    results against eager for real, and its CPU bars are met; every case a bar names, on either device, is
    a case the bench measures (a renamed case would otherwise show up only as NO DATA on the GPU)."""
    import importlib

    pytest.importorskip("torchops")
    module = importlib.import_module(f"benchmarks.{bench}")
    monkeypatch.setattr(H, "copy_bandwidth", lambda device, nbytes, quick=False: 1e10)
    monkeypatch.setattr(H, "time_all_ms", lambda fns, device, quick=False:
                        {name: 0.5 if name == "torchops" else 1.0 for name in fns})
    argv = ["--device", "cpu", "--out-dir", str(tmp_path), "--threads", str(torch.get_num_threads()),
            "--shapes", "8x64", "--no-compile"]
    assert H.main(module.BENCH, argv) == 0
    _, results = H.load(tmp_path / f"{module.BENCH.op}_cpu.json")
    for op in (module.BENCH.op, *module.BENCH.more_ops):
        measured = {r.case for r in results if r.op == op}
        for bar in BARS:
            if bar.op == op:
                assert set(bar.cases) <= measured, (bar, measured)


def test_a_grid_of_equal_sized_shapes_is_plotted_by_shape(tmp_path):
    # rms_norm's grid has several M x N shapes of one element count: on a size axis they would stack on one
    # x, and a grid of only such shapes was dropped as "a single point" before.
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    results = [H.bandwidth_result(op="norm", case="fwd", dtype=torch.float32, shape=f"{m}x{(1 << 20) // m}",
                                  numel=1 << 20, impl=impl, device="cuda", ms=ms, nbytes=8 << 20, copy_bps=4e12)
               for m in (64, 256, 1024) for impl, ms in (("torchops", 0.002), ("peer", 0.003))]
    axes_seen = []
    real_close = plt.close
    plt.close = lambda fig=None: (axes_seen.extend(fig.axes), real_close(fig))  # keep the axes for a look
    try:
        assert H._plot(results, tmp_path / "grid.png", ratios_only=False, title="t", copy_tbps=4.0)
    finally:
        plt.close = real_close
    assert (tmp_path / "grid.png").stat().st_size > 0
    assert [t.get_text() for t in axes_seen[0].get_xticklabels()] == ["64x16384", "256x4096", "1024x1024"]
