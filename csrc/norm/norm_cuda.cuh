// The CUDA row engine of the normalisations over the last dimension. It fixes how rows map to threads and
// how a row's statistics are formed; the kernels (cuda/norm_forward.cuh, cuda/norm_backward.cuh) and their
// launch plans (norm_plan.h) are built on it:
//   - accesses in "chunks" of kC elements: a 16-byte vector when every row start is aligned, else one
//     element. Chunk c of a row covers elements [c * kC, c * kC + kC); a row's thread t owns chunks t,
//     t + row_threads, ...;
//   - a row's statistics (RowMath): rms_norm's sum of squares; layer_norm's sums of (x - x0) and (x - x0)^2,
//     shifted by the row's first element x0 so the variance does not cancel; each chunk summed in the working
//     precision, then per thread in f64, then a fixed butterfly over the row's threads (shuffles, shared memory
//     across warps, distributed shared memory across a cluster): every thread of a row gets the same bits;
//   - the backward's row sums per thread in RowSum<T> (f64 for f32/f64 input, so their error does not grow with
//     the row; f32 for 16-bit input, whose outputs round far coarser), reduced the same way;
//   - the backward's deterministic column partials: one partial row per row group, in RowSum<T>, summed in
//     group order by norm_column_reduce_kernel.
#pragma once

#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "../core/cuda_utils.cuh"
#include "../core/dispatch.h"

namespace torchops {
namespace norm_cuda {

using namespace torchops::cuda;

// A tensor's rows, row r starting at data + r * stride (data null: absent).
template <typename T>
struct Rows {
  const T* data;
  int64_t stride;
  __host__ __device__ const T* row(int64_t r) const { return data + r * stride; }
};

// Per-thread row sums and the backward's column partials: see above.
template <typename T>
using RowSum = std::conditional_t<is_16bit_float<T>, float, double>;

// kN sums reduced together (rms_norm's one, layer_norm's two).
template <typename S, int kN>
struct Sums {
  S v[kN];
  __device__ __forceinline__ Sums& operator+=(const Sums& o) {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] += o.v[i];
    return *this;
  }
};

template <typename S, int kN>
__device__ __forceinline__ Sums<S, kN> zero_sums() {
  Sums<S, kN> s;
#pragma unroll
  for (int i = 0; i < kN; ++i) s.v[i] = S(0);
  return s;
}

// The sums over `width` consecutive lanes (a power of two up to 32; the width-lane groups of a warp reduce
// independently), in every lane of the group.
template <typename S, int kN>
__device__ __forceinline__ Sums<S, kN> lanes_sum(Sums<S, kN> s, int width) {
  for (int offset = width / 2; offset > 0; offset >>= 1) {
#pragma unroll
    for (int i = 0; i < kN; ++i) s.v[i] += __shfl_xor_sync(kFullWarpMask, s.v[i], offset);
  }
  return s;
}

// The sums of a row held by `group_warps` whole warps of the block (row `group` on warps [group * group_warps,
// (group + 1) * group_warps)), in each of its threads. Every thread of the block must call it, once a row, with
// one barrier: consecutive calls alternate halves of `scratch` (parity), so a warp writes a half again two rows
// on, past the barrier of the row between, which no warp passes before its reads of the half are done.
template <typename S, int kN>
__device__ __forceinline__ Sums<S, kN> warps_sum(Sums<S, kN> s, S (&scratch)[2][kN][kWarpSize], int parity, int group,
                                                 int group_warps) {
  s = lanes_sum(s, kWarpSize);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kN; ++i) scratch[parity][i][warp] = s.v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kN; ++i) s.v[i] = lane < group_warps ? scratch[parity][i][group * group_warps + lane] : S(0);
  return lanes_sum(s, kWarpSize);
}

