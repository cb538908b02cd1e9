// csr_spmm and its backward helpers on the CPU.
//
// Every kernel first validates the CSR structure (crow_indices[0] = 0, non-decreasing, crow_indices[M] = nnz,
// 0 <= col < K), so the loops below never index out of bounds. Rows are split into chunks of about equal
// cost (nonzeros + rows) for at::parallel_for, so a few very long rows don't leave one core with all the work.
//   forward     per row, register tiles of 64 (then 32, 16, 8) output columns accumulated in f32 over the row's
//               nonzeros (AVX2/FMA/F16C when the processor has them), f64 for f64; at::vec otherwise;
//   sddmm       one dot product per nonzero, 8 lanes at a time;
//   transpose   a stable counting sort (serial: O(nnz), deterministic).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../core/cpu_avx2.h"
#include "../csr/csr.h"
#include "../core/dispatch.h"
#include "../core/empty.h"

namespace torchops {
namespace {

constexpr int64_t kCostPerChunk = 1 << 16;  // multiply-adds per parallel task

// Calls f(row_begin, row_end) in parallel over chunks of rows of about equal cost, cost(row) = (nnz of the
// row + 1) * n_cols. Chunk boundaries come from a binary search on crow[i] + i, which is increasing.
template <typename Index, typename F>
void parallel_over_rows(const Index* crow, int64_t M, int64_t n_cols, F&& f) {
  if (M == 0) return;
  const int64_t items = static_cast<int64_t>(crow[M]) + M;
  const int64_t chunks =
      std::clamp<int64_t>(items * std::max<int64_t>(n_cols, 1) / kCostPerChunk, 1, std::min<int64_t>(M, 1 << 16));
  const auto row_at = [&](int64_t chunk) {  // first row i with crow[i] + i >= chunk * items / chunks
    const int64_t target = chunk * items / chunks;
    int64_t lo = 0, hi = M;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (static_cast<int64_t>(crow[mid]) + mid < target) lo = mid + 1; else hi = mid;
    }
    return lo;
  };
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t r0 = row_at(c), r1 = c + 1 == chunks ? M : row_at(c + 1);
      if (r0 < r1) f(r0, r1);
    }
  });
}

// ------------------------------------------------------------------------------------------------ forward

#ifdef TORCHOPS_HAS_AVX2_PATH
// out[j0, j0 + 8 kV) of one row: kV 8-float accumulators stay in registers over the row's nonzeros.
template <int kV, typename T, typename Index>
TORCHOPS_TARGET_AVX2 inline void row_tile_avx2(const Index* cols, const T* vals, int64_t len, const T* dense,
                                               int64_t ld, int64_t j0, T* out) {
  __m256 acc[kV];
  for (int k = 0; k < kV; ++k) acc[k] = _mm256_setzero_ps();
  for (int64_t p = 0; p < len; ++p) {
    const __m256 v = _mm256_set1_ps(static_cast<float>(vals[p]));
    const T* d = dense + static_cast<int64_t>(cols[p]) * ld + j0;
    for (int k = 0; k < kV; ++k) acc[k] = _mm256_fmadd_ps(v, cpu::load8_as_float(d + 8 * k), acc[k]);
  }
  for (int k = 0; k < kV; ++k) cpu::store8_from_float(out + j0 + 8 * k, acc[k]);
}

template <typename T, typename Index>
TORCHOPS_TARGET_AVX2 void spmm_rows_avx2(const Index* crow, const Index* col, const T* val, const T* dense,
                                         int64_t ld, T* out, int64_t N, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t begin = crow[r], len = static_cast<int64_t>(crow[r + 1]) - begin;
    const Index* cols = col + begin;
    const T* vals = val + begin;
    T* out_row = out + r * N;
    int64_t j = 0;
    // Widest tiles first: each tile walks the row's nonzeros once, so N = 32 is one pass, not four.
    for (; j + 64 <= N; j += 64) row_tile_avx2<8>(cols, vals, len, dense, ld, j, out_row);
    if (j + 32 <= N) {
      row_tile_avx2<4>(cols, vals, len, dense, ld, j, out_row);
      j += 32;
    }
    if (j + 16 <= N) {
      row_tile_avx2<2>(cols, vals, len, dense, ld, j, out_row);
      j += 16;
    }
    if (j + 8 <= N) {
      row_tile_avx2<1>(cols, vals, len, dense, ld, j, out_row);
      j += 8;
    }
    for (; j < N; ++j) {  // the last N % 8 columns
      float s = 0.f;
      for (int64_t p = 0; p < len; ++p) s += static_cast<float>(vals[p]) * static_cast<float>(dense[cols[p] * ld + j]);
      out_row[j] = static_cast<T>(s);
    }
  }
}
#endif

