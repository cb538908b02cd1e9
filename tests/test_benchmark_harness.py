"""The benchmark harness: its CPU timer (on a fake clock, so no assertion depends on how busy the machine
is), its bar checks (a missed bar and a bar without data both fail; "% of copy" against a copy of the same
bytes, at large inputs only), and benches that produce every case their bars name."""
import itertools
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness as H  # noqa: E402
from benchmarks.bars import BARS, COPY_BAR_MIN_INPUT_BYTES, NORM_PEERS, NORM_SHAPES, Bar, bars_for  # noqa: E402


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA allocator statistics")
def test_peak_cuda_bytes_counts_what_the_call_allocated_beyond_what_was_there():
    resident = torch.empty(1 << 22, device="cuda")  # 16 MiB allocated before the call: not counted
    peak, result = H.peak_cuda_bytes(lambda: torch.ones(1 << 20, device="cuda"))  # 4 MiB
    assert (4 << 20) <= peak < (5 << 20)
    assert result.shape == (1 << 20,)
    del resident


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
    bar = Bar("toy", "cuda", "vs eager", 1.0, ("fwd",), ("bf16",), "test", reduce="geomean", min_nbytes=100)
    rows = (_rows("toy", "fwd", "bf16", "big", {"eager": 1.05, "torchops": 1.0}, nbytes=200)
            + _rows("toy", "fwd", "bf16", "huge", {"eager": 0.97, "torchops": 1.0}, nbytes=400)
            + _rows("toy", "fwd", "bf16", "small", {"eager": 0.1, "torchops": 1.0}, nbytes=50))  # below the floor
    (verdict,) = H.check_bars(rows, "toy", "cuda", [bar])
    assert verdict.status == "ok", verdict  # geomean(1.05, 0.97) = 1.009; the small input does not count
    (verdict,) = H.check_bars(rows[2:], "toy", "cuda", [bar])
    assert verdict.status == "MISSED"  # 0.97x alone
    (verdict,) = H.check_bars(rows[4:], "toy", "cuda", [bar])
    assert verdict.status == "NO DATA"  # only an input below the floor ran


def test_pct_copy_judges_inputs_of_256_mib_or_more_only():
    """The rule of the metric itself, with no filter on the bar: an input (the row's shape in its dtype) of
    COPY_BAR_MIN_INPUT_BYTES or more is judged, a smaller one is left to the peer bars, and a label the rule
    cannot read is never counted."""
    assert COPY_BAR_MIN_INPUT_BYTES == 256 << 20
    bar = Bar("toy", "cuda", "pct_copy", 90.0, ("fwd",), ("bf16", "f32"), "test",
              shapes=("4096x2048", "65536x1024", "32768x4096"))
    # bf16: 16 / 128 / 256 MiB; f32: 32 / 256 / 512 MiB
    assert [s for s in bar.shapes if bar.selects(s, 2)] == ["32768x4096"]
    assert [s for s in bar.shapes if bar.selects(s, 4)] == ["65536x1024", "32768x4096"]
    flat = Bar("toy", "cuda", "pct_copy", 90.0, ("fwd",), ("f16",), "test")
    assert flat.selects("2^27", 2) and not flat.selects("2^26", 2) and not flat.selects("N=64", 2)
    assert "inputs >= 256 MiB" in bar.label and "same-bytes copy" in bar.label

    rows = []
    for dt, pcts in (("bf16", (40.0, 80.0, 95.0)), ("f32", (40.0, 92.0, 91.0))):
        for shape, pct in zip(bar.shapes, pcts):
            rows += _rows("toy", "fwd", dt, shape, {"torchops": 1.0}, pct_copy=pct)
    bf16, f32 = H.check_bars(rows, "toy", "cuda", [bar])
    assert bf16.status == "ok" and "32768x4096" in bf16.detail  # 40% and 80% at small inputs do not count
    assert f32.status == "ok" and "91.000%" in f32.detail
    # A large input without its copy of the same bytes has no value: no data, naming what did not run.
    rows[-1].pct_copy = None
    bf16, f32 = H.check_bars(rows, "toy", "cuda", [bar])
    assert f32.status == "NO DATA" and "32768x4096" in f32.detail and H.SAME_BYTES_COPY in f32.detail
    # A listed small shape that did not run is not missing; a large one is.
    bf16, f32 = H.check_bars([r for r in rows if r.shape != "4096x2048"], "toy", "cuda", [bar])
    assert bf16.status == "ok"
    bf16, _ = H.check_bars([r for r in rows if r.shape != "32768x4096"], "toy", "cuda", [bar])
    assert bf16.status == "NO DATA" and "fwd 32768x4096" in bf16.detail


