// The front half of the rotary ops (rotary_embedding, rotary_embedding_, qk_norm_rope and their backward ops),
// shared by the CPU and CUDA backends: argument checks (messages: meta_kernels._checks.MESSAGES, mirrored by
// meta_kernels/rotary_embedding.py), and the row views and call records the kernels take.
//
// Rows: q and k are [batch, heads, seq, head_dim] (unsqueeze_dim 1) or [batch, seq, heads, head_dim]
// (unsqueeze_dim 2); a row is one head of one token, head_dim elements. cos and sin are [1 or batch, 1 or seq,
// rot]: a position's row holds one value per rotated element (transformers' layout, both halves of a pair
// explicit), so the kernels never assume the halves repeat.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "../core/checks.h"

namespace torchops {

// What a checked rotary_embedding / qk_norm_rope call looks like.
struct RotaryShape {
  int64_t batch = 0, seq = 0, heads_q = 0, heads_k = 0, head_dim = 0, rot = 0;
  int heads_dim = 1;  // q's heads dimension: 1 (unsqueeze_dim 1) or 2
};

// rotary_embedding(q, k, cos, sin, unsqueeze_dim): q a float tensor, k of q's dtype, device and shape but for the
// heads, cos and sin alike, of q's dtype, [1 or batch, 1 or seq, rot] with rot even and at most head_dim.
RotaryShape check_rotary(const char* op, NamedTensor q, NamedTensor k, NamedTensor cos, NamedTensor sin,
                         int64_t unsqueeze_dim);

// qk_norm_rope's weights: 1-D of head_dim on x's device, of x's dtype or (16-bit x) float32; head_dim >= 1.
void check_qk_norm_weights(const char* op, NamedTensor q, NamedTensor k, NamedTensor q_weight, NamedTensor k_weight);

// The Autograd kernels: cos and sin are constants; neither may require grad nor carry a forward-mode tangent.
void check_rotary_constants(const char* op, NamedTensor cos, NamedTensor sin);

// rotary_embedding_ is inference only: none of its tensors may require grad or carry a tangent.
void check_rotary_inference_only(const char* op, std::initializer_list<NamedTensor> tensors);

// rotary_embedding_(positions, query, key, head_size, cos_sin_cache): positions 1-D int32/int64 (tokens,),
// query [tokens, heads * head_size] or [tokens, heads, head_size] with a dense last dimension, key (when given)
// alike of query's dtype and device, cos_sin_cache [max_position, rot] of query's dtype or (16-bit query)
// float32, rot even and at most head_size; query and key share no memory with each other or the cache.
struct RotaryCacheShape {
  int64_t tokens = 0, heads_q = 0, heads_k = 0, head_size = 0, rot = 0, max_position = 0;
};
RotaryCacheShape check_rotary_cache(const char* op, const at::Tensor& positions, const at::Tensor& query,
                                    const std::optional<at::Tensor>& key, int64_t head_size,
                                    const at::Tensor& cos_sin_cache);

// CPU only (it reads them): every position in [0, max_position).
void check_positions_in_range(const char* op, const at::Tensor& positions, int64_t max_position);

// ------------------------------------------------------------------------------------------ kernel views
// A tensor of rows as the kernels read it: element (b, h, s, j) at b * batch_stride + h * head_stride +
// s * seq_stride + j. `tensor` is the argument, or a contiguous copy when its last dimension is not dense.
struct HeadRows {
  at::Tensor tensor;
  int64_t batch_stride = 0, head_stride = 0, seq_stride = 0;
};
HeadRows head_rows(const at::Tensor& t, const RotaryShape& shape);

// cos and sin rows of a position (b, s): cos + b * batch_stride + s * seq_stride, rot dense elements; a size-1
// dimension has stride 0 (broadcast).
struct CosSinRows {
  at::Tensor cos, sin;
  int64_t cos_batch = 0, cos_seq = 0, sin_batch = 0, sin_seq = 0;
};
CosSinRows cos_sin_rows(const at::Tensor& cos, const at::Tensor& sin);

// One rotation call: q and k (either may be undefined: not rotated) into the dense outputs q_out and k_out.
// transposed: the backward's rotation (the transpose: by the negative angle when a pair's halves share cos and
// sin). For qk_norm_rope the rows are RMS-normalised first.
struct RotaryCall {
  RotaryShape shape;
  HeadRows q, k, q_out, k_out;
  CosSinRows cs;
  bool interleaved = false;
  bool transposed = false;
};

// qk_norm_rope's forward (out rows of `rope`) and backward (grad rows in grad_q / grad_k, undefined where no
// gradient flows; grad_q_in / grad_k_in / grad_q_weight / grad_k_weight allocated where wanted).
struct QkNormCall {
  RotaryCall rope;
  at::Tensor q_weight, k_weight;  // dense 1-D
  double eps = 0.0, weight_offset = 0.0;
  HeadRows grad_q, grad_k;
  at::Tensor grad_q_in, grad_k_in, grad_q_weight, grad_k_weight;
};

// rotary_embedding_: query and key rows rotated in place by the cache row of each token's position.
struct RotaryCacheCall {
  RotaryCacheShape shape;
  at::Tensor positions, query, key, cache;
  int64_t query_token_stride = 0, query_head_stride = 0, key_token_stride = 0, key_head_stride = 0;
  int64_t cache_stride = 0;
  bool is_neox = true;
};

}  // namespace torchops
