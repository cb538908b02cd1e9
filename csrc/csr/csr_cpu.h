// The CPU backend of the sparse ops (csr.h's CsrKernels): its engines are defined in cpu/csr_spmm.cpp (spmm,
// its max/min backward, transpose), cpu/csr_sddmm.cpp and cpu/csr_softmax.cpp; registered in csr_spmm.cpp.
// Every engine validates the CSR structure it reads first (check_csr_structure_cpu), so its loops never index
// out of bounds. Rows are split into chunks of about equal cost for at::parallel_for (parallel_over_rows), so a
// few very long rows don't leave one core with all the work.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "csr.h"

namespace torchops {

using CpuCsrBackend = CsrBackend<c10::DeviceType::CPU>;

namespace cpu {

constexpr int64_t kCostPerChunk = 1 << 16;  // multiply-adds (or element visits) per parallel task

// Calls f(row_begin, row_end) in parallel over chunks of rows of about equal cost, cost(row) = (nnz of the
// row + 1) * width. Chunk boundaries come from a binary search on crow[i] + i, which is increasing (the
// structure has been validated).
template <typename Index, typename F>
void parallel_over_rows(const Index* crow, int64_t M, int64_t width, F&& f) {
  if (M == 0) return;
  const int64_t items = static_cast<int64_t>(crow[M]) + M;
  const int64_t chunks =
      std::clamp<int64_t>(items * std::max<int64_t>(width, 1) / kCostPerChunk, 1, std::min<int64_t>(M, 1 << 16));
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

}  // namespace cpu
}  // namespace torchops
