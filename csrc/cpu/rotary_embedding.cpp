// The rotary ops on the CPU (rotary/rotary.h): work is split across cores by position (one token of one batch
// entry), whose cos and sin are converted once into per-element tables (f32; f64 for f64) that every head of q and
// k at that position then reads; the backward's tables hold the transposed sin (rotary_math.h), so one row
// rotation serves both directions. vLLM's cache rows (one cos and one sin per pair) are spread to the same
// per-element tables. Rows are rotated in f32 math (AVX2/FMA/F16C, picked at run time; at::vec-free scalar code
// otherwise and for f64), each output rounded once.
// qk_norm_rope normalises a row into an f32 table (x * rstd * (w + offset), rms_norm's order, the row's sum of
// squares blocked as norm/norm_cpu.h sums) and rotates that. Its backward rotates the gradient back first, then
// takes rms_norm's backward of the row; the weights' gradients are the norm engine's deterministic column partials
// (one partial row per fixed chunk of positions, summed in chunk order).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../core/cpu_avx2.h"
#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../norm/norm_cpu.h"
#include "../norm/norm.h"
#include "../rotary/rotary.h"
#include "../rotary/rotary_math.h"
#include "../rotary/rotary_ops.h"

namespace torchops {
namespace {

using rotary::pair_first;
using rotary::pair_second;

// A per-thread scratch row of n values (slot: several live at once).
template <typename A, int kSlot>
A* scratch(int64_t n) {
  thread_local std::vector<A> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

// ------------------------------------------------------------------------------------------------ tables
// The cos and sin of a position, one per rotated element; transposed: sin as the transposed rotation takes it.
template <typename T, typename A>
void fill_tables(const CosSinRows& cs, int64_t b, int64_t s, int64_t rot, bool interleaved, bool transposed, A* c,
                 A* sn) {
  const T* cr = cs.cos.const_data_ptr<T>() + b * cs.cos_batch + s * cs.cos_seq;
  const T* sr = cs.sin.const_data_ptr<T>() + b * cs.sin_batch + s * cs.sin_seq;
  for (int64_t j = 0; j < rot; ++j) {
    c[j] = static_cast<A>(cr[j]);
    sn[j] = static_cast<A>(sr[j]);
  }
  if (!transposed) return;
  for (int64_t i = 0; i < rot / 2; ++i) {
    const int64_t a = pair_first(i, rot / 2, interleaved), bb = pair_second(i, rot / 2, interleaved);
    const A sa = sn[a];
    sn[a] = -sn[bb];
    sn[bb] = -sa;
  }
}

// vLLM's cache row: cos of pair i at i, its sin at rot / 2 + i.
template <typename C, typename A>
void fill_cache_tables(const C* row, int64_t rot, bool interleaved, A* c, A* sn) {
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const A cv = static_cast<A>(row[i]), sv = static_cast<A>(row[half + i]);
    const int64_t a = pair_first(i, half, interleaved), b = pair_second(i, half, interleaved);
    c[a] = c[b] = cv;
    sn[a] = sn[b] = sv;
  }
}

// ------------------------------------------------------------------------------------------ row rotation
// y[0, rot) = the forward rotation of x by the tables, y[rot, n) = x[rot, n) (nothing to do in place). S and D are
// the source and destination types (the storage type, or A for a table of normalised values or gradients).
template <typename S, typename D, typename A>
void rotate_row_scalar(const S* x, D* y, const A* c, const A* s, int64_t from_pair, int64_t rot, bool interleaved) {
  const int64_t half = rot / 2;
  for (int64_t i = from_pair; i < half; ++i) {
    const int64_t a = pair_first(i, half, interleaved), b = pair_second(i, half, interleaved);
    A ya, yb;
    rotary::rotate_pair<false>(static_cast<A>(x[a]), static_cast<A>(x[b]), c[a], c[b], s[a], s[b], ya, yb);
    y[a] = static_cast<D>(ya);
    y[b] = static_cast<D>(yb);
  }
}

template <typename S, typename D>
void pass_through(const S* x, D* y, int64_t rot, int64_t n) {
  if (static_cast<const void*>(x) == static_cast<const void*>(y) || rot == n) return;
  if constexpr (std::is_same_v<S, D>) {
    std::memcpy(y + rot, x + rot, (n - rot) * sizeof(S));
  } else {
    for (int64_t j = rot; j < n; ++j) y[j] = static_cast<D>(x[j]);
  }
}

#ifdef TORCHOPS_HAS_AVX2_PATH
template <typename S, typename D>
TORCHOPS_TARGET_AVX2 void rotate_row_avx2(const S* x, D* y, const float* c, const float* s, int64_t rot,
                                          bool interleaved) {
  const int64_t half = rot / 2;
  int64_t done = 0;  // pairs rotated
  if (interleaved) {
    int64_t j = 0;
    for (; j + 8 <= rot; j += 8) {
      const __m256 v = cpu::load8_as_float(x + j);
      const __m256 partner = _mm256_permute_ps(v, 0xB1);  // (x_1, x_0, x_3, x_2, ...)
      // addsub: even lanes c x_a - s x_b, odd lanes c x_b + s x_a.
      const __m256 out = _mm256_addsub_ps(_mm256_mul_ps(_mm256_loadu_ps(c + j), v),
                                          _mm256_mul_ps(_mm256_loadu_ps(s + j), partner));
      cpu::store8_from_float(y + j, out);
    }
    done = j / 2;
  } else {
    int64_t i = 0;
    for (; i + 8 <= half; i += 8) {
      const __m256 xa = cpu::load8_as_float(x + i), xb = cpu::load8_as_float(x + half + i);
      const __m256 ya = _mm256_fmsub_ps(_mm256_loadu_ps(c + i), xa, _mm256_mul_ps(_mm256_loadu_ps(s + i), xb));
      const __m256 yb =
          _mm256_fmadd_ps(_mm256_loadu_ps(c + half + i), xb, _mm256_mul_ps(_mm256_loadu_ps(s + half + i), xa));
      cpu::store8_from_float(y + i, ya);
      cpu::store8_from_float(y + half + i, yb);
    }
    done = i;
  }
  rotate_row_scalar<S, D, float>(x, y, c, s, done, rot, interleaved);
}

// y[j] = x[j] as D for j in [from, n), 8 lanes at a time (float sources to 16-bit destinations).
template <typename S, typename D>
TORCHOPS_TARGET_AVX2 void convert_avx2(const S* x, D* y, int64_t from, int64_t n) {
  int64_t j = from;
  for (; j + 8 <= n; j += 8) cpu::store8_from_float(y + j, cpu::load8_as_float(x + j));
  for (; j < n; ++j) y[j] = static_cast<D>(static_cast<float>(x[j]));
}
#endif

template <typename T>
constexpr bool kAvx2Type = std::is_same_v<T, float> || std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;

template <typename S, typename D, typename A>
void rotate_row(const S* x, D* y, const A* c, const A* s, int64_t rot, int64_t n, bool interleaved) {
#ifdef TORCHOPS_HAS_AVX2_PATH
  if constexpr (std::is_same_v<A, float> && kAvx2Type<S> && kAvx2Type<D>) {
    if (cpu::cpu_has_avx2()) {
      rotate_row_avx2(x, y, c, s, rot, interleaved);
      if constexpr (!std::is_same_v<S, D>) {
        convert_avx2(x, y, rot, n);
        return;
      }
      pass_through(x, y, rot, n);
      return;
    }
  }
#endif
  rotate_row_scalar<S, D, A>(x, y, c, s, 0, rot, interleaved);
  pass_through(x, y, rot, n);
}

// ---------------------------------------------------------------------------------------- positions
// Work is split across cores in blocks of kBlock positions (a position: one token of one batch entry), whose cos and
// sin tables stay in L1 while every head of q and k at those positions is rotated. A block's rows are visited in the
// order of the output's layout: a head's positions one after another for [b, h, s, d] (kBlock consecutive rows),
// a position's heads for [b, s, h, d]; a position's heads of a [b, h, s, d] output are rows far apart.
constexpr int64_t kBlock = 16;

struct PositionBlock {
  int64_t first, count;  // positions [first, first + count)
};

int64_t blocks_of(int64_t positions) { return (positions + kBlock - 1) / kBlock; }

PositionBlock block_at(int64_t index, int64_t positions) {
  return {index * kBlock, std::min(kBlock, positions - index * kBlock)};
}

// fn(block) for every block of positions, split across cores; `work` elements a position.
template <typename Fn>
void for_each_block(int64_t positions, int64_t work, Fn&& fn) {
  if (positions == 0 || work == 0) return;
  norm_cpu::for_each_row(blocks_of(positions), work * kBlock, [&](int64_t i) { fn(block_at(i, positions)); });
}

// fn(i, b, h, s) for every head h < heads at every position i of the block (b, s: its batch entry and token), in
// the order of `out`'s layout.
template <typename Fn>
void for_each_row_of(const PositionBlock& blk, int64_t heads, int64_t seq, const HeadRows& out, Fn&& fn) {
  auto visit = [&](int64_t i, int64_t h) {
    const int64_t p = blk.first + i;
    fn(i, p / seq, h, p % seq);
  };
  if (out.head_stride >= out.seq_stride) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < blk.count; ++i) visit(i, h);
    }
  } else {
    for (int64_t i = 0; i < blk.count; ++i) {
      for (int64_t h = 0; h < heads; ++h) visit(i, h);
    }
  }
}

