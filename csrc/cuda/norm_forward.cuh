// The normalisations' forward kernels on the CUDA row engine (norm/norm_cuda.cuh), in the two forms of
// norm/norm_plan.h, and their launch from a plan. One template serves rms_norm, add_rms_norm (kOp kAddRms: the
// residual is added in the same pass, h = round_T(input + residual) stored as residual_out and normalised) and
// layer_norm (kOp kLayer: centred, with a bias); norm_forward_{rms,add,layer}.cu instantiate it in parallel.
// Every row: sweep 1 loads its chunks (all loads issued before any is used) and sums them; the row's
// sums give mean and rstd; sweep 2 writes ((h - mean) * rstd) * (weight + offset) + bias, formed in f32 (f64 for
// f64) and rounded once, F.rms_norm's / F.layer_norm's order. A row's sums are f64 (RowMath), so its statistics
// do not depend on its length or on where its large values sit: a thread's share that overflows the working
// precision is summed again in f64 from its values; f64 rows whose squares overflow f64 itself take exact
// statistics from a scaled pass over their values after their output, which they write again (RowMath::Exact).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../norm/norm_cuda.cuh"
#include "../norm/norm_plan.h"

namespace torchops {
namespace norm_cuda {

// The pointers and scalars of one forward launch (null where absent or not wanted).
template <typename T, typename W>
struct ForwardArgs {
  Rows<T> x;
  Rows<T> residual;  // add_rms_norm
  T* h_out;  // add_rms_norm's residual_out (dense)
  const W* weight;
  const W* bias;  // layer_norm
  T* y;
  opmath_t<T>* mean;  // layer_norm, when saved
  opmath_t<T>* rstd;  // when saved
  int64_t rows;
  int64_t n;
  opmath_t<T> eps;
  opmath_t<T> offset;
};

template <typename T, typename W>
using ForwardKernel = void (*)(ForwardArgs<T, W>, int);

// ------------------------------------------------------------------------------------------ register rows
// An f64 register row again with its exact statistics (RowMath::Exact) from its values in memory (`src`: the
// input, or add_rms_norm's residual_out), its output written again where `redo`. Every thread of the row's warp (a
// group of up to a warp) or block calls it; row < 0: a thread without a row. Not inlined: a cold path.
template <typename T, typename W, int kC, bool kLayer, bool kWeight, bool kBias, int kPer>
__device__ __noinline__ void register_rows_exact(ForwardArgs<T, W> a, int64_t row, const T* src, int t,
                                                 int group_threads, bool redo, int parity,
                                                 double (&scratch)[2][1][kWarpSize]) {
  using M = RowMath<kLayer, T>;
  using A = opmath_t<T>;
  const int n_chunks = static_cast<int>(a.n / kC);
  const bool in_warp = group_threads <= kWarpSize;
  auto for_each = [&](auto&& f) {
    if (row < 0) return;
    for (int k = 0; k < kPer; ++k) {
      if (t + k * group_threads < n_chunks) f(load_vector<T, kC>(src, t + k * group_threads));
    }
  };
  auto reduce = [&](double x, int pass) {
    const Sums<double, 1> e{{x}};
    return (in_warp ? lanes_sum(e, group_threads) : warps_sum(e, scratch, parity ^ pass, 0, group_threads / kWarpSize))
        .v[0];
  };
  A mean, r;
  M::Exact::stats(for_each, reduce, a.n, a.eps, mean, r);
  if (!redo) return;
  if (t == 0) {
    if (a.rstd != nullptr) a.rstd[row] = r;
    if (kLayer && a.mean != nullptr) a.mean[row] = mean;
  }
  for (int k = 0; k < kPer; ++k) {
    const int c = t + k * group_threads;
    if (c >= n_chunks) continue;
    const AlignedVector<W, kC> w = kWeight ? load_vector<W, kC>(a.weight, c) : AlignedVector<W, kC>{};
    const AlignedVector<W, kC> b = kBias ? load_vector<W, kC>(a.bias, c) : AlignedVector<W, kC>{};
    store_vector<T, kC>(a.y + row * a.n, c,
                        M::template normalize<kWeight, kBias>(load_vector<T, kC>(src, c), w, b, mean, r, a.offset));
  }
}


// A group of row_threads threads a row (a power of two; rows of a block: blockDim / row_threads, one when the
// group is larger than a warp), kPer chunks a thread, the row read once into registers. Plain rows of 16-byte
// vectors read the input with L2 "evict last" and store "evict first"; f32 rows of 4 vectors a thread (a block
// a row) read "evict first" without L1 and keep the weight in L1 and L2; add_rms_norm's take no hints. The weight
// is read before the row's sum up to 4 vectors a thread, after it at 8. kGroup: the group size as a constant
// (the plans' warp rows and 128-thread rows: constant offsets took 16 registers fewer), 0 for row_threads.
template <typename T, typename W, int kC, NormOp kOp, bool kWeight, bool kBias, int kPer, int kGroup>
__global__ void __launch_bounds__(1024 / kPer) norm_register_rows_kernel(ForwardArgs<T, W> a, int row_threads) {
  constexpr bool kAdd = kOp == NormOp::kAddRms, kLayer = kOp == NormOp::kLayer;
  using M = RowMath<kLayer, T>;
  using A = opmath_t<T>;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  constexpr bool kHints = !kAdd && sizeof(T) * kC == kVectorBytes;
  constexpr bool kBlockHints = kHints && sizeof(T) == 4 && kPer == 4;
  // Both of layer_norm's parameters held through the row's sum took 116-118 registers a thread at 4 vectors (40
  // without parameters, 78 with one): they are read after the sum there.
  constexpr bool kWeightFirst = kPer <= 4 && !(kWeight && kBias);
  __shared__ double scratch[2][M::kStats][kWarpSize];
  __shared__ double exact_scratch[2][1][kWarpSize];
  const int group_threads = kGroup > 0 ? kGroup : row_threads;
  const int per_block = static_cast<int>(blockDim.x) / group_threads;
  const int sub = static_cast<int>(threadIdx.x) / group_threads, t = static_cast<int>(threadIdx.x) % group_threads;
  const int n_chunks = static_cast<int>(a.n / kC);
  const double inv_n = 1.0 / static_cast<double>(a.n);
  const uint64_t keep = kHints ? l2_policy<L2Evict::kLast>() : 0, drop = kHints ? l2_policy<L2Evict::kFirst>() : 0;
  auto read = [&](const T* base, int c) {
    if constexpr (kBlockHints) return read_chunk<T, kC, L1Use::kNoAllocate>(base, c, drop, true);
    return read_chunk<T, kC>(base, c, keep, kHints);
  };
  auto read_param = [&](const W* p, int c) {
    constexpr bool kKeepParam = kBlockHints && sizeof(W) == sizeof(T);
    return read_chunk<W, kC, L1Use::kEvictLast>(p, c, keep, kKeepParam);
  };
  int parity = 0;
  for (int64_t group = blockIdx.x; group * per_block < a.rows; group += gridDim.x, parity ^= 1) {
    const int64_t row = group * per_block + sub;
    const bool valid = row < a.rows;  // uniform over the row's group
    Chunk v[kPer];
    WChunk w[kPer], b[kPer];
    typename M::Stats st = zero_sums<double, M::kStats>();
    A shift = 0;
    auto params = [&](int k, int c) {
      if constexpr (kWeight) w[k] = read_param(a.weight, c);
      if constexpr (kBias) b[k] = read_param(a.bias, c);
    };
    if (valid) {
      const T* xr = a.x.row(row);
      if constexpr (kLayer) shift = static_cast<A>(xr[0]);
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int c = t + k * group_threads;
        if (c < n_chunks) v[k] = read(xr, c);
      }
      if constexpr (kAdd) {
        const T* rr = a.residual.row(row);
        T* hr = a.h_out + row * a.n;
        Chunk o[kPer];
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int c = t + k * group_threads;
          if (c < n_chunks) o[k] = read(rr, c);
        }
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int c = t + k * group_threads;
          if (c < n_chunks) {
            v[k] = add_rounded(v[k], o[k]);
            write_chunk(hr, c, v[k], drop, false);
          }
        }
      }
      if constexpr (kWeightFirst) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int c = t + k * group_threads;
          if (c < n_chunks) params(k, c);
        }
      }
      typename M::Local local{};
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        if (t + k * group_threads < n_chunks) M::accumulate(local, v[k], shift);
      }
      M::add(st, local, [&](typename M::Stats& s) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          if (t + k * group_threads < n_chunks) M::accumulate_f64(s, v[k], shift);
        }
      });
