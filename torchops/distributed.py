"""DTensor support for the myns ops: sharding rules, a sequence-parallel RMSNorm style, a row-sharded spmm.

``import torchops.distributed`` registers a sharding rule for every ``torch.ops.myns`` op with DTensor
(:func:`register_sharding_rules`, idempotent), so the ops take DTensor inputs under tensor / sequence
parallelism (``parallelize_module``) and FSDP2 (``fully_shard``): forward, backward, ``no_grad`` /
``inference_mode`` and ``torch.compile``. ``import torchops`` alone does not import
``torch.distributed.tensor`` (it is slow to import); this module does.

The rules, per op (on each mesh dimension; DTensor picks the cheapest rule for the inputs it is given and
redistributes the inputs that don't match it):

- Pointwise ops (declared ``Pointwise`` in csrc/ops.cpp, so tagged ``torch.Tag.pointwise``: ``vector_add``,
  ``swiglu``, ``swiglu_backward``, ...) need no rule of their own: every input ``Shard(d)`` (any d) or every
  input ``Replicate`` -> the same on the outputs; where the definition declares the op linear in some
  inputs, ``Partial`` passes through them (``vector_add`` of two ``Partial`` inputs, ``swiglu_backward``
  with ``grad_out`` ``Partial``, the others ``Replicate``). A pointwise op that writes an argument
  (``vector_add_out``) writes it as it is placed: the other inputs are redistributed to its placements,
  it never is.
- The norms (``rms_norm``, ``add_rms_norm``, ``layer_norm``), their internal forward ops and their backward
  ops: ``Shard(d)`` on any dimension but the last (the normalised one) -> the same on the outputs and on
  the row statistics (``rstd``, ``mean``); a ``Shard`` of the last dimension is redistributed (every rule
  shards another dimension or replicates); ``weight`` and ``bias`` are ``Replicate``; ``grad_weight`` and
  ``grad_bias`` come out ``Partial(sum)`` when the rows are sharded (each rank sums over its own rows),
  ``Replicate`` when nothing is. The backward ops are linear in the incoming gradients, so ``Partial``
  gradients pass through them.
- The sparse ops (``csr_spmm``, ``spmm_reduce``, ``_csr_spmm_with_transpose``, ``_spmm_reduce_forward``,
  ``sddmm``, ``csr_softmax``): the structure (index tensors) is ``Replicate``. The products: ``dense``
  ``Replicate`` -> ``Replicate``; ``dense`` sharded on its last dimension (features, every reduce being per
  column) -> the result likewise; a 3-D dense sharded on its heads (dim 1), ``(nnz, H)`` values alike ->
  heads-sharded; for sum and mean (linear), ``Partial`` values or dense -> ``Partial``. ``sddmm``: heads
  ``Shard(1)`` -> ``Shard(1)``; "dot" with both operands sharded on the summed last dimension -> ``Partial``;
  ``Partial`` operands where the op is linear in them. ``csr_softmax`` (and its backward): heads ``Shard(1)``
  -> ``Shard(1)``. ``_csr_transpose`` and the max/min backward (``_spmm_reduce_backward``): ``Replicate``
  only. A *row-sharded* sparse matrix (each rank holding the CSR arrays of its own block of rows) is not a
  DTensor placement of the index tensors (each block's row offsets restart at 0 and its nonzeros are not an
  even split of the global ones): :func:`shard_csr_rows` builds such blocks and :func:`row_sharded_spmm`
  multiplies one by a DTensor, returning a ``Shard(0)`` DTensor.
- ``linear_cross_entropy``, ``cross_entropy`` and their internal ops: tokens ``Shard(d)`` on any dimension
  but the last (``input`` or ``logits`` and ``target`` alike: data / sequence parallel), ``linear_weight`` and
  ``linear_bias`` ``Replicate``; per-token outputs (``"none"`` losses, lse, grad_input) come out ``Shard(d)``,
  sums over tokens (``"sum"``, the weight's and bias's gradients) ``Partial``. ``"mean"`` divides by the
  count of non-ignored tokens of every shard: the Autograd kernels run it as sharded sums over that count
  (one small all-reduce), so the loss and gradients equal the single-process ones. A sharded
  ``linear_weight`` (vocab-parallel) raises, naming its placement.
- ``rotary_embedding``, ``_rotary_embedding_backward`` and ``qk_norm_rope`` (q and k ``[batch, heads, seq,
  head_dim]`` or ``[batch, seq, heads, head_dim]``, per ``unsqueeze_dim``): q and k ``Shard`` of the batch, heads or
  sequence dimension (alike) -> the same on the outputs, cos and sin sharded alike where they have that dimension
  (batch or seq larger than 1) and ``Replicate`` otherwise (heads); head_dim is never sharded (redistributed);
  qk_norm_rope's weights ``Replicate``. The rotation is linear: ``Partial`` q and k give ``Partial`` outputs
  (not qk_norm_rope, whose norm is not). ``_qk_norm_rope_backward``: the same, its weight gradients ``Partial``
  while rows are sharded; ``Partial`` incoming gradients (rows replicated) give ``Partial`` outputs.
- ``rotary_embedding_`` (in place): query and key keep their placements (``Shard(0)``, tokens; ``Shard(1)``, heads,
  whose local width must hold whole heads; or ``Replicate``), the cache is ``Replicate``. positions must come
  placed as the tokens are (``Shard(0)`` with them, else ``Replicate``): DTensor takes an op whose name ends in
  ``_`` to write its first argument, so it never redistributes positions either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding

import torchops  # registers the myns schemas

__all__ = [
    "CSRRowShard",
    "register_sharding_rules",
    "row_sharded_spmm",
    "shard_csr_rows",
    "sharding_rule_ops",
]

# An input placement per argument of the op's schema, None for non-tensor (or absent optional) arguments;
# the outputs' placements first. One mesh dimension: DTensor expands it to every dimension of the mesh.
PlacementList = list[Placement | None]
Strategy = tuple[PlacementList, PlacementList]


class _Args:
    """An op's arguments by schema name (defaults filled in), as DTensor hands them to a sharding rule.

    Rules look arguments up by name, never by position, so a schema that gains a trailing argument (say
    ``weight_offset``) needs no change here.
    """

    def __init__(self, op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.names = [a.name for a in op._schema.arguments]
        self.values: dict[str, Any] = {}
        for i, a in enumerate(op._schema.arguments):
            if i < len(args):
                self.values[a.name] = args[i]
            elif a.name in kwargs:
                self.values[a.name] = kwargs[a.name]
            else:
                self.values[a.name] = a.default_value if a.has_default_value() else None

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def is_tensor(self, name: str) -> bool:
        # DTensor passes its spec (shape, placements) in place of each DTensor argument.
        return hasattr(self.values[name], "placements")

    def ndim(self, name: str) -> int:
        return len(self.values[name].shape)

    def placements(self, by_name: dict[str, Placement]) -> PlacementList:
        """The input placement list: ``by_name`` for the given tensors, None for everything else."""
        out: PlacementList = []
        for n in self.names:
            if self.is_tensor(n):
                if n not in by_name:
                    raise AssertionError(f"sharding rule gives no placement for tensor argument {n!r}")
                out.append(by_name[n])
            else:
                out.append(None)
        return out


def _tensors(args: _Args) -> list[str]:
    return [n for n in args.names if args.is_tensor(n)]


# ---------------------------------------------------------------------------------------------------------
# Elementwise ops: all inputs alike.


def _elementwise(op: torch._ops.OpOverload, n_out: int, linear: Sequence[str] | None) -> Callable[..., list[Strategy]]:
    """Every tensor input Shard(d) / Replicate -> n_out outputs the same.

    linear: the inputs the op is linear in jointly (``None``: not linear in any): those ``Partial`` with the
    others ``Replicate`` -> every output ``Partial``.
    """

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        names = _tensors(args)
        ndim = args.ndim(names[0])
        rules: list[Strategy] = [([Replicate()] * n_out, args.placements({n: Replicate() for n in names}))]
        for d in range(ndim):
            rules.append(([Shard(d)] * n_out, args.placements({n: Shard(d) for n in names})))
        if linear is not None:
            by = {n: (Partial() if n in linear else Replicate()) for n in names}
            rules.append(([Partial()] * n_out, args.placements(by)))
        return rules

    return rule


def _written_keeps_placement(op: torch._ops.OpOverload) -> Callable[..., list[Strategy]]:
    # A pointwise op writing arguments in place (out=): they must keep their placements (DTensor would
    # otherwise write into redistributed copies): a rule per placement of the first, every other tensor
    # following it. On a mesh of several dimensions the rules combine across dimensions;
    # _keep_mutated_placements drops the combinations that would move a written argument.
    written = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if op._schema.returns:
        raise AssertionError(f"{op}: the generic pointwise rule handles written arguments and no return")

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        seen: list[Placement] = []
        for p in args[written[0]].placements:
            if p not in seen:
                seen.append(p)
        return [([], args.placements({n: p for n in _tensors(args)})) for p in seen]

    return rule


def _pointwise(op: torch._ops.OpOverload) -> Callable[..., list[Strategy]]:
    """The rule of every op tagged pointwise, from what its definition declares (torchops._C.declarations())."""
    if op._schema.is_mutable:
        return _written_keeps_placement(op)
    declared = torchops._C.declarations().get(_name(op), {})
    linear = declared.get("linear_in") or None
    return _elementwise(op, len(op._schema.returns), linear)


# ---------------------------------------------------------------------------------------------------------
# Row normalisation: rows may be sharded on any dimension but the last; weight replicated.


_NORM_PARAMS = ("weight", "bias")  # per-element parameters of the normalised dimension: replicated


def _present(args: _Args, names: Sequence[str]) -> list[str]:
    return [n for n in names if n in args.values and args.is_tensor(n)]


def _norm_forward(op: torch._ops.OpOverload, outputs: Sequence[str]) -> Callable[..., list[Strategy]]:
    """The norms' forward ops. outputs: 'row' (shaped like input) or 'stat' (input.shape[:-1]); both are
    placed as the rows are."""

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        rows = _present(args, ("input", "residual"))
        ndim = args.ndim("input")
        rules: list[Strategy] = []
        for d in [None, *range(ndim - 1)]:
            p = Replicate() if d is None else Shard(d)
            by = {n: p for n in rows}
            by.update({n: Replicate() for n in _present(args, _NORM_PARAMS)})
            rules.append(([p] * len(outputs), args.placements(by)))
        return rules

    return rule


def _norm_backward(op: torch._ops.OpOverload) -> Callable[..., list[Strategy]]:
    """The norms' backward ops: (grad_input, grad_weight[, grad_bias]), by the schema's return names.

    The saved row tensors (input or residual_out, mean, rstd) and the incoming gradients are sharded alike;
    grad_weight and grad_bias, sums over rows, are Partial when rows are sharded. Every output is linear in
    the incoming gradients: Partial ones (rows replicated) give Partial outputs. An output the call does not
    ask for (its flag false; grad_weight without a weight) is a [0]-shaped placeholder, Replicate.
    """
    returns = [r.name for r in op._schema.returns]

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        grads = _present(args, ("grad_out", "grad_residual_out"))
        saved = _present(args, ("input", "residual_out", "mean", "rstd"))
        ndim = args.ndim(saved[0])
        asked = {"grad_input": bool(args.values.get("input_grad", True)),
                 "grad_weight": bool(args["weight_grad"]) and args.is_tensor("weight"),
                 "grad_bias": bool(args.values.get("bias_grad", False))}
        rules: list[Strategy] = []

        def add(grad_p: Placement, row_p: Placement, param_grad_p: Placement) -> None:
            by = {n: grad_p for n in grads}
            by.update({n: row_p for n in saved})
            by.update({n: Replicate() for n in _present(args, _NORM_PARAMS)})
            placed = {"grad_input": grad_p, "grad_weight": param_grad_p, "grad_bias": param_grad_p}
            rules.append(([placed[r] if asked[r] else Replicate() for r in returns], args.placements(by)))

        add(Replicate(), Replicate(), Replicate())
        for d in range(ndim - 1):
            add(Shard(d), Shard(d), Partial())
        add(Partial(), Replicate(), Partial())
        return rules

    return rule


# ---------------------------------------------------------------------------------------------------------
# CSR: the sparse operands are replicated; dense may be column-sharded.


_CSR_STRUCTURE = ("crow_indices", "col_indices", "t_crow_indices", "t_col_indices", "t_perm")


def _spmm_reduce(op: torch._ops.OpOverload) -> Callable[..., list[Strategy]]:
    """csr_spmm, spmm_reduce, _csr_spmm_with_transpose and _spmm_reduce_forward (its outputs, out and arg,
    placed alike): the structure replicated; dense replicated, sharded on its last dimension (every reduce
    works column by column) or on its heads (dim 1 of a 3-D dense, with (nnz, H) values sharded alike); sum and
    mean are linear in values and in dense, so Partial passes through either."""
    n_out = len(op._schema.returns)

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        structure = {n: Replicate() for n in _tensors(args) if n in _CSR_STRUCTURE}
        has_values = args.is_tensor("values")
        head_values = has_values and args.ndim("values") == 2
        last = args.ndim("dense") - 1

        def with_(values: Placement, dense: Placement) -> PlacementList:
            return args.placements({**structure, "dense": dense, **({"values": values} if has_values else {})})

        rules = [([Replicate()] * n_out, with_(Replicate(), Replicate())),
                 ([Shard(last)] * n_out, with_(Replicate(), Shard(last)))]
        if last == 2:
            rules.append(([Shard(1)] * n_out, with_(Shard(1) if head_values else Replicate(), Shard(1))))
        if n_out == 1 and args.values.get("reduce", "sum") in ("sum", "mean"):
            if has_values:
                rules.append(([Partial()], with_(Partial(), Replicate())))
            rules.append(([Partial()], with_(Replicate(), Partial())))
        return rules

    return rule


def _sddmm(op: torch._ops.OpOverload) -> Callable[..., list[Strategy]]:
    """One value per nonzero from a's and b's rows: heads Shard(1) -> Shard(1); "dot" sums over the last
    dimension, so operands sharded there give Partial sums; Partial operands where the op is linear in them
    ("dot" and "mul" in each, "add" in both together)."""

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        kind, ndim = args["op"], args.ndim("a")
        idx = {"crow_indices": Replicate(), "col_indices": Replicate()}

        def with_(pa: Placement, pb: Placement) -> PlacementList:
            return args.placements({**idx, "a": pa, "b": pb})

        rules = [([Replicate()], with_(Replicate(), Replicate()))]
        if ndim == (3 if kind == "dot" else 2):
            rules.append(([Shard(1)], with_(Shard(1), Shard(1))))
        if kind == "dot":
            rules.append(([Partial()], with_(Shard(ndim - 1), Shard(ndim - 1))))
        if kind == "add":
            rules.append(([Partial()], with_(Partial(), Partial())))
        else:
            rules += [([Partial()], with_(Partial(), Replicate())), ([Partial()], with_(Replicate(), Partial()))]
        return rules

    return rule


def _csr_softmax(op: torch._ops.OpOverload) -> Callable[..., list[Strategy]]:
    """csr_softmax and its backward: each head is its own softmax, so (nnz, H) tensors may be Shard(1)."""

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        per_nonzero = [n for n in _tensors(args) if n != "crow_indices"]

        def with_(p: Placement) -> PlacementList:
            return args.placements({"crow_indices": Replicate(), **{n: p for n in per_nonzero}})

        rules = [([Replicate()], with_(Replicate()))]
        if args.ndim("values") == 2:
            rules.append(([Shard(1)], with_(Shard(1))))
        return rules

    return rule


def _replicate_only(op: torch._ops.OpOverload) -> Callable[..., list[Strategy]]:
    n_out = len(op._schema.returns)

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        return [([Replicate()] * n_out, args.placements({n: Replicate() for n in _tensors(args)}))]

    return rule


# ---------------------------------------------------------------------------------------------------------
# Losses: tokens sharded (data / sequence parallel) on any dimension but the last; the classifier replicated.


def _refuse_sharded_weight(op: torch._ops.OpOverload, args: _Args) -> None:
    """A sharded linear_weight would leave each rank a slice of every token's logits (vocab-parallel), whose
    log-sum-exp these ops do not combine across ranks: raise, naming the placement, rather than gather it."""
    if "linear_weight" not in args.values or not args.is_tensor("linear_weight"):
        return
    for p in args["linear_weight"].placements:
        if isinstance(p, Shard):
            raise RuntimeError(
                f"myns::{_name(op)}: linear_weight is sharded ({p}) across the mesh, so each rank would hold part of "
                "every token's logits (vocab-parallel), which this op does not combine; replicate linear_weight "
                "(shard the tokens instead: Shard(0) of input and target)")


def _loss_forward(op: torch._ops.OpOverload, scores: str) -> Callable[..., list[Strategy]]:
    """linear_cross_entropy, _linear_cross_entropy_chunked (scores: input) and cross_entropy (scores: logits).

    Tokens Shard(d) (with target) -> "none": Shard(d), "sum": Partial. "mean" divides by the count of every
    shard's tokens, which no placement of a local mean expresses: Replicate only (the autograd kernels, which
    these reach under no_grad and with gradients, run it as the sum of _linear_cross_entropy_forward's sharded
    losses over a count summed across shards; only inference_mode calls this op under DTensor directly).
    """

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        _refuse_sharded_weight(op, args)
        reduction = args["reduction"]

        def by(p: Placement) -> PlacementList:
            placed = {scores: p, "target": p}
            for n in ("linear_weight", "linear_bias"):
                if n in args.values and args.is_tensor(n):
                    placed[n] = Replicate()
            return args.placements(placed)

        rules: list[Strategy] = [([Replicate()], by(Replicate()))]
        if reduction in ("none", "sum"):
            for d in range(args.ndim(scores) - 1):
                rules.append(([Shard(d) if reduction == "none" else Partial()], by(Shard(d))))
        return rules

    return rule


# Rotary embeddings: the rows (a head of a token) may be sharded by batch, heads or sequence, never along head_dim.


def _rotary_dims(args: _Args) -> tuple[int, int]:
    """(heads, seq): q's dimensions of each, from unsqueeze_dim (1: [b, h, s, d], 2: [b, s, h, d])."""
    heads = 2 if args["unsqueeze_dim"] == 2 else 1
    return heads, 3 - heads


