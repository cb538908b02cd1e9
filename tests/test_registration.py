"""Registration audit: every myns op has an OpInfo, a schema tagged pt2_compliant, CPU and fake kernels,
a CUDA kernel when built with CUDA, and an Autograd kernel (differentiable or refusing, never the
silent fallback)."""

from __future__ import annotations

import pytest
import torch
from torch._library.simple_registry import singleton as simple_registry

import torchops
from op_db import OP_DB, OPS_BY_NAME


def myns_ops() -> list[str]:
    return sorted({name for name in torch._C._dispatch_get_all_op_names() if name.startswith("myns::")})


def test_every_op_is_in_the_test_table() -> None:
    names = {name.removeprefix("myns::") for name in myns_ops()}
    assert names, "no myns ops registered"
    assert names == set(OPS_BY_NAME), "op_db must cover exactly the registered myns ops"


@pytest.mark.parametrize("qualname", myns_ops())
def test_kernels_registered(qualname: str) -> None:
    has = lambda key: torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key)  # noqa: E731
    assert has("CPU"), f"{qualname}: no CPU kernel"
    assert has("Autograd"), f"{qualname}: no Autograd kernel"
    if torchops.build_info()["with_cuda"]:
        assert has("CUDA"), f"{qualname}: no CUDA kernel"
    entry = simple_registry.find(qualname)
    assert entry.fake_impl.kernel is not None, f"{qualname}: no fake kernel (meta_kernels)"


@pytest.mark.parametrize("info", OP_DB, ids=lambda info: info.name)
def test_schema_and_tags(info) -> None:
    packet = getattr(torch.ops.myns, info.name)
    assert torch.Tag.pt2_compliant_tag in info.op.tags
    assert packet.overloads() == ["default"]
    schema = info.op._schema
    assert schema.is_mutable == (info.mutated_arg is not None)
    if info.mutated_arg is not None:
        assert schema.arguments[info.mutated_arg].alias_info.is_write
        assert len(schema.returns) == 0


def test_build_info() -> None:
    info = torchops.build_info()
    assert info["torch"] == torch.__version__
    assert isinstance(info["with_cuda"], bool)
    if info["with_cuda"]:
        assert info["cuda"] and info["archs"]
