"""torchops inside Hugging Face transformers models, in one line: ``torchops.transformers.patch(model)``.

    >>> model = AutoModelForCausalLM.from_pretrained(...)   # llama, mistral, qwen2, qwen3 or gemma3_text
    >>> torchops.transformers.patch(model)                  # this instance only; unpatch(model) undoes it

What is replaced (each part can be switched off by its keyword):

- ``rms_norm``: every RMSNorm module becomes :class:`torchops.nn.RMSNorm` holding the *same* weight Parameter
  (Gemma's ``1 + w`` through ``weight_offset=1.0``), so the state_dict keeps its keys and values and an
  optimizer made before the patch still updates it;
- ``mlp``: ``act(gate_proj(x)) * up_proj(x)`` becomes :func:`torchops.swiglu` (``silu``) or
  :func:`torchops.gelu_and_mul` (``gelu_pytorch_tanh``: ``approximate="tanh"``; ``gelu``: exact);
- ``fused_residual``: in each decoder layer the residual add before the MLP's norm and the norm itself are
  one :func:`torchops.add_rms_norm`;
- ``rope``: the attention's ``apply_rotary_pos_emb`` becomes :func:`torchops.apply_rotary_pos_emb`; for the
  models with per-head q/k norms (qwen3, gemma3_text) the two norms and the rotation are one
  :func:`torchops.qk_norm_rope` when ``rms_norm`` is on too (with ``rms_norm=False`` the norms stay the
  model's own modules);
- ``loss``: a ``...ForCausalLM`` called with ``labels`` computes the causal-LM loss by
  :func:`torchops.linear_cross_entropy` from the final hidden states, never materialising the logits
  (transformers' label shift or ``shift_labels``, ``ignore_index``, ``num_items_in_batch``, Gemma's
  ``final_logit_softcapping``); ``outputs.logits`` is then None. Without labels the model runs as before.

Only the given instance changes: modules are swapped and per-instance ``forward`` methods set, while
transformers' classes and module-level functions are left as they are, so other models in the process run
exactly as before. The per-instance forwards follow the pinned transformers release (requirements-dev.txt);
:func:`patch` checks the attributes it relies on and raises if a model does not have them.

This module imports transformers; ``import torchops`` does not import this module.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import torchops
from torchops.nn import RMSNorm

__all__ = ["SUPPORTED_MODEL_TYPES", "is_patched", "patch", "unpatch"]


@dataclasses.dataclass(frozen=True)
class _Spec:
    """What differs between the supported model types' modeling files."""

    package: str  # transformers.models.<package>.modeling_<package>
    prefix: str  # class-name prefix: <prefix>RMSNorm, <prefix>MLP, <prefix>Attention, <prefix>DecoderLayer
    norm_offset: float  # Gemma scales by 1 + w
    gemma_layer: bool  # Gemma's sandwich norms (post-attention and pre/post-feedforward)
    qk_norm: bool  # per-head q_norm / k_norm before the rotation
    sliding_window: str  # what the attention passes as sliding_window: "none", "config" or "attr"
    act_attr: str  # the config attribute naming the MLP's activation


_SPECS: dict[str, _Spec] = {
    "llama": _Spec("llama", "Llama", 0.0, False, False, "none", "hidden_act"),
    "mistral": _Spec("mistral", "Mistral", 0.0, False, False, "config", "hidden_act"),
    "qwen2": _Spec("qwen2", "Qwen2", 0.0, False, False, "attr", "hidden_act"),
    "qwen3": _Spec("qwen3", "Qwen3", 0.0, False, True, "attr", "hidden_act"),
    "gemma3_text": _Spec("gemma3", "Gemma3", 1.0, True, True, "attr", "hidden_activation"),
}

#: The transformers release whose modeling code the replacement forwards follow (requirements-dev.txt pins it).
TESTED_TRANSFORMERS = "5.23.0"

#: The ``config.model_type`` values :func:`patch` accepts.
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(_SPECS)

# The MLP activations with a fused torchops op: config name -> gelu_and_mul's approximate (None: swiglu).
_GATED_ACTS: dict[str, str | None] = {"silu": None, "swish": None, "gelu_pytorch_tanh": "tanh", "gelu": "none"}

_RECORD = "_torchops_patch"  # the model attribute holding what unpatch() restores


