// The sparse x dense engine on the CPU (csr_spmm, spmm_reduce, _spmm_reduce_forward, _csr_spmm_with_transpose),
// the gradient of a max/min (_spmm_reduce_backward), the transpose, and the registration of every sparse op's
// CPU kernel (csr.h's CsrKernels over csr_cpu.h's backend).
//
//   forward    per row and head, register tiles of 64 (then 32, 16, 8) output columns over the row's nonzeros
//              (AVX2/FMA/F16C when the processor has them), f32 math for 16-bit, f64 for f64 (at::vec); sums in
//              the row's order; max and min keep the first nonzero reaching the extreme (NaN above every number),
//              min as the max of the negated products (negation is exact, so ties and NaN behave alike);
//   backward   max/min: each selected nonzero's product rule, rows in parallel for values (a row's positions are
//              its own), column ranges in parallel for dense (each range's rows in order: deterministic);
//   transpose  a stable counting sort (serial: O(nnz), deterministic).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../core/cpu_avx2.h"
#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../csr/csr_cpu.h"

namespace torchops {
namespace {

using cpu::parallel_over_rows;

// What the engine multiplies: spmm_operands() with raw pointers, and the reduction.
template <typename T, typename Index>
struct SpmmArgs : SpmmInputs<T> {
  const Index* crow;
  const Index* col;
  T* out;      // M x H x D, contiguous
  Index* arg;  // M x H x D (max/min), or null
  int64_t D;
  bool mean;         // sum: divide by the row's length
  opmath_t<T> sign;  // max: 1; min: -1 (the max of the negated products, negated back)
};

// One head of one row.
template <typename T, typename Index>
struct Row {
  const Index* cols;   // the row's column indices
  int64_t begin, len;  // its nonzeros' positions [begin, begin + len)
  const T* vals;       // weight of the row's first nonzero (then every vs-th), or null
  int64_t vs;
  const T* dense;  // dense's head h: row k at dense + k * ld
  int64_t ld;
  T* out;      // D outputs
  Index* arg;  // D positions, or null
};

template <typename T>
inline bool selects_over(opmath_t<T> x, opmath_t<T> best) {  // x replaces best (max: larger, or NaN over a number)
  return x > best || (x != x && best == best);
}

// ------------------------------------------------------------------------------------------------ AVX2

#ifdef TORCHOPS_HAS_AVX2_PATH
// out[j0, j0 + 8 kV) of one row: kV 8-float accumulators stay in registers over the row's nonzeros.
template <int kV, bool kOnes, typename T, typename Index>
TORCHOPS_TARGET_AVX2 inline void sum_tile_avx2(const Row<T, Index>& r, int64_t j0, float count) {
  __m256 acc[kV];
  for (int k = 0; k < kV; ++k) acc[k] = _mm256_setzero_ps();
  for (int64_t p = 0; p < r.len; ++p) {
    const T* d = r.dense + static_cast<int64_t>(r.cols[p]) * r.ld + j0;
    if constexpr (kOnes) {
      for (int k = 0; k < kV; ++k) acc[k] = _mm256_add_ps(acc[k], cpu::load8_as_float(d + 8 * k));
    } else {
      const __m256 v = _mm256_set1_ps(static_cast<float>(r.vals[p * r.vs]));
      for (int k = 0; k < kV; ++k) acc[k] = _mm256_fmadd_ps(v, cpu::load8_as_float(d + 8 * k), acc[k]);
    }
  }
  if (count != 1.f) {
    for (int k = 0; k < kV; ++k) acc[k] = _mm256_div_ps(acc[k], _mm256_set1_ps(count));
  }
  for (int k = 0; k < kV; ++k) cpu::store8_from_float(r.out + j0 + 8 * k, acc[k]);
}

// The max over the row of sign * product, per column, and (kArg) the position of the first nonzero reaching
// it. len >= 1 (and < 2^31: positions are kept as 32-bit offsets).
template <int kV, bool kOnes, bool kArg, typename T, typename Index>
TORCHOPS_TARGET_AVX2 inline void select_tile_avx2(const Row<T, Index>& r, int64_t j0, float sign) {
  __m256 acc[kV];
  __m256i pos[kV];
  {
    const T* d = r.dense + static_cast<int64_t>(r.cols[0]) * r.ld + j0;
    const __m256 v = _mm256_set1_ps(kOnes ? sign : sign * static_cast<float>(r.vals[0]));
    for (int k = 0; k < kV; ++k) {
      acc[k] = _mm256_mul_ps(v, cpu::load8_as_float(d + 8 * k));
      pos[k] = _mm256_setzero_si256();
    }
  }
  for (int64_t p = 1; p < r.len; ++p) {
    const T* d = r.dense + static_cast<int64_t>(r.cols[p]) * r.ld + j0;
    const __m256 v = _mm256_set1_ps(kOnes ? sign : sign * static_cast<float>(r.vals[p * r.vs]));
    const __m256 here = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int32_t>(p)));
    for (int k = 0; k < kV; ++k) {
      const __m256 x = _mm256_mul_ps(v, cpu::load8_as_float(d + 8 * k));
      const __m256 nan_over_number =
          _mm256_andnot_ps(_mm256_cmp_ps(acc[k], acc[k], _CMP_UNORD_Q), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
      const __m256 take = _mm256_or_ps(_mm256_cmp_ps(x, acc[k], _CMP_GT_OQ), nan_over_number);
      acc[k] = _mm256_blendv_ps(acc[k], x, take);
      if constexpr (kArg) pos[k] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(pos[k]), here, take));
    }
  }
  for (int k = 0; k < kV; ++k) {
    cpu::store8_from_float(r.out + j0 + 8 * k, _mm256_mul_ps(acc[k], _mm256_set1_ps(sign)));
    if constexpr (kArg) {
      alignas(32) int32_t lanes[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), pos[k]);
      for (int e = 0; e < 8; ++e) r.arg[j0 + 8 * k + e] = static_cast<Index>(r.begin + lanes[e]);
    }
  }
}
#endif

