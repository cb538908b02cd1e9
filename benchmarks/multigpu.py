"""Several GPUs of one host: a tensor-parallel LLaMA MLP sub-layer and an FSDP2 training step, torchops against the
same plan with native ops. Run it under torchrun, one process a GPU (NCCL; gloo on the CPU):

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m benchmarks.multigpu \
        [--device cuda|cpu] [--quick] [--no-bars] [--cases tp,fsdp]

- case "tp mlp fwd+bwd" (benchmarks/bars.py MULTI_GPU_TP_SIZES: LLaMA-3-8B's MLP at 8192 tokens, bf16): the residual
  add and RMSNorm sequence-parallel (tokens sharded), one all-gather, gate and up colwise, down rowwise (its output
  reduce-scattered back to tokens); forward, then the gradients of input, residual and every weight. "native":
  ``x + r``, ``nn.RMSNorm``, ``F.silu(gate) * up``; "torchops": ``add_rms_norm``, ``swiglu``; each also under
  ``torch.compile`` of the parallelised module (``+ torch.compile``). Rows "... (1 GPU)": the same sub-layer on whole
  tensors on one GPU (rank 0), for the scaling.
- case "fsdp2 train step": bench_transformers' LlamaForCausalLM (bars.HF_LLAMA) with FSDP2 (each decoder layer, then
  the model) and AdamW, a batch of bars.HF_TRAIN_BATCH on each rank: "unpatched" against "torchops"
  (``torchops.transformers.patch`` before sharding); time per step, and (CUDA) the peak memory of a step on the
  fullest GPU, resident weights and optimizer state included. "... (1 GPU)": the model unsharded on one GPU with
  one rank's batch (so the scaling is tokens per second on all ranks over one GPU's).
Every rank makes the same calls in the same order. A time is the largest over the ranks of the median of 3 rounds
(interleaved across implementations) of a fixed number of calls. Results agree before they are timed: torchops'
outputs and gradients against native's, the sharded ones against one GPU's, first losses against unpatched.
Only rank 0 prints and writes results/multigpu_<device>.json. Bars (world size 2, CUDA): benchmarks/bars.py.
On the CPU the sizes are tiny (a smoke run of the same code) and no bar applies.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks import harness as H
from benchmarks.bars import (MULTI_GPU_FSDP, MULTI_GPU_FSDP_MEMORY, MULTI_GPU_NATIVE, MULTI_GPU_TP, MULTI_GPU_TP_SIZES,
                             MULTI_GPU_UNPATCHED)
from benchmarks.harness import IMPL

OP = "multigpu"
COMPILED_SUFFIX = " + torch.compile"
ONE_GPU_SUFFIX = " (1 GPU)"
ROUNDS = 3
# NVLink multicast can take the host's GPUs out of service: never on (the GPU machines set these too).
for _var, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                     ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_var, _value)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, use_torchops: bool) -> None:
        super().__init__()
        self.use_torchops = use_torchops
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, h: Tensor) -> Tensor:
        import torchops
        act = torchops.swiglu(self.gate(h), self.up(h)) if self.use_torchops else F.silu(self.gate(h)) * self.up(h)
        return self.down(act)


class MLPSubLayer(nn.Module):
    """LLaMA's MLP sub-layer with the residual add and pre-norm before it: returns (mlp(norm(x + r)), x + r)."""

    def __init__(self, dim: int, hidden: int, use_torchops: bool, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.mlp = MLP(dim, hidden, use_torchops)

    def forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        if self.mlp.use_torchops:
            import torchops
            h, residual = torchops.add_rms_norm(x, residual, self.norm.weight, self.eps)
        else:
            residual = x + residual
            h = self.norm(residual)
        return self.mlp(h), residual


def parallelize(model: MLPSubLayer, mesh: Any) -> MLPSubLayer:
    """The sequence-parallel norm (weight replicated, tokens sharded), one all-gather before the MLP, gate and up
    colwise, down rowwise with its output reduce-scattered to tokens: torchtitan's plan for the feed-forward."""
    from torch.distributed.tensor import Replicate, Shard, distribute_module
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   parallelize_module)
    distribute_module(model.norm, mesh)
    return parallelize_module(model, mesh, {
        "mlp": PrepareModuleInput(input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),),
                                  use_local_output=False),
        "mlp.gate": ColwiseParallel(use_local_output=False),
        "mlp.up": ColwiseParallel(use_local_output=False),
        "mlp.down": RowwiseParallel(output_layouts=Shard(0), use_local_output=False),
    })


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(fns: dict[str, Callable[[], Any]], device: str, reps: int, *, collective: bool) -> dict[str, float]:
    """Median over ROUNDS interleaved rounds of `reps` calls each; collective: every rank runs them together and
    the time is the largest over the ranks."""
    for fn in fns.values():
        fn()
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            synchronize(device)
            if collective:
                dist.barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            synchronize(device)
            samples[name].append((time.perf_counter() - t0) * 1e3 / reps)
    out = {}
    for name, s in samples.items():
        ms = torch.tensor([statistics.median(s)], dtype=torch.float64, device=device)
        if collective:
            dist.all_reduce(ms, op=dist.ReduceOp.MAX)
        out[name] = float(ms)
    return out


