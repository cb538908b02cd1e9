// CUDA pieces shared by the csr_* kernels (cuda/csr_spmm.cu, cuda/csr_spmm_backward.cu): the merge-path
// partition of a CSR matrix into equal-sized units of work, and the per-lane column layout.
//
// Merge path (Merrill & Garland, "Merge-based parallel sparse matrix-vector multiplication", SC'16): the
// M row ends and the nnz nonzeros form M + nnz "items"; unit u takes items [u D, (u + 1) D). A binary
// search on crow_indices gives each unit its start coordinate (rows ended, nonzeros consumed) without any
// preprocessing pass or host synchronisation, so a row of 10^5 nonzeros is shared by many warps and a run
// of empty rows costs what its length says. The searches and every loop are bounded by the item counts
// and every crow value is clamped to [0, nnz] before use, so malformed indices (never validated on the GPU)
// cannot make a kernel read or write out of bounds or run forever; the result is then unspecified.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include <c10/cuda/CUDAException.h>

#include "cuda_utils.cuh"

namespace torchops {
namespace cuda {

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

// Coordinates of diagonals d0 and d1 (two independent searches interleaved, so their loads overlap).
template <typename Index>
__device__ __forceinline__ void merge_path_search(const Index* crow, int64_t M, int64_t nnz, int64_t d0,
                                                  int64_t d1, MergeCoord& c0, MergeCoord& c1) {
  int64_t lo0 = ::max(d0 - nnz, int64_t{0}), hi0 = ::min(d0, M);
  int64_t lo1 = ::max(d1 - nnz, int64_t{0}), hi1 = ::min(d1, M);
  while (lo0 < hi0 || lo1 < hi1) {
    if (lo0 < hi0) {
      const int64_t mid = (lo0 + hi0) >> 1;  // row `mid` ends at crow[mid + 1]; mid < M
      if (clamped_offset(crow, mid + 1, nnz) <= d0 - mid - 1) lo0 = mid + 1; else hi0 = mid;
    }
    if (lo1 < hi1) {
      const int64_t mid = (lo1 + hi1) >> 1;
      if (clamped_offset(crow, mid + 1, nnz) <= d1 - mid - 1) lo1 = mid + 1; else hi1 = mid;
    }
  }
  c0 = {lo0, d0 - lo0};
  c1 = {lo1, d1 - lo1};
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

// How many items each unit (one warp) takes: about kWavesPerLaunch waves of warps per column tile, but at
// least kMinItems (a unit must amortise its two searches) and at most kMaxItems (bounds the carry buffer).
struct MergePartition {
  int64_t per_unit;
  int64_t units;
};

inline MergePartition merge_partition(int64_t M, int64_t nnz, int64_t column_tiles, int device) {
  constexpr int64_t kWarpsPerSm = 64;  // the H200's maximum resident warps per SM
  constexpr int64_t kWavesPerLaunch = 4;
  constexpr int64_t kMinItems = 64, kMaxItems = 8192;
  const int64_t items = M + nnz;
  const int64_t target_units = std::max<int64_t>(
      1, device_attribute(cudaDevAttrMultiProcessorCount, device) * kWarpsPerSm * kWavesPerLaunch / std::max<int64_t>(column_tiles, 1));
  const int64_t per_unit = std::clamp<int64_t>((items + target_units - 1) / target_units, kMinItems, kMaxItems);
  return {per_unit, std::max<int64_t>(1, (items + per_unit - 1) / per_unit)};
}

// The widest vector (elements, up to 16 bytes) that every row of a matrix with N columns, row stride ld and
// base pointer `base` can be read with.
template <typename T>
inline int widest_vector_size(int64_t N, int64_t ld, const void* base) {
  int v = 16 / static_cast<int>(sizeof(T));
  while (v > 1 && (N % v != 0 || ld % v != 0 || reinterpret_cast<uintptr_t>(base) % (v * sizeof(T)) != 0)) v /= 2;
  return v;
}

// Elements per lane per access when 32 lanes span a row: the smallest power of two that lets them cover N
// (N <= 32: one element per lane), no wider than the matrix allows.
template <typename T>
inline int lane_vector_size(int64_t N, int64_t ld, const void* base) {
  int v = 1;
  while (v < 16 / static_cast<int>(sizeof(T)) && int64_t{kWarpSize} * v < N) v *= 2;
  return std::min(v, widest_vector_size<T>(N, ld, base));
}

}  // namespace cuda
}  // namespace torchops