def _rotary_splits(args: _Args) -> list[tuple[Placement, Placement]]:
    """(rows, cos and sin) placements: replicated, or the rows split by batch, heads or sequence with cos and sin
    split alike where they have that dimension (larger than 1; a size-1 one is broadcast, so replicated)."""
    heads, seq = _rotary_dims(args)
    cos = args["cos"].shape
    return [
        (Replicate(), Replicate()),
        (Shard(0), Shard(0) if cos[0] > 1 else Replicate()),
        (Shard(heads), Replicate()),
        (Shard(seq), Shard(1) if cos[1] > 1 else Replicate()),
    ]


def _rotary(op: torch._ops.OpOverload, rows: tuple[str, str], linear: bool) -> Callable[..., list[Strategy]]:
    """rotary_embedding (rows q, k), its backward (grad_q, grad_k) and qk_norm_rope (not linear: weights too)."""

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        weights = {n: Replicate() for n in ("q_weight", "k_weight") if n in args.values and args.is_tensor(n)}

        def with_(row: Placement, cos: Placement) -> PlacementList:
            return args.placements({rows[0]: row, rows[1]: row, "cos": cos, "sin": cos, **weights})

        rules: list[Strategy] = [([row, row], with_(row, cos)) for row, cos in _rotary_splits(args)]
        if linear:
            rules.append(([Partial(), Partial()], with_(Partial(), Replicate())))
        return rules

    return rule


