// csr_spmm on CUDA: out = A @ dense, A an M x K CSR matrix, out M x N.
//
// Work split: merge path over rows + nonzeros (csr/csr_cuda.cuh), one warp per unit of D items, so
// power-law rows (a few with 10^4..10^5 nonzeros, most with a handful) spread evenly over the GPU.
// Inside a unit:
//   - the unit's nonzeros stream through a 32-entry window: lane l loads (col, val) of nonzero w + l
//     (coalesced), and shuffles hand them to the lanes that gather the dense rows;
//   - the columns: a group of G lanes owns one vector of V columns per lane (V up to 16 bytes: float4 for
//     f32, 8 x bf16). Narrow N uses small groups, so the warp takes 32 / G nonzeros at once (N = 32 f32: 8
//     lanes of float4, 4 nonzeros at once); wide N uses whole warps over column tiles of 32 V columns
//     (grid.y: N = 512 f32 is 4 tiles of 128 columns), or narrower groups and tiles for long rows over a
//     `dense` larger than the L2 (launch_spmm);
//   - kBatch nonzeros per group are gathered before they are accumulated, so several dense rows are in
//     flight; row ends come 32 rows at a time through a second window (no load of its own per row);
//   - rows that end inside the unit are stored; the unit's last row, which continues in the next unit(s),
//     is left in a carry buffer, and a second kernel adds each row's carries in unit order.
// Accumulation is f32 for f16/bf16/f32 and f64 for f64. The result is deterministic: every partial sum is
// taken in a fixed order that depends only on the shapes and the GPU (SM count, L2 size, the kernel's
// occupancy), never on scheduling.
// For f16/bf16 a row split across units is rounded once: the unit that ends it leaves its part in f32
// too (the `head` buffer) and the second kernel stores the f32 sum. (Storing that part and adding the
// carries to it would round twice, which cancellation between the parts can turn into a large error.)
// Indices are never validated here (no host sync): see csr_cuda.cuh for how malformed ones stay in bounds.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>

#include "../csr/csr.h"
#include "../csr/csr_cuda.cuh"
#include "../core/cuda_utils.cuh"
#include "../core/dispatch.h"
#include "../core/empty.h"

