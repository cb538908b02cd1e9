// vector_add on the CPU: at::vec over contiguous runs, at::parallel_for across cores, any strides.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <type_traits>

#include "../common/elementwise.h"
#include "../common/cpu_avx2.h"
#include "../common/dispatch.h"
#include "../common/empty.h"
#include "../common/strided.h"

namespace torchops {
namespace {

constexpr int64_t kGrainSize = 32768;  // elements per task: large enough to amortise thread hand-off

template <typename T>
inline T add_scalar(T x, T y) {
  return static_cast<T>(static_cast<opmath_t<T>>(x) + static_cast<opmath_t<T>>(y));
}

#ifdef TORCHOPS_HAS_AVX2_PATH
// out[j*so] = a[j*sa] + b[j*sb] compiled for AVX2. f16/bf16 go through hardware conversions 8 lanes at
// a time (strided elements gathered into a register first); other dense types are a plain loop the
// compiler vectorises at 256 bits.
template <typename T>
TORCHOPS_TARGET_AVX2 void add_run_avx2(const T* a, int64_t sa, const T* b, int64_t sb, T* out, int64_t so,
                                       int64_t n) {
  int64_t j = 0;
  if (sa == 1 && sb == 1 && so == 1) {
    if constexpr (is_16bit_float<T>) {
      for (; j + 8 <= n; j += 8) {
        cpu::store8_from_float(out + j, _mm256_add_ps(cpu::load8_as_float(a + j), cpu::load8_as_float(b + j)));
      }
    }
    for (; j < n; ++j) out[j] = add_scalar(a[j], b[j]);
    return;
  }
  if constexpr (is_16bit_float<T>) {
    for (; j + 8 <= n; j += 8) {
      const __m256 sum = _mm256_add_ps(cpu::gather8_as_float(a + j * sa, sa), cpu::gather8_as_float(b + j * sb, sb));
      cpu::scatter8_from_float(out + j * so, so, sum);
    }
  }
  for (; j < n; ++j) out[j * so] = add_scalar(a[j * sa], b[j * sb]);
}
#endif

// out[j*so] = a[j*sa] + b[j*sb] for j in [0, n): one run of the innermost dimension.
template <typename T>
void add_run(const T* a, int64_t sa, const T* b, int64_t sb, T* out, int64_t so, int64_t n) {
#ifdef TORCHOPS_HAS_AVX2_PATH
  if (cpu::cpu_has_avx2()) return add_run_avx2(a, sa, b, sb, out, so, n);
#endif
  int64_t j = 0;
  if (sa == 1 && sb == 1 && so == 1) {
    using Vec = at::vec::Vectorized<T>;
    for (; j + Vec::size() <= n; j += Vec::size()) {
      (Vec::loadu(a + j) + Vec::loadu(b + j)).store(out + j);
    }
  }
  for (; j < n; ++j) out[j * so] = add_scalar(a[j * sa], b[j * sb]);
}

// Walks [begin, end) of the logical order over the collapsed layout; the innermost dimension runs as
// one add_run.
template <typename T>
void add_strided(const T* a, const T* b, T* out, const StridedLayout<3>& layout, int64_t begin, int64_t end) {
  const int64_t so = inner_stride(layout, 0), sa = inner_stride(layout, 1), sb = inner_stride(layout, 2);
  for_each_run(layout, begin, end, [&](const int64_t (&offsets)[3], int64_t run) {
    add_run(a + offsets[1], sa, b + offsets[2], sb, out + offsets[0], so, run);
  });
}

void vector_add_cpu_into(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  const int64_t n = out.numel();
  const auto layout = collapse_layout<3>("vector_add", {out, a, b});
  TORCHOPS_DISPATCH_FLOAT_AND_INT_TYPES(out.scalar_type(), "vector_add_cpu", [&] {
    const scalar_t* pa = a.const_data_ptr<scalar_t>();
    const scalar_t* pb = b.const_data_ptr<scalar_t>();
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    if (layout.ndim <= 1 && layout.is_contiguous(0) && layout.is_contiguous(1) && layout.is_contiguous(2)) {
      at::parallel_for(0, n, kGrainSize, [&](int64_t begin, int64_t end) {
        add_run(pa + begin, 1, pb + begin, 1, po + begin, 1, end - begin);
      });
    } else {
      at::parallel_for(0, n, kGrainSize,
                       [&](int64_t begin, int64_t end) { add_strided(pa, pb, po, layout, begin, end); });
    }
  });
}

at::Tensor vector_add_cpu(const at::Tensor& a, const at::Tensor& b) {
  return binary_elementwise("vector_add", {"a", a}, {"b", b}, {TORCHOPS_FLOAT_AND_INT_DTYPES}, empty_like_dense_cpu,
                            vector_add_cpu_into);
}

void vector_add_out_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  binary_elementwise_out("vector_add_out", {"a", a}, {"b", b}, {"out", out}, {TORCHOPS_FLOAT_AND_INT_DTYPES},
                         vector_add_cpu_into);
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, CPU, m) {
  m.impl("vector_add", &vector_add_cpu);
  m.impl("vector_add_out", &vector_add_out_cpu);
}

}  // namespace torchops
