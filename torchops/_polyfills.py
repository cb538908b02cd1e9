"""Tells torch.compile and TorchScript what to compile in place of the eager wrappers.

An eager wrapper in ``torchops.ops`` calls the C++ entry behind an OpOverload (``OpOverload._op``), which
neither dynamo nor TorchScript can see into.

torch.compile: ``torch.compiler.substitute_in_graph`` registers a twin that calls the OpOverloads instead,
so dynamo traces the twin and the ops land in the graph. But that registration imports torch._dynamo
(most of the cost of ``import torchops`` otherwise), and only torch.compile/torch.export, which import
torch._dynamo themselves, ever read it.

So ``traced_as`` only records the pair; the pairs are registered when torch._dynamo is imported
(``_after_import``: at once if it already is, otherwise right after its module body has run).
Nothing runs per call.

TorchScript: ``scripted_as`` registers the wrapper as a builtin of its op, as torch's own Python functions
are, so a scripted call of the wrapper is a call of the op (the schema's arguments and defaults;
tests/test_wrappers.py checks that the wrapper takes the same).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from torchops._after_import import after_import

_F = TypeVar("_F", bound=Callable[..., Any])

_DYNAMO = "torch._dynamo"
_pending: list[tuple[Callable[..., Any], Callable[..., Any]]] = []  # (eager wrapper, traced twin)
_lock = threading.Lock()


def traced_as(eager: Callable[..., Any]) -> Callable[[_F], _F]:
    """Decorator: the decorated function is what torch.compile traces wherever ``eager`` is called.

    It must take the same arguments as ``eager`` and do the same with OpOverloads (which dynamo puts in
    the graph) where ``eager`` calls their C++ entries. Returns the decorated function unchanged.
    """
    def record(traced: _F) -> _F:
        with _lock:
            _pending.append((eager, traced))
            first = len(_pending) == 1  # the others join the registration already waiting
        if first:
            after_import(_DYNAMO, _register_pending)
        return traced
    return record


def scripted_as(op: Any) -> Callable[[_F], _F]:
    """Decorator: TorchScript compiles a call of the decorated wrapper as a call of the OpOverload ``op``.

    The wrapper must take the schema's arguments with its defaults (it may make some keyword-only, and add
    keyword-only options of its own, which TorchScript then does not take). Returns the wrapper unchanged.
    """
    def register(wrapper: _F) -> _F:
        import torch

        torch.jit._builtins._register_builtin(wrapper, op._schema.name)
        return wrapper
    return register


def _register_pending() -> None:
    import torch

    with _lock:
        pairs = list(_pending)
        _pending.clear()
    for eager, traced in pairs:
        try:
            torch.compiler.substitute_in_graph(eager)(traced)
        except Exception as e:  # an import of torch._dynamo must not fail because of torchops
            warnings.warn(f"torchops: torch.compile cannot trace into torchops.{eager.__name__} ({e}); "
                          f"call torch.ops.myns.* directly in compiled code", stacklevel=2)
