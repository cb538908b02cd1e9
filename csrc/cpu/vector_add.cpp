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
// The dense loop compiled for AVX2: f16/bf16 through hardware conversions, 8 lanes of f32 at a time;
// the other types as a plain loop the compiler vectorises at 256 bits.
template <typename T>
TORCHOPS_TARGET_AVX2 void add_contiguous_avx2(const T* a, const T* b, T* out, int64_t n) {
  int64_t i = 0;
  if constexpr (std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>) {
    for (; i + 8 <= n; i += 8) {
      cpu::store8_from_float(out + i, _mm256_add_ps(cpu::load8_as_float(a + i), cpu::load8_as_float(b + i)));
    }
  }
  for (; i < n; ++i) out[i] = add_scalar(a[i], b[i]);
}
#endif

// out[i] = a[i] + b[i] for i in [0, n), all three dense.
template <typename T>
void add_contiguous(const T* a, const T* b, T* out, int64_t n) {
#ifdef TORCHOPS_HAS_AVX2_PATH
  if (cpu::cpu_has_avx2()) return add_contiguous_avx2(a, b, out, n);
#endif
  using Vec = at::vec::Vectorized<T>;
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    (Vec::loadu(a + i) + Vec::loadu(b + i)).store(out + i);
  }
  for (; i < n; ++i) out[i] = add_scalar(a[i], b[i]);
}

// Walks [begin, end) of the logical order with an odometer over the collapsed layout; the innermost
// dimension runs as a tight loop (vectorised when all three operands are dense there).
template <typename T>
void add_strided(const T* a, const T* b, T* out, const StridedLayout<3>& layout, int64_t begin, int64_t end) {
  const int inner = layout.ndim - 1;
  const int64_t inner_size = layout.sizes[inner];
  const int64_t so = layout.strides[0][inner], sa = layout.strides[1][inner], sb = layout.strides[2][inner];

  int64_t index[kMaxDims];
  int64_t rest = begin;
  for (int d = inner; d >= 0; --d) {
    index[d] = rest % layout.sizes[d];
    rest /= layout.sizes[d];
  }
  int64_t pos = begin;
  while (pos < end) {
    int64_t oo = 0, oa = 0, ob = 0;
    for (int d = 0; d <= inner; ++d) {
      oo += index[d] * layout.strides[0][d];
      oa += index[d] * layout.strides[1][d];
      ob += index[d] * layout.strides[2][d];
    }
    const int64_t run = std::min(inner_size - index[inner], end - pos);
    if (so == 1 && sa == 1 && sb == 1) {
      add_contiguous(a + oa, b + ob, out + oo, run);
    } else {
      for (int64_t j = 0; j < run; ++j) out[oo + j * so] = add_scalar(a[oa + j * sa], b[ob + j * sb]);
    }
    pos += run;
    index[inner] += run;
    for (int d = inner; d > 0 && index[d] == layout.sizes[d]; --d) {
      index[d] = 0;
      ++index[d - 1];
    }
  }
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
        add_contiguous(pa + begin, pb + begin, po + begin, end - begin);
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
