"""torch.autocast: each op follows its native counterpart's cast policy (csrc/autocast.cpp).

vector_add/vector_add_out/swiglu promote like add/mul; rms_norm is left as is on CPU and runs in float32 on
CUDA, like F.rms_norm; csr_spmm runs in autocast's dtype, like torch.sparse.mm. Eager, torch.compile
(fullgraph) and torch.export, on CPU and (skipped without a GPU) CUDA.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchops
from helpers import DEVICES, random_tensor, requires_cuda

# The expected policy of every public op, per device: "promote", "float32", "lower" (autocast's dtype) or
# "as is". A new public op must be added here (test_every_public_op_has_a_policy) and to csrc/autocast.cpp.
POLICIES: dict[str, dict[str, str]] = {
    "vector_add": {"cpu": "promote", "cuda": "promote"},
    "vector_add_out": {"cpu": "promote", "cuda": "promote"},
    "swiglu": {"cpu": "promote", "cuda": "promote"},
    "gelu_and_mul": {"cpu": "promote", "cuda": "promote"},
    "rms_norm": {"cpu": "as is", "cuda": "float32"},
    "add_rms_norm": {"cpu": "promote", "cuda": "float32"},
    "csr_spmm": {"cpu": "lower", "cuda": "lower"},
    "_csr_spmm_with_transpose": {"cpu": "lower", "cuda": "lower"},  # torchops.spmm's eager path
}
# Internal helpers the public ops' kernels call with their arguments already cast, and backward ops, which
# autograd runs in the dtypes the forward chose: autocast falls through for them.
NO_AUTOCAST_PREFIXES = ("_",)
NO_AUTOCAST_SUFFIXES = ("_backward",)

AUTOCAST_KEY = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}


def myns_ops() -> list[str]:
    return sorted(name.removeprefix("myns::") for name in torch._C._dispatch_get_all_op_names() if name.startswith("myns::"))


def test_every_public_op_has_a_policy() -> None:
    public = {name for name in myns_ops()
              if not name.startswith(NO_AUTOCAST_PREFIXES) and not name.endswith(NO_AUTOCAST_SUFFIXES)}
    assert public <= set(POLICIES), f"give these ops an autocast policy: {sorted(public - set(POLICIES))}"


@pytest.mark.parametrize("name", myns_ops())
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_autocast_kernels_registered_as_the_policy_says(name: str, device: str) -> None:
    policy = POLICIES.get(name, {}).get(device, "as is")
    has = torch._C._dispatch_has_kernel_for_dispatch_key(f"myns::{name}", AUTOCAST_KEY[device])
    assert has == (policy != "as is"), f"{name} on {device}: policy {policy}, kernel registered: {has}"


def test_no_dangling_registrations() -> None:
    # A policy row for an op the library does not define would leave a kernel without a schema.
    assert not [impl for impl in torch._C._dispatch_find_dangling_impls() if "myns::" in impl]


def _mlp_inputs(device: str):
    x = random_tensor((6, 16), torch.float32, device)
    lin = torch.nn.Linear(16, 16).to(device)
    return x, lin


def _check_eager(device: str) -> None:
    x, lin = _mlp_inputs(device)
    low = torch.bfloat16
    with torch.autocast(device, dtype=low):
        h = lin(x)
        assert h.dtype == low
        # Residual add of a float32 stream and a lower-precision projection: float32, as torch.add gives.
        y = torchops.vector_add(x, h)
        assert y.dtype == torch.float32
        assert torch.equal(y, x + h)
        assert torch.equal(torchops.vector_add(h, x), h + x)
        s = torchops.swiglu(h, x)
        assert s.dtype == torch.float32
        torch.testing.assert_close(s, F.silu(h.float()) * x)
        # Same dtypes: nothing to cast, the op runs as given.
        assert torchops.swiglu(h, h).dtype == low
        # Integers are not autocast: the op's own check still speaks.
        with pytest.raises(RuntimeError, match="myns::vector_add: a and b must have the same dtype"):
            torchops.vector_add(x, x.long())
        # float64 is never autocast (as in torch's autocast kernels).
        with pytest.raises(RuntimeError, match="myns::vector_add: a and b must have the same dtype"):
            torchops.vector_add(x.double(), h)


@pytest.mark.parametrize("device", DEVICES)
def test_eager_promote(device: str) -> None:
    _check_eager(device)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_flow_back_through_the_casts(device: str) -> None:
    x = random_tensor((5, 8), torch.float32, device).requires_grad_()
    g = random_tensor((5, 8), torch.float32, device).requires_grad_()
    with torch.autocast(device, dtype=torch.bfloat16):
        y = torchops.swiglu(g.bfloat16(), x)  # bfloat16 gate, float32 up
        assert y.dtype == torch.float32
    y.sum().backward()
    assert g.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    gate = g.detach().bfloat16().float()
    torch.testing.assert_close(x.grad, F.silu(gate))


@pytest.mark.parametrize("device", DEVICES)
def test_out_is_never_cast(device: str) -> None:
    x = random_tensor((4, 8), torch.float32, device)
    h = random_tensor((4, 8), torch.bfloat16, device)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = torch.empty(4, 8, device=device)
        assert torchops.vector_add(x, h, out=out) is out  # inputs promoted to out's float32
        assert torch.equal(out, x + h)
        # A lower-precision out is not silently fed a converted result: the op's dtype check refuses it.
        low_out = torch.zeros(4, 8, dtype=torch.bfloat16, device=device)
        with pytest.raises(RuntimeError, match="myns::vector_add_out: a and out must have the same dtype, got Float and BFloat16"):
            torchops.vector_add(x, h, out=low_out)
        assert not low_out.any()


def _rms_norm_expected_dtype(device: str, input_dtype: torch.dtype) -> torch.dtype:
    with torch.autocast(device, dtype=torch.bfloat16):
        x = torch.ones(2, 8, dtype=input_dtype, device=device)
        return F.rms_norm(x, (8,), torch.ones(8, device=device)).dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_like_torch(device: str, input_dtype: torch.dtype) -> None:
    x = random_tensor((3, 8), input_dtype, device)
    w = random_tensor((8,), torch.float32, device)
    with torch.autocast(device, dtype=torch.bfloat16):
        got = torchops.rms_norm(x, w)
        want = F.rms_norm(x, (8,), w, 1e-6)
    # Our policy is torch 2.14's: float32 under CUDA autocast, as is on the CPU. Older torch (2.11) leaves
    # F.rms_norm in the input's dtype on CUDA; the values agree either way.
    policy_dtype = torch.float32 if device == "cuda" else input_dtype
    assert got.dtype == policy_dtype
    if torch.__version__ >= "2.14" or device == "cpu":
        assert want.dtype == got.dtype == _rms_norm_expected_dtype(device, input_dtype)
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1.6e-2, atol=1e-2)


def _csr(device: str, dtype: torch.dtype):
    crow = torch.tensor([0, 2, 3, 5], device=device)
    col = torch.tensor([0, 2, 1, 0, 2], device=device)
    values = random_tensor((5,), dtype, device)
    return crow, col, values


@pytest.mark.parametrize("device", DEVICES)
def test_csr_spmm_in_lower_precision_like_sparse_mm(device: str) -> None:
    crow, col, values = _csr(device, torch.float32)
    dense = random_tensor((3, 4), torch.float32, device)
    with torch.autocast(device, dtype=torch.bfloat16):
        got = torchops.csr_spmm(crow, col, values, dense)
        got_spmm = torchops.spmm(torch.sparse_csr_tensor(crow, col, values, (3, 3)), dense)
    assert got.dtype == torch.bfloat16 and got_spmm.dtype == torch.bfloat16
    A = torch.sparse_csr_tensor(crow, col, values.bfloat16().double(), (3, 3)).to_dense()
    expected = A @ dense.bfloat16().double()
    torch.testing.assert_close(got.double(), expected, rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(got_spmm, got)


class _Block(torch.nn.Module):
    """A LLaMA-style MLP step under autocast: float32 residual stream, bfloat16 projections."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.norm_weight = torch.nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            gate, up = self.up(x).chunk(2, dim=-1)
            h = torchops.swiglu(gate, up.float())
            y = torchops.vector_add(x, h)
            return torchops.rms_norm(y, self.norm_weight)


