// rms_norm on the CPU. Rows are split across cores (at::parallel_for); each row is two sweeps: the sum of
// squares, then x * rstd (* weight). AVX2/FMA loops (8 f32 lanes; f16/bf16 converted by F16C / bit shifts)
// when the processor has them, at::vec (f32/f64) or scalar code otherwise; float64 always takes at::vec.
// Backward: dx per row in one pass over the row's (dy, x) after its dot product; dweight from per-chunk
// partial rows (a fixed split of the rows, independent of the thread count) summed in chunk order, so it
// is deterministic.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../common/cpu_avx2.h"
#include "../common/dispatch.h"
#include "../common/empty.h"
#include "../common/norm.h"

namespace torchops {
namespace {

constexpr int64_t kGrainElems = 32768;  // elements per task: large enough to amortise thread hand-off
constexpr int64_t kMaxChunks = 64;      // dweight partial rows at most (bounds the scratch memory)

template <typename A>
inline A inverse_rms(A sum_squares, int64_t n, A eps) {
  // Same order as F.rms_norm: mean, + eps, then 1/sqrt.
  return A(1) / std::sqrt(sum_squares / static_cast<A>(n) + eps);
}

// ------------------------------------------------------------------------------------------- AVX2 rows
#ifdef TORCHOPS_HAS_AVX2_PATH
// T: float, Half or BFloat16; W: T or float. Returns the row's rstd.
template <typename T, typename W>
TORCHOPS_TARGET_AVX2 float forward_row_avx2(const T* x, const W* w, T* y, int64_t n, float eps) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
         acc3 = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m256 a = cpu::load8_as_float(x + j), b = cpu::load8_as_float(x + j + 8);
    const __m256 c = cpu::load8_as_float(x + j + 16), d = cpu::load8_as_float(x + j + 24);
    acc0 = _mm256_fmadd_ps(a, a, acc0);
    acc1 = _mm256_fmadd_ps(b, b, acc1);
    acc2 = _mm256_fmadd_ps(c, c, acc2);
    acc3 = _mm256_fmadd_ps(d, d, acc3);
  }
  for (; j + 8 <= n; j += 8) {
    const __m256 a = cpu::load8_as_float(x + j);
    acc0 = _mm256_fmadd_ps(a, a, acc0);
  }
  float ss = cpu::hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; j < n; ++j) {
    const float v = static_cast<float>(x[j]);
    ss += v * v;
  }
  const float r = inverse_rms(ss, n, eps);
  const __m256 vr = _mm256_set1_ps(r);
  j = 0;
  // (x * rstd) first, then * weight, both in f32, one rounding to T at the end: F.rms_norm's order.
  if (w != nullptr) {
    for (; j + 8 <= n; j += 8) {
      const __m256 v = _mm256_mul_ps(cpu::load8_as_float(x + j), vr);
      cpu::store8_from_float(y + j, _mm256_mul_ps(v, cpu::load8_as_float(w + j)));
    }
    for (; j < n; ++j) y[j] = static_cast<T>(static_cast<float>(x[j]) * r * static_cast<float>(w[j]));
  } else {
    for (; j + 8 <= n; j += 8) cpu::store8_from_float(y + j, _mm256_mul_ps(cpu::load8_as_float(x + j), vr));
    for (; j < n; ++j) y[j] = static_cast<T>(static_cast<float>(x[j]) * r);
  }
  return r;
}