namespace torchops {
namespace {

using namespace torchops::cuda;

template <typename T, typename Index>
struct SpmmArgs : MergePathArgs<Index> {
  const T* val;
  const T* dense;  // K rows of N, row stride ld, unit column stride
  int64_t ld;
  T* out;  // M x N, dense
  int64_t column_tiles;
  opmath_t<T>* carry;  // units x N
  int64_t* carry_row;  // units: the row a unit's carry belongs to, or -1
  opmath_t<T>* head;   // units x N, 16-bit T only (else null): unit u > 0's part of row start.row when it ends there
};

// Adds the partial sums of the warp's 32 / G lane groups (butterfly: every group ends with the same,
// order-independent bits, as IEEE addition is commutative).
template <int G, int V, typename Acc>
__device__ __forceinline__ void sum_over_groups(Acc (&acc)[V]) {
#pragma unroll
  for (int offset = G; offset < kWarpSize; offset <<= 1)
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] += __shfl_xor_sync(kFullWarpMask, acc[e], offset);
}

// G lanes per nonzero: a group of G lanes spans one column tile of G vectors of V columns, and the warp's
// 32 / G groups take 32 / G consecutive nonzeros at once (G < 32: narrow N, where one nonzero per warp
// would leave most lanes idle and pay every shuffle and index computation per 32 V columns).
// (Gathering a whole chunk of nonzeros across row boundaries before accumulating nearly doubles the
// registers, and the occupancy lost costs more than the gathering saves.)
template <typename T, typename Index, int V, int G>
__global__ void __launch_bounds__(kWarpBlockThreads) csr_spmm_kernel(const SpmmArgs<T, Index> a) {
  using acc_t = opmath_t<T>;
  using Vec = AlignedVector<T, V>;
  constexpr int kGroups = kWarpSize / G;
  constexpr int kBatch = kGroups > 1 ? 2 : 4;  // nonzeros per group gathered before accumulating
  constexpr int kStep = kGroups * kBatch;      // nonzeros the warp consumes per step
  static_assert(kStep <= kWarpSize, "a step must fit the 32-entry window");
  const int lane = threadIdx.x % kWarpSize;
  const int group = lane / G;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (unit >= a.units) return;  // whole warps only: every later shuffle has all 32 lanes

  const int64_t d0 = unit * a.per_unit;
  const int64_t d1 = ::min(d0 + a.per_unit, a.M + a.nnz);
  MergeCoord start, end;
  merge_path_search(a.crow, a.M, a.nnz, d0, d1, start, end);
  const bool has_carry = end.row < a.M && end.row >= start.row;
  if (blockIdx.y == 0 && lane == 0) a.carry_row[unit] = has_carry ? end.row : -1;

  for (int64_t tile = blockIdx.y; tile < a.column_tiles; tile += gridDim.y) {
    const int64_t cj = (tile * G + lane % G) * V;  // this lane's first column
    const bool cok = cj < a.N;                      // N % V == 0 whenever V > 1
    acc_t acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = acc_t(0);

    int64_t j = start.nz;               // next nonzero to consume
    int64_t wbase = j - kWarpSize;      // nonzero window [wbase, wbase + 32): empty so far
    Index wcol = -1;                    // this lane's window entry
    acc_t wval = acc_t(0);
    int64_t rbase = start.row - kWarpSize;  // row-end window: lane l holds crow[rbase + 1 + l]
    Index wrow_end = 0;
    for (int64_t r = start.row; r <= end.row && r < a.M; ++r) {
      int64_t re = end.nz;  // the unit's last row stops at the unit's end
      if (r < end.row) {    // earlier rows end at crow[r + 1] (read 32 rows at a time, not one load per row)
        if (r >= rbase + kWarpSize) {
          rbase = r;
          wrow_end = r + 1 + lane <= a.M ? a.crow[r + 1 + lane] : Index(0);
        }
        re = row_end_in_unit(__shfl_sync(kFullWarpMask, wrow_end, static_cast<int>(r - rbase)), j, end, a.nnz);
      }
      while (j < re) {
        if (j >= wbase + kWarpSize) {
          wbase = j;
          const int64_t p = j + lane;
          wcol = p < end.nz ? a.col[p] : Index(-1);
          wval = p < end.nz ? static_cast<acc_t>(a.val[p]) : acc_t(0);
        }
        const int kb = static_cast<int>(j - wbase);
        const int ke = static_cast<int>(::min(re - wbase, int64_t{kWarpSize}));
        for (int k = kb; k < ke; k += kStep) {
          acc_t w[kBatch];
          Vec x[kBatch];
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            const int kk = k + u * kGroups + group;
            const Index c = __shfl_sync(kFullWarpMask, wcol, kk & (kWarpSize - 1));
            const acc_t v = __shfl_sync(kFullWarpMask, wval, kk & (kWarpSize - 1));
            const bool ok = kk < ke && c >= 0 && static_cast<int64_t>(c) < a.K;  // the same across a group
            w[u] = ok ? v : acc_t(0);
            const T* drow = a.dense + (ok ? static_cast<int64_t>(c) : 0) * a.ld;
            x[u] = ok && cok ? load_vector<T, V>(drow + cj, 0) : zero_vector<T, V>();
          }
#pragma unroll
          for (int u = 0; u < kBatch; ++u)
#pragma unroll
            for (int e = 0; e < V; ++e) acc[e] += w[u] * static_cast<acc_t>(x[u].val[e]);
        }
        j = wbase + ke;
      }
      if (r < end.row) {
        sum_over_groups<G>(acc);
        const bool writer = group == 0;
        if (a.head != nullptr && r == start.row && unit > 0) {
          // Ends here but began in an earlier unit (which carries it): the carry kernel stores the f32 sum.
          acc_t* hrow = a.head + unit * a.N;
#pragma unroll
          for (int e = 0; e < V; ++e) {
            if (writer && cok) hrow[cj + e] = acc[e];
            acc[e] = acc_t(0);
          }
        } else {  // row r ends in this unit
          Vec o;
#pragma unroll
          for (int e = 0; e < V; ++e) {
            o.val[e] = static_cast<T>(acc[e]);
            acc[e] = acc_t(0);
          }
          if (writer && cok) store_vector<T, V>(a.out + r * a.N + cj, 0, o);
        }
      }
    }
    if (has_carry) {
      sum_over_groups<G>(acc);
      acc_t* crow_out = a.carry + unit * a.N;
      if (group == 0 && cok)
#pragma unroll
        for (int e = 0; e < V; ++e) crow_out[cj + e] = acc[e];
    }
  }
}

