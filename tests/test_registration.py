"""Registration audit: every myns op has an OpInfo, a schema tagged pt2_compliant, CPU and fake kernels,
a CUDA kernel when built with CUDA, and an Autograd kernel (differentiable or refusing, never the
silent fallback); and what is derived from its definition in csrc/ops.cpp: a DTensor sharding rule
(pointwise, or a row in torchops.distributed), and for public ops an autocast policy and a C++ entry point
in the generated <torchops/ops.h>. The op list comes from the dispatcher, never from a list in this file, so
a new schema is audited the moment it is registered (test_the_audit_sees_a_new_schema proves it)."""

from __future__ import annotations

import collections.abc
import json
import os
import re
import sys
import types

import pytest
import torch
from torch._library.simple_registry import singleton as simple_registry

import torchops
from helpers import HAS_CUDA, is_public, run_python
from op_db import OP_DB, OPS_BY_NAME
from torchops import _native


def myns_ops() -> list[str]:
    return sorted({name for name in torch._C._dispatch_get_all_op_names() if name.startswith("myns::")})


def missing_kernels(qualname: str) -> list[str]:
    """What the audit finds missing for one registered op: empty when it is complete."""
    has = lambda key: torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key)  # noqa: E731
    missing = [key for key in ("CPU", "Autograd") if not has(key)]
    if torchops.build_info()["with_cuda"] and not has("CUDA"):
        missing.append("CUDA")
    entry = simple_registry.find(qualname)
    if entry.fake_impl.kernel is None:
        missing.append("fake (meta_kernels)")
    return missing


def header_entries() -> set[str]:
    """The ops the generated C++ header <torchops/ops.h> has an entry point for."""
    header = os.path.join(os.path.dirname(torchops.__file__), "include", "torchops", "ops.h")
    with open(header) as f:
        return set(re.findall(r"^inline [^\n]*? (\w+)\(", f.read(), flags=re.MULTILINE))


def missing_derivations(qualname: str) -> list[str]:
    """What the audit finds missing among the things derived from an op's definition: empty when complete."""
    import torchops.distributed as td  # imports torch.distributed.tensor: only here

    name = qualname.removeprefix("myns::")
    packet = getattr(torch.ops.myns, name)
    missing = []
    if any(td.rule_factory(getattr(packet, o)) is None for o in packet.overloads()):
        missing.append("DTensor sharding rule (Pointwise in define(), else a row in torchops/distributed.py)")
    if is_public(name):
        if torchops._C.declarations().get(name, {}).get("autocast") is None:
            missing.append("autocast policy (define() in csrc/ops.cpp)")
        if name not in header_entries():
            missing.append("C++ entry point (define() in csrc/ops.cpp, then a build)")
    return missing


def untabled_ops() -> set[str]:
    """Registered myns ops without an OpInfo in op_db."""
    return {name.removeprefix("myns::") for name in myns_ops()} - set(OPS_BY_NAME)


def test_every_op_is_in_the_test_table() -> None:
    names = {name.removeprefix("myns::") for name in myns_ops()}
    assert names, "no myns ops registered"
    assert not untabled_ops(), "registered myns ops without an OpInfo in op_db"
    assert set(OPS_BY_NAME) <= names, "op_db names ops that are not registered"


@pytest.fixture(params=["audit_probe", "_audit_probe"])
def probe_op(request) -> collections.abc.Iterator[str]:
    """A throwaway schema in the myns namespace with only a CPU kernel, defined outside csrc/ops.cpp: what a
    half-added op looks like (public, or internal)."""
    lib = torch.library.Library("myns", "FRAGMENT")
    try:
        lib.define(f"{request.param}(Tensor x) -> Tensor")
        lib.impl(request.param, lambda x: x.clone(), "CPU")
        yield f"myns::{request.param}"
    finally:
        lib._destroy()  # the op is gone again for every later test in this process


def test_the_audit_sees_a_new_schema(probe_op: str) -> None:
    name = probe_op.removeprefix("myns::")
    assert probe_op in myns_ops()
    assert untabled_ops() == {name}
    assert "Autograd" in missing_kernels(probe_op) and "fake (meta_kernels)" in missing_kernels(probe_op)
    assert missing_kernels(probe_op)[0] != "CPU"
    missing = missing_derivations(probe_op)
    assert missing[0].startswith("DTensor sharding rule")
    if is_public(name):
        assert [m.split(" (")[0] for m in missing[1:]] == ["autocast policy", "C++ entry point"]
    else:
        assert len(missing) == 1


