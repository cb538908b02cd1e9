"""The Python wrappers of torchops.ops (every name in ``__all__``) against their ops: the same arguments and
defaults as the schema, scriptable (TorchScript compiles a call of the wrapper as a call of its op), a short
TypeError for a None tensor, and inference-mode tensors taken as torch's own functions take them."""

from __future__ import annotations

import inspect
import io
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import torchops
from torchops import ops

# Wrappers that are not one op's: spmm takes a torch sparse CSR tensor (a call of csr_spmm on its parts);
# apply_rotary_pos_emb takes transformers' arguments (rotary_embedding's and an ignored position_ids).
NOT_ONE_OP = {"spmm", "apply_rotary_pos_emb"}


def _schema(name: str) -> torch.FunctionSchema:
    return getattr(torch.ops.myns, name).default._schema


def _op_wrappers() -> list[str]:
    return [name for name in ops.__all__ if name not in NOT_ONE_OP]


@pytest.mark.parametrize("name", _op_wrappers())
def test_wrapper_takes_the_schemas_arguments_and_defaults(name: str) -> None:
    # A schema that gains, renames, reorders or re-defaults an argument fails here until its wrapper follows.
    params = list(inspect.signature(getattr(ops, name)).parameters.values())
    arguments = _schema(name).arguments
    assert len(params) >= len(arguments), f"{name}: the wrapper lacks schema arguments"
    for p, a in zip(params, arguments):
        assert p.name == a.name, f"{name}: wrapper argument {p.name!r} where the schema has {a.name!r}"
        if a.has_default_value():
            assert p.default is not inspect.Parameter.empty and p.default == a.default_value, \
                f"{name}: {p.name}={p.default!r}, the schema's default is {a.default_value!r}"
        else:
            assert p.default is inspect.Parameter.empty, f"{name}: {p.name} has a default the schema lacks"
        if a.kwarg_only:
            assert p.kind is inspect.Parameter.KEYWORD_ONLY, f"{name}: {p.name} is keyword-only in the schema"
        else:
            assert p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY), (name, p)
    for p in params[len(arguments):]:  # the wrapper's own options (out=, check_invariants=)
        assert p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not inspect.Parameter.empty, \
            f"{name}: {p.name} is not in the schema, so it must be keyword-only with a default"


@pytest.mark.parametrize("name", ops.__all__)
def test_traced_twin_takes_the_wrappers_arguments(name: str) -> None:
    # torch.compile traces the twin wherever the wrapper is called: same arguments, or calls diverge.
    twin = getattr(ops, f"_{name}_traced")
    assert inspect.signature(twin) == inspect.signature(getattr(ops, name))


@pytest.mark.parametrize("name", _op_wrappers())
def test_torchscript_compiles_the_wrapper_as_its_op(name: str) -> None:
    assert torch.jit._builtins._find_builtin(getattr(ops, name)) == f"myns::{name}"
    assert torch.jit._builtins._find_builtin(getattr(torchops, name)) == f"myns::{name}"


# ---------------------------------------------------------------------------------------------------------
# Scripting modules that call every public wrapper, as torchvision's ops script.


def _csr() -> tuple[Tensor, Tensor, Tensor]:
    return torch.tensor([0, 2, 2, 3]), torch.tensor([1, 3, 0]), torch.randn(3)


class VectorAdd(torch.nn.Module):
    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return torchops.vector_add(a, b)


class Swiglu(torch.nn.Module):
    def forward(self, gate: Tensor, up: Tensor) -> Tensor:
        return torchops.swiglu(gate, up)


class GeluAndMul(torch.nn.Module):
    def forward(self, gate: Tensor, up: Tensor) -> Tensor:
        return torchops.gelu_and_mul(gate, up, approximate="tanh") + torchops.gelu_and_mul(gate, up)


class RMSNormCall(torch.nn.Module):
    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        return torchops.rms_norm(x, w, 1e-5, weight_offset=1.0) + torchops.rms_norm(x)


