"""torchops without Python: libtorchops.so holds every op and needs no Python; it is loaded once per process
however it is reached; and C++ programs built with CMake (examples/cpp, and a project written from the
README alone) run the ops, AOTInductor packages and TorchScript modules that call them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import torchops
from helpers import REPO_ROOT, run_python

# What the README's "From C++" section tells a user to write and run, verbatim.
README_CMAKELISTS = """\
cmake_minimum_required(VERSION 3.18)
project(app LANGUAGES CXX)
find_package(Torch REQUIRED)
find_package(torchops REQUIRED)
add_executable(app main.cpp)
target_link_libraries(app PRIVATE torchops::torchops ${TORCH_LIBRARIES})
"""
README_MAIN_CPP = """\
#include <ATen/ATen.h>
#include <torchops/ops.h>

#include <iostream>

int main() {
  at::Tensor x = at::randn({4, 64});
  at::Tensor y = torchops::rms_norm(x, at::ones({64}));  // myns::rms_norm through the dispatcher
  std::cout << "rms_norm ok: " << at::allclose(y, x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6)) << "\\n";
  try {
    torchops::swiglu(at::randn({4, 8}), at::randn({4, 9}));
  } catch (const c10::Error& e) {
    std::cout << e.what_without_backtrace() << "\\n";  // the message Python's RuntimeError carries
  }
}
"""
README_COMMANDS = """\
cmake -S . -B build $(python -m torchops.cmake_args)
cmake --build build
./build/app
"""


def _tool_env() -> dict[str, str]:
    """The environment for cmake and the README's commands: this interpreter's bin directory first on PATH, so
    `python`, and cmake and ninja from requirements-dev.txt, are the ones that belong to it."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    if shutil.which("ninja", path=env["PATH"]):
        env.setdefault("CMAKE_GENERATOR", "Ninja")
    if shutil.which("cmake", path=env["PATH"]) is None:
        pytest.fail("cmake not found: install the pinned requirements (pip install -r requirements-dev.txt)")
    return env


def _run(command: str | list[str], cwd: str, env: dict[str, str], timeout: float = 900) -> str:
    proc = subprocess.run(command, cwd=cwd, env=env, shell=isinstance(command, str), capture_output=True,
                          text=True, timeout=timeout, executable="/bin/bash" if isinstance(command, str) else None)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{command!r} failed ({proc.returncode}):\n{output[-6000:]}"
    return output


# C++20-only syntax: keywords and operators, and the headers that only C++20 has.
_CXX20_ONLY = re.compile(r"\brequires\s*[({]|\bconcept\b|<=>|\bconsteval\b|\bconstinit\b|\bco_(await|return|yield)\b"
                         r"|#include\s*<(span|format|ranges|concepts|bit|numbers|source_location)>")


def test_sources_stay_cxx17() -> None:
    # torch 2.11 (the GPU machine's) builds extensions as C++17, 2.14 (CI's) as C++20: C++20-only code
    # compiles here and fails there, as a `requires` expression in the elementwise engine once did.
    found = []
    for top in ("csrc", os.path.join("examples", "cpp")):
        for folder, _, files in os.walk(os.path.join(REPO_ROOT, top)):
            for name in files:
                if not name.endswith((".h", ".cuh", ".cpp", ".cu")):
                    continue
                path = os.path.join(folder, name)
                with open(path) as f:
                    for number, line in enumerate(f, 1):
                        code = line.split("//", 1)[0]
                        if _CXX20_ONLY.search(code):
                            found.append(f"{os.path.relpath(path, REPO_ROOT)}:{number}: {line.strip()}")
    assert not found, "C++20-only code:\n" + "\n".join(found)


def test_library_has_no_python_symbols() -> None:
    path = torchops.library_path()
    assert os.path.isfile(path), path
    undefined = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True, text=True, check=True)
    python_symbols = [line for line in undefined.stdout.splitlines() if line.split()[-1].startswith("Py")]
    assert python_symbols == [], f"libtorchops.so needs Python: {python_symbols[:10]}"
    needed = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    assert "libtorch_python" not in needed and "libpython" not in needed, needed