// --------------------------------------------------------------------------------------------- portable

template <bool kOnes, typename T, typename Index>
inline opmath_t<T> product(const Row<T, Index>& r, int64_t p, int64_t j) {
  const opmath_t<T> x = static_cast<opmath_t<T>>(r.dense[static_cast<int64_t>(r.cols[p]) * r.ld + j]);
  return kOnes ? x : static_cast<opmath_t<T>>(r.vals[p * r.vs]) * x;
}

// Column j of a sum / mean, in the row's order.
template <bool kOnes, typename T, typename Index>
inline void sum_column(const Row<T, Index>& r, int64_t j, opmath_t<T> count) {
  opmath_t<T> s = 0;
  for (int64_t p = 0; p < r.len; ++p) s += product<kOnes>(r, p, j);
  r.out[j] = static_cast<T>(count != 1 ? s / count : s);
}

// Column j of a max (of sign * product).
template <bool kOnes, bool kArg, typename T, typename Index>
inline void select_column(const Row<T, Index>& r, int64_t j, opmath_t<T> sign) {
  opmath_t<T> best = 0;
  int64_t at = -1;
  for (int64_t p = 0; p < r.len; ++p) {
    const opmath_t<T> x = sign * product<kOnes>(r, p, j);
    if (at < 0 || selects_over<T>(x, best)) {
      best = x;
      at = p;
    }
  }
  r.out[j] = static_cast<T>(at < 0 ? opmath_t<T>(0) : sign * best);
  if constexpr (kArg) r.arg[j] = static_cast<Index>(at < 0 ? -1 : r.begin + at);
}