#pragma unroll
      for (int k = 0; k < kPer; ++k) keep_packed(v[k]);
    }
    const bool in_warp = group_threads <= kWarpSize;  // else the block is the row's (per_block == 1)
    st = in_warp ? lanes_sum(st, group_threads) : warps_sum(st, scratch, parity, 0, group_threads / kWarpSize);
    A mean, r;
    const bool ok = M::finish(st, inv_n, a.eps, shift, mean, r);
    if (valid) {
      if (t == 0) {
        if (a.rstd != nullptr) a.rstd[row] = r;
        if (kLayer && a.mean != nullptr) a.mean[row] = mean;
      }
      T* yr = a.y + row * a.n;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int c = t + k * group_threads;
        if (c < n_chunks) {
          if constexpr (!kWeightFirst) params(k, c);
          write_chunk(yr, c, M::template normalize<kWeight, kBias>(v[k], w[k], b[k], mean, r, a.offset), drop,
                      kHints);
        }
      }
    }
    if constexpr (std::is_same_v<T, double>) {
      // rare: rows whose squares overflow f64, again with exact statistics (uniform over the warp or block)
      if (in_warp ? __any_sync(kFullWarpMask, valid && !ok) : !ok) {
        register_rows_exact<T, W, kC, kLayer, kWeight, kBias, kPer>(
            a, valid ? row : -1, kAdd ? a.h_out + row * a.n : a.x.row(row), t, group_threads,
            valid && !ok, parity, exact_scratch);
      }
    }
  }
}

