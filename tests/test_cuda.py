"""CUDA-only behaviour: current stream, CUDA graphs, device guard on a second GPU, > 2^31 elements, and
the dense path's alignment and tail handling at sizes around the vector width. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

import torchops
from helpers import HAS_CUDA, poison_, random_tensor, requires_cuda

pytestmark = requires_cuda


def test_runs_on_the_current_stream() -> None:
    side = torch.cuda.Stream()
    a = torch.zeros(1 << 20, device="cuda")
    b = torch.randn(1 << 20, device="cuda")
    src = torch.randn(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keeps the side stream busy, so a kernel on another stream runs first
        a.copy_(src)
        out = torchops.vector_add(a, b)
    side.synchronize()
    torch.testing.assert_close(out, src + b)


def test_cuda_graph_capture_and_replay() -> None:
    a, b = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    out_buf = torch.empty(1000, device="cuda")
    torchops.vector_add(a, b)  # warm up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torchops.vector_add(a, b)
        torchops.vector_add(out, b, out=out_buf)
    for _ in range(3):
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, a + b)
        torch.testing.assert_close(out_buf, a + 2 * b)


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_gpu_with_current_device_elsewhere() -> None:
    torch.cuda.set_device(0)
    a, b = torch.randn(4097, device="cuda:1"), torch.randn(4097, device="cuda:1")
    out = torchops.vector_add(a, b)
    assert out.device == torch.device("cuda:1")
    torch.testing.assert_close(out, a + b)
    with pytest.raises(RuntimeError, match=r"myns::vector_add: a and b must be on the same device, got cuda:0 and cuda:1"):
        torchops.vector_add(a.to("cuda:0"), b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.int32])
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


def _has_free_memory(nbytes: int) -> bool:
    free, _ = torch.cuda.mem_get_info()
    return free > nbytes


@pytest.mark.skipif(not HAS_CUDA or not _has_free_memory(40 << 30), reason="needs ~40 GB of GPU memory")
def test_more_than_2_pow_31_elements() -> None:
    n = (1 << 31) + 4099  # 64-bit indexing in the dense path, plus a tail
    a = torch.randn(n, dtype=torch.float16, device="cuda")
    b = torch.randn(n, dtype=torch.float16, device="cuda")
    out = torchops.vector_add(a, b)
    assert torch.equal(out, torch.add(a, b))
    del out
    # Strided 64-bit path: a row broadcast (strides (0, 1)) can't merge with its neighbour dimension.
    rows = 1 << 16
    cols = n // rows + 1
    c = torch.randn(1, cols, dtype=torch.float16, device="cuda").expand(rows, cols)
    d = torch.randn(rows, cols, dtype=torch.float16, device="cuda")
    assert c.numel() > 1 << 31
    assert torch.equal(torchops.vector_add(c, d), torch.add(c, d))
    # Tiled path with 64-bit offsets.
    e = torch.randn(cols, rows, dtype=torch.float16, device="cuda").t()
    assert torch.equal(torchops.vector_add(e, d), torch.add(e, d))
