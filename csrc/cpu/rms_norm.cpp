// rms_norm and add_rms_norm on the CPU: the row math on top of the row engine (norm/norm_cpu.h).
//   forward  - sweep 1 sums the squares of the row h (h = x, or for add_rms_norm h = x + residual rounded to
//              T and stored as residual_out in the same sweep); sweep 2 writes (h * rstd) * (w + offset),
//              formed in f32 (f64 for f64) and rounded once, F.rms_norm's order. For add_rms_norm the second
//              sweep reads h back from residual_out, still in cache.
//   backward - per row: s = sum((dy * (w + offset)) * h), then dx = rstd * dy * (w + offset) - h * rstd^3 / N * s
//              (+ grad_residual_out for add_rms_norm); dweight's partial rows sum dy * h * rstd.
// AVX2/FMA loops (8 f32 lanes; f16/bf16 converted by F16C / bit shifts) when the processor has them,
// at::vec (f32/f64) or scalar code otherwise; float64 always takes at::vec.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>

#include "../core/cpu_avx2.h"
#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../norm/norm.h"
#include "../norm/norm_ops.h"
#include "../norm/norm_cpu.h"

namespace torchops {
namespace {

using norm_cpu::blocked_sum_portable;

template <typename A>
inline A inverse_rms(double sum_squares, int64_t n, A eps) {
  // Same order as F.rms_norm: mean, + eps, then 1/sqrt, in the working precision.
  return A(1) / std::sqrt(static_cast<A>(sum_squares / static_cast<double>(n)) + eps);
}

// One forward row: h (= x, or x + residual stored to h_out), weight (nullable), output.
template <typename T, typename W>
struct ForwardRow {
  const T* x;
  const T* residual;  // null: plain rms_norm
  T* h_out;           // residual_out's row (with residual)
  const W* w;
  T* y;
};

// One backward row. dx's extra term dres (grad_residual_out) may be null; dx and dw_acc may each be null.
template <typename T, typename W, typename A>
struct BackwardRow {
  const T* dy;
  const T* h;
  const T* dres;
  const W* w;
  T* dx;
  A* dw_acc;
};

// ------------------------------------------------------------------------------------------- AVX2 rows
#ifdef TORCHOPS_HAS_AVX2_PATH
template <typename T>
struct SquaresAvx2 {
  const T* x;
  TORCHOPS_TARGET_AVX2 __m256 operator()(int64_t j) const {
    const __m256 v = cpu::load8_as_float(x + j);
    return _mm256_mul_ps(v, v);
  }
  float scalar(int64_t j) const {
    const float v = static_cast<float>(x[j]);
    return v * v;
  }
};

// Stores h = round_T(x + r) and returns the squares of the rounded values.
template <typename T>
struct AddSquaresAvx2 {
  const T* x;
  const T* r;
  T* h;
  TORCHOPS_TARGET_AVX2 __m256 operator()(int64_t j) const {
    __m256 v = _mm256_add_ps(cpu::load8_as_float(x + j), cpu::load8_as_float(r + j));
    cpu::store8_from_float(h + j, v);
    if constexpr (!std::is_same_v<T, float>) v = cpu::load8_as_float(h + j);  // the rounded value
    return _mm256_mul_ps(v, v);
  }
  float scalar(int64_t j) const {
    h[j] = static_cast<T>(static_cast<float>(x[j]) + static_cast<float>(r[j]));
    const float v = static_cast<float>(h[j]);
    return v * v;
  }
};

// (dy * (w + offset)) * h, or dy * h without a weight.
template <typename T, typename W>
struct GradDotAvx2 {
  const T* dy;
  const T* h;
  const W* w;
  float offset;
  TORCHOPS_TARGET_AVX2 __m256 operator()(int64_t j) const {
    __m256 g = cpu::load8_as_float(dy + j);
    if (w != nullptr) g = _mm256_mul_ps(g, _mm256_add_ps(cpu::load8_as_float(w + j), _mm256_set1_ps(offset)));
    return _mm256_mul_ps(g, cpu::load8_as_float(h + j));
  }
  float scalar(int64_t j) const {
    float g = static_cast<float>(dy[j]);
    if (w != nullptr) g *= static_cast<float>(w[j]) + offset;
    return g * static_cast<float>(h[j]);
  }
};

template <typename T, typename W>
TORCHOPS_TARGET_AVX2 float forward_row_avx2(const ForwardRow<T, W>& row, int64_t n, float eps, float offset) {
  double ss;
  const T* h = row.x;
  if (row.residual != nullptr) {
    AddSquaresAvx2<T> terms{row.x, row.residual, row.h_out};
    ss = norm_cpu::blocked_sum_avx2(terms, n);
    h = row.h_out;
  } else {
    SquaresAvx2<T> terms{row.x};
    ss = norm_cpu::blocked_sum_avx2(terms, n);
  }
  const float r = inverse_rms(ss, n, eps);
  const __m256 vr = _mm256_set1_ps(r), voff = _mm256_set1_ps(offset);
  int64_t j = 0;
  if (row.w != nullptr) {
    for (; j + 8 <= n; j += 8) {
      const __m256 v = _mm256_mul_ps(cpu::load8_as_float(h + j), vr);
      cpu::store8_from_float(row.y + j, _mm256_mul_ps(v, _mm256_add_ps(cpu::load8_as_float(row.w + j), voff)));
    }
    for (; j < n; ++j) {
      row.y[j] = static_cast<T>(static_cast<float>(h[j]) * r * (static_cast<float>(row.w[j]) + offset));
    }
  } else {
    for (; j + 8 <= n; j += 8) cpu::store8_from_float(row.y + j, _mm256_mul_ps(cpu::load8_as_float(h + j), vr));
    for (; j < n; ++j) row.y[j] = static_cast<T>(static_cast<float>(h[j]) * r);
  }
  return r;
}

template <typename T, typename W>
TORCHOPS_TARGET_AVX2 void backward_row_avx2(const BackwardRow<T, W, float>& row, float r, int64_t n, float offset) {
  float c = 0.f;
  if (row.dx != nullptr) {
    GradDotAvx2<T, W> terms{row.dy, row.h, row.w, offset};
    const double s = norm_cpu::blocked_sum_avx2(terms, n);
    c = static_cast<float>(static_cast<double>(r) * r * r * s / static_cast<double>(n));
  }
  const __m256 vr = _mm256_set1_ps(r), vc = _mm256_set1_ps(c), voff = _mm256_set1_ps(offset);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 d = cpu::load8_as_float(row.dy + j), hv = cpu::load8_as_float(row.h + j);
    if (row.dx != nullptr) {
      const __m256 g = row.w != nullptr ? _mm256_mul_ps(d, _mm256_add_ps(cpu::load8_as_float(row.w + j), voff)) : d;
      __m256 dx = _mm256_sub_ps(_mm256_mul_ps(vr, g), _mm256_mul_ps(vc, hv));
      if (row.dres != nullptr) dx = _mm256_add_ps(dx, cpu::load8_as_float(row.dres + j));
      cpu::store8_from_float(row.dx + j, dx);
    }
    if (row.dw_acc != nullptr) {
      _mm256_storeu_ps(row.dw_acc + j, _mm256_fmadd_ps(_mm256_mul_ps(d, hv), vr, _mm256_loadu_ps(row.dw_acc + j)));
    }
  }
  for (; j < n; ++j) {
    const float d = static_cast<float>(row.dy[j]), hv = static_cast<float>(row.h[j]);
    if (row.dx != nullptr) {
      const float g = row.w != nullptr ? d * (static_cast<float>(row.w[j]) + offset) : d;
      float dx = r * g - c * hv;
      if (row.dres != nullptr) dx += static_cast<float>(row.dres[j]);
      row.dx[j] = static_cast<T>(dx);
    }
    if (row.dw_acc != nullptr) row.dw_acc[j] += d * hv * r;
  }
}
#endif

// ----------------------------------------------------------------------------------- portable rows
// at::vec when T, W and the math type agree (f32, f64), scalar code otherwise (f16/bf16 without AVX2).
template <typename T, typename W>
constexpr bool kVecPath = std::is_same_v<T, opmath_t<T>> && std::is_same_v<W, T>;

template <typename T, typename W>
struct SquaresPortable {
  using A = opmath_t<T>;
  const T* x;
  at::vec::Vectorized<A> vec(int64_t j) const {
    if constexpr (kVecPath<T, W>) {
      const auto v = at::vec::Vectorized<A>::loadu(x + j);
      return v * v;
    } else {
      return at::vec::Vectorized<A>(A(0));  // unused
    }
  }
  A scalar(int64_t j) const {
    const A v = static_cast<A>(x[j]);
    return v * v;
  }
};

template <typename T, typename W>
struct GradDotPortable {
  using A = opmath_t<T>;
  const T* dy;
  const T* h;
  const W* w;
  A offset;
  at::vec::Vectorized<A> vec(int64_t j) const {
    using Vec = at::vec::Vectorized<A>;
    if constexpr (kVecPath<T, W>) {
      Vec g = Vec::loadu(dy + j);
      if (w != nullptr) g = g * (Vec::loadu(w + j) + Vec(offset));
      return g * Vec::loadu(h + j);
    } else {
      return Vec(A(0));  // unused
    }
  }
  A scalar(int64_t j) const {
    A g = static_cast<A>(dy[j]);
    if (w != nullptr) g *= static_cast<A>(w[j]) + offset;
    return g * static_cast<A>(h[j]);
  }
};

template <typename T, typename W>
opmath_t<T> forward_row_portable(const ForwardRow<T, W>& row, int64_t n, opmath_t<T> eps, opmath_t<T> offset) {
  using A = opmath_t<T>;
  using Vec = at::vec::Vectorized<A>;
  const T* h = row.x;
  if (row.residual != nullptr) {  // h = x + residual, rounded to T (rare path: no vectors)
    for (int64_t j = 0; j < n; ++j) row.h_out[j] = static_cast<T>(static_cast<A>(row.x[j]) + static_cast<A>(row.residual[j]));
    h = row.h_out;
  }
  SquaresPortable<T, W> terms{h};
  const A r = inverse_rms(blocked_sum_portable<A, kVecPath<T, W>>(terms, n), n, eps);
  int64_t j = 0;
  if constexpr (kVecPath<T, W>) {
    const Vec vr(r), voff(offset);
    if (row.w != nullptr) {
      for (; j + Vec::size() <= n; j += Vec::size()) {
        (Vec::loadu(h + j) * vr * (Vec::loadu(row.w + j) + voff)).store(row.y + j);
      }
    } else {
      for (; j + Vec::size() <= n; j += Vec::size()) (Vec::loadu(h + j) * vr).store(row.y + j);
    }
  }
  for (; j < n; ++j) {
    A v = static_cast<A>(h[j]) * r;
    if (row.w != nullptr) v *= static_cast<A>(row.w[j]) + offset;
    row.y[j] = static_cast<T>(v);
  }
  return r;
}

template <typename T, typename W>
void backward_row_portable(const BackwardRow<T, W, opmath_t<T>>& row, opmath_t<T> r, int64_t n, opmath_t<T> offset) {
  using A = opmath_t<T>;
  using Vec = at::vec::Vectorized<A>;
  A c = 0;
  if (row.dx != nullptr) {
    GradDotPortable<T, W> terms{row.dy, row.h, row.w, offset};
    const double s = blocked_sum_portable<A, kVecPath<T, W>>(terms, n);
    c = static_cast<A>(static_cast<double>(r) * r * r * s / static_cast<double>(n));
  }
  int64_t j = 0;
  if constexpr (kVecPath<T, W>) {
    const Vec vr(r), vc(c), voff(offset);
    for (; j + Vec::size() <= n; j += Vec::size()) {
      const Vec d = Vec::loadu(row.dy + j), hv = Vec::loadu(row.h + j);
      if (row.dx != nullptr) {
        const Vec g = row.w != nullptr ? d * (Vec::loadu(row.w + j) + voff) : d;
        Vec dx = vr * g - vc * hv;
        if (row.dres != nullptr) dx = dx + Vec::loadu(row.dres + j);
        dx.store(row.dx + j);
      }
      if (row.dw_acc != nullptr) at::vec::fmadd(d * hv, vr, Vec::loadu(row.dw_acc + j)).store(row.dw_acc + j);
    }
  }
  for (; j < n; ++j) {
    const A d = static_cast<A>(row.dy[j]), hv = static_cast<A>(row.h[j]);
    if (row.dx != nullptr) {
      A dx = r * (row.w != nullptr ? d * (static_cast<A>(row.w[j]) + offset) : d) - c * hv;
      if (row.dres != nullptr) dx += static_cast<A>(row.dres[j]);
      row.dx[j] = static_cast<T>(dx);
    }
    if (row.dw_acc != nullptr) row.dw_acc[j] += d * hv * r;
  }
}

template <typename T, typename W>
opmath_t<T> forward_row(const ForwardRow<T, W>& row, int64_t n, opmath_t<T> eps, opmath_t<T> offset) {
#ifdef TORCHOPS_HAS_AVX2_PATH
  if constexpr (std::is_same_v<opmath_t<T>, float>) {
    if (cpu::cpu_has_avx2()) return forward_row_avx2(row, n, eps, offset);
  }
#endif
  return forward_row_portable(row, n, eps, offset);
}

template <typename T, typename W>
void backward_row(const BackwardRow<T, W, opmath_t<T>>& row, opmath_t<T> r, int64_t n, opmath_t<T> offset) {
#ifdef TORCHOPS_HAS_AVX2_PATH
  if constexpr (std::is_same_v<opmath_t<T>, float>) {
    if (cpu::cpu_has_avx2()) return backward_row_avx2(row, r, n, offset);
  }
#endif
  backward_row_portable(row, r, n, offset);
}

// ---------------------------------------------------------------------------------------- forward

// Writes out (dense, input's shape), residual_out (dense; only with a residual) and, when `rstd` is
// defined, each row's rstd.
void forward_cpu_into(const at::Tensor& input, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
                      double eps, double weight_offset, const at::Tensor& out, const at::Tensor& residual_out,
                      const at::Tensor& rstd) {
  const NormRows x = norm_rows(input);
  if (x.rows == 0) return;
  const NormRows res = residual.defined() ? norm_rows(residual) : NormRows{};
  const at::Tensor w = dense_weight(weight);
  dispatch_norm_types(input.scalar_type(), w, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    using A = opmath_t<T>;
    const T* px = x.tensor.const_data_ptr<T>();
    const T* pres = residual.defined() ? res.tensor.const_data_ptr<T>() : nullptr;
    T* ph = residual.defined() ? residual_out.mutable_data_ptr<T>() : nullptr;
    const W* pw = w.defined() ? w.const_data_ptr<W>() : nullptr;
    T* py = out.mutable_data_ptr<T>();
    A* pr = rstd.defined() ? rstd.mutable_data_ptr<A>() : nullptr;
    const int64_t n = x.cols;
    const A eps_a = static_cast<A>(eps), offset = static_cast<A>(weight_offset);
    norm_cpu::for_each_row(x.rows, n, [&](int64_t row) {
      const ForwardRow<T, W> r{px + row * x.row_stride, pres != nullptr ? pres + row * res.row_stride : nullptr,
                               ph != nullptr ? ph + row * n : nullptr, pw, py + row * n};
      const A rs = forward_row(r, n, eps_a, offset);
      if (pr != nullptr) pr[row] = rs;
    });
  });
}

