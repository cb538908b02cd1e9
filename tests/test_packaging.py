"""Where the fake kernels live: inside torchops, as ``torchops._meta_kernels`` (the modules csrc/ops.cpp's
set_python_module names), never as a top-level package that could clash with another project's, whether
torchops runs from the source tree (the repo on the path, as the tests and scripts/gpu_check.sh run it; an
editable install maps the same folders) or from a wheel; and the wheel's Python floor."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch

import torchops
from helpers import REPO_ROOT

FAKE_KERNELS = "torchops._meta_kernels"
SOURCE = os.path.join(REPO_ROOT, "meta_kernels")

# Run in a fresh interpreter: no top-level meta_kernels anywhere, and every fake kernel passes PyTorch's
# check that it lives in the module set_python_module names (made on an op's first fake call).
_FRESH = """
    import sys, torch, torchops
    from torch._subclasses.fake_tensor import FakeTensorMode
    top_level = [m for m in sys.modules if m == "meta_kernels" or m.startswith("meta_kernels.")]
    assert not top_level, top_level
    print(torchops.__file__)
    print(torchops._meta_kernels.__file__)
    with FakeTensorMode() as mode:
        x, w = mode.from_tensor(torch.randn(4, 8)), mode.from_tensor(torch.randn(8))
        crow, col = mode.from_tensor(torch.tensor([0, 1, 2, 2, 3])), mode.from_tensor(torch.tensor([0, 1, 0]))
        outs = [torch.ops.myns.vector_add(x, x), torch.ops.myns.swiglu(x, x), torch.ops.myns.gelu_and_mul(x, x),
                torch.ops.myns.rms_norm(x, w), torch.ops.myns.add_rms_norm(x, x, w)[1],
                torch.ops.myns.layer_norm(x, w, w),
                torch.ops.myns.csr_spmm(crow, col, mode.from_tensor(torch.randn(3)), mode.from_tensor(torch.randn(4, 8)))]
    assert all(o.shape == (4, 8) for o in outs), [o.shape for o in outs]
    print("ok")
"""


def _run_fresh(pythonpath: str, cwd: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_FRESH)], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "ok", proc.stdout
    return lines


def test_every_op_names_a_module_of_torchops_meta_kernels() -> None:
    assert sys.modules[FAKE_KERNELS] is torchops._meta_kernels
    for qualname in torch._C._dispatch_get_all_op_names():
        if not qualname.startswith("myns::"):
            continue
        packet = getattr(torch.ops.myns, qualname.split("::")[1])
        for overload in packet.overloads():
            module, _ = torch._C._dispatch_pystub(qualname, getattr(packet, overload)._schema.overload_name)
            assert module.startswith(FAKE_KERNELS + ".") and module in sys.modules, (qualname, module)


def test_source_tree_loads_the_top_level_folder_as_torchops_meta_kernels(tmp_path) -> None:
    # In place: the repo on PYTHONPATH, run from elsewhere.
    torchops_file, fake_kernels_file = _run_fresh(REPO_ROOT, str(tmp_path))[:2]
    assert os.path.dirname(torchops_file) == os.path.join(REPO_ROOT, "torchops")
    assert fake_kernels_file == os.path.join(SOURCE, "__init__.py")


def _in_place_build_has_cuda() -> bool:
    with open(os.path.join(REPO_ROOT, "torchops", "_build_info.json")) as f:
        return bool(json.load(f)["with_cuda"])


@pytest.mark.slow
def test_wheel_installs_the_fake_kernels_inside_torchops(tmp_path) -> None:
    # Built in the tree's build/ folder, as pip builds a local project: the in-place build's objects are reused.
    # bdist_wheel packs all of build/lib*, so a top-level meta_kernels/ left there by a build of the layout
    # before this one would be packed as well: gone first.
    for stale in glob.glob(os.path.join(REPO_ROOT, "build", "lib*", "meta_kernels")):
        shutil.rmtree(stale)
    env = dict(os.environ, MAX_JOBS=os.environ.get("MAX_JOBS", "2"))
    if not _in_place_build_has_cuda():
        env["TORCHOPS_CPU_ONLY"] = "1"
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(dist),
                    REPO_ROOT], check=True, env=env, capture_output=True, timeout=1800)
    (wheel,) = glob.glob(str(dist / "torchops-*.whl"))
    assert "-cp310-abi3-" in os.path.basename(wheel), wheel  # _C's stable ABI: Python 3.10 and later
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        z.extractall(tmp_path / "site")
    assert not [n for n in names if n.startswith("meta_kernels/")], sorted(names)
    sources = {f"torchops/_meta_kernels/{f}" for f in os.listdir(SOURCE) if f.endswith(".py")}
    assert "torchops/_meta_kernels/_checks.py" in sources and sources <= names, sorted(sources - names)
    assert "Requires-Python: >=3.10" in metadata.splitlines(), metadata
    # Installed (a wheel is unpacked as it stands), and run with neither the repo nor its folders on the path.
    site = str(tmp_path / "site")
    torchops_file, fake_kernels_file = _run_fresh(site, str(tmp_path))[:2]
    assert torchops_file == os.path.join(site, "torchops", "__init__.py")
    assert fake_kernels_file == os.path.join(site, "torchops", "_meta_kernels", "__init__.py")
