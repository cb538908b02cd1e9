"""CUDA-only behaviour of every op in op_db: current stream, CUDA graphs, device guard on a second GPU,
> 2^31 elements; then vector_add's own paths (dense alignment and tails, tiled transposes, 64-bit strided
and tiled offsets). Skipped without a GPU."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

import torchops
from helpers import (FLOAT_AND_INT_DTYPES, HAS_CUDA, assert_close_to_reference, needs_gpu_memory, poison_,
                     random_tensor, requires_cuda)
from op_db import OpInfo, ops, upcast

pytestmark = requires_cuda


# --- every op, through op_db: current stream, CUDA graphs, a second GPU, more than 2^31 elements ---------


def _dtype(info: OpInfo) -> torch.dtype:
    """float64 where the op has it, so comparisons between runs are free of rounding noise."""
    return torch.float64 if torch.float64 in info.dtypes else info.dtypes[0]


def _call(info: OpInfo, args: tuple) -> tuple[torch.Tensor, ...]:
    """Run the op; its outputs as a tuple (an out= op's outputs are the arguments it writes)."""
    result = info.op(*args)
    if info.mutated_args:
        return tuple(args[i] for i in info.mutated_args)
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _updates_in_place(info: OpInfo) -> bool:
    """The arguments the op writes are also read (rotary_embedding_'s query), not out= buffers."""
    return bool(info.mutated_args) and not info.name.endswith("_out")


def _tensor_inputs(info: OpInfo, args: tuple) -> list[int]:
    return [i for i, a in enumerate(args)
            if isinstance(a, torch.Tensor) and (i not in info.mutated_args or _updates_in_place(info))]


def _clones(args: tuple) -> tuple:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _assert_same(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], what: str) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, msg=lambda m: f"{what}, output {i}: {m}")


@pytest.mark.parametrize("info", ops())
def test_runs_on_the_current_stream(info: OpInfo) -> None:
    args = info.sized_inputs("cuda", _dtype(info), 4099)
    want = _call(info, _clones(args))
    # The data inputs (floating point; an index-only op's indices) start as zeros on the default stream and
    # get their values on a side stream kept busy first: a kernel launched on any other stream than the
    # current one reads the zeros and gives another answer.
    inputs = _tensor_inputs(info, args)
    delayed = [i for i in inputs if args[i].dtype.is_floating_point] or inputs
    staged = list(args)
    for i in delayed:
        staged[i] = torch.zeros_like(args[i])
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        for i in delayed:
            staged[i].copy_(args[i])
        got = _call(info, tuple(staged))
    side.synchronize()
    _assert_same(got, want, f"{info.name} on a side stream")


@pytest.mark.parametrize("info", ops())
def test_cuda_graph_capture_and_replay(info: OpInfo) -> None:
    args = info.sized_inputs("cuda", _dtype(info), 1000)
    _call(info, args)  # warm up outside capture (lazy initialisation, workspace allocation)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = _call(info, args)
    for replay in range(3):
        # New values in the captured inputs (the same structure: sized_inputs draws only the data at random),
        # and poison in the outputs, so each replay must read the one and write all of the other.
        fresh = info.sized_inputs("cuda", _dtype(info), 1000)
        for i in _tensor_inputs(info, args):
            args[i].copy_(fresh[i])
        before = _clones(args)
        for out in outs:
            if not _updates_in_place(info):
                poison_(out)
        graph.replay()
        torch.cuda.synchronize()
        _assert_same(outs, _call(info, before), f"{info.name} replay {replay}")


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("info", ops())
def test_second_gpu_with_current_device_elsewhere(info: OpInfo) -> None:
    torch.cuda.set_device(0)
    args = info.sized_inputs("cuda:1", _dtype(info), 4097)
    got = _call(info, args)
    assert all(out.device == torch.device("cuda:1") for out in got), [out.device for out in got]
    want = info.reference(*upcast(args))
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want, strict=True):
        assert_close_to_reference(g.cpu(), w)
    first = _tensor_inputs(info, args)[0]
    moved = tuple(a.to("cuda:0") if i == first else a for i, a in enumerate(args))
    with pytest.raises(RuntimeError, match=rf"myns::{info.name}: .*must be on the same device, got cuda:[01] and cuda:[01]"):
        _call(info, moved)


def _row_sized(info: OpInfo) -> int | None:
    """Row width when every tensor input of the op is rows of n (or a per-column vector) and an output is too,
    else None: the ops whose outputs are row by row, so a slice of rows can be recomputed on its own (not
    cross_entropy's mean: its forward op's per-row losses are)."""
    args = info.sized_inputs("cpu", torch.float32, 7)
    widths = {a.shape[1] for a in args if isinstance(a, torch.Tensor) and a.dim() == 2 and a.shape[0] == 7}
    others = [a for a in args if isinstance(a, torch.Tensor) and not (a.dim() == 2 and a.shape[0] == 7)
              and not (a.dim() == 1 and (a.shape[0] == 7 or a.shape[0] in widths))]
    if len(widths) != 1 or others or not any(out.dim() >= 1 and out.shape[0] == 7 for out in _call(info, args)):
        return None
    return widths.pop()