// -------------------------------------------------------------------------------------------- stream rows
// A block (kCluster: the blocks of a cluster, each its part of the row) a row, two sweeps. Sweep 1 reads the
// row (kStreamInFlight vectors a thread in flight) with L2 "evict last" so sweep 2 finds it in L1 or L2; sweep 2
// reads it again "evict first" and writes the output. add_rms_norm (kKeep): sweep 1 reads input and residual
// once and stores residual_out, which sweep 2 reads back (kReadBack) or finds in shared memory (kShared: each
// thread its own chunks, no barrier); or (kInputsAgain) sweep 1 stores nothing and sweep 2 reads input and
// residual again (mostly from L1), adds them again and stores residual_out beside the output, as Inductor does.
// f32 rows kept in shared memory take no L2 hints (faster without); plain rows of exactly 4 vectors a thread add
// L1 priorities (sweep 1 "evict last", sweep 2 "evict first"). kPer > 0: exactly kPer vectors a thread, a fixed
// count of batches with no loop bounds (between a row's loads and its stores every instruction is on the
// critical path); kThreads > 0: the block size as a constant, so vectors sit at fixed offsets from one pointer.
constexpr int kAddOneMinBlocks = 4;  // add_rms_norm's read-twice rows of one vector a thread: 32 registers

