"""The bodies of tests/test_distributed.py's multi-process tests: each runs in every rank of a spawned group.

A check compares a DTensor run on the mesh against the same computation on whole tensors in this process
(every rank computes the reference itself, from the same seed). Every rank runs the same sequence of
collectives, so a check's asserts run on every rank too.
"""

from __future__ import annotations

import copy
import os
import sys
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh

F64 = torch.float64


def close(actual: Any, expected: Tensor, what: str, *, rtol: float = 1e-10, atol: float = 1e-10) -> None:
    full = actual.full_tensor() if isinstance(actual, DTensor) else actual
    torch.testing.assert_close(full, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def dt(full: Tensor, mesh: Any, placement: Any, requires_grad: bool = False) -> DTensor:
    """A DTensor whose global value is `full`, placed as asked (Partial: split in uneven random parts)."""
    if isinstance(placement, Partial):
        parts = torch.rand((mesh.size(),) + tuple(full.shape), generator=torch.Generator().manual_seed(7), dtype=full.dtype)
        parts = parts / parts.sum(0) if full.numel() else parts
        local = full.detach() * parts[mesh.get_local_rank()].to(full.device)
        d = DTensor.from_local(local, mesh, [Partial()], run_check=False)
        d = d.detach()
    else:
        d = distribute_tensor(full.detach(), mesh, [placement])
    return d.requires_grad_(requires_grad)


def rand(*shape: int, device: str, dtype: torch.dtype = F64) -> Tensor:
    return torch.randn(*shape, device=device, dtype=dtype)


def fwd_bwd(fn: Callable[..., Any], inputs: list[Tensor], grads: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    """fn(*inputs) and the gradients of sum(out_i * grads_i) with respect to every input."""
    outs = fn(*inputs)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    total = sum((o * g).sum() for o, g in zip(outs, grads))
    gin = torch.autograd.grad(total, inputs)
    return outs, list(gin)


def check_against_reference(name: str, fn: Callable[..., Any], full_inputs: list[Tensor], placements: list[Any], mesh: Any,
                            *, out_placements: list[Any] | None = None, differentiable: bool = True) -> None:
    device = full_inputs[0].device
    ref_in = [x.detach().clone().requires_grad_(differentiable) for x in full_inputs]
    ref_out = fn(*ref_in)
    ref_out = list(ref_out) if isinstance(ref_out, (tuple, list)) else [ref_out]
    grads = [torch.randn_like(o) for o in ref_out]
    d_in = [dt(x, mesh, p, differentiable) for x, p in zip(full_inputs, placements)]
    if differentiable:
        ref_out, ref_grads = fwd_bwd(fn, ref_in, grads)
        # The incoming gradient replicated: what a loss over the whole output hands back.
        d_grads = [distribute_tensor(g, mesh, [Replicate()]) for g in grads]
        outs, d_gin = fwd_bwd(fn, d_in, d_grads)
        for i, (g, r) in enumerate(zip(d_gin, ref_grads)):
            close(g, r, f"{name} {placements}: grad of input {i}")
    else:
        outs = fn(*d_in)
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    for i, (o, r) in enumerate(zip(outs, ref_out)):
        assert isinstance(o, DTensor), f"{name}: output {i} is not a DTensor"
        close(o, r.detach(), f"{name} {placements}: output {i}")
        if out_placements is not None:
            assert tuple(o.placements) == (out_placements[i],), f"{name} {placements}: output {i} is {o.placements}, want {out_placements[i]}"
    # The op's no-grad path (the outer op's own rule, no autograd recording).
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            plain = [dt(x, mesh, p) for x, p in zip(full_inputs, placements)]
            outs = fn(*plain)
            outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
            for i, (o, r) in enumerate(zip(outs, ref_out)):
                close(o, r.detach(), f"{name} {placements} under {ctx.__name__}: output {i}")


def check_elementwise_ops(mesh: Any, device: str) -> int:
    import torchops
    n = 0
    a, b = rand(6, 10, device=device), rand(6, 10, device=device)
    S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()
    for pa, pb, want in [(S0, S0, S0), (S1, S1, S1), (R, R, R), (S1, R, S1), (R, S0, S0), (P, P, P)]:
        check_against_reference("vector_add", torchops.vector_add, [a, b], [pa, pb], mesh, out_placements=[want])
        n += 1
    for pa, pb, want in [(S0, S0, S0), (S1, S1, S1), (R, R, R), (S1, R, S1), (R, S0, S0)]:
        check_against_reference("swiglu", torchops.swiglu, [a, b], [pa, pb], mesh, out_placements=[want])
        n += 1
    # swiglu_backward on its own (the C++ autograd calls it with the incoming gradient), Partial grad_out.
    g = rand(6, 10, device=device)
    for pg, px in [(S0, S0), (S1, R), (P, R), (R, R)]:
        check_against_reference("swiglu_backward", torch.ops.myns.swiglu_backward, [g, a, b], [pg, px, px], mesh)
        n += 1
    # vector_add_out writes `out` where it is: a and b move to out's placement, out never does.
    for po in (S0, S1, R):
        for pa, pb in [(S0, R), (S1, S1), (R, R)]:
            out = dt(torch.full_like(a, float("nan")), mesh, po)
            local_before = out._local_tensor
            torch.ops.myns.vector_add_out(dt(a, mesh, pa), dt(b, mesh, pb), out)
            assert tuple(out.placements) == (po,) and out._local_tensor is local_before
            close(out, a + b, f"vector_add_out a={pa} b={pb} out={po}")
            n += 1
    x = dt(a, mesh, S1)
    torchops.vector_add(x, dt(b, mesh, R), out=x)  # in place
    close(x, a + b, "vector_add out=a")
    # Empty and odd sizes: a dimension smaller than the mesh leaves some ranks empty.
    for shape in [(0, 5), (3, 1), (1,)]:
        e1, e2 = rand(*shape, device=device), rand(*shape, device=device)
        check_against_reference("vector_add", torchops.vector_add, [e1, e2], [S0, S0], mesh)
        check_against_reference("swiglu", torchops.swiglu, [e1, e2], [S0, R], mesh)
        n += 2
    return n + 1


def row_placement(x: Tensor, p: Any, mesh: Any) -> Any:
    """What a norm gives for input placed `p`: the same Shard of a leading dimension (DTensor leaves a
    dimension smaller than the mesh unsharded), else Replicate."""
    if isinstance(p, Shard) and p.dim != x.dim() - 1 and x.shape[p.dim] >= mesh.size():
        return p
    return Replicate()


def norm_cases(device: str) -> list[tuple[Tensor, Tensor | None]]:
    return [(rand(3, 5, 8, device=device), rand(8, device=device)), (rand(6, 7, device=device), None)]


def check_norm_ops(mesh: Any, device: str) -> int:
    import torchops
    n = 0
    S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()
    for x, w in norm_cases(device):
        last = x.dim() - 1
        for px in [S0, S1, Shard(last), R]:
            want = row_placement(x, px, mesh)
            if w is None:
                check_against_reference("rms_norm", lambda i: torchops.rms_norm(i, None, 1e-5), [x], [px], mesh, out_placements=[want])
            else:
                check_against_reference("rms_norm", lambda i, ww: torchops.rms_norm(i, ww, 1e-5), [x, w], [px, R], mesh,
                                        out_placements=[want])
                # The weight's gradient is a sum over rows: Partial while rows are sharded.
                xd, wd = dt(x, mesh, px, True), dt(w, mesh, R, True)
                torchops.rms_norm(xd, wd, 1e-5).sum().backward()
                assert tuple(wd.grad.placements) == ((P,) if want != R else (R,)), wd.grad.placements
            n += 1
        # The internal ops, called directly (what DTensor sees under the C++ autograd kernel).
        fwd = torch.ops.myns._rms_norm_forward
        args = [x] if w is None else [x, w]
        pl = [S0] if w is None else [S0, R]
        check_against_reference("_rms_norm_forward", (lambda i: fwd(i, None, 1e-5)) if w is None else (lambda i, ww: fwd(i, ww, 1e-5)),
                                args, pl, mesh, out_placements=[row_placement(x, S0, mesh)] * 2, differentiable=False)
        out, rstd = fwd(x, w, 1e-5)
        g = torch.randn_like(x)
        bwd = torch.ops.myns._rms_norm_backward
        for pg, px, want_w in [(S0, S0, P if row_placement(x, S0, mesh) == S0 else R), (P, R, P), (R, R, R),
                               (S1, Shard(last), P)]:
            if w is None:
                fn = lambda gg, xx, rr: bwd(gg, xx, None, rr, True, False)[:1]  # noqa: E731
                check_against_reference("_rms_norm_backward", fn, [g, x, rstd], [pg, px, px if px != Shard(last) else R],
                                        mesh, differentiable=False)
            else:
                fn = lambda gg, xx, ww, rr: bwd(gg, xx, ww, rr, True, True)  # noqa: E731
                placements = [pg, px, R, px if px != Shard(last) else R]
                check_against_reference("_rms_norm_backward", fn, [g, x, w, rstd], placements, mesh, differentiable=False)
                _, gw = fn(*[dt(t, mesh, p) for t, p in zip([g, x, w, rstd], placements)])
                assert tuple(gw.placements) == (want_w,), (placements, gw.placements)
                # Only one of the two gradients asked for: the other is a placeholder, the asked one right.
                # (The rule reads these flags: the sharding cache must tell the calls apart.)
                gi, unasked = bwd(*[dt(t, mesh, p) for t, p in zip([g, x, w, rstd], placements)], True, False)
                close(gi, bwd(g, x, w, rstd, True, False)[0], "_rms_norm_backward input grad only")
                assert tuple(unasked.placements) == (R,), unasked.placements
                unasked, gw = bwd(*[dt(t, mesh, p) for t, p in zip([g, x, w, rstd], placements)], False, True)
                close(gw, bwd(g, x, w, rstd, False, True)[1], "_rms_norm_backward weight grad only")
                assert tuple(unasked.placements) == (R,), unasked.placements
            n += 1
    # The fused residual norm, once it exists in this build.
    if hasattr(torch.ops.myns, "add_rms_norm"):
        x, r, w = rand(3, 5, 8, device=device), rand(3, 5, 8, device=device), rand(8, device=device)
        add_norm = torchops.add_rms_norm
        for px in [S0, S1, Shard(2), R]:
            want = row_placement(x, px, mesh)
            check_against_reference("add_rms_norm", lambda i, rr, ww: add_norm(i, rr, ww, 1e-5), [x, r, w], [px, px, R], mesh,
                                    out_placements=[want, want])
            n += 1
        check_against_reference("add_rms_norm", lambda i, rr, ww: add_norm(i, rr, ww, 1e-5, weight_offset=1.0), [x, r, w], [S1, R, R], mesh,
                                out_placements=[S1, S1])
        n += 1
    if "weight_offset" in [a.name for a in torch.ops.myns.rms_norm.default._schema.arguments]:
        x, w = rand(3, 5, 8, device=device), rand(8, device=device)
        check_against_reference("rms_norm weight_offset", lambda i, ww: torch.ops.myns.rms_norm(i, ww, 1e-5, 1.0), [x, w],
                                [S1, R], mesh, out_placements=[S1])
        n += 1
    return n


def check_layer_norm_ops(mesh: Any, device: str) -> int:
    import torchops
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module
    n = 0
    S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()
    x, w, b = rand(3, 5, 8, device=device), rand(8, device=device), rand(8, device=device)
    for px in [S0, S1, Shard(2), R]:
        want = row_placement(x, px, mesh)
        check_against_reference("layer_norm", lambda i, ww, bb: torchops.layer_norm(i, ww, bb, 1e-5), [x, w, b],
                                [px, R, R], mesh, out_placements=[want])
        # The parameters' gradients are sums over rows: Partial while rows are sharded.
        xd, wd, bd = dt(x, mesh, px, True), dt(w, mesh, R, True), dt(b, mesh, R, True)
        torchops.layer_norm(xd, wd, bd, 1e-5).sum().backward()
        assert tuple(wd.grad.placements) == tuple(bd.grad.placements) == ((P,) if want != R else (R,))
        n += 1
    e = rand(6, 7, device=device)
    check_against_reference("layer_norm", lambda i: torchops.layer_norm(i), [e], [S0], mesh, out_placements=[S0])
    check_against_reference("layer_norm", lambda i, bb: torchops.layer_norm(i, None, bb), [e, rand(7, device=device)],
                            [S1, R], mesh, out_placements=[R])
    n += 2
    # The internal ops, called directly (what DTensor sees under the C++ autograd kernel).
    fwd, bwd = torch.ops.myns._layer_norm_forward, torch.ops.myns._layer_norm_backward
    check_against_reference("_layer_norm_forward", lambda i, ww, bb: fwd(i, ww, bb, 1e-5), [x, w, b], [S1, R, R], mesh,
                            out_placements=[S1, S1, S1], differentiable=False)
    _, mean, rstd = fwd(x, w, b, 1e-5)
    g = torch.randn_like(x)
    for pg, px, want_param in [(S1, S1, P), (P, R, P), (R, R, R)]:
        placements = [pg, px, R, px, px]
        fn = lambda gg, xx, ww, mm, rr: bwd(gg, xx, ww, mm, rr, True, True, True)  # noqa: E731
        check_against_reference("_layer_norm_backward", fn, [g, x, w, mean, rstd], placements, mesh,
                                differentiable=False)
        _, gw, gb = fn(*[dt(t, mesh, p) for t, p in zip([g, x, w, mean, rstd], placements)])
        assert tuple(gw.placements) == tuple(gb.placements) == (want_param,), (placements, gw.placements)
        n += 1
    # torchops.nn.LayerNorm over two trailing dims under torch's SequenceParallel (tokens sharded).
    torch.manual_seed(5)
    ref = torchops.nn.LayerNorm((4, 8), device=device, dtype=F64)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    model = parallelize_module(copy.deepcopy(ref), mesh, SequenceParallel(use_local_output=False))
    tokens = rand(2, 6, 4, 8, device=device)
    out = model(distribute_tensor(tokens, mesh, [S1]))
    assert tuple(out.placements) == (S1,), out.placements
    close(out, ref(tokens), "nn.LayerNorm((4, 8)) sequence parallel")
    out.sum().backward()
    ref(tokens).sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        close(p.grad, q.grad, f"nn.LayerNorm((4, 8)) sequence parallel: grad of {name}")
    return n + 1


def random_csr(m: int, k: int, device: str, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(m, k, generator=gen) < 0.35
    mask[1] = False  # an empty row
    dense = torch.randn(m, k, generator=gen, dtype=F64) * mask
    A = dense.to_sparse_csr()
    return A.crow_indices().to(device), A.col_indices().to(device), A.values().to(device)


def check_csr_ops(mesh: Any, device: str) -> int:
    import torchops
    import torchops.distributed as td
    n = 0
    S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()
    crow, col, values = random_csr(7, 9, device)
    dense = rand(9, 6, device=device)
    idx = lambda t: distribute_tensor(t, mesh, [R])  # noqa: E731
    for pv, pd, want in [(R, R, R), (R, S1, S1), (R, S0, R), (P, R, P), (R, P, P)]:
        fn = lambda v, d: torchops.csr_spmm(idx(crow), idx(col), v, d) if isinstance(v, DTensor) else torchops.csr_spmm(crow, col, v, d)  # noqa: E731
        check_against_reference("csr_spmm", fn, [values, dense], [pv, pd], mesh, out_placements=[want])
        n += 1
    # With a precomputed transpose (what torchops.spmm caches), through the op itself.
    t_crow, t_col, t_perm = torch.ops.myns._csr_transpose(idx(crow), idx(col), 9)
    assert all(tuple(t.placements) == (R,) for t in (t_crow, t_col, t_perm))
    ref_t = torch.ops.myns._csr_transpose(crow, col, 9)
    for got, ref in zip((t_crow, t_col, t_perm), ref_t):
        assert torch.equal(got.full_tensor(), ref)
    with_t = torch.ops.myns._csr_spmm_with_transpose

    def fn_t(v: Tensor, d: Tensor) -> Tensor:
        if isinstance(v, DTensor):
            return with_t(idx(crow), idx(col), v, d, t_crow, t_col, t_perm)
        return with_t(crow, col, v, d, *ref_t)

    for pv, pd, want in [(R, S1, S1), (R, R, R)]:
        check_against_reference("_csr_spmm_with_transpose", fn_t, [values, dense], [pv, pd], mesh, out_placements=[want])
        n += 1
    g = rand(7, 6, device=device)
    sddmm = torch.ops.myns.sddmm
    for pg, pd, want in [(S1, S1, P), (R, R, R), (P, R, P)]:
        fn = lambda gg, d: sddmm(idx(crow), idx(col), gg, d) if isinstance(gg, DTensor) else sddmm(crow, col, gg, d)  # noqa: E731
        check_against_reference("sddmm", fn, [g, dense], [pg, pd], mesh, out_placements=[want])
        n += 1
    # Row-sharded A: each rank multiplies its own block of rows (odd row count: uneven blocks).
    for m in (7, 3):
        crow, col, values = random_csr(m, 9, device, seed=m)
        A = torch.sparse_csr_tensor(crow, col, values, (m, 9))
        ref_d = dense.detach().clone().requires_grad_()
        ref_v = values.detach().clone().requires_grad_()
        ref = torchops.csr_spmm(crow, col, ref_v, ref_d)
        gout = torch.randn_like(ref)
        ref.backward(gout)
        for pd in (R, S1, S0):
            block = td.shard_csr_rows(A, mesh)
            v = block.values.detach().clone().requires_grad_()
            block = block._replace(values=v)
            d = dt(dense, mesh, pd, True)
            out = td.row_sharded_spmm(block, d)
            assert tuple(out.placements) == (S0,), out.placements
            close(out, ref.detach(), f"row_sharded_spmm m={m} dense {pd}")
            out.backward(distribute_tensor(gout, mesh, [S0]))
            close(d.grad, ref_d.grad, f"row_sharded_spmm m={m} dense {pd}: grad of dense")
            start = block.row_start
            lo, hi = int(crow[start]), int(crow[start + block.crow_indices.numel() - 1])
            close(v.grad, ref_v.grad[lo:hi], f"row_sharded_spmm m={m}: grad of this rank's values")
            n += 1
    return n


def check_message_passing_ops(mesh: Any, device: str) -> int:
    """spmm_reduce (every reduce; features or heads sharded, Partial through the linear reduces), sddmm (heads
    sharded; "dot" over sharded features gives Partial) and csr_softmax (heads sharded), forward and backward."""
    import torchops
    n = 0
    R, P = Replicate(), Partial()
    crow, col, _ = random_csr(7, 9, device, seed=1)
    idx = lambda t: distribute_tensor(t, mesh, [R])  # noqa: E731
    heads = 4  # at least one a rank on the meshes of 2 and 4 ranks
    values, heads_values = rand(col.numel(), device=device), rand(col.numel(), heads, device=device)
    dense, dense3, a3 = rand(9, 6, device=device), rand(9, heads, 8, device=device), rand(7, heads, 8, device=device)

    def structure(t: Tensor) -> tuple[Tensor, Tensor]:
        return (idx(crow), idx(col)) if isinstance(t, DTensor) else (crow, col)

    def spmm(reduce: str) -> Callable[..., Tensor]:
        return lambda v, d: torchops.spmm_reduce(*structure(v), v, d, reduce)

    for reduce in ("sum", "mean", "max", "min"):
        check_against_reference(f"spmm_reduce {reduce}", spmm(reduce), [values, dense], [R, Shard(1)], mesh,
                                out_placements=[Shard(1)])
        check_against_reference(f"spmm_reduce {reduce} heads", spmm(reduce), [heads_values, dense3],
                                [Shard(1), Shard(1)], mesh, out_placements=[Shard(1)])
        n += 2
    for reduce in ("sum", "mean"):
        check_against_reference(f"spmm_reduce {reduce} partial", spmm(reduce), [values, dense], [P, R], mesh,
                                out_placements=[P])
        n += 1

    def sddmm(op: str) -> Callable[..., Tensor]:
        return lambda a, b: torchops.sddmm(*structure(a), a, b, op)

    for name, fn, inputs, placement, want in [
            ("sddmm dot heads", sddmm("dot"), [a3, dense3], Shard(1), Shard(1)),
            ("sddmm dot features", sddmm("dot"), [a3, dense3], Shard(2), P),
            ("sddmm add", sddmm("add"), [a3[..., 0], dense3[..., 0]], Shard(1), Shard(1))]:
        check_against_reference(name, fn, inputs, [placement, placement], mesh, out_placements=[want])
        n += 1
    check_against_reference("csr_softmax heads", lambda v: torchops.csr_softmax(structure(v)[0], v), [heads_values],
                            [Shard(1)], mesh, out_placements=[Shard(1)])
    return n + 1


def check_rotary_ops(mesh: Any, device: str) -> int:
    """rotary_embedding, qk_norm_rope (forward and backward, through their backward ops) and rotary_embedding_ on
    q / k split by batch, heads or sequence (cos and sin given replicated: DTensor splits them alike), partial
    rotary (6 of 8), GQA (8 and 4 heads), both layouts."""
    import torchops
    n = 0
    S0, R, P = Shard(0), Replicate(), Partial()
    for u in (1, 2):
        heads, seq = (1, 2) if u == 1 else (2, 1)
        shape = (lambda h: (4, h, 8, 8)) if u == 1 else (lambda h: (4, 8, h, 8))
        q, k = rand(*shape(8), device=device), rand(*shape(4), device=device)
        w = rand(8, device=device)
        for cos_batch in (1, 4):
            cos, sin = rand(cos_batch, 8, 6, device=device), rand(cos_batch, 8, 6, device=device)

            def constants() -> tuple[Tensor, Tensor]:
                return distribute_tensor(cos, mesh, [R]), distribute_tensor(sin, mesh, [R])

            def rope(qq: Tensor, kk: Tensor) -> Any:
                c, s = constants() if isinstance(qq, DTensor) else (cos, sin)
                return torchops.apply_rotary_pos_emb(qq, kk, c, s, unsqueeze_dim=u)

            def qk_norm(qq: Tensor, kk: Tensor, wq: Tensor, wk: Tensor) -> Any:
                c, s = constants() if isinstance(qq, DTensor) else (cos, sin)
                return torchops.qk_norm_rope(qq, kk, wq, wk, c, s, 1e-5, weight_offset=1.0, unsqueeze_dim=u)

            for p in (S0, Shard(heads), Shard(seq), R):
                check_against_reference("rotary_embedding", rope, [q, k], [p, p], mesh, out_placements=[p, p])
                check_against_reference("qk_norm_rope", qk_norm, [q, k, w, w], [p, p, R, R], mesh,
                                        out_placements=[p, p])
                # The weights' gradients are sums over the rows: Partial while the rows are split.
                qd, kd = dt(q, mesh, p, True), dt(k, mesh, p, True)
                wq, wk = dt(w, mesh, R, True), dt(w, mesh, R, True)
                sum(o.sum() for o in qk_norm(qd, kd, wq, wk)).backward()
                assert tuple(wq.grad.placements) == ((R,) if p == R else (P,)), wq.grad.placements
                n += 2
            # head_dim split: redistributed (values only); Partial q and k through the linear rotation.
            check_against_reference("rotary_embedding head_dim split", rope, [q, k], [Shard(3), Shard(3)], mesh)
            check_against_reference("rotary_embedding", rope, [q, k], [P, P], mesh, out_placements=[P, P])
            n += 2
    # In place: query and key stay where they are; the tokens split (positions alike), or the heads.
    positions = torch.randint(0, 16, (8,), device=device)
    cache = rand(16, 6, device=device)
    query, key = rand(8, 64, device=device), rand(8, 4, 8, device=device)
    want_q, want_k = query.clone(), key.clone()
    torchops.rotary_embedding_(positions, want_q, want_k, 8, cache)
    for pq, pk in [(S0, S0), (Shard(1), Shard(1)), (R, R), (Shard(1), R)]:
        qd, kd = dt(query.clone(), mesh, pq), dt(key.clone(), mesh, pk)  # a replicated one may share memory with it
        local_q, local_k = qd._local_tensor, kd._local_tensor
        # positions placed as the tokens are: DTensor never moves the first argument of an op named "..._".
        pd = distribute_tensor(positions, mesh, [S0 if pq == S0 else R])
        torchops.rotary_embedding_(pd, qd, kd, 8, distribute_tensor(cache, mesh, [R]))
        assert tuple(qd.placements) == (pq,) and tuple(kd.placements) == (pk,), (qd.placements, kd.placements)
        assert qd._local_tensor is local_q and kd._local_tensor is local_k
        close(qd, want_q, f"rotary_embedding_ query {pq} key {pk}")
        close(kd, want_k, f"rotary_embedding_ key {pk} query {pq}")
        n += 1
    return n


# ---------------------------------------------------------------------------------------------------------
# A LLaMA-style block: sequence-parallel norms, colwise/rowwise linears, swiglu, vector_add residuals.


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        import torchops
        super().__init__()
        self.attention_norm = torchops.nn.RMSNorm(dim)
        self.wv = nn.Linear(dim, dim, bias=False)  # a stand-in for attention: a colwise/rowwise pair
        self.wo = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = torchops.nn.RMSNorm(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.norm = torchops.nn.RMSNorm(dim)
        with torch.no_grad():
            for norm in (self.attention_norm, self.ffn_norm, self.norm):
                norm.weight.uniform_(0.5, 1.5)

    def forward(self, x: Tensor) -> Tensor:
        import torchops
        x = torchops.vector_add(x, self.wo(self.wv(self.attention_norm(x))))
        h = self.ffn_norm(x)
        x = torchops.vector_add(x, self.w2(torchops.swiglu(self.w1(h), self.w3(h))))
        return self.norm(x)


class NativeBlock(Block):
    """The same block in native ops (nn.RMSNorm, silu, +): the timing baseline."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__(dim, hidden)
        for name in ("attention_norm", "ffn_norm", "norm"):
            old = getattr(self, name)
            new = nn.RMSNorm(dim, eps=old.eps, device=old.weight.device, dtype=old.weight.dtype)
            new.weight = old.weight
            setattr(self, name, new)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.wo(self.wv(self.attention_norm(x)))
        h = self.ffn_norm(x)
        x = x + self.w2(nn.functional.silu(self.w1(h)) * self.w3(h))
        return self.norm(x)


def tensor_parallel_plan() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    # Activations stay DTensors between modules, sequence-sharded (Shard(1)) around the norms and residuals.
    colwise = dict(input_layouts=Shard(1), use_local_output=False)
    rowwise = dict(output_layouts=Shard(1), use_local_output=False)
    return {
        "attention_norm": SequenceParallel(use_local_output=False),
        "wv": ColwiseParallel(**colwise),
        "wo": RowwiseParallel(**rowwise),
        "ffn_norm": SequenceParallel(use_local_output=False),
        "w1": ColwiseParallel(**colwise),
        "w3": ColwiseParallel(**colwise),
        "w2": RowwiseParallel(**rowwise),
        "norm": SequenceParallel(use_local_output=False),
    }


def make_tp_block(mesh: Any, device: str, dtype: torch.dtype = F64, dim: int = 16, hidden: int = 24,
                  cls: type[Block] = Block) -> tuple[nn.Module, nn.Module]:
    from torch.distributed.tensor.parallel import parallelize_module
    torch.manual_seed(1)
    ref = cls(dim, hidden).to(device=device, dtype=dtype)
    model = parallelize_module(copy.deepcopy(ref), mesh, tensor_parallel_plan())
    return ref, model


def train(model: nn.Module, batches: list[Tensor], to_input: Callable[[Tensor], Tensor]) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x in batches:
        out = model(to_input(x))
        loss = out.pow(2).mean() - out.mean()
        if isinstance(loss, DTensor):
            loss = loss.full_tensor()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def check_tp_block(mesh: Any, device: str, compiled: str | None) -> int:
    """compiled: None (eager) or the torch.compile backend."""
    ref, model = make_tp_block(mesh, device)
    torch.manual_seed(2)
    # 9 tokens: uneven over 2 and 4 ranks. torch 2.11's DTensor linear fails on unevenly sequence-sharded
    # input with torch.nn.RMSNorm as well ("view size is not compatible ..."), so there the split is even.
    tokens = 9 if torch.__version__ >= "2.14" else 8
    batches = [rand(2, tokens, 16, device=device) for _ in range(3)]
    # The norms run sequence-sharded, as DTensors, on this rank's tokens only.
    seen: list[Any] = []

    def record(module: nn.Module, inputs: Any, output: Any) -> None:
        seen.append((type(output), tuple(getattr(output, "placements", ()))))

    norms = ("attention_norm", "ffn_norm", "norm")
    hooks = [] if compiled else [getattr(model, n).register_forward_hook(record) for n in norms]
    if compiled:
        from torch._dynamo.testing import CompileCounterWithBackend
        from torch._dynamo.utils import counters
        torch._dynamo.reset()
        counters.clear()
        # Each rank compiles its own graph: its local shapes differ when the tokens don't split evenly,
        # which the on-disk caches, shared by the ranks of this machine, don't tell apart.
        torch._inductor.config.fx_graph_cache = False
        torch._functorch.config.enable_autograd_cache = False
        backend = CompileCounterWithBackend(compiled)
        model = torch.compile(model, backend=backend)
    ref_losses = train(ref, batches, lambda x: x)
    losses = train(model, batches, lambda x: distribute_tensor(x, mesh, [Shard(1)]))
    for h in hooks:
        h.remove()
    if not compiled:
        assert len(seen) == 3 * len(batches) and all(s == (DTensor, (Shard(1),)) for s in seen), seen
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-9, atol=1e-12,
                               msg=lambda m: f"TP block (compiled={compiled}) losses: {m}")
    assert ref_losses[-1] < ref_losses[0], ref_losses
    if compiled:
        # One graph, no breaks: the myns ops on DTensors were traced, not run eagerly beside the graph.
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert backend.frame_count == 1, backend.frame_count
        graph_ops = {str(n.target) for g in backend.graphs for n in g.graph.nodes if n.op == "call_function"}
        want = {"myns.rms_norm.default", "myns.swiglu.default", "myns.vector_add.default"}
        assert want <= graph_ops, sorted(graph_ops)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        close(p, q.detach(), f"TP block (compiled={compiled}) parameter {name} after training", rtol=1e-9, atol=1e-12)
    with torch.inference_mode():
        close(model(distribute_tensor(batches[0], mesh, [Shard(1)])), ref(batches[0]), "TP block under inference_mode",
              rtol=1e-9, atol=1e-12)
    return 1


def check_fsdp(mesh: Any, device: str) -> int:
    import torchops
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(3)
    ref = nn.Sequential(nn.Linear(16, 32), torchops.nn.RMSNorm(32), nn.Linear(32, 16), torchops.nn.RMSNorm(16))
    ref = ref.to(device=device, dtype=F64)
    with torch.no_grad():
        ref[1].weight.uniform_(0.5, 1.5)
    model = copy.deepcopy(ref)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    torch.manual_seed(4)
    # Data parallel: each rank trains on its own slice of every global batch; the loss is the mean of all.
    ws, rank = mesh.size(), mesh.get_local_rank()
    batches = [rand(4 * ws, 16, device=device) for _ in range(3)]
    ref_losses = train(ref, batches, lambda x: x)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x in batches:
        local = x.chunk(ws)[rank]
        out = model(local)
        loss = out.pow(2).mean() - out.mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / ws)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-9, atol=1e-12,
                               msg=lambda m: f"FSDP losses: {m}")
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert isinstance(p, DTensor) and tuple(p.placements) == (Shard(0),)
        close(p, q.detach(), f"FSDP parameter {name} after training", rtol=1e-9, atol=1e-12)
    return 1


def check_mesh_2d(mesh: Any, device: str) -> int:
    """A 2 x (world / 2) mesh: rules expand to every mesh dimension; vector_add_out still never moves out."""
    import torchops
    mesh2 = init_device_mesh(mesh.device_type, (2, mesh.size() // 2), mesh_dim_names=("dp", "tp"))
    S0, S1, R = Shard(0), Shard(1), Replicate()
    a, b = rand(6, 10, device=device), rand(6, 10, device=device)
    n = 0
    for po, pa in [((S0, R), (R, S1)), ((R, S1), (S0, S0)), ((S0, S1), (R, R))]:
        out = distribute_tensor(torch.full_like(a, float("nan")), mesh2, po)
        local_before = out._local_tensor
        torch.ops.myns.vector_add_out(distribute_tensor(a, mesh2, pa), distribute_tensor(b, mesh2, [R, R]), out)
        assert tuple(out.placements) == po and out._local_tensor is local_before, out.placements
        close(out, a + b, f"vector_add_out on a 2-D mesh, out {po}")
        n += 1
    x, w = rand(4, 6, 8, device=device), rand(8, device=device)
    ref = torchops.rms_norm(x, w, 1e-5)
    xd = distribute_tensor(x, mesh2, [S0, S1]).requires_grad_()
    wd = distribute_tensor(w, mesh2, [R, R]).requires_grad_()
    out = torchops.rms_norm(xd, wd, 1e-5)
    assert tuple(out.placements) == (S0, S1), out.placements
    close(out, ref, "rms_norm on a 2-D mesh")
    out.sum().backward()
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    torchops.rms_norm(xr, wr, 1e-5).sum().backward()
    assert tuple(wd.grad.placements) == (Partial(), Partial()), wd.grad.placements
    close(wd.grad, wr.grad, "rms_norm on a 2-D mesh: grad of weight")
    close(xd.grad, xr.grad, "rms_norm on a 2-D mesh: grad of input")
    return n + 1


# ---------------------------------------------------------------------------------------------------------
# Losses: tokens sharded (data / sequence parallel), the LM head replicated.


def _loss_targets(shape: tuple[int, ...], classes: int, device: str, ignored: list[int]) -> Tensor:
    t = torch.randint(0, classes, shape, generator=torch.Generator().manual_seed(11)).view(-1)
    t[ignored] = -100  # the first tokens: the shards' counts of non-ignored tokens differ
    return t.view(shape).to(device)


def _loss_grads(out: Tensor, grad: Tensor, tensors: list[Tensor]) -> list[Tensor]:
    return list(torch.autograd.grad((out * grad).sum(), tensors))


def check_loss_ops(mesh: Any, device: str) -> int:
    """linear_cross_entropy / cross_entropy with input (or logits) and target Shard(d), the weight and bias
    replicated, against the same call on whole tensors: loss and gradients for every reduction (the mean over
    the count of non-ignored tokens of all shards), under no_grad and inference_mode too; their internal ops'
    placements; a vocab-sharded weight raises."""
    import torchops
    n = 0
    S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()
    V, H = 11, 8
    w, b = rand(V, H, device=device), rand(V, device=device)
    for shape, p, ignored in [((6,), S0, [0, 1, 2]), ((5,), S0, [0, 3]), ((2, 4), S1, [0, 1, 4]), ((2, 4), S0, [])]:
        x = rand(*shape, H, device=device)
        t = _loss_targets(shape, V, device, ignored)
        for reduction in ("none", "sum", "mean"):
            for bias, kw in [(b, dict(label_smoothing=0.1)), (None, dict(softcap=2.0))]:
                what = f"linear_cross_entropy {shape} {p} {reduction} bias={bias is not None} {kw}"
                leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
                if bias is not None:
                    leaves.append(bias.clone().requires_grad_())
                call = lambda xx, ww, tt, bb: torchops.linear_cross_entropy(xx, ww, tt, linear_bias=bb,  # noqa: E731
                                                                          reduction=reduction, **kw)
                ref = call(leaves[0], leaves[1], t, leaves[2] if bias is not None else None)
                grad = torch.randn_like(ref)
                ref_grads = _loss_grads(ref, grad, leaves)
                d = [distribute_tensor(leaves[0].detach(), mesh, [p]).requires_grad_(),
                     distribute_tensor(w, mesh, [R]).requires_grad_()]
                if bias is not None:
                    d.append(distribute_tensor(bias, mesh, [R]).requires_grad_())
                td = distribute_tensor(t, mesh, [p])
                out = call(d[0], d[1], td, d[2] if bias is not None else None)
                assert isinstance(out, DTensor), what
                close(out, ref.detach(), what)
                got = _loss_grads(out, distribute_tensor(grad, mesh, [R]), d)
                for i, (g, r) in enumerate(zip(got, ref_grads)):
                    close(g, r, f"{what}: grad of input {i}")
                assert tuple(got[0].placements) == (p,), (what, got[0].placements)
                for ctx in (torch.no_grad, torch.inference_mode):
                    with ctx():
                        plain = call(distribute_tensor(x, mesh, [p]), distribute_tensor(w, mesh, [R]),
                                     distribute_tensor(t, mesh, [p]),
                                     None if bias is None else distribute_tensor(bias, mesh, [R]))
                        close(plain, ref.detach(), f"{what} under {ctx.__name__}")
                # cross_entropy on the same logits, sharded alike.
                logits = torch.nn.functional.linear(x, w, bias)
                ce_ref_in = logits.clone().requires_grad_()
                ce_ref = torchops.cross_entropy(ce_ref_in, t, reduction=reduction, **kw)
                ce_grad = _loss_grads(ce_ref, grad, [ce_ref_in])[0]
                zd = distribute_tensor(logits, mesh, [p]).requires_grad_()
                ce = torchops.cross_entropy(zd, td, reduction=reduction, **kw)
                close(ce, ce_ref.detach(), f"cross_entropy {what}")
                close(_loss_grads(ce, distribute_tensor(grad, mesh, [R]), [zd])[0], ce_grad,
                      f"cross_entropy {what}: grad of logits")
                with torch.inference_mode():
                    close(torchops.cross_entropy(distribute_tensor(logits, mesh, [p]), distribute_tensor(t, mesh, [p]),
                                                 reduction=reduction, **kw), ce_ref.detach(),
                          f"cross_entropy {what} under inference_mode")
                n += 1
    # The internal ops' placements: per-token outputs sharded, sums over tokens Partial.
    x, t = rand(6, H, device=device), _loss_targets((6,), V, device, [1])
    loss, gi, gw, gb = torch.ops.myns._linear_cross_entropy_forward(
        distribute_tensor(x, mesh, [S0]), distribute_tensor(w, mesh, [R]), distribute_tensor(t, mesh, [S0]),
        distribute_tensor(b, mesh, [R]), -100, 0.0, None, None, True, True, True, 2)
    assert [tuple(o.placements) for o in (loss, gi, gw, gb)] == [(S0,), (S0,), (P,), (P,)]
    ref = torch.ops.myns._linear_cross_entropy_forward(x, w, t, b, -100, 0.0, None, None, True, True, True, 2)
    for got, want in zip((loss, gi, gw, gb), ref):
        close(got, want, "_linear_cross_entropy_forward Shard(0)")
    g = rand(6, device=device)
    bwd = torch.ops.myns._linear_cross_entropy_backward
    ref = bwd(g, x, w, t, b, -100, 0.1, None, True, True, True, 0)
    for pg, px, want in [(S0, S0, [S0, P, P]), (P, R, [P, P, P]), (R, R, [R, R, R])]:
        got = bwd(dt(g, mesh, pg), dt(x, mesh, px), dt(w, mesh, R), dt(t, mesh, px), dt(b, mesh, R), -100, 0.1, None,
                  True, True, True, 0)
        assert [tuple(o.placements) for o in got] == [(q,) for q in want], (pg, px, [o.placements for o in got])
        for o, r in zip(got, ref):
            close(o, r, f"_linear_cross_entropy_backward grad_loss {pg}, tokens {px}")
        n += 1
    # A vocab-parallel head (the weight's rows sharded): refused by name, never gathered silently.
    for pw in (S0, S1):
        try:
            torchops.linear_cross_entropy(distribute_tensor(x, mesh, [S0]), distribute_tensor(w, mesh, [pw]),
                                          distribute_tensor(t, mesh, [S0]))
        except RuntimeError as e:
            assert f"myns::_linear_cross_entropy_forward: linear_weight is sharded ({pw})" in str(e) or \
                f"myns::linear_cross_entropy: linear_weight is sharded ({pw})" in str(e), str(e)
        else:
            raise AssertionError(f"a {pw} linear_weight must raise")
        n += 1
    return n


CHECKS: dict[str, Callable[[Any, str], int]] = {
    "loss": check_loss_ops,
    "mesh_2d": check_mesh_2d,
    "elementwise": check_elementwise_ops,
    "norm": check_norm_ops,
    "layer_norm": check_layer_norm_ops,
    "csr": check_csr_ops,
    "message_passing": check_message_passing_ops,
    "rotary": check_rotary_ops,
    "tp_block": lambda mesh, device: check_tp_block(mesh, device, compiled=None),
    "tp_block_compiled": lambda mesh, device: check_tp_block(mesh, device, compiled="inductor"),
    "tp_block_aot_eager": lambda mesh, device: check_tp_block(mesh, device, compiled="aot_eager"),
    "fsdp": check_fsdp,
}


def run(rank: int, world_size: int, init_file: str, backend: str, checks: list[str], result_dir: str) -> None:
    """mp.spawn's entry: joins the group, runs `checks`, writes `<rank>.ok` (with counts) or `<rank>.err`."""
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        import torchops.distributed  # noqa: F401  registers the sharding rules
        mesh = init_device_mesh("cuda" if backend == "nccl" else "cpu", (world_size,))
        counts = {}
        for name in checks:
            torch.manual_seed(0)
            counts[name] = CHECKS[name](mesh, device)
        with open(os.path.join(result_dir, f"{rank}.ok"), "w") as f:
            f.write(repr(counts))
    except BaseException:
        with open(os.path.join(result_dir, f"{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()
    # Every check passed and the group is gone: end the process here. Its interpreter's teardown aborted now and
    # then ("terminate called without an active exception", no Python frame left: a joinable C++ thread destroyed
    # at exit, pytorch #190489), in about a third of the runs of the loss check after another spawn in one pytest
    # process; the checks had all passed by then.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