// The block's cos and sin tables: rot values per position, position i at i * rot.
template <typename T, typename A>
void fill_block_tables(const CosSinRows& cs, const PositionBlock& blk, int64_t seq, int64_t rot, bool interleaved,
                       bool transposed, A* c, A* sn) {
  for (int64_t i = 0; i < blk.count; ++i) {
    const int64_t p = blk.first + i;
    fill_tables<T>(cs, p / seq, p % seq, rot, interleaved, transposed, c + i * rot, sn + i * rot);
  }
}

template <typename T>
const T* row_of(const HeadRows& r, int64_t b, int64_t h, int64_t s) {
  return r.tensor.const_data_ptr<T>() + b * r.batch_stride + h * r.head_stride + s * r.seq_stride;
}

template <typename T>
T* mutable_row_of(const HeadRows& r, int64_t b, int64_t h, int64_t s) {
  return r.tensor.mutable_data_ptr<T>() + b * r.batch_stride + h * r.head_stride + s * r.seq_stride;
}

void rotate_cpu(const RotaryCall& call) {
  const RotaryShape& sh = call.shape;
  TORCHOPS_DISPATCH_FLOAT_TYPES(call.q.tensor.scalar_type(), "rotary_embedding_cpu", [&] {
    using T = scalar_t;
    using A = opmath_t<T>;
    const int64_t rot = sh.rot, n = sh.head_dim;
    for_each_block(sh.batch * sh.seq, (sh.heads_q + sh.heads_k) * n, [&](const PositionBlock& blk) {
      A* c = scratch<A, 0>(kBlock * rot);
      A* sn = scratch<A, 1>(kBlock * rot);
      fill_block_tables<T>(call.cs, blk, sh.seq, rot, call.interleaved, call.transposed, c, sn);
      auto side = [&](const HeadRows& in, const HeadRows& out, int64_t heads) {
        for_each_row_of(blk, heads, sh.seq, out, [&](int64_t i, int64_t b, int64_t h, int64_t s) {
          rotate_row(row_of<T>(in, b, h, s), mutable_row_of<T>(out, b, h, s), c + i * rot, sn + i * rot, rot, n,
                     call.interleaved);
        });
      };
      side(call.q, call.q_out, sh.heads_q);
      side(call.k, call.k_out, sh.heads_k);
    });
  });
}