// One sweep over this thread's chunks c = threadIdx.x, c + threads, ... (its j-th chunk the j-th of them):
// batch(c, j) takes kBatch at once; with kPer > 0 a fixed count of batches, else batches while whole ones remain,
// then one(c, j) for each chunk left.
template <int kPer, int kBatch, typename Batch, typename One>
__device__ __forceinline__ void stream_sweep(int threads, int n_chunks, Batch&& batch, One&& one) {
  int c = threadIdx.x;
  if constexpr (kPer > 0) {
#pragma unroll
    for (int q = 0; q < kPer / kBatch; ++q) batch(c + q * kBatch * threads, q * kBatch);
  } else {
    int j = 0;
    for (; c + (kBatch - 1) * threads < n_chunks; c += kBatch * threads, j += kBatch) batch(c, j);
    for (; c < n_chunks; c += threads, ++j) one(c, j);
  }
}

template <typename T, typename W, int kC, NormOp kOp, bool kWeight, bool kBias, Keep kKeep, int kPer, int kThreads,
          bool kCluster>
__global__ void __launch_bounds__(kKeep == Keep::kInputsAgain && kPer == 1 ? kAddAgainThreads : kStreamMaxThreads,
                                  kKeep == Keep::kInputsAgain && kPer == 1 ? kAddOneMinBlocks : kPer > 0 ? 1 : 0)
    norm_stream_rows_kernel(ForwardArgs<T, W> a, int) {
  constexpr bool kAdd = kOp == NormOp::kAddRms, kLayer = kOp == NormOp::kLayer;
  using M = RowMath<kLayer, T>;
  using A = opmath_t<T>;
  using Stats = typename M::Stats;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  constexpr bool kVec = sizeof(T) * kC == kVectorBytes;
  constexpr bool kKept = kKeep == Keep::kShared;
  constexpr bool kAgain = kKeep == Keep::kInputsAgain;
  constexpr bool kL1Priorities = !kAdd && kPer == 4;
  constexpr L1Use kSecondRead = kL1Priorities ? L1Use::kEvictFirst : L1Use::kNoAllocate;
  constexpr int kIn = kPer > 0 && !kAdd ? kPer : kPer > 0 && kPer < kStreamInFlight ? kPer : kStreamInFlight;
  constexpr int kOut = kPer > 0 && kPer < kStreamInFlight ? kPer : kStreamInFlight;
  static_assert(kPer % kIn == 0 && kPer % kOut == 0, "whole batches");
  static_assert(!kAgain || (kAdd && !kCluster), "input and residual read again: add_rms_norm, one block a row");
  // add_rms_norm's f32 rows (and all its fixed-count rows) kept in shared memory read without L2 hints
  constexpr bool kAddHints = kVec && !(kKeep != Keep::kReadBack && (std::is_same_v<T, float> || kPer > 0));
  __shared__ double scratch[2][M::kStats][kWarpSize];
  __shared__ Stats cluster_slots[kCluster ? 2 : 1];
  __shared__ double exact_scratch[2][1][kWarpSize];
  __shared__ Sums<double, 1> exact_slots[kCluster ? 2 : 1];
  extern __shared__ __align__(16) unsigned char stream_smem[];
  Chunk* kept = reinterpret_cast<Chunk*>(stream_smem) + threadIdx.x;
  const int cluster = kCluster ? static_cast<int>(cluster_blocks()) : 1;
  const int64_t part = kCluster ? a.n / cluster : a.n, first = kCluster ? cluster_rank() * part : 0;
  const int n_chunks = static_cast<int>(part / kC);
  const double inv_n = 1.0 / static_cast<double>(a.n);
  const W* w_part = kWeight ? a.weight + first : nullptr;
  const W* b_part = kBias ? a.bias + first : nullptr;
  const int threads = kThreads > 0 ? kThreads : static_cast<int>(blockDim.x);
  const uint64_t keep = kVec ? l2_policy<L2Evict::kLast>() : 0, drop = kVec ? l2_policy<L2Evict::kFirst>() : 0;
  auto read_once = [&](const T* base, int c) { return read_chunk<T, kC>(base, c, drop, kAddHints); };
  int parity = 0;
  for (int64_t row = blockIdx.x / cluster; row < a.rows; row += gridDim.x / cluster, parity ^= 1) {
    const T* xr = a.x.row(row) + first;
    const T* rr = kAdd ? a.residual.row(row) + first : nullptr;
    T* hr = kAdd ? a.h_out + row * a.n + first : nullptr;
    T* yr = a.y + row * a.n + first;
    const A shift = kLayer ? static_cast<A>(xr[0]) : A(0);
    // sweep 1's value of chunk c (add_rms_norm: residual_out, stored here but with kInputsAgain)
    auto first_read = [&](int c) {
      if constexpr (kAgain) {
        return add_rounded(read_chunk<T, kC, L1Use::kEvictLast>(xr, c, keep, kVec),
                           read_chunk<T, kC, L1Use::kEvictLast>(rr, c, keep, kVec));
      } else if constexpr (kAdd) {
        const Chunk v = add_rounded(read_once(xr, c), read_once(rr, c));
        write_chunk(hr, c, v, kKept ? drop : keep, kAddHints);
        return v;
      } else if constexpr (kL1Priorities) {
        return read_chunk<T, kC, L1Use::kEvictLast>(xr, c, keep, kVec);
      } else {
        return read_chunk<T, kC>(xr, c, keep, kVec);
      }
    };
    typename M::Partial part = zero_sums<RowSum<T>, M::kStats>();
    auto sweep1_batch = [&](int c, int j) {
      Chunk v[kIn];
      if constexpr (kAdd) {  // all of input's loads, then all of residual's, then the adds
        Chunk o[kIn];
#pragma unroll
        for (int k = 0; k < kIn; ++k) {
          v[k] = kAgain ? read_chunk<T, kC, L1Use::kEvictLast>(xr, c + k * threads, keep, kVec)
                        : read_once(xr, c + k * threads);
        }
#pragma unroll
        for (int k = 0; k < kIn; ++k) {
          o[k] = kAgain ? read_chunk<T, kC, L1Use::kEvictLast>(rr, c + k * threads, keep, kVec)
                        : read_once(rr, c + k * threads);
        }
#pragma unroll
        for (int k = 0; k < kIn; ++k) {
          v[k] = add_rounded(v[k], o[k]);
          if constexpr (!kAgain) write_chunk(hr, c + k * threads, v[k], kKept ? drop : keep, kAddHints);
          if constexpr (kKept) kept[(j + k) * threads] = v[k];
        }
      } else {
#pragma unroll
        for (int k = 0; k < kIn; ++k) v[k] = first_read(c + k * threads);
      }
      typename M::Local local{};
#pragma unroll
      for (int k = 0; k < kIn; ++k) M::accumulate(local, v[k], shift);
      M::add_overflowing(part, local);
    };
    stream_sweep<kPer, kIn>(threads, n_chunks, sweep1_batch, [&](int c, int j) {
      const Chunk v = first_read(c);
      if constexpr (kKept) kept[j * threads] = v;
      typename M::Local local{};
      M::accumulate(local, v, shift);
      M::add_overflowing(part, local);
    });
    Stats st = M::widen(part);
    if (!std::is_same_v<A, double> && !isfinite(st.v[M::kStats - 1])) {
      // rare: this thread's share overflowed the working precision: summed again in f64
      st = zero_sums<double, M::kStats>();
#pragma unroll 1
      for (int c = threadIdx.x, j = 0; c < n_chunks; c += threads, ++j) {
        Chunk v;
        if constexpr (kKept) {
          v = kept[j * threads];
        } else if constexpr (kAgain) {
          v = add_rounded(load_vector<T, kC>(xr, c), load_vector<T, kC>(rr, c));
        } else {
          v = load_vector<T, kC>(kAdd ? hr : xr, c);
        }
        M::accumulate_f64(st, v, shift);
      }
    }
    st = warps_sum(st, scratch, parity, 0, threads / kWarpSize);
    if constexpr (kCluster) st = cluster_sum(st, cluster_slots, parity, cluster);
    A mean, r;
    const bool ok = M::finish(st, inv_n, a.eps, shift, mean, r);
    // sweep 2's value of chunk c, the j-th of this thread's
    const T* again = kAdd ? hr : xr;
    auto second_read = [&](int c, int j) {
      if constexpr (kKept) {
        return kept[j * threads];
      } else if constexpr (kAgain) {
        return add_rounded(read_chunk<T, kC, L1Use::kEvictFirst>(xr, c, drop, kVec),
                           read_chunk<T, kC, L1Use::kEvictFirst>(rr, c, drop, kVec));
      } else {
        return read_chunk<T, kC, kSecondRead>(again, c, drop, kVec);
      }
    };
    if (threadIdx.x == 0 && first == 0) {
      if (a.rstd != nullptr) a.rstd[row] = r;
      if (kLayer && a.mean != nullptr) a.mean[row] = mean;
    }
    // a weight vector, which every block reads, is kept in L1 and L2 under the L1 priorities
    auto read_param = [&](const W* p, int c) {
      return read_chunk<W, kC, L1Use::kEvictLast>(p, c, keep, (kAgain || kL1Priorities) && sizeof(W) == sizeof(T));
    };
    auto write = [&](int c, const Chunk& v, const WChunk& w, const WChunk& b) {
      write_chunk(yr, c, M::template normalize<kWeight, kBias>(v, w, b, mean, r, a.offset), drop, kVec && !kAgain);
    };
    auto sweep2_batch = [&](int c, int j) {
      Chunk v[kOut];
      WChunk w[kOut], b[kOut];
      if constexpr (kAgain) {
        Chunk o[kOut];
#pragma unroll
        for (int k = 0; k < kOut; ++k) v[k] = read_chunk<T, kC, L1Use::kEvictFirst>(xr, c + k * threads, drop, kVec);
#pragma unroll
        for (int k = 0; k < kOut; ++k) o[k] = read_chunk<T, kC, L1Use::kEvictFirst>(rr, c + k * threads, drop, kVec);
#pragma unroll
        for (int k = 0; k < kOut; ++k) {
          if constexpr (kWeight) w[k] = read_param(w_part, c + k * threads);
          if constexpr (kBias) b[k] = read_param(b_part, c + k * threads);
        }
#pragma unroll
        for (int k = 0; k < kOut; ++k) {
          v[k] = add_rounded(v[k], o[k]);
          write_chunk(hr, c + k * threads, v[k], drop, false);
          write(c + k * threads, v[k], w[k], b[k]);
        }
      } else {
#pragma unroll
        for (int k = 0; k < kOut; ++k) {
          v[k] = second_read(c + k * threads, j + k);
          if constexpr (kWeight) w[k] = read_param(w_part, c + k * threads);
          if constexpr (kBias) b[k] = read_param(b_part, c + k * threads);
        }
#pragma unroll
        for (int k = 0; k < kOut; ++k) write(c + k * threads, v[k], w[k], b[k]);
      }
    };
    stream_sweep<kPer, kOut>(threads, n_chunks, sweep2_batch, [&](int c, int j) {
      const Chunk v = second_read(c, j);
      if constexpr (kAgain) write_chunk(hr, c, v, drop, false);
      write(c, v, kWeight ? read_param(w_part, c) : WChunk{}, kBias ? read_param(b_part, c) : WChunk{});
    });
    if (std::is_same_v<T, double> && !ok) {  // rare: an f64 row whose squares overflow f64, again with exact
      // statistics (uniform over the block and the cluster: the row's sums are the same bits everywhere)
      auto value = [&](int c, int j) { return kKept ? kept[j * threads] : load_vector<T, kC>(again, c); };
      auto for_each = [&](auto&& f) {
#pragma unroll 1
        for (int c = threadIdx.x, j = 0; c < n_chunks; c += threads, ++j) f(value(c, j));
      };
      auto reduce = [&](double x, int pass) {
        Sums<double, 1> e{{x}};
        e = warps_sum(e, exact_scratch, parity ^ pass, 0, threads / kWarpSize);
        if constexpr (kCluster) e = cluster_sum(e, exact_slots, parity ^ pass, cluster);
        return e.v[0];
      };
      M::Exact::stats(for_each, reduce, a.n, a.eps, mean, r);
      if (threadIdx.x == 0 && first == 0) {
        if (a.rstd != nullptr) a.rstd[row] = r;
        if (kLayer && a.mean != nullptr) a.mean[row] = mean;
      }
#pragma unroll 1
      for (int c = threadIdx.x, j = 0; c < n_chunks; c += threads, ++j) {
        const WChunk w = kWeight ? load_vector<W, kC>(w_part, c) : WChunk{};
        const WChunk b = kBias ? load_vector<W, kC>(b_part, c) : WChunk{};
        store_vector<T, kC>(yr, c, M::template normalize<kWeight, kBias>(value(c, j), w, b, mean, r, a.offset));
      }
    }
  }
  if constexpr (kCluster) cluster_barrier();  // no block exits while a peer may still read its slots
}

