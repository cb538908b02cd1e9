// rms_norm, add_rms_norm and layer_norm on the CPU: one row math for both kinds on top of the row engine
// (norm/norm_cpu.h). layer_norm centres each row (kCentre); rms_norm does not (its mean is 0).
//   forward  - sweep 1 sums h - shift (centred; shift = h's first value) or h^2 (h = x, or for add_rms_norm
//              h = x + residual rounded to T and stored as residual_out in the same sweep); a centred row's
//              sweep 2 sums (h - mean)^2, the row still in cache (two passes: no cancellation, unlike
//              E[h^2] - mean^2); the last sweep writes (h - mean) * rstd * w + b, formed in f32 (f64 for
//              f64) and rounded once. A row whose sums overflow although its values are finite takes
//              norm_cpu::exact_row instead.
//   backward - with g = dy * w and xhat = (h - mean) * rstd, per row:
//              dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (+ grad_residual_out; no mean(g) term
//              uncentred), one sweep for the sums, one for dx and the column terms dy * xhat (dweight) and
//              dy (dbias). xhat stays of order 1 however large h is, so nothing here overflows first.
// w is the weight plus weight_offset and b the bias, both in the working precision, converted once per call.
// AVX2/FMA loops (8 f32 lanes; f16/bf16 converted by F16C / bit shifts) when the processor has them,
// at::vec (f32/f64) or scalar code otherwise; float64 always takes at::vec.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <type_traits>
#include <vector>

#include "../core/cpu_avx2.h"
#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../norm/norm.h"
#include "../norm/norm_cpu.h"
#include "../norm/norm_ops.h"

