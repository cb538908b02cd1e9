"""torchops.transformers.patch on transformers' own modeling code: tiny random models of every supported type
(2 layers, hidden 64, vocab 1000, GQA heads), patched against an unpatched twin with the same weights."""

from __future__ import annotations

import copy
import importlib
import json
import sys

import pytest
import torch

import torchops
from helpers import HAS_CUDA, REPO_ROOT, run_python

transformers = pytest.importorskip("transformers")

import torchops.transformers as tt  # noqa: E402

TYPES = tt.SUPPORTED_MODEL_TYPES
# The equality tests run on the CPU and, where a GPU is present, on CUDA (ids "cuda-<type>").
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda,
                                              pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")])]
VOCAB = 1000


def tiny_config(model_type: str, **overrides):
    kwargs = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  tie_word_embeddings=False)
    if model_type == "gemma3_text":
        # one sliding and one global layer, softcapped logits, a head_dim-based query scale
        kwargs.update(query_pre_attn_scalar=16, sliding_window=8, final_logit_softcapping=30.0,
                      layer_types=["sliding_attention", "full_attention"])
    kwargs.update(overrides)
    return transformers.AutoConfig.for_model(model_type, **kwargs)


def tiny_model(model_type: str, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0, **overrides):
    """A random model whose norm weights are random too (not the ones/zeros they start at)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides),
                                                          attn_implementation="sdpa")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return model.to(device=device, dtype=dtype)


def twins(model_type: str, dtype: torch.dtype = torch.float32, device: str = "cpu", **patch_options):
    """(unpatched, patched) with equal weights."""
    ref = tiny_model(model_type, dtype, device)
    patched = tiny_model(model_type, dtype, device)
    patched.load_state_dict(ref.state_dict())
    return ref, tt.patch(patched, **patch_options)


def batch(device: str = "cpu", b: int = 2, s: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (b, s), generator=gen)
    labels = ids.clone()
    labels[0, :5] = -100
    labels[1, 10:13] = -100
    return ids.to(device), labels.to(device)


def assert_grads_close(ref, patched, **tol) -> None:
    grads = dict(patched.named_parameters())
    for name, p in ref.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(grads[name].grad, p.grad, msg=lambda m: f"{name}: {m}", **tol)


@pytest.mark.parametrize("model_type", TYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_logits_loss_and_gradients_match(device: str, model_type: str) -> None:
    ref, patched = twins(model_type, device=device)
    ids, labels = batch(device)
    torch.testing.assert_close(patched(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)
    out_ref, out = ref(ids, labels=labels), patched(ids, labels=labels)
    assert out.logits is None and out_ref.logits is not None
    assert out.loss.dtype == out_ref.loss.dtype == torch.float32
    torch.testing.assert_close(out.loss, out_ref.loss, rtol=1e-5, atol=1e-5)
    out_ref.loss.backward()
    out.loss.backward()
    assert_grads_close(ref, patched, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model_type", TYPES)
def test_attention_gets_q_and_k_in_the_projections_layout(model_type: str) -> None:
    # The rotated q and k stay in q_proj's [b, s, h, d] memory, as transformers' own code leaves them: a
    # contiguous [b, h, s, d] q made the attention's output come back in that layout and transformers'
    # transpose(1, 2).contiguous() copy it, a copy kept for o_proj's backward (512 MiB in bench_transformers'
    # LLaMA on the GPU).
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    seen: list[tuple] = []  # (query strides, key strides) of each attention call: the unpatched model's, then ours
    name = "torchops_layout_probe"

    def probe(module, query, key, value, *args, **kwargs):
        seen.append((query.stride(), key.stride()))
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)

    transformers.AttentionInterface.register(name, probe)
    ids, _ = batch()
    for model in twins(model_type):
        model.set_attn_implementation(name)
        with torch.no_grad():
            model(ids)
    ref, patched = seen[:2], seen[2:]
    assert len(patched) == 2 and patched == ref, seen
    query_stride = patched[0][0]
    assert query_stride[2] > query_stride[1], query_stride  # seq outer to heads: [b, s, h, d] in memory


@pytest.mark.parametrize("model_type", TYPES)
def test_mlp_backward_writes_grad_gate_over_the_incoming_gradient(model_type: str) -> None:
    # In transformers' MLP nothing but the backward holds the gradient reaching the gated op, so each layer's
    # backward takes one new buffer, not two: the out= form runs (128 MiB less in bench_transformers' LLaMA).
    op = "gelu_and_mul" if model_type == "gemma3_text" else "swiglu"
    _, patched = twins(model_type)
    ids, labels = batch()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        patched(ids, labels=labels).loss.backward()
    ran = [e.name for e in prof.events() if e.name.startswith(f"myns::{op}_backward")]
    assert ran == [f"myns::{op}_backward_out"] * patched.config.num_hidden_layers


def test_patch_replaces_what_it_says() -> None:
    model = tt.patch(tiny_model("qwen3"))
    layer = model.model.layers[0]
    assert isinstance(model.model.norm, torchops.nn.RMSNorm)
    assert isinstance(layer.self_attn.q_norm, torchops.nn.RMSNorm)
    for module in (model, layer, layer.self_attn, layer.mlp):
        assert "forward" in module.__dict__, type(module).__name__
    gemma = tt.patch(tiny_model("gemma3_text"))
    assert gemma.model.layers[1].pre_feedforward_layernorm.weight_offset == 1.0


@pytest.mark.parametrize("option", ["rms_norm", "rope", "mlp", "fused_residual", "loss"])
def test_each_part_switched_off_alone_still_matches(option: str) -> None:
    # gemma3_text has every part (q/k norms, sandwich norms, gelu_and_mul, softcapped loss)
    ref, patched = twins("gemma3_text", **{option: False})
    layer = patched.model.layers[0]
    untouched = {"rms_norm": not isinstance(layer.input_layernorm, torchops.nn.RMSNorm),
                 "rope": "forward" not in layer.self_attn.__dict__,
                 "mlp": "forward" not in layer.mlp.__dict__,
                 "fused_residual": "forward" not in layer.__dict__,
                 "loss": "forward" not in patched.__dict__}
    assert untouched[option]
    ids, labels = batch()
    torch.testing.assert_close(patched(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(patched(ids, labels=labels).loss, ref(ids, labels=labels).loss, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", ["mistral", "gemma3_text"])
def test_eager_attention_matches(model_type: str) -> None:
    """The attention forward hands the model's own eager_attention_forward (Gemma's softcapping) what it gets."""
    ref, patched = twins(model_type)
    for model in (ref, patched):
        model.config._attn_implementation = "eager"
    ids, labels = batch()
    torch.testing.assert_close(patched(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)
    out_ref, out = ref(ids, output_attentions=True), patched(ids, output_attentions=True)
    for expected, actual in zip(out_ref.attentions, out.attentions, strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_missing_attribute_names_the_option() -> None:
    model = tiny_model("llama")
    del model.model.layers[1].mlp.up_proj
    with pytest.raises(RuntimeError, match=r"LlamaMLP has no up_proj: the mlp patch follows transformers .*mlp=False"):
        tt.patch(model)
    assert not tt.is_patched(model)
    assert not any("forward" in m.__dict__ for m in model.modules())  # what it did before raising is undone
    assert not any(isinstance(m, torchops.nn.RMSNorm) for m in model.modules())


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_num_items_in_batch_shift_labels_and_tuple_output(model_type: str) -> None:
    ref, patched = twins(model_type)
    ids, labels = batch()
    n = torch.tensor(57)
    for kwargs in (dict(labels=labels, num_items_in_batch=n),
                   dict(labels=labels, shift_labels=torch.roll(labels, -1, 1)),
                   dict(labels=labels, return_dict=False)):
        expected, actual = ref(ids, **kwargs), patched(ids, **kwargs)
        if isinstance(expected, tuple):
            assert len(actual) == len(expected) - 1  # no logits
            expected, actual = expected[0], actual[0]
        else:
            expected, actual = expected.loss, actual.loss
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", TYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_greedy_generate_with_kv_cache_is_identical(device: str, model_type: str) -> None:
    ref, patched = twins(model_type, device=device)
    ids, _ = batch(device, b=2, s=7)
    mask = torch.ones_like(ids)
    kwargs = dict(attention_mask=mask, max_new_tokens=20, min_new_tokens=20, do_sample=False, use_cache=True,
                  pad_token_id=0)
    expected = ref.generate(ids, **kwargs)
    actual = patched.generate(ids, **kwargs)
    assert actual.shape == (2, 27)
    assert torch.equal(actual, expected)


@pytest.mark.parametrize("model_type", TYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_bf16_loss_matches(device: str, model_type: str) -> None:
    ref, patched = twins(model_type, torch.bfloat16, device)
    ids, labels = batch(device)
    torch.testing.assert_close(patched(ids, labels=labels).loss, ref(ids, labels=labels).loss, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_float32_model_under_bf16_autocast(model_type: str) -> None:
    """Mixed precision as Trainer(bf16=True) runs it: float32 weights, bf16 autocast; the ops' autocast policies
    take the float32 residual stream and rotary tables beside bf16 projections."""
    ref, patched = twins(model_type)
    ids, labels = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, actual = ref(ids, labels=labels).loss, patched(ids, labels=labels).loss
    torch.testing.assert_close(actual, expected, rtol=1e-2, atol=1e-2)
    actual.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in patched.parameters())


def _compiled_training_step(model, ids, labels) -> tuple[float, int]:
    """One compiled forward/backward/SGD step: the loss and the graph breaks dynamo counted."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = compiled(ids, labels=labels).loss
    loss.backward()
    opt.step()
    return loss.item(), sum(counters["graph_break"].values())


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_compiled_training_step_breaks_no_more_than_unpatched(model_type: str) -> None:
    ref, patched = twins(model_type)
    ids, labels = batch()
    loss_ref, breaks_ref = _compiled_training_step(ref, ids, labels)
    loss, breaks = _compiled_training_step(patched, ids, labels)
    assert breaks <= breaks_ref, f"patched: {breaks} graph breaks, unpatched: {breaks_ref}"
    assert abs(loss - loss_ref) < 1e-5
    torch.testing.assert_close(dict(patched.named_parameters())["model.layers.0.mlp.up_proj.weight"],
                               dict(ref.named_parameters())["model.layers.0.mlp.up_proj.weight"], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_compiled_patched_model_calls_the_torchops_ops() -> None:
    import torch._dynamo

    _, patched = twins("gemma3_text")
    ids, labels = batch()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(patched)(ids, labels=labels)
    targets = {str(node.target) for g in explanation.graphs for node in g.graph.nodes if node.op == "call_function"}
    for op in ("rms_norm", "add_rms_norm", "gelu_and_mul", "qk_norm_rope", "linear_cross_entropy"):
        assert f"myns.{op}.default" in targets, (op, sorted(t for t in targets if "myns" in t))


@pytest.mark.parametrize("model_type", TYPES)
def test_save_pretrained_round_trip_into_an_unpatched_model(model_type: str, tmp_path) -> None:
    ref, patched = twins(model_type)
    assert patched.state_dict().keys() == ref.state_dict().keys()
    patched.save_pretrained(tmp_path)
    loaded = type(ref).from_pretrained(tmp_path)
    assert not tt.is_patched(loaded)
    ids, _ = batch()
    torch.testing.assert_close(loaded(ids).logits, patched(ids).logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loaded(ids).logits, ref(ids).logits, rtol=0, atol=0)
    for key, value in ref.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_unpatch_restores_the_model() -> None:
    model = tiny_model("gemma3_text")
    ids, labels = batch()
    before = {name: type(m) for name, m in model.named_modules()}
    expected = model(ids).logits
    norm_weight = model.model.norm.weight
    tt.patch(model)
    assert model.model.norm.weight is norm_weight  # the same Parameter
    assert tt.is_patched(model)
    assert tt.unpatch(model) is model and not tt.is_patched(model)
    assert {name: type(m) for name, m in model.named_modules()} == before
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert model.model.norm.weight is norm_weight
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    assert model(ids, labels=labels).logits is not None
    tt.unpatch(model)  # a second unpatch does nothing


def test_deepcopy_of_a_patched_model_is_patched_and_unpatches_alone() -> None:
    ref, patched = twins("qwen3")
    ids, labels = batch()
    twin = copy.deepcopy(patched)
    assert tt.is_patched(twin) and twin(ids, labels=labels).logits is None
    assert twin.model.layers[0].mlp.forward.__self__ is twin.model.layers[0].mlp
    tt.unpatch(twin)
    torch.testing.assert_close(twin(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)
    assert tt.is_patched(patched) and patched(ids, labels=labels).logits is None


def test_patch_twice_and_optimizer_made_before_patch() -> None:
    ref, model = twins("llama")
    tt.unpatch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    tt.patch(model, loss=False)
    tt.patch(model)  # replaces the earlier patch
    ids, labels = batch()
    model(ids, labels=labels).loss.backward()
    opt.step()
    before = ref.model.norm.weight.detach().clone()
    assert not torch.equal(model.model.norm.weight, before)  # the optimizer updated the patched norm's weight


def test_other_instances_run_exactly_as_before() -> None:
    modeling = importlib.import_module("transformers.models.llama.modeling_llama")
    functions = {name: getattr(modeling, name) for name in ("apply_rotary_pos_emb", "rotate_half",
                                                           "eager_attention_forward")}
    classes = {cls: dict(vars(cls)) for cls in (modeling.LlamaAttention, modeling.LlamaMLP, modeling.LlamaRMSNorm,
                                                modeling.LlamaDecoderLayer, modeling.LlamaForCausalLM)}
    before = tiny_model("llama", seed=3)
    ids, labels = batch()
    expected = before(ids).logits
    expected_loss = before(ids, labels=labels).loss
    tt.patch(tiny_model("llama", seed=3))
    after = tiny_model("llama", seed=3)
    for other in (before, after):
        assert not any(isinstance(m, torchops.nn.RMSNorm) for m in other.modules())
        assert not any("forward" in m.__dict__ for m in other.modules())
        assert torch.equal(other(ids).logits, expected)
        assert torch.equal(other(ids, labels=labels).loss, expected_loss)
    assert {name: getattr(modeling, name) for name in functions} == functions
    assert {cls: dict(vars(cls)) for cls in classes} == classes


def test_unsupported_type_raises_listing_the_supported_ones() -> None:
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2, vocab_size=100)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match=r"model type 'gpt2' .* supported: llama, mistral, qwen2, qwen3, gemma3_text"):
        tt.patch(model)
    with pytest.raises(ValueError, match="not supported"):
        tt.patch(torch.nn.Linear(2, 2))
    assert not tt.is_patched(model)


