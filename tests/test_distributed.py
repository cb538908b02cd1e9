"""DTensor sharding rules of the myns ops (torchops.distributed), on several processes.

Spawned process groups (gloo on CPU, world sizes 2 and 4; NCCL on two or four GPUs when there are) run the
checks in distributed_workers.py: every op forward and backward on DTensor inputs against the same op on
whole tensors, a tensor/sequence-parallel LLaMA-style block trained eagerly and under torch.compile, and an
FSDP2 model with torchops.nn.RMSNorm. Each spawn runs many checks, since starting a group costs seconds. The
multi-GPU bench (benchmarks/multigpu.py) runs here on two CPU processes at its small sizes.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist

import distributed_workers

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

OP_CHECKS = ["elementwise", "norm", "layer_norm", "csr", "message_passing", "rotary"]


def spawn(world_size: int, backend: str, checks: list[str]) -> dict[str, int]:
    """Runs `checks` on `world_size` spawned ranks; returns how many cases each check ran (rank 0's count)."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        try:
            mp.spawn(distributed_workers.run, args=(world_size, init_file, backend, checks, tmp), nprocs=world_size)
        except Exception as e:
            errors = [open(os.path.join(tmp, f)).read() for f in sorted(os.listdir(tmp)) if f.endswith(".err")]
            raise AssertionError("\n".join(errors) or str(e)) from e
        oks = sorted(f for f in os.listdir(tmp) if f.endswith(".ok"))
        assert oks == [f"{r}.ok" for r in range(world_size)], oks
        with open(os.path.join(tmp, "0.ok")) as f:
            counts = ast.literal_eval(f.read())
    assert sorted(counts) == sorted(checks) and all(n > 0 for n in counts.values()), counts
    return counts


def test_every_myns_op_has_a_sharding_rule():
    import torchops.distributed as td
    from torch.distributed.tensor import DTensor

    td.register_sharding_rules()
    td.register_sharding_rules()  # idempotent
    ops = sorted(n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("myns::"))
    assert "rms_norm" in ops and "csr_spmm" in ops
    missing = [n for n in ops if n not in td.sharding_rule_ops()]
    assert not missing, f"myns ops without a DTensor sharding rule (declare them Pointwise, or add a _RULES row): {missing}"
    registered = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    for name in ops:
        packet = getattr(torch.ops.myns, name)
        for overload in packet.overloads():
            assert getattr(packet, overload) in registered, f"myns::{name}.{overload} has no registered strategy"


def test_pointwise_ops_need_no_row():
    # The elementwise ops get their rule from their definition (Pointwise in csrc/ops.cpp), not from _RULES.
    import torchops.distributed as td

    for name in ("vector_add", "vector_add_out", "swiglu", "swiglu_backward"):
        assert name not in td._RULES
        assert torch.Tag.pointwise in getattr(torch.ops.myns, name).default.tags
        assert td.rule_factory(getattr(torch.ops.myns, name).default) is td._pointwise
    assert torchops_declarations()["vector_add"]["linear_in"] == ("a", "b")
    assert torchops_declarations()["swiglu"]["linear_in"] == ()


def torchops_declarations() -> dict:
    import torchops

    return torchops._C.declarations()


def test_a_new_op_gets_the_pointwise_rule_or_is_reported():
    # A throwaway pointwise schema is given the generic rule (Shard/Replicate alike on every tensor, no
    # Partial: it declares no linearity) and registered; one that is neither pointwise nor in _RULES is
    # reported by the check above.
    import types

    import torchops.distributed as td
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    lib = torch.library.Library("myns", "FRAGMENT")  # noqa: TOR901
    try:
        lib.define("sharding_probe(Tensor x, Tensor y) -> Tensor", tags=(torch.Tag.pointwise,))
        lib.define("sharding_probe_plain(Tensor x) -> Tensor")
        probe, plain = torch.ops.myns.sharding_probe.default, torch.ops.myns.sharding_probe_plain.default
        assert td.rule_factory(probe) is td._pointwise and td.rule_factory(plain) is None
        assert "sharding_probe" in td.sharding_rule_ops() and "sharding_probe_plain" not in td.sharding_rule_ops()
        spec = types.SimpleNamespace(shape=torch.Size((4, 6)), placements=(Replicate(),))
        rules = td.rule_factory(probe)(probe)(spec, spec)
        assert ([Shard(1)], [Shard(1), Shard(1)]) in rules and ([Replicate()], [Replicate(), Replicate()]) in rules
        assert not any(Partial() in outs for outs, _ in rules)
        td.register_sharding_rules()
        assert probe in DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    finally:
        lib._destroy()


def test_import_torchops_leaves_dtensor_unimported():
    # torch.distributed.tensor is slow to import: only `import torchops.distributed` brings it in. (Today
    # torch._dynamo imports it too; while `import torchops` loads torch._dynamo that part can't hold.)
    code = ("import sys, torchops; m = sys.modules; "
            "print('torchops.distributed' in m, 'torch._dynamo' not in m and 'torch.distributed.tensor' in m)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(__file__)), *sys.path]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout


@pytest.mark.slow
def test_gloo_world_size_2():
    # The compiled block here only: it is the slowest check, and the world size changes nothing in it.
    spawn(2, "gloo", [*OP_CHECKS, "tp_block", "fsdp", "tp_block_compiled"])


@pytest.mark.slow
def test_gloo_world_size_4():
    spawn(4, "gloo", [*OP_CHECKS, "mesh_2d", "tp_block", "fsdp"])


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torchrun(*args: str) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --standalone --nproc_per_node 2 ARGS` from the repo root, this checkout's
    torchops first on the path; asserts that it succeeded."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          *args], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


@pytest.mark.slow
def test_example_runs_under_torchrun() -> None:
    # The README's launch line for examples/distributed_rms_norm.py, on the CPU (gloo), two processes.
    out = torchrun(os.path.join("examples", "distributed_rms_norm.py"), "--device", "cpu")
    assert "ok: the block trained on 2 ranks (cpu) matches the block trained on whole tensors" in out.stdout, out.stdout
    assert out.stdout.count("step ") == 3, out.stdout


def test_gloo_world_size_2_losses():
    # linear_cross_entropy / cross_entropy with tokens sharded: every reduction (the mean over all shards'
    # non-ignored tokens), gradients, no_grad and inference_mode, the internal ops, a vocab-sharded weight.
    spawn(2, "gloo", ["loss"])


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.device_count() >= 2) or not dist.is_nccl_available(),
                    reason="needs two CUDA GPUs and NCCL")
def test_nccl_world_size_2():
    spawn(2, "nccl", [*OP_CHECKS, "loss", "tp_block", "fsdp", "tp_block_compiled"])


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.device_count() >= 4) or not dist.is_nccl_available(),
                    reason="needs four CUDA GPUs and NCCL")
def test_nccl_world_size_4():
    spawn(4, "nccl", [*OP_CHECKS, "loss", "mesh_2d", "tp_block", "fsdp"])


@pytest.mark.slow
def test_multigpu_bench_runs_under_torchrun() -> None:
    # benchmarks/multigpu.py's launch line on the CPU (gloo, two processes, its small sizes): every case and
    # implementation runs, and the sharded results agree with one process's before anything is timed.
    pytest.importorskip("transformers")
    with tempfile.TemporaryDirectory() as out_dir:
        out = torchrun("-m", "benchmarks.multigpu", "--device", "cpu", "--quick", "--out-dir", out_dir)
        with open(os.path.join(out_dir, "multigpu_cpu_quick.json")) as f:
            rows = {(r["case"], r["impl"]) for r in json.load(f)["results"]}
    impls = ["native", "torchops", "native + torch.compile", "torchops + torch.compile"]
    want = {("tp mlp fwd+bwd", i) for i in [*impls, "native (1 GPU)", "torchops (1 GPU)"]}
    want |= {("fsdp2 train step", i) for i in ["unpatched", "torchops", "unpatched (1 GPU)", "torchops (1 GPU)"]}
    assert rows == want, sorted(rows ^ want)
    assert "FAILED" not in out.stdout + out.stderr


def test_norm_rules_read_arguments_by_name():
    # The fused residual norm and the weight_offset argument: their rules, applied to schemas of that
    # shape (a scratch namespace stands in where this build lacks the ops), place every tensor by name.
    import types

    import torchops.distributed as td
    from torch.distributed.tensor import Partial, Replicate, Shard

    lib = torch.library.Library("torchops_dist_test", "FRAGMENT")  # noqa: TOR901
    schemas = {
        "_rms_norm_backward": "(Tensor grad_out, Tensor input, Tensor? weight, Tensor rstd, bool input_grad, "
                              "bool weight_grad, float weight_offset=0.0) -> (Tensor grad_input, Tensor grad_weight)",
        "_add_rms_norm_forward": "(Tensor input, Tensor residual, Tensor? weight, float eps, float weight_offset) -> "
                                 "(Tensor out, Tensor residual_out, Tensor rstd)",
        "_add_rms_norm_backward": "(Tensor grad_out, Tensor? grad_residual_out, Tensor residual_out, Tensor? weight, "
                                  "Tensor rstd, bool weight_grad, float weight_offset=0.0) -> "
                                  "(Tensor grad_input, Tensor grad_weight)",
    }
    for name, schema in schemas.items():
        lib.define(name + schema)
    ns = torch.ops.torchops_dist_test

    def spec(*shape: int) -> types.SimpleNamespace:  # what DTensor hands a rule for each DTensor argument
        return types.SimpleNamespace(shape=torch.Size(shape), placements=(Replicate(),))

    x, w, rstd = spec(2, 6, 8), spec(8), spec(2, 6)
    S1, R, P = Shard(1), Replicate(), Partial()
    rules = td._RULES
    fwd = rules["_add_rms_norm_forward"](ns._add_rms_norm_forward.default)(x, x, w, 1e-6, 1.0)
    assert ([S1, S1, S1], [S1, S1, R, None, None]) in fwd
    assert all(outs[:1] != [Shard(2)] for outs, _ in fwd)  # never the normalised dimension
    bwd = rules["_add_rms_norm_backward"](ns._add_rms_norm_backward.default)(x, x, x, w, rstd, True)
    assert ([S1, P], [S1, S1, S1, R, S1, None, None]) in bwd
    assert ([P, P], [P, P, R, R, R, None, None]) in bwd
    bwd = rules["_add_rms_norm_backward"](ns._add_rms_norm_backward.default)(x, None, x, None, rstd, False)
    assert ([S1, R], [S1, None, S1, None, S1, None, None]) in bwd
    bwd = rules["_rms_norm_backward"](ns._rms_norm_backward.default)(x, x, w, rstd, True, True, 1.0)
    assert ([S1, P], [S1, S1, R, S1, None, None, None]) in bwd
    bwd = rules["_rms_norm_backward"](ns._rms_norm_backward.default)(x, x, w, rstd, False, True)
    assert ([R, P], [S1, S1, R, S1, None, None, None]) in bwd  # grad_input not asked for: a placeholder


def test_layer_norm_rules() -> None:
    # layer_norm and its internal ops, applied to their schemas: rows sharded on any dimension but the
    # last, weight and bias replicated, the statistics placed as the rows, and the parameters' gradients
    # Partial when the rows are sharded (and when the incoming gradient is), Replicate when not asked for.
    import types

    import torchops.distributed as td
    from torch.distributed.tensor import Partial, Replicate, Shard

    def spec(*shape: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(shape=torch.Size(shape), placements=(Replicate(),))

    x, w, stat = spec(2, 6, 8), spec(8), spec(2, 6)
    S0, S1, S2, R, P = Shard(0), Shard(1), Shard(2), Replicate(), Partial()
    ln = torch.ops.myns
    fwd = td.rule_factory(ln.layer_norm.default)(ln.layer_norm.default)(x, w, w, 1e-5)
    assert ([S1], [S1, R, R, None]) in fwd and ([S0], [S0, R, R, None]) in fwd and ([R], [R, R, R, None]) in fwd
    assert not any(outs == [S2] for outs, _ in fwd)  # never the normalised dimension
    fwd = td.rule_factory(ln.layer_norm.default)(ln.layer_norm.default)(x, None, w, 1e-5)
    assert ([S1], [S1, None, R, None]) in fwd
    fwd = td.rule_factory(ln._layer_norm_forward.default)(ln._layer_norm_forward.default)(x, w, None, 1e-5)
    assert ([S1, S1, S1], [S1, R, None, None]) in fwd
    backward = ln._layer_norm_backward.default
    bwd = td.rule_factory(backward)(backward)(x, x, w, stat, stat, True, True, True)
    assert ([S1, P, P], [S1, S1, R, S1, S1, None, None, None]) in bwd
    assert ([P, P, P], [P, R, R, R, R, None, None, None]) in bwd
    assert ([R, R, R], [R, R, R, R, R, None, None, None]) in bwd
    bwd = td.rule_factory(backward)(backward)(x, x, None, stat, stat, True, False, True)  # no weight
    assert ([S1, R, P], [S1, S1, None, S1, S1, None, None, None]) in bwd
    bwd = td.rule_factory(backward)(backward)(x, x, w, stat, stat, False, True, False)
    assert ([R, P, R], [S1, S1, R, S1, S1, None, None, None]) in bwd
