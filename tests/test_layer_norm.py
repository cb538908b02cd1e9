"""layer_norm specifics the generic tables don't express: agreement with F.layer_norm in float64 (values and
grads, every weight/bias combination), second derivatives (gradgradcheck for every combination, from our own
backward: torch's F.layer_norm loses one with weight None and a bias), forward-mode AD, the backward op refusing
its own derivative by name, accuracy against float64 in bf16/f32 (rows far from zero, long rows, dweight and
dbias over many rows against torch's own error), deterministic column sums, and rows whose working-precision
sums overflow although their values are finite (the exact answer, as rms_norm's)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import torchops  # noqa: F401  (loads the library)
from helpers import DEVICES, FLOAT_DTYPES, TOLERANCES, assert_close_to_reference, random_tensor, ulp

MYNS = torch.ops.myns
COMBOS = list(itertools.product((False, True), repeat=2))  # (weight given, bias given)
IDS = [f"{'w' if w else 'no_w'}-{'b' if b else 'no_b'}" for w, b in COMBOS]


def _params(n: int, dtype: torch.dtype, device: str, with_weight: bool, with_bias: bool, requires_grad=False):
    w = random_tensor((n,), dtype, device).requires_grad_(requires_grad) if with_weight else None
    b = random_tensor((n,), dtype, device).requires_grad_(requires_grad) if with_bias else None
    return w, b


def _present(*tensors):
    return tuple(t for t in tensors if t is not None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_weight,with_bias", COMBOS, ids=IDS)
def test_matches_f_layer_norm_in_float64(device: str, with_weight: bool, with_bias: bool) -> None:
    for shape in [(7, 1), (5, 3, 33), (16, 1024), (3, 4099)]:
        n = shape[-1]
        x = random_tensor(shape, torch.float64, device).requires_grad_()
        w, b = _params(n, torch.float64, device, with_weight, with_bias, requires_grad=True)
        xr = x.detach().clone().requires_grad_()
        wr, br = (None if t is None else t.detach().clone().requires_grad_() for t in (w, b))
        got = MYNS.layer_norm(x, w, b, 1e-5)
        want = F.layer_norm(xr, (n,), wr, br, 1e-5)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        dy = random_tensor(shape, torch.float64, device)
        got_grads = torch.autograd.grad(got, _present(x, w, b), dy)
        want_grads = torch.autograd.grad(want, _present(xr, wr, br), dy)
        for g, r in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10, msg=lambda m: f"{shape}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_weight,with_bias", COMBOS, ids=IDS)
def test_gradgradcheck_every_weight_bias_combination(device: str, with_weight: bool, with_bias: bool) -> None:
    x = random_tensor((3, 6), torch.float64, device).requires_grad_()
    w, b = _params(6, torch.float64, device, with_weight, with_bias, requires_grad=True)

    def fn(*args):
        it = iter(args)
        return MYNS.layer_norm(next(it), next(it) if with_weight else None, next(it) if with_bias else None, 1e-5)

    inputs = _present(x, w, b)
    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)
    # Forward mode, and forward over reverse.
    assert torch.autograd.gradcheck(fn, inputs, check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False, check_batched_grad=False)
    # Forward over reverse (torch.func's Hessian-vector product) against reverse over reverse.
    loss = lambda *a: (fn(*a) * torch.linspace(-1, 2, 18, dtype=torch.float64, device=device).view(3, 6)).pow(2).sum()  # noqa: E731
    v = tuple(torch.randn_like(t) for t in inputs)
    _, forward_over_reverse = torch.func.jvp(torch.func.grad(loss, argnums=tuple(range(len(inputs)))), inputs, v)
    _, reverse_over_reverse = torch.autograd.functional.hvp(loss, inputs, v)
    torch.testing.assert_close(forward_over_reverse, reverse_over_reverse)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_weight,with_bias", COMBOS, ids=IDS)
def test_jvp_matches_f_layer_norm(device: str, with_weight: bool, with_bias: bool) -> None:
    import torch.autograd.forward_ad as fwAD

    x = random_tensor((4, 40), torch.float64, device)
    w, b = _params(40, torch.float64, device, with_weight, with_bias)
    primals = _present(x, w, b)
    tangents = tuple(torch.randn_like(t) for t in primals)

    def call(fn):
        def run(*args):
            it = iter(args)
            return fn(next(it), next(it) if with_weight else None, next(it) if with_bias else None)
        return run

    ours = call(lambda x, w, b: MYNS.layer_norm(x, w, b, 1e-5))
    theirs = call(lambda x, w, b: F.layer_norm(x, (40,), w, b, 1e-5))
    _, got = torch.func.jvp(ours, primals, tangents)
    _, want = torch.func.jvp(theirs, primals, tangents)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    with fwAD.dual_level():
        dual = fwAD.unpack_dual(ours(*(fwAD.make_dual(p, t) for p, t in zip(primals, tangents)))).tangent
    torch.testing.assert_close(dual, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_op_refuses_its_own_derivatives_by_name(device: str) -> None:
    x = random_tensor((4, 8), torch.float64, device)
    w = random_tensor((8,), torch.float64, device)
    _, mean, rstd = MYNS._layer_norm_forward(x, w, None, 1e-5)
    dy = random_tensor((4, 8), torch.float64, device).requires_grad_()
    gx, _, _ = MYNS._layer_norm_backward(dy, x, w, mean, rstd, True, False, False)
    with pytest.raises(RuntimeError, match=r"myns::_layer_norm_backward: double backward .* is not supported"):
        gx.sum().backward()
    with pytest.raises(RuntimeError, match=r"myns::_layer_norm_backward: forward-mode AD is not supported"):
        torch.func.jvp(lambda d: MYNS._layer_norm_backward(d, x, w, mean, rstd, True, False, False)[0],
                       (dy.detach(),), (torch.ones_like(dy),))


@pytest.mark.parametrize("device", DEVICES)
def test_no_grad_uses_the_plain_kernel_and_grad_records_a_node(device: str) -> None:
    x = random_tensor((5, 16), torch.float32, device).requires_grad_()
    w, b = _params(16, torch.float32, device, True, True, requires_grad=True)
    with torch.no_grad():
        plain = MYNS.layer_norm(x, w, b)
    with torch.inference_mode():
        inference = MYNS.layer_norm(x, w, b)
    recorded = MYNS.layer_norm(x, w, b)
    assert not plain.requires_grad and not inference.requires_grad
    assert recorded.grad_fn.name() == "LayerNormBackward"
    assert torch.equal(plain, inference) and torch.equal(recorded.detach(), plain)
    # create_graph=True gives the same first derivative as the kernel (ATen math from input).
    dy = random_tensor((5, 16), torch.float32, device)
    first = torch.autograd.grad(recorded, (x, w, b), dy, retain_graph=True)
    again = torch.autograd.grad(recorded, (x, w, b), dy, create_graph=True)
    for a, c in zip(first, again, strict=True):
        torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_bias_grad_dtype_without_weight(device: str, dtype: torch.dtype) -> None:
    # Without a weight, grad_bias comes from the kernel in the stat dtype and is cast to the bias's dtype.
    for bias_dtype in {dtype, torch.float32}:
        x = random_tensor((6, 24), dtype, device)
        b = random_tensor((24,), bias_dtype, device).requires_grad_()
        dy = random_tensor((6, 24), dtype, device)
        (gb,) = torch.autograd.grad(MYNS.layer_norm(x, None, b), b, dy)
        assert gb.dtype == bias_dtype
        assert_close_to_reference(gb.cpu(), dy.double().sum(0).cpu())


def _layer_norm_64(x, w, b, eps):
    return F.layer_norm(x.double(), x.shape[-1:], None if w is None else w.double(), None if b is None else b.double(),
                        eps)


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def assert_close_given_the_saved_mean(out, x, w, b, eps) -> None:
    """out against float64 math, allowing what the contract's statistics precision allows: the mean is a float32
    number (float64 for float64 input), so x - mean may be off by its rounding, an ulp of the mean, scaled by
    rstd and the weight (large where a row sits far from zero with a small spread). Everything else within the
    output dtype's tolerance."""
    ref = _layer_norm_64(x, w, b, eps).cpu()
    xd = x.double().cpu()
    mean = xd.mean(-1, keepdim=True)
    rstd = torch.rsqrt((xd - mean).pow(2).mean(-1, keepdim=True) + eps)
    scale = rstd if w is None else rstd * w.double().cpu().abs()
    rtol, atol = TOLERANCES[out.dtype]
    bound = atol + rtol * ref.abs() + 2 * ulp(mean, _stat_dtype(x.dtype)) * scale
    excess = (out.double().cpu() - ref).abs() - bound
    assert bool((excess <= 0).all()), f"off by {excess.max().item():.3g} past the bound"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rows_far_from_zero_and_long_rows(device: str, dtype: torch.dtype) -> None:
    # A large mean with a small spread: E[x^2] - mean^2 in float32 would lose every digit of the variance
    # (1e4^2 against a variance near 1); the two passes keep it. Long rows: the blocked sums.
    cases = [((64, 256), 1e4 if dtype in (torch.float32, torch.float64) else 1e2), ((3, 70001), 3.0), ((2, 1 << 17), -5.0)]
    for shape, centre in cases:
        x = (random_tensor(shape, torch.float64, device) + centre).to(dtype)
        w, b = _params(shape[-1], dtype, device, True, True)
        out, mean, rstd = MYNS._layer_norm_forward(x, w, b, 1e-5)
        assert_close_given_the_saved_mean(out, x, w, b, 1e-5)
        xd = x.double()
        torch.testing.assert_close(mean.double(), xd.mean(-1), rtol=1e-6 if dtype != torch.float64 else 1e-12, atol=0)
        want_rstd = torch.rsqrt(xd.var(-1, correction=0) + 1e-5)
        torch.testing.assert_close(rstd.double(), want_rstd, rtol=1e-5 if dtype != torch.float64 else 1e-12, atol=0)