namespace torchops {
namespace {

// One forward row: h (= x, or x + residual stored to h_out), w and b (each nullable), output.
template <typename T, typename A>
struct ForwardRow {
  const T* x;
  const T* residual;  // null: no residual
  T* h_out;           // residual_out's row (with a residual)
  const A* w;
  const A* b;
  T* y;
};

// One backward row. dres (grad_residual_out), dx and the column accumulators may each be null.
template <typename T, typename A>
struct BackwardRow {
  const T* dy;
  const T* h;
  const T* dres;
  const A* w;
  T* dx;
  A* dw_acc;
  A* db_acc;
};

// A row's working-precision statistics: its mean (0 uncentred) and var (the biased variance centred, the
// mean square uncentred).
template <typename A>
struct Moments {
  A mean, var;
};

// A per-column parameter in the working precision A, plus `offset`: the tensor's own data where it already
// is that (and no offset), else a converted copy held in `scratch`. Null for an undefined tensor.
template <typename W, typename A>
const A* param_in(const at::Tensor& p, A offset, std::vector<A>& scratch) {
  if (!p.defined()) return nullptr;
  const W* src = p.const_data_ptr<W>();
  if constexpr (std::is_same_v<W, A>) {
    if (offset == A(0)) return src;
  }
  scratch.resize(p.numel());
  for (int64_t j = 0; j < p.numel(); ++j) scratch[j] = static_cast<A>(src[j]) + offset;
  return scratch.data();
}

// ---------------------------------------------------------------------------------- element math
// Generic in V: at::vec::Vectorized<A> (elements j.. of a row whose T is A) or A (element j).
template <typename V, typename P>
inline V load_as(const P* p) {
  if constexpr (std::is_arithmetic_v<V>) {
    return static_cast<V>(*p);
  } else {
    return V::loadu(p);
  }
}

template <typename P, typename V>
inline void store_as(P* p, V v) {
  if constexpr (std::is_arithmetic_v<V>) {
    *p = static_cast<P>(v);
  } else {
    v.store(p);
  }
}

// The first sweep's terms: h - shift (centred: for the mean) or h^2; with a residual, h = x + residual
// rounded to T is stored to h_out first. With `conv` (f32 sweeps of a 16-bit row), h is also stored there
// as f32, for the later sweeps to read without converting again.
template <bool kCentre, typename T, typename A>
struct FirstTerms {
  const T* x;
  const T* residual;
  T* h_out;
  A shift;
  float* conv;
  template <typename V>
  std::array<V, 1> at(int64_t j) const {
    V v = load_as<V>(x + j);
    if (residual != nullptr) {
      store_as(h_out + j, v + load_as<V>(residual + j));
      v = load_as<V>(h_out + j);  // the rounded value
    }
    if constexpr (std::is_same_v<V, float>) {
      if (conv != nullptr) conv[j] = v;
    }
    return {kCentre ? v - V(shift) : v * v};
  }
#ifdef TORCHOPS_HAS_AVX2_PATH
  TORCHOPS_TARGET_AVX2 norm_cpu::Sums8<1> operator()(int64_t j) const {
    __m256 v = cpu::load8_as_float(x + j);
    if (residual != nullptr) {
      v = _mm256_add_ps(v, cpu::load8_as_float(residual + j));
      cpu::store8_from_float(h_out + j, v);
      if constexpr (!std::is_same_v<T, float>) v = cpu::load8_as_float(h_out + j);
    }
    if (conv != nullptr) _mm256_storeu_ps(conv + j, v);
    return {{kCentre ? _mm256_sub_ps(v, _mm256_set1_ps(shift)) : _mm256_mul_ps(v, v)}};
  }
#endif
};

// The first sweep of a row: shift = h's first value when centred (the mean is then shift + sum / n:
// exactly the value for a row of equal ones, and no large sum to cancel for a row far from zero).
template <bool kCentre, typename T, typename A>
FirstTerms<kCentre, T, A> first_terms(const ForwardRow<T, A>& row, float* conv) {
  A shift = 0;
  if constexpr (kCentre) {
    shift = static_cast<A>(row.x[0]);
    if (row.residual != nullptr) shift = static_cast<A>(static_cast<T>(shift + static_cast<A>(row.residual[0])));
  }
  return {row.x, row.residual, row.h_out, shift, conv};
}

// (h - mean)^2: a centred row's second sweep.
template <typename T, typename A>
struct CentredSquares {
  const T* h;
  A mean;
  template <typename V>
  std::array<V, 1> at(int64_t j) const {
    const V d = load_as<V>(h + j) - V(mean);
    return {d * d};
  }
#ifdef TORCHOPS_HAS_AVX2_PATH
  TORCHOPS_TARGET_AVX2 norm_cpu::Sums8<1> operator()(int64_t j) const {
    const __m256 d = _mm256_sub_ps(cpu::load8_as_float(h + j), _mm256_set1_ps(mean));
    return {{_mm256_mul_ps(d, d)}};
  }
#endif
};

template <bool kCentre, typename V, typename T, typename A>
inline V xhat_at(const T* h, int64_t j, A mean, A rstd) {
  if constexpr (kCentre) {
    return (load_as<V>(h + j) - V(mean)) * V(rstd);
  } else {
    return load_as<V>(h + j) * V(rstd);
  }
}

template <typename V, typename T, typename A>
inline V grad_at(const BackwardRow<T, A>& row, int64_t j) {
  const V d = load_as<V>(row.dy + j);
  return row.w != nullptr ? d * load_as<V>(row.w + j) : d;
}

// The backward's row sums: g * xhat, and (centred) g.
template <bool kCentre, typename T, typename A>
struct GradTerms {
  static constexpr int K = kCentre ? 2 : 1;
  const BackwardRow<T, A>& row;
  A mean, rstd;
  template <typename V>
  std::array<V, K> at(int64_t j) const {
    const V g = grad_at<V>(row, j);
    const V gx = g * xhat_at<kCentre, V>(row.h, j, mean, rstd);
    if constexpr (kCentre) {
      return {gx, g};
    } else {
      return {gx};
    }
  }
#ifdef TORCHOPS_HAS_AVX2_PATH
  TORCHOPS_TARGET_AVX2 norm_cpu::Sums8<K> operator()(int64_t j) const {
    __m256 g = cpu::load8_as_float(row.dy + j);
    if (row.w != nullptr) g = _mm256_mul_ps(g, _mm256_loadu_ps(row.w + j));
    __m256 xhat = cpu::load8_as_float(row.h + j);
    if constexpr (kCentre) xhat = _mm256_sub_ps(xhat, _mm256_set1_ps(mean));
    xhat = _mm256_mul_ps(xhat, _mm256_set1_ps(rstd));
    if constexpr (kCentre) {
      return {{_mm256_mul_ps(g, xhat), g}};
    } else {
      return {{_mm256_mul_ps(g, xhat)}};
    }
  }
#endif
};

// Output element(s) j: (h - mean) * rstd * w + b.
template <bool kCentre, typename V, typename T, typename A>
inline V normalized_at(const T* h, const A* w, const A* b, int64_t j, A mean, A rstd) {
  V v = xhat_at<kCentre, V>(h, j, mean, rstd);
  if (w != nullptr) v = v * load_as<V>(w + j);
  if (b != nullptr) v = v + load_as<V>(b + j);
  return v;
}

// dx (rstd * g - xhat * c2 - c1, + dres) of element(s) j into `dx` when wanted, and their column terms.
template <bool kCentre, typename V, typename T, typename A, typename Y>
inline void grad_input_at(const BackwardRow<T, A>& row, Y* dx, int64_t j, A mean, A rstd, A c1, A c2) {
  const V xhat = xhat_at<kCentre, V>(row.h, j, mean, rstd);
  if (dx != nullptr) {
    V v = V(rstd) * grad_at<V>(row, j) - xhat * V(c2);
    if constexpr (kCentre) v = v - V(c1);
    if (row.dres != nullptr) v = v + load_as<V>(row.dres + j);
    store_as(dx + j, v);
  }
  const V d = load_as<V>(row.dy + j);
  if (row.dw_acc != nullptr) store_as(row.dw_acc + j, load_as<V>(row.dw_acc + j) + d * xhat);
  if (row.db_acc != nullptr) store_as(row.db_acc + j, load_as<V>(row.db_acc + j) + d);
}

// The row from element j0 on (null pointers stay null).
template <typename P>
P* from(P* p, int64_t j0) {
  return p != nullptr ? p + j0 : nullptr;
}

template <typename T, typename A>
BackwardRow<T, A> from(const BackwardRow<T, A>& r, int64_t j0) {
  return {from(r.dy, j0), from(r.h, j0), from(r.dres, j0), from(r.w, j0), from(r.dx, j0), from(r.dw_acc, j0),
          from(r.db_acc, j0)};
}

// ---------------------------------------------------------------------------------- row sweeps
// Each provides moments (the statistics' sweeps), apply (the output sweep), grad_sums and grad_input.

// at::vec when T is the math type (f32, f64), scalar code otherwise (f16/bf16 without AVX2).
struct PortableRows {
  template <typename T>
  static constexpr bool kVec = std::is_same_v<T, opmath_t<T>>;
  template <typename T>
  static constexpr bool kConverts = false;