def _linear_cross_entropy_forward(op: torch._ops.OpOverload) -> Callable[..., list[Strategy]]:
    """(loss, grad_input, grad_weight, grad_bias): tokens Shard(d) -> loss and grad_input Shard(d), the weight's
    and bias's gradients (sums over tokens) Partial; grad_scale Replicate. Outputs not asked for are
    [0]-shaped placeholders, Replicate."""

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        _refuse_sharded_weight(op, args)
        has_bias = args.is_tensor("linear_bias")
        wants = (bool(args["input_grad"]), bool(args["weight_grad"]), bool(args["bias_grad"]) and has_bias)

        def add(p: Placement, summed: Placement) -> Strategy:
            placed = {"input": p, "target": p, "linear_weight": Replicate()}
            for n in ("linear_bias", "grad_scale"):
                if args.is_tensor(n):
                    placed[n] = Replicate()
            outs = [p] + [q if want else Replicate() for q, want in zip((p, summed, summed), wants)]
            return outs, args.placements(placed)

        return [add(Replicate(), Replicate())] + [add(Shard(d), Partial()) for d in range(args.ndim("input") - 1)]

    return rule


def _linear_cross_entropy_backward(op: torch._ops.OpOverload) -> Callable[..., list[Strategy]]:
    """(grad_input, grad_weight, grad_bias): grad_loss sharded like the tokens -> grad_input Shard(d), the sums
    Partial; linear in grad_loss, so a Partial grad_loss (tokens replicated) gives Partial outputs."""

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        _refuse_sharded_weight(op, args)
        has_bias = args.is_tensor("linear_bias")
        wants = (bool(args["input_grad"]), bool(args["weight_grad"]), bool(args["bias_grad"]) and has_bias)

        def add(g: Placement, p: Placement, rows: Placement, summed: Placement) -> Strategy:
            placed = {"grad_loss": g, "input": p, "target": p, "linear_weight": Replicate()}
            if has_bias:
                placed["linear_bias"] = Replicate()
            outs = [q if want else Replicate() for q, want in zip((rows, summed, summed), wants)]
            return outs, args.placements(placed)

        rules = [add(Replicate(), Replicate(), Replicate(), Replicate())]
        rules += [add(Shard(d), Shard(d), Shard(d), Partial()) for d in range(args.ndim("input") - 1)]
        rules.append(add(Partial(), Replicate(), Partial(), Partial()))
        return rules

    return rule


