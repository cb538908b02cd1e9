"""rms_norm / add_rms_norm CUDA forward: rows kept in registers by a block of whole warps (kPer vectors a
thread, one or more rows a block) against the library's launch, timed as kernels with the host held ahead
(a sleep kernel while every call is queued, an L2 flush before each; three interleaved rounds of 60 calls, the
median of each) beside `torch.compile`, Liger-Kernel 0.8.5 and a device copy of the same bytes. Every
variant's output is checked against float64 first ("WRONG" is printed otherwise). history/log.md, "a
sixteenth session".

The experiment build is norm_forward_block_rows_variants.patch (git apply, against commit fe057a0): it adds
norm_forward_block_rows_kernel and routes weighted rows of up to 1024 vectors to it when TORCHOPS_EXP_REGS=p
(1, 2 or 4 vectors a thread) is set, TORCHOPS_EXP_REGROWS rows a block, TORCHOPS_EXP_REGMODE bit 0: L2 hints
(inputs and outputs "evict first", the weight "evict last"), bit 1: the weight read before the sum. Build it on
the GPU (README), then

    PYTHONPATH=. python benchmarks/history/tuning/norm_forward_block_rows_variants.py [op:dtype:MxN[:p,rows,mode] ...]

(default: both ops, both dtypes, 4096x2048 and 65536x1024, every variant). A case naming one variant times only
it against the library's launch and the copy, without the peers (no compile)."""
import statistics
import sys

import torch
import torch.nn.functional as F
from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
from liger_kernel.ops.rms_norm import LigerRMSNormFunction

import torchops
from norm_timing import check_variants, launches, rms_reference, time_variants

torch._dynamo.config.recompile_limit = 1024
torch._dynamo.config.cache_size_limit = 1024
EPS = 1e-6
REPS = 60
ENVS = ["TORCHOPS_EXP_REGS", "TORCHOPS_EXP_REGROWS", "TORCHOPS_EXP_REGMODE"]


cases = sys.argv[1:] or [f"{op}:{dt}:{shape}" for shape in ("4096x2048", "65536x1024")
                         for op in ("plain", "add") for dt in ("bf16", "f32")]
for case in cases:
    op, dt, shape, *only = case.split(":")
    only = tuple(int(v) for v in only[0].split(",")) if only else None
    m, n = (int(v) for v in shape.split("x"))
    dtype = torch.bfloat16 if dt == "bf16" else torch.float32
    chunks = n * dtype.itemsize // 16
    x, r = torch.randn(m, n, dtype=dtype, device="cuda"), torch.randn(m, n, dtype=dtype, device="cuda")
    w = torch.randn(n, dtype=dtype, device="cuda")
    variants = {"default": {}}
    for p in (1, 2, 4):
        if chunks % (32 * p) or chunks > 1024:
            continue
        for rows in (1, 2):
            if rows * chunks // p > 1024 // p:
                continue
            for mode in range(4):
                if only is not None and only != (p, rows, mode):
                    continue
                variants[f"p{p} rows{rows} mode{mode}"] = {"TORCHOPS_EXP_REGS": p, "TORCHOPS_EXP_REGROWS": rows,
                                                          "TORCHOPS_EXP_REGMODE": mode}
    fns = {}
    if op == "plain":
        want = rms_reference(x, w, EPS)
        for name, env in variants.items():
            fns["ours " + name] = (lambda: torchops.rms_norm(x, w, EPS), want, env)
        if only is None:
            compiled = torch.compile(lambda a, b: F.rms_norm(a, (n,), b, EPS), dynamic=False)
            fns["compile"] = (lambda: compiled(x, w), want, {})
            fns["liger"] = (lambda: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False), want, {})
        copy_elems = m * n
    else:
        want = rms_reference(x + r, w, EPS)

        def bench_form(a, res, b):
            h = a + res
            return F.rms_norm(h, (n,), b, EPS), h

        for name, env in variants.items():
            fns["ours " + name] = (lambda: torchops.add_rms_norm(x, r, w, EPS), want, env)
        if only is None:
            compiled = torch.compile(bench_form, dynamic=False)
            fns["compile"] = (lambda: compiled(x, r, w), want, {})
            fns["liger"] = (lambda: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS, 0.0, "llama", False), want,
                            {})
        copy_elems = 2 * m * n
    src, dst = (torch.empty(copy_elems, dtype=dtype, device="cuda") for _ in range(2))
    fns["copy"] = (lambda: dst.copy_(src), None, {})
    check_variants(fns, ENVS, 2e-2 if dtype == torch.bfloat16 else 2e-5, case)
    if m * n <= 4096 * 2048 and only is None:
        with torch.no_grad():
            for name in ("ours default", "compile", "liger"):
                print(f"KERNELS {case} {name}:", *launches(fns[name][0]), sep="\n   ")
    times = time_variants(fns, ENVS, REPS)
    base = "ours default" if only is not None else min(("compile", "liger"), key=lambda k: statistics.median(times[k]))
    best_peer = statistics.median(times[base])
    print(f"\n{case} ({chunks} vectors), µs: three rounds, median, {base} / it")
    for name, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
        med = statistics.median(ts)
        print(f"  {name:22s} " + " ".join(f"{t:7.2f}" for t in ts) + f"   {med:7.2f}  {best_peer / med:.3f}")
    sys.stdout.flush()
    torch._dynamo.reset()
    del x, r, w, src, dst
    torch.cuda.empty_cache()
