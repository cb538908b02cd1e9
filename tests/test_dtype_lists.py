"""The dtype lists are one fact: csrc/core/dispatch.h generates both the C++ argument checks and the
dispatch cases from its lists, and meta_kernels/_checks.py holds the same lists for the fake kernels and the
tests (helpers.py, and through it op_db's `dtypes`; no test types a list of its own). Here the Python lists are
read against dispatch.h's, and every op's real and fake kernels are called with every dtype a tensor can
have: each must accept exactly its op_db dtypes (a listed dtype without a dispatch case would raise "not
implemented") and reject every other one with the unsupported-dtype error naming the same list, in order.
"""

from __future__ import annotations

import pathlib
import re
import warnings
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import helpers
from helpers import DEVICES, REPO_ROOT
from torchops._meta_kernels import _checks
from op_db import OP_DB, OpInfo


def _convertible_dtypes(device: str) -> list[torch.dtype]:
    """Every torch dtype a float tensor on `device` converts to (quantized and bit-packed ones do not)."""
    all_dtypes = {getattr(torch, n) for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}
    found = []
    for d in sorted(all_dtypes, key=str):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "ComplexHalf support is experimental"
                torch.zeros(2, device=device).to(d)
        except (RuntimeError, TypeError):
            continue
        found.append(d)
    return found