def _dparam_errors(fn, n: int, rows: int, with_weight: bool):
    """max |error| of (dweight, dbias) from `fn` in float32 against float64, on one random problem."""
    gen = torch.Generator().manual_seed(rows * 7 + n)
    x, dy = torch.randn(rows, n, generator=gen), torch.randn(rows, n, generator=gen)
    w, b = torch.randn(n, generator=gen) if with_weight else None, torch.randn(n, generator=gen)
    wd, bd = (None if t is None else t.double().requires_grad_() for t in (w, b))
    want = torch.autograd.grad(F.layer_norm(x.double(), (n,), wd, bd, 1e-5), _present(wd, bd), dy.double())
    wf, bf = (None if t is None else t.clone().requires_grad_() for t in (w, b))
    got = torch.autograd.grad(fn(x, wf, bf), _present(wf, bf), dy)
    return [(g.double() - r).abs().max().item() for g, r in zip(got, want, strict=True)]


@pytest.mark.parametrize("rows,n", [(400_000, 64), (100_000, 256), (20_000, 1024), (1000, 64)])
def test_float32_weight_and_bias_grads_within_2x_of_torch(rows: int, n: int) -> None:
    ours = _dparam_errors(lambda x, w, b: MYNS.layer_norm(x, w, b, 1e-5), n, rows, True)
    torchs = _dparam_errors(lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5), n, rows, True)
    for name, e, t in zip(("dweight", "dbias"), ours, torchs, strict=True):
        assert e <= 2 * t, f"{name}: error {e:.3g} against torch's {t:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1000, 64), (257, 1031), (64, 70000)])
