"""torchops: hand-written CPU and CUDA operators registered as native PyTorch ops under ``torch.ops.myns``.

``import torchops`` is all that is needed before calling ``torch.ops.myns.*``, ``torch.export.load`` or
``torch.jit.load`` on a program that uses them.
"""

from __future__ import annotations

from typing import Any

from torchops import _native

_C = _native.load()  # registers the myns schemas and the CPU/CUDA/Autograd kernels
_native.load_fake_kernels()  # torchops._meta_kernels: fake kernels for torch.compile / torch.export
_native.tag_compile_caches()  # compiled graphs cached with another torchops are never reused

from torchops import graph, nn, ops  # noqa: E402
from torchops._after_import import after_import  # noqa: E402
from torchops.ops import *  # noqa: E402,F403  every wrapper in ops.__all__: a new one needs no edit here

__all__ = ["build_info", "cmake_prefix_path", "graph", "library_path", "nn"]
__all__ += ops.__all__  # the form type checkers follow


def _load_sharding_rules() -> None:
    import torchops.distributed  # noqa: F401  registers DTensor sharding rules for every myns op


# DTensor sharding rules load with torch.distributed.tensor (slow to import, so not before a program does).
after_import("torch.distributed.tensor", _load_sharding_rules)
__version__ = "0.1.0"

#: Directory to add to CMake's ``CMAKE_PREFIX_PATH`` for ``find_package(torchops)`` (like
#: ``torch.utils.cmake_prefix_path``); ``python -m torchops.cmake_args`` prints a whole configure line.
cmake_prefix_path: str = _native.CMAKE_PREFIX_PATH


def library_path() -> str:
    """Path of ``libtorchops.so``: every ``myns`` op's schema and kernels, linking libtorch only (no Python).

    A C++ program links or ``dlopen``s it to use the ops (AOTInductor packages and TorchScript modules that
    call them included). This process has it loaded already: ``torch.ops.load_library(library_path())``
    is a no-op here.
    """
    return _native.LIBRARY_PATH


def build_info() -> dict[str, Any]:
    """What the native extension was built against: torch and CUDA versions, GPU archs, CUDA or not, and a digest
    of its C++ sources."""
    return dict(_C.build_info())
