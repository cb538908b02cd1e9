"""Every op on every PT2 path: torch.compile (fullgraph, dynamic, backward), torch.export + save/load,
TorchScript script/save/load and AOTInductor, the last three reloaded in a fresh process."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch
import torch._dynamo.testing

import torchops

from helpers import DEVICES, run_python
from op_db import OP_DB, OpInfo, ops

pytestmark = pytest.mark.slow

# Schema argument types -> TorchScript-able annotations (every type our schemas use; a new one fails loudly).
_ANNOTATIONS = {"Tensor": "Tensor", "Optional[Tensor]": "Optional[Tensor]", "float": "float", "int": "int",
                "Optional[float]": "Optional[float]",
                "SymInt": "int", "bool": "bool", "str": "str"}


def module_source(infos: list[OpInfo]) -> str:
    """Source of an nn.Module whose forward calls every op in `infos` with its schema's arguments (typed,
    so it also scripts), each op on its own arguments (prefixed op<i>_), returning one result per op.
    An out= op's result is the tensor it wrote."""
    params, body, results = [], [], []
    for i, info in enumerate(infos):
        arguments = info.op._schema.arguments
        params += [f"op{i}_{a.name}: {_ANNOTATIONS[str(a.type)]}" for a in arguments]
        call = f"torch.ops.myns.{info.name}({', '.join(f'op{i}_{a.name}' for a in arguments)})"
        if info.mutated_args:
            body.append(call)
            written = [f"op{i}_{arguments[j].name}.clone()" for j in info.mutated_args]
            results.append(written[0] if len(written) == 1 else f"({', '.join(written)})")
        else:
            body.append(f"r{i} = {call}")
            results.append(f"r{i}")
    lines = body + [f"return ({', '.join(results)},)"]
    return (
        "from typing import Optional\n\nimport torch\nfrom torch import Tensor\n\n\n"
        "class OpModule(torch.nn.Module):\n"
        f"    def forward(self, {', '.join(params)}):\n"
        + "".join(f"        {line}\n" for line in lines)
    )


