"""Runs callbacks once a module has been imported, without importing it.

torchops has work that only matters to users of heavy parts of torch (registering torch.compile's traced
twins needs torch._dynamo; DTensor sharding rules need torch.distributed.tensor). Importing those at
``import torchops`` would make it slow; instead the work is tied to their import: done at once if the
module is already imported, otherwise right after its body has run, by a ``sys.meta_path`` finder that
wraps the module's loader (and is removed once nothing is pending). Nothing runs per call.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

_callbacks: dict[str, list[Callable[[], None]]] = {}  # module name -> work waiting for its import
_lock = threading.RLock()


def after_import(name: str, callback: Callable[[], None]) -> None:
    """Calls ``callback()`` once module ``name`` is imported: now if it already is, else right after."""
    with _lock:
        _callbacks.setdefault(name, []).append(callback)
        _install_finder()
    module = sys.modules.get(name)
    # Checked after the finder is in, so no import can slip between the two; a module still running its
    # body (imported from inside it) is left to the finder.
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        _run(name)


def pending_modules() -> list[str]:
    """Names of the modules whose import still has work waiting."""
    with _lock:
        return sorted(_callbacks)


def _run(name: str) -> None:
    # Taken under the lock, called outside it: a callback may import modules another thread is importing.
    with _lock:
        callbacks = _callbacks.pop(name, [])
        if not _callbacks:
            _remove_finder()
    for callback in callbacks:
        try:
            callback()
        except Exception as e:  # importing `name` must never fail because of torchops
            warnings.warn(f"torchops: work after importing {name} failed: {e!r}", stacklevel=2)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds a watched module through the other finders and wraps its loader (see _RunAfterExec)."""

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> Any:
        with _lock:
            if fullname not in _callbacks:
                return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RunAfterExec(spec.loader)
                return spec
        return None


class _RunAfterExec(importlib.abc.Loader):
    """The module's own loader, plus running the waiting callbacks after its body ran (a failed import runs
    nothing and leaves them for the next try)."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader  # what the module would have had without the finder
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        _run(module.__name__)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


_finder: _AfterImport | None = None


def _install_finder() -> None:
    global _finder
    if _finder is None:
        _finder = _AfterImport()
        sys.meta_path.insert(0, _finder)


def _remove_finder() -> None:
    global _finder
    if _finder is not None:
        try:
            sys.meta_path.remove(_finder)
        except ValueError:
            pass
        _finder = None
