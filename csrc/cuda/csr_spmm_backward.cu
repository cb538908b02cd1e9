// sddmm and the transpose on CUDA: the kernels behind csr_spmm's / spmm_reduce's backward (the gradient of
// values is an SDDMM; that of dense a product over the transpose) and sddmm itself. A separate translation
// unit from the forward so the two compile in parallel.
//
// sddmm "dot": out[p, h] = dot(a[row(p), h], b[col(p), h]). Same merge-path units and (col) window as the
//   forward; each head is its own walk (grid.y); each lane holds V columns of a's row (re-read only when
//   D > 32 V), kBatch nonzeros' partial dots are reduced across the warp together, and lane k keeps the result
//   of window slot k so the stores are coalesced. Masked (the values gradient of a max / min): a column counts
//   only where sel[row(p), h, d] == p.
// sddmm "add" / "mul": one lane per nonzero of the window, every head of it.
// _csr_transpose: keys = col (columns outside [0, K) become K, sorted last and left out of the offsets),
//   a stable radix sort of the keys (at::sort(stable=true): deterministic), t_crow_indices by a lower-bound
//   search per column, and each sorted entry's row by a binary search on crow_indices. Stable order = rows
//   ascending within a column, so a product over the transpose sums in a fixed order: the dense gradient is
//   deterministic (bit-identical run to run).
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/sort.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>
#include <tuple>

#include "../core/cuda_utils.cuh"
#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../csr/csr.h"
#include "../csr/csr_cuda.cuh"

namespace torchops {
namespace {

using namespace torchops::cuda;

// ------------------------------------------------------------------------------------------------- sddmm

template <typename T, typename Index>
struct SddmmArgs : MergePathArgs<Index> {  // N: D
  const T* a;  // M rows (row stride lda); head h at a + h * ahs; unit column stride
  int64_t lda, ahs;
  const T* b;  // K rows, likewise
  int64_t ldb, bhs;
  const Index* sel;  // masked: M rows of H * D selections, or null
  int64_t H;
  T* out;                    // nnz x H
  opmath_t<T>* out_opmath;   // dot: nnz x H in opmath instead of out (not rounded to T), or null
};

template <typename T, typename Index, int V, bool kMasked>
__global__ void __launch_bounds__(kWarpBlockThreads) csr_sddmm_kernel(const SddmmArgs<T, Index> s) {
  using acc_t = opmath_t<T>;
  using Vec = AlignedVector<T, V>;
  using Sel = AlignedVector<Index, V>;
  constexpr int kBatch = 4;
  const int lane = threadIdx.x % kWarpSize;
  int64_t unit;
  MergeCoord start, end;
  if (!warp_merge_unit(s, unit, start, end)) return;  // whole warps only

  const int64_t j0 = int64_t{lane} * V;  // this lane's first column; then every 32 V columns
  const bool first_ok = j0 < s.N;
  for (int64_t h = blockIdx.y; h < s.H; h += gridDim.y) {
    int64_t j = start.nz;
    int64_t wbase = j - kWarpSize;
    int64_t wcol = -1;
    acc_t mine = acc_t(0);  // result of window slot `lane`
    for (int64_t r = start.row; r <= end.row && r < s.M; ++r) {
      const int64_t re = unit_row_end(s.crow, r, j, end, s.nnz);
      if (j >= re) continue;
      const T* arow = s.a + r * s.lda + h * s.ahs;
      const Index* srow = kMasked ? s.sel + (r * s.H + h) * s.N : nullptr;
      acc_t a0[V];  // a[r, h, j0 : j0 + V], kept for the row
      Sel sel0;     // masked: sel[r, h, j0 : j0 + V]
      {
        const Vec x = first_ok ? load_vector<T, V>(arow + j0, 0) : zero_vector<T, V>();
#pragma unroll
        for (int e = 0; e < V; ++e) a0[e] = static_cast<acc_t>(x.val[e]);
        if constexpr (kMasked) {
          if (first_ok) {
            sel0 = load_vector<Index, V>(srow + j0, 0);
          } else {
#pragma unroll
            for (int e = 0; e < V; ++e) sel0.val[e] = Index(-1);
          }
        }
      }
      while (j < re) {
        if (j >= wbase + kWarpSize) {
          wbase = j;
          const int64_t p = j + lane;
          wcol = p < end.nz ? static_cast<int64_t>(s.col[p]) : -1;
        }
        const int kb = static_cast<int>(j - wbase);
        const int ke = static_cast<int>(::min(re - wbase, int64_t{kWarpSize}));
        for (int k = kb; k < ke; k += kBatch) {
          acc_t dot[kBatch];
          Vec x[kBatch];
          bool ok[kBatch];
          const T* brow[kBatch];
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            const int kk = k + u;
            const int64_t c = __shfl_sync(kFullWarpMask, wcol, kk & (kWarpSize - 1));
            ok[u] = kk < ke && c >= 0 && c < s.K;  // the same on every lane
            brow[u] = s.b + (ok[u] ? c : 0) * s.ldb + h * s.bhs;
            if (ok[u] && first_ok) {
              x[u] = load_vector<T, V>(brow[u] + j0, 0);
            } else {
              x[u] = zero_vector<T, V>();
            }
          }
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            const int64_t pos = wbase + k + u;
            dot[u] = acc_t(0);
#pragma unroll
            for (int e = 0; e < V; ++e) {
              const acc_t term = a0[e] * static_cast<acc_t>(x[u].val[e]);
              if constexpr (kMasked) {
                dot[u] += static_cast<int64_t>(sel0.val[e]) == pos ? term : acc_t(0);
              } else {
                dot[u] += term;
              }
            }
            if (ok[u]) {  // columns past the first 32 V (wide D): straight from memory
              for (int64_t jj = j0 + kWarpSize * V; jj < s.N; jj += kWarpSize * V) {
                const Vec xa = load_vector<T, V>(arow + jj, 0), xb = load_vector<T, V>(brow[u] + jj, 0);
                Sel xs;
                if constexpr (kMasked) xs = load_vector<Index, V>(srow + jj, 0);
#pragma unroll
                for (int e = 0; e < V; ++e) {
                  const acc_t term = static_cast<acc_t>(xa.val[e]) * static_cast<acc_t>(xb.val[e]);
                  if constexpr (kMasked) {
                    dot[u] += static_cast<int64_t>(xs.val[e]) == pos ? term : acc_t(0);
                  } else {
                    dot[u] += term;
                  }
                }
              }
            }
          }
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            dot[u] = warp_sum(dot[u]);
            if (k + u < ke && lane == k + u) mine = dot[u];
          }
        }
        if (lane >= kb && lane < ke) {
          if (s.out_opmath != nullptr) {
            s.out_opmath[(wbase + lane) * s.H + h] = mine;
          } else {
            s.out[(wbase + lane) * s.H + h] = static_cast<T>(mine);
          }
        }
        j = wbase + ke;
      }
    }
  }
}

