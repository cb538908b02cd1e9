"""Loads the native extension, turning a build/runtime torch mismatch into a readable ImportError, and the
fake kernels."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
from types import ModuleType
from typing import Any

import torch

REBUILD_HINT = "rebuild it with `make build` (or `pip install --no-build-isolation -e .` from the repo root)"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_BUILD_INFO_PATH = os.path.join(_PACKAGE_DIR, "_build_info.json")
# The operator library (every kernel and registration, no Python) and the CMake package describing it.
LIBRARY_PATH = os.path.join(_PACKAGE_DIR, "lib", "libtorchops.so")
CMAKE_PREFIX_PATH = os.path.join(_PACKAGE_DIR, "share", "cmake")


def read_build_info() -> dict[str, Any] | None:
    """What setup.py recorded about the build (torch/CUDA versions, archs), or None if absent."""
    try:
        with open(_BUILD_INFO_PATH) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def check_torch_version(built_against: str | None, running: str) -> None:
    """Raise ImportError when the extension was built against another torch than the one importing it.

    The C++ ABI of libtorch changes between releases, so a mismatch otherwise surfaces as an opaque
    undefined-symbol error, or worse, a crash.
    """
    if built_against is not None and built_against != running:
        raise ImportError(
            f"torchops was built against torch {built_against} but torch {running} is installed; "
            f"{REBUILD_HINT}"
        )


def load() -> Any:
    info = read_build_info()
    built_against = None if info is None else info.get("torch")
    check_torch_version(built_against, torch.__version__)
    try:
        # _C links libtorchops.so (found through its rpath), so this loads every op, exactly once: a later
        # torch.ops.load_library(LIBRARY_PATH) or a C++ library linking it gets the same copy.
        from torchops import _C
    except ImportError as e:
        raise ImportError(
            f"torchops could not load its native extension (built against torch {built_against or 'unknown'}, "
            f"running torch {torch.__version__}): {e}. {REBUILD_HINT}"
        ) from e
    return _C


# The fake kernels' package, as csrc/ops.cpp's set_python_module names its modules (PyTorch checks the name).
# A wheel installs the repo's top-level meta_kernels/ folder there (setup.py's package_dir); a source tree
# (in place, or an editable install) has only the folder, beside this package. Decided by this package's own
# location, not by what the import system could find elsewhere (another checkout's editable install).
FAKE_KERNELS = "torchops._meta_kernels"


def load_fake_kernels() -> ModuleType:
    """Imports the fake kernels as FAKE_KERNELS, registering every myns op's."""
    if os.path.isdir(os.path.join(_PACKAGE_DIR, "_meta_kernels")):  # installed from a wheel
        return importlib.import_module(FAKE_KERNELS)
    folder = os.path.join(os.path.dirname(_PACKAGE_DIR), "meta_kernels")
    init = os.path.join(folder, "__init__.py")
    if not os.path.isfile(init):
        raise ImportError(f"torchops: no fake kernels: neither {FAKE_KERNELS} nor {folder} exists; {REBUILD_HINT}")
    spec = importlib.util.spec_from_file_location(FAKE_KERNELS, init, submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules[FAKE_KERNELS] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[FAKE_KERNELS]
        raise
    setattr(sys.modules["torchops"], "_meta_kernels", module)
    return module


def tag_compile_caches() -> str | None:
    """Adds this torchops to torch.compile's cache key (``torch.compiler.config.cache_key_tag``); returns the tag.

    PyTorch's compile caches (Inductor's FX graph cache, AOTAutograd's) key a graph by the op names it calls, not
    by what the ops do: a backward traced through an older build's autograd formulas, or shaped by its fake
    kernels, would be loaded again after an upgrade and call internal ops that changed or no longer exist. The
    tag is a digest of the C++ sources the build recorded and of the Python sources now on disk (the fake
    kernels, the wrappers, the sharding rules), so a changed torchops never meets its old cache entries."""
    config = getattr(getattr(torch, "compiler", None), "config", None)
    if config is None or not hasattr(config, "cache_key_tag"):
        return None
    digest = hashlib.sha256(str((read_build_info() or {}).get("sources", "")).encode())
    fake_kernels = os.path.dirname(sys.modules[FAKE_KERNELS].__file__)  # where load_fake_kernels found them
    for folder in (_PACKAGE_DIR, fake_kernels):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as f:
                    digest.update(name.encode() + b"\0" + f.read())
    tag = f"torchops-{digest.hexdigest()[:16]}"
    if tag not in config.cache_key_tag.split("+"):  # a user's own tag is kept in front of it
        config.cache_key_tag = f"{config.cache_key_tag}+{tag}" if config.cache_key_tag else tag
    return tag