// dx = rstd * g - x * (rstd^3 / N) * sum(g * x) with g = dy * w (or dy); dw_acc += dy * x * rstd.
// dx and dw_acc may each be null (not requested).
template <typename T, typename W>
TORCHOPS_TARGET_AVX2 void backward_row_avx2(const T* dy, const T* x, const W* w, float r, T* dx, float* dw_acc,
                                            int64_t n) {
  int64_t j = 0;
  float c = 0.f;
  if (dx != nullptr) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; j + 16 <= n; j += 16) {
      __m256 g0 = cpu::load8_as_float(dy + j), g1 = cpu::load8_as_float(dy + j + 8);
      if (w != nullptr) {
        g0 = _mm256_mul_ps(g0, cpu::load8_as_float(w + j));
        g1 = _mm256_mul_ps(g1, cpu::load8_as_float(w + j + 8));
      }
      acc0 = _mm256_fmadd_ps(g0, cpu::load8_as_float(x + j), acc0);
      acc1 = _mm256_fmadd_ps(g1, cpu::load8_as_float(x + j + 8), acc1);
    }
    for (; j + 8 <= n; j += 8) {
      __m256 g = cpu::load8_as_float(dy + j);
      if (w != nullptr) g = _mm256_mul_ps(g, cpu::load8_as_float(w + j));
      acc0 = _mm256_fmadd_ps(g, cpu::load8_as_float(x + j), acc0);
    }
    float s = cpu::hsum8(_mm256_add_ps(acc0, acc1));
    for (; j < n; ++j) {
      const float g = static_cast<float>(dy[j]) * (w != nullptr ? static_cast<float>(w[j]) : 1.f);
      s += g * static_cast<float>(x[j]);
    }
    c = r * r * r * s / static_cast<float>(n);
  }
  const __m256 vr = _mm256_set1_ps(r), vc = _mm256_set1_ps(c);
  for (j = 0; j + 8 <= n; j += 8) {
    const __m256 d = cpu::load8_as_float(dy + j), xv = cpu::load8_as_float(x + j);
    if (dx != nullptr) {
      const __m256 g = w != nullptr ? _mm256_mul_ps(d, cpu::load8_as_float(w + j)) : d;
      cpu::store8_from_float(dx + j, _mm256_sub_ps(_mm256_mul_ps(vr, g), _mm256_mul_ps(vc, xv)));
    }
    if (dw_acc != nullptr) {
      _mm256_storeu_ps(dw_acc + j, _mm256_fmadd_ps(_mm256_mul_ps(d, xv), vr, _mm256_loadu_ps(dw_acc + j)));
    }
  }
  for (; j < n; ++j) {
    const float d = static_cast<float>(dy[j]), xv = static_cast<float>(x[j]);
    if (dx != nullptr) {
      const float g = w != nullptr ? d * static_cast<float>(w[j]) : d;
      dx[j] = static_cast<T>(r * g - c * xv);
    }
    if (dw_acc != nullptr) dw_acc[j] += d * xv * r;
  }
}
#endif

// ----------------------------------------------------------------------------------- portable rows
// at::vec when T, W and the math type agree (f32, f64), scalar code otherwise (f16/bf16 without AVX2).
template <typename T, typename W>
constexpr bool kVecPath = std::is_same_v<T, opmath_t<T>> && std::is_same_v<W, T>;

template <typename A>
A sum_lanes(const at::vec::Vectorized<A>& v) {
  A lanes[at::vec::Vectorized<A>::size()];
  v.store(lanes);
  A s = 0;
  for (A lane : lanes) s += lane;
  return s;
}

template <typename T, typename W>
opmath_t<T> forward_row_portable(const T* x, const W* w, T* y, int64_t n, opmath_t<T> eps) {
  using A = opmath_t<T>;
  using Vec = at::vec::Vectorized<A>;
  A ss = 0;
  int64_t j = 0;
  if constexpr (kVecPath<T, W>) {
    Vec acc(A(0));
    for (; j + Vec::size() <= n; j += Vec::size()) {
      const Vec v = Vec::loadu(x + j);
      acc = at::vec::fmadd(v, v, acc);
    }
    ss = sum_lanes(acc);
  }
  for (; j < n; ++j) {
    const A v = static_cast<A>(x[j]);
    ss += v * v;
  }
  const A r = inverse_rms(ss, n, eps);
  j = 0;
  if constexpr (kVecPath<T, W>) {
    const Vec vr(r);
    if (w != nullptr) {
      for (; j + Vec::size() <= n; j += Vec::size()) (Vec::loadu(x + j) * vr * Vec::loadu(w + j)).store(y + j);
    } else {
      for (; j + Vec::size() <= n; j += Vec::size()) (Vec::loadu(x + j) * vr).store(y + j);
    }
  }
  for (; j < n; ++j) {
    A v = static_cast<A>(x[j]) * r;
    if (w != nullptr) v *= static_cast<A>(w[j]);
    y[j] = static_cast<T>(v);
  }
  return r;
}