def agree(error: str | None, device: str) -> None:
    """Raise on every rank if a check failed on any (a rank raising alone would leave the others waiting in the
    next collective); the message is the failing rank's."""
    flag = torch.tensor([error is not None], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        raise AssertionError(error or "a check failed on another rank (its message is in its own output)")


def max_over_ranks(value: float, device: str) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def assert_close(actual: Tensor, expected: Tensor, what: str, dtype: torch.dtype) -> None:
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol,
                               msg=lambda m: f"{what}: {m}")


def row(case: str, impl: str, ms: float, shape: str, numel: int, dtype: str, device: str, ws: int,
        baseline: tuple[str, float] | None = None, **extra: Any) -> H.Result:
    r = H.Result(op=OP, case=case, dtype=dtype, shape=shape, numel=numel, impl=impl, device=device, ms=ms,
                 extra={"world_size": ws, **extra})
    if baseline is not None:
        r.baseline, r.speedup = baseline[0], H.speedup(baseline[1], ms)
    return r


# ------------------------------------------------------------------------------------------ tensor parallel
def tp_case(args: argparse.Namespace, mesh: Any, dtype: torch.dtype, reps: int) -> list[H.Result]:
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    device, ws, rank = args.device, mesh.size(), dist.get_rank()
    tokens, dim, hidden = MULTI_GPU_TP_SIZES if device == "cuda" and not args.quick else (64 * ws, 64, 128)
    shape, numel = f"{tokens}x{dim}x{hidden}", tokens * dim
    gen = torch.Generator().manual_seed(0)
    x, r, g_out, g_res = (torch.randn(tokens, dim, generator=gen).to(device=device, dtype=dtype) for _ in range(4))
    torch.manual_seed(1)
    base = MLPSubLayer(dim, hidden, False).to(device=device, dtype=dtype)
    with torch.no_grad():
        base.norm.weight.uniform_(0.5, 1.5)
    shard = [Shard(0)]
    dx, dr, dg_out, dg_res = (distribute_tensor(t, mesh, shard) for t in (x, r, g_out, g_res))
    dx.requires_grad_()
    dr.requires_grad_()

    def sublayer(use_torchops: bool) -> MLPSubLayer:  # base's weights, this implementation's ops
        model = copy.deepcopy(base)
        model.mlp.use_torchops = use_torchops
        return model

    def sharded(use_torchops: bool, compiled: bool) -> Callable[[], list[Tensor]]:
        model = parallelize(sublayer(use_torchops), mesh)
        call = torch.compile(model) if compiled else model
        inputs = [dx, dr, *model.parameters()]

        def step() -> list[Tensor]:
            out, res = call(dx, dr)
            return [out, res, *torch.autograd.grad((out, res), inputs, (dg_out, dg_res))]
        return step

    impls = {MULTI_GPU_NATIVE: (False, False), IMPL: (True, False)}
    if args.compile:
        impls |= {MULTI_GPU_NATIVE + COMPILED_SUFFIX: (False, True), IMPL + COMPILED_SUFFIX: (True, True)}
    steps = {name: sharded(*how) for name, how in impls.items()}
    full = lambda ts: [t.full_tensor() if isinstance(t, DTensor) else t for t in ts]  # noqa: E731
    results = {name: full(step()) for name, step in steps.items()}

    # One GPU, whole tensors: the reference for the sharded results and the time the scaling is against.
    one_gpu: dict[str, float] = {}
    error = None
    if rank == 0:
        singles = {}
        for use_torchops in (False, True):
            model = sublayer(use_torchops)
            lx, lr = x.clone().requires_grad_(), r.clone().requires_grad_()
            inputs = [lx, lr, *model.parameters()]

            def single(model: MLPSubLayer = model, lx: Tensor = lx, lr: Tensor = lr,
                       inputs: list[Tensor] = inputs) -> list[Tensor]:
                out, res = model(lx, lr)
                return [out, res, *torch.autograd.grad((out, res), inputs, (g_out, g_res))]
            singles[(IMPL if use_torchops else MULTI_GPU_NATIVE) + ONE_GPU_SUFFIX] = single
        reference = singles[MULTI_GPU_NATIVE + ONE_GPU_SUFFIX]()
        names = ["out", "residual_out", "grad x", "grad residual", "grad norm.weight", "grad gate", "grad up",
                 "grad down"]
        try:
            for impl, got in [*results.items(), (IMPL + ONE_GPU_SUFFIX, singles[IMPL + ONE_GPU_SUFFIX]())]:
                for name, a, b in zip(names, got, reference):
                    assert_close(a, b, f"tp sub-layer {impl} {name} against native on one GPU", dtype)
        except AssertionError as e:
            error = str(e)
        else:
            one_gpu = time_ms(singles, device, reps, collective=False)
    agree(error, device)
    times = time_ms(steps, device, reps, collective=True)
    dname = H.DTYPE_NAMES[dtype]
    rows = []
    for impl, ms in times.items():
        peer = MULTI_GPU_NATIVE + (COMPILED_SUFFIX if impl.endswith(COMPILED_SUFFIX) else "")
        rows.append(row(MULTI_GPU_TP, impl, ms, shape, numel, dname, device, ws,
                        baseline=(peer, times[peer]) if impl != peer else None))
    for impl, ms in one_gpu.items():
        tp = times[impl.removesuffix(ONE_GPU_SUFFIX)]
        rows.append(row(MULTI_GPU_TP, impl, ms, shape, numel, dname, device, 1,
                        scaling=ms / tp, note=f"{ws} ranks {ms / tp:.2f}x as fast as one"))
    return rows


