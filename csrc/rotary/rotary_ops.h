// The rotary ops' entry points, shared by the CPU and CUDA backends (as norm_ops.h is for the norms): check the
// arguments once under the op's name, allocate the outputs, hand one call record (rotary.h) to the backend.
//
// `Backend` provides:
//   static at::Tensor empty(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& like);
//   static at::Tensor empty_strided(c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype,
//                                   const at::Tensor& like);
//   static constexpr int64_t kMaxNormHeadDim;         qk_norm_rope's longest head_dim (elements)
//   static void rotate(const RotaryCall&);            rotary_embedding and its backward
//   static void qk_norm_forward(const QkNormCall&);
//   static void qk_norm_backward(const QkNormCall&);
//   static void rotate_cache(const RotaryCacheCall&); rotary_embedding_ (checks the positions' range or not)
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "../core/empty.h"
#include "rotary.h"

namespace torchops {

template <typename Backend>
struct RotaryOps {
  // A new output (or gradient) in the layout of `like`: its strides when they are a permutation of dense ones with
  // the features last, as torch's elementwise ops keep them, else contiguous. transformers' q is
  // q_proj(x).view(b, s, h, d).transpose(1, 2): [b, s, h, d] in memory stays so, and the attention that reads it
  // (whose output then needs no transposing copy) and the gradient's way back through the view take it as it is.
  // meta_kernels/rotary_embedding.py's _in_layout_of is the same rule.
  static at::Tensor empty_in_layout_of(const at::Tensor& like) {
    const bool permuted_dense = like.numel() > 0 && !like.is_contiguous() && like.is_non_overlapping_and_dense() &&
                                (like.size(-1) <= 1 || like.stride(-1) == 1);
    return permuted_dense ? Backend::empty_strided(like.sizes(), like.strides(), like.scalar_type(), like)
                          : backend_empty_like<Backend>(like);
  }

  // empty_in_layout_of(like) where wanted, else the [0]-shaped placeholder of an output not asked for.
  static at::Tensor empty_in_layout_if(bool wanted, const at::Tensor& like) {
    return wanted ? empty_in_layout_of(like) : backend_empty_if<Backend>(false, {}, like.scalar_type(), like);
  }

  // The rotation of q and k (named as the op names them) into new outputs in their layouts.
  static RotaryCall rotation(const char* op, NamedTensor q, NamedTensor k, const at::Tensor& cos,
                             const at::Tensor& sin, int64_t unsqueeze_dim, bool interleaved, bool transposed) {
    RotaryCall call;
    call.shape = check_rotary(op, q, k, {"cos", cos}, {"sin", sin}, unsqueeze_dim);
    call.q = head_rows(q.tensor, call.shape);
    call.k = head_rows(k.tensor, call.shape);
    call.q_out = head_rows(empty_in_layout_of(q.tensor), call.shape);
    call.k_out = head_rows(empty_in_layout_of(k.tensor), call.shape);
    call.cs = cos_sin_rows(cos, sin);
    call.interleaved = interleaved;
    call.transposed = transposed;
    return call;
  }

  static std::tuple<at::Tensor, at::Tensor> rotary_embedding(const at::Tensor& q, const at::Tensor& k,
                                                             const at::Tensor& cos, const at::Tensor& sin,
                                                             int64_t unsqueeze_dim, bool interleaved) {
    const RotaryCall call = rotation("rotary_embedding", {"q", q}, {"k", k}, cos, sin, unsqueeze_dim, interleaved, false);
    Backend::rotate(call);
    return {call.q_out.tensor, call.k_out.tensor};
  }

  static std::tuple<at::Tensor, at::Tensor> rotary_embedding_backward(const at::Tensor& grad_q, const at::Tensor& grad_k,
                                                                      const at::Tensor& cos, const at::Tensor& sin,
                                                                      int64_t unsqueeze_dim, bool interleaved) {
    const RotaryCall call = rotation("_rotary_embedding_backward", {"grad_q", grad_q}, {"grad_k", grad_k}, cos, sin,
                                     unsqueeze_dim, interleaved, true);
    Backend::rotate(call);
    return {call.q_out.tensor, call.k_out.tensor};
  }

  // qk_norm_rope's checks and rows (outputs not allocated).
  static QkNormCall qk_norm(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
                            const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin, double eps,
                            double weight_offset, int64_t unsqueeze_dim, bool interleaved) {
    QkNormCall call;
    RotaryCall& r = call.rope;
    r.shape = check_rotary(op, {"q", q}, {"k", k}, {"cos", cos}, {"sin", sin}, unsqueeze_dim);
    check_qk_norm_weights(op, {"q", q}, {"k", k}, {"q_weight", q_weight}, {"k_weight", k_weight});
    TORCHOPS_CHECK(r.shape.head_dim <= Backend::kMaxNormHeadDim, op, "q's rows of ", r.shape.head_dim,
                   " elements are longer than this device's kernels take (", Backend::kMaxNormHeadDim, ")");
    r.q = head_rows(q, r.shape);
    r.k = head_rows(k, r.shape);
    r.cs = cos_sin_rows(cos, sin);
    r.interleaved = interleaved;
    call.q_weight = q_weight.contiguous();
    call.k_weight = k_weight.contiguous();
    call.eps = eps;
    call.weight_offset = weight_offset;
    return call;
  }

