"""Print the CMake arguments that let a C++ project find torch and torchops: `cmake -S . -B build $(python -m
torchops.cmake_args)`.

Beyond the two prefixes, a CUDA build of a pip-installed torch needs what find_package(Torch) cannot work
out by itself: the CUDA toolkit's root (when nvcc is not on PATH), the NVRTC library (the wheel ships it under
site-packages/nvidia/, where CMake's CUDA search does not look, and a toolkit may lack it) and
TORCH_CUDA_ARCH_LIST (torch's CMake probes the GPU when it is unset and fails without one). Arguments are
space-separated; paths must not contain spaces.
"""

from __future__ import annotations

import glob
import os
import shutil

import torch
import torch.utils

import torchops
from torchops import _native


def _cuda_home() -> str | None:
    # The order torch.utils.cpp_extension uses to find the toolkit.
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc is not None:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    return next((home for home in candidates if home and os.path.exists(os.path.join(home, "bin", "nvcc"))), None)


def _nvrtc(cuda_home: str) -> str | None:
    """The toolkit's libnvrtc when it has one, else the one the torch wheel depends on."""
    for pattern in (os.path.join(cuda_home, "lib64", "libnvrtc.so"),
                    os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "cu*", "lib",
                                 "libnvrtc.so.*"),
                    os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "cuda_nvrtc", "lib",
                                 "libnvrtc.so.*")):
        found = sorted(p for p in glob.glob(pattern) if "builtins" not in os.path.basename(p))
        if found:
            return found[0]
    return None


def cmake_args() -> list[str]:
    args = [f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path};{torchops.cmake_prefix_path}"]
    if torch.version.cuda is None:
        return args
    cuda_home = _cuda_home()
    if cuda_home is None:
        raise SystemExit(f"torch {torch.__version__} is a CUDA build, and CMake's find_package(Torch) needs the "
                         "CUDA toolkit (nvcc): set CUDA_HOME")
    args.append(f"-DCUDA_TOOLKIT_ROOT_DIR={cuda_home}")
    nvrtc = _nvrtc(cuda_home)
    if nvrtc is not None:
        args.append(f"-DCUDA_nvrtc_LIBRARY={nvrtc}")
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if not archs and not torch.cuda.is_available():
        # What torchops itself was built for (no GPU to probe).
        archs = (_native.read_build_info() or {}).get("archs") or "9.0"
    if archs:
        args.append(f"-DTORCH_CUDA_ARCH_LIST={archs}")
    return args


if __name__ == "__main__":
    print(" ".join(cmake_args()))