// Portable path (and f64): accumulate a row in opmath with at::vec.
template <typename T, typename Index>
void spmm_rows_generic(const Index* crow, const Index* col, const T* val, const T* dense, int64_t ld, T* out,
                       int64_t N, int64_t r0, int64_t r1) {
  using acc_t = opmath_t<T>;
  using Vec = at::vec::Vectorized<acc_t>;
  std::vector<acc_t> acc_buf(std::is_same_v<acc_t, T> ? 0 : N);
  for (int64_t r = r0; r < r1; ++r) {
    acc_t* acc = std::is_same_v<acc_t, T> ? reinterpret_cast<acc_t*>(out + r * N) : acc_buf.data();
    std::fill(acc, acc + N, acc_t(0));
    for (int64_t p = crow[r]; p < static_cast<int64_t>(crow[r + 1]); ++p) {
      const acc_t v = static_cast<acc_t>(val[p]);
      const T* d = dense + static_cast<int64_t>(col[p]) * ld;
      int64_t j = 0;
      if constexpr (std::is_same_v<acc_t, T>) {
        const Vec vv(v);
        for (; j + Vec::size() <= N; j += Vec::size()) {
          at::vec::fmadd(vv, Vec::loadu(d + j), Vec::loadu(acc + j)).store(acc + j);
        }
      }
      for (; j < N; ++j) acc[j] += v * static_cast<acc_t>(d[j]);
    }
    if constexpr (!std::is_same_v<acc_t, T>) {
      for (int64_t j = 0; j < N; ++j) out[r * N + j] = static_cast<T>(acc[j]);
    }
  }
}

// out = A @ dense, out M x N dense; dense read through its row stride (columns dense).
void spmm_into(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values, const at::Tensor& dense,
               const at::Tensor& out) {
  const int64_t M = out.size(0), N = out.size(1);
  const int64_t ld = row_stride(dense);
  TORCHOPS_DISPATCH_INDEX_TYPES(crow.scalar_type(), "csr_spmm_cpu", [&] {
    TORCHOPS_DISPATCH_FLOAT_TYPES(values.scalar_type(), "csr_spmm_cpu", [&] {
      const index_t* pc = crow.const_data_ptr<index_t>();
      const index_t* pk = col.const_data_ptr<index_t>();
      const scalar_t* pv = values.const_data_ptr<scalar_t>();
      const scalar_t* pd = dense.const_data_ptr<scalar_t>();
      scalar_t* po = out.mutable_data_ptr<scalar_t>();
      parallel_over_rows(pc, M, N, [&](int64_t r0, int64_t r1) {
#ifdef TORCHOPS_HAS_AVX2_PATH
        if constexpr (!std::is_same_v<scalar_t, double>) {
          if (cpu::cpu_has_avx2()) return spmm_rows_avx2(pc, pk, pv, pd, ld, po, N, r0, r1);
        }
#endif
        spmm_rows_generic(pc, pk, pv, pd, ld, po, N, r0, r1);
      });
    });
  });
}

// csr.h's CsrSpmmKernels on the CPU.
struct CpuBackend {
  // out (M x N) for arguments that passed check_csr_spmm_args; validates the structure (it reads the
  // indices), and makes the index tensors and values contiguous.
  static at::Tensor spmm(const char* op, const at::Tensor& crow_in, const at::Tensor& col_in,
                         const at::Tensor& values_in, const at::Tensor& dense_in) {
    const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous(), values = values_in.contiguous();
    const int64_t M = crow.numel() - 1, N = dense_in.size(1);
    check_csr_structure_cpu(op, crow, col, dense_in.size(0));
    at::Tensor out = empty_dense_cpu({M, N}, values.scalar_type());
    if (out.numel() == 0) return out;
    spmm_into(crow, col, values, with_unit_column_stride(dense_in), out);
    return out;
  }
};

// -------------------------------------------------------------------------------------------------- sddmm

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

