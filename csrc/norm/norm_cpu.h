// The CPU row engine shared by the normalisations over the last dimension (rms_norm and add_rms_norm
// today; a LayerNorm or QK-norm is one more file of row math on top of it):
//   - row sums whose rounding error does not grow with the row length: f32 (or f64) vector accumulators
//     over blocks of kSumBlock elements, each block's total added into f64. The error is that of one
//     block however long the row (a plain running f32 sum over N = 2^22 elements lost ~7 bits);
//   - the row drivers: rows split across cores in grains of about kGrainElems elements, and the backward's
//     deterministic column partials (a fixed split of the rows into chunks, independent of the thread
//     count, one partial row each, summed in chunk order).
// The row math (what a row's statistics are and how they are applied) stays in the op's file.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../core/cpu_avx2.h"
#include "../core/dispatch.h"

namespace torchops {
namespace norm_cpu {

constexpr int64_t kGrainElems = 32768;  // elements per task: large enough to amortise thread hand-off
constexpr int64_t kMaxChunks = 64;      // column partial rows at most (bounds the scratch memory)
constexpr int64_t kSumBlock = 512;      // elements summed in the working precision before going to f64

// Calls fn(begin, end) over [0, n) in blocks of kSumBlock (the last one shorter).
template <typename Fn>
inline void for_each_block(int64_t n, Fn&& fn) {
  for (int64_t b = 0; b < n; b += kSumBlock) fn(b, std::min(n, b + kSumBlock));
}

#ifdef TORCHOPS_HAS_AVX2_PATH
// Sum over a row of terms(j) (8 f32 terms for elements j..j+7) and terms.scalar(j) (one, for a tail),
// blockwise as described above. `terms` may have side effects (e.g. store a residual): each j is visited
// once, in order.
template <typename Terms>
TORCHOPS_TARGET_AVX2 inline double blocked_sum_avx2(Terms& terms, int64_t n) {
  __m256d total0 = _mm256_setzero_pd(), total1 = _mm256_setzero_pd();
  double tail = 0.0;
  for (int64_t b = 0; b < n; b += kSumBlock) {
    const int64_t end = std::min(n, b + kSumBlock);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
           acc3 = _mm256_setzero_ps();
    int64_t j = b;
    for (; j + 32 <= end; j += 32) {
      acc0 = _mm256_add_ps(acc0, terms(j));
      acc1 = _mm256_add_ps(acc1, terms(j + 8));
      acc2 = _mm256_add_ps(acc2, terms(j + 16));
      acc3 = _mm256_add_ps(acc3, terms(j + 24));
    }
    for (; j + 8 <= end; j += 8) acc0 = _mm256_add_ps(acc0, terms(j));
    const __m256 block = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
    total0 = _mm256_add_pd(total0, _mm256_cvtps_pd(_mm256_castps256_ps128(block)));
    total1 = _mm256_add_pd(total1, _mm256_cvtps_pd(_mm256_extractf128_ps(block, 1)));
    for (; j < end; ++j) tail += static_cast<double>(terms.scalar(j));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(total0, total1));
  return (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]) + tail;
}
#endif

// Portable form: terms.vec(j) (a Vectorized<A> of terms for elements j..j+size-1) when kVec, terms.scalar(j)
// otherwise and for tails. A is the working precision (float or double).
template <typename A, bool kVec, typename Terms>
inline double blocked_sum_portable(Terms& terms, int64_t n) {
  using Vec = at::vec::Vectorized<A>;
  double total = 0.0;
  for_each_block(n, [&](int64_t b, int64_t end) {
    int64_t j = b;
    A block = 0;
    if constexpr (kVec) {
      Vec acc(A(0));
      for (; j + Vec::size() <= end; j += Vec::size()) acc = acc + terms.vec(j);
      A lanes[Vec::size()];
      acc.store(lanes);
      for (A lane : lanes) block += lane;
    }
    for (; j < end; ++j) block += terms.scalar(j);
    total += static_cast<double>(block);
  });
  return total;
}

// Runs fn(row) for every row in [0, rows), rows of n elements, split across cores.
template <typename Fn>
inline void for_each_row(int64_t rows, int64_t n, Fn&& fn) {
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrainElems / std::max<int64_t>(n, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t row = begin; row < end; ++row) fn(row);
                   });
}

// Runs fn(row, partial) for every row, `partial` being the n-element A row of the row's chunk (null when
// !want_partials), then store(j, total_j) for each column j with the chunks' partials summed in chunk order:
// the same bits whatever the thread count.
template <typename A, typename Fn, typename Store>
inline void for_each_row_with_column_sums(int64_t rows, int64_t n, bool want_partials, Fn&& fn, Store&& store) {
  if (rows == 0) {
    if (want_partials) {
      for (int64_t j = 0; j < n; ++j) store(j, A(0));
    }
    return;
  }
  const int64_t min_rows = std::max<int64_t>(1, kGrainElems / n);
  const int64_t want = std::min(kMaxChunks, (rows + min_rows - 1) / min_rows);
  const int64_t rows_per_chunk = (rows + want - 1) / want;
  const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  std::vector<A> partial(want_partials ? chunks * n : 0, A(0));
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      A* acc = want_partials ? partial.data() + chunk * n : nullptr;
      const int64_t last = std::min(rows, (chunk + 1) * rows_per_chunk);
      for (int64_t row = chunk * rows_per_chunk; row < last; ++row) fn(row, acc);
    }
  });
  if (!want_partials) return;
  at::parallel_for(0, n, kGrainElems / 8, [&](int64_t begin, int64_t end) {
    std::vector<A> sum(partial.begin() + begin, partial.begin() + end);
    for (int64_t chunk = 1; chunk < chunks; ++chunk) {
      const A* p = partial.data() + chunk * n;
      for (int64_t j = begin; j < end; ++j) sum[j - begin] += p[j];
    }
    for (int64_t j = begin; j < end; ++j) store(j, sum[j - begin]);
  });
}

}  // namespace norm_cpu
}  // namespace torchops