// "add" / "mul": lane l of the warp takes nonzero j + l of the row, and every head of it.
template <typename T, typename Index, bool kAdd>
__global__ void __launch_bounds__(kWarpBlockThreads) csr_sddmm_pointwise_kernel(const SddmmArgs<T, Index> s) {
  using acc_t = opmath_t<T>;
  const int lane = threadIdx.x % kWarpSize;
  int64_t unit;
  MergeCoord start, end;
  if (!warp_merge_unit(s, unit, start, end)) return;  // whole warps only (the search is the warp's)
  int64_t j = start.nz;
  for (int64_t r = start.row; r <= end.row && r < s.M; ++r) {
    const int64_t re = unit_row_end(s.crow, r, j, end, s.nnz);
    const T* arow = s.a + r * s.lda;
    for (int64_t p = j + lane; p < re; p += kWarpSize) {
      const int64_t c = s.col[p];
      const bool ok = c >= 0 && c < s.K;
      const T* brow = s.b + (ok ? c : 0) * s.ldb;
      for (int64_t h = 0; h < s.H; ++h) {
        acc_t v = acc_t(0);  // (a column outside [0, K): malformed, b is not read)
        if (ok) {
          const acc_t x = static_cast<acc_t>(arow[h * s.ahs]), y = static_cast<acc_t>(brow[h * s.bhs]);
          v = kAdd ? x + y : x * y;
        }
        s.out[p * s.H + h] = static_cast<T>(v);
      }
    }
    j = re;
  }
}