def test_pct_copy_is_against_a_copy_of_the_same_bytes_in_the_rows_dtype(monkeypatch):
    """A bench may time the copy beside its case (time_beside_copy); main times it for the rows that did not,
    once per dtype and byte count, in that dtype."""
    dst = H.same_bytes_copy(4096, torch.bfloat16, "cpu")()
    assert dst.dtype == torch.bfloat16 and dst.nbytes == 2048  # half the bytes read, half written

    r = H.bandwidth_result(op="toy", case="fwd", dtype=torch.float32, shape="8x8", numel=64, impl="torchops",
                           device="cpu", ms=2.0, nbytes=512, copy_ms=1.5)
    assert r.pct_copy == pytest.approx(75.0) and r.copy_ms == 1.5

    timed: list[tuple[torch.dtype, int]] = []

    def fake_time_ms(fn, device, *, quick=False, share=1):
        out = fn()
        timed.append((out.dtype, 2 * out.nbytes))
        return 1.0

    monkeypatch.setattr(H, "time_ms", fake_time_ms)
    rows = [H.bandwidth_result(op="toy", case=c, dtype=dt, shape="8x8", numel=64, impl=impl, device="cpu", ms=ms,
                               nbytes=nbytes)
            for c, dt, nbytes in (("fwd", torch.float32, 1024), ("fwd", torch.bfloat16, 1024),
                                  ("fwd+bwd", torch.float32, 4096))
            for impl, ms in (("eager", 4.0), ("torchops", 2.0))]
    rows.append(r)  # timed beside its case already: kept
    H.fill_same_bytes_copies(rows, "cpu")
    assert sorted(timed, key=str) == sorted([(torch.float32, 1024), (torch.bfloat16, 1024), (torch.float32, 4096)],
                                            key=str)
    assert [x.pct_copy for x in rows] == [25.0, 50.0] * 3 + [75.0]


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
              shapes=("65536x1024", "32768x4096", "4096x65536"), n_range=(1024, 16384))
    # 65536x1024 is 128 MiB in bf16 (below the metric's floor), 256 MiB in f32; 4096x65536 is past the N range.
    assert [s for s in bar.shapes if bar.selects(s, 2)] == ["32768x4096"]
    assert [s for s in bar.shapes if bar.selects(s, 4)] == ["65536x1024", "32768x4096"]
    peer = Bar("toy", "cuda", "vs eager", 1.0, ("fwd",), ("bf16",), "test", n_range=(1024, 16384))
    assert peer.selects("8x1024", 2) and not peer.selects("8x65536", 2) and not peer.selects("2^20", 2)
    rows = []
    for dt in ("bf16", "f32"):
        rows += _rows("toy", "fwd", dt, "65536x1024", {"torchops": 1.0}, pct_copy=50.0)  # only counts in f32
        rows += _rows("toy", "fwd", dt, "32768x4096", {"torchops": 1.0}, pct_copy=90.0)
        rows += _rows("toy", "fwd", dt, "4096x65536", {"torchops": 1.0}, pct_copy=10.0)  # never counts
    bf16, f32 = H.check_bars(rows, "toy", "cuda", [bar])
    assert bf16.status == "ok" and f32.status == "MISSED" and "65536x1024" in f32.detail
    # A selected shape that did not run is missing data; an unselected one is not.
    (bf16, f32) = H.check_bars([r for r in rows if r.shape != "65536x1024"], "toy", "cuda", [bar])
    assert bf16.status == "ok" and f32.status == "NO DATA" and "fwd 65536x1024" in f32.detail


