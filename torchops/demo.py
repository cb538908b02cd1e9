"""End-to-end demo: torchops ops in eager, autograd, compile, export, TorchScript and AOTInductor.

Run with ``python -m torchops.demo`` (``make demo``). On each available device (cpu, plus cuda when
present) it runs every entry of ``PATHS``, compares the result with plain PyTorch, prints one table
row per (device, path) and exits with status 1 if any path failed.

Adding an op means appending ``DemoPath("swiglu/eager", swiglu_eager)`` style entries to ``PATHS``;
a path function takes the device, raises on a mismatch and returns a short note for the table.
"""

from __future__ import annotations

import copy
import platform
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import torchops

SEED = 0
DIM = 32  # feature size of the demo model
HIDDEN = 64
BATCHES = (8, 13)  # two batch sizes, so dynamic shapes are really exercised
SGD_STEPS = 3
NOTE_WIDTH = 160  # long error messages are printed in full above the table, cut short inside it
# Compiled / exported graphs may order float math differently from eager, so allow rounding noise.
MODEL_TOL: dict[str, float] = {"rtol": 1e-4, "atol": 1e-5}


@dataclass(frozen=True)
class DemoPath:
    """A named check: ``run(device)`` raises on failure and returns a note for the table."""

    name: str
    run: Callable[[torch.device], str]
    hint: str = ""  # shown before a slow path starts, so a long pause is not mistaken for a hang


@dataclass(frozen=True)
class Result:
    device: str
    path: str
    ok: bool
    ms: float
    note: str