def load_module(infos: list[OpInfo], directory: str) -> torch.nn.Module:
    """Writes module_source to `directory`/opmodule.py (importable by the fresh process too)."""
    path = os.path.join(directory, "opmodule.py")
    with open(path, "w") as f:
        f.write(module_source(infos))
    spec = importlib.util.spec_from_file_location(f"opmodule_{abs(hash(directory))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.OpModule()


def clone_args(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def eager_result(info: OpInfo, args):
    result = info.op(*args)
    if not info.mutated_args:
        return result
    written = tuple(args[i] for i in info.mutated_args)
    return written[0] if len(written) == 1 else written


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("info", ops())
# Python float arguments (rms_norm's eps) specialized, as constants: otherwise dynamo first traces them
# as tensors, restarts the frame when the op needs a Python float, and the counter sees two frames.
@torch._dynamo.config.patch(specialize_float=True)
def test_compile_fullgraph_dynamic_one_frame(info: OpInfo, device: str) -> None:
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")

    def fn(*args):
        return eager_result(info, args)

    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    for n in (5, 8, 13):
        args = info.sized_inputs(device, torch.float32, n)
        expected = fn(*clone_args(args))
        torch.testing.assert_close(compiled(*args), expected)
    assert counter.frame_count == 1, "one compiled frame must serve every size (no recompiles, no graph breaks)"
    assert counter.op_count >= 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("info", ops(lambda info: info.differentiable))
def test_compile_backward(info: OpInfo, device: str) -> None:
    def loss(*args):
        out = info.op(*args)
        outs = out if isinstance(out, tuple) else (out,)
        # Non-uniform weights, so a wrong grad can't hide behind symmetric ones.
        return sum((o * torch.linspace(-1, 2, o.numel(), device=o.device).view_as(o)).sum() for o in outs)

    compiled = torch.compile(loss, fullgraph=True, dynamic=True)
    for n in (5, 9):
        args = info.sized_inputs(device, torch.float32, n)
        # Float tensors only: index tensors (csr_spmm's) and non-tensor arguments get no gradient.
        leaf = lambda a: a.detach().clone().requires_grad_(a.dtype.is_floating_point) if isinstance(a, torch.Tensor) else a  # noqa: E731
        eager_args = [leaf(a) for a in args]
        comp_args = [leaf(a) for a in args]
        loss(*eager_args).backward()
        compiled(*comp_args).backward()
        for e, c in zip(eager_args, comp_args):
            if isinstance(e, torch.Tensor) and e.requires_grad:
                torch.testing.assert_close(c.grad, e.grad)


def _sized_args(infos: list[OpInfo], device: str, n: int) -> tuple:
    return tuple(a for info in infos for a in info.sized_inputs(device, torch.float32, n))


def _export(infos: list[OpInfo], device: str, directory: str):
    module = load_module(infos, directory)
    args = _sized_args(infos, device, 8)
    dynamic = tuple({0: torch.export.Dim.AUTO} if isinstance(a, torch.Tensor) else None for a in args)
    ep = torch.export.export(module, clone_args(args), dynamic_shapes=dynamic)
    return module, ep


def _check_in_fresh_process(infos: list[OpInfo], device: str, directory: str, module, load_snippet: str) -> None:
    """Saves inputs for two sizes, runs `load_snippet` (which binds `fn`) in a fresh process on them, and
    compares with the eager module, op by op."""
    cases = [_sized_args(infos, device, n) for n in (8, 13)]
    torch.save(cases, os.path.join(directory, "inputs.pt"))
    run_python(f"""
        import os, sys, torch
        import torchops
        directory = {directory!r}
        sys.path.insert(0, directory)
        {load_snippet}
        cases = torch.load(os.path.join(directory, "inputs.pt"))
        torch.save([fn(*args) for args in cases], os.path.join(directory, "outputs.pt"))
    """)
    outputs = torch.load(os.path.join(directory, "outputs.pt"))
    for args, got in zip(cases, outputs):
        expected = module(*clone_args(args))
        assert len(got) == len(infos)
        for info, g, e in zip(infos, got, expected):
            torch.testing.assert_close(g, e, msg=lambda m, name=info.name: f"{name}: {m}")


# Export is checked op by op in this process (cheap); the save -> load -> run round trips, which each pay
# for a fresh interpreter (and AOTInductor for a C++ build), are checked once per device over a module
# that calls every op.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("info", ops())
def test_export_graph_calls_op(info: OpInfo, device: str, tmp_path) -> None:
    module, ep = _export([info], device, str(tmp_path))
    assert f"torch.ops.myns.{info.name}.default" in ep.graph_module.code
    args = info.sized_inputs(device, torch.float32, 13)
    torch.testing.assert_close(ep.module()(*clone_args(args)), module(*clone_args(args)))


@pytest.mark.parametrize("device", DEVICES)
def test_export_save_load_fresh_process(device: str, tmp_path) -> None:
    module, ep = _export(OP_DB, device, str(tmp_path))
    torch.export.save(ep, str(tmp_path / "program.pt2"))
    _check_in_fresh_process(OP_DB, device, str(tmp_path), module,
                            "fn = torch.export.load(os.path.join(directory, 'program.pt2')).module()")


@pytest.mark.parametrize("device", DEVICES)
def test_torchscript_save_load_fresh_process(device: str, tmp_path) -> None:
    module = load_module(OP_DB, str(tmp_path))
    scripted = torch.jit.script(module)
    for info in OP_DB:
        assert f"myns::{info.name}" in str(scripted.graph)
    scripted.save(str(tmp_path / "scripted.pt"))
    _check_in_fresh_process(OP_DB, device, str(tmp_path), module,
                            "fn = torch.jit.load(os.path.join(directory, 'scripted.pt'))")


@pytest.mark.parametrize("device", DEVICES)
def test_aoti_package_fresh_process(device: str, tmp_path) -> None:
    module, ep = _export(OP_DB, device, str(tmp_path))
    torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "model.pt2"))
    _check_in_fresh_process(OP_DB, device, str(tmp_path), module,
                            "fn = torch._inductor.aoti_load_package(os.path.join(directory, 'model.pt2'))")


def test_compiled_csr_spmm_on_a_sparse_tensors_parts() -> None:
    # The README's advice for compiled code (torch.compile takes no sparse tensor): pass A's index tensors
    # and a clone of A.values() (the view itself trips dynamo): one graph, and the gradient still reaches A.
    crow, col = torch.tensor([0, 2, 2, 3]), torch.tensor([1, 3, 0])
    A = torch.sparse_csr_tensor(crow, col, torch.randn(3, dtype=torch.float64), (3, 4)).requires_grad_()
    dense = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(lambda c, k, v, d: torchops.csr_spmm(c, k, v, d) * 2, backend=counter, fullgraph=True)
    out = compiled(A.crow_indices(), A.col_indices(), A.values().clone(), dense)
    torch.testing.assert_close(out, 2 * (A.detach().to_dense() @ dense.detach()))
    out.sum().backward()
    assert counter.frame_count == 1
    assert A.grad is not None and dense.grad is not None
    torch.testing.assert_close(A.grad.to_dense(), 2 * (torch.ones(3, 5, dtype=torch.float64) @ dense.detach().t())
                               * (A.detach().to_dense() != 0))
