"""Build torchops: the operator library torchops/lib/libtorchops.so (every TORCH_LIBRARY registration; links
libtorch only, no Python, so C++ programs can load it) and the thin Python module torchops._C over it.
The library is a CUDAExtension when nvcc and a CUDA-enabled torch are present, else a CppExtension.

Environment:
  TORCHOPS_FORCE_CUDA=1   fail instead of falling back to a CPU-only build when CUDA is missing
  TORCHOPS_CPU_ONLY=1     build the CPU kernels only, even where nvcc and a CUDA torch are present
  TORCH_CUDA_ARCH_LIST    GPU archs to build for (e.g. "9.0"); unset with no GPU visible -> 9.0
  CUDA_HOME               CUDA toolkit root; defaults to /usr/local/cuda when nvcc lives there
  DEBUG=1                 -O0 -g instead of -O3
  MAX_JOBS                parallel compile jobs (ninja)
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))

# torch.utils.cpp_extension reads CUDA_HOME when imported: settle it first. Without this torch guesses
# /usr/local and the link fails on -lcudart.
if "CUDA_HOME" not in os.environ and os.path.exists("/usr/local/cuda/bin/nvcc"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

import torch  # noqa: E402
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension  # noqa: E402

DEBUG = os.environ.get("DEBUG", "0") == "1"
FORCE_CUDA = os.environ.get("TORCHOPS_FORCE_CUDA", "0") == "1"
CPU_ONLY = os.environ.get("TORCHOPS_CPU_ONLY", "0") == "1"
DEFAULT_ARCH = "9.0"  # the project's GPU machine is an H200


def _log(msg: str) -> None:
    print(f"torchops setup: {msg}", file=sys.stderr)


def _cuda_available_for_build() -> tuple[bool, str]:
    if CPU_ONLY:
        return False, "TORCHOPS_CPU_ONLY=1"
    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} is a CPU-only build"
    if CUDA_HOME is None or not os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")):
        return False, "nvcc not found (set CUDA_HOME)"
    return True, ""


def _sources(pattern: str, exclude: str = "") -> list[str]:
    # Globbed, so adding an op (or a layer directory) needs no edit here. Relative paths keep the build portable.
    paths = (os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))
    return sorted(p for p in paths if not (exclude and p.startswith(exclude)))


def _arch_list() -> str:
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if archs:
        return archs
    if torch.cuda.is_available():
        # torch builds for the visible GPUs when the variable is unset.
        caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
        return ";".join(f"{major}.{minor}" for major, minor in caps)
    _log(f"no GPU visible and TORCH_CUDA_ARCH_LIST unset: building for sm_{DEFAULT_ARCH.replace('.', '')} only")
    os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCH
    return DEFAULT_ARCH


GENERATED_DIR = os.path.join(ROOT, "build", "generated")


def _write_ops_header() -> None:
    # <torchops/ops.h> (C++ entry points of the public ops) is generated from csrc/ops.cpp's schemas, so a
    # new op needs no hand-written C++ entry; it is written before setup() collects package data, so
    # wheels and the CMake package (torchops/include) hold it too.
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_ops_header", os.path.join(ROOT, "scripts", "gen_ops_header.py"))
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    if generator.write_header():
        _log(f"generated {os.path.relpath(generator.HEADER, ROOT)} from csrc/ops.cpp")


def _sources_digest() -> str:
    """A digest of every file under csrc/: the ops' schemas and their autograd formulas, which torch.compile's
    caches cannot see (torchops/_native.py puts it in their key)."""
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(ROOT, "csrc", "**", "*"), recursive=True)):
        if os.path.isfile(path):
            digest.update(os.path.relpath(path, ROOT).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()[:16]


def _write_build_info(info: dict[str, object]) -> None:
    # torchops/_build_info.json is read at import time *before* loading _C, so a torch mismatch is
    # reported plainly instead of as an undefined-symbol error. The header bakes the same facts into _C
    # (a header rather than -D flags: the values hold characters the build's shell would eat).
    with open(os.path.join(ROOT, "torchops", "_build_info.json"), "w") as f:
        json.dump(info, f, indent=2, sort_keys=True)
        f.write("\n")
    os.makedirs(GENERATED_DIR, exist_ok=True)
    keys = ("torch", "cuda", "archs", "sources")
    header = "".join(f"#define TORCHOPS_{key.upper()} {json.dumps(str(info[key]))}\n" for key in keys)
    path = os.path.join(GENERATED_DIR, "torchops_build_config.h")
    old = open(path).read() if os.path.exists(path) else None
    if old != header:  # rewriting an unchanged header would force a rebuild of ops.cpp
        with open(path, "w") as f:
            f.write(header)


def _runtime_dirs(with_cuda: bool) -> list[str]:
    """The library's rpath: where its own dependencies (libc10_cuda, libcudart, ...) are found when a C++
    program loads it. The program's RUNPATH does not apply to a library's dependencies, and a program links
    only some of torch's libraries itself. Each directory twice: relative to an installed torchops
    (site-packages/torchops/lib -> site-packages/torch/lib), and where the torch it was built against has
    it (in-place and editable builds)."""
    site = os.path.dirname(os.path.dirname(torch.__file__))
    dirs = [os.path.join(os.path.dirname(torch.__file__), "lib")]
    if with_cuda:  # the CUDA runtime of a pip torch lives in site-packages/nvidia/<...>/lib, else the toolkit's
        cudart = sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcudart.so.*")))
        dirs.append(os.path.dirname(cudart[0]) if cudart else os.path.join(CUDA_HOME, "lib64"))
    relative = [os.path.join("$ORIGIN", "..", "..", os.path.relpath(d, site)) for d in dirs if d.startswith(site)]
    return relative + dirs


LIBRARY = "torchops.lib.libtorchops"  # built as torchops/lib/libtorchops.so (see BuildTorchops)
LIBRARY_FILE = "libtorchops.so"
MODULE = "torchops._C"


def _extensions() -> list:
    with_cuda, why_not = _cuda_available_for_build()
    if not with_cuda and FORCE_CUDA:
        raise RuntimeError(f"TORCHOPS_FORCE_CUDA=1 but CUDA cannot be built: {why_not}")

    opt = ["-O0", "-g"] if DEBUG else ["-O3"]
    cxx_flags = [*opt, "-fdiagnostics-color=always"]
    # at::parallel_for is inline in ATen's headers: without -fopenmp its `#pragma omp parallel` is compiled
    # out and every CPU kernel runs on one thread. The GOMP symbols resolve at load time to the libgomp.so.1
    # torch itself loads (libtorch_cpu needs it), so there is one OpenMP runtime and torch.set_num_threads
    # applies to our kernels too.
    if sys.platform.startswith("linux") and torch.backends.openmp.is_available():
        cxx_flags.append("-fopenmp")
    nvcc_flags = [*opt, "--expt-relaxed-constexpr", "-lineinfo"]
    archs = ""
    cuda_version = ""
    # Everything under csrc/ but the Python module entry (csrc/python/) goes into the library.
    python_dir = os.path.join("csrc", "python") + os.sep
    sources = _sources("csrc/**/*.cpp", exclude=python_dir)
    if with_cuda:
        archs = _arch_list()
        cuda_version = torch.version.cuda or ""
        sources += _sources("csrc/**/*.cu", exclude=python_dir)
        cxx_flags.append("-DTORCHOPS_WITH_CUDA")
        _log(f"CUDA build (CUDA {cuda_version}, archs {archs}, CUDA_HOME={CUDA_HOME})")
    else:
        _log(f"CPU-only build: {why_not}. CUDA kernels are not compiled.")

    info = {"torch": torch.__version__, "cuda": cuda_version, "archs": archs, "with_cuda": with_cuda,
            "sources": _sources_digest()}
    _write_build_info(info)
    _write_ops_header()

    debug_link = ["-g"] if DEBUG else []
    kind = CUDAExtension if with_cuda else CppExtension
    library = kind(
        LIBRARY,
        sources,
        include_dirs=[GENERATED_DIR],
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags} if with_cuda else {"cxx": cxx_flags},
        # A plain soname, so a C++ program and the Python module that both load it share one copy (the
        # loader matches sonames) and every op registers once.
        extra_link_args=[f"-Wl,-soname,{LIBRARY_FILE}", *(f"-Wl,-rpath,{d}" for d in _runtime_dirs(with_cuda)),
                         *debug_link],
    )
    # The library must not need libtorch_python (Python symbols): CppExtension adds it unless the
    # extension is limited-API, which this one (not a Python module) isn't. (_C is, so it never gets it.)
    library.libraries = [name for name in library.libraries if name != "torch_python"]

    module_flags = {"cxx": [*opt, "-fdiagnostics-color=always"]}
    if with_cuda:
        module_flags["cxx"].append("-DTORCHOPS_WITH_CUDA")
    module = CppExtension(
        MODULE,
        _sources("csrc/python/*.cpp"),
        include_dirs=[GENERATED_DIR],
        py_limited_api=True,
        extra_compile_args=module_flags,
        # Linked (not only loaded) against the library, so importing _C brings every op; --no-as-needed
        # because the module calls nothing in it (the registrations are static initialisers); found through
        # an rpath relative to the module wherever the package lands (in place, editable, wheel).
        extra_link_args=["-Wl,--push-state,--no-as-needed", "-ltorchops", "-Wl,--pop-state",
                         "-Wl,-rpath,$ORIGIN/lib", *debug_link],
    )
    return [library, module]


class BuildTorchops(BuildExtension):
    """Names the operator library plainly (libtorchops.so, no Python ABI tag: it is not a Python module) and
    links the Python module against the copy just built."""

    def get_ext_filename(self, fullname: str) -> str:
        # Called with the short name (building) and the dotted one (copying in place); keep the directories.
        parts = fullname.split(".")
        if parts[-1] == LIBRARY.rsplit(".", 1)[1]:
            return os.path.join(*parts[:-1], LIBRARY_FILE)
        return super().get_ext_filename(fullname)

    def build_extension(self, ext) -> None:
        if ext.name == MODULE:
            ext.library_dirs = [*ext.library_dirs, os.path.dirname(self.get_ext_fullpath(LIBRARY))]
        super().build_extension(ext)

    def copy_extensions_to_source(self) -> None:
        # In place (and editable installs): the library's directory, torchops/lib, holds nothing else.
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            os.makedirs(os.path.dirname(self._get_inplace_equivalent(build_py, ext)[0]), exist_ok=True)
        super().copy_extensions_to_source()


if shutil.which("ninja") is None:
    _log("ninja not found: falling back to a slow serial build (pip install ninja)")

# The fake kernels live in the repo's top-level meta_kernels/ folder and install inside torchops, as the
# package csrc/ops.cpp's set_python_module names (a generic top-level name could clash with another project).
FAKE_KERNELS = "torchops._meta_kernels"

setup(
    packages=[*find_packages(include=["torchops", "torchops.*"]), FAKE_KERNELS],
    package_dir={FAKE_KERNELS: "meta_kernels"},
    # The C++ side ships in the package, laid out as torch lays out its own: include/, lib/, share/cmake/.
    package_data={"torchops": ["_build_info.json", "py.typed", "include/torchops/*.h",
                               "share/cmake/torchops/*.cmake"]},
    ext_modules=_extensions(),
    cmdclass={"build_ext": BuildTorchops.with_options(use_ninja=shutil.which("ninja") is not None)},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},  # _C's stable ABI: Python 3.10 and later
)