// --------------------------------------------------------------------------------------- backward

// grad_input (when input_grad: rms_norm's gradient wrt h, plus dres when defined) and grad_weight (when
// weight_grad), of h's rows.
std::tuple<at::Tensor, at::Tensor> backward_cpu(const at::Tensor& grad_out, const at::Tensor& h,
                                                const at::Tensor& dres, const std::optional<at::Tensor>& weight,
                                                const at::Tensor& rstd, bool input_grad, bool weight_grad,
                                                double weight_offset, at::Tensor grad_input, at::Tensor grad_weight) {
  const at::Tensor w = dense_weight(weight);
  if (!input_grad && !weight_grad) return {grad_input, grad_weight};

  const NormRows x = norm_rows(h);
  const NormRows dy = norm_rows(grad_out);
  const NormRows dr = dres.defined() ? norm_rows(dres) : NormRows{};
  const at::Tensor r = rstd.contiguous();
  const int64_t n = x.cols;

  dispatch_norm_types(h.scalar_type(), w, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    using A = opmath_t<T>;
    const T* px = x.rows > 0 ? x.tensor.const_data_ptr<T>() : nullptr;
    const T* pdy = x.rows > 0 ? dy.tensor.const_data_ptr<T>() : nullptr;
    const T* pdr = dres.defined() && x.rows > 0 ? dr.tensor.const_data_ptr<T>() : nullptr;
    const W* pw = w.defined() ? w.const_data_ptr<W>() : nullptr;
    const A* pr = r.const_data_ptr<A>();
    T* pdx = input_grad ? grad_input.mutable_data_ptr<T>() : nullptr;
    W* pgw = weight_grad ? grad_weight.mutable_data_ptr<W>() : nullptr;
    const A offset = static_cast<A>(weight_offset);
    norm_cpu::for_each_row_with_column_sums<A>(
        x.rows, n, weight_grad,
        [&](int64_t row, A* acc) {
          const BackwardRow<T, W, A> b{pdy + row * dy.row_stride, px + row * x.row_stride,
                                       pdr != nullptr ? pdr + row * dr.row_stride : nullptr, pw,
                                       pdx != nullptr ? pdx + row * n : nullptr, acc};
          backward_row(b, pr[row], n, offset);
        },
        [&](int64_t j, A v) { pgw[j] = static_cast<W>(v); });
  });
  return {grad_input, grad_weight};
}

