"""Argument errors come from one table (meta_kernels._checks.MESSAGES): for every error input of op_db, the C++
kernel (CPU, and CUDA when present) and the fake kernel raise exactly the message the table formats.

op_db names each expected error by key and fields; the fake kernels format the same templates; the C++
checks (csrc/core/checks.cpp, norm.cpp, csr.cpp) build their text themselves, and this is where a
difference between the two shows.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import DEVICES
from torchops._meta_kernels import _checks
from op_db import OP_DB, OpInfo, ops


def _raised(fn) -> str:
    try:
        fn()
    except RuntimeError as e:
        return str(e)
    return "(no error)"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("info", ops())
def test_kernels_raise_the_tables_message(info: OpInfo, device: str) -> None:
    cases = info.error_inputs(device)
    assert cases, f"{info.name} has no error inputs"
    for case in cases:
        expected = case.message
        assert expected.startswith(f"myns::{info.name}: ")
        real = _raised(lambda: info.op(*case.sample.args, **case.sample.kwargs))
        assert real == expected, f"{device} kernel: {real!r}"
        if case.on_fake:
            with FakeTensorMode() as mode:
                fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in case.sample.args)
                fake = _raised(lambda: info.op(*fake_args, **case.sample.kwargs))
            assert fake == real, f"fake kernel: {fake!r}, {device} kernel: {real!r}"


def test_every_message_is_expected_somewhere() -> None:
    # A template no error input expects would be checked by nothing. Exempt: same_device needs two devices and
    # row_limit a device whose kernels have one (CUDA error inputs use both), and "defined" is reachable from C++
    # only (Python passes no undefined tensor).
    used = {case.key for info in OP_DB for case in info.error_inputs("cpu")}
    unused = set(_checks.MESSAGES) - used - {"same_device", "row_limit", "defined"}
    assert not unused, f"messages no error input of tests/op_db.py expects: {sorted(unused)}"


def test_fields_are_spelled_as_cpp_prints_them() -> None:
    msg = _checks.message("op", "same_dtype", x="a", y="b", x_dtype=torch.bfloat16, y_dtype=torch.float32)
    assert msg == "myns::op: a and b must have the same dtype, got BFloat16 and Float"
    msg = _checks.message("op", "dtype_in", x="a", dtype=torch.bool, supported=(torch.float16, torch.int64))
    assert msg == "myns::op: a has unsupported dtype Bool; supported: Half, Long"
    assert _checks.message("op", "one_d", x="t", shape=torch.Size([])) == "myns::op: t must be 1-D, got shape []"
