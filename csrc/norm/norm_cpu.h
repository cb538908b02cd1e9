// The CPU row engine of the normalisations over the last dimension (their row math: csrc/cpu/norm.cpp):
//   - row sums whose rounding error does not grow with the row length: working-precision vector
//     accumulators over blocks of kSumBlock elements, each block's total added into f64 (a plain running f32
//     sum over 2^22 elements loses about 7 bits); several sums of one sweep side by side;
//   - the row drivers: rows split across cores in grains of about kGrainElems elements, and the backward's
//     column sums (dweight, dbias) over a fixed split of the rows into chunks, whatever the thread count:
//     each chunk adds kStageRows rows at a time in the working precision, then into its f64 partial row, and
//     the chunks' partials are summed in chunk order, so the error stays near one rounding however many rows;
//   - the exact statistics of a row whose working-precision sums overflow although its values are finite.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../core/cpu_avx2.h"
#include "../core/dispatch.h"

namespace torchops {
namespace norm_cpu {

constexpr int64_t kGrainElems = 32768;        // elements per task: large enough to amortise thread hand-off
constexpr int64_t kChunkElems = 4 * kGrainElems;  // a column-sum chunk's elements at least (each has a partial row)
constexpr int64_t kMaxChunks = 64;            // column partial rows at most
constexpr int64_t kPartialBytes = 8 << 20;    // ... and at most this much f64 scratch per column sum
constexpr int64_t kStageRows = 16;            // rows added in the working precision before going to f64
constexpr int64_t kSumBlock = 512;            // elements summed in the working precision before going to f64

#ifdef TORCHOPS_HAS_AVX2_PATH
// K sums of one sweep, 8 f32 lanes each.
template <int K>
struct Sums8 {
  __m256 v[K];
};

// The K sums over a row of terms(j) (Sums8<K>: the terms of elements j..j+7) and terms.template at<float>(j)
// (std::array<float, K>: one element's, for the tail), blockwise as described above. `terms` may have side
// effects (e.g. store a residual): each j is visited once, in order.
template <int K, typename Terms>
TORCHOPS_TARGET_AVX2 inline std::array<double, K> blocked_sums_avx2(const Terms& terms, int64_t n) {
  __m256d total[K][2];
  std::array<double, K> tail{};
  for (int k = 0; k < K; ++k) total[k][0] = total[k][1] = _mm256_setzero_pd();
  for (int64_t b = 0; b < n; b += kSumBlock) {
    const int64_t end = std::min(n, b + kSumBlock);
    __m256 acc[4][K];
    for (int u = 0; u < 4; ++u) {
      for (int k = 0; k < K; ++k) acc[u][k] = _mm256_setzero_ps();
    }
    int64_t j = b;
    for (; j + 32 <= end; j += 32) {
      for (int u = 0; u < 4; ++u) {
        const Sums8<K> t = terms(j + 8 * u);
        for (int k = 0; k < K; ++k) acc[u][k] = _mm256_add_ps(acc[u][k], t.v[k]);
      }
    }
    for (; j + 8 <= end; j += 8) {
      const Sums8<K> t = terms(j);
      for (int k = 0; k < K; ++k) acc[0][k] = _mm256_add_ps(acc[0][k], t.v[k]);
    }
    for (int k = 0; k < K; ++k) {
      const __m256 block = _mm256_add_ps(_mm256_add_ps(acc[0][k], acc[1][k]), _mm256_add_ps(acc[2][k], acc[3][k]));
      total[k][0] = _mm256_add_pd(total[k][0], _mm256_cvtps_pd(_mm256_castps256_ps128(block)));
      total[k][1] = _mm256_add_pd(total[k][1], _mm256_cvtps_pd(_mm256_extractf128_ps(block, 1)));
    }
    for (; j < end; ++j) {
      const std::array<float, K> t = terms.template at<float>(j);
      for (int k = 0; k < K; ++k) tail[k] += static_cast<double>(t[k]);
    }
  }
  std::array<double, K> sums;
  for (int k = 0; k < K; ++k) {
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, _mm256_add_pd(total[k][0], total[k][1]));
    sums[k] = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]) + tail[k];
  }
  return sums;
}

