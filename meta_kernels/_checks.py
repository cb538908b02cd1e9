"""The argument errors of the myns ops: one table of messages, and the fake kernels' checks that format it.

MESSAGES holds every argument error a myns op raises, by key. The C++ checks (csrc/core/checks.cpp,
norm.cpp, csr.cpp) raise the same text (tests/test_messages.py compares them on every error input of
tests/op_db.py, which names its expected errors by key and fields, never by re-typed text); the fake kernels
format it here. A new check adds its template here, formats it in the fake kernel with check(), and in C++
with TORCHOPS_CHECK.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# The dtype lists of csrc/core/dispatch.h, in its order (tests/test_dtype_lists.py checks them against the
# kernels); INT_DTYPES are also the CSR index dtypes.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.int32, torch.int64)
FLOAT_AND_INT_DTYPES = FLOAT_DTYPES + INT_DTYPES


# Dtypes no op supports, spelled as c10::toString does too, so a rejected dtype reads the same from a fake and a
# real kernel; looked up by name since not every torch build has every one.
_EXOTIC_DTYPE_NAMES = {
    getattr(torch, name): cpp
    for name, cpp in (("uint16", "UInt16"), ("uint32", "UInt32"), ("uint64", "UInt64"), ("complex32", "ComplexHalf"),
                      ("float8_e4m3fn", "Float8_e4m3fn"), ("float8_e4m3fnuz", "Float8_e4m3fnuz"),
                      ("float8_e5m2", "Float8_e5m2"), ("float8_e5m2fnuz", "Float8_e5m2fnuz"),
                      ("float8_e8m0fnu", "Float8_e8m0fnu"))
    if hasattr(torch, name)
}


def _dtype_name(dtype: torch.dtype) -> str:
    # c10::toString spelling, so fake and real kernels raise the same text.
    return {
        torch.float16: "Half",
        torch.bfloat16: "BFloat16",
        torch.float32: "Float",
        torch.float64: "Double",
        torch.int32: "Int",
        torch.int64: "Long",
        torch.int8: "Char",
        torch.int16: "Short",
        torch.uint8: "Byte",
        torch.bool: "Bool",
        torch.complex64: "ComplexFloat",
        torch.complex128: "ComplexDouble",
        **_EXOTIC_DTYPE_NAMES,
    }.get(dtype, str(dtype))


# Fields are spelled as C++ prints them (_spell): dtypes as c10::toString, shapes as [4, 8], devices as cuda:0.
MESSAGES: dict[str, str] = {
    # every op (csrc/core/checks.cpp)
    "defined": "{x} must be a defined tensor",
    "dtype_in": "{x} has unsupported dtype {dtype}; supported: {supported}",
    "same_shape": "{x} and {y} must have the same shape, got {x_shape} and {y_shape}",
    "same_dtype": "{x} and {y} must have the same dtype, got {x_dtype} and {y_dtype}",
    "same_device": "{x} and {y} must be on the same device, got {x_device} and {y_device}",
    # out= ops (checks.cpp; the Autograd kernels: core/autograd_utils.h); the fake kernels can't decide overlap
    "internal_overlap": "{x} has internal overlap (several elements share memory, e.g. an expanded tensor); "
                        "it cannot be written",
    "partial_overlap": "{x} partially overlaps {y} (they share memory but are not the same view); pass the same "
                       "tensor or a non-overlapping one",
    "out_requires_grad": "out= variants don't support automatic differentiation, but {x} requires grad; use the "
                         "functional op instead",
    "outs_share_memory": "{x} and {y} share memory; each result needs memory of its own",
    # gated activations (checks.cpp)
    "approximate": "approximate must be 'none' or 'tanh', got '{got}'",
    # row normalisation (csrc/norm/norm.cpp)
    "at_least_1d": "{x} must have at least 1 dimension, got a 0-dim tensor",
    "normalised_dim_empty": "{x}'s last dimension (the normalised one) must be at least 1, got shape {shape}",
    "offset_without_weight": "weight_offset is non-zero but weight is None; pass a weight (ones to scale by 1 + "
                             "weight_offset)",
    "param_shape": "{param} must be 1-D of size {n} ({x}'s last dimension), got shape {shape}",
    "param_dtype": "{param} must have {x}'s dtype ({dtype}), got {param_dtype}",
    "param_dtype_or_float": "{param} must have {x}'s dtype ({dtype}) or Float, got {param_dtype}",
    # raised by the real kernels only (a backend's limit, from the row length)
    "row_limit": "{x}'s rows of {n} elements are longer than this device's kernels take ({max})",
    "stat_shape_dtype": "{stat} must have shape {shape} ({x}'s leading dimensions) and dtype {dtype}, got shape "
                        "{got_shape} and dtype {got_dtype}",
    "weight_grad_without_weight": "weight_grad is true but weight is None",
    # rotary embeddings (csrc/rotary/rotary.cpp)
    "unsqueeze_dim": "unsqueeze_dim must be 1 (q and k [batch, heads, seq, head_dim]) or 2 ([batch, seq, heads, "
                     "head_dim]), got {got}",
    "rotary_4d": "{x} must be 4-D, {layout} (unsqueeze_dim={unsqueeze_dim}), got shape {shape}",
    "rotary_heads_only": "{y} must have {x}'s shape but for the heads (dimension {dim}), got {x_shape} and {y_shape}",
    "rotary_cos_shape": "{x} must be [1 or batch, 1 or seq, rot] = [1 or {batch}, 1 or {seq}, rot], got shape {shape}",
    "rotary_dim": "{x}'s last dimension (the rotary dimension) must be even and at most {limit} ({n}), got {rot}",
    "rotary_heads": "{x} must be [tokens, heads * head_size] or [tokens, heads, head_size] with head_size = "
                    "{head_size} >= 1, got shape {shape}",
    "rotary_tokens": "{x} must have a row per position ({tokens}), got shape {shape}",
    "rotary_inner_stride": "{x}'s last dimension must be dense (stride 1): it is rotated in place, got strides "
                           "{strides}",
    # raised by the Autograd kernels (csrc/autograd/rotary_embedding.cpp), fake tensors included
    "rotary_constant": "cos and sin are constants (no gradient flows to them), but {x} {why}; pass {x}.detach()",
    "rotary_inference_only": "it rotates query and key in place and records no gradient (inference only), but {x} "
                             "{why}",
    # rotary_embedding_'s memory and positions: read from the tensors' storage and data, so real kernels only (the
    # positions' range on the CPU only: CUDA never reads out of bounds, see torchops.rotary_embedding_)
    "rotary_same_memory": "query and key are the same memory: each is rotated in place, so they must not share any",
    "rotary_position": "positions must lie in [0, {max}) (the rows of cos_sin_cache), got positions[{i}] = {got}",
    # CSR (csrc/csr/csr.cpp)
    "one_d": "{x} must be 1-D, got shape {shape}",
    "two_d": "{x} must be 2-D, got shape {shape}",
    "dims": "{x} must be {what}, got shape {shape}",
    "crow_empty": "{x} must hold M + 1 >= 1 entries, got none",
    "nnz_mismatch": "col_indices and values must have the same length (nnz), got {col} and {values}",
    "rows": "{x} must have crow_indices.numel() - 1 = {m} rows, got {rows}",
    "values_heads": "values of shape {values} gives each nonzero one value per head, so dense must be 3-D (K, H, D) "
                    "with H = {heads}, got shape {dense}",
    "same_trailing": "{x} and {y} must have the same size in every dimension but the first, got shapes {x_shape} and "
                     "{y_shape}",
    "reduce": "reduce must be 'sum', 'mean', 'max' or 'min', got '{got}'",
    "reduce_selects": "reduce must be 'max' or 'min' (a reduction that selects one nonzero), got '{got}'",
    "sddmm_op": "op must be 'dot', 'add' or 'mul', got '{got}'",
    "result_shape": "grad_out must have the result's shape {shape}, got {got}",
    "values_grad_without_values": "values_grad is true but values is None",
    "transpose_parts": "t_crow_indices, t_col_indices and t_perm are a transpose: give all three or none, got {given}",
    "t_crow_size": "t_crow_indices must hold K + 1 = {k_plus_1} entries (K = dense.size(0)), got {got}",
    "t_nnz": "t_col_indices and t_perm must hold nnz = {nnz} entries, got {t_col} and {t_perm}",
    "negative_K": "K must be non-negative, got {K}",
    # CSR structure: read from the indices, so raised by the CPU kernels only (csr.cpp) and the wrappers'
    # check_invariants=True, never by fake kernels (no data)
    "crow_first": "crow_indices[0] must be 0, got {got}",
    "crow_decreasing": "crow_indices must be non-decreasing, got crow_indices[{i}] = {a} > crow_indices[{j}] = {b}",
    "crow_last": "crow_indices[-1] must equal nnz = {nnz} (the length of {of}), got {got}",
    "col_out_of_range": "col_indices must lie in [0, K) with K = {K}, got col_indices[{p}] = {got}",
    # losses (csrc/loss/loss.cpp)
    "in_features": "linear_weight must have {h} columns ({x}'s last dimension), got shape {shape}",
    "no_classes": "{x} holds no classes (its {dim} dimension is empty), got shape {shape}",
    "target_shape": "target must have shape {shape} ({x}'s leading dimensions), got shape {got}",
    "bias_shape": "linear_bias must be 1-D of size {n} (linear_weight's rows), got shape {shape}",
    "label_smoothing": "label_smoothing must lie in [0, 1], got {got}",
    "softcap": "softcap must be positive and finite, got {got}",
    "reduction": "reduction must be 'none', 'mean' or 'sum', got '{got}'",
    "chunk_size": "chunk_size must be non-negative (0: chosen from the sizes), got {got}",
    "zero_dim": "{x} must be a 0-dim tensor, got shape {shape}",
    "bias_grad_without_bias": "bias_grad is true but linear_bias is None",
    # loss targets: read from the data, so raised by the CPU kernels only, never by fake kernels
    "target_range": "target must lie in [0, {n}) or equal ignore_index ({ignore_index}), got {got} at index {i}",
}


def _spell(value: Any) -> str:
    if isinstance(value, torch.dtype):
        return _dtype_name(value)
    if isinstance(value, (list, tuple, torch.Size)):
        if value and all(isinstance(v, torch.dtype) for v in value):
            return ", ".join(_dtype_name(v) for v in value)
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def message(op: str, key: str, **fields: Any) -> str:
    """The full text of error `key` of op `op` (``myns::<op>: ...``), its fields spelled as C++ prints them."""
    return f"myns::{op}: " + MESSAGES[key].format(**{k: _spell(v) for k, v in fields.items()})


def check(cond: bool, op: str, key: str, **fields: Any) -> None:
    """Raises error `key` (see MESSAGES) unless `cond`; formatted only when it fails."""
    torch._check(cond, lambda: message(op, key, **fields))


# (name, tensor) pairs, as NamedTensor in checks.h.
Named = tuple[str, torch.Tensor]


def same_device(op: str, x: Named, y: Named) -> None:
    check(x[1].device == y[1].device, op, "same_device", x=x[0], y=y[0], x_device=x[1].device, y_device=y[1].device)


def same_dtype(op: str, x: Named, y: Named) -> None:
    check(x[1].dtype == y[1].dtype, op, "same_dtype", x=x[0], y=y[0], x_dtype=x[1].dtype, y_dtype=y[1].dtype)


def dtype_in(op: str, t: Named, dtypes: Sequence[torch.dtype]) -> None:
    check(t[1].dtype in dtypes, op, "dtype_in", x=t[0], dtype=t[1].dtype, supported=tuple(dtypes))


def check_elementwise(op: str, tensors: Sequence[Named], dtypes: Sequence[torch.dtype]) -> None:
    """Same contract as torchops::check_elementwise: same device, dtype and shape; dtype in `dtypes`."""
    first = tensors[0]
    for t in tensors[1:]:
        same_device(op, first, t)
        same_dtype(op, first, t)
        check(
            first[1].dim() == t[1].dim() and all(x == y for x, y in zip(first[1].shape, t[1].shape)),
            op, "same_shape", x=first[0], y=t[0], x_shape=list(first[1].shape), y_shape=list(t[1].shape),
        )
    dtype_in(op, first, dtypes)


def write_out(op: str, like: Named, out: Named) -> None:
    """An out= tensor for a result like `like`: its device and dtype, resized to its shape as the real kernels
    resize it (torchops::check_and_resize_out); the overlap checks need the data, which a fake has not."""
    same_device(op, like, out)
    same_dtype(op, like, out)
    if out[1].shape == like[1].shape:
        return
    if torch._guards.TracingContext.try_get() is not None:
        # torch.compile / torch.export: a resized graph input is not traced (nor is torch.add(out=)'s). A graph
        # break, not an argument error: torch.compile runs the call eagerly, fullgraph and export refuse it.
        from torch._dynamo.exc import Unsupported

        raise Unsupported(f"myns::{op}: {out[0]} of shape {list(out[1].shape)} would be resized to {like[0]}'s "
                          f"shape {list(like[1].shape)}, which a traced graph cannot do; pass a tensor of that shape")
    out[1].resize_(like[1].shape)