// -------------------------------------------------------------------------------------- qk_norm_rope
// Sum of squares of a row, blocked as the norm engine sums (its error does not grow with the row).
template <typename T, typename A>
struct Squares {
  const T* x;
  template <typename V>
  std::array<V, 1> at(int64_t j) const {
    const V v = static_cast<V>(x[j]);
    return {v * v};
  }
#ifdef TORCHOPS_HAS_AVX2_PATH
  TORCHOPS_TARGET_AVX2 norm_cpu::Sums8<1> operator()(int64_t j) const {
    const __m256 v = cpu::load8_as_float(x + j);
    return {{_mm256_mul_ps(v, v)}};
  }
#endif
};

template <typename T, typename A>
double sum_of_squares(const T* x, int64_t n) {
  Squares<T, A> terms{x};
#ifdef TORCHOPS_HAS_AVX2_PATH
  if constexpr (std::is_same_v<A, float>) {
    if (cpu::cpu_has_avx2()) return norm_cpu::blocked_sums_avx2<1>(terms, n)[0];
  }
#endif
  return norm_cpu::blocked_sums_portable<A, 1, false>(terms, n)[0];
}

// rms_norm's inverse RMS of a row: mean, + eps, then 1 / sqrt, in the working precision.
template <typename A>
A inverse_rms(double sum_squares, int64_t n, double eps) {
  return A(1) / std::sqrt(static_cast<A>(sum_squares / static_cast<double>(n)) + static_cast<A>(eps));
}