@pytest.mark.parametrize("order", ["import_then_load", "load_then_import"])
def test_library_loaded_once(order: str) -> None:
    """torchops imported and the library loaded as a C++ program would (by path) share one copy: TORCH_LIBRARY
    would raise on a second registration of the myns namespace, and the ops must still work."""
    load = "torch.ops.load_library(path)"
    steps = f"import torchops\n{load}" if order == "import_then_load" else f"{load}\nimport torchops"
    run_python(f"""
        import os, torch
        path = {torchops.library_path()!r}
        {textwrap.indent(steps, ' ' * 8).strip()}
        assert torchops.library_path() == path
        mapped = {{line.split()[-1] for line in open("/proc/self/maps") if "libtorchops" in line}}
        inodes = {{os.stat(p).st_ino for p in mapped}}
        assert len(inodes) == 1, mapped
        a = torch.randn(5)
        torch.testing.assert_close(torchops.vector_add(a, a), 2 * a)
    """)


def test_header_is_generated_from_the_schemas() -> None:
    """<torchops/ops.h> is what scripts/gen_ops_header.py makes of csrc/ops.cpp now (the build writes it), with an
    entry point for exactly the public schemas, their defaults, and each doc comment from above its define()."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_ops_header", os.path.join(REPO_ROOT, "scripts", "gen_ops_header.py"))
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    with open(os.path.join(REPO_ROOT, "csrc", "ops.cpp")) as f:
        source = f.read()
    header = os.path.join(os.path.dirname(torchops.__file__), "include", "torchops", "ops.h")
    with open(header) as f:
        text = f.read()
    assert text == generator.header_text(source), "stale header: rebuild (setup.py regenerates it)"
    defined = [torch._C.parse_schema(op.schema).name for op in generator.defined_ops(source)]
    registered = {n.removeprefix("myns::") for n in torch._C._dispatch_get_all_op_names() if n.startswith("myns::")}
    assert set(defined) == registered, "csrc/ops.cpp's define() calls and the registered schemas differ"
    public = [n for n in defined if generator.is_public(n)]
    assert "rms_norm" in public and "_rms_norm_forward" not in public and "swiglu_backward" not in public
    assert re.findall(r"^inline [^\n]*? (\w+)\(", text, flags=re.MULTILINE) == public
    assert "const std::optional<at::Tensor>& weight = std::nullopt,\n    double eps = 1e-06," in text
    assert "// silu(gate) * up.\n// Schema: swiglu(Tensor gate, Tensor up) -> Tensor\ninline at::Tensor swiglu(" in text


def test_cmake_prefix_path_holds_the_package() -> None:
    config = os.path.join(torchops.cmake_prefix_path, "torchops", "torchopsConfig.cmake")
    assert os.path.isfile(config)
    header = os.path.join(os.path.dirname(torchops.__file__), "include", "torchops", "ops.h")
    assert os.path.isfile(header)


@pytest.mark.slow
def test_example_from_cpp(tmp_path) -> None:
    """examples/cpp built with CMake runs an AOTInductor package, a TorchScript module and direct calls (CPU;
    CUDA too with a GPU) and its outputs and error message equal Python's."""
    env = _tool_env()
    build = str(tmp_path / "build")
    args = _run([sys.executable, "-m", "torchops.cmake_args"], REPO_ROOT, env).split()
    _run(["cmake", "-S", os.path.join(REPO_ROOT, "examples", "cpp"), "-B", build, *args], REPO_ROOT, env)
    _run(["cmake", "--build", build], REPO_ROOT, env)
    devices = ["cpu", "cuda"] if torch.cuda.is_available() and torchops.build_info()["with_cuda"] else ["cpu"]
    output = _run([sys.executable, os.path.join(REPO_ROOT, "examples", "cpp", "export_and_check.py"),
                   "--example", os.path.join(build, "torchops_example"), "--workdir", str(tmp_path / "work"),
                   *(f"--device={d}" for d in devices)], REPO_ROOT, env)
    assert "C++ outputs equal Python's on " + ", ".join(devices) in output, output
    assert "myns::vector_add: a and b must have the same shape, got [4, 8] and [4, 9]" in output, output


@pytest.mark.slow
def test_readme_project_outside_the_repo(tmp_path) -> None:
    """A project that knows torchops only through find_package(torchops), built with the README's commands."""
    (tmp_path / "CMakeLists.txt").write_text(README_CMAKELISTS)
    (tmp_path / "main.cpp").write_text(README_MAIN_CPP)
    output = _run(README_COMMANDS, str(tmp_path), _tool_env())
    assert "rms_norm ok: 1" in output, output
    assert "myns::swiglu: gate and up must have the same shape, got [4, 8] and [4, 9]" in output, output
