"""Benchmark torchops.transformers.patch end to end on transformers' LLaMA: a training step and greedy generation,
against the unpatched model eager and under torch.compile, and the model patched by Liger-Kernel.

The model is a ``LlamaForCausalLM`` from a random LLaMA-3-style config (benchmarks/bars.py HF_LLAMA: hidden 2048,
16 layers, 32 q / 8 kv heads, intermediate 8192, vocab 128256; SDPA attention) in bf16 on the GPU; a tiny
config (hidden 64, 2 layers, vocab 1000) in float32 on the CPU, where the rows are a smoke run and no bar applies.
Every implementation starts from the same weights, on the same batch, in the same run:
  - case "train step": ``opt.zero_grad(set_to_none=True)``, ``model(input_ids, labels=labels).loss``,
    ``backward()``, ``AdamW.step()``, batch 4 x 2048 tokens (every 16th label -100): "eager" (unpatched),
    "torch.compile" (``torch.compile(model)`` of the unpatched model), "torchops" (``patch(model)``) and
    "torchops + torch.compile" (``torch.compile`` of the patched model), timed in interleaved rounds.
  - case "train step beside liger": the torchops-patched model again beside "liger"
    (``liger_kernel.transformers.apply_liger_kernel_to_llama(model=...)``). Liger also replaces transformers'
    module-level ``apply_rotary_pos_emb`` and classes, which changes every LLaMA in the process; so it is patched
    only after every other row was measured, and the compiled models are not run again.
  - case "peak memory train step" (CUDA): the peak of ``torch.cuda.max_memory_allocated`` over one step, after
    ``reset_peak_memory_stats``, beyond what was allocated before it, plus the model's own resident bytes
    (weights and AdamW state): the peak the step would reach with this model alone on the GPU; the row's
    ``extra["peak_bytes"]``, its ``speedup`` the peer's peak over ours.
  - case "generate": ``model.generate`` of 128 new tokens (greedy, KV cache) after a 512-token prompt, batch 1,
    eager, unpatched against patched; the row's ``extra["tokens_per_s"]``.
Each implementation's first loss is checked against the unpatched eager loss first (float32 within 1e-4, bf16
within 2e-2 relative), so a wrong patch reports no number.

Bars: benchmarks/bars.py (the time bars by the harness, the memory bars MEMORY_BARS by this bench). A missed bar, a
peer that did not run or a wrong result exits non-zero. Needs transformers (``pip install torchops[transformers]``)
and, for the Liger rows, Liger-Kernel 0.8.5.

    python -m benchmarks.bench_transformers [--device cuda|cpu] [--quick] [--no-compile] [--no-liger] [--no-bars]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from typing import Any, Callable, Iterator, Sequence

import torch

from benchmarks import harness as H
from benchmarks.bars import (HF_GENERATE, HF_GENERATE_CASE, HF_LLAMA, HF_PATCHED_COMPILED, HF_TRAIN, HF_TRAIN_BATCH,
                             HF_TRAIN_MEMORY, HF_TRAIN_VS_LIGER)
from benchmarks.bench_linear_cross_entropy import judge_memory_bars
from benchmarks.harness import COMPILED, EAGER, IMPL, LIGER

OP = "transformers"
IGNORE_EVERY = 16  # every 16th label is -100

# (config, (batch, tokens), (prompt, new tokens)) per device and --quick
_SIZES: dict[tuple[str, bool], tuple[dict[str, int], tuple[int, int], tuple[int, int]]] = {
    ("cuda", False): (HF_LLAMA, HF_TRAIN_BATCH, HF_GENERATE),
    ("cuda", True): (dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                          intermediate_size=2048, vocab_size=32000), (2, 512), (64, 16)),
    ("cpu", False): (dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=128, vocab_size=1000), (2, 64), (32, 8)),
}
_SIZES[("cpu", True)] = _SIZES[("cpu", False)]


def sizes(args: argparse.Namespace) -> tuple[dict[str, int], tuple[int, int], tuple[int, int]]:
    return _SIZES[(args.device, args.quick)]


def _resident_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """The weights' and the optimizer state's bytes on this device (a sharded DTensor's: this rank's shard)."""
    tensors = list(model.parameters()) + [v for state in opt.state.values() for v in state.values()
                                          if isinstance(v, torch.Tensor)]
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local)


class Trainee:
    """A model, its AdamW and the callable that runs it (the model or its compiled twin), with one step."""

    def __init__(self, model: torch.nn.Module, call: Callable[..., Any], ids: torch.Tensor, labels: torch.Tensor):
        self.model, self.call, self.ids, self.labels = model, call, ids, labels
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def loss(self) -> float:
        with torch.no_grad():
            return self.call(input_ids=self.ids, labels=self.labels).loss.item()

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.call(input_ids=self.ids, labels=self.labels).loss.backward()
        self.opt.step()

    def peak_bytes(self, name: str) -> int:
        return H.peak_cuda_bytes(self.step, f"{name}'s training step")[0] + _resident_bytes(self.model, self.opt)


def stage(t0: float, what: str) -> None:
    """A progress line with the seconds since t0 (a run cut short by a time limit then says where it stood)."""
    print(f"  [{time.perf_counter() - t0:5.0f} s] {what}", file=sys.stderr, flush=True)


def check_loss(name: str, loss: float, reference: float, dtype: torch.dtype) -> None:
    rtol = 1e-4 if dtype == torch.float32 else 2e-2
    assert abs(loss - reference) <= rtol * abs(reference), \
        f"{name}: first loss {loss:.6f}, unpatched {reference:.6f} (rtol {rtol:g})"


def _rows(case: str, times: dict[str, float], shape: str, numel: int, dtype: torch.dtype, device: str,
          baseline: str = EAGER, extra: Callable[[str, float], dict[str, Any]] | None = None) -> list[H.Result]:
    rows = []
    for impl, ms in times.items():
        r = H.Result(op=OP, case=case, dtype=H.DTYPE_NAMES[dtype], shape=shape, numel=numel, impl=impl, device=device,
                     ms=ms, extra=extra(impl, ms) if extra else {})
        if impl != baseline and baseline in times:
            r.speedup, r.baseline = H.speedup(times[baseline], ms), baseline
        rows.append(r)
    return rows


def _memory_rows(peaks: dict[str, int], shape: str, numel: int, dtype: torch.dtype, device: str) -> list[H.Result]:
    rows = []
    for impl, peak in peaks.items():
        r = H.Result(op=OP, case=HF_TRAIN_MEMORY, dtype=H.DTYPE_NAMES[dtype], shape=shape, numel=numel, impl=impl,
                     device=device, ms=0.0, extra={"peak_bytes": peak, "peak_mib": peak / 2**20})
        if impl != IMPL and IMPL in peaks:
            r.speedup, r.baseline = peak / max(peaks[IMPL], 1), f"{IMPL} (peak ratio)"
        rows.append(r)
    return rows


def run(args: argparse.Namespace, ctx: H.Context) -> Iterator[H.Result]:
    try:
        import transformers
    except ImportError as e:
        raise RuntimeError(f"transformers is not installed ({e}): pip install torchops[transformers]") from None
    import torchops.transformers as tt

    H.raise_recompile_limit()
    device = args.device
    dtype = args.dtypes[0]
    config_kwargs, (batch, seq), (prompt_len, new_tokens) = sizes(args)
    config = transformers.LlamaConfig(**config_kwargs, max_position_embeddings=max(seq, prompt_len + new_tokens),
                                      tie_word_embeddings=False, attn_implementation="sdpa")
    print(f"transformers {transformers.__version__}, LlamaForCausalLM {config_kwargs}, {dtype}", file=sys.stderr)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype)
    stage(t0, "model built")
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=gen).to(device)
    labels = ids.clone()
    labels[..., ::IGNORE_EVERY] = -100
    shape, numel = f"{batch}x{seq}", batch * seq

    def trainee(patched: bool, compiled: bool) -> Trainee:
        model = copy.deepcopy(base)
        if patched:
            tt.patch(model)
        return Trainee(model, torch.compile(model) if compiled else model, ids, labels)

    trainees = {EAGER: trainee(False, False), IMPL: trainee(True, False)}
    if args.compile:
        trainees[COMPILED] = trainee(False, True)
        trainees[HF_PATCHED_COMPILED] = trainee(True, True)
    reference = trainees[EAGER].loss()
    for name, t in trainees.items():
        check_loss(name, t.loss(), reference, dtype)
        t.step()  # compiles, and makes the optimizer's state
        stage(t0, f"{name}: first loss checked, first step run")
    times = H.time_all_ms({name: t.step for name, t in trainees.items()}, device, quick=args.quick)
    yield from _rows(HF_TRAIN, times, shape, numel, dtype, device)
    peaks = {name: t.peak_bytes(name) for name, t in trainees.items() if device == "cuda"}
    stage(t0, "train steps timed")

    # Generation, eager: unpatched against patched, from the initial weights (the steps above may differ in count).
    prompt = torch.randint(0, config.vocab_size, (1, prompt_len), generator=gen).to(device)
    outputs: dict[str, torch.Tensor] = {}

    def generate(name: str) -> Callable[[], None]:
        model = copy.deepcopy(base).eval()
        if name == IMPL:
            tt.patch(model)

        def fn() -> None:
            with torch.no_grad():
                outputs[name] = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                               max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                               do_sample=False, use_cache=True, pad_token_id=0)
        return fn

    gen_times = H.time_all_ms({name: generate(name) for name in (EAGER, IMPL)}, device, quick=args.quick)
    same = int((outputs[EAGER] == outputs[IMPL]).sum()) - prompt_len
    stage(t0, "generation timed")
    print(f"generate: {same}/{new_tokens} new tokens equal between unpatched and patched", file=sys.stderr)
    yield from _rows(HF_GENERATE_CASE, gen_times, f"1x{prompt_len}+{new_tokens}", prompt_len + new_tokens, dtype,
                     device, extra=lambda impl, ms: {"tokens_per_s": new_tokens / (ms / 1e3),
                                                     "tokens_equal_to_eager": same})

    # Liger last: it patches transformers' module globals (every LLaMA in the process from then on).
    trainees = {IMPL: trainees[IMPL]}
    H.free_memory(device)
    if args.liger:
        try:
            from liger_kernel.transformers import apply_liger_kernel_to_llama
        except Exception as e:  # noqa: BLE001 - any import failure means: no Liger in this run
            print(f"Liger-Kernel not available ({type(e).__name__}: {e}): its bars will report no data",
                  file=sys.stderr)
        else:
            model = copy.deepcopy(base)
            apply_liger_kernel_to_llama(model=model)
            trainees[LIGER] = Trainee(model, model, ids, labels)
            check_loss(LIGER, trainees[LIGER].loss(), reference, dtype)
            trainees[LIGER].step()
            times = H.time_all_ms({name: t.step for name, t in trainees.items()}, device, quick=args.quick)
            yield from _rows(HF_TRAIN_VS_LIGER, times, shape, numel, dtype, device, baseline=LIGER)
            stage(t0, "train steps beside Liger timed")
            if device == "cuda":
                peaks[LIGER] = trainees[LIGER].peak_bytes(LIGER)
    if peaks:
        yield from _memory_rows(peaks, shape, numel, dtype, device)


def summarize(results: Sequence[H.Result], args: argparse.Namespace, ctx: H.Context) -> str:
    lines = []
    for r in results:
        if r.case == HF_TRAIN_MEMORY:
            lines.append(f"{r.impl}: peak {r.extra['peak_mib']:.0f} MiB for the training step")
        if r.case == HF_GENERATE_CASE:
            lines.append(f"{r.impl}: generate {r.extra['tokens_per_s']:.1f} tokens/s")
    verdicts = [] if args.quick or args.no_bars else [line for line, _ in judge_memory_bars(results, OP, args.device)]
    if verdicts:
        lines += ["Memory bars (benchmarks/bars.py MEMORY_BARS, judged by this bench):", *verdicts]
    return "\n".join(lines)


def judge(results: Sequence[H.Result], args: argparse.Namespace, ctx: H.Context) -> None:
    if not args.quick and not args.no_bars:
        for line, ok in judge_memory_bars(results, OP, args.device):
            if not ok:
                ctx.fail(line.strip())


def run_and_judge(args: argparse.Namespace, ctx: H.Context) -> Iterator[H.Result]:
    results: list[H.Result] = []
    try:
        for r in run(args, ctx):
            results.append(r)
            yield r
    finally:
        judge(results, args, ctx)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-compile", dest="compile", action="store_false", help="leave the torch.compile rows out")
    p.add_argument("--no-liger", dest="liger", action="store_false", help="leave Liger-Kernel out")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if len(args.dtypes) != 1:
        parser.error("--dtypes: one dtype")
    if args.device == "cpu":
        args.compile = False  # minutes of Inductor on two cores for a smoke run
        args.liger = False  # Triton kernels


# bf16 on the GPU (the bars' dtype), float32 for the CPU smoke run; a whole model's step has no copy to compare.
BENCH = H.Bench(OP, run_and_judge, default_dtypes=("bf16",), cpu_dtypes=("f32",), copy_reference=False,
                add_arguments=add_arguments, check_arguments=check_arguments, summarize=summarize)


if __name__ == "__main__":
    sys.exit(H.main(BENCH))
