"""Generates the C++ header <torchops/ops.h> from the schemas csrc/ops.cpp defines.

    python scripts/gen_ops_header.py [--check]     (setup.py runs it on every build)

One typed entry point per public op (no leading underscore, not a ``_backward`` or its out= form), its parameters and
defaults those of the schema (``torch._C.parse_schema``), its doc comment the ``//`` lines right above
the op's ``define(...)`` in csrc/ops.cpp. Each entry calls the op through the dispatcher, whose typed handle
checks the C++ signature against the registered kernels' on the first call: kernels take torch's usual C++
types (``const at::Tensor&``, ``const std::optional<at::Tensor>&``, ``double``, ``int64_t``, ``bool``).
The header is a build output (git-ignored), written only when its text changes.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS_CPP = os.path.join(ROOT, "csrc", "ops.cpp")
HEADER = os.path.join(ROOT, "torchops", "include", "torchops", "ops.h")

# A define(m, "..." "..." ...) call: the schema is the concatenation of the string literals after `m,`.
_DEFINE = re.compile(r'define\(\s*m\s*,\s*((?:"(?:[^"\\]|\\.)*"\s*)+)')
_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')


class DefinedOp(NamedTuple):
    schema: str
    doc: list[str]  # the comment lines above the define(), without "// "


def defined_ops(source: str) -> list[DefinedOp]:
    """Every define() of `source` (csrc/ops.cpp's text), in order, with the comment block above it."""
    ops = []
    for match in _DEFINE.finditer(source):
        # The literals' contents with C escapes undone (a default string is written \"none\").
        schema = re.sub(r"\\(.)", r"\1", "".join(_LITERAL.findall(match.group(1))))
        doc: list[str] = []
        # The lines before the one define( is on, nearest first.
        for line in reversed(source[: match.start()].split("\n")[:-1]):
            stripped = line.strip()
            if not stripped.startswith("//"):
                break
            doc.insert(0, stripped[2:].removeprefix(" "))
        ops.append(DefinedOp(schema, doc))
    return ops


def is_public(name: str) -> bool:
    return not name.startswith("_") and "_backward" not in name


def _cpp_type(t, argument: bool) -> str:
    """The C++ type of a schema type (torch's usual one for kernels) as an argument or a return."""
    import torch

    if isinstance(t, torch.OptionalType):
        inner = t.getElementType()
        if isinstance(inner, torch.TensorType):
            return "const std::optional<at::Tensor>&" if argument else "std::optional<at::Tensor>"
        return f"std::optional<{_cpp_type(inner, argument)}>"
    if isinstance(t, torch.ListType):
        inner = t.getElementType()
        if isinstance(inner, torch.TensorType):
            return "at::TensorList" if argument else "std::vector<at::Tensor>"
        if isinstance(inner, (torch.IntType, torch.SymIntType)):
            return "at::IntArrayRef" if argument else "std::vector<int64_t>"
        if isinstance(inner, torch.FloatType):
            return "c10::ArrayRef<double>" if argument else "std::vector<double>"
    simple = {
        torch.TensorType: "const at::Tensor&" if argument else "at::Tensor",
        torch.FloatType: "double",
        torch.IntType: "int64_t",
        torch.SymIntType: "c10::SymInt",
        torch.BoolType: "bool",
        torch.StringType: "c10::string_view" if argument else "std::string",
    }
    for kind, spelling in simple.items():
        if isinstance(t, kind):
            return spelling
    raise ValueError(f"no C++ spelling for schema type {t}: extend scripts/gen_ops_header.py")


def _cpp_default(value) -> str:
    if value is None:
        return "std::nullopt"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "{" + ", ".join(_cpp_default(v) for v in value) + "}"
    raise ValueError(f"no C++ spelling for the default {value!r}")


def entry_point(op: DefinedOp) -> str:
    """The header's function for one public op."""
    import torch

    schema = torch._C.parse_schema(op.schema)
    returns = [_cpp_type(r.type, argument=False) for r in schema.returns]
    result = "void" if not returns else returns[0] if len(returns) == 1 else f"std::tuple<{', '.join(returns)}>"
    params = []
    for a in schema.arguments:
        param = f"{_cpp_type(a.type, argument=True)} {a.name}"
        if a.has_default_value():
            param += f" = {_cpp_default(a.default_value)}"
        params.append(param)
    names = ", ".join(a.name for a in schema.arguments)
    call = f"TORCHOPS_CALL({schema.name}, {names})" if names else f"TORCHOPS_CALL({schema.name})"
    doc = "".join(f"// {line}".rstrip() + "\n" for line in op.doc) or f"// myns::{schema.name}.\n"
    signature = f"inline {result} {schema.name}({', '.join(params)}) {{"
    if len(signature) > 120:  # one parameter a line
        signature = f"inline {result} {schema.name}(\n    " + ",\n    ".join(params) + ") {"
    return (f"{doc}// Schema: {op.schema}\n"
            f"{signature}\n"
            f"  {'' if result == 'void' else 'return '}{call};\n"
            f"}}\n")


_PROLOGUE = """\
// GENERATED by scripts/gen_ops_header.py from csrc/ops.cpp at build time: do not edit (edit the schema or the
// comment above its define() instead).
//
// torchops from C++: typed entry points for the public myns ops, each a call through the PyTorch dispatcher
// (so autograd, CPU and CUDA kernels, and errors behave as torch.ops.myns.<op> does in Python).
//
// Link libtorchops.so (CMake: find_package(torchops) + target_link_libraries(app torchops::torchops)): its
// static initialisers register the ops. Bad input throws c10::Error with the same message as Python's
// RuntimeError ("myns::<op>: ..."); an op the loaded library lacks throws c10::Error on its first call.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <tuple>

namespace torchops {
namespace detail {

// The dispatcher handle of myns::<name>, typed by the C++ signature Fn. Looked up on the first call (after
// static initialisation registered the op) and checked against the registered schema: a signature that
// disagrees with the schema throws instead of calling the kernel with the wrong arguments.
template <class Fn>
c10::TypedOperatorHandle<Fn> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

}  // namespace detail

// Each entry holds its op's handle in a function-local static.
#define TORCHOPS_CALL(name, ...)                                                            \\
  [&] {                                                                                     \\
    static const auto handle_ = ::torchops::detail::find_op<decltype(name)>("myns::" #name); \\
    return handle_.call(__VA_ARGS__);                                                       \\
  }()
"""

_EPILOGUE = """
#undef TORCHOPS_CALL

}  // namespace torchops
"""


def header_text(source: str) -> str:
    import torch

    entries = [entry_point(op) for op in defined_ops(source)
               if is_public(torch._C.parse_schema(op.schema).name)]
    body = "".join("\n" + e for e in entries)
    includes = "".join(f"#include <{h}>\n" for h, used in (("string", "std::string" in body),
                                                            ("vector", "std::vector" in body)) if used)
    return _PROLOGUE.replace("#include <tuple>\n", "#include <tuple>\n" + includes) + body + _EPILOGUE


def write_header(ops_cpp: str = OPS_CPP, header: str = HEADER) -> bool:
    """Writes the header when its text changed; returns whether it did."""
    with open(ops_cpp) as f:
        text = header_text(f.read())
    if os.path.exists(header):
        with open(header) as f:
            if f.read() == text:
                return False
    os.makedirs(os.path.dirname(header), exist_ok=True)
    with open(header, "w") as f:
        f.write(text)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the header is missing or stale")
    if parser.parse_args().check:
        with open(OPS_CPP) as f:
            want = header_text(f.read())
        current = open(HEADER).read() if os.path.exists(HEADER) else None
        return 0 if current == want else 1
    print(f"{HEADER}: {'written' if write_header() else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