// What the shared entry points (norm_ops.h) call on the CPU.
struct CpuNorm {
  static constexpr int64_t kMaxRow = INT64_MAX;
  static at::Tensor empty(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor&) {
    return empty_dense_cpu(sizes, dtype);
  }
  static void forward(const NormForward& f) {
    TORCH_CHECK(f.kind == NormKind::kRms, "layer_norm: not yet on the CPU");
    forward_cpu_into(f.input, f.residual, f.weight.defined() ? std::optional<at::Tensor>(f.weight) : std::nullopt,
                     f.eps, f.weight_offset, f.out, f.residual_out, f.rstd);
  }
  static void backward(const NormBackward& b) {
    TORCH_CHECK(b.kind == NormKind::kRms, "layer_norm: not yet on the CPU");
    backward_cpu(b.grad_out, b.input, b.grad_residual_out,
                 b.weight.defined() ? std::optional<at::Tensor>(b.weight) : std::nullopt, b.rstd,
                 b.grad_input.defined(), b.grad_weight.defined(), b.weight_offset, b.grad_input, b.grad_weight);
  }
};
using Ops = NormOps<CpuNorm>;

}  // namespace

TORCH_LIBRARY_IMPL(myns, CPU, m) {
  m.impl("rms_norm", &Ops::rms_norm);
  m.impl("_rms_norm_forward", &Ops::rms_norm_forward);
  m.impl("_rms_norm_backward", &Ops::rms_norm_backward);
  m.impl("add_rms_norm", &Ops::add_rms_norm);
  m.impl("_add_rms_norm_forward", &Ops::add_rms_norm_forward);
  m.impl("_add_rms_norm_backward", &Ops::add_rms_norm_backward);
}

}  // namespace torchops
