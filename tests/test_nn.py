"""torchops.nn's modules as drop-ins for torch.nn's: RMSNorm and LayerNorm against torch.nn.RMSNorm and
torch.nn.LayerNorm (values, gradients, parameters, state_dict both ways, shape errors, repr), over one or
several trailing dimensions, and on every path a module takes: TorchScript, torch.fx, torch.compile,
torch.export, inference mode."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
import torch
from torch import nn

import torchops
from helpers import DEVICES

F64 = torch.float64

# (torchops module, torch's module, constructor arguments): the same arguments build both.
NORMS: dict[str, tuple[type[nn.Module], type[nn.Module]]] = {
    "RMSNorm": (torchops.nn.RMSNorm, nn.RMSNorm),
    "LayerNorm": (torchops.nn.LayerNorm, nn.LayerNorm),
}
SHAPES = [8, (8,), (4, 8), torch.Size((2, 3, 4))]


def _pair(kind: str, shape, device: str = "cpu", dtype: torch.dtype = F64, **kwargs) -> tuple[nn.Module, nn.Module]:
    """Ours and torch's, with the same random affine parameters (not the ones/zeros they start from)."""
    ours_cls, torch_cls = NORMS[kind]
    theirs = torch_cls(shape, device=device, dtype=dtype, **kwargs)
    with torch.no_grad():
        for p in theirs.parameters():
            p.uniform_(0.5, 1.5)
    ours = ours_cls(shape, device=device, dtype=dtype, **kwargs)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def _input(shape, *lead: int, device: str = "cpu", dtype: torch.dtype = F64,
           requires_grad: bool = False) -> torch.Tensor:
    trailing = (shape,) if isinstance(shape, int) else tuple(shape)
    return torch.randn(*lead, *trailing, device=device, dtype=dtype, requires_grad=requires_grad)


