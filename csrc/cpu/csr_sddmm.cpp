// sddmm on the CPU: one value per nonzero (i, j) and head h from a's row i and b's row j. "dot" sums
// a[i, h, :] * b[j, h, :] (8 lanes at a time, f32 for 16-bit); "add" and "mul" combine a[i, h] and b[j, h].
// Rows in parallel (csr_cpu.h), after the structure is validated.
#include <ATen/core/Tensor.h>

#include <type_traits>

#include "../core/cpu_avx2.h"
#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../csr/csr_cpu.h"

namespace torchops {
namespace {

#ifdef TORCHOPS_HAS_AVX2_PATH
template <typename T>
TORCHOPS_TARGET_AVX2 float dot_avx2(const T* a, const T* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    s0 = _mm256_fmadd_ps(cpu::load8_as_float(a + j), cpu::load8_as_float(b + j), s0);
    s1 = _mm256_fmadd_ps(cpu::load8_as_float(a + j + 8), cpu::load8_as_float(b + j + 8), s1);
  }
  if (j + 8 <= n) {
    s0 = _mm256_fmadd_ps(cpu::load8_as_float(a + j), cpu::load8_as_float(b + j), s0);
    j += 8;
  }
  float r = cpu::hsum8(_mm256_add_ps(s0, s1));
  for (; j < n; ++j) r += static_cast<float>(a[j]) * static_cast<float>(b[j]);
  return r;
}
#endif

template <typename T>
opmath_t<T> dot_generic(const T* a, const T* b, int64_t n) {
  opmath_t<T> s = 0;
  for (int64_t j = 0; j < n; ++j) s += static_cast<opmath_t<T>>(a[j]) * static_cast<opmath_t<T>>(b[j]);
  return s;
}

template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
#ifdef TORCHOPS_HAS_AVX2_PATH
  if constexpr (!std::is_same_v<T, double>) {
    if (n >= 8 && cpu::cpu_has_avx2()) return static_cast<T>(dot_avx2(a, b, n));
  }
#endif
  return static_cast<T>(dot_generic(a, b, n));
}

}  // namespace

template <>
at::Tensor CpuCsrBackend::sddmm(const char* op, const SddmmOperands& s, SddmmOp kind) {
  check_csr_structure_cpu(op, s.crow, s.col, s.K);
  const auto dtype = s.a.scalar_type();
  at::Tensor out = empty_dense_cpu(s.out_sizes, dtype);
  if (out.numel() == 0) return out;
  TORCHOPS_DISPATCH_INDEX_TYPES(s.crow.scalar_type(), "sddmm_cpu", [&] {
    TORCHOPS_DISPATCH_FLOAT_TYPES(dtype, "sddmm_cpu", [&] {
      using acc_t = opmath_t<scalar_t>;
      const index_t* crow = s.crow.const_data_ptr<index_t>();
      const index_t* col = s.col.const_data_ptr<index_t>();
      const scalar_t* a = s.a.const_data_ptr<scalar_t>();
      const scalar_t* b = s.b.const_data_ptr<scalar_t>();
      scalar_t* o = out.mutable_data_ptr<scalar_t>();
      const int64_t H = s.H, D = s.D;
      cpu::parallel_over_rows(crow, s.M, H * D, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const scalar_t* ar = a + r * s.a_row_stride;
          for (int64_t p = crow[r]; p < static_cast<int64_t>(crow[r + 1]); ++p) {
            const scalar_t* br = b + static_cast<int64_t>(col[p]) * s.b_row_stride;
            scalar_t* op_ = o + p * H;
            for (int64_t h = 0; h < H; ++h) {
              const scalar_t* x = ar + h * s.a_head_stride;
              const scalar_t* y = br + h * s.b_head_stride;
              if (kind == SddmmOp::kDot) {
                op_[h] = dot(x, y, D);
              } else if (kind == SddmmOp::kAdd) {
                op_[h] = static_cast<scalar_t>(static_cast<acc_t>(*x) + static_cast<acc_t>(*y));
              } else {
                op_[h] = static_cast<scalar_t>(static_cast<acc_t>(*x) * static_cast<acc_t>(*y));
              }
            }
          }
        }
      });
    });
  });
  return out;
}

}  // namespace torchops