@pytest.mark.parametrize("qualname", myns_ops())
def test_derived_from_the_definition(qualname: str) -> None:
    assert not missing_derivations(qualname), f"{qualname}: missing {missing_derivations(qualname)}"


@pytest.mark.parametrize("qualname", myns_ops())
def test_kernels_registered(qualname: str) -> None:
    assert not missing_kernels(qualname), f"{qualname}: no kernel for {missing_kernels(qualname)}"


@pytest.mark.parametrize("info", OP_DB, ids=lambda info: info.name)
def test_schema_and_tags(info) -> None:
    packet = getattr(torch.ops.myns, info.name)
    assert torch.Tag.pt2_compliant_tag in info.op.tags
    assert packet.overloads() == ["default"]
    schema = info.op._schema
    assert schema.is_mutable == bool(info.mutated_args)
    written = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    # the written arguments the generic tests compare: all of them, or a prefix (rotary_embedding_'s optional key
    # is compared in its own file)
    assert written[:len(info.mutated_args)] == list(info.mutated_args)
    if info.mutated_args:
        assert len(schema.returns) == 0


def test_build_info() -> None:
    """What the binary says it was built against matches what setup.py recorded beside it, the torch that
    loaded it, and the kernels it actually registered."""
    info = torchops.build_info()
    assert info == _native.read_build_info(), "_C and _build_info.json come from different builds"
    assert info["torch"] == torch.__version__
    has_cuda_kernel = torch._C._dispatch_has_kernel_for_dispatch_key("myns::vector_add", "CUDA")
    assert info["with_cuda"] is has_cuda_kernel, "with_cuda disagrees with the registered kernels"
    if not info["with_cuda"]:
        assert info["cuda"] == "" and info["archs"] == ""
        return
    assert info["cuda"] == torch.version.cuda
    # TORCH_CUDA_ARCH_LIST spelling: "8.0;9.0", "9.0a", "8.6+PTX", space- or semicolon-separated.
    archs = [re.fullmatch(r"(\d+)\.(\d+)[af]?(\+PTX)?", a) for a in re.split(r"[;\s]+", info["archs"].strip())]
    assert archs and all(archs), f"unparseable archs {info['archs']!r}"
    if HAS_CUDA:  # the GPU here must run one of the built archs (or a PTX the driver compiles up)
        cap = torch.cuda.get_device_capability()
        built = [((int(m[1]), int(m[2])), m[3] is not None) for m in archs]
        assert any(c == cap or (ptx and c <= cap) for c, ptx in built), f"sm_{cap} not in {info['archs']}"


def test_compile_caches_are_keyed_by_this_torchops() -> None:
    """torch.compile's caches key a graph by op names alone: a graph traced through another build's autograd
    formulas or fake kernels (an op renamed, an internal op's meaning changed) would be loaded again. Importing
    torchops adds a digest of its sources to the key; it is stable, and a user's own tag stays in front of it."""
    info = torchops.build_info()
    assert re.fullmatch(r"[0-9a-f]{16}", info["sources"]), info
    tag = _native.tag_compile_caches()
    assert re.fullmatch(r"torchops-[0-9a-f]{16}", tag), tag
    assert torch.compiler.config.cache_key_tag.split("+").count(tag) == 1, torch.compiler.config.cache_key_tag
    out = run_python("import torch, torchops; print(torch.compiler.config.cache_key_tag)",
                     env={"TORCH_COMPILE_CACHE_KEY_TAG": "mine"})
    assert out.split()[-1] == f"mine+{tag}", out


def test_the_compile_cache_tag_follows_the_fake_kernels(tmp_path, monkeypatch) -> None:
    # A copy of the package whose fake kernels differ in one byte gets another tag.
    package = tmp_path / "torchops"
    package.mkdir()
    (package / "_build_info.json").write_text(json.dumps(torchops.build_info()))
    fake = package / "_meta_kernels"
    fake.mkdir()
    (fake / "op.py").write_text("x = 1\n")
    monkeypatch.setattr(_native, "_BUILD_INFO_PATH", str(package / "_build_info.json"))
    monkeypatch.setattr(_native, "_PACKAGE_DIR", str(package))
    monkeypatch.setitem(sys.modules, _native.FAKE_KERNELS, types.SimpleNamespace(__file__=str(fake / "__init__.py")))
    monkeypatch.setattr(torch.compiler.config, "cache_key_tag", "")
    first = _native.tag_compile_caches()
    (fake / "op.py").write_text("x = 2\n")
    monkeypatch.setattr(torch.compiler.config, "cache_key_tag", "")
    assert _native.tag_compile_caches() != first