def _check_block_traced(device: str, trace) -> None:
    torch.manual_seed(0)
    block = _Block().to(device)
    x = random_tensor((4, 16), torch.float32, device)
    expected = block(x)
    assert expected.dtype == torch.float32
    got = trace(block, x)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected)


def _compiled(block, x):
    torch._dynamo.reset()
    return torch.compile(block, fullgraph=True)(x)


def _exported(block, x):
    ep = torch.export.export(block, (x,))
    return ep.run_decompositions().module()(x)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device: str) -> None:
    _check_block_traced(device, _compiled)


@pytest.mark.parametrize("device", DEVICES)
def test_export(device: str) -> None:
    _check_block_traced(device, _exported)


def test_opcheck_under_autocast() -> None:
    x = random_tensor((4, 8), torch.float32, "cpu")
    h = random_tensor((4, 8), torch.bfloat16, "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.library.opcheck(torch.ops.myns.vector_add.default, (x, h),
                              test_utils=("test_schema", "test_faketensor"))
        torch.library.opcheck(torch.ops.myns.swiglu.default, (h, x), test_utils=("test_schema", "test_faketensor"))


@requires_cuda
def test_cuda_eager() -> None:
    _check_eager("cuda")


@requires_cuda
def test_cuda_rms_norm_runs_in_float32() -> None:
    x = random_tensor((3, 8), torch.bfloat16, "cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert torchops.rms_norm(x, torch.ones(8, device="cuda")).dtype == torch.float32