class ResidualMLP(nn.Module):
    """``x + fc2(relu(fc1(x)))`` with the residual add done by torchops."""

    def __init__(self, dim: int = DIM, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return torchops.vector_add(x, self.fc2(torch.relu(self.fc1(x))))


class ScriptableResidualMLP(ResidualMLP):
    """Same model for TorchScript, which calls the registered op rather than the Python wrapper."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.myns.vector_add(x, self.fc2(torch.relu(self.fc1(x))))


def _make_model(device: torch.device, cls: type[ResidualMLP] = ResidualMLP) -> ResidualMLP:
    # Initialise on CPU so every device starts from identical weights.
    torch.manual_seed(SEED)
    return cls().to(device)


def _inputs(device: torch.device) -> list[Tensor]:
    return [torch.randn(batch, DIM, device=device) for batch in BATCHES]


def _check_model(run: Callable[[Tensor], Tensor], model: nn.Module, device: torch.device) -> None:
    for x in _inputs(device):
        torch.testing.assert_close(run(x), model(x), **MODEL_TOL)


def _count_vector_add_nodes(graph: torch.fx.Graph) -> int:
    return sum(node.target is torch.ops.myns.vector_add.default for node in graph.nodes)


# --- vector_add paths --------------------------------------------------------------------------


def vector_add_eager(device: torch.device) -> str:
    cases = 0
    for dtype in (torch.float32, torch.bfloat16):
        # 66 columns: an odd half (33) misses any vector width, so the scalar tail runs too.
        a = torch.randn(64, 66, device=device, dtype=dtype)
        b = torch.randn(64, 66, device=device, dtype=dtype)
        half = torch.randn(64, 33, device=device, dtype=dtype)
        operands = [(a, b), (a[:, ::2], half), (a.t(), b.t())]  # contiguous, strided, transposed
        for x, y in operands:
            expected = torch.add(x, y)
            got = torchops.vector_add(x, y)
            torch.testing.assert_close(got, expected)
            if not got.is_contiguous():
                raise AssertionError(f"vector_add returned non-contiguous strides {got.stride()}")
            # NaN poison shows any element the kernel fails to write.
            out = torch.full(expected.shape, float("nan"), device=device, dtype=dtype)
            torchops.vector_add(x, y, out=out)
            torch.testing.assert_close(out, expected)
            out.fill_(float("nan"))
            torch.ops.myns.vector_add_out(x, y, out)
            torch.testing.assert_close(out, expected)
            cases += 1
        acc = a.clone()
        torchops.vector_add(acc, b, out=acc)  # out may alias an input (in-place accumulate)
        torch.testing.assert_close(acc, a + b)
    return f"{cases} cases (f32, bf16; contiguous/strided/transposed); out=, vector_add_out, out=a"


def vector_add_autograd(device: torch.device) -> str:
    a = torch.randn(16, 24, device=device, requires_grad=True)
    b = torch.randn(24, 16, device=device).t().requires_grad_()  # non-contiguous leaf
    grad_out = torch.randn(16, 24, device=device)
    got = torch.autograd.grad(torchops.vector_add(a, b), (a, b), grad_out)
    expected = torch.autograd.grad(torch.add(a, b), (a, b), grad_out)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)
    # Finite differences in float64 check the registered backward itself, not just agreement.
    a64 = torch.randn(5, 7, device=device, dtype=torch.float64, requires_grad=True)
    b64 = torch.randn(5, 7, device=device, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(torchops.vector_add, (a64, b64))
    return "grads == torch.add's; gradcheck (f64) passes"


def _sgd_losses(loss: Callable[[], Tensor], params: list[nn.Parameter], lr: float) -> list[float]:
    """SGD_STEPS steps of SGD on `loss()` (evaluated afresh each step); the losses."""
    opt = torch.optim.SGD(params, lr=lr)
    losses = []
    for _ in range(SGD_STEPS):
        value = loss()
        opt.zero_grad()
        value.backward()
        opt.step()
        losses.append(value.item())
    return losses


def _train(model: Callable[[Tensor], Tensor], params: list[nn.Parameter], device: torch.device) -> list[float]:
    gen = torch.Generator().manual_seed(SEED)  # same data for the eager and the compiled run

    def loss() -> Tensor:
        x = torch.randn(BATCHES[0], DIM, generator=gen).to(device)
        target = torch.randn(BATCHES[0], DIM, generator=gen).to(device)
        return F.mse_loss(model(x), target)

    return _sgd_losses(loss, params, lr=0.05)


def _assert_trained_alike(reference_losses: list[float], losses: list[float], reference: nn.Module,
                          twin: nn.Module) -> None:
    torch.testing.assert_close(losses, reference_losses, **MODEL_TOL)
    for p_twin, p_ref in zip(twin.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p_twin, p_ref, **MODEL_TOL)


def _compiled_trains_like(reference: nn.Module, twin: nn.Module, device: torch.device) -> None:
    """Compiles `twin` (fullgraph, dynamic), checks its outputs against the eager `reference`, then trains
    both SGD_STEPS steps on the same data: losses and final weights must match."""
    compiled = torch.compile(twin, fullgraph=True, dynamic=True)
    _check_model(compiled, reference, device)
    reference_losses = _train(reference, list(reference.parameters()), device)
    compiled_losses = _train(compiled, list(twin.parameters()), device)
    _assert_trained_alike(reference_losses, compiled_losses, reference, twin)


def model_compile(device: torch.device) -> str:
    torch._dynamo.reset()  # fresh caches, so the time shown includes compilation on this device
    eager = _make_model(device)
    _compiled_trains_like(eager, copy.deepcopy(eager), device)
    return f"fullgraph+dynamic, batches {BATCHES}; {SGD_STEPS} SGD steps, losses match eager"


def _export(model: nn.Module, device: torch.device) -> torch.export.ExportedProgram:
    x = torch.randn(BATCHES[0], DIM, device=device)
    return torch.export.export(model, (x,), dynamic_shapes={"x": {0: torch.export.Dim.DYNAMIC}})


def model_export(device: torch.device) -> str:
    model = _make_model(device)
    program = _export(model, device)
    nodes = _count_vector_add_nodes(program.graph)
    if nodes != 1:
        raise AssertionError(f"exported graph has {nodes} myns.vector_add nodes, expected 1")
    with tempfile.TemporaryDirectory(prefix="torchops-demo-") as tmp:
        path = Path(tmp) / "residual_mlp.pt2"
        torch.export.save(program, path)
        size_kib = path.stat().st_size / 1024
        loaded = torch.export.load(path).module()
    _check_model(loaded, model, device)
    return f"1 myns.vector_add node; save -> load ({size_kib:.0f} KiB) -> run, batches {BATCHES}"


def model_torchscript(device: torch.device) -> str:
    model = _make_model(device, ScriptableResidualMLP)
    # TorchScript is deprecated upstream but still a supported path; keep its FutureWarnings out of the output.
    with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="torchops-demo-") as tmp:
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(model)
        path = Path(tmp) / "residual_mlp.pt"
        torch.jit.save(scripted, str(path))
        loaded = torch.jit.load(str(path), map_location=device)
    if "myns::vector_add" not in str(loaded.inlined_graph):
        raise AssertionError("loaded TorchScript graph does not call myns::vector_add")
    _check_model(loaded, model, device)
    return f"script -> save -> load -> run, batches {BATCHES}"


def model_aoti(device: torch.device) -> str:
    model = _make_model(device)
    with torch.no_grad(), tempfile.TemporaryDirectory(prefix="torchops-demo-") as tmp:
        program = _export(model, device)
        package = torch._inductor.aoti_compile_and_package(program, package_path=str(Path(tmp) / "residual_mlp.pt2"))
        runner = torch._inductor.aoti_load_package(package)
        _check_model(runner, model, device)
    return f"compile_and_package -> load_package -> run, batches {BATCHES}"


# --- swiglu paths ------------------------------------------------------------------------------


class SwigluMLP(nn.Module):
    """LLaMA-style MLP ``down(swiglu(gate(x), up(x)))``; ``reference=True`` uses ``F.silu(g) * u`` instead."""

    def __init__(self, dim: int = DIM, hidden: int = HIDDEN, reference: bool = False) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.reference = reference

    def forward(self, x: Tensor) -> Tensor:
        g, u = self.gate(x), self.up(x)
        return self.down(F.silu(g) * u if self.reference else torchops.swiglu(g, u))


def swiglu_eager(device: torch.device) -> str:
    cases = 0
    for dtype in (torch.float32, torch.bfloat16):
        # The halves of one fused projection, read in place; 33 columns miss every vector width.
        for hidden in (33, 64):
            x = torch.randn(16, 2 * hidden, device=device, dtype=dtype, requires_grad=True)
            gate, up = x.chunk(2, dim=-1)
            grad_out = torch.randn(16, hidden, device=device, dtype=dtype)
            got = torchops.swiglu(gate, up)
            (got_grad,) = torch.autograd.grad(got, x, grad_out)
            x64 = x.detach().double().requires_grad_()
            gate64, up64 = x64.chunk(2, dim=-1)
            expected = F.silu(gate64) * up64
            (expected_grad,) = torch.autograd.grad(expected, x64, grad_out.double())
            tol = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
            torch.testing.assert_close(got, expected.to(dtype), **tol)
            torch.testing.assert_close(got_grad, expected_grad.to(dtype), **tol)
            cases += 1
    big = torch.tensor([1e4, -1e4, 100.0, -100.0], device=device)
    out = torchops.swiglu(big, torch.ones_like(big))
    if not bool(out.isfinite().all()):
        raise AssertionError(f"swiglu overflowed at large |gate|: {out.tolist()}")
    return f"{cases} cases (f32, bf16; chunk halves, odd/even H) fwd+bwd vs f64; |gate| = 1e4 stays finite"


def swiglu_mlp_compile(device: torch.device) -> str:
    torch._dynamo.reset()
    torch.manual_seed(SEED)
    reference = SwigluMLP(reference=True).to(device)
    model = copy.deepcopy(reference)
    model.reference = False
    _compiled_trains_like(reference, model, device)
    return f"down(swiglu(gate(x), up(x))) compiled, {SGD_STEPS} SGD steps == eager F.silu*mul (losses, weights)"


# --- csr_spmm paths ----------------------------------------------------------------------------

GCN_NODES, GCN_EDGES, GCN_FEATURES, GCN_HIDDEN, GCN_CLASSES = 300, 2400, 16, 32, 4


def _gcn_graph(device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """Symmetric-normalised adjacency D^-1/2 (A + I) D^-1/2 of a random graph, as CSR (int64 indices)."""
    gen = torch.Generator().manual_seed(SEED)
    src = torch.randint(0, GCN_NODES, (GCN_EDGES,), generator=gen)
    dst = torch.randint(0, GCN_NODES, (GCN_EDGES,), generator=gen)
    loops = torch.arange(GCN_NODES)
    keys = torch.unique(torch.cat([src * GCN_NODES + dst, dst * GCN_NODES + src, loops * GCN_NODES + loops]))
    rows, cols = keys // GCN_NODES, keys % GCN_NODES
    degree = torch.bincount(rows, minlength=GCN_NODES).double()
    values = (degree[rows] * degree[cols]).rsqrt().float()
    crow = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(torch.bincount(rows, minlength=GCN_NODES), 0)])
    return crow.to(device), cols.to(device), values.to(device)


class GCN(nn.Module):
    """Two graph-convolution layers, ``A relu(A X W1) W2``, the sparse products done by torchops.csr_spmm."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(GCN_FEATURES, GCN_HIDDEN)
        self.lin2 = nn.Linear(GCN_HIDDEN, GCN_CLASSES)

    def forward(self, crow: Tensor, col: Tensor, values: Tensor, x: Tensor) -> Tensor:
        h = torch.relu(torchops.csr_spmm(crow, col, values, self.lin1(x)))
        return torchops.csr_spmm(crow, col, values, self.lin2(h))


def csr_spmm_eager(device: torch.device) -> str:
    crow, col, values = _gcn_graph(device)
    x = torch.randn(GCN_NODES, 40, device=device)
    a = torch.sparse_csr_tensor(crow, col, values, (GCN_NODES, GCN_NODES))
    torch.testing.assert_close(torchops.csr_spmm(crow, col, values, x), a @ x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torchops.spmm(a, x), a @ x, rtol=1e-5, atol=1e-5)
    return f"{GCN_NODES} nodes, {col.numel()} nonzeros: csr_spmm and spmm == torch sparse CSR @ dense"


def _train_gcn(model: Callable[..., Tensor], params: list[nn.Parameter], device: torch.device) -> list[float]:
    crow, col, values = _gcn_graph(device)
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(GCN_NODES, GCN_FEATURES, generator=gen).to(device)
    labels = torch.randint(0, GCN_CLASSES, (GCN_NODES,), generator=gen).to(device)
    return _sgd_losses(lambda: F.cross_entropy(model(crow, col, values, x), labels), params, lr=0.5)


def gcn_compile(device: torch.device) -> str:
    torch._dynamo.reset()
    torch.manual_seed(SEED)
    eager = GCN().to(device)
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, fullgraph=True)
    eager_losses = _train_gcn(eager, list(eager.parameters()), device)
    compiled_losses = _train_gcn(compiled, list(twin.parameters()), device)
    _assert_trained_alike(eager_losses, compiled_losses, eager, twin)
    if not eager_losses[-1] < eager_losses[0]:
        raise AssertionError(f"GCN loss did not decrease: {eager_losses}")
    return f"2-layer GCN, {GCN_NODES} nodes; {SGD_STEPS} SGD steps under torch.compile(fullgraph) match eager"


