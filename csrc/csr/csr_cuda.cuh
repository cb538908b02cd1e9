// CUDA pieces shared by the sparse kernels: the backend's declaration (csr.h's CsrKernels on CUDA), the
// merge-path partition of a CSR matrix into equal-sized units of work, the kernel that completes the rows
// several units share (merge_carry_kernel), and the per-lane column layout.
//
// Merge path (Merrill & Garland, "Merge-based parallel sparse matrix-vector multiplication", SC'16): the
// M row ends and the nnz nonzeros form M + nnz "items"; unit u takes items [u D, (u + 1) D). A binary
// search on crow_indices gives each unit its start coordinate (rows ended, nonzeros consumed) without any
// preprocessing pass or host synchronisation, so a row of 10^5 nonzeros is shared by many warps and a run
// of empty rows costs what its length says. The searches and every loop are bounded by the item counts
// and every crow value is clamped to [0, nnz] before use, so malformed indices (never validated on the GPU)
// cannot make a kernel read or write out of bounds or run forever; the result is then unspecified.
#pragma once

#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <tuple>

#include <c10/cuda/CUDAException.h>

#include "../core/cuda_utils.cuh"
#include "csr.h"

namespace torchops {

// The CUDA backend of the sparse ops: spmm and its max/min backward in cuda/csr_spmm.cu, sddmm and the
// transpose in cuda/csr_spmm_backward.cu, softmax in cuda/csr_softmax.cu (registered in csr_spmm.cu). No
// engine reads the indices on the host (no synchronisation); each stays in bounds on malformed ones.
using CudaCsrBackend = CsrBackend<c10::DeviceType::CUDA>;

// grad_values[p, h] = sum over d of g[i, h, d] * b[col[p], h, d] where sel[i, h, d] == p: the values gradient of
// a max / min (sel its arg), (nnz, H), in the accumulation dtype (f32 for 16-bit). In csr_spmm_backward.cu, for
// csr_spmm.cu's select_backward.
at::Tensor masked_sddmm_cuda(const SddmmOperands& s, const at::Tensor& sel);

namespace cuda {

// What every merge-path kernel reads of its CSR matrix and partition; a kernel's arguments derive from it.
template <typename Index>
struct MergePathArgs {
  const Index* crow;
  const Index* col;
  int64_t M, K, N, nnz;     // A is M x K with nnz nonzeros; the dense side has N columns
  int64_t per_unit, units;  // the partition (merge_partition)

