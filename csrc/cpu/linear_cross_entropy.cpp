// linear_cross_entropy and cross_entropy on the CPU: the loss family's row kernel (loss/loss.h) and the
// registrations; the drivers (chunked matmuls, reductions, checks: targets are validated before any work)
// are loss/loss.cpp. Rows are split across cores; each row is read three times while it sits in the core's
// cache: its max, then its sum of exp (and of the logits, for label smoothing), then, when a gradient is
// wanted, the gradient written in place of (or beside) it. f32/f16/bf16 run 8 lanes of f32 math at a time
// (AVX2/FMA/F16C, picked at run time), f64 runs in f64.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "../core/cpu_avx2.h"
#include "../core/dispatch.h"
#include "../loss/cross_entropy_math.h"
#include "../loss/loss.h"
#include "../loss/loss_ops.h"

namespace torchops {
namespace {

// Elements per task: each costs two or three exponentials.
constexpr int64_t kGrainElems = 32768;

// One row's view of a CrossEntropyRows call, in the math type A.
template <typename T, typename A>
struct Row {
  const T* z;    // the logits
  T* grad;       // nullptr: no gradient
  int64_t classes;
  const CrossEntropyMath<A>& math;

  A capped(A z_value) const { return math.capped() ? math.softcap * std::tanh(z_value * math.inverse_softcap) : z_value; }
};

struct Stats {
  double max, sum_exp, sum_logits;  // of the capped logits; sum_logits only when smoothed
};

template <typename T, typename A>
Stats stats_scalar(const Row<T, A>& row) {
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t j = 0; j < row.classes; ++j) m = std::max(m, static_cast<A>(row.z[j]));
  m = row.capped(m);  // capping is monotonic: the max of the capped logits is the capped max
  A s = 0, sc = 0;
  for (int64_t j = 0; j < row.classes; ++j) {
    const A c = row.capped(static_cast<A>(row.z[j]));
    s += std::exp(c - m);
    sc += c;
  }
  return {static_cast<double>(m), static_cast<double>(s), static_cast<double>(sc)};
}

template <typename T, typename A>
void grad_scalar(const Row<T, A>& row, A lse, A scale) {
  for (int64_t j = 0; j < row.classes; ++j) {
    const A c = row.capped(static_cast<A>(row.z[j]));
    row.grad[j] = static_cast<T>(scale * row.math.grad(std::exp(c - lse), c));
  }
}

#ifdef TORCHOPS_HAS_AVX2_PATH
TORCHOPS_TARGET_AVX2 inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// cap * tanh(x / cap), tanh(y) = sign(y) (1 - 2 / (exp(2 |y|) + 1)): an absolute error of a few ulp of cap.
TORCHOPS_TARGET_AVX2 inline __m256 capped8(__m256 x, const CrossEntropyMath<float>& math) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 y = _mm256_mul_ps(x, _mm256_set1_ps(math.inverse_softcap));
  const __m256 e = cpu::exp8(_mm256_add_ps(_mm256_andnot_ps(sign, y), _mm256_andnot_ps(sign, y)));
  const __m256 t = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_div_ps(_mm256_set1_ps(2.0f),
                                                                      _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
  return _mm256_mul_ps(_mm256_or_ps(t, _mm256_and_ps(sign, y)), _mm256_set1_ps(math.softcap));
}

template <typename T>
TORCHOPS_TARGET_AVX2 Stats stats_avx2(const Row<T, float>& row) {
  const int64_t v = row.classes, full = v / 8 * 8;
  __m256 vm = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < full; j += 8) vm = _mm256_max_ps(vm, cpu::load8_as_float(row.z + j));
  float m = hmax8(vm);
  for (int64_t j = full; j < v; ++j) m = std::max(m, static_cast<float>(row.z[j]));
  m = row.capped(m);
  const bool capped = row.math.capped();
  const __m256 mv = _mm256_set1_ps(m);
  __m256 s = _mm256_setzero_ps(), sc = _mm256_setzero_ps();
  for (int64_t j = 0; j < full; j += 8) {
    __m256 c = cpu::load8_as_float(row.z + j);
    if (capped) c = capped8(c, row.math);
    s = _mm256_add_ps(s, cpu::exp8(_mm256_sub_ps(c, mv)));
    sc = _mm256_add_ps(sc, c);
  }
  double sum = cpu::hsum8(s), sum_c = cpu::hsum8(sc);
  for (int64_t j = full; j < v; ++j) {
    const float c = row.capped(static_cast<float>(row.z[j]));
    sum += std::exp(c - m);
    sum_c += c;
  }
  return {m, sum, sum_c};
}

