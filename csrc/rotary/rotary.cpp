#include "rotary.h"

#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <atomic>

#include "../core/dispatch.h"

namespace torchops {

namespace {

constexpr int64_t kForwardGradLevel = 0;  // as core/autograd_utils.h reads tangents

const char* layout_of(int64_t unsqueeze_dim) {
  return unsqueeze_dim == 1 ? "[batch, heads, seq, head_dim]" : "[batch, seq, heads, head_dim]";
}

// Why a tensor may not take part in autograd here, or null when it may.
const char* autograd_use(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  if (c10::GradMode::is_enabled() && t.requires_grad()) return "requires grad";
  if (t._fw_grad(kForwardGradLevel).defined()) return "has a forward-mode tangent";
  return nullptr;
}

bool same_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.has_storage() && b.has_storage() && a.storage().is_alias_of(b.storage());
}

void check_4d(const char* op, NamedTensor t, int64_t unsqueeze_dim) {
  TORCHOPS_CHECK(t.tensor.dim() == 4, op, t.name, " must be 4-D, ", layout_of(unsqueeze_dim), " (unsqueeze_dim=",
                 unsqueeze_dim, "), got shape ", t.tensor.sizes());
}

// rot even and at most `limit` (head_dim, head_size).
void check_rotary_dim(const char* op, NamedTensor t, int64_t rot, const char* limit_name, int64_t limit) {
  TORCHOPS_CHECK(rot % 2 == 0 && rot <= limit, op, t.name, "'s last dimension (the rotary dimension) must be even and at most ",
                 limit_name, " (", limit, "), got ", rot);
}

// A norm weight (core of norm.cpp's parameter rule, under the argument's own name).
void check_weight(const char* op, NamedTensor x, NamedTensor w) {
  check_defined_on(op, x, w);
  const int64_t n = x.tensor.size(-1);
  TORCHOPS_CHECK(w.tensor.dim() == 1 && w.tensor.size(0) == n, op, w.name, " must be 1-D of size ", n, " (", x.name,
                 "'s last dimension), got shape ", w.tensor.sizes());
  const auto dtype = x.tensor.scalar_type();
  const bool reduced = is_16bit_float_dtype(dtype);
  TORCHOPS_CHECK(w.tensor.scalar_type() == dtype || (reduced && w.tensor.scalar_type() == at::kFloat), op, w.name,
                 " must have ", x.name, "'s dtype (", dtype, ")", reduced ? " or Float" : "", ", got ",
                 w.tensor.scalar_type());
}

// query / key of rotary_embedding_: [tokens, heads * head_size] or [tokens, heads, head_size], a row per position,
// the last dimension dense. Returns the heads.
int64_t check_cache_rows(const char* op, NamedTensor x, int64_t tokens, int64_t head_size) {
  const at::Tensor& t = x.tensor;
  const bool split = head_size >= 1 && ((t.dim() == 2 && t.size(1) % head_size == 0) ||
                                        (t.dim() == 3 && t.size(2) == head_size));
  TORCHOPS_CHECK(split, op, x.name, " must be [tokens, heads * head_size] or [tokens, heads, head_size] with head_size = ",
                 head_size, " >= 1, got shape ", t.sizes());
  TORCHOPS_CHECK(t.size(0) == tokens, op, x.name, " must have a row per position (", tokens, "), got shape ",
                 t.sizes());
  TORCHOPS_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, op, x.name,
                 "'s last dimension must be dense (stride 1): it is rotated in place, got strides ", t.strides());
  return t.dim() == 2 ? t.size(1) / head_size : t.size(1);
}

}  // namespace