#ifdef TORCHOPS_HAS_AVX2_PATH
template <typename T, typename W>
TORCHOPS_TARGET_AVX2 int64_t normalize_row_avx2(const T* x, const W* w, float rstd, float offset, float* out, int64_t n) {
  const __m256 vr = _mm256_set1_ps(rstd), voff = _mm256_set1_ps(offset);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_mul_ps(cpu::load8_as_float(x + j), vr);
    _mm256_storeu_ps(out + j, _mm256_mul_ps(v, _mm256_add_ps(cpu::load8_as_float(w + j), voff)));
  }
  return j;
}
#endif

// out[j] = (x[j] * rstd) * (w[j] + offset), the normalised row in A.
template <typename T, typename W, typename A>
void normalize_row(const T* x, const W* w, A rstd, A offset, A* out, int64_t n) {
  int64_t j = 0;
#ifdef TORCHOPS_HAS_AVX2_PATH
  if constexpr (std::is_same_v<A, float>) {
    if (cpu::cpu_has_avx2()) j = normalize_row_avx2(x, w, rstd, offset, out, n);
  }
#endif
  for (; j < n; ++j) out[j] = static_cast<A>(x[j]) * rstd * (static_cast<A>(w[j]) + offset);
}

// Runs rows(T{}, W{}, offset) for call's dtypes: T q's, W the weights' (T's, or float with a 16-bit T), the
// weight offset in T's math type.
template <typename Rows>
void dispatch_qk_norm(const QkNormCall& call, Rows&& rows) {
  dispatch_norm_types(call.rope.q.tensor.scalar_type(), call.q_weight, [&](auto t_tag, auto w_tag) {
    rows(t_tag, w_tag, static_cast<opmath_t<decltype(t_tag)>>(call.weight_offset));
  });
}

template <typename T, typename W, typename A>
void qk_norm_forward_rows(const QkNormCall& call, A offset) {
  const RotaryCall& r = call.rope;
  const RotaryShape& sh = r.shape;
  const int64_t rot = sh.rot, n = sh.head_dim;
  const W* wq = call.q_weight.const_data_ptr<W>();
  const W* wk = call.k_weight.const_data_ptr<W>();
  for_each_block(sh.batch * sh.seq, (sh.heads_q + sh.heads_k) * n, [&](const PositionBlock& blk) {
    A* c = scratch<A, 0>(kBlock * rot);
    A* sn = scratch<A, 1>(kBlock * rot);
    A* normed = scratch<A, 2>(n);
    fill_block_tables<T>(r.cs, blk, sh.seq, rot, r.interleaved, false, c, sn);
    auto side = [&](const HeadRows& in, const HeadRows& out, const W* w, int64_t heads) {
      for_each_row_of(blk, heads, sh.seq, out, [&](int64_t i, int64_t b, int64_t h, int64_t s) {
        const T* x = row_of<T>(in, b, h, s);
        const A rstd = inverse_rms<A>(sum_of_squares<T, A>(x, n), n, call.eps);
        normalize_row(x, w, rstd, offset, normed, n);
        rotate_row(static_cast<const A*>(normed), mutable_row_of<T>(out, b, h, s), c + i * rot, sn + i * rot, rot, n,
                   r.interleaved);
      });
    };
    side(r.q, r.q_out, wq, sh.heads_q);
    side(r.k, r.k_out, wk, sh.heads_k);
  });
}

void qk_norm_forward_cpu(const QkNormCall& call) {
  dispatch_qk_norm(call, [&](auto t, auto w, auto offset) {
    qk_norm_forward_rows<decltype(t), decltype(w)>(call, offset);
  });
}

// gn * (w + offset) * x summed over a row (gn: the normalised row's gradient, in A), blocked as Squares.
template <typename T, typename W, typename A>
struct GradDot {
  const A* gn;
  const W* w;
  const T* x;
  A offset;
  template <typename V>
  std::array<V, 1> at(int64_t j) const {
    return {static_cast<V>(gn[j]) * (static_cast<V>(w[j]) + static_cast<V>(offset)) * static_cast<V>(x[j])};
  }
#ifdef TORCHOPS_HAS_AVX2_PATH
  TORCHOPS_TARGET_AVX2 norm_cpu::Sums8<1> operator()(int64_t j) const {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(gn + j), _mm256_add_ps(cpu::load8_as_float(w + j), _mm256_set1_ps(offset)));
    return {{_mm256_mul_ps(g, cpu::load8_as_float(x + j))}};
  }
#endif
};

