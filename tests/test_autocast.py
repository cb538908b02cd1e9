"""torch.autocast: each op follows the cast policy its definition declares (csrc/ops.cpp, applied by
csrc/autocast.cpp), which is its native counterpart's.

The declared policies are read from the library (torchops._C.declarations()), never from a copy here: each
is checked against the kernels registered and against torch's own rule for that policy (what torch.add,
torch.mm or an op in autocast's fp32 list does under autocast) on op_db's samples. Then the counterparts
themselves: vector_add/swiglu like add/mul, rms_norm and layer_norm like F.rms_norm and F.layer_norm,
csr_spmm like torch.sparse.mm; eager, torch.compile (fullgraph) and torch.export, on CPU and (skipped without
a GPU) CUDA.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

import torchops
from helpers import DEVICES, is_public, random_tensor, requires_cuda
from op_db import OPS_BY_NAME

AUTOCAST_KEY = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}
DEVICE_INDEX = {"cpu": 0, "cuda": 1}
LOW = torch.bfloat16


def myns_ops() -> list[str]:
    return sorted(name.removeprefix("myns::") for name in torch._C._dispatch_get_all_op_names() if name.startswith("myns::"))


def declared_policy(name: str, device: str) -> str | None:
    """The policy op `name`'s definition declares for `device`; None when it declares none."""
    declared = torchops._C.declarations().get(name, {}).get("autocast")
    return None if declared is None else declared[DEVICE_INDEX[device]]


def ops_without_a_policy() -> list[str]:
    return [name for name in myns_ops() if is_public(name) and declared_policy(name, "cpu") is None]


def test_every_public_op_declares_a_policy() -> None:
    assert not ops_without_a_policy(), "declare an autocast policy in define() (csrc/ops.cpp) for these ops"


def test_declared_policies_are_known() -> None:
    for name in myns_ops():
        for device in AUTOCAST_KEY:
            assert declared_policy(name, device) in (None, "as is", "promote", "float32", "lower precision")


@pytest.mark.parametrize("name", myns_ops())
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_autocast_kernels_registered_as_declared(name: str, device: str) -> None:
    policy = declared_policy(name, device) or "as is"
    has = torch._C._dispatch_has_kernel_for_dispatch_key(f"myns::{name}", AUTOCAST_KEY[device])
    assert has == (policy != "as is"), f"{name} on {device}: policy {policy}, kernel registered: {has}"


def test_no_dangling_registrations() -> None:
    # An autocast kernel for an op the library does not define would be a kernel without a schema.
    assert not [impl for impl in torch._C._dispatch_find_dangling_impls() if "myns::" in impl]


# ------------------------------------------------------------------------------- torch's rule per policy
# What torch itself does under autocast to floating inputs of the given dtypes, per policy, observed on a
# torch op that has the policy: None means "left as they are".


def _torch_target(policy: str, device: str, dtypes: list[torch.dtype]) -> torch.dtype | None:
    one = lambda dtype: torch.ones(1, dtype=dtype, device=device)  # noqa: E731
    with torch.autocast(device, dtype=LOW):
        if policy == "promote":  # add is in no autocast list: type promotion settles it
            return functools.reduce(torch.add, [one(d) for d in dtypes]).dtype
        if policy == "lower precision":  # mm is in every device's lower-precision list
            return torch.mm(one(dtypes[0]).view(1, 1), one(dtypes[-1]).view(1, 1)).dtype
        if policy == "float32":  # mse_loss is in every device's fp32 list
            return F.mse_loss(one(dtypes[0]), one(dtypes[0])).dtype
    assert policy == "as is", policy
    return None


def _eligible(x: object, device: str) -> bool:
    """What autocast casts: floating tensors on its device other than float64."""
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.device.type == device and x.dtype != torch.float64


def _mixed(args: tuple, written: tuple[int, ...], device: str) -> tuple:
    """The sample's arguments with the first eligible tensor in autocast's dtype, the others float32."""
    out, first = [], True
    for i, a in enumerate(args):
        if i not in written and _eligible(a, device):
            a = a.detach().to(LOW if first else torch.float32)
            first = False
        elif isinstance(a, torch.Tensor):
            a = a.detach().clone()
        out.append(a)
    return tuple(out)


def _outcome(op, args: tuple, written: tuple[int, ...]):
    """The op's outputs (the written arguments for out= ops), or its error message."""
    try:
        result = op(*args)
    except RuntimeError as e:
        return str(e)
    if written:
        return tuple(args[i] for i in written)
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", [n for n in myns_ops() if declared_policy(n, "cpu") is not None])
def test_declared_policy_follows_torchs_rule(name: str, device: str) -> None:
    """Under autocast, the op gives exactly what it gives outside autocast on its inputs cast as torch's
    rule for the declared policy casts them."""
    policy = declared_policy(name, device)
    info = OPS_BY_NAME[name]
    written = info.mutated_args
    checked = 0
    for sample in info.sample_inputs(device, torch.float32, False)[:4]:
        args = _mixed(sample.args, written, device)
        dtypes = [a.dtype for i, a in enumerate(args) if i not in written and _eligible(a, device)]
        if not dtypes:
            continue
        target = _torch_target(policy, device, dtypes)
        cast = tuple(a.to(target) if target is not None and i not in written and _eligible(a, device) else a
                     for i, a in enumerate(args))
        expected = _outcome(info.op, tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in cast), written)
        with torch.autocast(device, dtype=LOW):
            got = _outcome(info.op, args, written)
        if isinstance(expected, str):
            assert got == expected, f"{sample.desc}: {policy}"
        else:
            assert not isinstance(got, str), f"{sample.desc}: {policy}: raised {got}"
            for g, e in zip(got, expected, strict=True):
                assert g.dtype == e.dtype, f"{sample.desc}: {policy}: {g.dtype} != {e.dtype}"
                torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True, msg=f"{sample.desc}: {policy}")
        checked += 1
    assert checked, f"no op_db sample of {name} has a tensor autocast could cast"


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


# (ours, torch's) on (input, weight, bias) of 8 columns.
_NORMS = {
    "rms_norm": (lambda x, w, b: torchops.rms_norm(x, w), lambda x, w, b: F.rms_norm(x, (8,), w, 1e-6)),
    "layer_norm": (lambda x, w, b: torch.ops.myns.layer_norm(x, w, b), lambda x, w, b: F.layer_norm(x, (8,), w, b)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", sorted(_NORMS))
def test_norms_like_torch(device: str, input_dtype: torch.dtype, op: str) -> None:
    ours, theirs = _NORMS[op]
    x = random_tensor((3, 8), input_dtype, device)
    w, b = random_tensor((8,), torch.float32, device), random_tensor((8,), torch.float32, device)
    with torch.autocast(device, dtype=torch.bfloat16):
        got = ours(x, w, b)
        want = theirs(x, w, b)
    # Our policy is torch 2.14's: float32 under CUDA autocast, as is on the CPU. Older torch (2.11) leaves
    # F.rms_norm in the input's dtype on CUDA (F.layer_norm has long been in the float32 list); the values
    # agree either way.
    assert got.dtype == (torch.float32 if device == "cuda" else input_dtype)
    if op == "layer_norm" or torch.__version__ >= "2.14" or device == "cpu":
        assert want.dtype == got.dtype
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