  template <typename T, typename Fn>
  static void for_each(int64_t n, Fn&& fn) {
    using A = opmath_t<T>;
    using Vec = at::vec::Vectorized<A>;
    int64_t j = 0;
    if constexpr (kVec<T>) {
      for (; j + Vec::size() <= n; j += Vec::size()) fn(Vec(), j);
    }
    for (; j < n; ++j) fn(A(), j);
  }

  template <bool kCentre, typename T, typename A>
  static Moments<A> moments(const ForwardRow<T, A>& row, int64_t n, float* /*conv*/) {
    const auto first = first_terms<kCentre>(row, nullptr);
    const double s = norm_cpu::blocked_sums_portable<A, 1, kVec<T>>(first, n)[0];
    const A m = static_cast<A>(first.shift + s / static_cast<double>(n));
    if constexpr (!kCentre) return {A(0), m};
    const CentredSquares<T, A> squares{row.residual != nullptr ? row.h_out : row.x, m};
    const double ss = norm_cpu::blocked_sums_portable<A, 1, kVec<T>>(squares, n)[0];
    return {m, static_cast<A>(ss / static_cast<double>(n))};
  }

  template <bool kCentre, typename T, typename A>
  static void apply(const ForwardRow<T, A>& row, const T* h, const float* /*conv*/, int64_t n, A mean, A rstd) {
    for_each<T>(n, [&](auto v, int64_t j) {
      store_as(row.y + j, normalized_at<kCentre, decltype(v)>(h, row.w, row.b, j, mean, rstd));
    });
  }