#ifdef TORCHOPS_HAS_AVX2_PATH
// dx = rstd * gn * w' - coef * x (when dx), dw += gn * x * rstd (when dw), 8 lanes at a time; returns where the
// scalar tail starts.
template <typename T, typename W>
TORCHOPS_TARGET_AVX2 int64_t norm_backward_avx2(const T* x, const float* gn, const W* w, float offset, float rstd,
                                                float coef, int64_t n, T* dx, float* dw) {
  const __m256 vr = _mm256_set1_ps(rstd), vc = _mm256_set1_ps(coef), voff = _mm256_set1_ps(offset);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 g = _mm256_loadu_ps(gn + j), xv = cpu::load8_as_float(x + j);
    if (dx != nullptr) {
      const __m256 gw = _mm256_mul_ps(g, _mm256_add_ps(cpu::load8_as_float(w + j), voff));
      cpu::store8_from_float(dx + j, _mm256_sub_ps(_mm256_mul_ps(vr, gw), _mm256_mul_ps(vc, xv)));
    }
    if (dw != nullptr) _mm256_storeu_ps(dw + j, _mm256_fmadd_ps(_mm256_mul_ps(g, xv), vr, _mm256_loadu_ps(dw + j)));
  }
  return j;
}
#endif

// One row of the backward, from gn = the gradient rotated back (the normalised row's gradient), in A:
//   rstd from x; d = sum(gn * w' * x); dx = rstd * gn * w' - x * rstd^3 * d / n; dw += gn * x * rstd.
template <typename T, typename W, typename A>
void norm_backward_row(const T* x, const A* gn, const W* w, A offset, double eps, int64_t n, T* dx, A* dw) {
  const A rstd = inverse_rms<A>(sum_of_squares<T, A>(x, n), n, eps);
  GradDot<T, W, A> terms{gn, w, x, offset};
  bool vectors = false;
  double dot = 0.0;
#ifdef TORCHOPS_HAS_AVX2_PATH
  if constexpr (std::is_same_v<A, float>) {
    vectors = cpu::cpu_has_avx2();
    if (vectors) dot = norm_cpu::blocked_sums_avx2<1>(terms, n)[0];
  }
#endif
  if (!vectors) dot = norm_cpu::blocked_sums_portable<A, 1, false>(terms, n)[0];
  const A coef = static_cast<A>(static_cast<double>(rstd) * rstd * rstd * dot / static_cast<double>(n));
  int64_t j = 0;
#ifdef TORCHOPS_HAS_AVX2_PATH
  if constexpr (std::is_same_v<A, float>) {
    if (vectors) j = norm_backward_avx2(x, gn, w, offset, rstd, coef, n, dx, dw);
  }
#endif
  for (; j < n; ++j) {
    const A xv = static_cast<A>(x[j]);
    if (dx != nullptr) dx[j] = static_cast<T>(rstd * gn[j] * (static_cast<A>(w[j]) + offset) - coef * xv);
    if (dw != nullptr) dw[j] += gn[j] * xv * rstd;
  }
}

template <typename T, typename W, typename A>
void qk_norm_backward_rows(const QkNormCall& call, A offset) {
  const RotaryCall& r = call.rope;
  const RotaryShape& sh = r.shape;
  const int64_t rot = sh.rot, n = sh.head_dim, positions = sh.batch * sh.seq;
  // One side (q or k): its input rows, incoming gradient rows, weight, outputs.
  auto side = [&](const HeadRows& in, const HeadRows& grad, const at::Tensor& weight, const at::Tensor& grad_in,
                  const at::Tensor& grad_weight, int64_t heads) {
    if (!grad.tensor.defined() || (!grad_in.defined() && !grad_weight.defined())) return;
    const W* w = weight.const_data_ptr<W>();
    HeadRows dx_rows;
    if (grad_in.defined()) dx_rows = head_rows(grad_in, sh);
    W* dw = grad_weight.defined() ? grad_weight.mutable_data_ptr<W>() : nullptr;
    // The partial rows of the weight's gradient: one per fixed chunk of position blocks (norm_cpu.h).
    norm_cpu::for_each_row_with_column_sums<A>(
        heads > 0 ? blocks_of(positions) : 0, n, dw != nullptr ? n : 0,
        [&](int64_t index, A* acc) {
          const PositionBlock blk = block_at(index, positions);
          A* c = scratch<A, 0>(kBlock * rot);
          A* sn = scratch<A, 1>(kBlock * rot);
          A* gn = scratch<A, 2>(n);
          fill_block_tables<T>(r.cs, blk, sh.seq, rot, r.interleaved, true, c, sn);
          const HeadRows& walked = grad_in.defined() ? dx_rows : in;
          for_each_row_of(blk, heads, sh.seq, walked, [&](int64_t i, int64_t b, int64_t h, int64_t s) {
            rotate_row(row_of<T>(grad, b, h, s), gn, c + i * rot, sn + i * rot, rot, n, r.interleaved);
            T* dx = grad_in.defined() ? mutable_row_of<T>(dx_rows, b, h, s) : nullptr;
            norm_backward_row(row_of<T>(in, b, h, s), gn, w, offset, call.eps, n, dx, acc);
          });
        },
        [&](int64_t j, double v) { dw[j] = static_cast<W>(v); });
  };
  side(r.q, call.grad_q, call.q_weight, call.grad_q_in, call.grad_q_weight, sh.heads_q);
  side(r.k, call.grad_k, call.k_weight, call.grad_k_in, call.grad_k_weight, sh.heads_k);
}