def _grads(module: nn.Module, x: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    x = x.detach().requires_grad_()
    out = module(x)
    return [out, *torch.autograd.grad(out, [x, *module.parameters()], g)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", sorted(NORMS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("affine", [True, False])
def test_matches_torch_values_and_gradients(kind: str, shape, affine: bool, device: str) -> None:
    ours, theirs = _pair(kind, shape, device, elementwise_affine=affine)
    for lead in [(5,), (2, 3), (0,), ()]:
        x = _input(shape, *lead, device=device)
        g = torch.randn_like(x)
        for got, want in zip(_grads(ours, x, g), _grads(theirs, x, g)):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_layer_norm_without_bias(shape) -> None:
    ours, theirs = _pair("LayerNorm", shape, bias=False)
    assert ours.bias is None and [n for n, _ in ours.named_parameters()] == ["weight"]
    x = _input(shape, 3)
    g = torch.randn_like(x)
    for got, want in zip(_grads(ours, x, g), _grads(theirs, x, g)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("kind", sorted(NORMS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_parameters_state_dict_and_repr_as_torch(kind: str, shape) -> None:
    for kwargs in ({}, {"elementwise_affine": False}, *([{"bias": False}] if kind == "LayerNorm" else [])):
        ours_cls, torch_cls = NORMS[kind]
        ours, theirs = ours_cls(shape, **kwargs), torch_cls(shape, **kwargs)
        assert repr(ours) == repr(theirs)
        assert ours.normalized_shape == theirs.normalized_shape
        assert [(n, p.shape, p.dtype) for n, p in ours.named_parameters()] == \
               [(n, p.shape, p.dtype) for n, p in theirs.named_parameters()]
        for (_, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
            assert torch.equal(p, q)  # the same initial values (ones, zeros)
        # Weights load either way.
        with torch.no_grad():
            for p in theirs.parameters():
                p.uniform_(0.5, 1.5)
        ours.load_state_dict(theirs.state_dict())
        back = torch_cls(shape, **kwargs)
        back.load_state_dict(ours.state_dict())
        for (_, p), (_, q) in zip(back.named_parameters(), theirs.named_parameters()):
            assert torch.equal(p, q)


def test_constructor_dtype_and_device() -> None:
    for cls in (torchops.nn.RMSNorm, torchops.nn.LayerNorm):
        m = cls((4, 8), dtype=torch.bfloat16, device="cpu")
        assert all(p.dtype == torch.bfloat16 and p.device.type == "cpu" and p.shape == (4, 8) for p in m.parameters())


@pytest.mark.parametrize("kind", sorted(NORMS))
@pytest.mark.parametrize("affine", [True, False])
def test_input_whose_trailing_dims_differ_raises_as_torch(kind: str, affine: bool) -> None:
    # torchops.nn.RMSNorm(64, elementwise_affine=False) used to normalise a 32-wide input without complaint.
    for shape, bad in [(64, (2, 32)), ((4, 8), (2, 4, 9)), ((4, 8), (2, 8, 4)), ((4, 8), (8,)), (8, ())]:
        ours, theirs = _pair(kind, shape, elementwise_affine=affine)
        x = torch.randn(bad, dtype=F64)
        with pytest.raises((RuntimeError, ValueError)):  # torch's RMSNorm: ValueError for too few dimensions
            theirs(x)
        # Both modules raise torch.nn.LayerNorm's error (torch's RMSNorm spells the same one "[*4, 8]").
        with pytest.raises(RuntimeError) as want:
            nn.LayerNorm(shape, elementwise_affine=False)(x)
        with pytest.raises(RuntimeError) as got:
            ours(x)
        assert str(got.value) == str(want.value)


@pytest.mark.parametrize("kind", sorted(NORMS))
def test_constructor_rejects_empty_or_zero_sizes(kind: str) -> None:
    for shape in [(), 0, (4, 0)]:
        with pytest.raises(ValueError, match=rf"torchops.nn.{kind}: normalized_shape"):
            NORMS[kind][0](shape)


def test_rms_norm_residual_over_several_dims() -> None:
    ours, theirs = _pair("RMSNorm", (4, 8))
    x, r = _input((4, 8), 3, 2, requires_grad=True), _input((4, 8), 3, 2, requires_grad=True)
    out, residual_out = ours(x, r)
    torch.testing.assert_close(residual_out, x + r)
    torch.testing.assert_close(out, theirs(x + r))
    with pytest.raises(RuntimeError, match=r"Given normalized_shape=\[4, 8\]"):
        ours(x, torch.randn(3, 2, 8, 4, dtype=F64))  # same element count, other trailing dims


@pytest.mark.parametrize("eps", [None, 1e-5])
def test_rms_norm_default_eps_follows_the_input_dtype(eps) -> None:
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        ours, theirs = _pair("RMSNorm", 8, dtype=dtype, eps=eps)
        x = torch.randn(3, 8, dtype=dtype) * 1e-4  # small: eps matters
        torch.testing.assert_close(ours(x), theirs(x))


# ---------------------------------------------------------------------------------------------------------
# The paths a module takes.

MODULE_CASES: dict[str, Callable[[], nn.Module]] = {
    "RMSNorm": lambda: torchops.nn.RMSNorm(8),
    "RMSNorm eps": lambda: torchops.nn.RMSNorm(8, eps=1e-5),
    "RMSNorm (4, 8)": lambda: torchops.nn.RMSNorm((4, 8)),
    "RMSNorm no affine": lambda: torchops.nn.RMSNorm(8, elementwise_affine=False),
    "RMSNorm gemma": lambda: torchops.nn.RMSNorm(8, weight_offset=1.0),
    "LayerNorm": lambda: torchops.nn.LayerNorm(8),
    "LayerNorm (4, 8)": lambda: torchops.nn.LayerNorm((4, 8)),
    "LayerNorm no bias": lambda: torchops.nn.LayerNorm(8, bias=False),
    "LayerNorm no affine": lambda: torchops.nn.LayerNorm((4, 8), elementwise_affine=False),
}


def _case(name: str) -> tuple[nn.Module, torch.Tensor]:
    module = MODULE_CASES[name]()
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(0.5, 1.5)
    shape = module.normalized_shape
    return module, torch.randn(3, 2, *shape)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit.script is deprecated in torch 2.14
@pytest.mark.parametrize("name", sorted(MODULE_CASES))
def test_torchscript(name: str) -> None:
    module, x = _case(name)
    scripted = torch.jit.script(module)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    for m in (scripted, loaded):
        torch.testing.assert_close(m(x), module(x))
    if name.startswith("RMSNorm"):
        r = torch.randn_like(x)
        for m in (scripted, loaded):
            torch.testing.assert_close(m(x, r), module(x, r))


@pytest.mark.parametrize("name", sorted(MODULE_CASES))
def test_fx_symbolic_trace(name: str) -> None:
    # torch.fx.symbolic_trace(torchops.nn.RMSNorm(8)) used to fail (the default eps's dtype test is Python
    # control flow), and with eps given the traced module wanted the residual.
    module, x = _case(name)
    traced = torch.fx.symbolic_trace(module)
    torch.testing.assert_close(traced(x), module(x))
    if name.startswith("RMSNorm"):
        r = torch.randn_like(x)
        torch.testing.assert_close(traced(x, r), module(x, r))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["RMSNorm", "RMSNorm (4, 8)", "LayerNorm", "LayerNorm (4, 8)"])
def test_compile_fullgraph_and_export(name: str) -> None:
    module, x = _case(name)
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    for lead in (3, 5):
        xs = torch.randn(lead, *x.shape[1:])
        torch.testing.assert_close(compiled(xs), module(xs))
    ep = torch.export.export(module, (x,), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    op = "rms_norm" if name.startswith("RMSNorm") else "layer_norm"
    assert f"torch.ops.myns.{op}.default" in ep.graph_module.code
    torch.testing.assert_close(ep.module()(x), module(x))


@pytest.mark.parametrize("kind", sorted(NORMS))
@pytest.mark.parametrize("shape", [8, (4, 8)], ids=str)
def test_inference_mode_input_with_a_weight_that_requires_grad(kind: str, shape) -> None:
    # F.rms_norm takes an input made under inference_mode with a weight that requires grad; torchops used to
    # raise "Inference tensors cannot be saved for backward". (F.layer_norm raises it: the reference runs
    # on a clone.)
    ours, theirs = _pair(kind, shape)
    with torch.inference_mode():
        x = _input(shape, 3)
        with_no_grad = ours(x)
    assert with_no_grad.is_inference()
    out, want = ours(x), theirs(x.clone())
    torch.testing.assert_close(out, want)
    g = torch.randn_like(out)
    for got, exp in zip(torch.autograd.grad(out, list(ours.parameters()), g),
                        torch.autograd.grad(want, list(theirs.parameters()), g)):
        torch.testing.assert_close(got, exp)