def _qk_norm_rope_backward(op: torch._ops.OpOverload) -> Callable[..., list[Strategy]]:
    """(grad_q, grad_k, grad_q_weight, grad_k_weight): rows and incoming gradients split alike, the weights'
    gradients Partial while rows are split; a placeholder (a gradient not given or not asked for) Replicate."""

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        given = {s: args.is_tensor(f"grad_{s}_out") for s in "qk"}
        input_grad, weight_grad = bool(args["input_grad"]), bool(args["weight_grad"])
        rules: list[Strategy] = []

        def add(row: Placement, cos: Placement, grad: Placement, dweight: Placement) -> None:
            by: dict[str, Placement] = {f"grad_{s}_out": grad for s in "qk" if given[s]}
            by.update(q=row, k=row, cos=cos, sin=cos, q_weight=Replicate(), k_weight=Replicate())
            outs = [grad if given[s] and input_grad else Replicate() for s in "qk"]
            outs += [dweight if given[s] and weight_grad else Replicate() for s in "qk"]
            rules.append((outs, args.placements(by)))

        for row, cos in _rotary_splits(args):
            add(row, cos, row, Replicate() if row == Replicate() else Partial())
        add(Replicate(), Replicate(), Partial(), Partial())
        return rules

    return rule


def _cross_entropy_rows(op: torch._ops.OpOverload, row_inputs: Sequence[str], n_out: int,
                        linear_in: str | None = None) -> Callable[..., list[Strategy]]:
    """_cross_entropy_forward / _cross_entropy_backward: every per-token input (and the logits) Shard(d) ->
    every output Shard(d); `linear_in` (the backward's grad_loss) Partial with the rest Replicate -> Partial."""

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        names = [n for n in row_inputs if args.is_tensor(n)]
        rules: list[Strategy] = [([Replicate()] * n_out, args.placements({n: Replicate() for n in names}))]
        for d in range(args.ndim("logits") - 1):
            rules.append(([Shard(d)] * n_out, args.placements({n: Shard(d) for n in names})))
        if linear_in is not None:
            by = {n: Partial() if n == linear_in else Replicate() for n in names}
            rules.append(([Partial()] * n_out, args.placements(by)))
        return rules

    return rule


