"""The rotary ops' specifics the generic tables don't express (their rows: tests/op_db/rotary.py).

- Gradients: the op_db rows of rotary_embedding, its backward and qk_norm_rope say differentiable=False (cos and
  sin are constants, and the generic compiled-backward test would make them require grad), so their gradcheck and
  gradgradcheck (forward mode too), opcheck with gradients and compiled backward run here over the same samples,
  with only q, k and the weights requiring grad; gradients against float64 transformers' math; torch.func.
- cos / sin refused when they require grad or carry a tangent.
- transformers' layout read in place (no copy), position_ids accepted and ignored, compile with a dynamic sequence
  length, export with a dynamic sequence in a fresh process.
- rotary_embedding_ against vLLM's definition for query and key (is_neox true and false, partial rot, GQA, qkv
  slices), versions, inference only, out-of-range positions (CPU: raises before writing; CUDA: leaves the token).
- qk_norm_rope equal to rms_norm then apply_rotary_pos_emb (values and gradients), deterministic weight gradients.
- Property tests (hypothesis): random shapes, layouts, dtypes and modes against the float64 references (in this
  file rather than tests/test_properties.py, which another change owns this session).
- CUDA: CPU agreement at training-like shapes, a flat index past 2^31, CUDA graphs, the weight gradients' chunks
  (skipped without a GPU).
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch
import torch._dynamo.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck, gradgradcheck

import torchops
from helpers import (DEVICES, FLOAT_DTYPES, HALF_DTYPES, TOLERANCES, assert_close_to_reference, needs_gpu_memory,
                     property_examples, random_tensor, requires_cuda, run_python)
from torchops._meta_kernels import _checks
from op_db import OPS_BY_NAME, upcast
from op_db.rotary import (output_layout, qk_norm_rope_reference, rotary_reference, rotate_half, rotate_every_two,
                          vllm_rotary_reference)

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")  # vmap's batching fallback

D = torch.float64
HALF = HALF_DTYPES
# The ops differentiable in their rows (and qk_norm_rope's weights), and which of their arguments those are.
DIFFERENTIABLE = {"rotary_embedding": (0, 1), "_rotary_embedding_backward": (0, 1), "qk_norm_rope": (0, 1, 2, 3)}


def _fast(args) -> bool:
    # Full Jacobians of the larger samples would take long; fast mode checks random projections.
    return sum(a.numel() for a in args if isinstance(a, torch.Tensor)) > 2000


# ------------------------------------------------------------------------------------------------ gradients
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(DIFFERENTIABLE))
def test_gradcheck_and_gradgradcheck(name: str, device: str) -> None:
    info = OPS_BY_NAME[name]
    for sample in info.sample_inputs(device, D, True):
        fast = _fast(sample.args)
        fn = lambda *a: info.op(*a)  # noqa: E731
        assert gradcheck(fn, sample.args, fast_mode=fast, check_forward_ad=True), sample.desc
        assert gradgradcheck(fn, sample.args, fast_mode=fast), sample.desc


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(DIFFERENTIABLE))
def test_opcheck_with_gradients(name: str, device: str) -> None:
    info = OPS_BY_NAME[name]
    for dtype in (torch.float32, torch.bfloat16):
        for sample in info.sample_inputs(device, dtype, True):
            torch.library.opcheck(info.op, sample.args, sample.kwargs)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(DIFFERENTIABLE))
def test_compile_backward(name: str, device: str, fresh_dynamo) -> None:
    info = OPS_BY_NAME[name]
    grads = DIFFERENTIABLE[name]

    def loss(*args):
        return sum((o * torch.linspace(-1, 2, o.numel(), device=o.device).view_as(o)).sum() for o in info.op(*args))

    compiled = torch.compile(loss, fullgraph=True, dynamic=True)
    for n in (5, 9):
        args = info.sized_inputs(device, torch.float32, n)
        leaves = [[a.detach().clone().requires_grad_(i in grads) if isinstance(a, torch.Tensor) else a
                   for i, a in enumerate(args)] for _ in range(2)]
        loss(*leaves[0]).backward()
        compiled(*leaves[1]).backward()
        for i in grads:
            torch.testing.assert_close(leaves[1][i].grad, leaves[0][i].grad)


def _check_grads(got, want, dtype: torch.dtype, what: str) -> None:
    """Gradients against float64 ones: rows at the dtype's tolerance; 1-D ones (sums over rows) relative to their
    largest value."""
    rtol, atol = TOLERANCES[dtype]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        scale = max(1.0, w.abs().max().item()) if w.dim() == 1 else 1.0
        torch.testing.assert_close(g.double().cpu(), w, rtol=4 * rtol if w.dim() == 1 else rtol, atol=atol * scale,
                                   msg=lambda m: f"{what}: gradient {i}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("name", ["rotary_embedding", "qk_norm_rope"])
def test_gradients_match_float64_reference(name: str, dtype: torch.dtype, device: str) -> None:
    info = OPS_BY_NAME[name]
    reference = rotary_reference if name == "rotary_embedding" else qk_norm_rope_reference
    for sample in info.sample_inputs(device, dtype, True):
        leaves = [a for i, a in enumerate(sample.args) if i in DIFFERENTIABLE[name]]
        outs = info.op(*sample.args)
        grads_out = [random_tensor(o.shape, dtype, device) for o in outs]
        got = torch.autograd.grad(outs, leaves, grads_out)
        wide = [a.requires_grad_() if i in DIFFERENTIABLE[name] else a for i, a in enumerate(upcast(sample.args))]
        want = torch.autograd.grad(reference(*wide), [wide[i] for i in DIFFERENTIABLE[name]],
                                   [g.double().cpu() for g in grads_out])
        _check_grads(got, want, dtype, sample.desc)


def _small_rotary(device: str):
    torch.manual_seed(3)
    q = random_tensor((2, 5, 3, 8), D, device).transpose(1, 2)
    k = random_tensor((2, 5, 2, 8), D, device).transpose(1, 2)
    cos, sin = random_tensor((1, 5, 6), D, device), random_tensor((1, 5, 6), D, device)
    return q, k, cos, sin


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_torch_func_transforms(device: str, interleaved: bool) -> None:
    q, k, cos, sin = _small_rotary(device)
    w = random_tensor((8,), D, device)

    def ours(q, k):
        return torchops.apply_rotary_pos_emb(q, k, cos, sin, interleaved=interleaved)

    def ref(q, k):
        return rotary_reference(q, k, cos, sin, 1, interleaved)

    def ours_norm(q, w):
        return torchops.qk_norm_rope(q, k, w, w, cos, sin, weight_offset=0.5, interleaved=interleaved)[0].sum()

    def ref_norm(q, w):
        from op_db.norm import rms_norm_reference
        return rotary_reference(rms_norm_reference(q, w, 1e-6, 0.5), k, cos, sin, 1, interleaved)[0].sum()

    tq, tk = torch.randn_like(q), torch.randn_like(k)
    for got, want in zip(torch.func.jvp(ours, (q, k), (tq, tk)), torch.func.jvp(ref, (q, k), (tq, tk))):
        torch.testing.assert_close(got, want)
    _, vjp = torch.func.vjp(ours, q, k)
    _, vjp_ref = torch.func.vjp(ref, q, k)
    g = (torch.randn_like(q), torch.randn_like(k))
    for got, want in zip(vjp(g), vjp_ref(g)):
        torch.testing.assert_close(got, want)
    for got, want in zip(torch.func.jacrev(ours_norm, argnums=(0, 1))(q, w),
                         torch.func.jacrev(ref_norm, argnums=(0, 1))(q, w)):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.func.jacfwd(ours_norm, argnums=1)(q, w), torch.func.jacfwd(ref_norm, argnums=1)(q, w))
    torch.testing.assert_close(torch.func.hessian(ours_norm, argnums=1)(q, w), torch.func.hessian(ref_norm, argnums=1)(q, w))


@pytest.mark.parametrize("device", DEVICES)
def test_vmap_over_a_batch_of_calls(device: str) -> None:
    # vmap over an extra leading dimension of 4-D calls: PyTorch's batching fallback (one call per entry).
    q = random_tensor((3, 2, 4, 5, 8), D, device)
    k = random_tensor((3, 2, 2, 5, 8), D, device)
    cos, sin = random_tensor((1, 5, 8), D, device), random_tensor((1, 5, 8), D, device)
    got_q, got_k = torch.vmap(lambda a, b: torchops.apply_rotary_pos_emb(a, b, cos, sin))(q, k)
    for i in range(3):
        want_q, want_k = rotary_reference(q[i], k[i], cos, sin)
        torch.testing.assert_close(got_q[i], want_q)
        torch.testing.assert_close(got_k[i], want_k)


@pytest.mark.parametrize("device", DEVICES)
def test_cos_and_sin_are_constants(device: str) -> None:
    q, k, cos, sin = _small_rotary(device)
    w = random_tensor((8,), D, device)
    msg = lambda op, x, why: "^" + re.escape(_checks.message(op, "rotary_constant", x=x, why=why)) + "$"  # noqa: E731
    with pytest.raises(RuntimeError, match=msg("rotary_embedding", "cos", "requires grad")):
        torchops.apply_rotary_pos_emb(q, k, cos.clone().requires_grad_(), sin)
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        dual_sin = fwAD.make_dual(sin, torch.randn_like(sin))
        with pytest.raises(RuntimeError, match=msg("rotary_embedding", "sin", "has a forward-mode tangent")):
            torchops.apply_rotary_pos_emb(q, k, cos, dual_sin)
        with pytest.raises(RuntimeError, match=msg("qk_norm_rope", "sin", "has a forward-mode tangent")):
            torchops.qk_norm_rope(q, k, w, w, cos, dual_sin)
    with pytest.raises(RuntimeError, match=msg("rotary_embedding", "cos", "has a forward-mode tangent")):
        torch.func.jvp(lambda c: torchops.apply_rotary_pos_emb(q, k, c, sin)[0], (cos,), (torch.randn_like(cos),))
    # Under no_grad a cos that requires grad is just a value: nothing would be recorded.
    with torch.no_grad():
        got = torchops.apply_rotary_pos_emb(q, k, cos.clone().requires_grad_(), sin)
    torch.testing.assert_close(got, rotary_reference(q, k, cos, sin))


def test_backward_of_one_output_only() -> None:
    # Only q_out takes part in the loss: k gets no gradient, q the transposed rotation of its own.
    q, k, cos, sin = _small_rotary("cpu")
    q.requires_grad_()
    k.requires_grad_()
    q_out, _ = torchops.apply_rotary_pos_emb(q, k, cos, sin)
    g = torch.randn_like(q_out)
    gq, gk = torch.autograd.grad(q_out, (q, k), g, allow_unused=True)
    assert gk is None
    qr = q.detach().clone().requires_grad_()
    torch.testing.assert_close(gq, torch.autograd.grad(rotary_reference(qr, k.detach(), cos, sin)[0], qr, g)[0])
    w = random_tensor((8,), D, "cpu").requires_grad_()
    _, k_out = torchops.qk_norm_rope(q, k, w, w, cos, sin)
    gq, gk, gw = torch.autograd.grad(k_out.sum(), (q, k, w), allow_unused=True)
    assert gq is None and gk is not None and gw is not None


def test_qk_norm_rope_backward_op_refuses_its_own_derivatives() -> None:
    q, k, cos, sin = _small_rotary("cpu")
    w = random_tensor((8,), D, "cpu").requires_grad_()
    g = torch.randn_like(q).requires_grad_()
    grads = torch.ops.myns._qk_norm_rope_backward(g, None, q, k, w, w, cos, sin, 1e-6, 0.0, 1, False, True, True)
    with pytest.raises(RuntimeError, match=r"^myns::_qk_norm_rope_backward: double backward"):
        grads[0].sum().backward()
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level(), pytest.raises(RuntimeError, match=r"^myns::_qk_norm_rope_backward: forward-mode AD"):
        torch.ops.myns._qk_norm_rope_backward(fwAD.make_dual(g.detach(), torch.randn_like(g)), None, q, k, w.detach(),
                                              w.detach(), cos, sin, 1e-6, 0.0, 1, False, True, True)


# -------------------------------------------------------------------------------------------- the HF call
def test_signature_is_transformers() -> None:
    params = list(inspect.signature(torchops.apply_rotary_pos_emb).parameters.values())
    assert [p.name for p in params] == ["q", "k", "cos", "sin", "position_ids", "unsqueeze_dim", "interleaved"]
    assert params[4].default is None and params[5].default == 1 and params[6].default is False
    # interleaved after transformers' own arguments (positional: TorchScript takes no keyword-only defaults)
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)


@pytest.mark.parametrize("device", DEVICES)
def test_position_ids_are_ignored(device: str) -> None:
    q, k, cos, sin = _small_rotary(device)
    ids = torch.arange(5, device=device)[None]
    for got, want in zip(torchops.apply_rotary_pos_emb(q, k, cos, sin, ids), rotary_reference(q, k, cos, sin)):
        torch.testing.assert_close(got, want)


def test_references_are_transformers_formula() -> None:
    # The test's own helpers, against their definitions written out element by element.
    x = torch.arange(8.0)
    assert torch.equal(rotate_half(x), torch.tensor([-4.0, -5, -6, -7, 0, 1, 2, 3]))
    assert torch.equal(rotate_every_two(x), torch.tensor([-1.0, 0, -3, 2, -5, 4, -7, 6]))


@pytest.mark.parametrize("device", DEVICES)
def test_transformers_layout_is_read_in_place(device: str) -> None:
    # q and k as an attention layer makes them: a projection's output viewed [b, s, h, d] and transposed.
    b, s, h, d = 2, 7, 4, 64
    x = random_tensor((b, s, 2 * h * d), torch.float32, device)
    q = x[..., : h * d].view(b, s, h, d).transpose(1, 2)
    k = x[..., h * d:].view(b, s, h, d).transpose(1, 2)
    cos, sin = random_tensor((1, s, d), torch.float32, device), random_tensor((1, s, d), torch.float32, device)
    copies = {"aten::contiguous", "aten::clone", "aten::copy_", "aten::_to_copy"}

    def ops_called(fn) -> set[str]:
        with torch.profiler.profile() as prof:
            fn()
        return {e.name for e in prof.events()}

    assert not ops_called(lambda: torchops.apply_rotary_pos_emb(q, k, cos, sin)) & copies
    # The probe can see a copy: a last dimension that is not dense is copied first.
    assert ops_called(lambda: torchops.apply_rotary_pos_emb(q[..., ::2], k[..., ::2], cos[..., ::2], sin[..., ::2])) & copies
    for got, want in zip(torchops.apply_rotary_pos_emb(q, k, cos, sin), rotary_reference(q.double(), k.double(),
                                                                                         cos.double(), sin.double())):
        assert got.is_contiguous()  # q and k share one buffer (a fused projection): not dense alone, so contiguous
        assert_close_to_reference(got, want)

    # Each from its own projection (transformers' q_proj, k_proj): the outputs keep the [b, s, h, d] memory, as
    # q * cos + rotate_half(q) * sin keeps it, so the attention after them and the gradient's way back through the
    # view need no copy; so do the gradients of rotary_embedding's backward and of qk_norm_rope's.
    q, k = (random_tensor((b, s, h * d), torch.float32, device).view(b, s, h, d).transpose(1, 2) for _ in range(2))
    for x, got, want in zip((q, k), torchops.apply_rotary_pos_emb(q, k, cos, sin),
                            rotary_reference(q.double(), k.double(), cos.double(), sin.double())):
        assert got.stride() == x.stride() == (q * cos.unsqueeze(1)).stride()
        assert_close_to_reference(got, want)
    grads = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k)]
    for g, got in zip(grads, torch.ops.myns._rotary_embedding_backward(*grads, cos, sin, 1, False)):
        assert got.stride() == g.stride()
    w = random_tensor((d,), torch.float32, device)
    for x, got in zip((q, k), torch.ops.myns.qk_norm_rope(q, k, w, w, cos, sin)):
        assert got.stride() == x.stride()
    for x, got in zip((q, k), torch.ops.myns._qk_norm_rope_backward(*grads, q, k, w, w, cos, sin, 1e-6, 0.0, 1, False,
                                                                    True, False)[:2]):
        assert got.stride() == x.stride()


@pytest.mark.parametrize("device", DEVICES)
@torch._dynamo.config.patch(specialize_float=True)
def test_compile_fullgraph_dynamic_seq(device: str, fresh_dynamo) -> None:
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    h, hk, d = 4, 2, 16

    def prelude(x, cos, sin, qw, kw, positions, cache):
        b, s, _ = x.shape
        q = x[..., : h * d].view(b, s, h, d).transpose(1, 2)
        k = x[..., h * d:].view(b, s, hk, d).transpose(1, 2)
        rq, rk = torchops.apply_rotary_pos_emb(q, k, cos, sin)
        nq, nk = torchops.qk_norm_rope(q, k, qw, kw, cos, sin, weight_offset=1.0)
        flat = x.reshape(b * s, -1).clone()
        torchops.rotary_embedding_(positions, flat[:, : h * d], flat[:, h * d:], d, cache)
        return rq, rk, nq, nk, flat

    compiled = torch.compile(prelude, backend=counter, fullgraph=True, dynamic=True)
    qw, kw = random_tensor((d,), torch.float32, device), random_tensor((d,), torch.float32, device)
    cache = random_tensor((64, 12), torch.float32, device)
    for s in (5, 9, 17):
        x = random_tensor((2, s, (h + hk) * d), torch.float32, device)
        cos, sin = random_tensor((1, s, d), torch.float32, device), random_tensor((1, s, d), torch.float32, device)
        positions = torch.randint(0, 64, (2 * s,), device=device)
        for got, want in zip(compiled(x, cos, sin, qw, kw, positions, cache), prelude(x, cos, sin, qw, kw, positions, cache)):
            torch.testing.assert_close(got, want)
    assert counter.frame_count == 1, "one compiled frame must serve every sequence length"
    targets = {str(n.target) for g in counter.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert {"myns.rotary_embedding.default", "myns.qk_norm_rope.default"} <= targets, targets


def test_export_dynamic_seq_in_a_fresh_process(tmp_path) -> None:
    class Prelude(torch.nn.Module):
        def forward(self, q, k, cos, sin, w):
            q_out, k_out = torchops.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            return (q_out, k_out) + torchops.qk_norm_rope(q, k, w, w, cos, sin, unsqueeze_dim=2)

    args = (random_tensor((2, 6, 4, 8), torch.float32, "cpu"), random_tensor((2, 6, 2, 8), torch.float32, "cpu"),
            random_tensor((1, 6, 8), torch.float32, "cpu"), random_tensor((1, 6, 8), torch.float32, "cpu"),
            random_tensor((8,), torch.float32, "cpu"))
    seq = torch.export.Dim("seq", min=2, max=4096)
    ep = torch.export.export(Prelude(), args, dynamic_shapes=({1: seq}, {1: seq}, {1: seq}, {1: seq}, None))
    code = ep.graph_module.code
    assert "torch.ops.myns.rotary_embedding.default" in code and "torch.ops.myns.qk_norm_rope.default" in code
    torch.export.save(ep, str(tmp_path / "prelude.pt2"))
    longer = tuple(a if i == 4 else torch.cat([a, a[:, :3]], 1) for i, a in enumerate(args))
    torch.save(longer, str(tmp_path / "inputs.pt"))
    run_python(f"""
        import torch, torchops
        fn = torch.export.load({str(tmp_path / 'prelude.pt2')!r}).module()
        torch.save(fn(*torch.load({str(tmp_path / 'inputs.pt')!r})), {str(tmp_path / 'outputs.pt')!r})
    """)
    got = torch.load(str(tmp_path / "outputs.pt"))
    for g, w in zip(got, Prelude()(*longer), strict=True):
        assert torch.equal(g, w)


# ------------------------------------------------------------------------------------ rotary_embedding_
def _inplace_case(device, dtype, tokens, hq, hk, hs, rot, layout, cache_dtype=None):
    if layout == "qkv":
        qkv = random_tensor((tokens, (hq + 2 * hk) * hs), dtype, device)
        query, key = qkv[:, : hq * hs], (qkv[:, hq * hs: (hq + hk) * hs] if hk else None)
    elif layout == "3d":
        query = random_tensor((tokens, hq, hs), dtype, device)
        key = random_tensor((tokens, hk, hs), dtype, device) if hk else None
    else:
        query = random_tensor((tokens, hq * hs), dtype, device)
        key = random_tensor((tokens, hk * hs), dtype, device) if hk else None
    cache = random_tensor((40, rot), cache_dtype or dtype, device)
    positions = torch.randint(0, 40, (tokens,), device=device)
    return positions, query, key, cache


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("hs,rot", [(128, 128), (128, 64), (80, 32), (16, 8)])
@pytest.mark.parametrize("layout", ["2d", "3d", "qkv"])
def test_inplace_matches_vllm_definition(device, dtype, is_neox, hs, rot, layout) -> None:
    positions, query, key, cache = _inplace_case(device, dtype, 9, 4, 2, hs, rot, layout)
    want_q = vllm_rotary_reference(*upcast((positions, query, hs, cache)), is_neox=is_neox)
    want_k = vllm_rotary_reference(*upcast((positions, key, hs, cache)), is_neox=is_neox)
    q_before, k_before = query.clone(), key.clone()
    assert torchops.rotary_embedding_(positions, query, key, hs, cache, is_neox) is None
    assert_close_to_reference(query.cpu(), want_q)
    assert_close_to_reference(key.cpu(), want_k)
    # Past rot nothing is touched: the same bits.
    heads_of = lambda t: t.reshape(9, -1, hs)[..., rot:]  # noqa: E731
    assert torch.equal(heads_of(query), heads_of(q_before)) and torch.equal(heads_of(key), heads_of(k_before))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF)
def test_inplace_float32_cache_with_16bit_rows(device, dtype) -> None:
    positions, query, key, cache = _inplace_case(device, dtype, 6, 2, 1, 64, 64, "2d", torch.float32)
    want = [vllm_rotary_reference(*upcast((positions, t, 64, cache))) for t in (query, key)]
    torchops.rotary_embedding_(positions, query, key, 64, cache)
    assert_close_to_reference(query.cpu(), want[0])
    assert_close_to_reference(key.cpu(), want[1])


@pytest.mark.parametrize("device", DEVICES)
def test_inplace_versions_and_inference_only(device) -> None:
    positions, query, key, cache = _inplace_case(device, torch.float32, 4, 2, 1, 16, 16, "2d")
    v_q, v_k = query._version, key._version
    torchops.rotary_embedding_(positions, query, key, 16, cache)
    assert (query._version, key._version) == (v_q + 1, v_k + 1)
    with torch.inference_mode():
        q2, k2 = query.clone(), key.clone()
        torchops.rotary_embedding_(positions, q2, k2, 16, cache)
    message = lambda x, why: _checks.message("rotary_embedding_", "rotary_inference_only", x=x, why=why)  # noqa: E731
    leaf = query.clone().requires_grad_()
    with pytest.raises(RuntimeError) as e:
        torchops.rotary_embedding_(positions, leaf, key, 16, cache)
    assert str(e.value) == message("query", "requires grad")
    with torch.no_grad():  # nothing is recorded, so nothing to refuse (a leaf's data may be updated in place)
        torchops.rotary_embedding_(positions, leaf, key.clone(), 16, cache)
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        dual = fwAD.make_dual(key.clone(), torch.randn_like(key))
        with pytest.raises(RuntimeError) as e:
            torchops.rotary_embedding_(positions, query.clone(), dual, 16, cache)
    assert str(e.value) == message("key", "has a forward-mode tangent")


def test_inplace_out_of_range_position_on_cpu_raises_before_writing() -> None:
    positions, query, key, cache = _inplace_case("cpu", torch.float32, 6, 2, 1, 16, 16, "2d")
    positions[4] = 40
    before = query.clone(), key.clone()
    with pytest.raises(RuntimeError, match=r"^myns::rotary_embedding_: positions must lie in \[0, 40\)"):
        torchops.rotary_embedding_(positions, query, key, 16, cache)
    assert torch.equal(query, before[0]) and torch.equal(key, before[1])


@requires_cuda
def test_inplace_out_of_range_position_on_cuda_leaves_the_token() -> None:
    positions, query, key, cache = _inplace_case("cuda", torch.float32, 6, 2, 1, 16, 16, "2d")
    positions[1], positions[4] = 40, -3
    before = query.clone(), key.clone()
    want = [vllm_rotary_reference(*upcast((positions.clamp(0, 39), t, 16, cache))) for t in before]
    torchops.rotary_embedding_(positions, query, key, 16, cache)
    torch.cuda.synchronize()
    for got, old, ref in zip((query, key), before, want):
        for t in range(6):
            if t in (1, 4):
                assert torch.equal(got[t], old[t]), t
            else:
                assert_close_to_reference(got[t].cpu(), ref[t])


# ------------------------------------------------------------------------------------------ qk_norm_rope
def _qk_case(device, dtype, weight_dtype=None, interleaved=False, rot=128, u=1):
    b, hq, hk, s, d = 2, 4, 2, 5, 128
    shape = (lambda h: (b, s, h, d)) if u == 1 else (lambda h: (b, h, s, d))
    q = random_tensor(shape(hq), dtype, device).transpose(1, 2)
    k = random_tensor(shape(hk), dtype, device).transpose(1, 2)
    qw, kw = (random_tensor((d,), weight_dtype or dtype, device) for _ in range(2))
    from op_db.rotary import _angles
    cos, sin = _angles(b, s, rot, interleaved, dtype, device)
    return q, k, qw, kw, cos, sin


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("interleaved,rot,u", [(False, 128, 1), (True, 64, 2), (False, 32, 2)])
def test_qk_norm_rope_equals_the_composition(device, dtype, interleaved, rot, u) -> None:
    q, k, qw, kw, cos, sin = _qk_case(device, dtype, interleaved=interleaved, rot=rot, u=u)
    kwargs = dict(weight_offset=1.0, unsqueeze_dim=u, interleaved=interleaved)
    fused = torchops.qk_norm_rope(q, k, qw, kw, cos, sin, 1e-5, **kwargs)
    composed = torchops.apply_rotary_pos_emb(torchops.rms_norm(q, qw, 1e-5, weight_offset=1.0),
                                             torchops.rms_norm(k, kw, 1e-5, weight_offset=1.0), cos, sin,
                                             unsqueeze_dim=u, interleaved=interleaved)
    want = qk_norm_rope_reference(*upcast((q, k, qw, kw, cos, sin)), 1e-5, 1.0, u, interleaved)
    for f, c, w in zip(fused, composed, want):
        if dtype in HALF:  # the composition rounds the normalised rows to 16 bits first: the fused op is nearer
            assert_close_to_reference(f.cpu(), w)
            rtol, atol = TOLERANCES[dtype]
            torch.testing.assert_close(c, f, rtol=2 * rtol, atol=2 * atol)
        else:
            tol = 1e-12 if dtype == D else 2e-5
            torch.testing.assert_close(f, c, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_qk_norm_rope_gradients_equal_the_composition(device) -> None:
    q, k, qw, kw, cos, sin = _qk_case(device, D, interleaved=True, rot=64)
    leaves = [t.requires_grad_() for t in (q, k, qw, kw)]
    g = [torch.randn(t.shape, dtype=D, device=device) for t in (q, k)]
    fused = torch.autograd.grad(torchops.qk_norm_rope(*leaves, cos, sin, weight_offset=0.5, interleaved=True), leaves, g)
    composed_out = torchops.apply_rotary_pos_emb(torchops.rms_norm(leaves[0], leaves[2], weight_offset=0.5),
                                                 torchops.rms_norm(leaves[1], leaves[3], weight_offset=0.5), cos, sin,
                                                 interleaved=True)
    for f, c in zip(fused, torch.autograd.grad(composed_out, leaves, g)):
        torch.testing.assert_close(f, c, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,weight_dtype", [(torch.float32, None), (torch.bfloat16, torch.float32),
                                                (torch.float16, None)])
def test_qk_norm_rope_weight_gradients_are_deterministic(device, dtype, weight_dtype) -> None:
    # Many rows (a chunked sum on every device): the same bits on every run, and on the CPU whatever the threads.
    b, h, s, d = 4, 8, 300, 64
    q = random_tensor((b, s, h, d), dtype, device).transpose(1, 2)
    k = random_tensor((b, s, h // 2, d), dtype, device).transpose(1, 2)
    qw, kw = (random_tensor((d,), weight_dtype or dtype, device) for _ in range(2))
    cos, sin = random_tensor((1, s, d), dtype, device), random_tensor((1, s, d), dtype, device)
    g = [random_tensor(t.shape, dtype, device) for t in (q, k)]

    def weight_grads():
        return torch.ops.myns._qk_norm_rope_backward(g[0], g[1], q, k, qw, kw, cos, sin, 1e-6, 0.0, 1, False, False,
                                                     True)[2:]

    first = weight_grads()
    threads = torch.get_num_threads()
    try:
        for n in ([1, 2] if device == "cpu" else [threads]):
            torch.set_num_threads(n)
            for got, want in zip(weight_grads(), first):
                assert torch.equal(got, want)
    finally:
        torch.set_num_threads(threads)
    # and right: against float64
    wide = [t.double().cpu().requires_grad_() for t in (q, k, qw, kw)]
    want = torch.autograd.grad(qk_norm_rope_reference(*wide, cos.double().cpu(), sin.double().cpu()), wide[2:],
                               [t.double().cpu() for t in g])
    _check_grads(first, want, weight_dtype or dtype, "weight gradients")


# ------------------------------------------------------------------------------------------- properties
_PROPERTY = settings(max_examples=property_examples(40))


@st.composite
def rotary_calls(draw, device: str):
    """A random rotary_embedding call: sizes from 0, GQA, any rot (even, at most head_dim), both layouts and pair
    orders, cos and sin of batch 1 or b and seq 1 or s, q / k and cos / sin in several memory layouts, a dtype."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    b, hq, hk, s = draw(st.integers(0, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 5)), draw(st.integers(0, 6))
    half = draw(st.integers(0, 20))
    d = 2 * half + draw(st.integers(0, 9))
    u, interleaved = draw(st.sampled_from([1, 2])), draw(st.booleans())
    cb, cs = draw(st.sampled_from([1, b])), draw(st.sampled_from([1, s]))

    def heads(h):
        shape = (b, h, s, d) if u == 1 else (b, s, h, d)
        layout = draw(st.sampled_from(["contiguous", "swapped", "sliced", "offset"]))
        if layout == "swapped":
            return random_tensor((shape[0], shape[2], shape[1], d), dtype, device).transpose(1, 2)
        if layout == "sliced":
            return random_tensor(shape[:-1] + (2 * d,), dtype, device)[..., ::2]
        if layout == "offset":
            n = b * h * s * d
            return random_tensor((n + 1,), dtype, device)[1:].view(shape)
        return random_tensor(shape, dtype, device)

    def table():
        if draw(st.booleans()):
            return random_tensor((cb, cs, 4 * half + 3), dtype, device)[..., 1: 1 + 4 * half: 2]  # strided
        return random_tensor((cb, cs, 2 * half), dtype, device)

    return heads(hq), heads(hk), table(), table(), u, interleaved


