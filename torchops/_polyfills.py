"""Tells torch.compile what to trace in place of the eager wrappers, without importing torch._dynamo.

An eager wrapper in ``torchops.ops`` calls the C++ entry behind an OpOverload (``OpOverload._op``), which
dynamo cannot see into. ``torch.compiler.substitute_in_graph`` registers a twin that calls the OpOverloads
instead, so dynamo traces the twin and the ops land in the graph. But that registration imports
torch._dynamo (about a second on a small machine, most of ``import torchops`` otherwise), and only
torch.compile/torch.export, which import torch._dynamo themselves, ever read it.

So ``traced_as`` only records the pair. The pairs are registered when torch._dynamo is imported: at once
if it already is, otherwise right after its module body has run, by an import hook (a ``sys.meta_path``
finder that wraps the loader of ``torch._dynamo`` and removes itself once the pairs are registered).
Nothing runs per call.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])

_DYNAMO = "torch._dynamo"
_pending: list[tuple[Callable[..., Any], Callable[..., Any]]] = []  # (eager wrapper, traced twin)
_lock = threading.RLock()


def traced_as(eager: Callable[..., Any]) -> Callable[[_F], _F]:
    """Decorator: the decorated function is what torch.compile traces wherever ``eager`` is called.

    It must take the same arguments as ``eager`` and do the same with OpOverloads (which dynamo puts in
    the graph) where ``eager`` calls their C++ entries. Returns the decorated function unchanged.
    """
    def record(traced: _F) -> _F:
        with _lock:
            _pending.append((eager, traced))
            _install_hook()
        if _DYNAMO in sys.modules:  # checked after the hook is in: no import can slip between the two
            _register_pending()
        return traced
    return record


def _register_pending() -> None:
    import torch

    # Taken under the lock, registered outside it: registering imports torch._dynamo, which may wait
    # for another thread that is importing it and will call this function when done.
    with _lock:
        pairs = list(_pending)
        _pending.clear()
        _remove_hook()
    for eager, traced in pairs:
        try:
            torch.compiler.substitute_in_graph(eager)(traced)
        except Exception as e:  # an import of torch._dynamo must not fail because of torchops
            warnings.warn(f"torchops: torch.compile cannot trace into torchops.{eager.__name__} ({e}); "
                          f"call torch.ops.myns.* directly in compiled code", stacklevel=2)


class _AfterDynamoImport(importlib.abc.MetaPathFinder):
    """Finds torch._dynamo through the other finders and has its loader register the pending pairs once
    the module body has run (a failed import registers nothing and leaves the hook for the next try)."""

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> Any:
        if fullname != _DYNAMO:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisterAfterExec(spec.loader)
                return spec
        return None


class _RegisterAfterExec(importlib.abc.Loader):
    """The module's own loader, plus registering the pending pairs after its body ran."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader  # what the module would have had without the hook
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        _register_pending()

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


_hook: _AfterDynamoImport | None = None


def _install_hook() -> None:
    global _hook
    if _hook is None:
        _hook = _AfterDynamoImport()
        sys.meta_path.insert(0, _hook)


def _remove_hook() -> None:
    global _hook
    if _hook is not None:
        try:
            sys.meta_path.remove(_hook)
        except ValueError:
            pass
        _hook = None