  template <bool kCentre, typename T, typename A>
  static auto grad_sums(const BackwardRow<T, A>& row, A mean, A rstd, int64_t n) {
    const GradTerms<kCentre, T, A> terms{row, mean, rstd};
    return norm_cpu::blocked_sums_portable<A, GradTerms<kCentre, T, A>::K, kVec<T>>(terms, n);
  }

  template <bool kCentre, typename T, typename A>
  static void grad_input(const BackwardRow<T, A>& row, A mean, A rstd, A c1, A c2, int64_t n) {
    for_each<T>(n, [&](auto v, int64_t j) { grad_input_at<kCentre, decltype(v)>(row, row.dx, j, mean, rstd, c1, c2); });
  }
};

#ifdef TORCHOPS_HAS_AVX2_PATH
// 8 f32 lanes for f16/bf16/f32 rows; tails through the portable element math. bf16 results go through
// f32 blocks rounded by AVX512-BF16 where the processor has it (norm_cpu::by_bf16_blocks). The row's
// pointers are copied to locals: stores through T* may alias the row struct, which would reload them every
// step.
struct Avx2Rows {
  template <typename T>
  static constexpr bool kConverts = is_16bit_float<T>;

  // conv: where a 16-bit row's first sweep leaves it as f32 (n floats), which the later sweeps read instead.
  template <bool kCentre, typename T>
  TORCHOPS_TARGET_AVX2 static Moments<float> moments(const ForwardRow<T, float>& row, int64_t n, float* conv) {
    const auto first = first_terms<kCentre>(row, conv);
    const double s = norm_cpu::blocked_sums_avx2<1>(first, n)[0];
    const float m = static_cast<float>(first.shift + s / static_cast<double>(n));
    if constexpr (!kCentre) return {0.f, m};
    if (conv != nullptr) return {m, centred_mean_square(conv, n, m)};
    return {m, centred_mean_square(row.residual != nullptr ? row.h_out : row.x, n, m)};
  }

  template <typename H>
  TORCHOPS_TARGET_AVX2 static float centred_mean_square(const H* h, int64_t n, float mean) {
    const CentredSquares<H, float> squares{h, mean};
    return static_cast<float>(norm_cpu::blocked_sums_avx2<1>(squares, n)[0] / static_cast<double>(n));
  }