// A whole row of a sum / mean through at::vec (f64; and every dtype where AVX2 is missing), accumulating in
// opmath in `acc` (D entries).
template <bool kOnes, typename T, typename Index>
void sum_row_vec(const Row<T, Index>& r, int64_t D, opmath_t<T> count, opmath_t<T>* acc) {
  using acc_t = opmath_t<T>;
  using Vec = at::vec::Vectorized<acc_t>;
  std::fill(acc, acc + D, acc_t(0));
  for (int64_t p = 0; p < r.len; ++p) {
    const acc_t v = kOnes ? acc_t(1) : static_cast<acc_t>(r.vals[p * r.vs]);
    const T* d = r.dense + static_cast<int64_t>(r.cols[p]) * r.ld;
    int64_t j = 0;
    if constexpr (std::is_same_v<acc_t, T>) {
      const Vec vv(v);
      for (; j + Vec::size() <= D; j += Vec::size()) at::vec::fmadd(vv, Vec::loadu(d + j), Vec::loadu(acc + j)).store(acc + j);
    }
    for (; j < D; ++j) acc[j] += v * static_cast<acc_t>(d[j]);
  }
  for (int64_t j = 0; j < D; ++j) r.out[j] = static_cast<T>(count != 1 ? acc[j] / count : acc[j]);
}

// ------------------------------------------------------------------------------------------------ driver

template <typename T, typename Index>
Row<T, Index> row_of(const SpmmArgs<T, Index>& a, int64_t r, int64_t h) {
  const int64_t begin = a.crow[r];
  Row<T, Index> row{a.col + begin, begin, static_cast<int64_t>(a.crow[r + 1]) - begin,
                    a.val == nullptr ? nullptr : a.val + begin * a.vs + h * a.vhs, a.vs, a.dense + h * a.dhs, a.ld,
                    a.out + (r * a.H + h) * a.D, a.arg == nullptr ? nullptr : a.arg + (r * a.H + h) * a.D};
  return row;
}

// Rows [r0, r1), every head: sums (and means).
template <bool kOnes, typename T, typename Index>
void sum_rows(const SpmmArgs<T, Index>& a, int64_t r0, int64_t r1) {
  using acc_t = opmath_t<T>;
  std::vector<acc_t> acc;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t h = 0; h < a.H; ++h) {
      const Row<T, Index> row = row_of(a, r, h);
      const acc_t count = a.mean ? acc_t(std::max<int64_t>(row.len, 1)) : acc_t(1);
#ifdef TORCHOPS_HAS_AVX2_PATH
      if constexpr (!std::is_same_v<T, double>) {
        if (cpu::cpu_has_avx2()) {
          const float c = static_cast<float>(count);
          int64_t j = 0;
          // Widest tiles first: each tile walks the row's nonzeros once, so D = 32 is one pass, not four.
          for (; j + 64 <= a.D; j += 64) sum_tile_avx2<8, kOnes>(row, j, c);
          if (j + 32 <= a.D) sum_tile_avx2<4, kOnes>(row, j, c), j += 32;
          if (j + 16 <= a.D) sum_tile_avx2<2, kOnes>(row, j, c), j += 16;
          if (j + 8 <= a.D) sum_tile_avx2<1, kOnes>(row, j, c), j += 8;
          for (; j < a.D; ++j) sum_column<kOnes>(row, j, count);  // the last D % 8 columns
          continue;
        }
      }
#endif
      acc.resize(a.D);
      sum_row_vec<kOnes>(row, a.D, count, acc.data());
    }
  }
}

// Rows [r0, r1), every head: max / min, with the selected positions when kArg.
template <bool kOnes, bool kArg, typename T, typename Index>
void select_rows(const SpmmArgs<T, Index>& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t h = 0; h < a.H; ++h) {
      const Row<T, Index> row = row_of(a, r, h);
      int64_t j = 0;
#ifdef TORCHOPS_HAS_AVX2_PATH
      if constexpr (!std::is_same_v<T, double>) {
        if (cpu::cpu_has_avx2() && row.len >= 1 && row.len <= std::numeric_limits<int32_t>::max()) {
          const float s = static_cast<float>(a.sign);
          for (; j + 32 <= a.D; j += 32) select_tile_avx2<4, kOnes, kArg>(row, j, s);
          if (j + 16 <= a.D) select_tile_avx2<2, kOnes, kArg>(row, j, s), j += 16;
          if (j + 8 <= a.D) select_tile_avx2<1, kOnes, kArg>(row, j, s), j += 8;
        }
      }
#endif
      for (; j < a.D; ++j) select_column<kOnes, kArg>(row, j, a.sign);
    }
  }
}