// ------------------------------------------------------------------------------------------------ launch
// The kernel of a plan, for a launch with or without weight (and bias).
template <typename T, typename W, int kC, NormOp kOp, bool kWeight, bool kBias>
ForwardKernel<T, W> forward_kernel_for(const ForwardPlan& p) {
  constexpr bool kVec = sizeof(T) * kC == kVectorBytes;
  constexpr int kFixed = kStreamMaxThreads, kAgainFixed = kAddAgainThreads;
  if (p.form == ForwardForm::kRegisterRows) {
    if constexpr (kVec) {
      const bool warp = p.row_threads == kWarpSize, block = p.row_threads == 4 * kWarpSize;
      switch (p.per) {
        case 1: return norm_register_rows_kernel<T, W, kC, kOp, kWeight, kBias, 1, 0>;
        case 2:
          return block ? norm_register_rows_kernel<T, W, kC, kOp, kWeight, kBias, 2, 4 * kWarpSize>
                       : norm_register_rows_kernel<T, W, kC, kOp, kWeight, kBias, 2, 0>;
        case 4:
          return warp    ? norm_register_rows_kernel<T, W, kC, kOp, kWeight, kBias, 4, kWarpSize>
                 : block ? norm_register_rows_kernel<T, W, kC, kOp, kWeight, kBias, 4, 4 * kWarpSize>
                         : norm_register_rows_kernel<T, W, kC, kOp, kWeight, kBias, 4, 0>;
        default:
          return warp ? norm_register_rows_kernel<T, W, kC, kOp, kWeight, kBias, kMaxRegisterPer, kWarpSize>
                      : norm_register_rows_kernel<T, W, kC, kOp, kWeight, kBias, kMaxRegisterPer, 0>;
      }
    }
    return norm_register_rows_kernel<T, W, kC, kOp, kWeight, kBias, kMaxRegisterPer, 0>;
  }
  if constexpr (kVec && kOp == NormOp::kAddRms) {
    if (p.keep == Keep::kInputsAgain) {
      if (p.per == 1) return norm_stream_rows_kernel<T, W, kC, kOp, kWeight, kBias, Keep::kInputsAgain, 1, 0, false>;
      if (p.per == 2) {
        return norm_stream_rows_kernel<T, W, kC, kOp, kWeight, kBias, Keep::kInputsAgain, 2, kAgainFixed, false>;
      }
      return norm_stream_rows_kernel<T, W, kC, kOp, kWeight, kBias, Keep::kInputsAgain, 4, kAgainFixed, false>;
    }
    if (p.cluster > 1) {
      return p.per == 4 ? norm_stream_rows_kernel<T, W, kC, kOp, kWeight, kBias, Keep::kShared, 4, kFixed, true>
                        : norm_stream_rows_kernel<T, W, kC, kOp, kWeight, kBias, Keep::kShared, 8, kFixed, true>;
    }
    if (p.keep == Keep::kShared) {
      if (p.per == 4) return norm_stream_rows_kernel<T, W, kC, kOp, kWeight, kBias, Keep::kShared, 4, kFixed, false>;
      if (p.per == 8) return norm_stream_rows_kernel<T, W, kC, kOp, kWeight, kBias, Keep::kShared, 8, kFixed, false>;
      return norm_stream_rows_kernel<T, W, kC, kOp, kWeight, kBias, Keep::kShared, 0, 0, false>;
    }
  } else if constexpr (kVec) {
    if (p.per == 4) return norm_stream_rows_kernel<T, W, kC, kOp, kWeight, kBias, Keep::kReadBack, 4, 0, false>;
    if (p.per == 8) return norm_stream_rows_kernel<T, W, kC, kOp, kWeight, kBias, Keep::kReadBack, 8, 0, false>;
  }
  return norm_stream_rows_kernel<T, W, kC, kOp, kWeight, kBias, Keep::kReadBack, 0, 0, false>;
}