def _rotary_inplace(op: torch._ops.OpOverload) -> Callable[..., list[Strategy]]:
    """rotary_embedding_: query and key written where they are (_keep_mutated_placements drops the rest)."""

    def rule(*a: Any, **k: Any) -> list[Strategy]:
        args = _Args(op, a, k)
        has_key = args.is_tensor("key")
        choices = (Replicate(), Shard(0), Shard(1))
        rules: list[Strategy] = []
        for q in choices:
            for key in choices if has_key else (None,):
                if has_key and (q == Shard(0)) != (key == Shard(0)):
                    continue  # a split of the tokens splits the positions, so both or neither
                by = {"positions": Shard(0) if q == Shard(0) else Replicate(), "query": q, "cos_sin_cache": Replicate()}
                if has_key:
                    by["key"] = key
                rules.append(([], args.placements(by)))
        return rules

    return rule


# The rules of the ops that are not pointwise, by name (pointwise ops get _pointwise); a test fails for a
# myns op with neither.
_RULES: dict[str, Callable[[torch._ops.OpOverload], Callable[..., list[Strategy]]]] = {
    "rms_norm": lambda op: _norm_forward(op, ("row",)),
    "_rms_norm_forward": lambda op: _norm_forward(op, ("row", "stat")),
    "_rms_norm_backward": _norm_backward,
    "add_rms_norm": lambda op: _norm_forward(op, ("row", "row")),
    "_add_rms_norm_forward": lambda op: _norm_forward(op, ("row", "row", "stat")),
    "_add_rms_norm_backward": _norm_backward,
    "layer_norm": lambda op: _norm_forward(op, ("row",)),
    "_layer_norm_forward": lambda op: _norm_forward(op, ("row", "stat", "stat")),
    "_layer_norm_backward": _norm_backward,
    "csr_spmm": _spmm_reduce,
    "spmm_reduce": _spmm_reduce,
    "_csr_spmm_with_transpose": _spmm_reduce,
    "_spmm_reduce_forward": _spmm_reduce,
    "_spmm_reduce_backward": _replicate_only,
    "sddmm": _sddmm,
    "_csr_transpose": _replicate_only,
    "csr_softmax": _csr_softmax,
    "_csr_softmax_backward": _csr_softmax,
    "linear_cross_entropy": lambda op: _loss_forward(op, "input"),
    "_linear_cross_entropy_chunked": lambda op: _loss_forward(op, "input"),
    "_linear_cross_entropy_forward": _linear_cross_entropy_forward,
    "_linear_cross_entropy_backward": _linear_cross_entropy_backward,
    "cross_entropy": lambda op: _loss_forward(op, "logits"),
    "_cross_entropy_forward": lambda op: _cross_entropy_rows(op, ("logits", "target"), 2),
    "_cross_entropy_backward": lambda op: _cross_entropy_rows(op, ("grad_loss", "logits", "target", "lse"), 1,
                                                              linear_in="grad_loss"),
    "rotary_embedding": lambda op: _rotary(op, ("q", "k"), linear=True),
    "_rotary_embedding_backward": lambda op: _rotary(op, ("grad_q", "grad_k"), linear=True),
    "qk_norm_rope": lambda op: _rotary(op, ("q", "k"), linear=False),
    "_qk_norm_rope_backward": _qk_norm_rope_backward,
    "rotary_embedding_": _rotary_inplace,
}