# ---------------------------------------------------------------------------------------------------- forwards


def _norm_args(norm: nn.Module, offset: float) -> tuple[Tensor, float, float]:
    """(weight, eps, weight_offset) of an RMSNorm module, torchops' or the model's own."""
    if isinstance(norm, RMSNorm):
        return norm.weight, norm.eps, norm.weight_offset
    eps = getattr(norm, "variance_epsilon", None)
    return norm.weight, getattr(norm, "eps", 1e-6) if eps is None else eps, offset


def _make_mlp_forward(approximate: str | None) -> Callable[..., Tensor]:
    if approximate is None:
        def forward(self: nn.Module, x: Tensor) -> Tensor:
            return self.down_proj(torchops.swiglu(self.gate_proj(x), self.up_proj(x)))
    else:
        def forward(self: nn.Module, x: Tensor) -> Tensor:
            return self.down_proj(torchops.gelu_and_mul(self.gate_proj(x), self.up_proj(x), approximate))
    return forward


def _make_decoder_forward(spec: _Spec) -> Callable[..., Tensor]:
    """The decoder layer's forward with the residual add before the MLP's norm fused into that norm."""
    offset = spec.norm_offset
    if spec.gemma_layer:
        def forward(self: nn.Module, hidden_states: Tensor, **kwargs: Any) -> Tensor:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
            hidden_states, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
            hidden_states = self.post_attention_layernorm(hidden_states)
            weight, eps, off = _norm_args(self.pre_feedforward_layernorm, offset)
            hidden_states, residual = torchops.add_rms_norm(hidden_states, residual, weight, eps, weight_offset=off)
            hidden_states = self.mlp(hidden_states)
            hidden_states = self.post_feedforward_layernorm(hidden_states)
            return residual + hidden_states
    else:
        def forward(self: nn.Module, hidden_states: Tensor, **kwargs: Any) -> Tensor:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
            hidden_states, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
            weight, eps, off = _norm_args(self.post_attention_layernorm, offset)
            hidden_states, residual = torchops.add_rms_norm(hidden_states, residual, weight, eps, weight_offset=off)
            hidden_states = self.mlp(hidden_states)
            return residual + hidden_states
    return forward


def _make_attention_forward(spec: _Spec, modeling: types.ModuleType, fuse_qk_norm: bool) -> Callable[..., Any]:
    """The attention's forward as transformers writes it, the rotation (and the q/k norms) by torchops."""
    eager_attention_forward = modeling.eager_attention_forward
    attention_functions = modeling.ALL_ATTENTION_FUNCTIONS
    offset = spec.norm_offset
    qk_norm = spec.qk_norm
    sliding = spec.sliding_window

    def forward(self: nn.Module, hidden_states: Tensor, position_embeddings: tuple[Tensor, Tensor] | None = None,
                attention_mask: Tensor | None = None, past_key_values: Any = None,
                **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        if qk_norm and fuse_qk_norm:
            q_weight, eps, off = _norm_args(self.q_norm, offset)
            k_weight, _, _ = _norm_args(self.k_norm, offset)
            query_states, key_states = torchops.qk_norm_rope(query_states, key_states, q_weight, k_weight, cos, sin,
                                                             eps, weight_offset=off)
        else:
            if qk_norm:
                query_states = self.q_norm(query_states)
                key_states = self.k_norm(key_states)
            query_states, key_states = torchops.apply_rotary_pos_emb(query_states, key_states, cos, sin)

        if past_key_values is not None:
            key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx)

        attention_interface = attention_functions.get_interface(self.config._attn_implementation,
                                                                eager_attention_forward)
        if sliding == "attr":
            kwargs["sliding_window"] = self.sliding_window
        elif sliding == "config":
            kwargs["sliding_window"] = getattr(self.config, "sliding_window", None)
        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask,
            dropout=self.attention_dropout if self.training else 0.0, scaling=self.scaling, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights

    return forward