RotaryShape check_rotary(const char* op, NamedTensor q, NamedTensor k, NamedTensor cos, NamedTensor sin,
                         int64_t unsqueeze_dim) {
  check_defined(op, q);
  check_dtype_in(op, q, {TORCHOPS_FLOAT_DTYPES});
  TORCHOPS_CHECK(unsqueeze_dim == 1 || unsqueeze_dim == 2, op,
                 "unsqueeze_dim must be 1 (q and k [batch, heads, seq, head_dim]) or 2 ([batch, seq, heads, "
                 "head_dim]), got ", unsqueeze_dim);
  check_4d(op, q, unsqueeze_dim);
  check_defined_on(op, q, k);
  check_same_dtype(op, q, k);
  check_4d(op, k, unsqueeze_dim);
  RotaryShape s;
  s.heads_dim = static_cast<int>(unsqueeze_dim);
  const int seq_dim = 3 - s.heads_dim;
  bool same_but_heads = true;
  for (int d = 0; d < 4; ++d) same_but_heads = same_but_heads && (d == s.heads_dim || q.tensor.size(d) == k.tensor.size(d));
  TORCHOPS_CHECK(same_but_heads, op, k.name, " must have ", q.name, "'s shape but for the heads (dimension ", s.heads_dim,
                 "), got ", q.tensor.sizes(), " and ", k.tensor.sizes());
  s.batch = q.tensor.size(0);
  s.seq = q.tensor.size(seq_dim);
  s.heads_q = q.tensor.size(s.heads_dim);
  s.heads_k = k.tensor.size(s.heads_dim);
  s.head_dim = q.tensor.size(3);
  for (const NamedTensor& t : {cos, sin}) {
    check_defined_on(op, q, t);
    check_same_dtype(op, q, t);
    const auto c = t.tensor.sizes();
    TORCHOPS_CHECK(c.size() == 3 && (c[0] == 1 || c[0] == s.batch) && (c[1] == 1 || c[1] == s.seq), op, t.name,
                   " must be [1 or batch, 1 or seq, rot] = [1 or ", s.batch, ", 1 or ", s.seq, ", rot], got shape ", c);
  }
  check_same_shape(op, cos, sin);
  s.rot = cos.tensor.size(2);
  check_rotary_dim(op, cos, s.rot, "head_dim", s.head_dim);
  return s;
}

void check_qk_norm_weights(const char* op, NamedTensor q, NamedTensor k, NamedTensor q_weight, NamedTensor k_weight) {
  TORCHOPS_CHECK(q.tensor.size(-1) >= 1, op, q.name, "'s last dimension (the normalised one) must be at least 1, got shape ",
                 q.tensor.sizes());
  check_weight(op, q, q_weight);
  check_weight(op, k, k_weight);
}

void check_rotary_constants(const char* op, NamedTensor cos, NamedTensor sin) {
  for (const NamedTensor& t : {cos, sin}) {
    const char* why = autograd_use(t.tensor);
    TORCHOPS_CHECK(why == nullptr, op, "cos and sin are constants (no gradient flows to them), but ", t.name, " ", why,
                   "; pass ", t.name, ".detach()");
  }
}

void check_rotary_inference_only(const char* op, std::initializer_list<NamedTensor> tensors) {
  for (const NamedTensor& t : tensors) {
    const char* why = autograd_use(t.tensor);
    TORCHOPS_CHECK(why == nullptr, op, "it rotates query and key in place and records no gradient (inference only), but ",
                   t.name, " ", why);
  }
}