template <typename T, typename Index>
void spmm_into(const SpmmArgs<T, Index>& a, int64_t M, Reduce reduce) {
  const bool ones = a.val == nullptr, arg = a.arg != nullptr;
  parallel_over_rows(a.crow, M, a.H * a.D, [&](int64_t r0, int64_t r1) {
    if (!selects(reduce)) {
      return ones ? sum_rows<true>(a, r0, r1) : sum_rows<false>(a, r0, r1);
    }
    if (ones) return arg ? select_rows<true, true>(a, r0, r1) : select_rows<true, false>(a, r0, r1);
    return arg ? select_rows<false, true>(a, r0, r1) : select_rows<false, false>(a, r0, r1);
  });
}

// ---------------------------------------------------------------------------------- max/min backward

// The gradient of out[i, h, d] = w(p, h) * dense[col[p], h, d], p = arg[i, h, d]: to values
// (g * dense[col[p], h, d], summed over the heads when one value serves them all) and to dense (g * w(p, h)).
// Positions outside their row (only a malformed arg has them) give nothing.
template <typename T, typename Index>
void select_backward_into(const SpmmArgs<T, Index>& a, const T* g, int64_t M, opmath_t<T>* grad_values,
                          opmath_t<T>* grad_dense, int64_t value_heads) {
  using acc_t = opmath_t<T>;
  const int64_t H = a.H, D = a.D;
  const auto weight = [&](int64_t p, int64_t h) {
    return a.val == nullptr ? acc_t(1) : static_cast<acc_t>(a.val[p * a.vs + h * a.vhs]);
  };
  if (grad_values != nullptr) {
    parallel_over_rows(a.crow, M, H * D, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t begin = a.crow[r], end = a.crow[r + 1];
        for (int64_t h = 0; h < H; ++h) {
          const int64_t e = (r * H + h) * D;
          for (int64_t d = 0; d < D; ++d) {
            const int64_t p = a.arg[e + d];
            if (p < begin || p >= end) continue;
            const T* x = a.dense + static_cast<int64_t>(a.col[p]) * a.ld + h * a.dhs + d;
            grad_values[p * value_heads + (value_heads > 1 ? h : 0)] += static_cast<acc_t>(g[e + d]) * static_cast<acc_t>(*x);
          }
        }
      }
    });
  }
  if (grad_dense != nullptr) {
    // Column ranges of the (H x D) output columns in parallel, each walking every row in order.
    const int64_t columns = H * D;
    const int64_t grain = std::max<int64_t>(1, cpu::kCostPerChunk / std::max<int64_t>(M, 1));
    at::parallel_for(0, columns, grain, [&](int64_t c0, int64_t c1) {
      for (int64_t r = 0; r < M; ++r) {
        const int64_t begin = a.crow[r], end = a.crow[r + 1];
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t p = a.arg[r * columns + c];
          if (p < begin || p >= end) continue;
          const int64_t h = c / D;
          grad_dense[static_cast<int64_t>(a.col[p]) * columns + c] += static_cast<acc_t>(g[r * columns + c]) * weight(p, h);
        }
      }
    });
  }
}

template <typename T, typename Index>
SpmmArgs<T, Index> spmm_args(const SpmmOperands& s) {
  SpmmArgs<T, Index> a{};
  a.set_inputs(s);
  a.crow = s.crow.const_data_ptr<Index>();
  a.col = s.col.const_data_ptr<Index>();
  a.D = s.D;
  a.sign = 1;
  return a;
}

}  // namespace

template <>
at::Tensor CpuCsrBackend::empty(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& /*device_of*/) {
  return empty_dense_cpu(sizes, dtype);
}

