"""add_rms_norm f32 forward at 4096x2048 (rows of 512 vectors, the register rows): how many rows an SM holds at
once against the time, for the forms of norm_forward_register_rows_kernel that differ in vectors a thread and in
the registers they are allowed (__launch_bounds__' blocks an SM), beside Liger-Kernel 0.8.5, `torch.compile` and
a device copy of the same bytes. history/log.md, "an eighteenth session".

Two clocks, both three interleaved rounds, the median of the rounds: norm_timing.kernel_us (an L2 flush before each
call, the host held ahead by a sleep kernel) and the bench's own (benchmarks.harness.time_all_ms: do_bench, an L2
flush before each call). Every form's output is checked against float64 first ("WRONG" is printed otherwise).

The experiment build is norm_forward_register_rows_occupancy.patch (git apply, against the commit that adds this
script): TORCHOPS_EXP_RR=v picks the form (0: the library's, 4 vectors a thread in 128-thread blocks, 70 registers;
1: the same at 8 blocks an SM, 64 registers; 2: 2 a thread, 256 threads; 3, 4: 2 a thread at 6 / 8 blocks an SM;
5: 8 a thread, 64 threads; 6, 7: 8 a thread at 10 / 12 blocks an SM). Build it on the GPU (README), then

    PYTHONPATH=. python benchmarks/history/tuning/norm_add_register_occupancy.py [MxN ...]

(default: 4096x2048)."""
import statistics
import sys

import torch
import torch.nn.functional as F
from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

import torchops
from benchmarks import harness as H
from norm_timing import check_variants, launches, rms_reference, set_env, time_variants

torch._dynamo.config.recompile_limit = 1024
torch._dynamo.config.cache_size_limit = 1024
EPS = 1e-6
REPS = 80
ENVS = ["TORCHOPS_EXP_RR"]
FORMS = {0: "4 a thread, 128 threads", 1: "4 a thread, 8 blocks/SM", 2: "2 a thread, 256 threads",
         3: "2 a thread, 6 blocks/SM", 4: "2 a thread, 8 blocks/SM", 5: "8 a thread, 64 threads",
         6: "8 a thread, 10 blocks/SM", 7: "8 a thread, 12 blocks/SM"}

for shape in sys.argv[1:] or ["4096x2048"]:
    m, n = (int(v) for v in shape.split("x"))
    x, r = torch.randn(m, n, device="cuda"), torch.randn(m, n, device="cuda")
    w = torch.randn(n, device="cuda")
    want = rms_reference(x + r, w, EPS)

    def bench_form(a, res, b):
        h = a + res
        return F.rms_norm(h, (n,), b, EPS), h

    compiled = torch.compile(bench_form, dynamic=False)
    fns = {f"ours {v}": (lambda: torchops.add_rms_norm(x, r, w, EPS), want, {"TORCHOPS_EXP_RR": v}) for v in FORMS}
    fns["compile"] = (lambda: compiled(x, r, w), want, {})
    fns["liger"] = (lambda: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS, 0.0, "llama", False), want, {})
    src, dst = (torch.empty(2 * m * n, device="cuda") for _ in range(2))
    fns["copy"] = (lambda: dst.copy_(src), None, {})
    check_variants(fns, ENVS, 2e-5, shape)
    with torch.no_grad():
        for v in FORMS:
            set_env(ENVS, {"TORCHOPS_EXP_RR": v})
            print(f"KERNELS {shape} ours {v}:", *launches(fns[f"ours {v}"][0]), sep="\n   ")
        set_env(ENVS, {})
    held = time_variants(fns, ENVS, REPS)

    # the bench's clock: every call sets its form's variable itself (read at each launch)
    def with_env(fn, env):
        def call():
            set_env(ENVS, env)
            return fn()
        return call

    bench = {name: [] for name in fns}
    with torch.no_grad():
        for _ in range(3):
            times = H.time_all_ms({name: with_env(fn, env) for name, (fn, _, env) in fns.items()}, "cuda")
            for name, ms in times.items():
                bench[name].append(ms * 1e3)
    set_env(ENVS, {})
    copy_held, copy_bench = statistics.median(held["copy"]), statistics.median(bench["copy"])
    print(f"\nadd_rms_norm f32 {shape}, µs: kernel_us rounds, median, % of copy | bench clock rounds, median, % of copy")
    for name in sorted(fns, key=lambda k: statistics.median(held[k])):
        a, b = statistics.median(held[name]), statistics.median(bench[name])
        label = f"{name} ({FORMS[int(name[5:])]})" if name.startswith("ours") else name
        print(f"  {label:38s} " + " ".join(f"{t:6.2f}" for t in held[name]) + f"  {a:6.2f} {100 * copy_held / a:5.1f}%"
              f" | " + " ".join(f"{t:6.2f}" for t in bench[name]) + f"  {b:6.2f} {100 * copy_bench / b:5.1f}%")
    sys.stdout.flush()
    torch._dynamo.reset()
    del x, r, w, src, dst
    torch.cuda.empty_cache()
