"""rms_norm / add_rms_norm CUDA forward at 4096 rows: how a kernel's time depends on what the GPU ran before it,
for the register rows (norm_forward_register_rows_kernel: the row read once), the stream kernel they took those
rows from (read twice), Liger-Kernel 0.8.5, `torch.compile` and a device copy of the same bytes; and what each
costs right after a bf16 GEMM, as in a model. history/log.md, "a seventeenth session".

Kernel time as norm_timing.kernel_us (an L2 flush before each call, a sleep kernel holding the GPU while the host
queues the calls). "after": for each predecessor, three rounds of (a batch of the predecessor's calls, then a batch
of the timed call), the timed batch's median each round; "idle" is half a second with the GPU idle. "GEMM": a
bf16 M x 2048 x N matmul into a tensor of its own, alone and followed by each forward (the forward reads its own
inputs: only the GPU's state is shared), five interleaved rounds; a forward's cost is the pair's time less the
GEMM's. Outputs are checked against float64 first ("WRONG" is printed otherwise).

The experiment build is norm_forward_register_rows_off.patch (git apply, against commit 2d086a2, whose kernels are
049e133's, on which it ran): with TORCHOPS_EXP_NOREG set, the register rows' shapes go to the kernels before them.
Build it on the GPU (README), then

    PYTHONPATH=. python benchmarks/history/tuning/norm_forward_state.py [op:dtype:MxN ...]

(default: plain:f32:4096x2048 add:bf16:4096x2048 plain:bf16:4096x4096 add:f32:4096x2048)."""
import statistics
import sys

import torch
import torch.nn.functional as F
from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
from liger_kernel.ops.rms_norm import LigerRMSNormFunction

import torchops
from norm_timing import check_variants, idle_gpu, kernel_us, rms_reference, set_env

torch._dynamo.config.recompile_limit = 1024
torch._dynamo.config.cache_size_limit = 1024
EPS = 1e-6
REPS = 80
ENVS = ["TORCHOPS_EXP_NOREG"]


def timed(fns: dict, name: str) -> float:
    fn, _, env = fns[name]
    set_env(ENVS, env)
    try:
        return kernel_us(fn, REPS)
    finally:
        set_env(ENVS, {})


cases = sys.argv[1:] or ["plain:f32:4096x2048", "add:bf16:4096x2048", "plain:bf16:4096x4096", "add:f32:4096x2048"]
for case in cases:
    op, dt, shape = case.split(":")
    m, n = (int(v) for v in shape.split("x"))
    dtype = torch.bfloat16 if dt == "bf16" else torch.float32
    x, r = torch.randn(m, n, dtype=dtype, device="cuda"), torch.randn(m, n, dtype=dtype, device="cuda")
    w = torch.randn(n, dtype=dtype, device="cuda")
    if op == "plain":
        want = rms_reference(x, w, EPS)
        ours = lambda: torchops.rms_norm(x, w, EPS)
        liger = lambda: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False)
        compiled = torch.compile(lambda a, b: F.rms_norm(a, (n,), b, EPS), dynamic=False)
        comp = lambda: compiled(x, w)
    else:
        want = rms_reference(x + r, w, EPS)
        ours = lambda: torchops.add_rms_norm(x, r, w, EPS)
        liger = lambda: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS, 0.0, "llama", False)

        def bench_form(a, res, b):
            h = a + res
            return F.rms_norm(h, (n,), b, EPS), h

        compiled = torch.compile(bench_form, dynamic=False)
        comp = lambda: compiled(x, r, w)
    copy_elems = m * n if op == "plain" else 2 * m * n
    src, dst = (torch.empty(copy_elems, dtype=dtype, device="cuda") for _ in range(2))
    ga = torch.randn(m, 2048, dtype=torch.bfloat16, device="cuda")
    gb = torch.randn(2048, n, dtype=torch.bfloat16, device="cuda")
    gout = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    gemm = lambda: torch.mm(ga, gb, out=gout)
    fns = {  # name: (call, float64 reference of its first output or None, environment)
        "register rows": (ours, want, {}), "stream": (ours, want, {"TORCHOPS_EXP_NOREG": 1}),
        "liger": (liger, want, {}), "compile": (comp, want, {}), "copy": (lambda: dst.copy_(src), None, {}),
    }
    for name in ("register rows", "stream", "liger", "compile"):
        fn, ref, env = fns[name]
        fns["GEMM, " + name] = ((lambda fn=fn: (gemm(), fn())[1]), ref, env)
    fns["GEMM"] = (gemm, None, {})
    check_variants(fns, ENVS, 2e-2 if dtype == torch.bfloat16 else 2e-5, case)

    targets = ("register rows", "stream", "liger")
    print(f"\n{case}, µs: the timed call (columns) right after a batch of the predecessor's (rows); three rounds")
    print(f"  {'after':14s}" + "".join(f"{t:>26s}" for t in targets))
    with torch.no_grad():
        for before in ("idle", "register rows", "stream", "liger", "compile", "copy"):
            cells = []
            for target in targets:
                ts = []
                for _ in range(3):
                    idle_gpu() if before == "idle" else timed(fns, before)
                    ts.append(timed(fns, target))
                cells.append(" ".join(f"{t:6.2f}" for t in ts))
            print(f"  {before:14s}" + "".join(f"{c:>26s}" for c in cells))
        sys.stdout.flush()
        pairs = [k for k in fns if k.startswith("GEMM")]
        times = {k: [] for k in pairs}
        for _ in range(5):
            for k in pairs:
                times[k].append(timed(fns, k))
    g = statistics.median(times["GEMM"])
    print(f"{case}, µs: after a bf16 GEMM {m}x2048x{n}: five rounds, median, median less the GEMM's")
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"  {k:22s} " + " ".join(f"{t:7.2f}" for t in ts) + f"   {med:7.2f}  {med - g:6.2f}")
    sys.stdout.flush()
    torch._dynamo.reset()
    del x, r, w, src, dst, ga, gb, gout
    torch.cuda.empty_cache()