def _name(op: torch._ops.OpOverload) -> str:
    return op._schema.name.split("::", 1)[1]


def rule_factory(op: torch._ops.OpOverload) -> Callable[[torch._ops.OpOverload], Callable[..., list[Strategy]]] | None:
    """What makes ``op``'s sharding rule: its ``_RULES`` row, else the pointwise rule when it is tagged
    pointwise, else None (no rule)."""
    if _name(op) in _RULES:
        return _RULES[_name(op)]
    if torch.Tag.pointwise in op.tags:
        return _pointwise
    return None


def _myns_ops() -> list[str]:
    return sorted(n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("myns::"))


def sharding_rule_ops() -> list[str]:
    """The names of the registered myns ops that have a sharding rule (a ``_RULES`` row, or pointwise)."""
    return [name for name in _myns_ops() if all(rule_factory(op) is not None for op in _myns_overloads(name))]


def _myns_overloads(name: str) -> list[torch._ops.OpOverload]:
    if not hasattr(torch.ops.myns, name):
        return []
    packet = getattr(torch.ops.myns, name)
    return [getattr(packet, o) for o in packet.overloads()]


def _cache_every_scalar(op: torch._ops.OpOverload) -> None:
    # register_sharding caches its decision on the tensor placements and int arguments only; our rules
    # also read bools (the norm backward ops' input_grad / weight_grad / bias_grad), so key the cache on
    # every argument from the first non-tensor one.
    propagator = DTensor._op_dispatcher.sharding_propagator
    info = getattr(propagator, "op_to_schema_info", {}).get(op)
    if info is None:
        return
    first = next(
        (i for i, a in enumerate(op._schema.arguments)
         if not isinstance(a.type, torch.TensorType)
         and not (isinstance(a.type, torch.OptionalType) and isinstance(a.type.getElementType(), torch.TensorType))),
        None,
    )
    if first is not None and first < info.static_argnum:
        propagator.op_to_schema_info[op] = dataclasses.replace(info, static_argnum=first)