def test_norm_bars_select_what_the_issue_says():
    """The bars are transcribed from prose ("N <= 32768", "1024 <= N <= 16384", "% of a same-bytes copy at inputs
    of 256 MB or more"): the shapes they end up judging are spelled out here."""
    def selected(bar, itemsize):
        return [s for s in bar.shapes if bar.selects(s, itemsize)]
    by_metric = {(b.op, b.metric, b.cases): b
                 for op in ("rms_norm", "add_rms_norm", "layer_norm") for b in bars_for(op, "cuda")}
    assert NORM_SHAPES == ("4096x2048", "65536x1024", "32768x4096", "16384x8192", "8192x16384", "4096x32768",
                           "2048x65536")
    large_bf16 = ["32768x4096", "16384x8192", "8192x16384", "4096x32768", "2048x65536"]  # 256 MiB inputs
    large_f32 = ["65536x1024", *large_bf16]
    fwd_copy = by_metric[("rms_norm", "pct_copy", ("fwd",))]
    assert selected(fwd_copy, 2) == large_bf16[:-1] and selected(fwd_copy, 4) == large_f32[:-1]  # N <= 32768
    train_copy = by_metric[("rms_norm", "pct_copy", ("fwd+bwd",))]
    assert selected(train_copy, 2) == ["32768x4096", "16384x8192", "8192x16384"]
    assert selected(train_copy, 4) == ["65536x1024", "32768x4096", "16384x8192", "8192x16384"]
    for op in ("add_rms_norm", "layer_norm"):
        bar = by_metric[(op, "pct_copy", ("fwd",))]
        assert bar.at_least == 90.0 and selected(bar, 2) == large_bf16 and selected(bar, 4) == large_f32
    fwd_peer = by_metric[("rms_norm", "vs best peer", ("fwd",))]
    assert fwd_peer.tolerate == (0.98, 2) and fwd_peer.peers == NORM_PEERS == ("eager", "torch.compile", "liger")
    assert by_metric[("rms_norm", "vs best peer", ("fwd+bwd",))].tolerate is None
    for metric in ("vs torch.compile", "vs liger"):
        assert by_metric[("add_rms_norm", metric, ("fwd", "fwd+bwd"))].at_least == 1.0
    ln_peer = by_metric[("layer_norm", "vs best peer", ("fwd", "fwd+bwd"))]
    assert (ln_peer.at_least, ln_peer.peers, ln_peer.tolerate, ln_peer.shapes) == (0.98, NORM_PEERS, None, NORM_SHAPES)
    assert ln_peer.dtypes == ("bf16", "f32")
    (ln_cpu,) = bars_for("layer_norm", "cpu")
    assert (ln_cpu.metric, ln_cpu.at_least, ln_cpu.cases, ln_cpu.reduce) == ("vs eager", 1.0, ("fwd", "fwd+bwd"), "min")


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