# ------------------------------------------------------------------------------------------------- FSDP2
def fsdp_case(args: argparse.Namespace, mesh: Any, dtype: torch.dtype, reps: int) -> list[H.Result]:
    import transformers
    import torchops.transformers as tt
    from torch.distributed.fsdp import fully_shard
    from benchmarks.bench_transformers import IGNORE_EVERY, Trainee, check_loss, sizes
    device, ws, rank = args.device, mesh.size(), dist.get_rank()
    config_kwargs, (batch, seq), _ = sizes(args)
    config = transformers.LlamaConfig(**config_kwargs, max_position_embeddings=seq, tie_word_embeddings=False,
                                      attn_implementation="sdpa")
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(1 + rank)  # each rank its own batch (data parallel)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=gen).to(device)
    labels = ids.clone()
    labels[..., ::IGNORE_EVERY] = -100
    shape, numel = f"{batch}x{seq}", batch * seq

    def trainee(patched: bool, sharded: bool) -> Trainee:
        model = copy.deepcopy(base)
        if patched:
            tt.patch(model)
        if sharded:
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        return Trainee(model, model, ids, labels)

    trainees = {MULTI_GPU_UNPATCHED: trainee(False, True), IMPL: trainee(True, True)}
    reference = trainees[MULTI_GPU_UNPATCHED].loss()
    error = None
    try:
        check_loss(f"fsdp2 {IMPL} on rank {rank}", trainees[IMPL].loss(), reference, dtype)
    except AssertionError as e:
        error = str(e)
    agree(error, device)
    times = time_ms({name: t.step for name, t in trainees.items()}, device, reps, collective=True)
    peaks = {name: max_over_ranks(t.peak_bytes(device), device) for name, t in trainees.items()} if device == "cuda" else {}
    del trainees
    H.free_memory(device)
    one_gpu: dict[str, float] = {}
    if rank == 0 and not args.no_single:
        singles = {name + ONE_GPU_SUFFIX: trainee(name == IMPL, False) for name in (MULTI_GPU_UNPATCHED, IMPL)}
        one_gpu = time_ms({name: t.step for name, t in singles.items()}, device, reps, collective=False)
        del singles
        H.free_memory(device)
    dist.barrier()
    dname = H.DTYPE_NAMES[dtype]
    rows = [row(MULTI_GPU_FSDP, impl, ms, shape, numel, dname, device, ws,
                baseline=(MULTI_GPU_UNPATCHED, times[MULTI_GPU_UNPATCHED]) if impl == IMPL else None,
                tokens_per_s=ws * numel / (ms / 1e3)) for impl, ms in times.items()]
    for impl, ms in one_gpu.items():
        many = times[impl.removesuffix(ONE_GPU_SUFFIX)]
        scaling = (ws * numel / many) / (numel / ms)
        rows.append(row(MULTI_GPU_FSDP, impl, ms, shape, numel, dname, device, 1, tokens_per_s=numel / (ms / 1e3),
                        scaling=scaling, note=f"{ws} ranks {scaling:.2f}x the tokens per second of one"))
    for impl, peak in peaks.items():
        r = row(MULTI_GPU_FSDP_MEMORY, impl, 0.0, shape, numel, dname, device, ws, peak_bytes=peak,
                peak_mib=peak / 2**20)
        if impl == IMPL:
            r.speedup, r.baseline = peaks[MULTI_GPU_UNPATCHED] / max(peak, 1), f"{MULTI_GPU_UNPATCHED} (peak ratio)"
        rows.append(r)
    return rows