def _keep_mutated_placements(op: torch._ops.OpOverload) -> None:
    # Wraps the registered strategy so that only strategies leaving every mutated argument where it is
    # remain (register_sharding expands a rule to every combination over the mesh dimensions).
    propagator = DTensor._op_dispatcher.sharding_propagator
    funcs = getattr(propagator, "op_strategy_funcs", None)
    if funcs is None or op not in funcs:
        return
    mutated = [i for i, a in enumerate(op._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    inner = funcs[op]

    def strategy(*args: Any) -> Any:
        op_schema = args[-1]  # older torch passes (mesh, op_schema), newer (op_schema)
        result = inner(*args)
        tensor_positions = [i for i, a in enumerate(op_schema.args_schema) if hasattr(a, "strategies")]
        keep = []
        for s in result.strategies:
            ok = True
            for i in mutated:
                if i not in tensor_positions:
                    continue
                current = op_schema.args_schema[i].strategies[0].output_spec.placements
                if s.input_specs[tensor_positions.index(i)].placements != current:
                    ok = False
            if ok:
                keep.append(s)
        result.strategies = keep
        return result

    funcs[op] = strategy


_registered: set[torch._ops.OpOverload] = set()


def register_sharding_rules() -> None:
    """Registers the DTensor sharding rule of every myns op that has one and has none registered yet (see
    the module docstring). Idempotent; call it again after defining more myns ops."""
    for name in _myns_ops():
        for op in _myns_overloads(name):
            make_rule = rule_factory(op)
            if make_rule is None or op in _registered:
                continue
            register_sharding(op)(make_rule(op))
            _cache_every_scalar(op)
            if op._schema.is_mutable:
                _keep_mutated_placements(op)
            _registered.add(op)


register_sharding_rules()


# ---------------------------------------------------------------------------------------------------------
# Row-sharded sparse matrices.


class CSRRowShard(NamedTuple):
    """One rank's block of rows of an M x K CSR matrix: rows ``[row_start, row_start + rows)``.

    ``crow_indices`` has ``rows + 1`` offsets starting at 0 (into this block's ``col_indices`` /
    ``values``); column indices are global (``0 <= col < K``). The blocks follow ``Shard(0)``'s split of M
    rows (``ceil(M / world)`` rows per rank, fewer or none on the last ones), so the product is a
    ``Shard(0)`` DTensor.
    """

    crow_indices: Tensor
    col_indices: Tensor
    values: Tensor
    shape: tuple[int, int]  # the whole matrix: (M, K)
    row_start: int


def _row_block(rows: int, parts: int, index: int) -> tuple[int, int]:
    """Shard(0)'s [start, end) of `rows` rows for part `index` of `parts` (torch.chunk's sizes)."""
    size = -(-rows // parts) if rows else 0
    start = min(index * size, rows)
    return start, min(start + size, rows)


def shard_csr_rows(A: Tensor, mesh: DeviceMesh, mesh_dim: int = 0) -> CSRRowShard:
    """This rank's block of rows of the 2-D sparse CSR tensor ``A`` (the whole matrix, on every rank).

    Rows are split as ``Shard(0)`` splits them over ``mesh``'s dimension ``mesh_dim``. The block's
    ``values`` is a slice of ``A.values()`` (a view: gradients flow back to it). To build blocks without
    ever holding the whole matrix, construct :class:`CSRRowShard` directly with the same row split.
    """
    if A.layout != torch.sparse_csr or A.dim() != 2:
        raise RuntimeError(f"torchops.distributed.shard_csr_rows: A must be a 2-D sparse CSR tensor, got layout "
                           f"{A.layout} with {A.dim()} dims")
    M, K = A.shape
    start, end = _row_block(M, mesh.size(mesh_dim), mesh.get_local_rank(mesh_dim))
    crow = A.crow_indices()
    lo, hi = int(crow[start]), int(crow[end])
    return CSRRowShard(crow[start:end + 1] - lo, A.col_indices()[lo:hi], A.values()[lo:hi], (M, K), start)


def row_sharded_spmm(A: CSRRowShard, dense: DTensor, mesh_dim: int = 0) -> DTensor:
    """``A @ dense`` for a row-sharded sparse ``A`` (this rank's :class:`CSRRowShard`) and a K x N DTensor.

    ``dense`` is made ``Replicate`` on ``mesh_dim`` first (a gather when it is sharded, a reduction when
    it is partial; nothing when it is already replicated); on the mesh's other dimensions its placements
    carry over to the result. The result is an M x N DTensor, ``Shard(0)`` on ``mesh_dim``. Differentiable
    in ``dense`` (its gradient, ``A^T @ grad``, comes out ``Partial``: each rank holds its rows' share)
    and in ``A.values`` (a local tensor, with a local gradient).
    """
    if not isinstance(dense, DTensor):
        raise TypeError(f"torchops.distributed.row_sharded_spmm: dense must be a DTensor, got {type(dense).__name__}")
    mesh = dense.device_mesh
    if dense.dim() != 2 or dense.shape[0] != A.shape[1]:
        raise RuntimeError(f"torchops.distributed.row_sharded_spmm: A is {A.shape[0]} x {A.shape[1]} but dense has "
                           f"shape {list(dense.shape)}")
    if any(isinstance(p, Shard) and p.dim == 0 for p in dense.placements):
        # Shard(0) of dense on another mesh dimension would split K: not this product.
        dense = dense.redistribute(placements=[Replicate() if isinstance(p, Shard) and p.dim == 0 else p
                                               for p in dense.placements])
    start, end = _row_block(A.shape[0], mesh.size(mesh_dim), mesh.get_local_rank(mesh_dim))
    if A.row_start != start or A.crow_indices.numel() != end - start + 1:
        raise RuntimeError(f"torchops.distributed.row_sharded_spmm: this rank's block must hold rows [{start}, {end}) "
                           f"of {A.shape[0]} (Shard(0)'s split), got {A.crow_indices.numel() - 1} rows from "
                           f"{A.row_start}")
    placements = list(dense.placements)
    placements[mesh_dim] = Replicate()
    dense = dense.redistribute(placements=placements)
    grad_placements = list(placements)
    grad_placements[mesh_dim] = Partial()
    local = dense.to_local(grad_placements=grad_placements)
    out = torchops.csr_spmm(A.crow_indices, A.col_indices, A.values, local)
    placements[mesh_dim] = Shard(0)
    N = dense.shape[1]
    return DTensor.from_local(out, mesh, placements, run_check=False, shape=torch.Size((A.shape[0], N)),
                              stride=(N, 1))
