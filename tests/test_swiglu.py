"""swiglu specifics the generic tables don't express: the Python wrapper, chunk halves read in place,
overflow at large |gate|, inf/NaN as torch's F.silu gives them, closeness in ulps to a float64 reference
for every dtype, double backward, forward-mode AD, the exported graph, and CUDA-only layouts and sizes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from expecttest import TestCase

import torchops
from helpers import (FLOAT_DTYPES, called_ops, DEVICES, HAS_CUDA, assert_close_to_reference, chunk_halves,
                     needs_gpu_memory, random_tensor, requires_cuda, ulp)

ALL_DTYPES = FLOAT_DTYPES


def reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    gate, up = gate.detach().cpu().double(), up.detach().cpu().double()
    return F.silu(gate) * up


def reference_backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    grad, gate, up = (t.detach().cpu().double() for t in (grad, gate, up))
    s = torch.sigmoid(gate)
    return grad * up * (s * (1 + gate * (1 - s))), grad * F.silu(gate)


# ------------------------------------------------------------------------------------------- wrapper


@pytest.mark.parametrize("device", DEVICES)
def test_wrapper_is_the_op(device: str) -> None:
    gate, up = random_tensor((5, 6), torch.float32, device), random_tensor((5, 6), torch.float32, device)
    out = torchops.swiglu(gate, up)
    assert torch.equal(out, torch.ops.myns.swiglu(gate, up))
    assert out.is_contiguous() and out.shape == gate.shape
    assert_close_to_reference(out.cpu(), reference(gate, up))


def test_error_names_op_and_argument() -> None:
    with pytest.raises(RuntimeError, match=r"myns::swiglu: gate and up must have the same shape, got \[4, 8\] and \[4, 9\]"):
        torchops.swiglu(torch.randn(4, 8), torch.randn(4, 9))
    with pytest.raises(RuntimeError, match=r"myns::swiglu: gate has unsupported dtype Long"):
        torchops.swiglu(torch.arange(4), torch.arange(4))
    with pytest.raises(RuntimeError, match=r"myns::swiglu_backward: grad_out and gate must have the same dtype"):
        torch.ops.myns.swiglu_backward(torch.randn(4), torch.randn(4).double(), torch.randn(4).double())


# -------------------------------------------------------------------------------------- chunk halves


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("h", [1, 7, 8, 33, 64, 257])
@pytest.mark.parametrize("offset", [0, 1])
def test_chunk_halves_forward_and_backward(device: str, dtype: torch.dtype, h: int, offset: int) -> None:
    x, gate, up = chunk_halves(9, h, dtype, device, offset=offset)
    x_before = x.clone()
    out = torchops.swiglu(gate, up)
    assert out.is_contiguous() and out.shape == (9, h)
    assert_close_to_reference(out.cpu(), reference(gate, up))
    grad = random_tensor((9, h), dtype, device)
    grad_gate, grad_up = torch.ops.myns.swiglu_backward(grad, gate, up)
    ref_gate, ref_up = reference_backward(grad, gate, up)
    assert_close_to_reference(grad_gate.cpu(), ref_gate)
    assert_close_to_reference(grad_up.cpu(), ref_up)
    assert torch.equal(x, x_before), "inputs must not be written"


@pytest.mark.parametrize("device", DEVICES)
def test_chunk_halves_autograd_reaches_the_fused_input(device: str) -> None:
    # The LLaMA pattern: one projection, chunked; grads flow back into x through both views.
    x = random_tensor((6, 2 * 40), torch.float64, device).requires_grad_()
    weight = random_tensor((6, 40), torch.float64, device)
    (torchops.swiglu(*x.chunk(2, dim=-1)) * weight).sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    gate, up = x_ref.chunk(2, dim=-1)
    (F.silu(gate) * up * weight).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_chunk_halves_are_not_copied_cpu() -> None:
    # The only allocation of the call is the output: the strided halves are read in place.
    x, gate, up = chunk_halves(64, 96, torch.float32, "cpu")
    torchops.swiglu(gate, up)  # warm up
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        torchops.swiglu(gate, up)
    allocated = [e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0]
    assert sum(allocated) == 64 * 96 * 4, allocated


# --------------------------------------------------------------------------------- large |gate|, inf, NaN


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_large_gate_does_not_overflow(device: str, dtype: torch.dtype) -> None:
    values = [1e4, -1e4, 1e3, -1e3, 100.0, -100.0, 89.0, -89.0, 88.7, -88.7, 87.0, -87.0, 50.0, -50.0, 20.0, -20.0]
    gate = torch.tensor(values * 3, dtype=dtype, device=device)  # 48: vector body and scalar tail
    up = random_tensor(gate.shape, dtype, device)
    grad = random_tensor(gate.shape, dtype, device)
    out = torchops.swiglu(gate, up)
    grad_gate, grad_up = torch.ops.myns.swiglu_backward(grad, gate, up)
    for t in (out, grad_gate, grad_up):
        assert bool(t.isfinite().all()), t
    assert_close_to_reference(out.cpu(), reference(gate, up))
    ref_gate, ref_up = reference_backward(grad, gate, up)
    assert_close_to_reference(grad_gate.cpu(), ref_gate)
    assert_close_to_reference(grad_up.cpu(), ref_up)
    # silu(-1e4) * up is a (signed) zero, not NaN; silu(1e4) * up == 1e4 * up.
    assert out[1].item() == 0.0 and out[0].item() == pytest.approx(gate[0].item() * up[0].item(), rel=1e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_inf_and_nan_like_torch_silu(device: str, dtype: torch.dtype) -> None:
    inf, nan = math.inf, math.nan
    specials = [inf, -inf, nan, 1e4, -1e4, 0.0, -0.0, 1.0, -1.0]
    # Every (gate, up) pair of special values, 81 elements: through the vector loops and the tails.
    gate = torch.tensor([g for g in specials for _ in specials], dtype=dtype, device=device)
    up = torch.tensor([u for _ in specials for u in specials], dtype=dtype, device=device)
    grad = torch.tensor([1.5, -2.0, 0.5] * 27, dtype=dtype, device=device)
    expected = reference(gate, up)  # F.silu in float64: silu(+inf) = inf, silu(-inf) = NaN (-inf * 0)
    got = torchops.swiglu(gate, up).cpu().double()
    assert torch.equal(got.isnan(), expected.isnan())
    torch.testing.assert_close(got, expected.to(dtype).double(), equal_nan=True, rtol=1e-2, atol=0)
    for got_g, exp_g in zip(torch.ops.myns.swiglu_backward(grad, gate, up), reference_backward(grad, gate, up)):
        got_g = got_g.cpu().double()
        assert torch.equal(got_g.isnan(), exp_g.isnan())
        torch.testing.assert_close(got_g, exp_g.to(dtype).double(), equal_nan=True, rtol=1e-2, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_matches_torch_at_infinities(device: str) -> None:
    # torch's own autograd through F.silu(g) * u gives the same NaN/inf pattern as swiglu_backward.
    gate = torch.tensor([math.inf, -math.inf, 1e4, -1e4, 3.0], device=device, requires_grad=True)
    up = torch.tensor([2.0, 2.0, 2.0, 2.0, 2.0], device=device, requires_grad=True)
    got = torch.autograd.grad(torchops.swiglu(gate, up).sum(), (gate, up))
    expected = torch.autograd.grad((F.silu(gate) * up).sum(), (gate, up))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, equal_nan=True)


# ----------------------------------------------------------------------------------- ulp-level accuracy


def assert_within_ulps_of_float64(device: str, dtype: torch.dtype, n: int) -> None:
    # 16-bit: computed in f32 and rounded once, so within 1 ulp of the exact value. f32/f64: a few
    # roundings (exp <= 2 ulp, the division, two products). grad_gate is bounded relative to the size of
    # its terms: 1 + gate * (1 - s) cancels near gate = -1.28.
    gate = random_tensor((n,), dtype, device, low=-20, high=20)
    up, grad = random_tensor((n,), dtype, device), random_tensor((n,), dtype, device)
    g64, u64, d64 = (t.cpu().double() for t in (gate, up, grad))
    ulps = 1.0 if dtype in (torch.float16, torch.bfloat16) else 8.0
    f32_eps = 2.0**-23 if dtype != torch.float64 else 2.0**-52

    out = torchops.swiglu(gate, up).cpu().double()
    exact = reference(gate, up)
    assert bool(((out - exact).abs() <= ulps * ulp(exact, dtype)).all()), (out - exact).abs().max()

    grad_gate, grad_up = (t.cpu().double() for t in torch.ops.myns.swiglu_backward(grad, gate, up))
    exact_gate, exact_up = reference_backward(grad, gate, up)
    s = torch.sigmoid(g64)
    scale = (d64 * u64).abs() * (s + (g64 * s * (1 - s)).abs())
    bound = ulps * ulp(exact_gate, dtype) + 16 * f32_eps * scale
    assert bool(((grad_gate - exact_gate).abs() <= bound).all()), (grad_gate - exact_gate).abs().max()
    assert bool(((grad_up - exact_up).abs() <= ulps * ulp(exact_up, dtype)).all()), (grad_up - exact_up).abs().max()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_within_ulps_of_float64(device: str, dtype: torch.dtype) -> None:
    assert_within_ulps_of_float64(device, dtype, (1 << 16) + 5)


def test_cpu_outputs_over_32_mib_within_ulps() -> None:
    # f32 outputs of 32 MiB + 20 bytes: the CPU kernels allocate them with huge-page advice (core/empty.h).
    assert_within_ulps_of_float64("cpu", torch.float32, (1 << 23) + 5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_16_bit_gate(device: str, dtype: torch.dtype) -> None:
    # All 65536 bit patterns as the gate (the CPU looks 16-bit sigmoids up in a table built from them):
    # silu within 1 ulp of float64, NaN exactly where F.silu gives NaN; the backward's grad_up likewise.
    # Below gate = -88.72 exp(-gate) overflows f32 and the result is -0, as torch's own F.silu gives in
    # bf16 and f32 (the exact value, ~1e-37 at -89, is a bf16 number).
    gate = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype).to(device)
    ones = torch.ones_like(gate)
    exact = reference(gate, ones)
    overflow = gate.cpu().double() < -88.72
    checked = exact.isfinite() & ~overflow
    for got in (torchops.swiglu(gate, ones), torch.ops.myns.swiglu_backward(ones, gate, ones)[1]):
        got = got.cpu().double()
        assert torch.equal(got.isnan(), exact.isnan())
        assert torch.equal(got[exact.isinf()], exact[exact.isinf()])
        assert bool((got[overflow & ~exact.isnan()] == 0).all())
        err = (got[checked] - exact[checked]).abs()
        assert bool((err <= ulp(exact[checked], dtype)).all()), err.max()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_layout_does_not_change_the_bits(device: str, dtype: torch.dtype) -> None:
    # Contiguous, chunk halves, transposed and strided inputs run different loops; same values, same bits.
    _, gate, up = chunk_halves(37, 41, dtype, device)
    dense = torchops.swiglu(gate.contiguous(), up.contiguous())
    assert torch.equal(torchops.swiglu(gate, up), dense)
    assert torch.equal(torchops.swiglu(gate.t().contiguous().t(), up), dense)
    grads_dense = torch.ops.myns.swiglu_backward(dense, gate.contiguous(), up.contiguous())
    for got, want in zip(torch.ops.myns.swiglu_backward(dense, gate, up), grads_dense):
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_short_runs_match_the_vector_loop_bit_for_bit(dtype: torch.dtype) -> None:
    # Rows of 5 (row stride 8) go through the CPU driver's tail buffer, a contiguous tensor through its
    # 8-lane loop: the same conversions either way, compared as bits over every 16-bit gate (NaN payloads
    # included, which torch.equal cannot see). A NaN's sign is left out: IEEE 754 leaves it unspecified, and
    # in the H200 host's build the f16 backward's tail and loop gave NaNs of opposite sign (same payload).
    gate = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype).view(-1, 8)
    up, grad = random_tensor(gate.shape, dtype, "cpu"), random_tensor(gate.shape, dtype, "cpu")

    def assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
        assert torch.equal(got.isnan(), want.isnan())
        keep = torch.where(got.isnan(), 0x7FFF, -1).to(torch.int16)  # every bit, but a NaN's sign
        assert torch.equal(got.contiguous().view(torch.int16) & keep, want.contiguous().view(torch.int16) & keep)

    assert_same_bits(torchops.swiglu(gate[:, :5], up[:, :5]), torchops.swiglu(gate, up)[:, :5])
    short = torch.ops.myns.swiglu_backward(grad[:, :5], gate[:, :5], up[:, :5])
    for got, want in zip(short, torch.ops.myns.swiglu_backward(grad, gate, up)):
        assert_same_bits(got, want[:, :5])


# --------------------------------------------------------------------------------- autograd extras


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward(device: str) -> None:
    gate = random_tensor((4, 7), torch.float64, device).requires_grad_()
    up = random_tensor((4, 7), torch.float64, device).requires_grad_()
    assert torch.autograd.gradgradcheck(torchops.swiglu, (gate, up))
    # Hessian-vector product agrees with torch's own math.
    v = random_tensor((4, 7), torch.float64, device)

    def hvp(fn):
        g, u = gate.detach().clone().requires_grad_(), up.detach().clone().requires_grad_()
        grads = torch.autograd.grad(fn(g, u).sum(), (g, u), create_graph=True)
        return torch.autograd.grad(sum((x * v).sum() for x in grads), (g, u))

    for got, want in zip(hvp(torchops.swiglu), hvp(lambda g, u: F.silu(g) * u)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_mode_ad(device: str) -> None:
    gate, up = random_tensor((3, 5), torch.float64, device), random_tensor((3, 5), torch.float64, device)
    tg, tu = random_tensor((3, 5), torch.float64, device), random_tensor((3, 5), torch.float64, device)
    out, tangent = torch.func.jvp(torchops.swiglu, (gate, up), (tg, tu))
    ref_out, ref_tangent = torch.func.jvp(lambda g, u: F.silu(g) * u, (gate, up), (tg, tu))
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(tangent, ref_tangent)
    _, only_up = torch.func.jvp(lambda u: torchops.swiglu(gate, u), (up,), (tu,))
    torch.testing.assert_close(only_up, F.silu(gate) * tu)
    # Forward mode through swiglu_backward too (what torch.func.hessian of swiglu needs).
    grad_out = random_tensor((3, 5), torch.float64, device)
    ref = lambda g, x, u: torch.func.vjp(lambda a, b: F.silu(a) * b, x, u)[1](g)  # noqa: E731
    got = torch.func.jvp(torch.ops.myns.swiglu_backward, (grad_out, gate, up), (tg, tu, tg))
    want = torch.func.jvp(ref, (grad_out, gate, up), (tg, tu, tg))
    torch.testing.assert_close(got, want)



def _myns_lines(called: str) -> str:
    return "\n".join(line for line in called.splitlines() if line.startswith("myns."))


class ExportedGraph(TestCase):
    def test_exported_mlp_holds_the_swiglu_op_on_chunk_views(self) -> None:
        class GatedMLP(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.gate_up = torch.nn.Linear(8, 32, bias=False)
                self.down = torch.nn.Linear(16, 8, bias=False)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.down(torchops.swiglu(*self.gate_up(x).chunk(2, dim=-1)))

        ep = torch.export.export(GatedMLP(), (torch.randn(4, 8),))
        # Only the myns lines: how chunk is spelled (aten.chunk / aten.split) differs between releases; no
        # clone/contiguous between the chunk and the op either way.
        called = called_ops(ep.graph_module)
        assert "clone" not in called and "contiguous" not in called, called
        self.assertExpectedInline(_myns_lines(called), """myns.swiglu.default""")

    def test_joint_graph_calls_swiglu_backward(self) -> None:
        # What torch.compile traces for training: the backward is one myns.swiglu_backward node.
        from functorch.compile import aot_function, make_boxed_func

        graphs: list[torch.fx.GraphModule] = []

        def keep(gm, _inputs):
            graphs.append(gm)
            return make_boxed_func(gm.forward)

        fn = aot_function(lambda g, u: torchops.swiglu(g, u), fw_compiler=keep, bw_compiler=keep)
        fn(torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)).sum().backward()
        forward, backward = graphs
        self.assertIn("myns.swiglu.default", called_ops(forward))
        self.assertExpectedInline(_myns_lines(called_ops(backward)), """myns.swiglu_backward.default""")


# ------------------------------------------------------------------------------------------ CUDA only


@requires_cuda
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("h", [1, 3, 7, 9, 15, 17, 255, 1001, 11008])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_cuda_chunk_halves_rows_paths(dtype: torch.dtype, h: int, offset: int) -> None:
    # Odd H: rows never 16-byte aligned (scalar rows path); H % 8 == 0 and offset 0: the vector path;
    # offset != 0: misaligned bases. Outputs poisoned through the caching allocator first.
    from helpers import poison_cuda_cache

    x, gate, up = chunk_halves(33, h, dtype, "cuda", offset=offset)
    grad = random_tensor((33, h), dtype, "cuda")
    poison_cuda_cache()
    out = torchops.swiglu(gate, up)
    grad_gate, grad_up = torch.ops.myns.swiglu_backward(grad, gate, up)
    assert_close_to_reference(out.cpu(), reference(gate, up))
    ref_gate, ref_up = reference_backward(grad, gate, up)
    assert_close_to_reference(grad_gate.cpu(), ref_gate)
    assert_close_to_reference(grad_up.cpu(), ref_up)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_cuda_dense_every_alignment_and_tail(dtype: torch.dtype) -> None:
    for offset in range(0, 8):
        for n in (1, 7, 8, 9, 15, 16, 17, 255, 256, 257, 1023, 1025, 4096 * 4 + 5):
            gate = random_tensor((n + 8,), dtype, "cuda")[offset:offset + n]
            up = random_tensor((n + 8,), dtype, "cuda")[offset:offset + n]
            assert_close_to_reference(torchops.swiglu(gate, up).cpu(), reference(gate, up), msg=f"{offset} {n}")


@requires_cuda
def test_cuda_matches_cpu_closely() -> None:
    # Same formula on both devices (CPU: AVX2 exp, CUDA: expf): within a few f32 ulp of each other.
    for dtype in ALL_DTYPES:
        _, gate, up = chunk_halves(64, 11008 // 8, dtype, "cuda", low=-20, high=20)
        torch.testing.assert_close(torchops.swiglu(gate, up).cpu(), torchops.swiglu(gate.cpu(), up.cpu()),
                                   rtol=2e-6 if dtype == torch.float32 else None, atol=1e-6 if dtype == torch.float32 else None)


@requires_cuda
def test_cuda_current_stream_and_graph_capture() -> None:
    _, gate, up = chunk_halves(128, 64, torch.bfloat16, "cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    src = gate.clone()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        gate.copy_(src * 2)
        out = torchops.swiglu(gate, up)
    side.synchronize()
    assert_close_to_reference(out.cpu(), reference(src * 2, up))
    torchops.swiglu(gate, up)  # warm up outside capture
    graph = torch.cuda.CUDAGraph()
    grad = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    with torch.cuda.graph(graph):
        out = torchops.swiglu(gate, up)
        grads = torch.ops.myns.swiglu_backward(grad, gate, up)
    for _ in range(2):
        gate.copy_(torch.randn_like(gate))
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_reference(out.cpu(), reference(gate, up))
        for got, want in zip(grads, reference_backward(grad, gate, up)):
            assert_close_to_reference(got.cpu(), want)


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_cuda_second_gpu() -> None:
    torch.cuda.set_device(0)
    _, gate, up = chunk_halves(16, 24, torch.float32, "cuda:1")
    out = torchops.swiglu(gate, up)
    assert out.device == torch.device("cuda:1")
    assert_close_to_reference(out.cpu(), reference(gate, up))


@needs_gpu_memory(40)
def test_cuda_more_than_2_pow_31_elements() -> None:
    # Chunk halves with odd H past 2^31 elements: the scalar rows path with 64-bit indices; then even H
    # (16-byte vectors, 2^31+ elements), then a transposed gate (strided path, 64-bit offsets).
    rows, h = (1 << 16) + 1, (1 << 15) + 1  # > 2^31 elements per half
    x = torch.empty(rows, 2 * h, dtype=torch.bfloat16, device="cuda").uniform_(-4, 4)
    gate, up = x.chunk(2, dim=-1)
    assert gate.numel() > 1 << 31
    out = torchops.swiglu(gate, up)
    sample = torch.randint(0, gate.numel(), (1 << 16,), device="cuda")
    sample = torch.cat([sample, torch.tensor([0, gate.numel() - 1], device="cuda")])
    r, c = sample // h, sample % h
    assert_close_to_reference(out[r, c].cpu(), reference(gate[r, c], up[r, c]))
    del out, x, gate, up
    torch.cuda.empty_cache()
    n = (1 << 31) + 4099
    gate = torch.empty(n, dtype=torch.bfloat16, device="cuda").uniform_(-4, 4)
    up = torch.empty(n, dtype=torch.bfloat16, device="cuda").uniform_(-4, 4)
    grad_gate, grad_up = torch.ops.myns.swiglu_backward(up, gate, up)
    idx = torch.cat([torch.randint(0, n, (1 << 16,), device="cuda"), torch.arange(n - 20, n, device="cuda")])
    ref_gate, ref_up = reference_backward(up[idx], gate[idx], up[idx])
    assert_close_to_reference(grad_gate[idx].cpu(), ref_gate)
    assert_close_to_reference(grad_up[idx].cpu(), ref_up)
    del grad_gate, grad_up, up
    torch.cuda.empty_cache()
    cols = n // (1 << 16) + 1
    gate_t = torch.empty(cols, 1 << 16, dtype=torch.bfloat16, device="cuda").uniform_(-4, 4).t()
    up2 = torch.empty(1 << 16, cols, dtype=torch.bfloat16, device="cuda").uniform_(-4, 4)
    out = torchops.swiglu(gate_t, up2)
    r = torch.cat([torch.randint(0, 1 << 16, (1 << 14,), device="cuda"), torch.tensor([(1 << 16) - 1], device="cuda")])
    c = torch.cat([torch.randint(0, cols, (1 << 14,), device="cuda"), torch.tensor([cols - 1], device="cuda")])
    assert_close_to_reference(out[r, c].cpu(), reference(gate_t[r, c], up2[r, c]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_any_rank_forward_and_backward(device: str, dtype: torch.dtype) -> None:
    # 17 dims of size 2 stored in a scrambled order, which no stride pattern merges (more than the 16
    # the strided kernels take): the front ends hand the kernels dense copies.
    rank = 17
    order = list(range(rank))[1::2] + list(range(rank))[0::2]
    gate = random_tensor((2,) * rank, dtype, device).permute(*order)
    up = random_tensor((2,) * rank, dtype, device)
    out = torchops.swiglu(gate, up)
    assert out.is_contiguous()
    assert_close_to_reference(out.cpu(), reference(gate, up))
    grad = random_tensor((2,) * rank, dtype, device).permute(*order[::-1])
    grad_gate, grad_up = torch.ops.myns.swiglu_backward(grad, gate, up)
    ref_gate, ref_up = reference_backward(grad, gate, up)
    assert_close_to_reference(grad_gate.cpu(), ref_gate)
    assert_close_to_reference(grad_up.cpu(), ref_up)