def test_main_keeps_the_rows_before_an_error_and_fails(tmp_path, monkeypatch, capsys):
    """An op that raises (one with no kernel for this device) fails the run loudly, naming the error, and the
    rows measured before it are written."""
    monkeypatch.setattr(H, "copy_bandwidth", lambda device, nbytes, quick=False: 1e10)
    monkeypatch.setattr("benchmarks.bars.BARS", [])

    def run(args, ctx):
        yield H.Result(op="toy", case="fwd", dtype="f32", shape="4", numel=4, impl="torchops", device="cpu", ms=1.0)
        raise NotImplementedError("Could not run 'myns::toy' with arguments from the 'CPU' backend")

    argv = ["--device", "cpu", "--out-dir", str(tmp_path), "--threads", str(torch.get_num_threads()), "--quick"]
    assert H.main(H.Bench(op="toy", description="toy", run=run), argv) == 1
    assert "NotImplementedError: Could not run 'myns::toy'" in capsys.readouterr().out
    _, rows = H.load(tmp_path / "toy_cpu_quick.json")
    assert [r.op for r in rows] == ["copy_", "toy"]


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
    out = capsys.readouterr().out
    assert "NO DATA: toy_add" in out and "no toy_add case ran" in out
    # The JSON re-check judges both ops again.
    assert H._rerender([str(tmp_path / "toy_cpu.json")]) == 1
    H.main(bench(0.5), argv)
    assert H._rerender([str(tmp_path / "toy_cpu.json")]) == 0
    # --ops: the ops asked for are measured and judged, and only they; the bench reads them from args.ops.
    assert H.main(bench(None), argv + ["--ops", "toy"]) == 0
    assert H.main(bench(2.0), argv + ["--ops", "toy"]) == 0  # toy_add's miss is not judged
    assert H.load(tmp_path / "toy_cpu.json")[0]["meta"]["ops"] == ["toy"]
    assert H._rerender([str(tmp_path / "toy_cpu.json")]) == 0  # nor on the re-check
    with pytest.raises(SystemExit):
        H.main(bench(0.5), argv + ["--ops", "toy,other"])


def _run_on_a_fake_timer(module, tmp_path, monkeypatch, *extra: str) -> tuple[int, list[H.Result]]:
    """A bench on tiny CPU shapes with a fake timer (torchops 2x every other implementation, the copies of the same
    bytes as fast as the peers): its results are checked for real. Its exit status and rows."""
    monkeypatch.setattr(H, "copy_bandwidth", lambda device, nbytes, quick=False: 1e10)
    monkeypatch.setattr(H, "time_ms", lambda fn, device, quick=False, share=1: 1.0)
    monkeypatch.setattr(H, "time_all_ms", lambda fns, device, quick=False:
                        {name: 0.5 if name == "torchops" else 1.0 for name in fns})
    argv = ["--device", "cpu", "--out-dir", str(tmp_path), "--threads", str(torch.get_num_threads()),
            "--shapes", "8x64,4x520", "--no-compile", *extra]
    rc = H.main(module.BENCH, argv)
    return rc, H.load(tmp_path / f"{module.BENCH.name or module.BENCH.op}_cpu.json")[1]


def _assert_every_bar_case_measured(results: list[H.Result], ops) -> None:
    for op in ops:
        measured = {r.case for r in results if r.op == op}
        assert measured, op
        for bar in BARS:
            if bar.op == op:
                assert set(bar.cases) <= measured, (bar, measured)


@pytest.mark.parametrize("bench, ops", [
    pytest.param("bench_gated", (), id="gated"),
    pytest.param("bench_norm", ("rms_norm", "add_rms_norm"), id="norm-rms_norm,add_rms_norm"),
    pytest.param("bench_norm", ("layer_norm",), id="norm-layer_norm")])
def test_a_bench_produces_every_case_its_bars_name(bench, ops, tmp_path, monkeypatch):
    """Every case a bar names, on either device, is a case the bench measures (a renamed case would otherwise show
    up only as NO DATA on the GPU), its CPU bars are met on the fake timer, and every row that moves bytes has its
    % of a copy of the same bytes."""
    import importlib

    pytest.importorskip("torchops")
    module = importlib.import_module(f"benchmarks.{bench}")
    rc, results = _run_on_a_fake_timer(module, tmp_path, monkeypatch, *(("--ops", ",".join(ops)) if ops else ()))
    assert rc == 0
    _assert_every_bar_case_measured(results, ops or module.BENCH.ops)
    moving = [r for r in results if r.nbytes and r.op != "copy_"]
    assert moving and all(r.copy_ms == 1.0 and r.pct_copy == pytest.approx(100.0 * 1.0 / r.ms) for r in moving)