// A processor with AVX512-BF16 rounds 16 f32 lanes to bf16 in one instruction (round to nearest even, NaN
// kept NaN; subnormal results flush to zero), where the AVX2 form takes about ten.
#define TORCHOPS_TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

inline bool cpu_has_avx512bf16() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return has;
}

// dst[0..n) = src rounded to bf16. Only called after cpu_has_avx512bf16().
TORCHOPS_TARGET_AVX512BF16 inline void store_bf16(const float* src, c10::BFloat16* dst, int64_t n) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + j)));
  }
  if (j < n) {
    const auto mask = static_cast<__mmask16>((1u << (n - j)) - 1);
    _mm256_mask_storeu_epi16(dst + j, mask, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, src + j)));
  }
}

constexpr int64_t kOutBlock = 1024;  // f32 results staged on the stack before store_bf16

// Writes a bf16 row y of n elements through f32 blocks: fn(buf, j0, len) computes elements [j0, j0 + len)
// into buf, then store_bf16 rounds them into y.
template <typename Fn>
inline void by_bf16_blocks(c10::BFloat16* y, int64_t n, Fn&& fn) {
  float buf[kOutBlock];
  for (int64_t j0 = 0; j0 < n; j0 += kOutBlock) {
    const int64_t len = std::min(kOutBlock, n - j0);
    fn(buf, j0, len);
    store_bf16(buf, y + j0, len);
  }
}
#endif

// Portable form, in the working precision A (float or double): terms.template at<V>(j) gives the K terms
// of elements j.. as std::array<V, K>, V = at::vec::Vectorized<A> (when kVec) or A (one element).
template <typename A, int K, bool kVec, typename Terms>
inline std::array<double, K> blocked_sums_portable(const Terms& terms, int64_t n) {
  using Vec = at::vec::Vectorized<A>;
  std::array<double, K> sums{};
  for (int64_t b = 0; b < n; b += kSumBlock) {
    const int64_t end = std::min(n, b + kSumBlock);
    std::array<A, K> block{};
    int64_t j = b;
    if constexpr (kVec) {
      std::array<Vec, K> acc;
      acc.fill(Vec(A(0)));
      for (; j + Vec::size() <= end; j += Vec::size()) {
        const std::array<Vec, K> t = terms.template at<Vec>(j);
        for (int k = 0; k < K; ++k) acc[k] = acc[k] + t[k];
      }
      for (int k = 0; k < K; ++k) {
        A lanes[Vec::size()];
        acc[k].store(lanes);
        for (A lane : lanes) block[k] += lane;
      }
    }
    for (; j < end; ++j) {
      const std::array<A, K> t = terms.template at<A>(j);
      for (int k = 0; k < K; ++k) block[k] += t[k];
    }
    for (int k = 0; k < K; ++k) sums[k] += static_cast<double>(block[k]);
  }
  return sums;
}

// Runs fn(row) for every row in [0, rows), rows of n elements, split across cores.
template <typename Fn>
inline void for_each_row(int64_t rows, int64_t n, Fn&& fn) {
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrainElems / std::max<int64_t>(n, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t row = begin; row < end; ++row) fn(row);
                   });
}

