"""rms_norm / add_rms_norm CUDA forward variants, chosen per call by environment variables that only an
experiment build reads, timed as kernels with the host held ahead (a sleep kernel while every call is queued,
an L2 flush before each; three interleaved rounds of 60 calls, the median of each) beside `torch.compile`,
Liger-Kernel 0.8.5 and a device copy of the same bytes. Every variant's output is checked against float64
first ("WRONG" is printed otherwise). history/log.md, "a fifteenth session".

The experiment builds are patches against commit f5b1c77's csrc/cuda/rms_norm_forward.cuh:
  add:   norm_forward_env_variants_add.patch. TORCHOPS_EXP_ADDT=t sends add_rms_norm's rows whose vectors
         are 1, 2 or 4 times t to the read-twice form (Keep::kInputsAgain) in t-thread blocks.
  plain: norm_forward_env_variants_plain.patch (on top of the add form as shipped). TORCHOPS_EXP_THREADS=t
         sets rms_norm's stream block size, TORCHOPS_EXP_KPER=1 takes the straight-line kernel at 2, 4 or 8
         vectors a thread, TORCHOPS_EXP_L1=1 adds Inductor's L1 priorities (sweep 1 "evict last", sweep 2
         "evict first", the weight "evict last"), =2 also stores the output without an L2 hint;
         TORCHOPS_EXP_WARPROWS=w takes rows of exactly 128 or 256 vectors a warp a row, w rows a block, the
         row in registers, with TORCHOPS_EXP_WARPMODE bit 0: the weight read before the sum, bit 1: no L2
         hints.
Apply one (git apply), build on the GPU (README), then

    PYTHONPATH=. python benchmarks/history/tuning/norm_forward_env_variants.py add|plain [dtypeMxN,...]

where the optional list (e.g. bf1665536x1024) names shapes whose Inductor code ($OUT/inductor_plain.txt) and
kernel launch shapes (a profiler trace: grid, block, registers) are recorded too (plain only)."""
import os
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
OUT = os.environ.get("OUT", "/tmp")
ENVS = ["TORCHOPS_EXP_L1", "TORCHOPS_EXP_THREADS", "TORCHOPS_EXP_WARPROWS", "TORCHOPS_EXP_WARPMODE",
        "TORCHOPS_EXP_KPER", "TORCHOPS_EXP_ADDT"]


which = sys.argv[1]  # plain | add
dumps = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else set()
code_file = open(os.path.join(OUT, f"inductor_{which}.txt"), "w")


