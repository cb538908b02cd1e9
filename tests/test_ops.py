"""Generic tests over every OpInfo in op_db: float64 reference, opcheck, gradcheck, fake kernels, errors."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from helpers import DEVICES, assert_close_to_reference, poison_cuda_cache
from op_db import OP_DB, OpInfo, ops, upcast


def _dtype_params(predicate=lambda info: True):
    return [
        pytest.param(info, dtype, id=f"{info.name}-{str(dtype).removeprefix('torch.')}")
        for info in OP_DB if predicate(info) for dtype in info.dtypes
    ]


def _outputs(info: OpInfo, args, result):
    """The tensors an op produced: its return value, or the argument an out= op wrote."""
    if info.mutated_args:
        assert result is None
        return tuple(args[i] for i in info.mutated_args)
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("info,dtype", _dtype_params())
def test_matches_float64_reference(info: OpInfo, dtype: torch.dtype, device: str) -> None:
    for sample in info.sample_inputs(device, dtype, False):
        expected = info.reference(*upcast(sample.args), **sample.kwargs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        poison_cuda_cache()
        result = info.op(*sample.args, **sample.kwargs)
        outputs = _outputs(info, sample.args, result)
        dtypes = info.output_dtypes(sample) if info.output_dtypes else (dtype,) * len(outputs)
        strides = info.output_strides(sample) if info.output_strides else (None,) * len(outputs)
        for actual, exp, out_dtype, out_strides in zip(outputs, expected, dtypes, strides):
            assert actual.device.type == device and actual.dtype == out_dtype, sample.desc
            assert actual.shape == exp.shape, sample.desc
            if not info.mutated_args:
                if out_strides is None:
                    assert actual.is_contiguous(), f"{sample.desc}: output must be a new contiguous tensor"
                else:
                    assert actual.stride() == out_strides, f"{sample.desc}: output strides {actual.stride()}"
            assert_close_to_reference(actual.cpu(), exp, msg=lambda m: f"{sample.desc}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("info", ops())
def test_opcheck(info: OpInfo, device: str) -> None:
    # All four utils: schema, autograd registration, fake tensor, AOT dispatch (static and dynamic).
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        if dtype not in info.dtypes:
            continue
        requires_grad = info.differentiable and dtype.is_floating_point
        for sample in info.sample_inputs(device, dtype, requires_grad):
            torch.library.opcheck(info.op, sample.args, sample.kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("info", ops(lambda info: info.differentiable))
def test_gradcheck(info: OpInfo, device: str) -> None:
    for sample in info.sample_inputs(device, torch.float64, True):
        tensors = [a for a in sample.args if isinstance(a, torch.Tensor)]
        if any(torch._debug_has_internal_overlap(t) == 1 for t in tensors):
            continue  # numerical differentiation can't perturb one element of a stride-0 input
        # Full Jacobians of the larger samples would take gigabytes; fast mode checks random projections.
        fast = sum(t.numel() for t in tensors) > 2000
        assert torch.autograd.gradcheck(lambda *a: info.op(*a, **sample.kwargs), sample.args, fast_mode=fast), sample.desc


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("info", ops(lambda info: not info.mutated_args))  # out= ops make no new tensor
def test_fake_matches_real_metadata(info: OpInfo, device: str) -> None:
    for sample in info.sample_inputs(device, torch.float32, False):
        real = _outputs(info, sample.args, info.op(*sample.args, **sample.kwargs))
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in sample.args)
            fake = _outputs(info, fake_args, info.op(*fake_args, **sample.kwargs))
        for r, f in zip(real, fake):
            assert (r.shape, r.dtype, r.device, r.stride()) == (f.shape, f.dtype, f.device, f.stride()), sample.desc


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("info", ops())
def test_bad_inputs_raise_named_errors(info: OpInfo, device: str) -> None:
    for case in info.error_inputs(device):
        with pytest.raises(RuntimeError, match=case.match):
            info.op(*case.sample.args, **case.sample.kwargs)
        if case.on_fake:  # torch.compile / export see the same message
            with FakeTensorMode() as mode:
                fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in case.sample.args)
                with pytest.raises(RuntimeError, match=case.match):
                    info.op(*fake_args, **case.sample.kwargs)