  // y[0..n) from h, w, b (each from the same element on).
  template <bool kCentre, typename T, typename Y>
  TORCHOPS_TARGET_AVX2 static void apply_to(const T* h, const float* w, const float* b, Y* y, int64_t n, float mean,
                                            float rstd) {
    const __m256 vm = _mm256_set1_ps(mean), vr = _mm256_set1_ps(rstd);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      __m256 v = cpu::load8_as_float(h + j);
      if constexpr (kCentre) v = _mm256_sub_ps(v, vm);
      v = _mm256_mul_ps(v, vr);
      if (w != nullptr) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + j));
      if (b != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(b + j));
      cpu::store8_from_float(y + j, v);
    }
    for (; j < n; ++j) y[j] = static_cast<Y>(normalized_at<kCentre, float>(h, w, b, j, mean, rstd));
  }

  template <bool kCentre, typename T>
  TORCHOPS_TARGET_AVX2 static void apply(const ForwardRow<T, float>& row, const T* h, const float* conv, int64_t n,
                                         float mean, float rstd) {
    if (conv != nullptr) return apply_from<kCentre>(row, conv, n, mean, rstd);
    apply_from<kCentre>(row, h, n, mean, rstd);
  }

  template <bool kCentre, typename T, typename H>
  TORCHOPS_TARGET_AVX2 static void apply_from(const ForwardRow<T, float>& row, const H* h, int64_t n, float mean,
                                              float rstd) {
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      if (norm_cpu::cpu_has_avx512bf16()) {
        return norm_cpu::by_bf16_blocks(row.y, n, [&](float* buf, int64_t j0, int64_t len) {
          apply_to<kCentre>(h + j0, from(row.w, j0), from(row.b, j0), buf, len, mean, rstd);
        });
      }
    }
    apply_to<kCentre>(h, row.w, row.b, row.y, n, mean, rstd);
  }

  template <bool kCentre, typename T>
  TORCHOPS_TARGET_AVX2 static auto grad_sums(const BackwardRow<T, float>& row, float mean, float rstd, int64_t n) {
    const GradTerms<kCentre, T, float> terms{row, mean, rstd};
    return norm_cpu::blocked_sums_avx2<GradTerms<kCentre, T, float>::K>(terms, n);
  }

  // dx[0..n) (when dx is not null) and the column terms, of the row from the same element on.
  template <bool kCentre, typename T, typename Y>
  TORCHOPS_TARGET_AVX2 static void grad_input_to(const BackwardRow<T, float>& row, Y* dx, float mean, float rstd,
                                                 float c1, float c2, int64_t n) {
    const T *dy = row.dy, *h = row.h, *dres = row.dres;
    const float* w = row.w;
    float *dw_acc = row.dw_acc, *db_acc = row.db_acc;
    const __m256 vm = _mm256_set1_ps(mean), vr = _mm256_set1_ps(rstd), vc1 = _mm256_set1_ps(c1),
                 vc2 = _mm256_set1_ps(c2);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 d = cpu::load8_as_float(dy + j);
      __m256 xhat = cpu::load8_as_float(h + j);
      if constexpr (kCentre) xhat = _mm256_sub_ps(xhat, vm);
      xhat = _mm256_mul_ps(xhat, vr);
      if (dx != nullptr) {
        const __m256 g = w != nullptr ? _mm256_mul_ps(d, _mm256_loadu_ps(w + j)) : d;
        __m256 v = _mm256_fnmadd_ps(xhat, vc2, _mm256_mul_ps(vr, g));
        if constexpr (kCentre) v = _mm256_sub_ps(v, vc1);
        if (dres != nullptr) v = _mm256_add_ps(v, cpu::load8_as_float(dres + j));
        cpu::store8_from_float(dx + j, v);
      }
      if (dw_acc != nullptr) _mm256_storeu_ps(dw_acc + j, _mm256_fmadd_ps(d, xhat, _mm256_loadu_ps(dw_acc + j)));
      if (db_acc != nullptr) _mm256_storeu_ps(db_acc + j, _mm256_add_ps(d, _mm256_loadu_ps(db_acc + j)));
    }
    for (; j < n; ++j) grad_input_at<kCentre, float>(row, dx, j, mean, rstd, c1, c2);
  }

  template <bool kCentre, typename T>
  TORCHOPS_TARGET_AVX2 static void grad_input(const BackwardRow<T, float>& row, float mean, float rstd, float c1,
                                              float c2, int64_t n) {
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      if (row.dx != nullptr && norm_cpu::cpu_has_avx512bf16()) {
        return norm_cpu::by_bf16_blocks(row.dx, n, [&](float* buf, int64_t j0, int64_t len) {
          grad_input_to<kCentre>(from(row, j0), buf, mean, rstd, c1, c2, len);
        });
      }
    }
    grad_input_to<kCentre>(row, row.dx, mean, rstd, c1, c2, n);
  }
};
#endif