@pytest.mark.parametrize("device", DEVICES)
@_PROPERTY
@given(data=st.data())
def test_property_rotary_matches_float64_reference(device, data) -> None:
    q, k, cos, sin, u, interleaved = data.draw(rotary_calls(device))
    got = torchops.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=u, interleaved=interleaved)
    want = rotary_reference(*upcast((q, k, cos, sin)), u, interleaved)
    for x, g, w in zip((q, k), got, want):
        assert g.stride() == output_layout(x) and g.dtype == q.dtype
        assert_close_to_reference(g.cpu(), w)
    back = torch.ops.myns._rotary_embedding_backward(q, k, cos, sin, u, interleaved)
    from op_db.rotary import rotary_backward_reference
    for g, w in zip(back, rotary_backward_reference(*upcast((q, k, cos, sin)), u, interleaved)):
        assert_close_to_reference(g.cpu(), w)


@pytest.mark.parametrize("device", DEVICES)
@_PROPERTY
@given(data=st.data())
def test_property_qk_norm_rope_matches_float64_reference(device, data) -> None:
    q, k, cos, sin, u, interleaved = data.draw(rotary_calls(device))
    if q.shape[-1] == 0:
        return
    wdtype = data.draw(st.sampled_from([q.dtype, torch.float32] if q.dtype in HALF else [q.dtype]))
    qw, kw = (random_tensor((q.shape[-1],), wdtype, device) for _ in range(2))
    offset = data.draw(st.sampled_from([0.0, 1.0]))
    got = torchops.qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6, weight_offset=offset, unsqueeze_dim=u,
                                interleaved=interleaved)
    for g, w in zip(got, qk_norm_rope_reference(*upcast((q, k, qw, kw, cos, sin)), 1e-6, offset, u, interleaved)):
        assert_close_to_reference(g.cpu(), w)