def test_the_norm_bench_runs_layer_norm_rows_on_a_stand_in(tmp_path, monkeypatch, capsys):
    """layer_norm's rows through the bench's whole path (float64 checks of values and of the three gradients,
    timing, bytes, bars), with F.layer_norm standing in for torchops' kernel, so the path is tested on a machine
    where the op has no kernel; a stand-in that is wrong fails the run."""
    import dataclasses

    import torch.nn.functional as F

    from benchmarks import bench_norm

    def stand_in(scale: float):
        return lambda t: lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w * scale, b, bench_norm.LN_EPS)

    op = bench_norm.OPS["layer_norm"]
    monkeypatch.setitem(bench_norm.OPS, "layer_norm", dataclasses.replace(op, ours=stand_in(1.0)))
    rc, results = _run_on_a_fake_timer(bench_norm, tmp_path, monkeypatch, "--ops", "layer_norm")
    assert rc == 0
    _assert_every_bar_case_measured(results, ("layer_norm",))
    ours = [r for r in results if r.op == "layer_norm" and r.impl == "torchops"]
    assert sorted((r.dtype, r.shape, r.case, r.nbytes) for r in ours) == sorted(
        (dt, f"{m}x{n}", case, nbytes(m, n, s)) for dt, s in (("bf16", 2), ("f32", 4)) for m, n in ((8, 64), (4, 520))
        for case, nbytes in (("fwd", op.fwd_bytes), ("fwd+bwd", op.train_bytes)))
    assert op.fwd_bytes(8, 64, 2) == 2 * 8 * 64 * 2 + 2 * 64 * 2  # x read, y written, weight and bias read

    capsys.readouterr()
    monkeypatch.setitem(bench_norm.OPS, "layer_norm", dataclasses.replace(op, ours=stand_in(1.01)))
    rc, results = _run_on_a_fake_timer(bench_norm, tmp_path, monkeypatch, "--ops", "layer_norm")
    assert rc == 1 and "wrong result: layer_norm torchops output 0" in capsys.readouterr().out
    assert not [r for r in results if r.op == "layer_norm"]  # no number for a wrong kernel