// Runs fn(row, stage) for every row, `stage` being a `width`-element row of A (null when width is 0: the
// row's column sums side by side, n each) that fn adds the row's column terms into; then store(j, total_j)
// for each column j < width, total_j the sum of column j's terms over all rows. The same bits whatever the
// thread count and whichever of the sums are wanted (the chunks depend on rows and n alone).
template <typename A, typename Fn, typename Store>
inline void for_each_row_with_column_sums(int64_t rows, int64_t n, int64_t width, Fn&& fn, Store&& store) {
  if (rows == 0) {
    for (int64_t j = 0; j < width; ++j) store(j, 0.0);
    return;
  }
  const int64_t min_rows = std::max<int64_t>(1, kChunkElems / n);
  const int64_t max_chunks = std::max<int64_t>(1, kPartialBytes / static_cast<int64_t>(sizeof(double) * n));
  const int64_t want = std::min({kMaxChunks, max_chunks, (rows + min_rows - 1) / min_rows});
  const int64_t rows_per_chunk = (rows + want - 1) / want;
  const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  std::vector<double> partial(chunks * width, 0.0);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> stage(width, A(0));
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      double* part = partial.data() + chunk * width;
      const int64_t first = chunk * rows_per_chunk, last = std::min(rows, first + rows_per_chunk);
      for (int64_t row = first; row < last; ++row) {
        fn(row, width > 0 ? stage.data() : nullptr);
        if ((row - first + 1) % kStageRows == 0 || row + 1 == last) {
          for (int64_t j = 0; j < width; ++j) {
            part[j] += static_cast<double>(stage[j]);
            stage[j] = A(0);
          }
        }
      }
    }
  });
  if (width == 0) return;
  at::parallel_for(0, width, kGrainElems / 8, [&](int64_t begin, int64_t end) {
    std::vector<double> sum(partial.begin() + begin, partial.begin() + end);
    for (int64_t chunk = 1; chunk < chunks; ++chunk) {
      const double* p = partial.data() + chunk * width;
      for (int64_t j = begin; j < end; ++j) sum[j - begin] += p[j];
    }
    for (int64_t j = begin; j < end; ++j) store(j, sum[j - begin]);
  });
}

// A row's statistics in f64: mean (0 unless centred) and rstd = 1 / sqrt(var + eps), var the biased
// variance (centred) or the mean square.
struct ExactStats {
  double mean = 0.0, rstd = 0.0;
};

// For a row h whose working-precision statistics overflowed: when every value is finite, computes the
// statistics in f64 over the row scaled by 2^-e (e the exponent of its largest magnitude: exact, and
// nothing overflows, f64 input included), writes y = (h - mean) * rstd * w + b from them and returns true.
// (h - mean) * rstd is rounded to the working precision A first, as the fast path forms it. With an inf or
// NaN in the row it writes nothing and returns false (they propagate as the working precision gives them).
// w and b may be null.
template <typename A, typename T>
bool exact_row(const T* h, int64_t n, bool centre, double eps, const A* w, const A* b, T* y, ExactStats& stats) {
  double largest = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const double v = static_cast<double>(h[j]);
    if (!std::isfinite(v)) return false;
    largest = std::max(largest, std::abs(v));
  }
  if (largest == 0.0) return false;
  const int e = std::ilogb(largest);
  const double scale = std::ldexp(1.0, -e);
  double mean = 0.0;
  if (centre) {  // shifted by the first value: exactly that value for a row of equal ones
    const double first = static_cast<double>(h[0]) * scale;
    for (int64_t j = 0; j < n; ++j) mean += static_cast<double>(h[j]) * scale - first;
    mean = first + mean / static_cast<double>(n);
  }
  double var = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const double d = static_cast<double>(h[j]) * scale - mean;
    var += d * d;
  }
  var /= static_cast<double>(n);
  // The rstd of the scaled row. eps * scale^2 may underflow; it only counts where every deviation is 0,
  // and there (h - mean) * rstd = 0 * (1 / sqrt(eps)).
  const double denom = var + eps * scale * scale;
  const double inv = denom > 0.0 ? 1.0 / std::sqrt(denom) : 0.0;
  const double rstd = denom > 0.0 ? inv * scale : 1.0 / std::sqrt(eps);
  for (int64_t j = 0; j < n; ++j) {
    const double xhat = denom > 0.0 ? (static_cast<double>(h[j]) * scale - mean) * inv : 0.0 * rstd;
    double v = static_cast<double>(static_cast<A>(xhat));
    if (w != nullptr) v *= static_cast<double>(w[j]);
    if (b != nullptr) v += static_cast<double>(b[j]);
    y[j] = static_cast<T>(v);
  }
  stats.mean = std::ldexp(mean, e);
  stats.rstd = rstd;
  return true;
}

}  // namespace norm_cpu
}  // namespace torchops