template <typename T>
TORCHOPS_TARGET_AVX2 void grad_avx2(const Row<T, float>& row, float lse, float scale) {
  const int64_t v = row.classes, full = v / 8 * 8;
  const bool capped = row.math.capped();
  const __m256 lse8 = _mm256_set1_ps(lse), scale8 = _mm256_set1_ps(scale);
  const __m256 uniform = _mm256_set1_ps(row.math.smoothing_per_class);
  const __m256 inv_cap = _mm256_set1_ps(row.math.inverse_softcap), one = _mm256_set1_ps(1.0f);
  for (int64_t j = 0; j < full; j += 8) {
    __m256 c = cpu::load8_as_float(row.z + j);
    if (capped) c = capped8(c, row.math);
    __m256 d = _mm256_sub_ps(cpu::exp8(_mm256_sub_ps(c, lse8)), uniform);
    if (capped) {
      const __m256 u = _mm256_mul_ps(c, inv_cap);
      d = _mm256_mul_ps(d, _mm256_fnmadd_ps(u, u, one));
    }
    cpu::store8_from_float(row.grad + j, _mm256_mul_ps(d, scale8));
  }
  for (int64_t j = full; j < v; ++j) {
    const float c = row.capped(static_cast<float>(row.z[j]));
    row.grad[j] = static_cast<T>(scale * row.math.grad(std::exp(c - lse), c));
  }
}
#endif

template <typename T, typename A>
Stats stats(const Row<T, A>& row) {
#ifdef TORCHOPS_HAS_AVX2_PATH
  if constexpr (std::is_same_v<A, float>) {
    if (cpu::cpu_has_avx2()) return stats_avx2(row);
  }
#endif
  return stats_scalar(row);
}

template <typename T, typename A>
void write_grad(const Row<T, A>& row, A lse, A scale) {
#ifdef TORCHOPS_HAS_AVX2_PATH
  if constexpr (std::is_same_v<A, float>) {
    if (cpu::cpu_has_avx2()) return grad_avx2(row, lse, scale);
  }
#endif
  grad_scalar(row, lse, scale);
}

template <typename T, typename Index>
void rows_kernel(const CrossEntropyRows& r) {
  using A = opmath_t<T>;
  const int64_t rows = r.logits.size(0), classes = r.logits.size(1), ld = r.logits.stride(0);
  const CrossEntropyMath<A> math(r.options.label_smoothing, classes, r.options.softcap);
  const T* logits = r.logits.const_data_ptr<T>();
  const Index* target = r.target.const_data_ptr<Index>();
  const A* lse_in = r.lse_in.defined() ? r.lse_in.const_data_ptr<A>() : nullptr;
  A* lse_out = r.lse_out.defined() ? r.lse_out.mutable_data_ptr<A>() : nullptr;
  A* loss_out = r.loss_out.defined() ? r.loss_out.mutable_data_ptr<A>() : nullptr;
  T* grad = r.grad.defined() ? r.grad.mutable_data_ptr<T>() : nullptr;
  const int64_t grad_ld = r.grad.defined() ? r.grad.stride(0) : 0;
  const A* scale = r.scale.defined() ? r.scale.const_data_ptr<A>() : nullptr;
  const int64_t scale_step = r.scale.defined() && r.scale.dim() > 0 ? 1 : 0;
  const int64_t ignore_index = r.options.ignore_index;
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrainElems / classes), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Row<T, A> row{logits + i * ld, grad ? grad + i * grad_ld : nullptr, classes, math};
      const auto t = static_cast<int64_t>(target[i]);
      const bool ignored = t == ignore_index, valid = !ignored && t >= 0 && t < classes;
      // Read before the row may be overwritten by its gradient.
      const A target_logit = valid ? row.capped(static_cast<A>(row.z[t])) : A(0);
      A lse = A(0);
      if (lse_in) {
        lse = lse_in[i];
      } else if (lse_out || (valid && (loss_out || row.grad))) {
        const Stats s = stats(row);
        lse = static_cast<A>(s.max + std::log(s.sum_exp));
        if (lse_out) lse_out[i] = lse;
        if (loss_out && valid) loss_out[i] = math.loss(lse, target_logit, static_cast<A>(s.sum_logits));
      }
      if (loss_out && !valid) loss_out[i] = ignored ? A(0) : std::numeric_limits<A>::quiet_NaN();
      if (!row.grad) continue;
      if (!valid) {
        std::fill(row.grad, row.grad + classes, T(0));
        continue;
      }
      const A s = scale ? scale[i * scale_step] : A(1);
      write_grad(row, lse, s);
      row.grad[t] = static_cast<T>(s * (math.grad(std::exp(target_logit - lse), target_logit) +
                                        math.target_term(target_logit)));
    }
  });
}

void cpu_rows(const CrossEntropyRows& r) {
  TORCHOPS_DISPATCH_FLOAT_TYPES(r.logits.scalar_type(), "cross_entropy_rows_cpu", [&] {
    TORCHOPS_DISPATCH_INDEX_TYPES(r.target.scalar_type(), "cross_entropy_rows_cpu",
                                  [&] { rows_kernel<scalar_t, index_t>(r); });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, CPU, m) {
  LossOps<&cpu_rows>::register_kernels(m);
}

}  // namespace torchops