template <>
at::Tensor CpuCsrBackend::spmm(const char* op, const SpmmOperands& s, Reduce reduce, at::Tensor* arg) {
  check_csr_structure_cpu(op, s.crow, s.col, s.K);
  const auto dtype = s.dense.scalar_type();
  at::Tensor out = empty_dense_cpu(s.out_sizes, dtype);
  if (arg != nullptr) *arg = empty_dense_cpu(s.out_sizes, s.crow.scalar_type());
  if (out.numel() == 0) return out;
  TORCHOPS_DISPATCH_INDEX_TYPES(s.crow.scalar_type(), "spmm_reduce_cpu", [&] {
    TORCHOPS_DISPATCH_FLOAT_TYPES(dtype, "spmm_reduce_cpu", [&] {
      SpmmArgs<scalar_t, index_t> a = spmm_args<scalar_t, index_t>(s);
      a.out = out.mutable_data_ptr<scalar_t>();
      a.arg = arg != nullptr ? arg->mutable_data_ptr<index_t>() : nullptr;
      a.mean = reduce == Reduce::kMean;
      a.sign = reduce == Reduce::kMin ? -1 : 1;
      spmm_into(a, s.M, reduce);
    });
  });
  return out;
}

template <>
std::tuple<at::Tensor, at::Tensor> CpuCsrBackend::select_backward(const char* op, const at::Tensor& grad_out,
                                                                  const SpmmOperands& s, const at::Tensor& arg_in,
                                                                  const OptTensor& /*t_crow*/,
                                                                  const OptTensor& /*t_col*/,
                                                                  const OptTensor& /*t_perm*/, bool values_grad,
                                                                  bool dense_grad) {
  // The CPU needs no transpose: each column range of dense's gradient walks the rows itself.
  check_csr_structure_cpu(op, s.crow, s.col, s.K);
  const auto dtype = s.dense.scalar_type();
  const auto acc_dtype = is_16bit_float_dtype(dtype) ? at::kFloat : dtype;
  const int64_t value_heads = s.values.defined() && s.values.dim() == 2 ? s.H : 1;
  at::Tensor gv, gd;
  if (values_grad) gv = empty_dense_cpu({s.nnz * value_heads}, acc_dtype).zero_();
  if (dense_grad) gd = empty_dense_cpu({s.K * s.H * s.D}, acc_dtype).zero_();
  const at::Tensor g = grad_out.contiguous(), arg = arg_in.contiguous();
  if (s.M > 0 && s.H * s.D > 0) {
    TORCHOPS_DISPATCH_INDEX_TYPES(s.crow.scalar_type(), "spmm_reduce_backward_cpu", [&] {
      TORCHOPS_DISPATCH_FLOAT_TYPES(dtype, "spmm_reduce_backward_cpu", [&] {
        SpmmArgs<scalar_t, index_t> a = spmm_args<scalar_t, index_t>(s);
        a.arg = const_cast<index_t*>(arg.const_data_ptr<index_t>());  // read only
        using acc_t = opmath_t<scalar_t>;
        select_backward_into(a, g.const_data_ptr<scalar_t>(), s.M,
                             values_grad ? gv.mutable_data_ptr<acc_t>() : nullptr,
                             dense_grad ? gd.mutable_data_ptr<acc_t>() : nullptr, value_heads);
      });
    });
  }
  at::Tensor grad_values, grad_dense;
  if (values_grad) grad_values = gv.to(dtype).view(s.values.sizes());
  if (dense_grad) {
    const std::vector<int64_t> sizes = s.dense.dim() == 3 ? std::vector<int64_t>{s.K, s.H, s.D}
                                                          : std::vector<int64_t>{s.K, s.D};
    grad_dense = gd.to(dtype).view(sizes);
  }
  return {grad_values, grad_dense};
}

template <>
std::tuple<at::Tensor, at::Tensor, at::Tensor> CpuCsrBackend::transpose(const char* op, const at::Tensor& crow_in,
                                                                        const at::Tensor& col_in, int64_t K) {
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

TORCH_LIBRARY_IMPL(myns, CPU, m) {
  CsrKernels<CpuCsrBackend>::register_kernels(m);
}

}  // namespace torchops