void qk_norm_backward_cpu(const QkNormCall& call) {
  dispatch_qk_norm(call, [&](auto t, auto w, auto offset) {
    qk_norm_backward_rows<decltype(t), decltype(w)>(call, offset);
  });
}

// ------------------------------------------------------------------------------------ rotary_embedding_
void rotate_cache_cpu(const RotaryCacheCall& call) {
  const RotaryCacheShape& sh = call.shape;
  check_positions_in_range("rotary_embedding_", call.positions, sh.max_position);
  if (sh.tokens == 0) return;
  const bool interleaved = !call.is_neox;
  TORCHOPS_DISPATCH_FLOAT_TYPES(call.query.scalar_type(), "rotary_embedding__cpu", [&] {
    using T = scalar_t;
    using A = opmath_t<T>;
    auto run = [&](auto c_tag) {
      using C = decltype(c_tag);
      TORCHOPS_DISPATCH_INDEX_TYPES(call.positions.scalar_type(), "rotary_embedding__cpu", [&] {
        const index_t* pos = call.positions.const_data_ptr<index_t>();
        const C* cache = call.cache.const_data_ptr<C>();
        T* q = call.query.mutable_data_ptr<T>();
        T* k = call.key.defined() ? call.key.mutable_data_ptr<T>() : nullptr;
        const int64_t rot = sh.rot, n = sh.head_size;
        norm_cpu::for_each_row(sh.tokens, (sh.heads_q + sh.heads_k) * n, [&](int64_t t) {
          A* c = scratch<A, 0>(rot);
          A* sn = scratch<A, 1>(rot);
          fill_cache_tables(cache + static_cast<int64_t>(pos[t]) * call.cache_stride, rot, interleaved, c, sn);
          for (int64_t h = 0; h < sh.heads_q; ++h) {
            T* row = q + t * call.query_token_stride + h * call.query_head_stride;
            rotate_row(static_cast<const T*>(row), row, c, sn, rot, n, interleaved);
          }
          for (int64_t h = 0; k != nullptr && h < sh.heads_k; ++h) {
            T* row = k + t * call.key_token_stride + h * call.key_head_stride;
            rotate_row(static_cast<const T*>(row), row, c, sn, rot, n, interleaved);
          }
        });
      });
    };
    if constexpr (is_16bit_float<T>) {
      if (call.cache.scalar_type() == at::kFloat) return run(float{});
    }
    run(T{});
  });
}

struct CpuRotary {
  static constexpr int64_t kMaxNormHeadDim = INT64_MAX;
  static at::Tensor empty(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor&) {
    return empty_dense_cpu(sizes, dtype);
  }
  static at::Tensor empty_strided(c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype,
                                  const at::Tensor&) {
    at::Tensor out = at::detail::empty_strided_cpu(sizes, strides, dtype);
    advise_huge_pages(out);
    return out;
  }
  static void rotate(const RotaryCall& call) { rotate_cpu(call); }
  static void qk_norm_forward(const QkNormCall& call) { qk_norm_forward_cpu(call); }
  static void qk_norm_backward(const QkNormCall& call) { qk_norm_backward_cpu(call); }
  static void rotate_cache(const RotaryCacheCall& call) { rotate_cache_cpu(call); }
};
using Ops = RotaryOps<CpuRotary>;

}  // namespace

TORCH_LIBRARY_IMPL(myns, CPU, m) {
  Ops::register_kernels(m);
}

}  // namespace torchops