class AddRMSNorm(torch.nn.Module):
    def forward(self, x: Tensor, r: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        return torchops.add_rms_norm(x, r, w, eps=1e-5)


class LayerNormCall(torch.nn.Module):
    def forward(self, x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        return torchops.layer_norm(x, w, b, 1e-4) + torchops.layer_norm(x)


class CsrSpmm(torch.nn.Module):
    def forward(self, crow: Tensor, col: Tensor, values: Tensor, dense: Tensor) -> Tensor:
        return torchops.csr_spmm(crow, col, values, dense)


class Spmm(torch.nn.Module):
    def forward(self, A: Tensor, dense: Tensor) -> Tensor:
        return torchops.spmm(A, dense)


class SpmmReduce(torch.nn.Module):
    def forward(self, crow: Tensor, col: Tensor, dense: Tensor, values: Tensor) -> Tensor:
        return torchops.spmm_reduce(crow, col, values, dense, "max") + torchops.spmm_reduce(crow, col, None, dense)


class Sddmm(torch.nn.Module):
    def forward(self, crow: Tensor, col: Tensor, a: Tensor, b: Tensor) -> Tensor:
        return torchops.sddmm(crow, col, a, b) + torchops.sddmm(crow, col, a[:, 0], b[:, 1], op="mul")


class CsrSoftmax(torch.nn.Module):
    def forward(self, crow: Tensor, values: Tensor) -> Tensor:
        return torchops.csr_softmax(crow, values)


class LinearCrossEntropy(torch.nn.Module):
    def forward(self, x: Tensor, w: Tensor, t: Tensor, b: Tensor) -> Tensor:
        return torchops.linear_cross_entropy(x, w, t, linear_bias=b, reduction="sum") + torchops.linear_cross_entropy(
            x, w, t)


class CrossEntropy(torch.nn.Module):
    def forward(self, logits: Tensor, t: Tensor) -> Tensor:
        return torchops.cross_entropy(logits, t, label_smoothing=0.1) + torchops.cross_entropy(logits, t)


class RotaryEmbedding(torch.nn.Module):
    def forward(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        return torchops.rotary_embedding(q, k, cos, sin, interleaved=True)


class ApplyRotaryPosEmb(torch.nn.Module):
    def forward(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        return torchops.apply_rotary_pos_emb(q, k, cos, sin, None, 1)


class RotaryEmbeddingInPlace(torch.nn.Module):
    def forward(self, positions: Tensor, query: Tensor, cache: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
        q, k = query.clone(), key.clone()  # the same inputs give the eager and scripted calls the same outputs
        torchops.rotary_embedding_(positions, q, k, 8, cache, is_neox=False)
        return q, k


class QkNormRope(torch.nn.Module):
    def forward(self, q: Tensor, k: Tensor, wq: Tensor, wk: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        return torchops.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-5, weight_offset=1.0)


def _rope_args() -> tuple[Tensor, ...]:
    return torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8), torch.randn(1, 3, 6), torch.randn(1, 3, 6)


def _x() -> Tensor:
    return torch.randn(3, 8)


SCRIPT_CASES: dict[str, tuple[type[torch.nn.Module], Callable[[], tuple[Any, ...]]]] = {
    "vector_add": (VectorAdd, lambda: (_x(), _x())),
    "swiglu": (Swiglu, lambda: (_x(), _x())),
    "gelu_and_mul": (GeluAndMul, lambda: (_x(), _x())),
    "rms_norm": (RMSNormCall, lambda: (_x(), torch.randn(8))),
    "add_rms_norm": (AddRMSNorm, lambda: (_x(), _x(), torch.randn(8))),
    "layer_norm": (LayerNormCall, lambda: (_x(), torch.randn(8), torch.randn(8))),
    "csr_spmm": (CsrSpmm, lambda: (*_csr(), torch.randn(4, 5))),
    "spmm_reduce": (SpmmReduce, lambda: (*_csr()[:2], torch.randn(4, 5), torch.randn(3))),
    "sddmm": (Sddmm, lambda: (*_csr()[:2], torch.randn(3, 5), torch.randn(4, 5))),
    "csr_softmax": (CsrSoftmax, lambda: (_csr()[0], torch.randn(3, 2))),
    "linear_cross_entropy": (LinearCrossEntropy, lambda: (_x(), torch.randn(5, 8), torch.tensor([0, 4, 2]),
                                                          torch.randn(5))),
    "cross_entropy": (CrossEntropy, lambda: (torch.randn(3, 5), torch.tensor([0, 4, 2]))),
    "spmm": (Spmm, lambda: (torch.sparse_csr_tensor(*_csr(), (3, 4)), torch.randn(4, 5))),
    "rotary_embedding": (RotaryEmbedding, _rope_args),
    "apply_rotary_pos_emb": (ApplyRotaryPosEmb, _rope_args),
    "rotary_embedding_": (RotaryEmbeddingInPlace, lambda: (torch.tensor([3, 0, 2]), torch.randn(3, 16),
                                                           torch.randn(4, 6), torch.randn(3, 8))),
    "qk_norm_rope": (QkNormRope, lambda: (*_rope_args()[:2], torch.randn(8), torch.randn(8), *_rope_args()[2:])),
}
# The ops' other arguments without defaults (optional tensors too), for calls made with keywords.
REQUIRED_NON_TENSORS: dict[str, dict[str, Any]] = {"rotary_embedding_": {"head_size": 8, "key": None},
                                                   "spmm_reduce": {"values": None}}


def test_every_wrapper_has_a_scripting_case() -> None:
    assert sorted(SCRIPT_CASES) == sorted(ops.__all__)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit.script is deprecated in torch 2.14
@pytest.mark.parametrize("name", sorted(SCRIPT_CASES))
def test_module_calling_the_wrapper_scripts_saves_and_loads(name: str) -> None:
    cls, make_args = SCRIPT_CASES[name]
    module = cls()
    scripted = torch.jit.script(module)
    op = {"spmm": "csr_spmm", "apply_rotary_pos_emb": "rotary_embedding"}.get(name, name)
    assert f"myns::{op}" in str(scripted.inlined_graph), scripted.inlined_graph
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    args = make_args()
    expected = module(*args)
    torch.testing.assert_close(scripted(*args), expected)
    torch.testing.assert_close(loaded(*args), expected)


# ---------------------------------------------------------------------------------------------------------
# None where a tensor belongs: a TypeError naming the op and the argument.


def _tensor_arguments(name: str) -> list[str]:
    return [a.name for a in _schema(name).arguments if isinstance(a.type, torch.TensorType)]


def _good_args(name: str) -> dict[str, Any]:
    # The scripting case's arguments start with the schema's tensors, in order.
    return {**dict(zip(_tensor_arguments(name), SCRIPT_CASES[name][1]())), **REQUIRED_NON_TENSORS.get(name, {})}


@pytest.mark.parametrize("name", _op_wrappers())
def test_every_tensor_argument_none_is_a_type_error(name: str) -> None:
    tensors = _tensor_arguments(name)
    with pytest.raises(TypeError, match=rf"^myns::{name}: {tensors[0]} must be a Tensor, got None$"):
        getattr(torchops, name)(**{t: None for t in tensors}, **REQUIRED_NON_TENSORS.get(name, {}))


@pytest.mark.parametrize("name", _op_wrappers())
def test_one_tensor_argument_none_is_a_type_error_naming_it(name: str) -> None:
    good = _good_args(name)
    for t in _tensor_arguments(name):
        with pytest.raises(TypeError, match=rf"^myns::{name}: {t} must be a Tensor, got None$"):
            getattr(torchops, name)(**{**good, t: None})


def test_none_with_the_wrappers_own_options() -> None:
    crow, col, values = _csr()
    with pytest.raises(TypeError, match=r"^myns::vector_add_out: a must be a Tensor, got None$"):
        torchops.vector_add(None, None, out=torch.empty(2))
    with pytest.raises(TypeError, match=r"^myns::csr_spmm: crow_indices must be a Tensor, got None$"):
        torchops.csr_spmm(None, None, None, None, check_invariants=True)
    with pytest.raises(TypeError, match=r"^myns::csr_spmm: dense must be a Tensor, got None$"):
        torchops.csr_spmm(crow, col, values, None, check_invariants=True)


def test_spmm_none_is_a_type_error() -> None:
    A = torch.sparse_csr_tensor(*_csr(), (3, 4))
    with pytest.raises(TypeError, match=r"^torchops.spmm: A must be a Tensor, got None$"):
        torchops.spmm(None, torch.randn(4, 5))
    with pytest.raises(TypeError, match=r"^torchops.spmm: dense must be a Tensor, got None$"):
        torchops.spmm(A, None)


def test_a_bad_tensor_still_raises_the_ops_message() -> None:
    # The slow path a failed call takes changes nothing but None: the op's own error comes through.
    with pytest.raises(RuntimeError, match=r"^myns::swiglu: gate and up must have the same shape"):
        torchops.swiglu(torch.randn(4, 8), torch.randn(4, 9))


# ---------------------------------------------------------------------------------------------------------
# Tensors made under torch.inference_mode(), used outside it with an argument that requires grad: torch's
# functions mostly take them (F.rms_norm, F.silu(x) * y save only tensors they compute; F.layer_norm does
# not), so the wrappers do. The references run on a clone.

INFERENCE_CASES: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    # name: (torchops call, torch's math) on (inference x, y requiring grad, w requiring grad)
    "swiglu": (lambda x, y, w: torchops.swiglu(x, y), lambda x, y, w: F.silu(x) * y),
    "gelu_and_mul": (lambda x, y, w: torchops.gelu_and_mul(x, y), lambda x, y, w: F.gelu(x) * y),
    "rms_norm": (lambda x, y, w: torchops.rms_norm(x, w), lambda x, y, w: F.rms_norm(x, (8,), w, 1e-6)),
    "add_rms_norm": (lambda x, y, w: torchops.add_rms_norm(x, y, w)[0],
                     lambda x, y, w: F.rms_norm(x + y, (8,), w, 1e-6)),
    "layer_norm": (lambda x, y, w: torchops.layer_norm(x, w, y[0]),
                   lambda x, y, w: F.layer_norm(x, (8,), w, y[0], 1e-5)),
}


@pytest.mark.parametrize("name", sorted(INFERENCE_CASES))
def test_inference_tensor_with_an_argument_that_requires_grad(name: str) -> None:
    ours, torchs = INFERENCE_CASES[name]
    with torch.inference_mode():
        x = torch.randn(3, 8, dtype=torch.float64)
    y = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    out = ours(x, y, w)
    expected = torchs(x.clone(), y, w)
    torch.testing.assert_close(out, expected)
    g = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, (y, w), g, allow_unused=True, materialize_grads=True),
                               torch.autograd.grad(expected, (y, w), g, allow_unused=True, materialize_grads=True))


def test_inference_tensors_for_csr_spmm() -> None:
    with torch.inference_mode():
        crow, col, values = _csr()
    dense = torch.randn(4, 5, dtype=torch.float32, requires_grad=True)
    out = torchops.csr_spmm(crow, col, values, dense)
    A = torch.sparse_csr_tensor(crow.clone(), col.clone(), values.clone(), (3, 4))
    torch.testing.assert_close(out, A @ dense.detach())
    out.sum().backward()
    torch.testing.assert_close(dense.grad, A.to_dense().t() @ torch.ones(3, 5))