template <typename T, typename W>
void backward_row_portable(const T* dy, const T* x, const W* w, opmath_t<T> r, T* dx, opmath_t<T>* dw_acc,
                           int64_t n) {
  using A = opmath_t<T>;
  using Vec = at::vec::Vectorized<A>;
  A c = 0;
  if (dx != nullptr) {
    A s = 0;
    int64_t j = 0;
    if constexpr (kVecPath<T, W>) {
      Vec acc(A(0));
      for (; j + Vec::size() <= n; j += Vec::size()) {
        Vec g = Vec::loadu(dy + j);
        if (w != nullptr) g = g * Vec::loadu(w + j);
        acc = at::vec::fmadd(g, Vec::loadu(x + j), acc);
      }
      s = sum_lanes(acc);
    }
    for (; j < n; ++j) s += static_cast<A>(dy[j]) * (w != nullptr ? static_cast<A>(w[j]) : A(1)) * static_cast<A>(x[j]);
    c = r * r * r * s / static_cast<A>(n);
  }
  int64_t j = 0;
  if constexpr (kVecPath<T, W>) {
    const Vec vr(r), vc(c);
    for (; j + Vec::size() <= n; j += Vec::size()) {
      const Vec d = Vec::loadu(dy + j), xv = Vec::loadu(x + j);
      if (dx != nullptr) {
        const Vec g = w != nullptr ? d * Vec::loadu(w + j) : d;
        (vr * g - vc * xv).store(dx + j);
      }
      if (dw_acc != nullptr) at::vec::fmadd(d * xv, vr, Vec::loadu(dw_acc + j)).store(dw_acc + j);
    }
  }
  for (; j < n; ++j) {
    const A d = static_cast<A>(dy[j]), xv = static_cast<A>(x[j]);
    if (dx != nullptr) dx[j] = static_cast<T>(r * (w != nullptr ? d * static_cast<A>(w[j]) : d) - c * xv);
    if (dw_acc != nullptr) dw_acc[j] += d * xv * r;
  }
}

template <typename T, typename W>
opmath_t<T> forward_row(const T* x, const W* w, T* y, int64_t n, opmath_t<T> eps) {
#ifdef TORCHOPS_HAS_AVX2_PATH
  if constexpr (std::is_same_v<opmath_t<T>, float>) {
    if (cpu::cpu_has_avx2()) return forward_row_avx2(x, w, y, n, eps);
  }
#endif
  return forward_row_portable(x, w, y, n, eps);
}

template <typename T, typename W>
void backward_row(const T* dy, const T* x, const W* w, opmath_t<T> r, T* dx, opmath_t<T>* dw_acc, int64_t n) {
#ifdef TORCHOPS_HAS_AVX2_PATH
  if constexpr (std::is_same_v<opmath_t<T>, float>) {
    if (cpu::cpu_has_avx2()) return backward_row_avx2(dy, x, w, r, dx, dw_acc, n);
  }
#endif
  backward_row_portable(dy, x, w, r, dx, dw_acc, n);
}

// ---------------------------------------------------------------------------------------- forward

// Writes out (dense, input's shape) and, when `rstd` is defined, each row's rstd.
void forward_cpu_into(const at::Tensor& input, const std::optional<at::Tensor>& weight, double eps,
                      const at::Tensor& out, const at::Tensor& rstd) {
  const NormRows x = norm_rows(input);
  if (x.rows == 0) return;
  const at::Tensor w = dense_weight(weight);
  dispatch_norm_types(input.scalar_type(), w, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    using A = opmath_t<T>;
    const T* px = x.tensor.const_data_ptr<T>();
    const W* pw = w.defined() ? w.const_data_ptr<W>() : nullptr;
    T* py = out.mutable_data_ptr<T>();
    A* pr = rstd.defined() ? rstd.mutable_data_ptr<A>() : nullptr;
    const int64_t n = x.cols, stride = x.row_stride;
    const A eps_a = static_cast<A>(eps);
    at::parallel_for(0, x.rows, std::max<int64_t>(1, kGrainElems / n), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const A r = forward_row(px + row * stride, pw, py + row * n, n, eps_a);
        if (pr != nullptr) pr[row] = r;
      }
    });
  });
}