at::Tensor csr_sddmm_cpu(const at::Tensor& crow_in, const at::Tensor& col_in, const at::Tensor& grad_out,
                         const at::Tensor& dense) {
  const char* op = "_csr_sddmm";
  check_csr_sddmm_args(op, crow_in, col_in, grad_out, dense);
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous();
  check_csr_structure_cpu(op, crow, col, dense.size(0));
  const int64_t M = crow.numel() - 1, N = dense.size(1), nnz = col.numel();
  at::Tensor out = empty_dense_cpu({nnz}, grad_out.scalar_type());
  if (nnz == 0) return out;
  const at::Tensor a = with_unit_column_stride(grad_out), b = with_unit_column_stride(dense);
  const int64_t lda = row_stride(a), ldb = row_stride(b);
  TORCHOPS_DISPATCH_INDEX_TYPES(crow.scalar_type(), "csr_sddmm_cpu", [&] {
    TORCHOPS_DISPATCH_FLOAT_TYPES(out.scalar_type(), "csr_sddmm_cpu", [&] {
      const index_t* pc = crow.const_data_ptr<index_t>();
      const index_t* pk = col.const_data_ptr<index_t>();
      const scalar_t* pa = a.const_data_ptr<scalar_t>();
      const scalar_t* pb = b.const_data_ptr<scalar_t>();
      scalar_t* po = out.mutable_data_ptr<scalar_t>();
      parallel_over_rows(pc, M, N, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const scalar_t* ar = pa + r * lda;
          for (int64_t p = pc[r]; p < static_cast<int64_t>(pc[r + 1]); ++p) {
            const scalar_t* br = pb + static_cast<int64_t>(pk[p]) * ldb;
#ifdef TORCHOPS_HAS_AVX2_PATH
            if constexpr (!std::is_same_v<scalar_t, double>) {
              if (cpu::cpu_has_avx2()) {
                po[p] = static_cast<scalar_t>(dot_avx2(ar, br, N));
                continue;
              }
            }
#endif
            po[p] = static_cast<scalar_t>(dot_generic(ar, br, N));
          }
        }
      });
    });
  });
  return out;
}

// ---------------------------------------------------------------------------------------------- transpose

std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_transpose_cpu(const at::Tensor& crow_in, const at::Tensor& col_in,
                                                                 int64_t K) {
  const char* op = "_csr_transpose";
  check_csr_transpose_input(op, crow_in, col_in, K);
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous();
  check_csr_structure_cpu(op, crow, col, K);
  const int64_t M = crow.numel() - 1, nnz = col.numel();
  const auto dtype = crow.scalar_type();
  at::Tensor t_crow = empty_dense_cpu({K + 1}, dtype), t_col = empty_dense_cpu({nnz}, dtype),
             t_perm = empty_dense_cpu({nnz}, dtype);
  TORCHOPS_DISPATCH_INDEX_TYPES(crow.scalar_type(), "csr_transpose_cpu", [&] {
    const index_t* pc = crow.const_data_ptr<index_t>();
    const index_t* pk = col.const_data_ptr<index_t>();
    index_t* tc = t_crow.mutable_data_ptr<index_t>();
    index_t* tk = t_col.mutable_data_ptr<index_t>();
    index_t* tp = t_perm.mutable_data_ptr<index_t>();
    std::fill(tc, tc + K + 1, index_t(0));
    for (int64_t p = 0; p < nnz; ++p) ++tc[pk[p] + 1];  // column counts
    for (int64_t k = 0; k < K; ++k) tc[k + 1] += tc[k];  // exclusive offsets
    std::vector<index_t> next(tc, tc + K);
    for (int64_t r = 0; r < M; ++r) {  // rows in order: each column's entries stay sorted by row
      for (int64_t p = pc[r]; p < static_cast<int64_t>(pc[r + 1]); ++p) {
        const index_t q = next[pk[p]]++;
        tk[q] = static_cast<index_t>(r);
        tp[q] = static_cast<index_t>(p);
      }
    }
  });
  return {t_crow, t_col, t_perm};
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, CPU, m) {
  CsrSpmmKernels<CpuBackend>::register_kernels(m);
  m.impl("_csr_sddmm", &csr_sddmm_cpu);
  m.impl("_csr_transpose", &csr_transpose_cpu);
}

}  // namespace torchops