// The sums of a row split over the blocks of a cluster, from each block's sums `s` (the same bits in all of its
// threads): published in slots[parity], then added in rank order after a cluster barrier. Every thread of the
// cluster must call it; parity alternates by row as in warps_sum. (A block must not exit while a peer may still
// read its slots: one more cluster_barrier() after its last row.)
template <typename S, int kN>
__device__ __forceinline__ Sums<S, kN> cluster_sum(const Sums<S, kN>& s, Sums<S, kN> (&slots)[2], int parity,
                                                   int cluster) {
  if (threadIdx.x == 0) slots[parity] = s;
  cluster_barrier();
  Sums<S, kN> total = zero_sums<S, kN>();
  for (int q = 0; q < cluster; ++q) total += *cluster_peer(&slots[parity], q);
  return total;
}

// Hides a kept chunk's value from the optimizer between a row's sweeps: otherwise it keeps the first sweep's f32
// conversions of 16-bit values live until the second (twice the registers of the packed values) and spills.
template <typename T, int kC>
__device__ __forceinline__ void keep_packed(AlignedVector<T, kC>& v) {
  if constexpr (sizeof(v) % 4 == 0 && !std::is_same_v<T, double>) {
    auto* words = reinterpret_cast<unsigned int*>(&v);
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(v) / 4); ++i) asm volatile("" : "+r"(words[i]));
  }
}

// 16-byte accesses with L2 (and L1) priorities, or plain ones (element accesses, or kHinted false).
template <typename T, int kC, L1Use kL1 = L1Use::kNormal>
__device__ __forceinline__ AlignedVector<T, kC> read_chunk(const T* base, int64_t c, uint64_t policy, bool hinted) {
  if constexpr (sizeof(T) * kC == kVectorBytes) {
    if (hinted) return load_vector_l2<T, kC, kL1>(base, c, policy);
  }
  return load_vector<T, kC>(base, c);
}

template <typename T, int kC>
__device__ __forceinline__ void write_chunk(T* base, int64_t c, const AlignedVector<T, kC>& v, uint64_t policy,
                                            bool hinted) {
  if constexpr (sizeof(T) * kC == kVectorBytes) {
    if (hinted) return store_vector_l2(base, c, v, policy);
  }
  store_vector<T, kC>(base, c, v);
}

// ------------------------------------------------------------------------------------------------ row math
// What a norm computes of its rows. kLayer: layer_norm (centred, with a bias), else rms_norm. A row's statistics
// are Sums of kStats values per thread, in f64: each chunk is summed in the working precision, then added in f64,
// so a row's sums neither lose precision with its length nor overflow where its values do not (a chunk whose
// working sum overflows is summed again in f64). `shift` is layer_norm's x0 (0 for rms_norm).
template <bool kLayer, typename T>
struct RowMath {
  using A = opmath_t<T>;
  static constexpr int kStats = kLayer ? 2 : 1;
  using Stats = Sums<double, kStats>;

  using Local = Sums<A, kStats>;  // a thread's sums over a few chunks, in the working precision

  template <int kC>
  __device__ static __forceinline__ void accumulate(Local& s, const AlignedVector<T, kC>& v, A shift) {
#pragma unroll
    for (int e = 0; e < kC; ++e) {
      const A d = static_cast<A>(v.val[e]) - shift;
      if constexpr (kLayer) s.v[0] += d;
      s.v[kStats - 1] += d * d;
    }
  }

  template <int kC>
  __device__ static __forceinline__ void accumulate_f64(Stats& s, const AlignedVector<T, kC>& v, A shift) {
#pragma unroll
    for (int e = 0; e < kC; ++e) {
      const double d = static_cast<double>(static_cast<A>(v.val[e])) - static_cast<double>(shift);
      if constexpr (kLayer) s.v[0] += d;
      s.v[kStats - 1] += d * d;
    }
  }

  // s += local in f64; where local overflowed the working precision (not f64), redo(s) adds the same values in
  // f64 instead (rare).
  template <typename Redo>
  __device__ static __forceinline__ void add(Stats& s, const Local& local, Redo&& redo) {
    if (!std::is_same_v<A, double> && !isfinite(local.v[kStats - 1])) {
      redo(s);
      return;
    }
#pragma unroll
    for (int i = 0; i < kStats; ++i) s.v[i] += static_cast<double>(local.v[i]);
  }

  // A thread's sums over a whole row sweep: RowSum<T> (f32 for 16-bit input, like its math; f64 for f32 and f64,
  // so a long row's error does not grow with its length), widened to f64 for the row's reduction.
  using Partial = Sums<RowSum<T>, kStats>;

