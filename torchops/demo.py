"""Train small models with torchops, eagerly and under torch.compile, next to plain PyTorch.

    python -m torchops.demo [--device cpu|cuda] [--steps N]      (``make demo``)

1. A LLaMA-style pre-norm MLP block, ``x + down(swiglu(gate(h), up(h)))`` with ``h = RMSNorm(x)``:
   ``torchops.nn.RMSNorm``, ``torchops.swiglu`` and ``torchops.vector_add`` for the residual.
2. A two-layer GCN, ``A relu(A X W1) W2``, its sparse products by ``torchops.csr_spmm``.
3. A two-layer GAT (graph attention, as PyG's ``GATConv``): per-edge scores by ``torchops.sddmm``, their
   softmax over each node's incoming edges by ``torchops.csr_softmax``, the weighted sum of the sources'
   features by ``torchops.spmm_reduce``: no tensor with a row per edge and feature.
4. A small random LLaMA from transformers (when it is installed: ``pip install torchops[transformers]``),
   unpatched and patched by ``torchops.transformers.patch(model)``: losses side by side, time per step and,
   on CUDA, the peak memory of the training steps.

Each model is trained from the same weights on the same data three ways: plain PyTorch, torchops, and
torchops under ``torch.compile(fullgraph=True)`` (which refuses any graph break). The demo prints the losses
side by side, the time per step, and exits non-zero if the three disagree. The op-by-op checks (every
dtype, layout, autograd, export, TorchScript, AOTInductor) are the test suite's job: ``make test``.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import torchops

SEED = 0
# Compiled graphs may order float math differently from eager: losses agree to rounding, not bit for bit.
LOSS_TOL = {"rtol": 1e-4, "atol": 1e-5}


class MLPBlock(nn.Module):
    """Pre-norm transformer MLP block; ``use_torchops=False`` is the same math in plain PyTorch."""

    def __init__(self, dim: int, hidden: int, use_torchops: bool) -> None:
        super().__init__()
        self.norm = torchops.nn.RMSNorm(dim) if use_torchops else nn.RMSNorm(dim, eps=1e-6)
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)  # one fused projection, as in LLaMA
        self.down = nn.Linear(hidden, dim, bias=False)
        self.use_torchops = use_torchops

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(self.norm(x)).chunk(2, dim=-1)  # swiglu reads the two halves in place
        if self.use_torchops:
            return torchops.vector_add(x, self.down(torchops.swiglu(gate, up)))
        return x + self.down(F.silu(gate) * up)


class GCN(nn.Module):
    """Two graph convolutions over a fixed normalised adjacency given as CSR (crow, col, values)."""

    def __init__(self, features: int, hidden: int, classes: int, use_torchops: bool) -> None:
        super().__init__()
        self.lin1 = nn.Linear(features, hidden)
        self.lin2 = nn.Linear(hidden, classes)
        self.use_torchops = use_torchops

    def propagate(self, crow: Tensor, col: Tensor, values: Tensor, h: Tensor) -> Tensor:
        if self.use_torchops:
            return torchops.csr_spmm(crow, col, values, h)
        n = crow.numel() - 1
        return torch.sparse_csr_tensor(crow, col, values, (n, h.size(0))) @ h

    def forward(self, crow: Tensor, col: Tensor, values: Tensor, x: Tensor) -> Tensor:
        h = torch.relu(self.propagate(crow, col, values, self.lin1(x)))
        return self.propagate(crow, col, values, self.lin2(h))


class GATLayer(nn.Module):
    """Graph attention over a graph in CSR form (row i: node i's incoming edges, columns their sources), the
    layer of Velickovic et al. as PyG's ``GATConv(in_features, head_features, heads)`` computes it (concatenated
    heads, self-loops being part of the given graph): with ``h = x W`` split into heads,

        e[i, j] = leaky_relu(<h[i], att_dst> + <h[j], att_src>)       for each edge j -> i, per head
        alpha[i, :] = softmax of e[i, :] over node i's incoming edges
        out[i] = sum over those edges of alpha[i, j] * h[j]   (+ bias)

    With torchops these are three ops on the CSR structure (sddmm "add", csr_softmax, spmm_reduce): edges x heads
    scores, never edges x features. ``use_torchops=False`` is the same math in plain PyTorch, gathering a row
    per edge and scattering it back, as PyG does.
    """

    def __init__(self, in_features: int, heads: int, head_features: int, use_torchops: bool,
                 negative_slope: float = 0.2) -> None:
        super().__init__()
        self.heads, self.head_features, self.negative_slope = heads, head_features, negative_slope
        self.lin = nn.Linear(in_features, heads * head_features, bias=False)
        self.att_src = nn.Parameter(torch.randn(heads, head_features) / head_features**0.5)
        self.att_dst = nn.Parameter(torch.randn(heads, head_features) / head_features**0.5)
        self.bias = nn.Parameter(torch.zeros(heads * head_features))
        self.use_torchops = use_torchops

    def forward(self, crow: Tensor, col: Tensor, x: Tensor) -> Tensor:
        n = x.size(0)
        h = self.lin(x).view(n, self.heads, self.head_features)
        score_src, score_dst = (h * self.att_src).sum(-1), (h * self.att_dst).sum(-1)  # (n, heads)
        if self.use_torchops:
            e = F.leaky_relu(torchops.sddmm(crow, col, score_dst, score_src, "add"), self.negative_slope)
            out = torchops.spmm_reduce(crow, col, torchops.csr_softmax(crow, e), h)
        else:
            target = torch.repeat_interleave(torch.arange(n, device=x.device), crow.diff())
            e = F.leaky_relu(score_dst[target] + score_src[col], self.negative_slope)  # (edges, heads)
            top = torch.zeros_like(score_dst).scatter_reduce(0, target[:, None].expand_as(e), e, "amax",
                                                             include_self=False)
            w = torch.exp(e - top[target])
            alpha = w / torch.zeros_like(score_dst).index_add(0, target, w)[target]
            out = torch.zeros_like(h).index_add(0, target, alpha[..., None] * h[col])
        return out.reshape(n, -1) + self.bias


class GAT(nn.Module):
    """Two GAT layers: ``heads`` heads of ``hidden`` features, ELU, then one head giving the classes."""

    def __init__(self, features: int, hidden: int, heads: int, classes: int, use_torchops: bool) -> None:
        super().__init__()
        self.layer1 = GATLayer(features, heads, hidden, use_torchops)
        self.layer2 = GATLayer(heads * hidden, 1, classes, use_torchops)

    def forward(self, crow: Tensor, col: Tensor, x: Tensor) -> Tensor:
        return self.layer2(crow, col, F.elu(self.layer1(crow, col, x)))


def random_graph(nodes: int, edges: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """D^-1/2 (A + I) D^-1/2 of a random undirected graph, as CSR with sorted columns."""
    src, dst = torch.randint(0, nodes, (2, edges), generator=gen)
    loops = torch.arange(nodes)
    keys = torch.unique(torch.cat([src * nodes + dst, dst * nodes + src, loops * nodes + loops]))
    rows, cols = keys // nodes, keys % nodes
    counts = torch.bincount(rows, minlength=nodes)
    values = (counts[rows].double() * counts[cols].double()).rsqrt().float()
    crow = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    return crow, cols, values


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model: Callable[..., Tensor], params: list[nn.Parameter], batch: tuple, steps: int, loss_fn: Callable,
          lr: float, device: torch.device) -> tuple[list[float], list[float]]:
    """``steps`` SGD steps on one batch: the loss before each step and after the last (steps + 1 values), and
    the wall time of each step in seconds."""
    inputs, target = batch
    opt = torch.optim.SGD(params, lr=lr)
    losses, seconds = [], []
    for _ in range(steps):
        sync(device)
        start = time.perf_counter()
        loss = loss_fn(model(*inputs), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())  # .item() waits for the step, so the time is the step's
        seconds.append(time.perf_counter() - start)
    # With gradients recorded, as in the steps: a compiled model reuses its graph instead of compiling anew.
    losses.append(loss_fn(model(*inputs), target).item())
    return losses, seconds


def compare(title: str, make: Callable[[bool], nn.Module], batch: tuple, steps: int, loss_fn: Callable, lr: float,
            device: torch.device) -> bool:
    """Train plain PyTorch, torchops and compiled torchops from the same weights; print; True if they agree
    (and, after at least one step, the loss went down)."""
    print(f"\n{title}")
    torch.manual_seed(SEED)
    reference = make(False).to(device)
    ours = make(True).to(device)
    ours.load_state_dict(reference.state_dict())
    twin = copy.deepcopy(ours)
    torch._dynamo.reset()
    compiled = torch.compile(twin, fullgraph=True)  # fullgraph: a graph break would raise, not slow down silently
    runs = {
        "PyTorch": train(reference, list(reference.parameters()), batch, steps, loss_fn, lr, device),
        "torchops": train(ours, list(ours.parameters()), batch, steps, loss_fn, lr, device),
        "torchops + torch.compile": train(compiled, list(twin.parameters()), batch, steps, loss_fn, lr, device),
    }
    compiled_first = f"; the compiled first step took {runs['torchops + torch.compile'][1][0]:.1f} s" if steps else ""
    return report(runs, steps, timing_note=compiled_first, verdict_note="graph breaks: 0 (fullgraph=True); ")


def report(runs: dict[str, tuple[list[float], list[float]]], steps: int, *, timing_note: str = "",
           verdict_note: str = "", extra: str = "") -> bool:
    """Print the losses of ``train`` runs side by side (the first run is the reference) and their time per
    step, then ``extra`` and the verdict; True if every run's losses agree with the reference's (and, after at
    least one step, its loss went down)."""
    names = list(runs)
    print("  step  " + "".join(f"{name:>26}" for name in names) + "   (loss after the step)")
    for step in range(steps + 1):
        print(f"  {step:>4}  " + "".join(f"{runs[name][0][step]:>26.6f}" for name in names))
    if steps:
        # The first steps warm caches (and, compiled, include compilation); time the rest.
        warm = min(2, steps - 1)
        per_step = {name: 1e3 * sum(s[warm:]) / len(s[warm:]) for name, (_, s) in runs.items()}
        print("  ms/step " + ", ".join(f"{name} {ms:.2f}" for name, ms in per_step.items())
              + f"   (steps {warm + 1}-{steps}{timing_note})")
    if extra:
        print(extra)
    ok = True
    for name in names[1:]:
        try:
            torch.testing.assert_close(runs[name][0], runs[names[0]][0], **LOSS_TOL)
        except AssertionError as e:
            print(f"  {name} losses DISAGREE with {names[0]}'s:\n{e}")
            ok = False
    learned = runs[names[0]][0][-1] < runs[names[0]][0][0]
    went_down = ("yes" if learned else "NO") if steps else "(no steps taken)"
    print(f"  losses agree: {'yes' if ok else 'NO'} (rtol {LOSS_TOL['rtol']:g}); {verdict_note}"
          f"loss went down: {went_down}")
    return ok and (learned or not steps)


def compare_transformers(steps: int, device: torch.device, big: bool) -> bool:
    """A random LLaMA trained from the same weights unpatched and patched by torchops.transformers.patch; print
    the losses, the time per step and (CUDA) the peak memory; True if the losses agree. Without transformers
    the section says how to get it and passes."""
    try:
        import transformers
    except ImportError:
        print("\ntransformers is not installed (pip install torchops[transformers]): its section is skipped")
        return True
    import torchops.transformers

    layers, dim, vocab, batch, seq = (4, 1024, 32000, 4, 1024) if big else (2, 128, 8000, 4, 128)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=dim * 11 // 4,
                                      num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                                      max_position_embeddings=seq, tie_word_embeddings=False)
    print(f"\ntransformers {transformers.__version__}: LlamaForCausalLM, {layers} layers, hidden {dim}, vocab {vocab}, "
          f"{batch} x {seq} tokens; unpatched vs torchops.transformers.patch(model)")
    torch.manual_seed(SEED)
    reference = transformers.LlamaForCausalLM(config).to(device)
    patched = transformers.LlamaForCausalLM(config).to(device)
    patched.load_state_dict(reference.state_dict())
    torchops.transformers.patch(patched)
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    runs, peaks = {}, {}
    for name, model in (("transformers", reference), ("torchops-patched", patched)):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
        runs[name] = train(lambda x, y: model(input_ids=x, labels=y).loss, list(model.parameters()), ((ids, ids), None),
                           steps, lambda loss, _: loss, 0.1, device)
        if device.type == "cuda":
            peaks[name] = (torch.cuda.max_memory_allocated(device) - before) / 2**20
    if peaks:
        memory = "  peak memory of the steps beyond the model: " + ", ".join(
            f"{name} {mib:.0f} MiB" for name, mib in peaks.items())
    else:
        memory = (f"  peak memory: measured on CUDA only; the patched loss never holds the {batch * seq} x {vocab} "
                  f"logits ({batch * seq * vocab * 4 / 2**20:.0f} MiB in float32) nor their gradient")
    return report(runs, steps, extra=memory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=6, help="SGD steps per model (0: compare the initial losses)")
    args = parser.parse_args(argv)
    if args.steps < 0:
        parser.error(f"--steps must be at least 0, got {args.steps}")
    device = torch.device(args.device)
    # The PyTorch baseline's sparse CSR product warns that sparse CSR is in beta; that is not the demo's news.
    warnings.filterwarnings("ignore", message="Sparse (CSR tensor support|invariant checks)")
    big = device.type == "cuda"
    info = torchops.build_info()
    print(f"torchops on {device} (torch {torch.__version__}, {torch.get_num_threads()} CPU threads; "
          f"built {'with CUDA ' + info['cuda'] if info['with_cuda'] else 'CPU-only'})")

    gen = torch.Generator().manual_seed(SEED)
    dim, hidden, tokens = (1024, 2816, 4096) if big else (128, 352, 256)
    # One batch, fitted step after step, so the loss has to go down.
    x, target = (torch.randn(tokens, dim, generator=gen).to(device) for _ in range(2))
    ok = compare(f"LLaMA MLP block: x + down(swiglu(gate, up)) after RMSNorm, {tokens} tokens x {dim}, hidden {hidden}",
                 lambda use: MLPBlock(dim, hidden, use), ((x,), target), args.steps, F.mse_loss, 0.1, device)

    nodes, edges, features, classes = (100_000, 1_000_000, 64, 8) if big else (2_000, 16_000, 32, 4)
    crow, col, values = (t.to(device) for t in random_graph(nodes, edges, gen))
    x = torch.randn(nodes, features, generator=gen).to(device)
    labels = torch.randint(0, classes, (nodes,), generator=gen).to(device)
    adjacency = torch.sparse_csr_tensor(crow, col, values, (nodes, nodes))
    torch.testing.assert_close(torchops.spmm(adjacency, x), adjacency @ x, rtol=1e-5, atol=1e-5)
    print("\ntorchops.spmm(A, X) on a torch sparse CSR tensor == A @ X (it caches A's transpose for the backward)")
    ok &= compare(f"GCN: A relu(A X W1) W2, {nodes} nodes, {col.numel()} nonzeros, {features} features",
                  lambda use: GCN(features, 32, classes, use), ((crow, col, values, x), labels), args.steps,
                  F.cross_entropy, 0.5, device)  # full-batch training on one graph
    ok &= compare(f"GAT: two graph-attention layers (4 heads x 16, then 1 head), {nodes} nodes, {col.numel()} edges",
                  lambda use: GAT(features, 16, 4, classes, use), ((crow, col, x), labels), args.steps,
                  F.cross_entropy, 0.05, device)
    ok &= compare_transformers(args.steps, device, big)

    print("\nall agree" if ok else "\nFAILED: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