template <typename T, typename W, int kC, NormOp kOp>
ForwardKernel<T, W> forward_kernel(const ForwardPlan& p, bool weighted, bool biased) {
  if constexpr (kOp == NormOp::kLayer) {
    if (biased) {
      return weighted ? forward_kernel_for<T, W, kC, kOp, true, true>(p)
                      : forward_kernel_for<T, W, kC, kOp, false, true>(p);
    }
  }
  return weighted ? forward_kernel_for<T, W, kC, kOp, true, false>(p)
                  : forward_kernel_for<T, W, kC, kOp, false, false>(p);
}

// Plans and launches the forward of `a`'s rows (kC: 16-byte vectors, or 1 for element accesses).
template <typename T, typename W, int kC, NormOp kOp>
void launch_forward(const ForwardArgs<T, W>& a, int device, cudaStream_t stream) {
  constexpr int kStats = RowMath<kOp == NormOp::kLayer, T>::kStats;
  const bool weighted = a.weight != nullptr, biased = a.bias != nullptr;
  // the kernels' static shared memory: the row sums' scratch and cluster slots, and the exact sums'
  constexpr size_t kStaticBytes = kReduceScratchBytes<double, kStats> + (2 * kWarpSize + 2) * sizeof(double);
  const RowShape shape{kOp, static_cast<int>(sizeof(T)), std::is_same_v<T, double>, kC > 1, a.n, a.rows};
  const DeviceInfo info{device_attribute(cudaDevAttrMultiProcessorCount, device),
                        device_attribute(cudaDevAttrComputeCapabilityMajor, device), smem_limit(device, kStaticBytes)};
  auto residency = [&](const ForwardPlan& p) {
    const auto kernel = forward_kernel<T, W, kC, kOp>(p, weighted, biased);
    allow_shared_memory(kernel, p.smem, kStaticBytes);
    return cached_residency(kernel, device, p.threads, p.smem, p.cluster);
  };
  const ForwardPlan plan = plan_forward(shape, info, residency);
  const auto kernel = forward_kernel<T, W, kC, kOp>(plan, weighted, biased);
  allow_shared_memory(kernel, plan.smem, kStaticBytes);
  launch_in_clusters(kernel, static_cast<unsigned int>(plan.blocks), plan.threads, plan.smem, plan.cluster, stream, a,
                     plan.row_threads);
}

}  // namespace norm_cuda
}  // namespace torchops