  // A's contiguous index tensors, and the dense side's K x N shape.
  void set_matrix(const at::Tensor& crow_indices, const at::Tensor& col_indices, int64_t dense_rows,
                  int64_t dense_columns) {
    crow = crow_indices.const_data_ptr<Index>();
    col = col_indices.const_data_ptr<Index>();
    M = crow_indices.numel() - 1;
    nnz = col_indices.numel();
    K = dense_rows;
    N = dense_columns;
  }
};

struct MergeCoord {
  int64_t row;  // rows [0, row) have ended
  int64_t nz;   // nonzeros [0, nz) are consumed; row + nz == the diagonal searched
};

// A crow value as read (unvalidated), clamped to [0, nnz].
__device__ __forceinline__ int64_t clamp_offset(int64_t offset, int64_t nnz) {
  return ::min(::max(offset, int64_t{0}), nnz);
}

template <typename Index>
__device__ __forceinline__ int64_t clamped_offset(const Index* crow, int64_t i, int64_t nnz) {
  return clamp_offset(crow[i], nnz);
}

// Coordinates of diagonals d0 and d1, searched by the whole warp (all 32 lanes must call it; the results are
// the same in every lane). Row r lies before diagonal d's point while crow[r + 1] + r + 1 <= d, so each
// diagonal's point is the first r in [lo, hi) where that fails (hi if none). Lanes 0-15 search d0 and lanes
// 16-31 d1, 16-ary: per round each lane probes the last row of one of 16 equal segments and a ballot picks
// the first segment holding the point, so ~log16(M) dependent loads instead of log2(M), which short units
// feel. Every round shrinks each range, whatever the (unvalidated) crow values, so the loop ends and the
// point stays in [lo, hi].
template <typename Index>
__device__ __forceinline__ void merge_path_search(const Index* crow, int64_t M, int64_t nnz, int64_t d0,
                                                  int64_t d1, MergeCoord& c0, MergeCoord& c1) {
  constexpr int kWays = kWarpSize / 2;
  const int lane = threadIdx.x % kWarpSize;
  const int way = lane % kWays;
  const bool second = lane >= kWays;
  int64_t lo[2] = {::max(d0 - nnz, int64_t{0}), ::max(d1 - nnz, int64_t{0})};
  int64_t hi[2] = {::min(d0, M), ::min(d1, M)};
  while (lo[0] < hi[0] || lo[1] < hi[1]) {  // the same in every lane
    const int64_t my_lo = second ? lo[1] : lo[0], my_hi = second ? hi[1] : hi[0], d = second ? d1 : d0;
    const int64_t step = (my_hi - my_lo + kWays - 1) / kWays;  // segment length
    const int64_t r = my_lo + (way + 1) * step - 1;            // the segment's last row
    bool past = true;  // the point is at or before r (a probe beyond the range counts as past)
    if (r < my_hi) past = clamped_offset(crow, r + 1, nnz) + r + 1 > d;
    const unsigned int ballot = __ballot_sync(kFullWarpMask, past);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (lo[h] >= hi[h]) continue;
      const unsigned int mask = (ballot >> (h * kWays)) & ((1u << kWays) - 1);
      const int64_t seg = (hi[h] - lo[h] + kWays - 1) / kWays;
      if (mask == 0) {  // only when the last probe was the range's last row: the point is hi
        lo[h] = hi[h];
      } else {
        const int first = __ffs(mask) - 1;  // the point is after segment first - 1, at or before segment first's end
        hi[h] = ::min(lo[h] + (first + 1) * seg - 1, hi[h]);
        lo[h] = lo[h] + first * seg;
      }
    }
  }
  c0 = {lo[0], d0 - lo[0]};
  c1 = {lo[1], d1 - lo[1]};
}

// This warp's unit of the merge path (each block's kWarpsPerBlock warps take one unit each) and the unit's start
// and end coordinates; false for a warp past the last unit, which must return at once (as a whole warp: the
// search and every later shuffle need all 32 lanes). Args: crow, M, nnz, units and per_unit (items a unit).
template <typename Args>
__device__ __forceinline__ bool warp_merge_unit(const Args& a, int64_t& unit, MergeCoord& start, MergeCoord& end) {
  unit = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (unit >= a.units) return false;
  const int64_t d0 = unit * a.per_unit;
  merge_path_search(a.crow, a.M, a.nnz, d0, ::min(d0 + a.per_unit, a.M + a.nnz), start, end);
  return true;
}

// The end (exclusive) of the nonzeros of a row that ends inside a unit ending at `end`, given the row's
// crow[r + 1] (as read: unvalidated): clamped to [0, nnz], never before the cursor `j`, never past the unit.
__device__ __forceinline__ int64_t row_end_in_unit(int64_t crow_next, int64_t j, MergeCoord end, int64_t nnz) {
  return ::min(::max(clamp_offset(crow_next, nnz), j), end.nz);
}

// The end (exclusive) of row r's nonzeros inside a unit that ends at `end`, never before the cursor `j`:
// rows before the unit's last row end at crow[r + 1]; the last row stops at the unit's end.
template <typename Index>
__device__ __forceinline__ int64_t unit_row_end(const Index* crow, int64_t r, int64_t j, MergeCoord end,
                                                int64_t nnz) {
  if (r >= end.row) return end.nz;
  return row_end_in_unit(crow[r + 1], j, end, nnz);
}

// How many items each unit (one warp) takes. Units take about the same time, so a launch lasts whole
// "waves" of as many units as the GPU holds at once (`resident_warps`, from the kernel's occupancy): a last
// wave 40% full costs as much as a full one. First a size for about kWavesPerLaunch waves per column tile,
// at least kMinItems (every unit pays its searches and, short rows or not, a carry row of N values) and at
// most kMaxItems (bounds the carry buffer); then the items are spread evenly over the whole waves they
// fill, at least one, so no launch ends on a nearly empty wave.
struct MergePartition {
  int64_t per_unit;
  int64_t units;
};

inline MergePartition merge_partition(int64_t M, int64_t nnz, int64_t column_tiles, int64_t resident_warps) {
  constexpr int64_t kWavesPerLaunch = 4;
  constexpr int64_t kMinItems = 192, kMaxItems = 8192;
  // Spreading less than one wave of work over a whole wave shrinks units, but not below this: a small
  // matrix is not cut into thousands of near-empty units, each with its searches and an N-wide carry row.
  constexpr int64_t kMinSpreadItems = 64;
  const int64_t items = M + nnz, tiles = std::max<int64_t>(column_tiles, 1);
  const int64_t wave = std::max<int64_t>(resident_warps, 1);  // units of all tiles running at once
  const auto units_of = [items](int64_t per_unit) { return std::max<int64_t>(1, (items + per_unit - 1) / per_unit); };
  const int64_t target_units = std::max<int64_t>(1, wave * kWavesPerLaunch / tiles);
  int64_t per_unit = std::clamp<int64_t>((items + target_units - 1) / target_units, kMinItems, kMaxItems);
  const int64_t waves = std::max<int64_t>(1, units_of(per_unit) * tiles / wave);  // whole ones, rounded down
  const int64_t units = std::max<int64_t>(1, waves * wave / tiles);
  per_unit = std::clamp<int64_t>((items + units - 1) / units, kMinSpreadItems, kMaxItems);
  return {per_unit, units_of(per_unit)};
}

// How many warps of kKernel, launched in blocks of kThreads, the device holds at once (the occupancy is
// cached per kernel and device).
template <auto kKernel, int kThreads>
inline int64_t resident_warps(int device) {
  static std::atomic<int> blocks_cache[kCachedDevices][1] = {};
  const int blocks =
      cached_per_device(blocks_cache, device, 0, [] { return resident_blocks_per_sm(kKernel, kThreads); });
  return int64_t{blocks} * (kThreads / kWarpSize) * device_attribute(cudaDevAttrMultiProcessorCount, device);
}

// Completes the rows that several units share. Unit u carries row r (carry_row[u] = r) when r continues past
// u's last item: the first unit of each run of units carrying r combines the run's partials (Policy::carry, in
// unit order) with the part of the unit that ends the row (the next one), and stores the row
// (Policy::finish). A run can be hundreds of units long (a row of 10^4 nonzeros in units of ~200 items), so
// a block of kCarryThreads takes it: kCarryGroups groups of kCarryWidth columns each combine every
// kCarryGroups-th partial, then one group combines the groups' results in group order (a fixed order:
// deterministic). blockIdx.y steps over chunks of kCarryWidth of the Policy::columns columns.
//
// A Policy holds the buffers and provides
//   using Acc;                        a partial (plain data)
//   static Acc identity(), combine(Acc earlier, Acc later);
//   Acc carry_of(int64_t unit, int64_t column);   the unit's partial
//   void finish(int64_t row, int64_t ending_unit, int64_t column, Acc run)   ending_unit may be `units` when
//                                     malformed indices leave no unit ending the row;
//   int64_t columns.
constexpr int kCarryThreads = 256;
constexpr int kCarryWidth = 64;
constexpr int kCarryGroups = kCarryThreads / kCarryWidth;

template <typename Index, typename Policy>
__global__ void __launch_bounds__(kCarryThreads) merge_carry_kernel(const Index* crow, int64_t M, int64_t nnz,
                                                                    int64_t per_unit, int64_t units,
                                                                    const int64_t* carry_row, Policy policy) {
  using Acc = typename Policy::Acc;
  __shared__ Acc partial[kCarryThreads];
  const int g = threadIdx.x / kCarryWidth;
  const int t = threadIdx.x % kCarryWidth;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const int64_t r = carry_row[u];
    if (r < 0 || r >= M || (u > 0 && carry_row[u - 1] == r)) continue;  // the same for the whole block
    // Unit v carries row r while the row's end item (diagonal crow[r + 1] + r) lies beyond v's last item,
    // so the run ends at the unit before the one holding that item. (Clamped: with malformed indices the
    // result is unspecified, but every access stays in bounds.)
    const int64_t end_item = clamped_offset(crow, r + 1, nnz) + r;
    const int64_t last = ::min(::max(end_item / per_unit - 1, u), units - 1);
    for (int64_t col0 = int64_t{blockIdx.y} * kCarryWidth; col0 < policy.columns;
         col0 += int64_t{gridDim.y} * kCarryWidth) {
      const int64_t col = col0 + t;
      Acc s = Policy::identity();
      if (col < policy.columns) {
        for (int64_t v = u + g; v <= last; v += kCarryGroups) s = Policy::combine(s, policy.carry_of(v, col));
      }
      partial[threadIdx.x] = s;
      __syncthreads();
      if (g == 0 && col < policy.columns) {
        Acc total = Policy::identity();
#pragma unroll
        for (int h = 0; h < kCarryGroups; ++h) total = Policy::combine(total, partial[h * kCarryWidth + t]);
        policy.finish(r, last + 1, col, total);
      }
      __syncthreads();
    }
  }
}