  static std::tuple<at::Tensor, at::Tensor> qk_norm_rope(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& q_weight, const at::Tensor& k_weight,
                                                         const at::Tensor& cos, const at::Tensor& sin, double eps,
                                                         double weight_offset, int64_t unsqueeze_dim, bool interleaved) {
    QkNormCall call = qk_norm("qk_norm_rope", q, k, q_weight, k_weight, cos, sin, eps, weight_offset, unsqueeze_dim,
                              interleaved);
    call.rope.q_out = head_rows(empty_in_layout_of(q), call.rope.shape);
    call.rope.k_out = head_rows(empty_in_layout_of(k), call.rope.shape);
    Backend::qk_norm_forward(call);
    return {call.rope.q_out.tensor, call.rope.k_out.tensor};
  }

  // (grad_q, grad_k, grad_q_weight, grad_k_weight): a side's gradients exist where its output's gradient was given
  // (input_grad: of the input; weight_grad: of the weight), else are [0]-shaped placeholders.
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> qk_norm_rope_backward(
      const OptTensor& grad_q_out, const OptTensor& grad_k_out, const at::Tensor& q, const at::Tensor& k,
      const at::Tensor& q_weight, const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin, double eps,
      double weight_offset, int64_t unsqueeze_dim, bool interleaved, bool input_grad, bool weight_grad) {
    const char* op = "_qk_norm_rope_backward";
    QkNormCall call = qk_norm(op, q, k, q_weight, k_weight, cos, sin, eps, weight_offset, unsqueeze_dim, interleaved);
    call.rope.transposed = true;
    const bool has_q = grad_q_out.has_value() && grad_q_out->defined();
    const bool has_k = grad_k_out.has_value() && grad_k_out->defined();
    if (has_q) {
      check_like(op, {"q", q}, {"grad_q_out", *grad_q_out});
      call.grad_q = head_rows(*grad_q_out, call.rope.shape);
    }
    if (has_k) {
      check_like(op, {"k", k}, {"grad_k_out", *grad_k_out});
      call.grad_k = head_rows(*grad_k_out, call.rope.shape);
    }
    call.grad_q_in = empty_in_layout_if(has_q && input_grad, q);
    call.grad_k_in = empty_in_layout_if(has_k && input_grad, k);
    call.grad_q_weight =
        backend_empty_if<Backend>(has_q && weight_grad, q_weight.sizes(), q_weight.scalar_type(), q);
    call.grad_k_weight =
        backend_empty_if<Backend>(has_k && weight_grad, k_weight.sizes(), k_weight.scalar_type(), k);
    // The backend sees only what is wanted: undefined elsewhere.
    QkNormCall run = call;
    if (!(has_q && input_grad)) run.grad_q_in = at::Tensor();
    if (!(has_k && input_grad)) run.grad_k_in = at::Tensor();
    if (!(has_q && weight_grad)) run.grad_q_weight = at::Tensor();
    if (!(has_k && weight_grad)) run.grad_k_weight = at::Tensor();
    if (run.grad_q_in.defined() || run.grad_k_in.defined() || run.grad_q_weight.defined() ||
        run.grad_k_weight.defined()) {
      Backend::qk_norm_backward(run);
    }
    return {call.grad_q_in, call.grad_k_in, call.grad_q_weight, call.grad_k_weight};
  }

  static void rotary_embedding_(const at::Tensor& positions, const at::Tensor& query, const OptTensor& key,
                                int64_t head_size, const at::Tensor& cos_sin_cache, bool is_neox) {
    RotaryCacheCall call;
    call.shape = check_rotary_cache("rotary_embedding_", positions, query, key, head_size, cos_sin_cache);
    call.positions = positions.contiguous();
    call.query = query;
    call.query_token_stride = query.size(0) > 1 ? query.stride(0) : 0;
    call.query_head_stride = query.dim() == 2 ? head_size : (query.size(1) > 1 ? query.stride(1) : 0);
    if (key.has_value() && key->defined()) {
      call.key = *key;
      call.key_token_stride = key->size(0) > 1 ? key->stride(0) : 0;
      call.key_head_stride = key->dim() == 2 ? head_size : (key->size(1) > 1 ? key->stride(1) : 0);
    }
    call.cache = cos_sin_cache.size(1) <= 1 || cos_sin_cache.stride(1) == 1 ? cos_sin_cache : cos_sin_cache.contiguous();
    call.cache_stride = call.cache.size(0) > 1 ? call.cache.stride(0) : 0;
    call.is_neox = is_neox;
    Backend::rotate_cache(call);
  }

  // The backend's kernels of every rotary op (in its TORCH_LIBRARY_IMPL block).
  static void register_kernels(torch::Library& m) {
    m.impl("rotary_embedding", &rotary_embedding);
    m.impl("_rotary_embedding_backward", &rotary_embedding_backward);
    m.impl("rotary_embedding_", &rotary_embedding_);
    m.impl("qk_norm_rope", &qk_norm_rope);
    m.impl("_qk_norm_rope_backward", &qk_norm_rope_backward);
  }
};

}  // namespace torchops