def _retyped(x: Any, old: torch.dtype, new: torch.dtype) -> Any:
    """x with every tensor of dtype `old` converted to `new` (so an op's other tensors, such as CSR indices
    or a float32 rstd, keep theirs)."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(new) if x.dtype == old else x
    if isinstance(x, (list, tuple)):
        return type(x)(_retyped(y, old, new) for y in x)
    return x


def _call(info: OpInfo, args: tuple, kwargs: dict, fake: bool) -> None:
    if not fake:
        info.op(*args, **kwargs)
        return
    with FakeTensorMode() as mode:
        to_fake = lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x  # noqa: E731
        info.op(*[to_fake(a) for a in args], **{k: to_fake(v) for k, v in kwargs.items()})


def test_python_lists_are_one_source() -> None:
    assert _checks.FLOAT_AND_INT_DTYPES == _checks.FLOAT_DTYPES + _checks.INT_DTYPES
    assert len(set(_checks.FLOAT_AND_INT_DTYPES)) == len(_checks.FLOAT_AND_INT_DTYPES)
    assert all(d.is_floating_point for d in _checks.FLOAT_DTYPES)
    assert not any(d.is_floating_point or d.is_complex for d in _checks.INT_DTYPES)
    for name in ("FLOAT_DTYPES", "INT_DTYPES", "FLOAT_AND_INT_DTYPES"):
        assert getattr(helpers, name) is getattr(_checks, name)


def test_python_lists_are_dispatch_h_lists() -> None:
    """The X-macro lists of csrc/core/dispatch.h, dtype for dtype and in order (c10 spells at::kHalf "Half",
    as _checks._dtype_name does)."""
    text = (pathlib.Path(REPO_ROOT) / "csrc" / "core" / "dispatch.h").read_text()
    for name, listed in (("FLOAT", _checks.FLOAT_DTYPES), ("INT", _checks.INT_DTYPES)):
        body = re.search(rf"#define TORCHOPS_FOR_EACH_{name}_DTYPE\(F, \.\.\.\)((?:.*\\\n)*.*)", text)
        assert body, f"no TORCHOPS_FOR_EACH_{name}_DTYPE in dispatch.h"
        assert re.findall(r"F\(at::k(\w+),", body.group(1)) == [_checks._dtype_name(d) for d in listed]


_DTYPE_LITERAL = re.compile(r"[(\[{]\s*torch\.\w+(?:\s*,\s*torch\.\w+)+\s*,?\s*[)\]}]")


def test_no_test_types_a_list_of_its_own() -> None:
    """A literal list of dtypes that is one of the supported lists (or its 16-bit floats) belongs in helpers,
    which takes them from _checks; a literal selection of a few dtypes, for a test too slow for all, is fine."""
    lists = {frozenset(d) for d in (_checks.FLOAT_DTYPES, _checks.INT_DTYPES, _checks.FLOAT_AND_INT_DTYPES,
                                    helpers.HALF_DTYPES)}
    found = []
    for path in sorted(pathlib.Path(REPO_ROOT, "tests").rglob("*.py")):
        if path.name == "helpers.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for literal in _DTYPE_LITERAL.findall(line):
                names = re.findall(r"torch\.(\w+)", literal)
                dtypes = {getattr(torch, n) for n in names if isinstance(getattr(torch, n, None), torch.dtype)}
                if len(dtypes) == len(names) and frozenset(dtypes) in lists:
                    found.append(f"{path.relative_to(REPO_ROOT)}:{number}: {literal}")
    assert not found, "dtype lists typed again (take them from helpers):\n" + "\n".join(found)


@pytest.mark.parametrize("fake", [False, True], ids=["kernel", "fake"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("info", OP_DB, ids=lambda info: info.name)
def test_kernels_accept_exactly_the_listed_dtypes(info: OpInfo, device: str, fake: bool) -> None:
    base = info.dtypes[0]
    sample = info.sample_inputs(device, base, False)[-1]
    supported = ", ".join(_checks._dtype_name(d) for d in info.dtypes)
    rejected = []
    for dtype in _convertible_dtypes(device):
        if dtype in info.dtypes:  # raises if no kernel was compiled for it
            listed = info.sample_inputs(device, dtype, False)[-1]
            _call(info, listed.args, listed.kwargs, fake)
            continue
        args, kwargs = _retyped(sample.args, base, dtype), _retyped(sample.kwargs, base, dtype)
        # The dtype's own spelling is not compared: the fake kernels name exotic dtypes as Python does.
        with pytest.raises(RuntimeError, match=rf"(?m)^myns::{info.name}: \w+ has unsupported dtype \S+; "
                                               rf"supported: {re.escape(supported)}$"):
            _call(info, args, kwargs, fake)
        rejected.append(dtype)
    assert torch.bool in rejected and torch.complex64 in rejected  # the sweep reached beyond the list


def _index_dtype(x: Any) -> torch.dtype | None:
    """The dtype of the first integer tensor among x's (CSR index tensors, for ops whose dtypes are float)."""
    for y in x if isinstance(x, (list, tuple)) else (x,):
        if isinstance(y, torch.Tensor) and not y.dtype.is_floating_point and not y.dtype.is_complex:
            return y.dtype
    return None


@pytest.mark.parametrize("fake", [False, True], ids=["kernel", "fake"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("info", [info for info in OP_DB if "csr" in info.name and info.dtypes == _checks.FLOAT_DTYPES],
                         ids=lambda info: info.name)
def test_index_arguments_accept_exactly_the_int_dtypes(info: OpInfo, device: str, fake: bool) -> None:
    """The CSR index tensors of the ops whose listed dtypes are their values' (_csr_transpose's are its
    indices': the test above)."""
    sample = info.sample_inputs(device, info.dtypes[0], False)[-1]
    base = _index_dtype(sample.args)
    assert base in _checks.INT_DTYPES
    supported = ", ".join(_checks._dtype_name(d) for d in _checks.INT_DTYPES)
    for dtype in _convertible_dtypes(device):
        args = _retyped(sample.args, base, dtype)
        if dtype in _checks.INT_DTYPES:
            _call(info, args, sample.kwargs, fake)
            continue
        with pytest.raises(RuntimeError, match=rf"(?m)^myns::{info.name}: \w+ has unsupported dtype \S+; "
                                               rf"supported: {re.escape(supported)}$"):
            _call(info, args, sample.kwargs, fake)