# The csr ops are not among these: their sized inputs build the sparsity structure in Python lists, which
# cannot reach 2^31 nonzeros in a test's time.
@needs_gpu_memory(48)
@pytest.mark.parametrize("info", ops(lambda info: torch.float16 in info.dtypes and _row_sized(info) is not None))
def test_more_than_2_pow_31_elements(info: OpInfo) -> None:
    width = _row_sized(info)
    n = (1 << 31) // width + 4099  # past 2^31 elements, plus a tail that misses every vector width
    args = info.sized_inputs("cuda", torch.float16, n)
    outs = _call(info, args)
    rows_outs = [i for i, out in enumerate(outs) if out.dim() >= 1 and out.shape[0] == n]
    assert rows_outs, f"{info.name}: no output has a row per input row"
    # Each half of the rows recomputed alone (under 2^31 elements: 32-bit offsets) must give the same rows,
    # every one of them; compared a slice at a time to bound the temporaries.
    split = n // 2 + 1
    for half in (slice(0, split), slice(split, n)):
        part = tuple(a[half] if isinstance(a, torch.Tensor) and a.dim() >= 1 and a.shape[0] == n else a
                     for a in args)
        if info.mutated_args:
            part = tuple(torch.empty_like(a) if i in info.mutated_args else a for i, a in enumerate(part))
        alone = _call(info, part)
        for i in rows_outs:
            full = outs[i][half]
            step = 1 << 24
            for start in range(0, full.shape[0], step):
                rows = slice(start, start + step)
                assert_close_to_reference(full[rows], alone[i][rows],
                                          msg=lambda m: f"output {i}, rows {half.start + start}+: {m}")
        del alone, part


# --- vector_add's own paths: dense alignment and tails, tiled transposes, 64-bit strided/tiled offsets ---


@pytest.mark.parametrize("dtype", FLOAT_AND_INT_DTYPES)
def test_dense_path_every_alignment_and_tail(dtype: torch.dtype) -> None:
    # Offsets 0..7 elements into the storage x sizes around the 16-byte vector and unroll widths:
    # covers out-aligned/input-misaligned, equal misalignment (head peeling) and the scalar tail.
    for offset_a in range(0, 8):
        for offset_b in (0, 3):
            for n in (1, 7, 8, 9, 15, 16, 17, 1023, 1024, 1025, 4096 * 4 + 5):
                a = random_tensor((n + 8,), dtype, "cuda")[offset_a:offset_a + n]
                b = random_tensor((n + 8,), dtype, "cuda")[offset_b:offset_b + n]
                out_base = poison_(torch.empty(n + 8, dtype=dtype, device="cuda"))
                out = out_base[offset_a:offset_a + n]
                torchops.vector_add(a, b, out=out)
                assert torch.equal(out, torch.add(a, b)), (offset_a, offset_b, n)
                # Elements around the written range keep their poison (NaN == NaN here).
                for untouched in (out_base[:offset_a], out_base[offset_a + n:]):
                    torch.testing.assert_close(untouched, poison_(untouched.clone()), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("shape", [(1, 1), (31, 33), (32, 32), (1000, 3), (3, 1000), (2_100_001, 2), (2, 70000)])
def test_tiled_transpose_path_edges(shape) -> None:
    # Partial tiles, one-row/one-column tiles and more than 65535 row tiles (grid.y is capped).
    rows, cols = shape
    a = torch.randn(cols, rows, device="cuda").t()
    for b in (torch.randn(rows, cols, device="cuda"), torch.randn(cols, rows, device="cuda").t(),
              torch.randn(rows, 2 * cols, device="cuda")[:, ::2]):
        assert torch.equal(torchops.vector_add(a, b), torch.add(a, b))


@needs_gpu_memory(40)
def test_vector_add_strided_and_tiled_paths_past_2_pow_31_elements() -> None:
    # Strided 64-bit path: a row broadcast (strides (0, 1)) can't merge with its neighbour dimension.
    rows = 1 << 16
    cols = ((1 << 31) + 4099) // rows + 1
    c = torch.randn(1, cols, dtype=torch.float16, device="cuda").expand(rows, cols)
    d = torch.randn(rows, cols, dtype=torch.float16, device="cuda")
    assert c.numel() > 1 << 31
    assert torch.equal(torchops.vector_add(c, d), torch.add(c, d))
    # Tiled path with 64-bit offsets.
    e = torch.randn(cols, rows, dtype=torch.float16, device="cuda").t()
    assert torch.equal(torchops.vector_add(e, d), torch.add(e, d))