def test_a_grid_of_equal_sized_shapes_is_plotted_by_shape(tmp_path):
    # rms_norm's grid has several M x N shapes of one element count: on a size axis they would stack on one
    # x, and a grid of only such shapes was dropped as "a single point" before.
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    results = [H.bandwidth_result(op="norm", case="fwd", dtype=torch.float32, shape=f"{m}x{(1 << 20) // m}",
                                  numel=1 << 20, impl=impl, device="cuda", ms=ms, nbytes=8 << 20)
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


def test_the_message_passing_gpu_sections_check_and_time_on_a_small_cpu_graph(monkeypatch):
    """bench_spmm_reduce's fwd+bwd sections run on the GPU only (their bars are the H200's), so a slip in their
    checking code would first show up there: run each on a small CPU graph, results checked for real."""
    import argparse

    pytest.importorskip("torchops")
    from benchmarks import bench_spmm_reduce as B
    from benchmarks.bench_csr_spmm import GraphSpec

    monkeypatch.setattr(H, "time_all_ms", lambda fns, device, quick=False: {name: 1.0 for name in fns})
    g = B.Graph(GraphSpec("small", 300, 2_000, 60), "cpu")
    args = argparse.Namespace(device="cpu", quick=True)
    ctx = H.Context(device="cpu", quick=True)
    pyg, why = B.import_torch_geometric()
    values = torch.randn(g.nnz, dtype=torch.float32)
    dense = torch.randn(g.m, 16, dtype=torch.float32)
    rows = [*B.bench_reduce_fwd_bwd(args, ctx, g, values, dense), *B.bench_sddmm(args, ctx, g, torch.float32),
            *B.bench_softmax(args, ctx, g, torch.float32, pyg, why), *B.bench_gat(args, ctx, g, torch.float32, pyg, why)]
    assert ctx.failures == []
    cases = {r.case for r in rows if r.impl == "torchops"}
    assert {"small mean fwd+bwd", "small max fwd+bwd", "small sddmm fwd+bwd", "small softmax fwd+bwd"} <= cases
    assert ("small gat fwd+bwd" in cases) == (pyg is not None)


def test_profile_prints_each_timed_function_costliest_kernels(tmp_path, monkeypatch, capsys):
    """--profile N: every function time_all_ms times gets a profiler table of its N costliest kernels on stderr
    (here the CPU's ops: the toy's torch.add and torch.mul)."""
    monkeypatch.setattr(H, "CPU_WARMUP_S", 0.0)
    monkeypatch.setattr(H, "PROFILE_ROWS", 0)  # restored after the test, whatever main sets

    def run(args, ctx):
        x = torch.ones(64)
        times = H.time_all_ms({"eager": lambda: torch.add(x, x), "torchops": lambda: torch.mul(x, x)}, "cpu",
                              quick=True)
        return [H.Result(op="toy", case="c", dtype="f32", shape="64", numel=64, impl=impl, device="cpu", ms=ms)
                for impl, ms in times.items()]

    bench = H.Bench(op="toy", description="toy", run=run)
    argv = ["--device", "cpu", "--out-dir", str(tmp_path), "--no-bars", "--profile", "3"]
    assert H.main(bench, argv) == 0
    err = capsys.readouterr().err
    assert "profile of 'eager', 3 calls" in err and "aten::add" in err
    assert "profile of 'torchops', 3 calls" in err and "aten::mul" in err
    assert H.PROFILE_ROWS == 3


def test_memory_breakdown_names_what_is_live_at_the_peak(tmp_path, monkeypatch):
    """--memory-breakdown N sets MEMORY_ROWS; peak_breakdown, over a recorded trace, sums the allocations live at
    the highest total by their innermost frame outside torch, and lists the last ones made before that moment."""
    monkeypatch.setattr(H, "MEMORY_ROWS", 0)  # restored after the test, whatever main sets
    torch_file = os.path.join(os.path.dirname(torch.__file__), "nn", "modules", "linear.py")

    def alloc(addr, mib, *frames):
        return {"action": "alloc", "addr": addr, "size": mib << 20,
                "frames": [{"filename": f, "line": line, "name": name} for f, line, name in frames]}

    def free(addr):
        return {"action": "free_completed", "addr": addr, "size": 0}

    model = ("/src/model.py", 12, "forward")
    trace = [alloc(1, 100, (torch_file, 5, "forward"), model),  # torch's frame skipped: the model's line names it
             alloc(2, 20, model), free(2), alloc(3, 30, ("/src/loss.py", 7, "loss")),
             alloc(4, 10, ("/src/loss.py", 9, "loss")),  # peak: 1, 3 and 4 live (140 MiB)
             free(1), alloc(5, 20, model)]
    text = H.peak_breakdown(trace, 2)
    lines = text.splitlines()
    assert lines[0].split() == ["140.0", "MiB", "live", "at", "the", "peak"]
    assert lines[1].split() == ["100.0", "MiB", "in", "1", "from", "model.py:12", "forward"]
    assert lines[2].split() == ["30.0", "MiB", "in", "1", "from", "loss.py:7", "loss"]
    assert len([line for line in lines if " from " in line and "event" not in line]) == 2  # the 2 largest sources
    assert [line.split() for line in lines[-2:]] == [["30.0", "MiB", "(event", "3)", "from", "loss.py:7", "loss"],
                                                     ["10.0", "MiB", "(event", "4)", "from", "loss.py:9", "loss"]]

    def run(args, ctx):
        return [H.Result(op="toy", case="c", dtype="f32", shape="1", numel=1, impl="torchops", device="cpu", ms=1.0)]

    assert H.main(H.Bench(op="toy", description="toy", run=run),
                  ["--device", "cpu", "--out-dir", str(tmp_path), "--no-bars", "--memory-breakdown", "5"]) == 0
    assert H.MEMORY_ROWS == 5
