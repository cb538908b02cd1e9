"""Shape/dtype/device checks of the fake kernels, mirroring csrc/common/checks.h message for message."""

from __future__ import annotations

from collections.abc import Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FLOAT_AND_INT_DTYPES = (*FLOAT_DTYPES, torch.int32, torch.int64)


def _dtype_name(dtype: torch.dtype) -> str:
    # c10::toString spelling, so fake and real kernels raise the same text.
    return {
        torch.float16: "Half",
        torch.bfloat16: "BFloat16",
        torch.float32: "Float",
        torch.float64: "Double",
        torch.int32: "Int",
        torch.int64: "Long",
        torch.int8: "Char",
        torch.int16: "Short",
        torch.uint8: "Byte",
        torch.bool: "Bool",
        torch.complex64: "ComplexFloat",
        torch.complex128: "ComplexDouble",
    }.get(dtype, str(dtype))


def check(cond: bool, op: str, msg: str) -> None:
    torch._check(cond, lambda: f"myns::{op}: {msg}")


def check_elementwise(op: str, tensors: Sequence[tuple[str, torch.Tensor]], dtypes: Sequence[torch.dtype]) -> None:
    """Same contract as torchops::check_elementwise: same device, dtype and shape; dtype in `dtypes`."""
    first_name, first = tensors[0]
    for name, t in tensors[1:]:
        check(
            first.device == t.device,
            op,
            f"{first_name} and {name} must be on the same device, got {first.device} and {t.device}",
        )
        check(
            first.dtype == t.dtype,
            op,
            f"{first_name} and {name} must have the same dtype, got {_dtype_name(first.dtype)} and {_dtype_name(t.dtype)}",
        )
        check(
            first.dim() == t.dim() and all(x == y for x, y in zip(first.shape, t.shape)),
            op,
            f"{first_name} and {name} must have the same shape, got {list(first.shape)} and {list(t.shape)}",
        )
    check(
        first.dtype in dtypes,
        op,
        f"{first_name} has unsupported dtype {_dtype_name(first.dtype)}; "
        f"supported: {', '.join(_dtype_name(d) for d in dtypes)}",
    )
