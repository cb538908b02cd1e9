"""Exports the models examples/cpp/main.cpp runs, runs it, and checks its outputs against Python's.

    python examples/cpp/export_and_check.py --example build/example/torchops_example [--workdir DIR]
        [--device cpu] [--device cuda]

Writes to the work directory: inputs.pt, model_<device>.pt2 (an AOTInductor package per device) and
scripted.pt (TorchScript); the program writes outputs_<device>.pt. Every output of every path (AOTInductor,
TorchScript, direct calls through <torchops/ops.h>) must equal the eager Python module's, and the C++ error
message must equal Python's RuntimeError text. Devices default to cpu, plus cuda when a GPU is visible and
torchops was built with CUDA. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import torch
import torch.jit._pickle
from torch import Tensor

import torchops


class AllOps(torch.nn.Module):
    """Calls every public op once (main.cpp's direct calls make the same calls, in the same order)."""

    def forward(self, a: Tensor, b: Tensor, out: Tensor, gate: Tensor, up: Tensor, crow: Tensor, col: Tensor,
                values: Tensor, dense: Tensor, x: Tensor, weight: Tensor, h: Tensor, residual: Tensor):
        torch.ops.myns.vector_add_out(a, b, out)
        normed, residual_out = torch.ops.myns.add_rms_norm(h, residual, weight, 1e-6, 1.0)
        return (torch.ops.myns.vector_add(a, b), out.clone(), torch.ops.myns.swiglu(gate, up),
                torch.ops.myns.csr_spmm(crow, col, values, dense), torch.ops.myns.rms_norm(x, weight),
                normed, residual_out)


def make_inputs() -> dict[str, list[Tensor]]:
    g = torch.Generator().manual_seed(0)
    randn = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    m, k, n = 6, 5, 7
    mask = torch.rand(m, k, generator=g) < 0.5
    sparse = (randn(m, k) * mask).to_sparse_csr()
    args = [randn(3, 17), randn(3, 17), torch.full((3, 17), float("nan")),  # vector_add (+out: poisoned)
            randn(4, 33), randn(4, 33),  # swiglu
            *(t.clone() for t in (sparse.crow_indices(), sparse.col_indices(), sparse.values())), randn(k, n),  # csr_spmm
            randn(2, 3, 40), randn(40),  # rms_norm
            randn(2, 3, 40), randn(2, 3, 40)]  # add_rms_norm (rms_norm's weight, Gemma's offset 1)
    return {"args": args, "bad": [randn(4, 8), randn(4, 9)]}


def export(workdir: str, devices: list[str]) -> None:
    inputs = make_inputs()
    torch.save(inputs, os.path.join(workdir, "inputs.pt"))
    torch.jit.script(AllOps()).save(os.path.join(workdir, "scripted.pt"))
    for device in devices:
        args = tuple(t.to(device) for t in inputs["args"])
        ep = torch.export.export(AllOps(), args)
        torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(workdir, f"model_{device}.pt2"))


def check(workdir: str, device: str) -> list[str]:
    """The mismatches between the C++ outputs for `device` and Python's (none: an empty list)."""
    inputs = torch.load(os.path.join(workdir, "inputs.pt"))
    # torch::jit::pickle_save rebuilds typed containers through these two (annotations and tensor lists only).
    with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag, torch.jit._pickle.build_tensorlist]):
        got = torch.load(os.path.join(workdir, f"outputs_{device}.pt"))
    expected = [t.cpu() for t in AllOps()(*(t.to(device) for t in inputs["args"]))]
    problems = []
    for path in ("aoti", "torchscript", "direct"):
        if len(got[path]) != len(expected):
            problems.append(f"{device} {path}: {len(got[path])} outputs, expected {len(expected)}")
            continue
        for i, (g, e) in enumerate(zip(got[path], expected)):
            try:
                torch.testing.assert_close(g, e)
            except AssertionError as err:
                problems.append(f"{device} {path} output {i}: {err}")
    try:
        torchops.vector_add(*(t.to(device) for t in inputs["bad"]))
        python_error = "no error"
    except RuntimeError as err:
        python_error = str(err)
    if got["error"] != python_error:
        problems.append(f"{device} error: C++ {got['error']!r} != Python {python_error!r}")
    return problems


def default_devices() -> list[str]:
    cuda = torch.cuda.is_available() and torchops.build_info()["with_cuda"]
    return ["cpu", "cuda"] if cuda else ["cpu"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--example", required=True, help="the built torchops_example program")
    parser.add_argument("--workdir", help="where models and outputs go (default: a temporary directory)")
    parser.add_argument("--device", action="append", choices=["cpu", "cuda"], help="repeatable")
    options = parser.parse_args()
    devices = options.device or default_devices()
    workdir = options.workdir or tempfile.mkdtemp(prefix="torchops-example-")
    os.makedirs(workdir, exist_ok=True)

    export(workdir, devices)
    problems = []
    for device in devices:
        # No Python in the program: it finds libtorchops and libtorch through its rpath.
        run = subprocess.run([options.example, workdir, device], capture_output=True, text=True)
        print(run.stdout + run.stderr, end="")
        if run.returncode != 0:
            problems.append(f"{device}: {options.example} exited with {run.returncode}")
            continue
        problems += check(workdir, device)
    for problem in problems:
        print("MISMATCH", problem)
    if not problems:
        print(f"C++ outputs equal Python's on {', '.join(devices)} (AOTInductor, TorchScript, direct calls, error)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
