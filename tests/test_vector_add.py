"""vector_add specifics the generic tables don't express: the Python wrapper, out= aliasing, resizing and
version counters, the exported graph, strided layouts beyond the samples, and the import-time version check."""

from __future__ import annotations

import re

import pytest
import torch
import torch._dynamo.testing
from expecttest import TestCase
from torch._subclasses.fake_tensor import FakeTensorMode

import torchops
from helpers import (DEVICES, FLOAT_AND_INT_DTYPES, HALF_DTYPES, assert_close_to_reference, called_ops, make_layout,
                     poison_, random_tensor)
from op_db import OPS_BY_NAME
from torchops import _native


@pytest.mark.parametrize("device", DEVICES)
def test_wrapper_returns_out_and_writes_in_place(device: str) -> None:
    a, b = random_tensor((6, 5), torch.float32, device), random_tensor((6, 5), torch.float32, device)
    expected = a + b
    out = poison_(torch.empty_like(a))
    assert torchops.vector_add(a, b, out=out) is out
    torch.testing.assert_close(out, expected)
    a_copy = a.clone()
    assert torchops.vector_add(a, b, out=a) is a  # in place into an input
    torch.testing.assert_close(a, a_copy + b)


# An out of another shape is resized as torch.add(out=) resizes it: an empty one silently, any other with
# torch's deprecation warning (from its own resize_output).
_RESIZE_WARNING = "An output with one or more elements was resized since it had shape"


def _cpp_warnings(stderr: str) -> list[str]:
    """The C++ warnings (TORCH_WARN) in captured stderr, without their time stamps: through torch.ops they
    reach stderr, not Python's warnings, torch.ops.aten's and ours alike."""
    return re.findall(r"Warning: (.*?) \(function", stderr)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_shape", [(0,), (2, 0), (5,), (3, 4), (4, 3, 1)])
def test_out_of_another_shape_is_resized_like_torch_add(device: str, out_shape: tuple[int, ...], capfd) -> None:
    a, b = random_tensor((4, 3), torch.float32, device), random_tensor((4, 3), torch.float32, device)
    out, torch_out = torch.empty(out_shape, device=device), torch.empty(out_shape, device=device)
    capfd.readouterr()
    torch.ops.myns.vector_add_out(a, b, out)
    ours = _cpp_warnings(capfd.readouterr().err)
    torch.ops.aten.add.out(a, b, out=torch_out)
    theirs = _cpp_warnings(capfd.readouterr().err)
    assert out.shape == torch_out.shape == a.shape and out.stride() == torch_out.stride()
    assert torch.equal(out, a + b)
    assert ours == theirs and len(ours) == (torch.Size(out_shape).numel() != 0), (ours, theirs)
    if ours:
        assert ours[0].startswith(_RESIZE_WARNING)


@pytest.mark.parametrize("device", DEVICES)
def test_wrapper_warns_like_torch_add_when_it_resizes(device: str) -> None:
    a, b = random_tensor((4, 3), torch.float32, device), random_tensor((4, 3), torch.float32, device)
    for out_shape in [(5,), (3, 4)]:
        with pytest.warns(UserWarning, match=_RESIZE_WARNING):
            torch.add(a, b, out=torch.empty(out_shape, device=device))
        out = torch.empty(out_shape, device=device)
        with pytest.warns(UserWarning, match=_RESIZE_WARNING):
            assert torchops.vector_add(a, b, out=out) is out
        assert torch.equal(out, a + b)


def test_fake_kernel_resizes_out_as_the_kernels_do() -> None:
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    for out_shape in [(0,), (5,), (3, 4)]:
        real = torch.empty(out_shape)
        torch.ops.myns.vector_add_out(a, b, real)
        with FakeTensorMode() as mode:
            fake = mode.from_tensor(torch.empty(out_shape))
            torch.ops.myns.vector_add_out(mode.from_tensor(a), mode.from_tensor(b), fake)
        assert (fake.shape, fake.stride()) == (real.shape, real.stride())