  // s += local; an overflow of the working precision shows as a sum that is not finite (the kernel sums that
  // thread's share again in f64).
  template <typename S>
  __device__ static __forceinline__ void add_overflowing(Sums<S, kStats>& s, const Local& local) {
#pragma unroll
    for (int i = 0; i < kStats; ++i) s.v[i] += static_cast<S>(local.v[i]);
  }

  __device__ static __forceinline__ Stats widen(const Partial& p) {
    Stats s;
#pragma unroll
    for (int i = 0; i < kStats; ++i) s.v[i] = static_cast<double>(p.v[i]);
    return s;
  }

  // mean (layer_norm; 0 for rms_norm) and rstd of a row from its reduced sums (inv_n = 1 / n), in the working
  // precision in F.rms_norm's / F.layer_norm's order (mean, + eps, 1 / sqrt); where the mean square or variance
  // overflows the working precision, rstd from it scaled by a power of two (eps is below its rounding there).
  // Returns false where the sums are not finite: rows holding inf or NaN (which give what the formula gives, as
  // torch's) and f64 rows whose squares overflow f64 (these take Exact). No f64 division or square root here: on
  // the GPU those are subroutines that cost registers.
  __device__ static __forceinline__ bool finish(const Stats& s, double inv_n, A eps, A shift, A& mean, A& rstd) {
    double spread;
    if constexpr (kLayer) {
      const double m1 = s.v[0] * inv_n;
      spread = s.v[1] * inv_n - m1 * m1;
      if (spread < 0) spread = 0;  // rounding; NaN (a row holding inf or NaN) stays NaN
      mean = static_cast<A>(static_cast<double>(shift) + m1);
    } else {
      (void)shift;
      spread = s.v[0] * inv_n;
      mean = A(0);
    }
    const A spread_a = static_cast<A>(spread);
    rstd = A(1) / sqrt(spread_a + eps);
    if constexpr (!std::is_same_v<A, double>) {
      if (isinf(spread_a) && isfinite(spread)) rstd = rsqrtf(static_cast<float>(spread * 0x1p-160)) * 0x1p-80f;
    }
    return isfinite(spread);
  }

  // An f64 row's statistics from its values scaled by a power of two (their squares can overflow f64 itself),
  // each thread's share added by for_each and reduced over the row's threads by reduce, for rows finish()
  // refused: mean, then the sum of squared deviations (rms_norm: of the values).
  struct Exact {
    static constexpr double kScale = 0x1p-600;
    template <int kC>
    __device__ static __forceinline__ double sum(const AlignedVector<T, kC>& v) {
      double s = 0;
#pragma unroll
      for (int e = 0; e < kC; ++e) s += static_cast<double>(static_cast<A>(v.val[e])) * kScale;
      return s;
    }
    template <int kC>
    __device__ static __forceinline__ double squares(const AlignedVector<T, kC>& v, double centre) {
      double s = 0;
#pragma unroll
      for (int e = 0; e < kC; ++e) {
        const double d = static_cast<double>(static_cast<A>(v.val[e])) * kScale - centre;
        s += d * d;
      }
      return s;
    }
    // for_each(f) calls f(chunk) for each of this thread's chunks; reduce(x, pass) sums x over the row's threads.
    template <typename ForEach, typename Reduce>
    __device__ static __forceinline__ void stats(ForEach&& for_each, Reduce&& reduce, int64_t n, A eps, A& mean,
                                                 A& rstd) {
      double centre = 0;
      if constexpr (kLayer) {
        double part = 0;
        for_each([&](const auto& v) { part += sum(v); });
        centre = reduce(part, 0) / static_cast<double>(n);
      }
      double part = 0;
      for_each([&](const auto& v) { part += squares(v, centre); });
      const double spread = reduce(part, 1) / static_cast<double>(n);
      mean = static_cast<A>(centre / kScale);
      rstd = static_cast<A>(kScale / sqrt(spread + static_cast<double>(eps) * kScale * kScale));
    }
  };

