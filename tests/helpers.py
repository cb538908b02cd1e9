"""Shared test helpers: devices, tolerances, input makers, output poisoning, graph inspection and
fresh-process runs."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

from torchops._meta_kernels import _checks

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


def needs_gpu_memory(gib: int) -> pytest.MarkDecorator:
    """For tests past 2^31 elements: skipped unless the GPU has `gib` GiB free, and all of them sent to one
    pytest-xdist worker (``--dist loadgroup``, as the Makefile and gpu_check run the suite), one at a time:
    two or three at once on separate workers ran the GPU out of memory."""
    free = torch.cuda.mem_get_info()[0] if HAS_CUDA else 0
    skip = pytest.mark.skipif(free <= gib << 30, reason=f"needs ~{gib} GB of free GPU memory")
    group = pytest.mark.xdist_group("gpu_memory")
    return lambda fn: group(skip(fn))

# The supported dtypes: the lists the fake kernels check against (test_dtype_lists.py: the C++ kernels' too).
# Tests take their dtypes from here, never as a list of their own.
FLOAT_DTYPES = _checks.FLOAT_DTYPES
INT_DTYPES = _checks.INT_DTYPES
FLOAT_AND_INT_DTYPES = _checks.FLOAT_AND_INT_DTYPES
HALF_DTYPES = tuple(d for d in FLOAT_DTYPES if d.itemsize == 2)  # the 16-bit floats (computed in f32)

# (rtol, atol) against a float64 reference rounded to the output dtype.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.int32: (0.0, 0.0),
    torch.int64: (0.0, 0.0),
}


def assert_close_to_reference(actual: torch.Tensor, expected: torch.Tensor, **kwargs: Any) -> None:
    rtol, atol = TOLERANCES.get(actual.dtype, (1.3e-6, 1e-5))
    torch.testing.assert_close(actual, expected.to(actual.dtype), rtol=rtol, atol=atol, equal_nan=True, **kwargs)


def assert_close_to_sum(actual: torch.Tensor, expected: torch.Tensor, magnitude: torch.Tensor, terms: int) -> None:
    """assert_close_to_reference for entries that are float sums of up to `terms` products: each may also differ
    by terms * eps * magnitude (magnitude: the float64 sum of the products' absolute values; eps: of the float32
    or float64 the sum runs in), what any order of the sum can lose to cancellation."""
    rtol, atol = TOLERANCES.get(actual.dtype, (1.3e-6, 1e-5))
    eps = torch.finfo(torch.float64 if actual.dtype == torch.float64 else torch.float32).eps
    slack = terms * eps * magnitude.to(torch.float64)
    error = (actual.to(torch.float64).cpu() - expected.to(torch.float64).cpu()).abs()
    allowed = atol + rtol * expected.to(torch.float64).cpu().abs() + slack.cpu()
    bad = ~(error <= allowed) & ~(actual.cpu().isnan() & expected.cpu().isnan())
    assert not bad.any(), (f"{int(bad.sum())} of {bad.numel()} entries beyond the sum's bound; worst error "
                           f"{(error - allowed)[bad].max().item():.3g} past it")


def random_tensor(shape: Sequence[int], dtype: torch.dtype, device: str | torch.device, *,
                  low: float = -3.0, high: float = 3.0) -> torch.Tensor:
    """Random values that are never all zeros or ones: they would hide unwritten or mis-indexed output."""
    if dtype.is_floating_point:
        return torch.empty(shape, dtype=torch.float64, device=device).uniform_(low, high).to(dtype)
    return torch.randint(-1000, 1000, tuple(shape), dtype=dtype, device=device)


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of `dtype` numbers around the float64 values x (subnormal spacing near 0)."""
    fi = torch.finfo(dtype)
    return torch.pow(2.0, torch.floor(torch.log2(x.abs().clamp_min(fi.smallest_normal)))) * fi.eps


def exact_gelu(x: torch.Tensor, approximate: str) -> tuple[torch.Tensor, torch.Tensor]:
    """gelu and gelu' in float64 without the cancellations of torch's formulas far below zero (where
    1 + erf and 1 + tanh lose all digits): Phi = erfc(-x / sqrt 2) / 2; tanh form x sigmoid(w), w = 2u, with
    1 - sigmoid(w) = sigmoid(-w)."""
    x = x.detach().cpu().double()
    if approximate == "none":
        cdf = 0.5 * torch.special.erfc(-x / math.sqrt(2))
        pdf = torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        return x * cdf, cdf + x * pdf
    beta, kappa = math.sqrt(2 / math.pi), 0.044715
    w = 2 * beta * (x + kappa * x**3)
    s, one_minus_s = torch.sigmoid(w), torch.sigmoid(-w)
    return x * s, s + x * s * one_minus_s * 2 * beta * (1 + 3 * kappa * x * x)