// Adds the carries of each row that several units share: the first unit u of the run of units carrying
// row r sums the run's carries in unit order and adds the part of the unit ending the row (the next one),
// which that unit stored in out[r] (f32/f64) or left in head (16-bit). A run can be hundreds of units long
// (a row of 10^4 nonzeros in units of ~200 items), so a block of kCarryThreads takes it: kCarryGroups
// groups of kCarryWidth columns each sum every kCarryGroups-th carry, then one group adds the partial sums
// in group order (a fixed order: deterministic). blockIdx.y steps over chunks of kCarryWidth columns.
constexpr int kCarryThreads = 256;
constexpr int kCarryWidth = 64;
constexpr int kCarryGroups = kCarryThreads / kCarryWidth;

template <typename T, typename Index>
__global__ void __launch_bounds__(kCarryThreads) csr_spmm_carry_kernel(const SpmmArgs<T, Index> a) {
  using acc_t = opmath_t<T>;
  __shared__ acc_t partial[kCarryThreads];
  const int g = threadIdx.x / kCarryWidth;
  const int t = threadIdx.x % kCarryWidth;
  for (int64_t u = blockIdx.x; u < a.units; u += gridDim.x) {
    const int64_t r = a.carry_row[u];
    if (r < 0 || r >= a.M || (u > 0 && a.carry_row[u - 1] == r)) continue;  // the same for the whole block
    // Unit v carries row r while the row's end item (diagonal crow[r + 1] + r) lies beyond v's last item,
    // so the run ends at the unit before the one holding that item. (Clamped: with malformed indices the
    // result is unspecified, but every access stays in bounds.)
    const int64_t end_item = clamped_offset(a.crow, r + 1, a.nnz) + r;
    const int64_t last = ::min(::max(end_item / a.per_unit - 1, u), a.units - 1);
    for (int64_t col0 = int64_t{blockIdx.y} * kCarryWidth; col0 < a.N; col0 += int64_t{gridDim.y} * kCarryWidth) {
      const int64_t col = col0 + t;
      acc_t s = acc_t(0);
      if (col < a.N) {
#pragma unroll 4
        for (int64_t v = u + g; v <= last; v += kCarryGroups) s += a.carry[v * a.N + col];
      }
      partial[threadIdx.x] = s;
      __syncthreads();
      if (g == 0 && col < a.N) {
        acc_t total = acc_t(0);
#pragma unroll
        for (int h = 0; h < kCarryGroups; ++h) total += partial[h * kCarryWidth + t];
        const acc_t tail = a.head != nullptr && last + 1 < a.units ? a.head[(last + 1) * a.N + col]
                                                                   : static_cast<acc_t>(a.out[r * a.N + col]);
        a.out[r * a.N + col] = static_cast<T>(tail + total);
      }
      __syncthreads();
    }
  }
}

