"""Shape/dtype/device checks of the fake kernels, mirroring csrc/common/checks.h message for message."""

from __future__ import annotations

from collections.abc import Sequence

import torch

# The dtype lists of csrc/common/dispatch.h, in its order (tests/test_dtype_lists.py checks them against the
# kernels); INT_DTYPES are also the CSR index dtypes.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.int32, torch.int64)
FLOAT_AND_INT_DTYPES = FLOAT_DTYPES + INT_DTYPES


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


# (name, tensor) pairs, as NamedTensor in checks.h.
Named = tuple[str, torch.Tensor]


def same_device(op: str, x: Named, y: Named) -> None:
    check(x[1].device == y[1].device, op, f"{x[0]} and {y[0]} must be on the same device, got {x[1].device} and {y[1].device}")


def same_dtype(op: str, x: Named, y: Named) -> None:
    check(x[1].dtype == y[1].dtype, op,
          f"{x[0]} and {y[0]} must have the same dtype, got {_dtype_name(x[1].dtype)} and {_dtype_name(y[1].dtype)}")


def dtype_in(op: str, t: Named, dtypes: Sequence[torch.dtype]) -> None:
    check(t[1].dtype in dtypes, op,
          f"{t[0]} has unsupported dtype {_dtype_name(t[1].dtype)}; supported: {', '.join(_dtype_name(d) for d in dtypes)}")


def check_elementwise(op: str, tensors: Sequence[Named], dtypes: Sequence[torch.dtype]) -> None:
    """Same contract as torchops::check_elementwise: same device, dtype and shape; dtype in `dtypes`."""
    first = tensors[0]
    for t in tensors[1:]:
        same_device(op, first, t)
        same_dtype(op, first, t)
        check(
            first[1].dim() == t[1].dim() and all(x == y for x, y in zip(first[1].shape, t[1].shape)),
            op,
            f"{first[0]} and {t[0]} must have the same shape, got {list(first[1].shape)} and {list(t[1].shape)}",
        )
    dtype_in(op, first, dtypes)