def causal_lm_loss(hidden_states: Tensor, lm_head: nn.Linear, labels: Tensor, *, softcap: float | None = None,
                   num_items_in_batch: Tensor | int | None = None, ignore_index: int = -100,
                   shift_labels: Tensor | None = None, **kwargs: Any) -> Tensor:
    """transformers' ``ForCausalLMLoss`` of ``lm_head(hidden_states)`` (softcapped), computed by
    :func:`torchops.linear_cross_entropy` without the logits: tokens ``< n`` predict ``n`` (or
    ``shift_labels``), ``ignore_index`` left out, summed and divided by ``num_items_in_batch`` when that is
    given (gradient accumulation), else the mean. The loss is float32, as transformers'."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    shift_labels = shift_labels.to(hidden_states.device)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = torchops.linear_cross_entropy(hidden_states, lm_head.weight, shift_labels, linear_bias=lm_head.bias,
                                         reduction=reduction, ignore_index=ignore_index, softcap=softcap).float()
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def _make_causal_lm_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """The ...ForCausalLM forward: with labels, the loss from the hidden states and no logits; else original."""
    from transformers.modeling_outputs import CausalLMOutputWithPast
    from transformers.modeling_utils import slice_logits_to_keep
    from transformers.utils import can_return_tuple

    @can_return_tuple
    def forward(self: nn.Module, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, past_key_values: Any = None, inputs_embeds: Tensor | None = None,
                labels: Tensor | None = None, use_cache: bool | None = None, logits_to_keep: int | Tensor = 0,
                **kwargs: Any) -> Any:
        if labels is None:
            return original(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                            logits_to_keep=logits_to_keep, **kwargs)
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                             **kwargs)
        hidden_states = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)
        loss = causal_lm_loss(hidden_states, self.lm_head, labels,
                              softcap=getattr(self.config, "final_logit_softcapping", None), **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=outputs.past_key_values,
                                      hidden_states=outputs.hidden_states, attentions=outputs.attentions)

    return forward


# ---------------------------------------------------------------------------------------------- patch / unpatch


@dataclasses.dataclass
class _Record:
    """What patch() changed, in order, for unpatch(): swapped modules and per-instance forwards."""

    modules: list[tuple[nn.Module, str, nn.Module]] = dataclasses.field(default_factory=list)
    forwards: list[tuple[nn.Module, str, Any]] = dataclasses.field(default_factory=list)  # None: had none
    options: dict[str, bool] = dataclasses.field(default_factory=dict)


def _set_forward(record: _Record, module: nn.Module, fn: Callable[..., Any]) -> None:
    """Give ``module`` its own forward. A module that accelerate hooked (device_map) keeps its hook: the hook
    calls ``_old_forward``, which is then what is replaced."""
    attr = "_old_forward" if "_old_forward" in module.__dict__ else "forward"
    record.forwards.append((module, attr, module.__dict__.get(attr)))  # (None, not a sentinel: deepcopy keeps it)
    setattr(module, attr, types.MethodType(fn, module))


def _current_forward(module: nn.Module) -> Callable[..., Any]:
    attr = "_old_forward" if "_old_forward" in module.__dict__ else "forward"
    return getattr(module, attr)


def _require(module: nn.Module, names: tuple[str, ...], option: str) -> None:
    """Raise, naming ``option``, if ``module`` lacks an attribute the replacement forward reads."""
    missing = [n for n in names if not hasattr(module, n)]
    if missing:
        raise RuntimeError(f"torchops.transformers.patch: {type(module).__name__} has no {', '.join(missing)}: the "
                           f"{option} patch follows transformers {TESTED_TRANSFORMERS}'s modeling code, not this "
                           f"release's ({_transformers_version()}); pass {option}=False to leave that part as it is")


def _transformers_version() -> str:
    return getattr(sys.modules.get("transformers"), "__version__", "?")


def _spec_of(model: nn.Module) -> _Spec:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in _SPECS:
        raise ValueError(f"torchops.transformers.patch: model type {model_type!r} ({type(model).__name__}) is not "
                         f"supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    return _SPECS[model_type]


def is_patched(model: nn.Module) -> bool:
    """Whether :func:`patch` has patched this instance (and :func:`unpatch` not yet restored it)."""
    return _RECORD in model.__dict__


def patch(model: nn.Module, *, rms_norm: bool = True, rope: bool = True, mlp: bool = True,
          fused_residual: bool = True, loss: bool = True) -> nn.Module:
    """Patch a transformers model instance in place to run on torchops ops, and return it.

    Args:
        model: a ``...ForCausalLM`` or the bare ``...Model`` (``...TextModel``) of a supported model type
            (:data:`SUPPORTED_MODEL_TYPES`: llama, mistral, qwen2, qwen3, gemma3_text); anything else raises
            a ValueError naming them.
        rms_norm: RMSNorm modules -> :class:`torchops.nn.RMSNorm` with the same weight Parameters.
        rope: the rotary embedding (with ``rms_norm``, and q/k norms, Qwen3's and Gemma 3's ``qk_norm_rope``).
        mlp: the gated activation -> ``torchops.swiglu`` / ``torchops.gelu_and_mul`` (activations without
            a fused op are left as they are).
        fused_residual: the residual add before the MLP's norm -> ``torchops.add_rms_norm``.
        loss: with ``labels``, the causal-LM loss by ``torchops.linear_cross_entropy`` from the hidden
            states; ``outputs.logits`` is then None. (A model whose ``loss_function`` was replaced keeps it.)

    Patching a patched model first undoes the earlier patch. The state_dict is unchanged, so checkpoints
    saved from a patched model load into unpatched ones and back. Only this instance changes.
    """
    spec = _spec_of(model)
    if is_patched(model):
        unpatch(model)
    modeling = importlib.import_module(f"transformers.models.{spec.package}.modeling_{spec.package}")
    norm_cls = getattr(modeling, f"{spec.prefix}RMSNorm")
    mlp_cls = getattr(modeling, f"{spec.prefix}MLP")
    attention_cls = getattr(modeling, f"{spec.prefix}Attention")
    layer_cls = getattr(modeling, f"{spec.prefix}DecoderLayer")
    record = _Record(options=dict(rms_norm=rms_norm, rope=rope, mlp=mlp, fused_residual=fused_residual, loss=loss))
    config = model.config
    try:
        if rms_norm:
            for parent in list(model.modules()):
                for name, child in list(parent.named_children()):
                    if type(child) is norm_cls:
                        _require(child, ("weight",), "rms_norm")
                        _, eps, offset = _norm_args(child, spec.norm_offset)
                        new = RMSNorm(child.weight.shape, eps=eps, weight_offset=offset, device="meta")
                        new.weight = child.weight  # the same Parameter: state_dict and optimizers see no change
                        new.train(child.training)
                        record.modules.append((parent, name, child))
                        setattr(parent, name, new)
        if mlp:
            act = getattr(config, spec.act_attr, None)
            if act in _GATED_ACTS:
                forward = _make_mlp_forward(_GATED_ACTS[act])
                for module in model.modules():
                    if type(module) is mlp_cls:
                        _require(module, ("gate_proj", "up_proj", "down_proj"), "mlp")
                        _set_forward(record, module, forward)
        if rope:
            forward = _make_attention_forward(spec, modeling, fuse_qk_norm=rms_norm)
            for module in model.modules():
                if type(module) is attention_cls:
                    needs = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling", "attention_dropout",
                             "layer_idx", "config")
                    needs += ("q_norm", "k_norm") if spec.qk_norm else ()
                    needs += ("sliding_window",) if spec.sliding_window == "attr" else ()
                    _require(module, needs, "rope")
                    _set_forward(record, module, forward)
        if fused_residual:
            forward = _make_decoder_forward(spec)
            norms = ("pre_feedforward_layernorm", "post_feedforward_layernorm") if spec.gemma_layer else ()
            for module in model.modules():
                if type(module) is layer_cls:
                    _require(module, ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp") + norms,
                             "fused_residual")
                    _set_forward(record, module, forward)
        if loss and hasattr(model, "lm_head") and hasattr(model, "model") and "_loss_function" not in model.__dict__:
            _set_forward(record, model, _make_causal_lm_forward(_current_forward(model)))
    except BaseException:
        _restore(record)
        raise
    model.__dict__[_RECORD] = record
    return model


def _restore(record: _Record) -> None:
    for module, attr, previous in reversed(record.forwards):
        if previous is None:
            delattr(module, attr)
        else:
            setattr(module, attr, previous)
    for parent, name, original in reversed(record.modules):
        original.train(getattr(parent, name).training)
        setattr(parent, name, original)


def unpatch(model: nn.Module) -> nn.Module:
    """Undo :func:`patch` on this instance (the model's own modules and forwards back, the same weights), and
    return it. A model that is not patched is returned as it is."""
    record = model.__dict__.pop(_RECORD, None)
    if record is not None:
        _restore(record)
    return model