shapes = {
    "plain": [("bf16", 65536, 1024), ("bf16", 16384, 8192), ("f32", 16384, 8192), ("f32", 4096, 2048),
              ("f32", 65536, 1024), ("bf16", 4096, 2048), ("f32", 32768, 4096), ("bf16", 32768, 4096)],
    "add": [("bf16", 32768, 4096), ("f32", 4096, 2048), ("bf16", 65536, 1024), ("bf16", 4096, 2048),
            ("f32", 65536, 1024), ("f32", 32768, 4096)],
}[which]
for dt, m, n in shapes:
    dtype = torch.bfloat16 if dt == "bf16" else torch.float32
    chunks = n * dtype.itemsize // 16
    x, r = torch.randn(m, n, dtype=dtype, device="cuda"), torch.randn(m, n, dtype=dtype, device="cuda")
    w = torch.randn(n, dtype=dtype, device="cuda")
    fns = {}
    if which == "plain":
        want = rms_reference(x, w, EPS)
        compiled = torch.compile(lambda a, b: F.rms_norm(a, (n,), b, EPS), dynamic=False)
        if f"{dt}{m}x{n}" in dumps:
            from torch._inductor.utils import run_and_get_code
            _, codes = run_and_get_code(compiled, x, w)
            code_file.write(f"\n\n######## rms_norm {dt} {m}x{n}\n" + "\n".join(codes))
            for fn_name, fn_ in (("compile", lambda: compiled(x, w)), ("ours", lambda: torchops.rms_norm(x, w, EPS)),
                                 ("liger", lambda: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False))):
                fn_()
                print(f"KERNELS {dt} {m}x{n} {fn_name}:", *launches(fn_), sep="\n   ")
        src, dst = (torch.empty(m * n, dtype=dtype, device="cuda") for _ in range(2))
        variants = {"default": {}, "L1=1": {"TORCHOPS_EXP_L1": 1}, "L1=2": {"TORCHOPS_EXP_L1": 2}}
        plan = {
            "bf1665536x1024": ([("w", 1, m_) for m_ in range(4)] + [("w", 4, m_) for m_ in range(4)]
                               + [("w", 8, 1), ("w", 8, 3)]),
            "f3265536x1024": ([("w", 1, m_) for m_ in range(4)] + [("w", 2, m_) for m_ in range(4)]
                              + [("w", 4, 1), ("w", 4, 3)]),
            "bf164096x2048": [("w", 4, m_) for m_ in range(4)] + [("w", 8, 1), ("w", 8, 3)],
            "bf1616384x8192": [("t", 256, 2), ("t", 512, 0), ("t", 512, 1), ("t", 512, 2), ("t", 256, 1)],
            "f3216384x8192": [("t", 256, 0), ("t", 256, 1), ("t", 256, 2), ("t", 512, 0), ("t", 512, 1), ("t", 512, 2)],
            "f3232768x4096": [("t", 256, 0), ("t", 256, 1), ("t", 256, 2), ("t", 512, 1), ("t", 512, 2)],
            "f324096x2048": [("t", 64, 0), ("t", 64, 1), ("t", 64, 2), ("t", 128, 0), ("t", 128, 1), ("t", 128, 2),
                             ("t", 256, 1), ("t", 256, 2)],
            "bf1632768x4096": [("t", 128, 0), ("t", 128, 1), ("t", 128, 2), ("t", 256, 1)],
        }[f"{dt}{m}x{n}"]
        for kind, t, mode in plan:
            if kind == "w":
                variants[f"warps{t} mode{mode}"] = {"TORCHOPS_EXP_WARPROWS": t, "TORCHOPS_EXP_WARPMODE": mode}
            else:
                variants[f"t{t} kper L1={mode}"] = {"TORCHOPS_EXP_THREADS": t, "TORCHOPS_EXP_KPER": 1,
                                                    "TORCHOPS_EXP_L1": mode}
        for name, env in variants.items():
            fns["ours " + name] = (lambda: torchops.rms_norm(x, w, EPS), want, env)
        fns["compile"] = (lambda: compiled(x, w), want, {})
        fns["liger"] = (lambda: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False), want, {})
        fns["copy"] = (lambda: dst.copy_(src), None, {})
    else:
        want = rms_reference(x + r, w, EPS)

        def bench_form(a, res, b):
            h = a + res
            return F.rms_norm(h, (n,), b, EPS), h

        compiled_add = torch.compile(bench_form, dynamic=False)
        src, dst = (torch.empty(2 * m * n, dtype=dtype, device="cuda") for _ in range(2))
        variants = {"default": {}}
        for t in (32, 64, 128, 256, 512):
            if chunks % t == 0 and chunks // t in (1, 2, 4):
                variants[f"again t{t}"] = {"TORCHOPS_EXP_ADDT": t}
        for name, env in variants.items():
            fns["ours " + name] = (lambda: torchops.add_rms_norm(x, r, w, EPS), want, env)
        fns["compile"] = (lambda: compiled_add(x, r, w), want, {})
        fns["liger"] = (lambda: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS, 0.0, "llama", False), want, {})
        fns["copy"] = (lambda: dst.copy_(src), None, {})
    check_variants(fns, ENVS, 2e-2 if dtype == torch.bfloat16 else 2e-5, f"{dt} {m}x{n}")
    times = time_variants(fns, ENVS, REPS)
    best_peer = min(statistics.median(times[k]) for k in ("compile", "liger"))
    print(f"\n{which} {dt} {m}x{n} ({chunks} vectors), µs: three rounds, median, best peer / it")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:16s} " + " ".join(f"{t:7.2f}" for t in ts) + f"   {med:7.2f}  {best_peer / med:.3f}")
    torch._dynamo.reset()
    del x, r, w, src, dst
    torch.cuda.empty_cache()
code_file.close()