  // One output chunk: ((x - mean) * rstd) * (w + offset) (+ b), formed in A and rounded once. Without a weight
  // (kWeight false) w is not read; without a bias neither is b.
  template <bool kWeight, bool kBias, typename W, int kC>
  __device__ static __forceinline__ AlignedVector<T, kC> normalize(const AlignedVector<T, kC>& v,
                                                                   const AlignedVector<W, kC>& w,
                                                                   const AlignedVector<W, kC>& b, A mean, A rstd,
                                                                   A offset) {
    AlignedVector<T, kC> out;
#pragma unroll
    for (int e = 0; e < kC; ++e) {
      A y = kLayer ? (static_cast<A>(v.val[e]) - mean) * rstd : static_cast<A>(v.val[e]) * rstd;
      if constexpr (kWeight) y = y * (static_cast<A>(w.val[e]) + offset);
      if constexpr (kBias) y = y + static_cast<A>(b.val[e]);
      out.val[e] = static_cast<T>(y);
    }
    return out;
  }
};

// h = round_T(x + residual), add_rms_norm's residual_out.
template <typename T, int kC>
__device__ __forceinline__ AlignedVector<T, kC> add_rounded(const AlignedVector<T, kC>& a,
                                                            const AlignedVector<T, kC>& b) {
  using A = opmath_t<T>;
  AlignedVector<T, kC> out;
#pragma unroll
  for (int e = 0; e < kC; ++e) out.val[e] = static_cast<T>(static_cast<A>(a.val[e]) + static_cast<A>(b.val[e]));
  return out;
}

// ----------------------------------------------------------------------------------------- staged rows
// Rows staged through shared memory (the backward's staged kernel): while a block works on one row, each
// thread's copies of its chunks of the next rows are in flight (cp.async) into a ring of kStages row buffers. A
// thread reads back only the chunks it copied itself, so the ring needs no barrier. A buffer holds the same row
// of kTensors tensors, kUnits chunks a thread (chunk tid + k * threads), laid out [stage][tensor][unit][thread]:
// a warp's 16-byte accesses are consecutive. Every fetch commits one copy group (empty past the block's rows),
// so wait() (at most kStages - 1 groups in flight) always means "the oldest fetched row is here".
template <typename T, int kC, int kTensors, int kUnits, int kStages>
struct RowRing {
  using Chunk = AlignedVector<T, kC>;
  static_assert(sizeof(Chunk) == kVectorBytes, "cp.async copies 16-byte vectors");

  static size_t bytes(int threads) { return size_t{kStages} * kTensors * kUnits * threads * sizeof(Chunk); }

  __device__ explicit RowRing(void* smem) : mine_(static_cast<Chunk*>(smem) + threadIdx.x) {}

  __device__ const Chunk& at(int stage, int tensor, int unit) const { return *slot(stage, tensor, unit); }

  // Copies this thread's chunks of the rows starting at row[t] into `stage` (none when !valid).
  __device__ void fetch(int stage, const T* const (&row)[kTensors], int n_chunks, bool valid) {
    if (valid) {
#pragma unroll
      for (int k = 0; k < kUnits; ++k) {
        const int c = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
        if (c < n_chunks) {
#pragma unroll
          for (int t = 0; t < kTensors; ++t) {
            copy_async_16(slot(stage, t, k), reinterpret_cast<const Chunk*>(row[t]) + c);
          }
        }
      }
    }
    copy_async_commit();
  }

  __device__ static void wait() { copy_async_wait<kStages - 1>(); }

 private:
  __device__ Chunk* slot(int stage, int tensor, int unit) const {
    return mine_ + ((stage * kTensors + tensor) * kUnits + unit) * static_cast<int>(blockDim.x);
  }

  Chunk* mine_;
};

// ------------------------------------------------------------------------------------ column partials
constexpr int kReduceRows = 16;  // column reduction: partial rows summed in parallel per column