// Launches merge_carry_kernel over a partition's units.
template <typename Index, typename Policy>
void launch_merge_carry(const MergePathArgs<Index>& a, const int64_t* carry_row, const Policy& policy,
                        cudaStream_t stream) {
  if (policy.columns <= 0) return;
  const dim3 grid(blocks_to_cover(a.units, 1), std::min(blocks_to_cover(policy.columns, kCarryWidth), kMaxGridYZ));
  merge_carry_kernel<Index, Policy><<<grid, kCarryThreads, 0, stream>>>(a.crow, a.M, a.nnz, a.per_unit, a.units,
                                                                          carry_row, policy);
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

// The widest vector (elements, up to 16 bytes) that every row of a matrix with N columns, row stride ld and
// base pointer `base` can be read with.
template <typename T>
inline int widest_vector_size(int64_t N, int64_t ld, const void* base) {
  int v = vector_size<T>();
  while (v > 1 && (N % v != 0 || ld % v != 0 || !is_aligned(base, v * static_cast<int>(sizeof(T))))) v /= 2;
  return v;
}

// Elements per lane per access when 32 lanes span a row: the smallest power of two that lets them cover N
// (N <= 32: one element per lane), no wider than the matrix allows.
template <typename T>
inline int lane_vector_size(int64_t N, int64_t ld, const void* base) {
  int v = 1;
  while (v < vector_size<T>() && int64_t{kWarpSize} * v < N) v *= 2;
  return std::min(v, widest_vector_size<T>(N, ld, base));
}

}  // namespace cuda
}  // namespace torchops