template <typename T, typename Index, int V, bool kMasked>
void launch_sddmm_config(SddmmArgs<T, Index> s, int device, cudaStream_t stream) {
  constexpr auto kKernel = csr_sddmm_kernel<T, Index, V, kMasked>;
  const auto part = merge_partition(s.M, s.nnz, s.H, resident_warps<kKernel, kWarpBlockThreads>(device));
  s.per_unit = part.per_unit;
  s.units = part.units;
  const dim3 grid(blocks_to_cover(s.units, kWarpsPerBlock), static_cast<unsigned int>(std::min<int64_t>(s.H, kMaxGridYZ)));
  kKernel<<<grid, kWarpBlockThreads, 0, stream>>>(s);
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

template <typename T, typename Index, bool kAdd>
void launch_sddmm_pointwise(SddmmArgs<T, Index> s, int device, cudaStream_t stream) {
  constexpr auto kKernel = csr_sddmm_pointwise_kernel<T, Index, kAdd>;
  const auto part = merge_partition(s.M, s.nnz, 1, resident_warps<kKernel, kWarpBlockThreads>(device));
  s.per_unit = part.per_unit;
  s.units = part.units;
  kKernel<<<blocks_to_cover(s.units, kWarpsPerBlock), kWarpBlockThreads, 0, stream>>>(s);
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

// out (nnz x H) of the operands: "dot" (sel null: plain; else masked), "add" or "mul". `opmath`: a dot's
// result in the accumulation dtype (f32 for 16-bit), for a caller that sums it further and rounds once.
at::Tensor sddmm_into(const SddmmOperands& o, SddmmOp kind, const at::Tensor& sel, bool opmath = false) {
  const c10::cuda::CUDAGuard device_guard(o.a.device());
  const at::ScalarType dtype = o.a.scalar_type();
  const at::ScalarType out_dtype = opmath && kind == SddmmOp::kDot ? at::toOpMathType(dtype) : dtype;
  at::Tensor out = empty_dense_cuda({o.nnz, o.H}, out_dtype, o.a.device());
  if (out.numel() == 0) return out;
  if (o.M == 0 || (kind == SddmmOp::kDot && o.D == 0)) return out.zero_();  // empty dot products (M = 0 with nnz > 0 is malformed)
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCHOPS_DISPATCH_INDEX_TYPES(o.crow.scalar_type(), "sddmm_cuda", [&] {
    TORCHOPS_DISPATCH_FLOAT_TYPES(dtype, "sddmm_cuda", [&] {
      SddmmArgs<scalar_t, index_t> s{};
      s.set_matrix(o.crow, o.col, o.K, o.D);
      s.a = o.a.const_data_ptr<scalar_t>();
      s.lda = o.a_row_stride;
      s.ahs = o.a_head_stride;
      s.b = o.b.const_data_ptr<scalar_t>();
      s.ldb = o.b_row_stride;
      s.bhs = o.b_head_stride;
      s.sel = sel.defined() ? sel.const_data_ptr<index_t>() : nullptr;
      s.H = o.H;
      if (out_dtype != dtype) {
        s.out = nullptr;
        s.out_opmath = out.mutable_data_ptr<opmath_t<scalar_t>>();
      } else {
        s.out = out.mutable_data_ptr<scalar_t>();
        s.out_opmath = nullptr;
      }
      const int device = out.get_device();
      if (kind == SddmmOp::kAdd) return launch_sddmm_pointwise<scalar_t, index_t, true>(s, device, stream);
      if (kind == SddmmOp::kMul) return launch_sddmm_pointwise<scalar_t, index_t, false>(s, device, stream);
      int v = std::min(lane_vector_size<scalar_t>(o.D, s.lda, s.a), lane_vector_size<scalar_t>(o.D, s.ldb, s.b));
      while (v > 1 && (s.ahs % v != 0 || s.bhs % v != 0)) v /= 2;
      // the selections (masked) are read in vectors of v indices too: an offset view may allow narrower ones only
      while (v > 1 && s.sel != nullptr && !is_aligned(s.sel, v * static_cast<int>(sizeof(index_t)))) v /= 2;
      with_vector_size<scalar_t>(v, [&](auto vector) {
        constexpr int V = decltype(vector)::value;
        if (s.sel != nullptr) {
          launch_sddmm_config<scalar_t, index_t, V, true>(s, device, stream);
        } else {
          launch_sddmm_config<scalar_t, index_t, V, false>(s, device, stream);
        }
      });
    });
  });
  return out;
}

}  // namespace

template <>
at::Tensor CudaCsrBackend::sddmm(const char* /*op*/, const SddmmOperands& s, SddmmOp kind) {
  return sddmm_into(s, kind, at::Tensor()).view(s.out_sizes);
}

at::Tensor masked_sddmm_cuda(const SddmmOperands& s, const at::Tensor& sel) {
  return sddmm_into(s, SddmmOp::kDot, sel.contiguous(), /*opmath=*/true);
}

namespace {

// --------------------------------------------------------------------------------------------- transpose

template <typename Index, typename Key>
__global__ void transpose_keys_kernel(const Index* col, Key* keys, int64_t nnz, int64_t K) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < nnz; p += step) {
    const int64_t c = col[p];
    keys[p] = static_cast<Key>(c >= 0 && c < K ? c : K);
  }
}