// dst[col] = sum over p of partial[p, col], in a fixed order: thread (x, y) sums p = y, y + kReduceRows, ... in
// order, then row y == 0 adds the kReduceRows sums in order of y.
template <typename S, typename W>
__global__ void __launch_bounds__(kWarpSize * kReduceRows)
    norm_column_reduce_kernel(const S* __restrict__ partial, int64_t parts, int64_t n, W* __restrict__ dst) {
  __shared__ S sums[kReduceRows][kWarpSize + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarpSize + threadIdx.x;
  S v = 0;
  if (col < n) {
    for (int64_t p = threadIdx.y; p < parts; p += kReduceRows) v += partial[p * n + col];
  }
  sums[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    S total = sums[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < kReduceRows; ++k) total += sums[k][threadIdx.x];
    dst[col] = static_cast<W>(total);
  }
}

template <typename S, typename W>
void launch_column_reduce(const S* partial, int64_t parts, int64_t n, W* dst, cudaStream_t stream) {
  norm_column_reduce_kernel<S, W>
      <<<blocks_to_cover(n, kWarpSize), dim3(kWarpSize, kReduceRows), 0, stream>>>(partial, parts, n, dst);
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

// ------------------------------------------------------------------------------------------ launching
// A kernel's residency (blocks per SM, or clusters per device) for (device, block size, dynamic shared memory,
// cluster size), asked of the driver once per key: the occupancy query took host time on every call.
// Direct-mapped, lock-free: each slot packs key and value into one word, so a reader sees a whole entry or a miss.
class OccupancyCache {
 public:
  template <typename Query>
  int get(int device, int threads, size_t smem, Query query, int cluster = 1) {
    if (device < 0 || device >= 64 || threads > 1024 || smem >= (size_t{1} << 24) || cluster < 1 || cluster > 15) {
      return query();
    }
    const uint64_t key = (static_cast<uint64_t>(cluster) << 41) | (static_cast<uint64_t>(device) << 35) |
                         (static_cast<uint64_t>(threads) << 24) | smem;
    std::atomic<uint64_t>& slot = slots_[(key ^ (key >> 9) ^ (key >> 24)) % kSlots];
    const uint64_t entry = slot.load(std::memory_order_relaxed);
    if (entry != 0 && (entry >> 16) == key) return static_cast<int>(entry & 0xffff);
    const int value = query();  // >= 0
    slot.store((key << 16) | static_cast<uint64_t>(std::min(value, 0xffff)), std::memory_order_relaxed);
    return value;
  }

 private:
  static constexpr int kSlots = 64;
  std::atomic<uint64_t> slots_[kSlots] = {};
};

// Resident blocks an SM of `kernel` (threads, dynamic smem), or resident clusters of the device, cached.
template <typename... Params>
int cached_residency(void (*kernel)(Params...), int device, int threads, size_t smem, int cluster = 1) {
  static OccupancyCache cache;  // one per kernel instance
  if (cluster > 1) {
    return cache.get(device, threads, smem, [&] { return resident_clusters(kernel, threads, smem, cluster); },
                     cluster);
  }
  return cache.get(device, threads, smem, [&] { return resident_blocks_per_sm(kernel, threads, smem); });
}

// The static shared memory of the block-reduction kernels: warps_sum's scratch and cluster_sum's slots, of
// elements of S.
template <typename S, int kStats>
constexpr size_t kReduceScratchBytes = (2 * kWarpSize + 2) * kStats * sizeof(S);

// The dynamic shared memory a kernel may opt in to on `device`, next to `static_bytes`.
inline size_t smem_limit(int device, size_t static_bytes) {
  return static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) - static_bytes;
}

// `threads` rounded up to whole warps.
inline int round_to_warps(int64_t threads) {
  return static_cast<int>((threads + kWarpSize - 1) / kWarpSize * kWarpSize);
}

// Every row start of `rows` (and its base) 16-byte aligned for n-element rows.
template <typename T>
bool rows_aligned(const Rows<T>& rows, int64_t n) {
  constexpr int kUnit = vector_size<T>();
  return n % kUnit == 0 && rows.stride % kUnit == 0 && is_aligned(rows.data);
}

// A weight (or bias) aligned for its own kUnit-wide (T's vector width) loads; null is.
template <typename T, typename W>
bool param_aligned(const W* p) {
  return p == nullptr || is_aligned(p, static_cast<int>(sizeof(W)) * vector_size<T>());
}

}  // namespace norm_cuda
}  // namespace torchops