# --- rms_norm paths ----------------------------------------------------------------------------


class NormMLPBlock(nn.Module):
    """``x + down(swiglu(gate(h), up(h)))`` with ``h = RMSNorm(x)``: a pre-norm transformer MLP block, all
    three custom steps by torchops (``nn.RMSNorm``, ``swiglu``, ``vector_add`` for the residual)."""

    def __init__(self, dim: int = DIM, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.norm = torchops.nn.RMSNorm(dim)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(x)
        return torchops.vector_add(x, self.down(torchops.swiglu(self.gate(h), self.up(h))))


def rms_norm_eager(device: torch.device) -> str:
    cases = 0
    for dtype, weight_dtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                (torch.bfloat16, torch.float32)):
        x = torch.randn(64, 1000, device=device, dtype=dtype)
        w = torch.rand(1000, device=device, dtype=weight_dtype) + 0.5
        tol = 1e-5 if dtype == torch.float32 else 1.6e-2
        with warnings.catch_warnings():  # F.rms_norm warns that mixed dtypes take its unfused path
            warnings.simplefilter("ignore", UserWarning)
            expected = F.rms_norm(x, (1000,), w, 1e-6)
        torch.testing.assert_close(torchops.rms_norm(x, w), expected, rtol=tol, atol=tol)
        for rows in (x.t().contiguous().t(), x[:, :999]):  # transposed (copied), sliced rows (in place)
            torch.testing.assert_close(torchops.rms_norm(rows), F.rms_norm(rows, (rows.shape[-1],)), rtol=tol, atol=tol)
        cases += 3
    x64 = torch.randn(6, 33, device=device, dtype=torch.float64, requires_grad=True)
    w64 = torch.randn(33, device=device, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(torchops.rms_norm, (x64, w64))
    return f"{cases} cases vs F.rms_norm (f32, bf16, bf16 + f32 weight; dense/transposed/sliced); gradcheck (f64)"


def norm_mlp_compile(device: torch.device) -> str:
    torch._dynamo.reset()
    torch.manual_seed(SEED)
    eager = NormMLPBlock().to(device)
    with torch.no_grad():
        eager.norm.weight.uniform_(0.5, 1.5)  # not the all-ones init, so a wrong weight path shows
    _compiled_trains_like(eager, copy.deepcopy(eager), device)
    return f"RMSNorm + swiglu MLP + vector_add residual; fullgraph+dynamic; {SGD_STEPS} SGD steps match eager"


PATHS: list[DemoPath] = [
    DemoPath("eager", vector_add_eager),
    DemoPath("autograd", vector_add_autograd),
    DemoPath("compile", model_compile, hint="torch.compile, may take ~30 s"),
    DemoPath("export", model_export),
    DemoPath("torchscript", model_torchscript),
    DemoPath("aoti", model_aoti, hint="AOTInductor C++ build, may take ~30 s or more"),
    DemoPath("swiglu/eager", swiglu_eager),
    DemoPath("swiglu/mlp-compile", swiglu_mlp_compile, hint="torch.compile training, may take ~30 s"),
    DemoPath("csr_spmm/eager", csr_spmm_eager),
    DemoPath("csr_spmm/gcn-compile", gcn_compile, hint="torch.compile of a GCN training step, may take ~30 s"),
    DemoPath("rms_norm/eager", rms_norm_eager),
    DemoPath("rms_norm/block-compile", norm_mlp_compile, hint="torch.compile of a training step, may take ~30 s"),
]


# --- runner ------------------------------------------------------------------------------------


def devices() -> list[torch.device]:
    found = [torch.device("cpu")]
    if torch.cuda.is_available():
        found.append(torch.device("cuda"))
    return found


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_path(path: DemoPath, device: torch.device) -> Result:
    print(f"-> {device.type}: {path.name}" + (f" ({path.hint})" if path.hint else ""), flush=True)
    torch.manual_seed(SEED)  # each path is reproducible on its own, whatever ran before it
    _sync(device)
    start = time.perf_counter()
    try:
        note = path.run(device)
        _sync(device)
        ok = True
    except Exception as exc:  # one failing path must not hide the others
        # The full message (not the traceback, which is mostly torch internals) is what explains a failure.
        print(f"   FAILED {device.type}/{path.name}:\n{''.join(traceback.format_exception_only(exc))}", flush=True)
        lines = str(exc).strip().splitlines()
        note = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        note = note if len(note) <= NOTE_WIDTH else note[: NOTE_WIDTH - 3] + "..."
        ok = False
    ms = (time.perf_counter() - start) * 1e3
    return Result(device.type, path.name, ok, ms, note)


def print_header() -> bool:
    """Print versions and build info; return False if build_info() itself is broken."""
    print(f"torch {torch.__version__}, python {platform.python_version()}, {platform.machine()}")
    print(f"devices: {', '.join(str(d) for d in devices())}")
    try:
        info = torchops.build_info()
    except Exception as exc:
        print(f"torchops.build_info() failed: {type(exc).__name__}: {exc}")
        return False
    print("torchops.build_info():")
    for key, value in info.items():
        print(f"  {key}: {value}")
    print(flush=True)
    return True


def format_table(results: list[Result]) -> str:
    headers = ("device", "path", "ok", "time (ms)", "note")
    rows = [(r.device, r.path, "yes" if r.ok else "NO", f"{r.ms:.1f}", r.note) for r in results]
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers))]
    right = {3}  # right-align the numbers

    def line(cells: tuple[str, ...]) -> str:
        padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return " | ".join(padded).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def main() -> int:
    header_ok = print_header()
    results = [run_path(path, device) for device in devices() for path in PATHS]
    failed = sum(not r.ok for r in results)
    print()
    print(format_table(results))
    print(f"\n{len(results) - failed}/{len(results)} paths passed", flush=True)
    return 0 if failed == 0 and header_ok else 1


if __name__ == "__main__":
    sys.exit(main())