// t_crow[k] = number of keys below k (keys sorted), k in [0, K].
template <typename Key, typename Index>
__global__ void transpose_offsets_kernel(const Key* sorted, int64_t nnz, Index* t_crow, int64_t K) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k <= K; k += step) {
    int64_t lo = 0, hi = nnz;
    while (lo < hi) {
      const int64_t mid = (lo + hi) >> 1;
      if (static_cast<int64_t>(sorted[mid]) < k) lo = mid + 1; else hi = mid;
    }
    t_crow[k] = static_cast<Index>(lo);
  }
}

// For each sorted entry q: t_perm[q] = its position p in A, t_col[q] = the row holding p.
template <typename Index>
__global__ void transpose_rows_kernel(const Index* crow, int64_t M, const int64_t* perm, Index* t_col, Index* t_perm,
                                      int64_t nnz) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < nnz; q += step) {
    const int64_t p = perm[q];
    int64_t lo = 0, hi = M;  // first row whose end is past p
    while (lo < hi) {
      const int64_t mid = (lo + hi) >> 1;
      if (static_cast<int64_t>(crow[mid + 1]) <= p) lo = mid + 1; else hi = mid;
    }
    t_perm[q] = static_cast<Index>(p);
    t_col[q] = static_cast<Index>(::min(lo, ::max(M - 1, int64_t{0})));
  }
}

template <typename Index, typename Key>
void transpose_into(const at::Tensor& crow, const at::Tensor& col, int64_t K, const at::Tensor& t_crow,
                    const at::Tensor& t_col, const at::Tensor& t_perm, cudaStream_t stream) {
  const int64_t M = crow.numel() - 1, nnz = col.numel();
  at::Tensor keys = empty_dense_cuda({nnz}, c10::CppTypeToScalarType<Key>::value, col.device());
  const unsigned int entry_blocks = blocks_to_cover(nnz, kIndexLoopThreads);
  transpose_keys_kernel<Index, Key><<<entry_blocks, kIndexLoopThreads, 0, stream>>>(
      col.const_data_ptr<Index>(), keys.mutable_data_ptr<Key>(), nnz, K);
  TORCHOPS_CUDA_LAUNCH_CHECK();
  const auto [sorted, perm] = at::sort(keys, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  transpose_offsets_kernel<Key, Index><<<blocks_to_cover(K + 1, kIndexLoopThreads), kIndexLoopThreads, 0, stream>>>(
      sorted.const_data_ptr<Key>(), nnz, t_crow.mutable_data_ptr<Index>(), K);
  TORCHOPS_CUDA_LAUNCH_CHECK();
  transpose_rows_kernel<Index><<<entry_blocks, kIndexLoopThreads, 0, stream>>>(
      crow.const_data_ptr<Index>(), M, perm.const_data_ptr<int64_t>(), t_col.mutable_data_ptr<Index>(),
      t_perm.mutable_data_ptr<Index>(), nnz);
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <>
std::tuple<at::Tensor, at::Tensor, at::Tensor> CudaCsrBackend::transpose(const char* /*op*/, const at::Tensor& crow_in,
                                                                         const at::Tensor& col_in, int64_t K) {
  const c10::cuda::CUDAGuard device_guard(crow_in.device());
  const int64_t nnz = col_in.numel();
  const auto dtype = crow_in.scalar_type();
  at::Tensor t_col = empty_dense_cuda({nnz}, dtype, crow_in.device());
  at::Tensor t_perm = empty_dense_cuda({nnz}, dtype, crow_in.device());
  at::Tensor t_crow = empty_dense_cuda({K + 1}, dtype, crow_in.device());
  if (nnz == 0) return {t_crow.zero_(), t_col, t_perm};
  const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCHOPS_DISPATCH_INDEX_TYPES(dtype, "csr_transpose_cuda", [&] {
    if (K < std::numeric_limits<int32_t>::max()) {  // 32-bit keys sort in half the passes
      transpose_into<index_t, int32_t>(crow, col, K, t_crow, t_col, t_perm, stream);
    } else {
      transpose_into<index_t, int64_t>(crow, col, K, t_crow, t_col, t_perm, stream);
    }
  });
  return {t_crow, t_col, t_perm};
}

}  // namespace torchops