def test_bare_model_is_patched_too() -> None:
    torch.manual_seed(0)
    ref = transformers.AutoModel.from_config(tiny_config("mistral"), attn_implementation="sdpa")
    model = transformers.AutoModel.from_config(tiny_config("mistral"), attn_implementation="sdpa")
    model.load_state_dict(ref.state_dict())
    tt.patch(model)
    ids, _ = batch()
    torch.testing.assert_close(model(ids).last_hidden_state, ref(ids).last_hidden_state, rtol=1e-5, atol=1e-5)


def test_import_torchops_does_not_import_transformers() -> None:
    out = run_python("""
        import json, sys
        import torch
        import torchops
        print(json.dumps(["transformers" in sys.modules, "torchops.transformers" in sys.modules]))
    """)
    assert json.loads(out.splitlines()[-1]) == [False, False]



def test_the_benchmark_runs_its_cpu_path(tmp_path, monkeypatch) -> None:
    """benchmarks/bench_transformers.py (its bars are the H200's): the CPU smoke run checks and measures every row."""
    sys.path.insert(0, REPO_ROOT)
    from benchmarks import bench_transformers, harness

    monkeypatch.setattr(harness, "time_all_ms",
                        lambda fns, device, quick=False: {name: (fn(), 1.0)[1] for name, fn in fns.items()})
    argv = ["--device", "cpu", "--out-dir", str(tmp_path), "--threads", str(torch.get_num_threads())]
    assert harness.main(bench_transformers.BENCH, argv) == 0
    _, rows = harness.load(tmp_path / "transformers_cpu.json")
    assert {(r.case, r.impl) for r in rows} == {(c, i) for c in ("train step", "generate") for i in ("eager", "torchops")}
    assert all(r.extra["tokens_equal_to_eager"] == 8 for r in rows if r.case == "generate")