@pytest.mark.parametrize("out_shape", [(0,), (5,)])
def test_compiled_out_of_another_shape_runs_eagerly(out_shape: tuple[int, ...]) -> None:
    # A traced graph cannot resize its input (dynamo does not trace torch.add(out=)'s resizing either): the call
    # is a graph break, run eagerly; fullgraph refuses it, naming the op.
    def fn(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        torchops.vector_add(a, b, out=out)
        return out * 2

    a, b = torch.randn(4, 3), torch.randn(4, 3)
    torch._dynamo.reset()
    out = torch.empty(out_shape)
    torch.testing.assert_close(torch.compile(fn)(a, b, out), (a + b) * 2)
    assert out.shape == a.shape
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=r"myns::vector_add_out: out of shape \[\d+\] would be resized"):
        torch.compile(fn, fullgraph=True)(a, b, torch.empty(out_shape))


@pytest.mark.parametrize("device", DEVICES)
def test_out_bumps_version_counter(device: str) -> None:
    a, b = torch.randn(4, device=device), torch.randn(4, device=device)
    out = torch.empty(4, device=device)
    before = out._version
    torchops.vector_add(a, b, out=out)
    assert out._version == before + 1


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_out_of_a_saved_tensor_is_caught_by_autograd(mode) -> None:
    # Writing through out= into a tensor that backward needs must be detected, as for torch's own ops,
    # also under inference_mode (which skips the Autograd kernel but not the version bump).
    x = torch.randn(4, requires_grad=True)
    y = x.exp()  # saves its result for backward
    with mode():
        torchops.vector_add(y.detach(), y.detach(), out=y)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_forward_mode_ad(device: str) -> None:
    import torch.autograd.forward_ad as fwAD

    a, b = torch.randn(3, 4, device=device), torch.randn(4, 3, device=device).t()
    ta, tb = torch.randn(3, 4, device=device), torch.randn(3, 4, device=device)
    with fwAD.dual_level():
        out = torchops.vector_add(fwAD.make_dual(a, ta), fwAD.make_dual(b, tb))
        primal, tangent = fwAD.unpack_dual(out)
        torch.testing.assert_close(primal, a + b)
        torch.testing.assert_close(tangent, ta + tb)
        only_a = fwAD.unpack_dual(torchops.vector_add(fwAD.make_dual(a, ta), b)).tangent
        torch.testing.assert_close(only_a, ta)
        with pytest.raises(RuntimeError, match="myns::vector_add_out: out= variants don't support forward-mode AD"):
            torchops.vector_add(fwAD.make_dual(a, ta), b, out=torch.empty(3, 4, device=device))
    # functorch's jvp, and forward-over-reverse with a leaf that also requires grad.
    _, jvp_out = torch.func.jvp(torchops.vector_add, (a, b), (ta, tb))
    torch.testing.assert_close(jvp_out, ta + tb)
    leaf = a.clone().requires_grad_()
    with fwAD.dual_level():
        out = torchops.vector_add(fwAD.make_dual(leaf, ta), b)
        torch.testing.assert_close(fwAD.unpack_dual(out).tangent, ta)
        out.sum().backward()
    torch.testing.assert_close(leaf.grad, torch.ones_like(leaf))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_AND_INT_DTYPES)