# --------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="small sizes (no bar applies)")
    parser.add_argument("--no-bars", action="store_true")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--no-single", action="store_true", help="skip the one-GPU rows of the FSDP2 case")
    parser.add_argument("--cases", default="tp,fsdp")
    parser.add_argument("--reps", type=int, default=None, help="calls a round (default: 20 tp / 5 fsdp on CUDA)")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("run it under torchrun: python -m torch.distributed.run --standalone --nproc_per_node 2 "
                     "-m benchmarks.multigpu")
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, ws = dist.get_rank(), dist.get_world_size()
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(args.device, (ws,))
    H.raise_recompile_limit()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    cases = {"tp": tp_case, "fsdp": fsdp_case}
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not wanted or set(wanted) - set(cases):
        parser.error(f"--cases: a comma-separated subset of {','.join(cases)}")
    results: list[H.Result] = []
    failures: list[str] = []
    for name in wanted:
        reps = args.reps or (1 if args.device == "cpu" else 20 if name == "tp" else 5)
        try:
            results += cases[name](args, mesh, dtype, reps)
        except AssertionError as e:  # every rank raised (agree): the next case starts together
            failures.append(f"wrong result: {e}")
    status = 0
    if rank == 0:
        from benchmarks.bench_linear_cross_entropy import judge_memory_bars
        judged = args.device == "cuda" and not args.quick and not args.no_bars and ws == 2 and set(wanted) == set(cases)
        verdicts = H.check_all_bars(results, [OP], args.device) if judged else []
        memory = judge_memory_bars(results, OP, args.device) if judged else []
        note = "" if judged else "NOT CHECKED: the bars are for the full sizes and cases on 2 CUDA GPUs"
        summary = "\n".join([f"{r.case} {r.impl}: {r.extra['note']}" for r in results if "note" in r.extra]
                            + [f"{r.impl}: peak {r.extra['peak_mib']:.0f} MiB on the fullest GPU" for r in results
                               if r.case == MULTI_GPU_FSDP_MEMORY]
                            + (["Memory bars (benchmarks/bars.py MEMORY_BARS):", *(line for line, _ in memory)]
                               if memory else []))
        H.emit(results, f"{OP}_{args.device}" + ("_quick" if args.quick else ""), out_dir=args.out_dir,
               summary=summary, meta={"bench": OP, "world_size": ws, "cases": wanted}, bars=verdicts,
               bars_note=note)
        failures += [line.strip() for line, ok in memory if not ok]
        for failure in failures:
            print(f"FAILED: {failure}", file=sys.stderr)
        status = H._verdict(OP, verdicts, failures)
    elif failures:
        status = 1
    flag = torch.tensor([status], device=args.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    dist.destroy_process_group()
    return int(flag)


if __name__ == "__main__":
    status = main()
    # Past destroy_process_group the interpreter's own teardown aborts now and then on gloo (a joinable C++
    # thread destroyed at exit, pytorch #190489): the run's verdict is in, so leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
