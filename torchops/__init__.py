"""torchops: hand-written CPU and CUDA operators registered as native PyTorch ops under ``torch.ops.myns``.

``import torchops`` is all that is needed before calling ``torch.ops.myns.*``, ``torch.export.load`` or
``torch.jit.load`` on a program that uses them.
"""

from __future__ import annotations

from typing import Any

from torchops import _native

_C = _native.load()  # registers the myns schemas and the CPU/CUDA/Autograd kernels

import meta_kernels  # noqa: E402,F401  fake kernels for torch.compile / torch.export

from torchops import nn  # noqa: E402
from torchops.ops import csr_spmm, rms_norm, spmm, swiglu, vector_add  # noqa: E402

__all__ = ["build_info", "csr_spmm", "nn", "rms_norm", "spmm", "swiglu", "vector_add"]
__version__ = "0.1.0"


def build_info() -> dict[str, Any]:
    """What the native extension was built against: torch and CUDA versions, GPU archs, CUDA or not."""
    return dict(_C.build_info())