def test_column_sums_are_deterministic(dtype: torch.dtype, shape) -> None:
    x, dy = random_tensor(shape, dtype, "cpu"), random_tensor(shape, dtype, "cpu")
    w = random_tensor((shape[-1],), dtype, "cpu")
    _, mean, rstd = MYNS._layer_norm_forward(x, w, w, 1e-5)
    runs = [MYNS._layer_norm_backward(dy, x, w, mean, rstd, True, True, True) for _ in range(3)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # the row split is fixed, not the thread count's
        runs.append(MYNS._layer_norm_backward(dy, x, w, mean, rstd, True, True, True))
    finally:
        torch.set_num_threads(threads)
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(run, runs[0], strict=True))
    only_dx = MYNS._layer_norm_backward(dy, x, w, mean, rstd, True, False, False)
    only_db = MYNS._layer_norm_backward(dy, x, w, mean, rstd, False, False, True)
    assert torch.equal(only_dx[0], runs[0][0]) and torch.equal(only_db[2], runs[0][2])
    assert only_dx[1].shape == only_dx[2].shape == only_db[0].shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rows_whose_sums_overflow_get_the_exact_answer(device: str, dtype: torch.dtype) -> None:
    # Values whose squares (or deviations' squares) overflow the working precision although every value is
    # finite: the row's statistics are recomputed exactly, wherever the large values sit and whatever the row
    # length; rows holding inf or NaN still propagate them.
    big = 1.5e19 if dtype != torch.float64 else 1.5e300
    rows = []
    for n, where in ((16, (0, 1)), (16, (0, 8)), (15, (3, 11)), (33, (0, 32))):
        row = random_tensor((n,), torch.float64, device)
        row[list(where)] = torch.tensor([big, -big], dtype=torch.float64, device=device)
        rows.append(row)
    # Equal magnitudes (alternating signs: the mean is 0, each deviation squared overflows) below and above
    # 16 elements.
    rows += [big * (1 - 2 * (torch.arange(n, device=device) % 2)).double() for n in (8, 15, 16, 17)]
    for row in rows:
        x = row.to(dtype).view(1, -1)
        n = x.shape[-1]
        w, b = _params(n, dtype, device, True, True)
        out, mean, rstd = MYNS._layer_norm_forward(x, w, b, 1e-5)
        xs = x.double() / big  # the same row scaled into range: its exact statistics
        mean_s = xs.mean(-1)
        want = (xs - mean_s) * torch.rsqrt((xs - mean_s).pow(2).mean(-1) + 1e-5 / big / big) * w.double() + b.double()
        assert_close_to_reference(out.cpu(), want.cpu(), msg=lambda m: f"n={n}: {m}")
        torch.testing.assert_close(mean.double() / big, mean_s, rtol=1e-6, atol=1e-6)
        assert torch.isfinite(rstd).all() and rstd.item() > 0
    x = torch.tensor([[big, float("inf"), 1.0, 2.0]], device=device).to(dtype)
    assert torch.isnan(MYNS.layer_norm(x)).any()


def _transparent_huge_pages() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        return "absent"


@pytest.mark.skipif(_transparent_huge_pages() not in ("madvise", "always"),
                    reason="needs Linux transparent huge pages in madvise or always mode")
@pytest.mark.parametrize("shape", [(4096, 4096), (4096, 4097)], ids=["32MiB", "32MiB+8KiB"])
def test_cpu_outputs_of_32_mib_fault_in_by_huge_pages(shape: tuple[int, int]) -> None:
    # glibc gives a buffer of 32 MiB or more a fresh mmap on every call; core/empty.h advises huge pages over
    # it, so its first writes fault in 2 MiB at a time (16 faults) rather than 4 KiB (8192 faults: the CPU
    # bench's bf16 4096 x 4096 rows ran 3x slower than the kernel when exactly 32 MiB went unadvised).
    import resource
    x = torch.randn(shape, dtype=torch.bfloat16)
    torchops.layer_norm(x)
    faults = []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        out = torchops.layer_norm(x)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del out
    assert min(faults) < 1024, faults