@pytest.mark.parametrize("device", DEVICES)
@_PROPERTY
@given(data=st.data())
def test_property_inplace_matches_vllm_definition(device, data) -> None:
    dtype = data.draw(st.sampled_from(FLOAT_DTYPES))
    tokens, hq, hk = data.draw(st.integers(0, 7)), data.draw(st.integers(1, 4)), data.draw(st.integers(0, 3))
    half = data.draw(st.integers(0, 16))
    hs = 2 * half + data.draw(st.integers(0, 5))
    if hs == 0:
        return
    layout = data.draw(st.sampled_from(["2d", "3d", "qkv"]))
    cache_dtype = data.draw(st.sampled_from([dtype, torch.float32] if dtype in HALF else [dtype]))
    positions, query, key, cache = _inplace_case(device, dtype, tokens, hq, hk, hs, 2 * half, layout, cache_dtype)
    is_neox = data.draw(st.booleans())
    want = [vllm_rotary_reference(*upcast((positions, t, hs, cache)), is_neox=is_neox) if t is not None else None
            for t in (query, key)]
    torchops.rotary_embedding_(positions, query, key, hs, cache, is_neox)
    for got, w in zip((query, key), want):
        if got is not None:
            assert_close_to_reference(got.cpu(), w)


# ------------------------------------------------------------------------------------------------- CUDA
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_agrees_with_cpu_at_a_training_like_shape(dtype) -> None:
    b, hq, hk, s, d = 2, 16, 4, 256, 128
    q = random_tensor((b, s, hq, d), dtype, "cuda").transpose(1, 2)
    k = random_tensor((b, s, hk, d), dtype, "cuda").transpose(1, 2)
    from op_db.rotary import _angles
    cos, sin = _angles(1, s, d, False, dtype, "cuda")
    w = random_tensor((d,), dtype, "cuda")
    for fn in (lambda *a: torchops.apply_rotary_pos_emb(*a),
               lambda q, k, c, s_: torchops.qk_norm_rope(q, k, w.to(q.device), w.to(q.device), c, s_)):
        got = fn(q, k, cos, sin)
        want = fn(q.cpu(), k.cpu(), cos.cpu(), sin.cpu())
        for g, c in zip(got, want):
            rtol, atol = TOLERANCES[dtype]
            torch.testing.assert_close(g.cpu(), c, rtol=2 * rtol, atol=2 * atol)
    # The backward too, through autograd (weights' gradients summed over 2 * 256 * 16 rows).
    leaves = [t.detach().requires_grad_() for t in (q, k, w, w.clone())]
    outs = torchops.qk_norm_rope(*leaves, cos, sin)
    g = [random_tensor(o.shape, dtype, "cuda") for o in outs]
    got = torch.autograd.grad(outs, leaves, g)
    wide = [t.detach().double().cpu().requires_grad_() for t in leaves]
    want = torch.autograd.grad(qk_norm_rope_reference(*wide, cos.double().cpu(), sin.double().cpu()), wide,
                               [t.double().cpu() for t in g])
    _check_grads(got, want, dtype, "CUDA qk_norm_rope gradients")