template <typename T, typename Index, int V, int G>
void launch_config(SpmmArgs<T, Index> a, const at::Tensor& like, cudaStream_t stream) {
  constexpr auto kKernel = csr_spmm_kernel<T, Index, V, G>;
  const auto part =
      merge_partition(a.M, a.nnz, a.column_tiles, resident_warps<kKernel, kWarpBlockThreads>(like.get_device()));
  a.per_unit = part.per_unit;
  a.units = part.units;
  constexpr auto kAccType = c10::CppTypeToScalarType<opmath_t<T>>::value;
  at::Tensor carry = empty_dense_cuda({a.units * a.N}, kAccType, like.device());
  at::Tensor carry_row = empty_dense_cuda({a.units}, at::kLong, like.device());
  a.carry = carry.mutable_data_ptr<opmath_t<T>>();
  a.carry_row = carry_row.mutable_data_ptr<int64_t>();
  at::Tensor head;
  a.head = nullptr;
  if constexpr (!std::is_same_v<T, opmath_t<T>>) {
    head = empty_dense_cuda({a.units * a.N}, kAccType, like.device());
    a.head = head.mutable_data_ptr<opmath_t<T>>();
  }
  const dim3 grid(blocks_to_cover(a.units, kWarpsPerBlock),
                  static_cast<unsigned int>(std::min<int64_t>(a.column_tiles, kMaxGridYZ)));
  kKernel<<<grid, kWarpBlockThreads, 0, stream>>>(a);
  TORCHOPS_CUDA_LAUNCH_CHECK();
  const dim3 carry_grid(blocks_to_cover(a.units, 1), std::min(blocks_to_cover(a.N, kCarryWidth), kMaxGridYZ));
  csr_spmm_carry_kernel<T, Index><<<carry_grid, kCarryThreads, 0, stream>>>(a);
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

// The instantiated (V, G): V elements per access (16 bytes when N, the row stride and the base pointer allow
// it); with 16-byte vectors the smallest group of G >= 4 lanes that spans N, at most a warp; narrower vectors
// (odd N, misaligned views) take whole warps. Wider N runs more column tiles (grid.y) rather than several
// vectors per lane: fewer registers (more warps in flight), and each tile's units gather only the tile's
// slice of `dense`, more of which stays in L2 while they run. Long rows (kLongRows nonzeros on average) take
// narrower tiles while a tile's slice (K rows of G 16-byte vectors) is over kL2Share of the L2: each tile
// then re-reads the indices and pays the per-row work again, which rows that long amortize (shorter rows,
// as in a uniform graph, lose more than they gain).
constexpr int64_t kLongRows = 128;
constexpr double kL2Share = 0.7;

template <typename T, typename Index>
void launch_spmm(SpmmArgs<T, Index> a, int v, const at::Tensor& like, cudaStream_t stream) {
  constexpr int kMaxV = vector_size<T>();
  int g = kWarpSize;
  if (v == kMaxV) {
    const int64_t vectors = (a.N + v - 1) / v;  // per row
    g = 4;
    while (g < kWarpSize && g < vectors) g *= 2;
    if (a.nnz >= kLongRows * a.M) {
      const double l2 = device_attribute(cudaDevAttrL2CacheSize, like.get_device());
      while (g > 4 && static_cast<double>(a.K) * g * kVectorBytes > kL2Share * l2) g /= 2;
    }
  }
  a.column_tiles = (a.N + int64_t{g} * v - 1) / (int64_t{g} * v);
  with_vector_size<T>(v, [&](auto vector) {
    constexpr int V = decltype(vector)::value;
    if constexpr (V == kMaxV) {
      if (g == 4) {
        launch_config<T, Index, V, 4>(a, like, stream);
      } else if (g == 8) {
        launch_config<T, Index, V, 8>(a, like, stream);
      } else if (g == 16) {
        launch_config<T, Index, V, 16>(a, like, stream);
      } else {
        launch_config<T, Index, V, kWarpSize>(a, like, stream);
      }
    } else {
      launch_config<T, Index, V, kWarpSize>(a, like, stream);
    }
  });
}

// csr.h's CsrSpmmKernels on CUDA.
struct CudaBackend {
  // out (M x N) for arguments that passed check_csr_spmm_args; never reads the indices on the host.
  static at::Tensor spmm(const char* /*op*/, const at::Tensor& crow_in, const at::Tensor& col_in,
                         const at::Tensor& values_in, const at::Tensor& dense_in) {
    const c10::cuda::CUDAGuard device_guard(values_in.device());
    const int64_t M = crow_in.numel() - 1, K = dense_in.size(0), N = dense_in.size(1);
    at::Tensor out = empty_dense_cuda({M, N}, values_in.scalar_type(), values_in.device());
    if (out.numel() == 0) return out;
    const at::Tensor crow = crow_in.contiguous(), col = col_in.contiguous(), values = values_in.contiguous();
    const at::Tensor dense = with_unit_column_stride(dense_in);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    TORCHOPS_DISPATCH_INDEX_TYPES(crow.scalar_type(), "csr_spmm_cuda", [&] {
      TORCHOPS_DISPATCH_FLOAT_TYPES(values.scalar_type(), "csr_spmm_cuda", [&] {
        SpmmArgs<scalar_t, index_t> a{};
        a.set_matrix(crow, col, K, N);
        a.val = values.const_data_ptr<scalar_t>();
        a.dense = dense.const_data_ptr<scalar_t>();
        a.ld = row_stride(dense);
        a.out = out.mutable_data_ptr<scalar_t>();
        launch_spmm(a, widest_vector_size<scalar_t>(N, a.ld, a.dense), out, stream);
      });
    });
    return out;
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  CsrSpmmKernels<CudaBackend>::register_kernels(m);
}

}  // namespace torchops