at::Tensor rms_norm_cpu(const at::Tensor& input, const std::optional<at::Tensor>& weight, double eps) {
  check_norm_input("rms_norm", {"input", input}, weight);
  at::Tensor out = empty_like_dense_cpu(input);
  forward_cpu_into(input, weight, eps, out, at::Tensor());
  return out;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_cpu(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                                        double eps) {
  check_norm_input("_rms_norm_forward", {"input", input}, weight);
  at::Tensor out = empty_like_dense_cpu(input);
  at::Tensor rstd = at::detail::empty_cpu(input.sizes().slice(0, input.dim() - 1),
                                          norm_stat_dtype(input.scalar_type()), false, at::MemoryFormat::Contiguous);
  forward_cpu_into(input, weight, eps, out, rstd);
  return {out, rstd};
}

// --------------------------------------------------------------------------------------- backward

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(const at::Tensor& grad_out, const at::Tensor& input,
                                                         const std::optional<at::Tensor>& weight,
                                                         const at::Tensor& rstd, bool input_grad, bool weight_grad) {
  check_norm_backward("_rms_norm_backward", {"grad_out", grad_out}, {"input", input}, weight, {"rstd", rstd},
                      weight_grad);
  const at::Tensor w = dense_weight(weight);
  at::Tensor grad_input, grad_weight;  // not structured bindings: the lambdas below capture them (C++17)
  std::tie(grad_input, grad_weight) = norm_backward_outputs(
      input, w, input_grad, weight_grad, [](c10::IntArrayRef sizes, at::ScalarType dtype) {
        return at::detail::empty_cpu(sizes, dtype, /*pin_memory=*/false, at::MemoryFormat::Contiguous);
      });
  if (!input_grad && !weight_grad) return {grad_input, grad_weight};

  const NormRows x = norm_rows(input);
  const NormRows dy = norm_rows(grad_out);
  const at::Tensor r = rstd.contiguous();
  const int64_t rows = x.rows, n = x.cols;

  dispatch_norm_types(input.scalar_type(), w, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    using A = opmath_t<T>;
    if (rows == 0) {
      if (weight_grad) std::fill_n(grad_weight.mutable_data_ptr<W>(), n, W(0));
      return;
    }
    const T* px = x.tensor.const_data_ptr<T>();
    const T* pdy = dy.tensor.const_data_ptr<T>();
    const W* pw = w.defined() ? w.const_data_ptr<W>() : nullptr;
    const A* pr = r.const_data_ptr<A>();
    T* pdx = input_grad ? grad_input.mutable_data_ptr<T>() : nullptr;

    // A fixed split of the rows into chunks (not the thread count's), each with its own dweight partial row.
    const int64_t min_rows = std::max<int64_t>(1, kGrainElems / n);
    const int64_t want = std::min(kMaxChunks, (rows + min_rows - 1) / min_rows);
    const int64_t rows_per_chunk = (rows + want - 1) / want;
    const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    std::vector<A> partial(weight_grad ? chunks * n : 0, A(0));

    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t chunk = begin; chunk < end; ++chunk) {
        A* acc = weight_grad ? partial.data() + chunk * n : nullptr;
        const int64_t last = std::min(rows, (chunk + 1) * rows_per_chunk);
        for (int64_t row = chunk * rows_per_chunk; row < last; ++row) {
          backward_row(pdy + row * dy.row_stride, px + row * x.row_stride, pw, pr[row],
                       pdx != nullptr ? pdx + row * n : nullptr, acc, n);
        }
      }
    });

    if (weight_grad) {
      W* pgw = grad_weight.mutable_data_ptr<W>();
      at::parallel_for(0, n, kGrainElems / 8, [&](int64_t begin, int64_t end) {
        std::vector<A> sum(partial.begin() + begin, partial.begin() + end);
        for (int64_t chunk = 1; chunk < chunks; ++chunk) {
          const A* p = partial.data() + chunk * n;
          for (int64_t j = begin; j < end; ++j) sum[j - begin] += p[j];
        }
        for (int64_t j = begin; j < end; ++j) pgw[j] = static_cast<W>(sum[j - begin]);
      });
    }
  });
  return {grad_input, grad_weight};
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, CPU, m) {
  m.impl("rms_norm", &rms_norm_cpu);
  m.impl("_rms_norm_forward", &rms_norm_forward_cpu);
  m.impl("_rms_norm_backward", &rms_norm_backward_cpu);
}

}  // namespace torchops