RotaryCacheShape check_rotary_cache(const char* op, const at::Tensor& positions, const at::Tensor& query,
                                    const std::optional<at::Tensor>& key, int64_t head_size,
                                    const at::Tensor& cos_sin_cache) {
  const NamedTensor p{"positions", positions}, q{"query", query}, c{"cos_sin_cache", cos_sin_cache};
  check_defined(op, p);
  check_dtype_in(op, p, {TORCHOPS_INT_DTYPES});
  TORCHOPS_CHECK(positions.dim() == 1, op, "positions must be 1-D, got shape ", positions.sizes());
  check_defined(op, q);
  check_dtype_in(op, q, {TORCHOPS_FLOAT_DTYPES});
  check_same_device(op, q, p);
  RotaryCacheShape s;
  s.tokens = positions.size(0);
  s.head_size = head_size;
  s.heads_q = check_cache_rows(op, q, s.tokens, head_size);
  const bool has_key = key.has_value() && key->defined();
  if (has_key) {
    const NamedTensor k{"key", *key};
    check_same_device(op, q, k);
    check_same_dtype(op, q, k);
    s.heads_k = check_cache_rows(op, k, s.tokens, head_size);
  }
  check_defined_on(op, q, c);
  TORCHOPS_CHECK(cos_sin_cache.dim() == 2, op, "cos_sin_cache must be 2-D, got shape ", cos_sin_cache.sizes());
  const auto dtype = query.scalar_type();
  const bool reduced = is_16bit_float_dtype(dtype);
  TORCHOPS_CHECK(cos_sin_cache.scalar_type() == dtype || (reduced && cos_sin_cache.scalar_type() == at::kFloat), op,
                 "cos_sin_cache must have query's dtype (", dtype, ")", reduced ? " or Float" : "", ", got ",
                 cos_sin_cache.scalar_type());
  s.max_position = cos_sin_cache.size(0);
  s.rot = cos_sin_cache.size(1);
  check_rotary_dim(op, c, s.rot, "head_size", head_size);
  // Memory: rotated in place, so query and key may share nothing with each other or with the cache (asked of
  // check_out_overlap only within one storage: it cannot decide views of different element sizes, a float32 cache
  // beside a 16-bit query, and separate storages share nothing anyway).
  check_out_overlap(op, q, {});
  if (same_storage(query, cos_sin_cache)) check_out_overlap(op, q, {c});
  if (has_key) {
    TORCHOPS_CHECK(!(key->numel() > 0 && key->const_data_ptr() == query.const_data_ptr()), op,
                   "query and key are the same memory: each is rotated in place, so they must not share any");
    check_out_overlap(op, {"key", *key}, {q});
    if (same_storage(*key, cos_sin_cache)) check_out_overlap(op, {"key", *key}, {c});
  }
  return s;
}

void check_positions_in_range(const char* op, const at::Tensor& positions, int64_t max_position) {
  const at::Tensor p = positions.contiguous();
  TORCHOPS_DISPATCH_INDEX_TYPES(p.scalar_type(), "rotary_positions", [&] {
    const index_t* v = p.const_data_ptr<index_t>();
    const int64_t n = p.numel();
    std::atomic<int64_t> first{n};
    at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (v[i] < 0 || v[i] >= max_position) {
          int64_t seen = first.load();
          while (i < seen && !first.compare_exchange_weak(seen, i)) {
          }
          return;
        }
      }
    });
    const int64_t bad = first.load();
    TORCHOPS_CHECK(bad == n, op, "positions must lie in [0, ", max_position, ") (the rows of cos_sin_cache), got positions[",
                   bad, "] = ", bad < n ? static_cast<int64_t>(v[bad]) : 0);
  });
}

HeadRows head_rows(const at::Tensor& t, const RotaryShape& shape) {
  HeadRows rows;
  rows.tensor = t.size(3) <= 1 || t.stride(3) == 1 ? t : t.contiguous();
  const at::Tensor& r = rows.tensor;
  const int heads = shape.heads_dim, seq = 3 - shape.heads_dim;
  // A size-1 dimension is never stepped along; stride 0 keeps its (arbitrary) stride out of alignment decisions.
  rows.batch_stride = r.size(0) > 1 ? r.stride(0) : 0;
  rows.head_stride = r.size(heads) > 1 ? r.stride(heads) : 0;
  rows.seq_stride = r.size(seq) > 1 ? r.stride(seq) : 0;
  return rows;
}

CosSinRows cos_sin_rows(const at::Tensor& cos, const at::Tensor& sin) {
  CosSinRows rows;
  rows.cos = cos.size(2) <= 1 || cos.stride(2) == 1 ? cos : cos.contiguous();
  rows.sin = sin.size(2) <= 1 || sin.stride(2) == 1 ? sin : sin.contiguous();
  rows.cos_batch = rows.cos.size(0) > 1 ? rows.cos.stride(0) : 0;
  rows.cos_seq = rows.cos.size(1) > 1 ? rows.cos.stride(1) : 0;
  rows.sin_batch = rows.sin.size(0) > 1 ? rows.sin.stride(0) : 0;
  rows.sin_seq = rows.sin.size(1) > 1 ? rows.sin.stride(1) : 0;
  return rows;
}

}  // namespace torchops