def chunk_halves(rows: int | Sequence[int], h: int, dtype: torch.dtype, device: str, *, offset: int = 0,
                 low: float = -3.0, high: float = 3.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (rows x 2h, or (*rows, 2h) for a shape of rows, starting `offset` elements into its storage) and its
    halves x.chunk(2, -1): the gate and up of a fused projection, read in place by the gated ops."""
    lead = (rows,) if isinstance(rows, int) else tuple(rows)
    n = math.prod(lead) * 2 * h
    x = random_tensor((n + offset,), dtype, device, low=low, high=high)[offset:].view(*lead, 2 * h)
    gate, up = x.chunk(2, dim=-1)
    return x, gate, up


def make_layout(shape: Sequence[int], dtype: torch.dtype, device: str, layout: str) -> torch.Tensor:
    """A tensor of logical `shape` with the memory layout `layout`:

    contiguous   dense row-major
    transposed   2-D+: the last two dims swapped in memory (column-major matrix)
    sliced       every other element of the last dim
    offset       dense but starting one element into its storage (misses 16-byte alignment)
    expanded     stride 0 along the first dim (one row broadcast)
    permuted     3-D+: dims stored in reverse order
    """
    shape = tuple(shape)
    if layout == "contiguous":
        return random_tensor(shape, dtype, device)
    if layout == "transposed":
        return random_tensor(shape[:-2] + (shape[-1], shape[-2]), dtype, device).transpose(-1, -2)
    if layout == "sliced":
        return random_tensor(shape[:-1] + (shape[-1] * 2,), dtype, device)[..., ::2]
    if layout == "offset":
        n = 1
        for s in shape:
            n *= s
        return random_tensor((n + 1,), dtype, device)[1:].view(shape)
    if layout == "expanded":
        return random_tensor((1,) + shape[1:], dtype, device).expand(shape)
    if layout == "permuted":
        dims = list(reversed(range(len(shape))))
        return random_tensor(tuple(shape[d] for d in dims), dtype, device).permute(*dims)
    raise ValueError(f"unknown layout {layout}")


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill with a value no correct kernel produces from our inputs, so unwritten elements show."""
    if t.dtype.is_floating_point:
        return t.fill_(float("nan"))
    return t.fill_(torch.iinfo(t.dtype).min)


def poison_cuda_cache(nbytes: int = 64 << 20) -> None:
    """Leave the CUDA caching allocator holding NaN-filled blocks, so a freshly allocated output that a
    kernel forgets to write shows NaN (or a huge integer) instead of a lucky zero."""
    if HAS_CUDA:
        blocks = [torch.empty(size, dtype=torch.uint8, device="cuda").fill_(0xFF) for size in (nbytes, 1 << 20, 4096, 512)]
        del blocks


def run_python(code: str, *, timeout: int = 600, env: dict[str, str] | None = None) -> str:
    """Run `code` in a fresh interpreter that imports this checkout's torchops (with `env` added to the
    environment); return its stdout."""
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO_ROOT)
    assert proc.returncode == 0, f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def called_ops(graph_module: torch.fx.GraphModule) -> str:
    """The targets of a graph's call_function nodes, one per line, in order: what an exported or compiled
    graph runs. Node targets rather than generated code, whose formatting changes between torch releases."""
    return "\n".join(str(node.target) for node in graph_module.graph.nodes if node.op == "call_function")


# The property tests' profiles, chosen by HYPOTHESIS_PROFILE when this module is first imported (by every property
# test module, and by the subprocesses of test_properties.py): "ci", the default, derandomized (every run draws
# the same examples) and bounded; "long", 3000 examples a property from a fresh seed each run, the deeper search
# of the README's testing section. property_examples sizes each property under "ci".
_PROFILE_COMMON = dict(deadline=None, database=None, print_blob=True,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                              HealthCheck.filter_too_much])
settings.register_profile("ci", max_examples=60, derandomize=True, **_PROFILE_COMMON)
settings.register_profile("long", max_examples=3000, derandomize=False, **_PROFILE_COMMON)
PROPERTY_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROPERTY_PROFILE)


def property_examples(ci: int) -> int:
    """A property's example count: `ci` under the default profile, the loaded profile's (long: 3000) otherwise."""
    return ci if PROPERTY_PROFILE == "ci" else settings.default.max_examples


def is_public(name: str) -> bool:
    """Ops a user calls, which must declare an autocast policy and have a C++ entry point (the rule of
    scripts/gen_ops_header.py). Internal helpers (leading underscore) are called by the public ops' kernels
    with their arguments already cast, backward ops (and their out= forms) by autograd in the dtypes the
    forward chose: they declare a policy only when a wrapper calls them directly (torchops.spmm's eager path)."""
    return not name.startswith("_") and "_backward" not in name