// Calls fn(Rows{}) with the fastest row sweeps this processor runs for working precision A.
template <typename A, typename Fn>
void with_rows(Fn&& fn) {
#ifdef TORCHOPS_HAS_AVX2_PATH
  if constexpr (std::is_same_v<A, float>) {
    if (cpu::cpu_has_avx2()) return fn(Avx2Rows{});
  }
#endif
  fn(PortableRows{});
}

// ---------------------------------------------------------------------------------------- forward

template <bool kCentre>
void forward_cpu(const NormForward& f) {
  const NormRows x = norm_rows(f.input);
  if (x.rows == 0) return;
  const NormRows res = f.residual.defined() ? norm_rows(f.residual) : NormRows{};
  // weight and bias share one dtype when both are given; either sets it alone.
  const at::Tensor& param = f.weight.defined() ? f.weight : f.bias;
  dispatch_norm_types(f.input.scalar_type(), param, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    using A = opmath_t<T>;
    std::vector<A> w_scratch, b_scratch;
    const A* pw = param_in<W>(f.weight, static_cast<A>(f.weight_offset), w_scratch);
    const A* pb = param_in<W>(f.bias, A(0), b_scratch);
    const T* px = x.tensor.const_data_ptr<T>();
    const T* pres = f.residual.defined() ? res.tensor.const_data_ptr<T>() : nullptr;
    T* ph = f.residual.defined() ? f.residual_out.mutable_data_ptr<T>() : nullptr;
    T* py = f.out.mutable_data_ptr<T>();
    A* pmean = f.mean.defined() ? f.mean.mutable_data_ptr<A>() : nullptr;
    A* prstd = f.rstd.defined() ? f.rstd.mutable_data_ptr<A>() : nullptr;
    const int64_t n = x.cols;
    const A eps = static_cast<A>(f.eps);
    with_rows<A>([&](auto rows_tag) {
      using Rows = decltype(rows_tag);
      norm_cpu::for_each_row(x.rows, n, [&](int64_t row) {
        const ForwardRow<T, A> r{px + row * x.row_stride, pres != nullptr ? pres + row * res.row_stride : nullptr,
                                 ph != nullptr ? ph + row * n : nullptr, pw, pb, py + row * n};
        const T* h = ph != nullptr ? r.h_out : r.x;
        float* conv = nullptr;
        if constexpr (Rows::template kConverts<T>) {
          thread_local std::vector<float> conv_row;
          conv_row.resize(n);
          conv = conv_row.data();
        }
        const Moments<A> m = Rows::template moments<kCentre>(r, n, conv);
        A mean = m.mean, rstd;
        norm_cpu::ExactStats exact;
        if (!(std::isfinite(m.mean) && std::isfinite(m.var)) &&
            norm_cpu::exact_row<A>(h, n, kCentre, f.eps, pw, pb, r.y, exact)) {
          mean = static_cast<A>(exact.mean);
          rstd = static_cast<A>(exact.rstd);
        } else {
          rstd = A(1) / std::sqrt(m.var + eps);  // F.rms_norm's and F.layer_norm's order
          Rows::template apply<kCentre>(r, h, conv, n, mean, rstd);
        }
        if (pmean != nullptr) pmean[row] = mean;
        if (prstd != nullptr) prstd[row] = rstd;
      });
    });
  });
}

// --------------------------------------------------------------------------------------- backward

