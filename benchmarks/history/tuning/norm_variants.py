"""A/B timing of the CUDA rms_norm / add_rms_norm kernel variants behind experiment knobs (env vars read once
per process), in one GPU call: each variant runs in its own process; peers (copy, F.rms_norm, Liger,
optionally torch.compile) in another. CUDA-event medians; prints one JSON line per measurement and a table.

The knobs (TORCHOPS_NORM_*) exist only in the kernels of commit 0163eee; they were removed after the run
written up in norm_variants_h200.md (raw lines: norm_variants_h200.jsonl). On later kernels every variant
runs the same code: the script is kept as the record of how the numbers were taken.

    python benchmarks/history/tuning/norm_variants.py [--out FILE] [--compile]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

GRID = [(4096, 2048), (65536, 1024), (32768, 4096), (16384, 8192), (8192, 16384), (4096, 32768), (2048, 65536)]
ODD_NS = [1, 33, 257, 1025, 2056, 4096, 8195, 16384, 16388, 32768, 32776, 40000, 65536, 70000, 131072, 131080]
VARIANTS = {  # in order of interest: a run cut short keeps the first ones
    "base": {"TORCHOPS_NORM_CLUSTER": "0", "TORCHOPS_NORM_WARP_MB": "1", "TORCHOPS_NORM_BWD_UNITS": "4"},
    "cl256": {"TORCHOPS_NORM_CLUSTER": "256"},
    "cl256_stream": {"TORCHOPS_NORM_CLUSTER": "256", "TORCHOPS_NORM_STREAM": "1"},
    "cl128": {"TORCHOPS_NORM_CLUSTER": "128"},
    "cl256_wpre": {"TORCHOPS_NORM_CLUSTER": "256", "TORCHOPS_NORM_WPRE": "1"},
    "cl256_warp6_wpre": {"TORCHOPS_NORM_CLUSTER": "256", "TORCHOPS_NORM_WARP_MB": "6", "TORCHOPS_NORM_WPRE": "1"},
    "cl256_bwdwarp4": {"TORCHOPS_NORM_CLUSTER": "256", "TORCHOPS_NORM_BWD_WARP_MB": "4"},
    "cl256_bwd41": {"TORCHOPS_NORM_CLUSTER": "256", "TORCHOPS_NORM_BWD_UNITS": "41"},
    "cl256_bwd8": {"TORCHOPS_NORM_CLUSTER": "256", "TORCHOPS_NORM_BWD_UNITS": "8"},
    "cl512": {"TORCHOPS_NORM_CLUSTER": "512"},
    "cl256_warp6": {"TORCHOPS_NORM_CLUSTER": "256", "TORCHOPS_NORM_WARP_MB": "6"},
}
ALL_OPS = ("fwd", "add_fwd", "fwdbwd", "add_fwdbwd")
# the grid rows each variant can change (others run the base kernels)
SHAPES = {"cl128": lambda n: n >= 16384, "cl512": lambda n: n >= 16384, "cl256_warp6": lambda n: n <= 2048,
          "cl256_wpre": lambda n: n <= 2048, "cl256_warp6_wpre": lambda n: n <= 2048,
          "cl256_bwd8": lambda n: n <= 16384, "cl256_bwd41": lambda n: 2048 < n <= 8192,
          "cl256_bwdwarp4": lambda n: n <= 2048}
OPS = {"base": ALL_OPS, "cl256": ALL_OPS, "peers": ALL_OPS,  # else fwd, add_fwd
       "cl256_bwd8": ("fwdbwd",), "cl256_bwd41": ("fwdbwd",), "cl256_bwdwarp4": ("fwdbwd", "add_fwdbwd")}
EPS = 1e-6


def timed_us(fn, reps: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def child(variant: str, which: str) -> None:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    if which == "ours":
        import torchops  # noqa: F401

        ours_fwd = lambda x, w: torch.ops.myns.rms_norm(x, w, EPS, 0.0)  # noqa: E731
        ours_add = lambda x, r, w: torch.ops.myns.add_rms_norm(x, r, w, EPS, 0.0)  # noqa: E731
        # correctness at odd row lengths (every path) against float64
        for dt in (torch.bfloat16, torch.float32):
            tol = 1.6e-2 if dt == torch.bfloat16 else 2e-5
            for n in ODD_NS:
                x = torch.randn(3, n, device="cuda", dtype=dt)
                r = torch.randn(3, n, device="cuda", dtype=dt)
                w = torch.randn(n, device="cuda", dtype=dt)
                want = F.rms_norm(x.double(), (n,), w.double(), EPS)
                got = ours_fwd(x, w)
                ok = torch.allclose(got.double(), want, rtol=tol, atol=tol)
                h = x + r
                out, res = ours_add(x, r, w)
                ok_add = torch.equal(res, h) and torch.allclose(
                    out.double(), F.rms_norm(h.double(), (n,), w.double(), EPS), rtol=tol, atol=tol)
                xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
                dy = torch.randn_like(x)
                gx, gw = torch.autograd.grad(torch.ops.myns.rms_norm(xg, wg, EPS, 0.0), (xg, wg), dy)
                xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
                rx, rw = torch.autograd.grad(F.rms_norm(xd, (n,), wd, EPS), (xd, wd), dy.double())
                ok_bwd = torch.allclose(gx.double(), rx, rtol=tol, atol=tol) and torch.allclose(
                    gw.double(), rw, rtol=4 * tol, atol=4 * tol * 3)
                if not (ok and ok_add and ok_bwd):
                    emit(variant=variant, check="FAIL", dtype=str(dt), n=n, fwd=ok, add=ok_add, bwd=ok_bwd)
        emit(variant=variant, check="done")
    else:
        liger = None
        try:
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            liger = (LigerRMSNormFunction, LigerFusedAddRMSNormFunction)
        except Exception as e:  # noqa: BLE001
            emit(variant=variant, note=f"no liger: {e}")
        src = torch.empty(2**28, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        us = timed_us(lambda: dst.copy_(src), reps=50)
        emit(variant=variant, op="copy", us=us, tbps=2 * 2**28 / us / 1e6)
        del src, dst
    for dt in (torch.bfloat16, torch.float32):
        for m, n in GRID:
            if not SHAPES.get(variant, lambda n: True)(n):
                continue
            x = torch.randn(m, n, device="cuda", dtype=dt)
            r = torch.randn(m, n, device="cuda", dtype=dt)
            w = torch.randn(n, device="cuda", dtype=dt)
            dy = torch.randn(m, n, device="cuda", dtype=dt)
            xg, wg, rg = (t.detach().clone().requires_grad_() for t in (x, w, r))
            impls = {}
            if which == "ours":
                impls["ours"] = (ours_fwd, ours_add)
            else:
                impls["eager"] = (lambda a, b: F.rms_norm(a, (n,), b, EPS),
                                  lambda a, res, b: (lambda h: (F.rms_norm(h, (n,), b, EPS), h))(a + res))
                if liger is not None:
                    impls["liger"] = (lambda a, b: liger[0].apply(a, b, EPS, 0.0, "llama", False),
                                      lambda a, res, b: liger[1].apply(a, res, b, EPS, 0.0, "llama", False))
            ref = F.rms_norm(x.float(), (n,), w.float(), EPS)
            tol = 1.6e-2 if dt == torch.bfloat16 else 1e-5
            ops = OPS.get(variant, ("fwd", "add_fwd"))
            for name, (fwd, add) in impls.items():
                label = variant if which == "ours" else name
                if name == "liger":
                    ops = ("fwd",)  # each Triton compile costs ~1 s: the forward only
                with torch.no_grad():
                    if not torch.allclose(fwd(x, w).float(), ref, rtol=tol, atol=tol):
                        emit(variant=label, check="FAIL grid", dtype=str(dt), shape=f"{m}x{n}")
                    if "fwd" in ops:
                        us = timed_us(lambda: fwd(x, w))
                        emit(variant=label, op="fwd", dtype=str(dt), shape=f"{m}x{n}", us=us)
                    if "add_fwd" in ops:
                        us = timed_us(lambda: add(x, r, w))
                        emit(variant=label, op="add_fwd", dtype=str(dt), shape=f"{m}x{n}", us=us)
                if "fwdbwd" in ops:
                    us = timed_us(lambda: torch.autograd.grad(fwd(xg, wg), (xg, wg), dy), reps=15)
                    emit(variant=label, op="fwdbwd", dtype=str(dt), shape=f"{m}x{n}", us=us)
                if "add_fwdbwd" in ops:
                    us = timed_us(lambda: torch.autograd.grad(add(xg, rg, wg), (xg, rg, wg), (dy, dy)), reps=15)
                    emit(variant=label, op="add_fwdbwd", dtype=str(dt), shape=f"{m}x{n}", us=us)
            del x, r, w, dy, xg, wg, rg
            torch.cuda.empty_cache()


def compiled_child() -> None:
    import torch
    import torch.nn.functional as F

    torch._dynamo.config.recompile_limit = 1024
    torch._dynamo.config.cache_size_limit = 1024
    for dt in (torch.bfloat16, torch.float32):
        for m, n in GRID:
            torch._dynamo.reset()
            x = torch.randn(m, n, device="cuda", dtype=dt)
            w = torch.randn(n, device="cuda", dtype=dt)
            fn = torch.compile(lambda a, b: F.rms_norm(a, (n,), b, EPS), dynamic=False)
            with torch.no_grad():
                us = timed_us(lambda: fn(x, w))
            emit(variant="compile", op="fwd", dtype=str(dt), shape=f"{m}x{n}", us=us)
            del x, w
            torch.cuda.empty_cache()


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "--child":
        return child(args[1], args[2])
    if args and args[0] == "--compiled":
        return compiled_child()
    out = Path(args[args.index("--out") + 1]) if "--out" in args else None
    lines: list[dict] = []
    runs = [(v, "ours", env) for v, env in VARIANTS.items()]
    runs.insert(2, ("peers", "peers", {}))
    if "--compile" in args:
        runs.append(("compile", "compile", {}))
    for variant, which, env in runs:
        t0 = time.time()
        cmd = [sys.executable, __file__] + (["--compiled"] if which == "compile" else ["--child", variant, which])
        try:
            proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired as e:
            print(f"# {variant}: timed out", flush=True)
            out_text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            proc = subprocess.CompletedProcess(cmd, 124, out_text, "")
        for line in proc.stdout.splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        print(f"# {variant}: rc {proc.returncode}, {time.time() - t0:.1f} s", flush=True)
        if proc.returncode:
            print(proc.stderr[-3000:], flush=True)
        if out:
            out.write_text("\n".join(json.dumps(d) for d in lines) + "\n")
        report(lines)


def report(lines: list[dict]) -> None:
    copy = next((d["tbps"] for d in lines if d.get("op") == "copy"), None)
    for d in lines:
        if "check" in d or "note" in d:
            print(d)
    table: dict = {}
    for d in lines:
        if "us" in d and "shape" in d:
            table.setdefault((d["op"], d["dtype"], d["shape"]), {})[d["variant"]] = d["us"]
    variants = [v for v in VARIANTS] + ["eager", "liger", "compile"]
    print("op dtype shape | " + " ".join(f"{v:>11}" for v in variants) + " | best_peer  base%copy new%copy")
    for (op, dt, shape), row in table.items():
        m, n = (int(v) for v in shape.split("x"))
        size = 2 if "bfloat16" in dt else 4
        nbytes = {"fwd": 2, "add_fwd": 4, "fwdbwd": 5, "add_fwdbwd": 7}[op] * m * n * size
        peers = [row[p] for p in ("eager", "liger", "compile") if p in row]
        best = min(peers) if peers else None
        cells = " ".join(f"{row.get(v, float('nan')):11.1f}" for v in variants)
        pct = lambda us: 100 * nbytes / us / 1e6 / copy if copy else float("nan")  # noqa: E731
        ratio = "" if best is None else " ".join(f"{v}:{best / row[v]:.3f}" for v in VARIANTS if v in row)
        print(f"{op} {dt[6:]} {shape} | {cells} | {pct(row.get('base', float('nan'))):.0f}% "
              f"{pct(row.get('cl256', float('nan'))):.0f}% | {ratio}", flush=True)


if __name__ == "__main__":
    main()