@requires_cuda
def test_cuda_graph_capture_replays() -> None:
    # No host synchronisation inside the ops: they capture into a CUDA graph and replay equal to eager.
    q, k, cos, sin = (t.float().cuda() for t in _small_rotary("cpu"))
    w = random_tensor((8,), torch.float32, "cuda")
    positions, query, key, cache = _inplace_case("cuda", torch.float32, 5, 2, 1, 16, 16, "2d")
    eager = torchops.apply_rotary_pos_emb(q, k, cos, sin) + torchops.qk_norm_rope(q, k, w, w, cos, sin)
    q_ref, k_ref = query.clone(), key.clone()
    torchops.rotary_embedding_(positions, q_ref, k_ref, 16, cache)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream, as graph capture asks
        torchops.apply_rotary_pos_emb(q, k, cos, sin)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = torchops.apply_rotary_pos_emb(q, k, cos, sin) + torchops.qk_norm_rope(q, k, w, w, cos, sin)
        torchops.rotary_embedding_(positions, query, key, 16, cache)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, eager):
        assert torch.equal(got, want)
    assert torch.equal(query, q_ref) and torch.equal(key, k_ref)


@requires_cuda
@pytest.mark.parametrize("interleaved", [False, True])
def test_cuda_vector_and_element_paths_agree(interleaved) -> None:
    # The same values through 16-byte vectors (aligned rows) and single elements (rows one element off).
    b, h, s, d = 2, 3, 33, 64
    aligned = random_tensor((b, h, s, d), torch.bfloat16, "cuda")
    shifted = torch.empty((b * h * s * d + 1,), dtype=torch.bfloat16, device="cuda")[1:].view(b, h, s, d)
    shifted.copy_(aligned)
    cos, sin = random_tensor((b, s, 48), torch.bfloat16, "cuda"), random_tensor((b, s, 48), torch.bfloat16, "cuda")
    want = rotary_reference(*upcast((aligned, aligned, cos, sin)), 1, interleaved)
    for a, c, w in zip(torchops.apply_rotary_pos_emb(aligned, aligned, cos, sin, interleaved=interleaved),
                       torchops.apply_rotary_pos_emb(shifted, shifted, cos, sin, interleaved=interleaved), want):
        assert_close_to_reference(a.cpu(), w)
        assert_close_to_reference(c.cpu(), w)


@requires_cuda
@needs_gpu_memory(40)
def test_cuda_flat_index_past_pow_31() -> None:
    # Single-element units (rows one element off 16-byte alignment): positions x heads x units > 2^31, the 64-bit
    # index path. A few rows checked against float64.
    h, d = 1, 64
    s = (1 << 26) + 7
    q = torch.empty((s * h * d + 1,), dtype=torch.bfloat16, device="cuda")[1:].view(1, h, s, d)
    q.normal_()
    cos = torch.ones((1, 1, d), dtype=torch.bfloat16, device="cuda") * 0.6
    sin = torch.ones((1, 1, d), dtype=torch.bfloat16, device="cuda") * 0.8
    q_out, _ = torchops.apply_rotary_pos_emb(q, q[:, :0], cos, sin)  # k without heads
    for rows in (slice(0, 3), slice(s - 3, s)):
        want = rotary_reference(*upcast((q[:, :, rows], q[:, :, rows], cos, sin)))[0]
        assert_close_to_reference(q_out[:, :, rows].cpu(), want)