template <bool kCentre>
void backward_cpu(const NormBackward& b) {
  const NormRows x = norm_rows(b.input);
  const NormRows dy = norm_rows(b.grad_out);
  const NormRows dr = b.grad_residual_out.defined() ? norm_rows(b.grad_residual_out) : NormRows{};
  const at::Tensor rstd = b.rstd.contiguous();
  const at::Tensor mean = kCentre ? b.mean.contiguous() : at::Tensor();
  const int64_t n = x.cols;
  const bool want_w = b.grad_weight.defined(), want_b = b.grad_bias.defined();
  const int64_t width = (int64_t{want_w} + int64_t{want_b}) * n;
  dispatch_norm_types(b.input.scalar_type(), b.weight, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    using A = opmath_t<T>;
    std::vector<A> w_scratch;
    const A* pw = param_in<W>(b.weight, static_cast<A>(b.weight_offset), w_scratch);
    const bool rows = x.rows > 0;
    const T* px = rows ? x.tensor.const_data_ptr<T>() : nullptr;
    const T* pdy = rows ? dy.tensor.const_data_ptr<T>() : nullptr;
    const T* pdr = rows && b.grad_residual_out.defined() ? dr.tensor.const_data_ptr<T>() : nullptr;
    const A* prstd = rstd.const_data_ptr<A>();
    const A* pmean = kCentre ? mean.const_data_ptr<A>() : nullptr;
    T* pdx = b.grad_input.defined() ? b.grad_input.mutable_data_ptr<T>() : nullptr;
    // grad_bias has weight's dtype, or the statistics' without a weight (norm_ops.h).
    W* pgw = want_w ? b.grad_weight.mutable_data_ptr<W>() : nullptr;
    W* pgb_w = want_b && pw != nullptr ? b.grad_bias.mutable_data_ptr<W>() : nullptr;
    A* pgb_a = want_b && pw == nullptr ? b.grad_bias.mutable_data_ptr<A>() : nullptr;
    with_rows<A>([&](auto rows_tag) {
      using Rows = decltype(rows_tag);
      norm_cpu::for_each_row_with_column_sums<A>(
          x.rows, n, width,
          [&](int64_t row, A* stage) {
            const BackwardRow<T, A> r{pdy + row * dy.row_stride, px + row * x.row_stride,
                                      pdr != nullptr ? pdr + row * dr.row_stride : nullptr, pw,
                                      pdx != nullptr ? pdx + row * n : nullptr,
                                      want_w ? stage : nullptr, want_b ? stage + (want_w ? n : 0) : nullptr};
            const A mu = kCentre ? pmean[row] : A(0), rs = prstd[row];
            A c1 = 0, c2 = 0;
            if (r.dx != nullptr) {
              const auto sums = Rows::template grad_sums<kCentre>(r, mu, rs, n);
              c2 = static_cast<A>(static_cast<double>(rs) * sums[0] / static_cast<double>(n));
              if constexpr (kCentre) c1 = static_cast<A>(static_cast<double>(rs) * sums[1] / static_cast<double>(n));
            }
            Rows::template grad_input<kCentre>(r, mu, rs, c1, c2, n);
          },
          [&](int64_t j, double v) {
            if (want_w && j < n) {
              pgw[j] = static_cast<W>(v);
            } else if (pgb_w != nullptr) {
              pgb_w[j - (want_w ? n : 0)] = static_cast<W>(v);
            } else {
              pgb_a[j - (want_w ? n : 0)] = static_cast<A>(v);
            }
          });
    });
  });
}

// What the shared entry points (norm_ops.h) call on the CPU.
struct CpuNorm {
  static constexpr int64_t kMaxRow = INT64_MAX;
  static at::Tensor empty(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor&) {
    return empty_dense_cpu(sizes, dtype);
  }
  static void forward(const NormForward& f) {
    f.kind == NormKind::kLayer ? forward_cpu<true>(f) : forward_cpu<false>(f);
  }
  static void backward(const NormBackward& b) {
    b.kind == NormKind::kLayer ? backward_cpu<true>(b) : backward_cpu<false>(b);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(myns, CPU, m) { register_norm_ops<CpuNorm>(m); }

}  // namespace torchops