def test_every_sample_bit_identical_to_torch_add(device: str, dtype: torch.dtype) -> None:
    # One rounding of the exact sum, as torch.add does: any layout must give the very same bits.
    for sample in OPS_BY_NAME["vector_add"].sample_inputs(device, dtype, False):
        assert torch.equal(torchops.vector_add(*sample.args), torch.add(*sample.args)), sample.desc


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("shape", [(1, 1, 17), (3, 1, 5, 1), (2, 64, 3), (257, 3)])
@pytest.mark.parametrize("layouts", [("permuted", "transposed"), ("expanded", "sliced"), ("offset", "permuted")])
def test_more_layouts(device: str, dtype: torch.dtype, shape, layouts) -> None:
    a, b = (make_layout(shape, dtype, device, layout) for layout in layouts)
    out = torchops.vector_add(a, b)
    assert out.is_contiguous()
    assert_close_to_reference(out.cpu(), a.cpu().double() + b.cpu().double() if dtype.is_floating_point else a.cpu() + b.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_half_precision_matches_torch_add_exactly(device: str) -> None:
    # Same math as torch.add (f32 sum, one rounding), so the results are bit-identical.
    for dtype in HALF_DTYPES:
        a, b = random_tensor((4099,), dtype, device, low=-60000, high=60000), random_tensor((4099,), dtype, device)
        assert torch.equal(torchops.vector_add(a, b), torch.add(a, b))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_every_bit_pattern_rounds_like_torch_add(device: str, dtype: torch.dtype) -> None:
    # Random 16-bit patterns cover subnormals, infinities, NaNs and rounding ties, through the vector
    # loops (CPU AVX2/F16C, CUDA 16-byte) and their scalar tails (odd length).
    n = (1 << 18) + 7
    bits = lambda size: torch.randint(-(2**15), 2**15, (size,), dtype=torch.int16, device=device).view(dtype)  # noqa: E731
    for a, b in ((bits(n), bits(n)), (bits(3 * n)[::3], bits(n))):  # dense, and a strided operand
        got, want = torchops.vector_add(a, b), torch.add(a, b)
        same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
        assert bool(same.all()), f"{int((~same).sum())} elements differ from torch.add"


def test_inf_and_nan_propagate() -> None:
    a = torch.tensor([float("inf"), float("-inf"), float("nan"), 1.0, 65504.0], dtype=torch.float16)
    b = torch.tensor([1.0, float("inf"), 0.0, float("nan"), 65504.0], dtype=torch.float16)
    torch.testing.assert_close(torchops.vector_add(a, b), torch.add(a, b), equal_nan=True)


def test_integer_overflow_wraps_like_torch() -> None:
    a = torch.tensor([2**31 - 1, -(2**31)], dtype=torch.int32)
    b = torch.tensor([1, -1], dtype=torch.int32)
    assert torch.equal(torchops.vector_add(a, b), torch.add(a, b))


def test_version_mismatch_is_a_readable_import_error() -> None:
    _native.check_torch_version(torch.__version__, torch.__version__)
    _native.check_torch_version(None, torch.__version__)  # no record: nothing to compare
    with pytest.raises(ImportError, match=r"built against torch 2\.0\.0 but torch .* is installed; rebuild it with `make build`"):
        _native.check_torch_version("2.0.0", torch.__version__)


@pytest.mark.parametrize("device", DEVICES)
def test_wrapper_compiles_to_the_ops_without_graph_breaks(device: str) -> None:
    # The eager wrapper calls C++ entries dynamo can't see; the traced body registered for it must put
    # both OpOverloads in one graph.
    graphs = torch._dynamo.testing.EagerAndRecordGraphs()

    def fn(x: torch.Tensor, y: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        z = torchops.vector_add(x, y)
        return torchops.vector_add(z, y, out=buf) * 2

    torch._dynamo.reset()
    x, y = random_tensor((4, 3), torch.float32, device), random_tensor((4, 3), torch.float32, device)
    buf = poison_(torch.empty_like(x))
    got = torch.compile(fn, backend=graphs, fullgraph=True)(x, y, buf)
    torch.testing.assert_close(got, (x + 2 * y) * 2)
    torch.testing.assert_close(buf, x + 2 * y)
    assert len(graphs.graphs) == 1
    assert called_ops(graphs.graphs[0]).splitlines()[:2] == ["myns.vector_add.default", "myns.vector_add_out.default"]



class ExportedGraph(TestCase):
    def test_exported_graph_holds_exactly_the_myns_ops(self) -> None:
        class Residual(torch.nn.Module):
            def forward(self, x: torch.Tensor, y: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
                torch.ops.myns.vector_add_out(x, y, buf)
                return torchops.vector_add(buf, y)

        args = (torch.randn(4, 3), torch.randn(4, 3), torch.empty(4, 3))
        ep = torch.export.export(Residual(), args)
        self.assertExpectedInline(
            called_ops(ep.graph_module),
            """\
myns.vector_add_out.default
myns.vector_add.default""",
        )
        # Functionalized (what AOTInductor compiles): the mutation becomes auto_functionalized.
        functional = ep.run_decompositions()
        self.assertExpectedInline(
            called_ops(functional.graph_module),
            """\
auto_functionalized_v2
<built-in function getitem>
myns.vector_add.default""",
        )


# ------------------------------------------------------------------------------------ out= overlap rule
# out may be an input exactly, or share no element with it; anything else is refused, decided exactly for
# any strides. The reference: the element offsets of each view, as Python sets.


def _element_offsets(t: torch.Tensor) -> list[int]:
    offsets = [t.storage_offset()]
    for size, stride in zip(t.shape, t.stride()):
        offsets = [o + j * stride for o in offsets for j in range(size)]
    return offsets


def _same_view(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.storage_offset() == y.storage_offset() and all(
        sx == sy for n, sx, sy in zip(x.shape, x.stride(), y.stride()) if n > 1)


def _expect_out_accepted(out: torch.Tensor, a: torch.Tensor) -> bool:
    out_offsets, a_offsets = _element_offsets(out), _element_offsets(a)
    internal = len(set(out_offsets)) < len(out_offsets)
    shared = bool(set(out_offsets) & set(a_offsets)) and not _same_view(out, a)
    return not internal and not shared


def _check_out_rule(out: torch.Tensor, a: torch.Tensor) -> bool:
    """Runs vector_add(a, b, out=out), compares accept/refuse with the set reference and, when accepted, the
    values; returns whether it was accepted."""
    b = random_tensor(tuple(a.shape), a.dtype, a.device)
    expected = a.clone() + b
    accept = _expect_out_accepted(out, a)
    if accept:
        torchops.vector_add(a, b, out=out)
        torch.testing.assert_close(out, expected)
    else:
        with pytest.raises(RuntimeError, match=r"myns::vector_add_out: out (has internal overlap|partially overlaps a \(they share)"):
            torchops.vector_add(a, b, out=out)
    return accept


_NAMED_LAYOUTS = {
    # name: (storage size, out (shape, stride, offset), a (shape, stride, offset)), all on one storage
    "interleaved slices": (16, ((8,), (2,), 0), ((8,), (2,), 1)),
    "interleaved, issue repro": (9, ((4,), (2,), 0), ((4,), (2,), 1)),
    "same stride, shifted by one step": (16, ((7,), (2,), 0), ((7,), (2,), 2)),
    "chunk halves": (24, ((3, 4), (8, 1), 0), ((3, 4), (8, 1), 4)),
    "chunk halves, one transposed": (32, ((4, 4), (1, 8), 0), ((4, 4), (8, 1), 4)),
    "transposed halves": (32, ((4, 4), (4, 1), 0), ((4, 4), (1, 4), 16)),
    "transposed onto itself": (16, ((4, 4), (4, 1), 0), ((4, 4), (1, 4), 0)),
    "overlapping windows": (12, ((3, 4), (4, 1), 0), ((3, 4), (2, 1), 1)),
    "windows that interleave": (40, ((4, 4), (10, 2), 0), ((4, 4), (10, 2), 1)),
    "stride-0 input on the out's elements": (8, ((4,), (1,), 0), ((4,), (0,), 2)),
    "stride-0 input beside the out": (8, ((4,), (2,), 0), ((4,), (0,), 1)),
    "same view, size-1 dim strides differ": (8, ((4, 1), (1, 1), 0), ((4, 1), (1, 7), 0)),
    "out a column, a a row of one matrix": (16, ((4,), (4,), 0), ((4,), (1,), 1)),
    "out a column, a a row that crosses it": (16, ((4,), (4,), 0), ((4,), (1,), 4)),
    "3-D interleaved": (64, ((2, 2, 4), (32, 8, 2), 0), ((2, 2, 4), (32, 8, 2), 1)),
    "3-D, a permuted through out's gaps": (64, ((2, 2, 4), (32, 8, 2), 0), ((2, 2, 4), (2, 16, 4), 1)),
}


@pytest.mark.parametrize("name", list(_NAMED_LAYOUTS))
def test_out_overlap_layouts(name: str) -> None:
    size, (o_shape, o_stride, o_off), (a_shape, a_stride, a_off) = _NAMED_LAYOUTS[name]
    storage = torch.randn(size)
    _check_out_rule(storage.as_strided(o_shape, o_stride, o_off), storage.as_strided(a_shape, a_stride, a_off))


def test_out_overlap_named_layouts_cover_both_answers() -> None:
    answers = set()
    for size, (o_shape, o_stride, o_off), (a_shape, a_stride, a_off) in _NAMED_LAYOUTS.values():
        storage = torch.randn(size)
        answers.add(_expect_out_accepted(storage.as_strided(o_shape, o_stride, o_off), storage.as_strided(a_shape, a_stride, a_off)))
    assert answers == {True, False}


def test_issue_repro_disjoint_slices_are_accepted() -> None:
    x = torch.arange(16.0)
    y = torch.randn(8)
    expected = x[1::2] + y
    torchops.vector_add(x[1::2], y, out=x[0::2])
    torch.testing.assert_close(x[0::2], expected)
    # And what torch.add accepts: the same call through it agrees.
    x2 = torch.arange(16.0)
    torch.add(x2[1::2], y, out=x2[0::2])
    torch.testing.assert_close(x, x2)


def test_out_overlap_random_layouts_against_sets() -> None:
    # Random strided views (strides 0..12, ranks 1-3, random offsets) of one storage as out and a, with
    # out's own internal overlap included; thousands of cases in well under a second.
    import random

    rng = random.Random(1234)
    storage = torch.randn(160)
    counts = {True: 0, False: 0}
    for _ in range(3000):
        shape = [rng.randint(1, 5) for _ in range(rng.randint(1, 3))]

        def view() -> torch.Tensor:
            while True:
                strides = [rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12]) for _ in shape]
                offset = rng.randint(0, 30)
                if offset + sum((n - 1) * s for n, s in zip(shape, strides)) < storage.numel():
                    return storage.as_strided(shape, strides, offset)

        counts[_check_out_rule(view(), view())] += 1
    assert min(counts.values()) > 500, counts


def test_out_overlap_of_large_views_is_decided_quickly() -> None:
    # Views far too large to list element by element: the search decides them in a few steps.
    import time

    x = torch.empty(2048, 4096, dtype=torch.float16)
    half = 2048
    cases = [
        (x[:, :half], x[:, half:], True),            # chunk halves
        (x[:, 0::2], x[:, 1::2], True),              # interleaved columns
        (x[0::2], x[1::2], True),                    # interleaved rows
        (x[:, :half], x[:, 1:half + 1], False),      # shifted by one column
        (x[:1024, :1024], x[1024:, :1024].t(), True),  # a transposed block elsewhere
        (x[:1024, :1024], x[:1024, :1024].t(), False),  # the same block transposed
    ]
    for out, a, accept in cases:
        start = time.perf_counter()
        if accept:
            torchops.vector_add(a, a, out=out)
        else:
            with pytest.raises(RuntimeError, match="partially overlaps a \\(they share"):
                torchops.vector_add(a, a, out=out)
        assert time.perf_counter() - start < 0.5


def test_out_with_internal_overlap_beyond_stride_zero() -> None:
    # Overlapping windows (no stride is 0, so PyTorch can't tell): refused, exactly.
    storage = torch.randn(20)
    windows = storage.as_strided((4, 4), (2, 1))  # rows overlap
    with pytest.raises(RuntimeError, match="myns::vector_add_out: out has internal overlap"):
        torchops.vector_add(torch.randn(4, 4), torch.randn(4, 4), out=windows)
    disjoint = storage.as_strided((4, 4), (5, 1))  # gaps between rows: fine
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    torchops.vector_add(a, b, out=disjoint)
    torch.testing.assert_close(disjoint, a + b)


# ------------------------------------------------------------------------------------------- any rank
# Layouts that take more than 16 dimensions after merging go through dense copies (elementwise.h).


def _high_rank(dtype: torch.dtype, device: str, rank: int = 18) -> torch.Tensor:
    # Sizes 2 with the dims stored in a scrambled order: no two neighbours merge.
    order = list(range(rank))
    random_order = order[1::2] + order[0::2]
    base = random_tensor((2,) * rank, dtype, device)
    return base.permute(*random_order)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_any_rank(device: str, dtype: torch.dtype) -> None:
    a, b = _high_rank(dtype, device), _high_rank(dtype, device).contiguous()
    assert a.dim() == 18 and not a.is_contiguous()
    assert torch.equal(torchops.vector_add(a, b), torch.add(a, b))
    out = poison_(torch.empty_like(b).transpose(0, 17))  # yet another layout
    assert torchops.vector_add(a, b, out=out) is out
    assert torch.equal(out, torch.add(a, b))
    a_copy = a.clone()
    torchops.vector_add(a, b, out=a)  # in place into the scrambled input
    assert torch.equal(a, torch.add(a_copy, b))


@pytest.mark.parametrize("device", DEVICES)
def test_any_rank_gradients(device: str) -> None:
    # 2^17 elements: too many for gradcheck, so the gradients of a weighted sum, exact for an add.
    a = _high_rank(torch.float32, device, rank=17).requires_grad_()
    b = _high_rank(torch.float32, device, rank=17).requires_grad_()
    weight = random_tensor(tuple(a.shape), torch.float32, device)
    (torchops.vector_add(a, b) * weight).sum().backward()
    assert torch.equal(a.grad, weight) and torch.equal(b.grad, weight)
