// rms_norm's forward kernel on the CUDA row engine (norm/norm_cuda.cuh), shared by rms_norm.cu (plain
// rows) and add_rms_norm.cu (kAdd: the residual added in the same pass), two translation units so that
// the two sets of instantiations compile in parallel. See rms_norm.cu for the kernel's design.
#pragma once

#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../core/dispatch.h"
#include "../norm/norm_cuda.cuh"

namespace torchops {
namespace rms_norm_kernels {

using namespace torchops::norm_cuda;

constexpr int kWeightGroup = 4;

template <typename A, typename S>
__device__ __forceinline__ A inverse_rms(S sum_squares, int64_t n, A eps) {
  // mean, + eps, 1/sqrt in the working precision: F.rms_norm's order
  return A(1) / sqrt(static_cast<A>(sum_squares / static_cast<S>(n)) + eps);
}

template <typename A, typename T, int kC>
__device__ __forceinline__ A chunk_squares(const AlignedVector<T, kC>& v) {
  A s = 0;
#pragma unroll
  for (int e = 0; e < kC; ++e) {
    const A a = static_cast<A>(v.val[e]);
    s += a * a;
  }
  return s;
}

template <typename A, typename T, int kC>
__device__ __forceinline__ AlignedVector<T, kC> add_rounded(const AlignedVector<T, kC>& a,
                                                            const AlignedVector<T, kC>& b) {
  AlignedVector<T, kC> out;
#pragma unroll
  for (int e = 0; e < kC; ++e) out.val[e] = static_cast<T>(static_cast<A>(a.val[e]) + static_cast<A>(b.val[e]));
  return out;
}

template <typename T, typename W, int kC, typename A>
__device__ __forceinline__ AlignedVector<T, kC> normalize(const AlignedVector<T, kC>& v,
                                                          const AlignedVector<W, kC>& w, A r, A offset) {
  AlignedVector<T, kC> out;
#pragma unroll
  for (int e = 0; e < kC; ++e) {
    out.val[e] = static_cast<T>(static_cast<A>(v.val[e]) * r * (static_cast<A>(w.val[e]) + offset));
  }
  return out;
}

template <typename T, int kC, typename A>
__device__ __forceinline__ AlignedVector<T, kC> normalize(const AlignedVector<T, kC>& v, A r) {
  AlignedVector<T, kC> out;
#pragma unroll
  for (int e = 0; e < kC; ++e) out.val[e] = static_cast<T>(static_cast<A>(v.val[e]) * r);
  return out;
}

// rstd may be null (the plain ops); otherwise rstd[row]. residual / h_out only with kAdd.
template <typename T, typename W, int kSlots, int kC, bool kBlockPerRow, bool kAdd, int kMaxThreads, int kMinBlocks>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks)
    norm_forward_kernel(const T* __restrict__ x, int64_t x_row_stride, const T* __restrict__ residual,
                        int64_t residual_row_stride, T* __restrict__ h_out, const W* __restrict__ weight,
                        opmath_t<T> offset, T* __restrict__ y, opmath_t<T>* __restrict__ rstd, int64_t rows,
                        int64_t n, opmath_t<T> eps) {
  using A = opmath_t<T>;
  using S = RowSum<T>;
  using P = Processor<kBlockPerRow>;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  // The loops over the rest of a row longer than the kept chunks (block rows only): unrolled in a warp
  // kernel, where they never run, their loads took registers.
  constexpr int kRestUnroll = kBlockPerRow ? 4 : 1;
  __shared__ S scratch[kWarpSize];
  const int threads = P::threads();
  // exact: the vector path requires n % kC == 0. 32-bit column math (n < 2^31, checked at launch): with
  // 64-bit chunk indices ptxas spent ~2 registers per kept chunk on addresses.
  const int n_chunks = static_cast<int>(n / kC);
  const int tid = P::tid();  // this thread's first chunk of the row: chunks tid, tid + threads, ... below n_chunks
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * P::per_block() + P::in_block();
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * P::per_block();
  for (int64_t row = first_row; row < rows; row += row_step) {  // uniform over the processor
    const T* xr = x + row * x_row_stride;
    const T* rr = kAdd ? residual + row * residual_row_stride : nullptr;
    T* hr = kAdd ? h_out + row * n : nullptr;
    T* yr = y + row * n;
    Chunk cache[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int c = tid + s * threads;
      if (c < n_chunks) cache[s] = load_vector<T, kC>(xr, c);
    }
    if constexpr (kAdd) {
      Chunk other[kSlots];
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int c = tid + s * threads;
        if (c < n_chunks) other[s] = load_vector<T, kC>(rr, c);
      }
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int c = tid + s * threads;
        if (c < n_chunks) {
          cache[s] = add_rounded<A>(cache[s], other[s]);
          store_vector<T, kC>(hr, c, cache[s]);
        }
      }
    }
    S ss = 0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (tid + s * threads < n_chunks) ss += chunk_squares<A>(cache[s]);
    }
#pragma unroll kRestUnroll
    for (int c = tid + kSlots * threads; c < n_chunks; c += threads) {
      Chunk v = load_vector<T, kC>(xr, c);
      if constexpr (kAdd) {
        v = add_rounded<A>(v, load_vector<T, kC>(rr, c));
        store_vector<T, kC>(hr, c, v);
      }
      ss += chunk_squares<A>(v);
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) keep_packed(cache[s]);
    ss = row_sum<kBlockPerRow>(ss, scratch);
    const A r = inverse_rms(ss, n, eps);
    if (rstd != nullptr && P::tid() == 0) rstd[row] = r;
    if (weight != nullptr) {
#pragma unroll
      for (int g = 0; g < kSlots; g += kWeightGroup) {
        WChunk wc[kWeightGroup];
#pragma unroll
        for (int k = 0; k < kWeightGroup && g + k < kSlots; ++k) {
          const int c = tid + (g + k) * threads;
          if (c < n_chunks) wc[k] = load_vector<W, kC>(weight, c);
        }
#pragma unroll
        for (int k = 0; k < kWeightGroup && g + k < kSlots; ++k) {
          const int c = tid + (g + k) * threads;
          if (c < n_chunks) store_vector<T, kC>(yr, c, normalize(cache[g + k], wc[k], r, offset));
        }
      }
    } else {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int c = tid + s * threads;
        if (c < n_chunks) store_vector<T, kC>(yr, c, normalize(cache[s], r));
      }
    }
#pragma unroll kRestUnroll
    for (int c = tid + kSlots * threads; c < n_chunks; c += threads) {
      const Chunk v = kAdd ? load_vector<T, kC>(hr, c) : load_vector<T, kC>(xr, c);
      if (weight != nullptr) {
        store_vector<T, kC>(yr, c, normalize(v, load_vector<W, kC>(weight, c), r, offset));
      } else {
        store_vector<T, kC>(yr, c, normalize(v, r));
      }
    }
  }
}

// Stream rows: a block per row keeping nothing in registers between its two sweeps, for rows of 16-byte vectors (kC =
// T's vector width) from stream_threads' sizes up. Sweep 1 reads the row (kInFlight vectors a thread in flight) and
// sums its squares; sweep 2 reads it again and writes the output. Sweep 1's reads ask L2 to keep the lines and allocate
// in L1, so sweep 2 finds the row in L1 when the rows in flight on an SM fit it (stream_threads sizes the blocks for
// that), else in L2; sweep 2's reads and the stores ask L2 to drop their lines first. kAdd: sweep 1 reads input and
// residual once (drop) and writes residual_out; with Keep::kShared it keeps residual_out in shared memory too, each
// thread its own chunks (its j-th at kept[j * threads]: no barrier), and sweep 2 reads it from there, else
// (Keep::kReadBack) back from L2 (written with the keep hint; stores do not fill L1); with Keep::kInputsAgain sweep 1
// stores nothing, and sweep 2 reads input and residual again, adds them again and stores residual_out beside the output
// (stream_threads). Kept against read back (history/tuning/rms_norm_kernels.py, add_rms_norm forward): f32 4096x32768
// 552 / 550 us in two runs against 572, 8192x16384 552 / 547 against 553, bf16 2048x65536 284 / 283 against 289; rows
// too long for shared memory (f32 past 57344 elements) read back. f32 rows kept in shared memory read input and
// residual and write residual_out with no L2 hints (kAddHints): 4% faster than with them, forward alone, one build, us:
// 8192x16384 522.2 against 545.5, 4096x32768 524.3 against 548.4; bf16 rows ran 4% slower without (4096x32768 293.3
// against 281.2, 2048x65536 294.9 against 284.3), so 16-bit rows keep them in the loop kernel (kPer = 0; the kPer
// kernel below drops them for every dtype). Blocks of any size up to kStreamMaxThreads. kWeight: whether weight is
// given (a runtime test per chunk cost 10-30 registers, and spills for 16-bit inputs).
// Against the kept-in-registers blocks (benchmarks/history/tuning/norm_rows_variants.cu, rms_norm forward,
// bf16 / f32): 2048x65536 140 / 318 us against 190 / 357 (a thread-block cluster per row, the long block),
// 4096x32768 134 / 266 against 153 / 297, 2-6% faster at N = 4096...16384; add_rms_norm 15-27% faster at rows
// longer than its kept units, slower at shorter ones (where it keeps the kept blocks).
constexpr int kStreamMaxThreads = 1024;
constexpr int kAddAgainThreads = 512;  // add_rms_norm's blocks reading input and residual twice (stream_threads)
// The read-twice kernel's launch bound at one vector a thread: four 512-thread blocks an SM, which holds ptxas
// to 32 registers (stream_threads)
constexpr int kAddOneMinBlocks = 4;
constexpr int kStreamInFlight = 4;

// Where the stream kernel finds a row's values for sweep 2: read again (rms_norm: the input, from L1 or L2;
// add_rms_norm: residual_out, from L2), add_rms_norm's residual_out kept in shared memory, or (kInputsAgain)
// add_rms_norm's input and residual read again and added a second time, residual_out stored only then (see
// stream_threads).
enum class Keep { kReadBack, kShared, kInputsAgain };

// Keep::kInputsAgain's loads of one batch: input chunks c, c + threads, ... into x, the residual's into r (all
// of the input's issued first), with L1 use kL1 and L2 policy `policy`.
template <L1Use kL1, typename T, int kC, int kBatch>
__device__ __forceinline__ void load_pair(const T* xr, const T* rr, int c, int threads, uint64_t policy,
                                          AlignedVector<T, kC> (&x)[kBatch], AlignedVector<T, kC> (&r)[kBatch]) {
#pragma unroll
  for (int k = 0; k < kBatch; ++k) x[k] = load_vector_l2<T, kC, kL1>(xr, c + k * threads, policy);
#pragma unroll
  for (int k = 0; k < kBatch; ++k) r[k] = load_vector_l2<T, kC, kL1>(rr, c + k * threads, policy);
}

// One sweep of the stream kernel over this thread's chunks c = threadIdx.x, c + threads, ... (its j-th chunk
// the j-th of them): batch(c, j) takes kBatch of them at once, chunks c, c + threads, ..., c + (kBatch - 1) *
// threads. With kPer > 0 (exactly kPer chunks a thread) a fixed count of batches; else batches while whole
// ones remain, then one(c, j) for each chunk left.
template <int kPer, int kBatch, typename Batch, typename One>
__device__ __forceinline__ void stream_sweep(int threads, int n_chunks, Batch&& batch, One&& one) {
  int c = threadIdx.x;
  if constexpr (kPer > 0) {
#pragma unroll
    for (int b = 0; b < kPer / kBatch; ++b) batch(c + b * kBatch * threads, b * kBatch);
  } else {
    int j = 0;
    for (; c + (kBatch - 1) * threads < n_chunks; c += kBatch * threads, j += kBatch) batch(c, j);
    for (; c < n_chunks; c += threads, ++j) one(c, j);
  }
}

// kPer > 0: rows of exactly kPer vectors a thread (stream_rows), every sweep a fixed number of batches with no loop
// bounds or tails: between a row's loads and its stores (one or two blocks an SM) every instruction is on the
// critical path. add_rms_norm's kPer rows keep residual_out and read input and residual and write residual_out
// without L2 hints, or (Keep::kInputsAgain) read input and residual twice with L1 and L2 priorities; plain rows of
// 4 a thread add Inductor's L1 priorities to the L2 hints (kL1Priorities; stream_rows).
// __launch_bounds__'s minimum of one block an SM lets ptxas use up to 64 registers (add_rms_norm's read-twice
// rows of one vector a thread: kAddOneMinBlocks, 32): without it the kPer kernels
// took 50-51 and ran f32 4096x32768 at 266-269 us against 256 (separate builds); the loop kernel keeps ptxas's own
// choice (32-46 registers; with the minimum it took 56-60 and ran 1-3% slower). Against the loop kernel, forward
// alone through the op, one build, three interleaved do_bench rounds, us (history/log.md, "a tenth session"):
// rms_norm f32 4096x32768 256.0 against 271.2 (torch.compile 256.5), bf16 2048x65536 132.8 against 148.9, bf16
// 4096x32768 (512 threads) 131.2 against 132.1; add_rms_norm bf16 4096x32768 262.0 against 278.9 (Liger 263.4),
// bf16 2048x65536 266.8 against 284.2, f32 8192x16384 513.0 against 521.2, f32 4096x32768 521.4 against 525.9.
// kCluster: add_rms_norm's rows split over the blocks of a cluster (add_stream_cluster), each block its part of
// the row (kPer vectors a thread, residual_out in shared memory), the row's sum added over the cluster.
template <typename T, typename W, int kC, bool kAdd, bool kWeight, Keep kKeep, int kPer = 0, int kThreads = 0,
          bool kCluster = false>
__global__ void __launch_bounds__(kKeep == Keep::kInputsAgain && kPer == 1 ? kAddAgainThreads : kStreamMaxThreads,
                                  kKeep == Keep::kInputsAgain && kPer == 1 ? kAddOneMinBlocks : kPer > 0 ? 1 : 0)
    norm_forward_stream_kernel(const T* __restrict__ x, int64_t x_row_stride, const T* __restrict__ residual,
                               int64_t residual_row_stride, T* __restrict__ h_out, const W* __restrict__ weight,
                               opmath_t<T> offset, T* __restrict__ y, opmath_t<T>* __restrict__ rstd, int64_t rows,
                               int64_t n, opmath_t<T> eps) {
  using A = opmath_t<T>;
  using S = RowSum<T>;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  constexpr bool kKept = kKeep == Keep::kShared;
  constexpr bool kAgain = kKeep == Keep::kInputsAgain;
  // plain rows of 4 vectors a thread: sweep 1 reads with L1 "evict last", sweep 2 "evict first" (stream_rows)
  constexpr bool kL1Priorities = !kAdd && kPer == 4;
  constexpr L1Use kSecondRead = kL1Priorities ? L1Use::kEvictFirst : L1Use::kNoAllocate;  // sweep 2's read-again
  // sweep 1's batch: with kPer, all of a plain row's vectors at once (add_rms_norm's two inputs: up to 4 and 4)
  constexpr int kIn = kPer > 0 && !kAdd ? kPer : kPer > 0 && kPer < kStreamInFlight ? kPer : kStreamInFlight;
  // sweep 2's batch
  constexpr int kOut = kPer > 0 && kPer < kStreamInFlight ? kPer : kStreamInFlight;
  static_assert(kPer % kIn == 0 && kPer % kOut == 0, "whole batches");
  static_assert(kPer == 0 || !kAdd || kKeep != Keep::kReadBack, "add_rms_norm's kPer rows keep residual_out");
  static_assert(!kAgain || (kAdd && (kPer == 1 || kPer == 2 || kPer == 4) && !kCluster),
                "input and residual read again: one batch a sweep");
  __shared__ S scratch[kWarpSize];
  extern __shared__ __align__(16) unsigned char stream_smem[];
  Chunk* kept = reinterpret_cast<Chunk*>(stream_smem) + threadIdx.x;  // kKept: residual_out (see above)
  // kCluster: a row split over the blocks of a cluster, block q taking elements [q, q + 1) * part
  __shared__ S cluster_sums[kCluster ? 2 : 1];
  const int cluster = kCluster ? static_cast<int>(cluster_blocks()) : 1;
  const int64_t part = kCluster ? n / cluster : n, first = kCluster ? cluster_rank() * part : 0;
  const int n_chunks = static_cast<int>(part / kC);  // exact: part % kC == 0; 32-bit (n < 2^31, checked at launch)
  const W* w_part = kWeight ? weight + first : nullptr;
  // kThreads > 0: the block size as a constant, so that the kPer kernel addresses its vectors at fixed offsets
  // from one pointer (add_rms_norm f32 4096x32768 520.8 us against 526.0)
  const int threads = kThreads > 0 ? kThreads : static_cast<int>(blockDim.x);
  const uint64_t keep = l2_policy<L2Evict::kLast>(), drop = l2_policy<L2Evict::kFirst>();
  constexpr bool kAddHints = !(kKeep != Keep::kReadBack && (std::is_same_v<T, float> || kPer > 0));
  auto read_once = [&](const T* base, int c) {  // kAdd: input and residual
    return load_vector_hinted<kAddHints, T, kC>(base, c, drop);
  };
  auto store_residual_out = [&](T* hr, int c, const Chunk& v) {
    store_vector_hinted<kAddHints>(hr, c, v, kKept ? drop : keep);
  };
  int parity = 0;  // kCluster: cluster_row_sum's slots, alternating by row
  for (int64_t row = blockIdx.x / cluster; row < rows; row += gridDim.x / cluster, parity ^= 1) {
    const T* xr = x + row * x_row_stride + first;
    const T* rr = kAdd ? residual + row * residual_row_stride + first : nullptr;
    T* hr = kAdd ? h_out + row * n + first : nullptr;
    T* yr = y + row * n + first;
    auto read = [&](int c) {  // sweep 1's value of chunk c (residual_out with kAdd, which it also stores)
      if constexpr (kAdd) {
        const Chunk v = add_rounded<A>(read_once(xr, c), read_once(rr, c));
        store_residual_out(hr, c, v);
        return v;
      } else if constexpr (kL1Priorities) {
        return load_vector_l2<T, kC, L1Use::kEvictLast>(xr, c, keep);
      } else {
        return load_vector_l2<T, kC>(xr, c, keep);
      }
    };
    // Sweep 1 over chunks c, c + threads, ..., c + (kIn - 1) * threads (the j-th to j + kIn - 1-th of this
    // thread's), all loads issued before any is used.
    S ss = 0;
    auto sweep1_batch = [&](int c, int j) {
      Chunk v[kIn];
      if constexpr (kAgain) {
        // the lines stay in L1 and L2 for sweep 2; nothing is stored yet
        Chunk o[kIn];
        load_pair<L1Use::kEvictLast>(xr, rr, c, threads, keep, v, o);
#pragma unroll
        for (int k = 0; k < kIn; ++k) v[k] = add_rounded<A>(v[k], o[k]);
      } else if constexpr (kAdd) {
        Chunk o[kIn];
#pragma unroll
        for (int k = 0; k < kIn; ++k) v[k] = read_once(xr, c + k * threads);
#pragma unroll
        for (int k = 0; k < kIn; ++k) o[k] = read_once(rr, c + k * threads);
#pragma unroll
        for (int k = 0; k < kIn; ++k) {
          v[k] = add_rounded<A>(v[k], o[k]);
          store_residual_out(hr, c + k * threads, v[k]);
          if constexpr (kKept) kept[(j + k) * threads] = v[k];
        }
      } else if constexpr (kL1Priorities) {
#pragma unroll
        for (int k = 0; k < kIn; ++k) v[k] = load_vector_l2<T, kC, L1Use::kEvictLast>(xr, c + k * threads, keep);
      } else {
#pragma unroll
        for (int k = 0; k < kIn; ++k) v[k] = load_vector_l2<T, kC>(xr, c + k * threads, keep);
      }
#pragma unroll
      for (int k = 0; k < kIn; ++k) ss += chunk_squares<A>(v[k]);
    };
    stream_sweep<kPer, kIn>(threads, n_chunks, sweep1_batch, [&](int c, int j) {
      const Chunk v = read(c);
      if constexpr (kKept) kept[j * threads] = v;
      ss += chunk_squares<A>(v);
    });
    ss = row_sum<true>(ss, scratch);
    if constexpr (kCluster) ss = cluster_row_sum(ss, cluster_sums, parity, cluster);
    const A r = inverse_rms(ss, n, eps);
    if (rstd != nullptr && threadIdx.x == 0 && first == 0) rstd[row] = r;
    const T* again = kAdd ? hr : xr;
    auto write = [&](int c, const Chunk& v, const WChunk& w) {
      store_vector_l2(yr, c, kWeight ? normalize(v, w, r, offset) : normalize(v, r), drop);
    };
    // The weight's chunk c. Under Inductor's priorities (the read-twice rows, plain rows of 4 a thread) a 16-byte
    // weight vector, which every block reads, is kept in L1 and L2.
    auto read_weight = [&](int c) {
      return load_vector_hinted<(kAgain || kL1Priorities) && sizeof(W) == sizeof(T), W, kC, L1Use::kEvictLast>(
          w_part, c, keep);
    };
    auto sweep2_batch = [&](int c, int j) {
      Chunk v[kOut];
      WChunk w[kOut];
      if constexpr (kAgain) {
        Chunk o[kOut];
        load_pair<L1Use::kEvictFirst>(xr, rr, c, threads, drop, v, o);
        if constexpr (kWeight) {
#pragma unroll
          for (int k = 0; k < kOut; ++k) w[k] = read_weight(c + k * threads);
        }
#pragma unroll
        for (int k = 0; k < kOut; ++k) {
          v[k] = add_rounded<A>(v[k], o[k]);
          store_vector<T, kC>(hr, c + k * threads, v[k]);
          store_vector<T, kC>(yr, c + k * threads, kWeight ? normalize(v[k], w[k], r, offset) : normalize(v[k], r));
        }
      } else {
#pragma unroll
        for (int k = 0; k < kOut; ++k) {
          v[k] = kKept ? kept[(j + k) * threads] : load_vector_l2<T, kC, kSecondRead>(again, c + k * threads, drop);
          if constexpr (kWeight) w[k] = read_weight(c + k * threads);
        }
#pragma unroll
        for (int k = 0; k < kOut; ++k) write(c + k * threads, v[k], w[k]);
      }
    };
    stream_sweep<kPer, kOut>(threads, n_chunks, sweep2_batch, [&](int c, int j) {
      const Chunk v = kKept ? kept[j * threads] : load_vector_l2<T, kC, kSecondRead>(again, c, drop);
      write(c, v, kWeight ? read_weight(c) : WChunk{});
    });
  }
  if constexpr (kCluster) cluster_barrier();  // no block exits while a peer may still read its cluster_sums
}

// rms_norm's rows of exactly kPer * 32 vectors (128 or 256: bf16 N = 1024 / 2048, f32 512 / 1024): a warp a
// row, kWarpRowsPerBlock rows a block, the row in registers, summed by the warp's shuffles alone (no barrier),
// as Inductor's kernel does at bf16 65536x1024 (one warp a row); the stream kernel's blocks of 32 or 64 threads
// synchronise a block per row. The input is read "evict last" and the output stored "evict first" in L2, as in
// the stream kernel. At 4 vectors a lane the weight is read with the row, before the sum (at 8 that ran 15%
// slower: bf16 4096x2048 14.2 us against 12.4). Kernel time with the host held ahead, three interleaved rounds,
// us (history/log.md, "a fifteenth session"): bf16 65536x1024 67.5 against the stream blocks' 68.5 (weight read
// after the sum 68.7, torch.compile 66.9), f32 65536x1024 128.3-128.5 (one to four warps a block) against 129.7
// (torch.compile 130.3), bf16 4096x2048 12.4 against 12.8 (Liger 12.8).
constexpr int kWarpRowsPerBlock = 4;

template <typename T, typename W, int kC, bool kWeight, int kPer>
__global__ void __launch_bounds__(kWarpRowsPerBlock * kWarpSize)
    norm_forward_warp_rows_kernel(const T* __restrict__ x, int64_t x_row_stride, const T* __restrict__ residual,
                                  int64_t residual_row_stride, T* __restrict__ h_out, const W* __restrict__ weight,
                                  opmath_t<T> offset, T* __restrict__ y, opmath_t<T>* __restrict__ rstd, int64_t rows,
                                  int64_t n, opmath_t<T> eps) {
  using A = opmath_t<T>;
  using S = RowSum<T>;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  constexpr bool kWeightFirst = kWeight && kPer == 4;
  const int lane = threadIdx.x % kWarpSize;
  const uint64_t keep = l2_policy<L2Evict::kLast>(), drop = l2_policy<L2Evict::kFirst>();
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / kWarpSize; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarpRowsPerBlock) {  // uniform over the warp
    const T* xr = x + row * x_row_stride;
    T* yr = y + row * n;
    Chunk v[kPer];
    WChunk w[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) v[k] = load_vector_l2<T, kC>(xr, lane + k * kWarpSize, keep);
    if constexpr (kWeightFirst) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) w[k] = load_vector<W, kC>(weight, lane + k * kWarpSize);
    }
    S ss = 0;
#pragma unroll
    for (int k = 0; k < kPer; ++k) ss += chunk_squares<A>(v[k]);
#pragma unroll
    for (int k = 0; k < kPer; ++k) keep_packed(v[k]);
    const A r = inverse_rms(warp_sum(ss), n, eps);
    if (rstd != nullptr && lane == 0) rstd[row] = r;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int c = lane + k * kWarpSize;
      if constexpr (kWeight && !kWeightFirst) w[k] = load_vector<W, kC>(weight, c);
      store_vector_l2(yr, c, kWeight ? normalize(v[k], w[k], r, offset) : normalize(v[k], r), drop);
    }
  }
}

// Rows of 256 or 512 vectors on few rows (register_rows): a 128-thread block a row, 2 or 4 vectors a thread,
// the row (add_rms_norm: residual_out, stored at once) kept in registers, read once, the weight read before the
// sum, one barrier a row. Where an SM has few rows to take, a row's latency from its loads to its
// stores is what the kernel's time is made of, and this form, as Liger-Kernel's, has one read in it; the stream
// kernel's second read and the read-twice form's pay off only over more rows. Plain f32 rows read their inputs
// and store "evict first" and keep the weight "evict last" in L1 and L2 (kHints): with them f32 4096x2048 ran
// 19.95 us against 20.80 without; the 16-bit rows and add_rms_norm ran faster without (bf16 4096x4096 21.42
// against 23.84; history/log.md, "a sixteenth session").
constexpr int kRegisterRowThreads = 128;

// (The launch bound is the one the variants were timed with: up to 1024 / kPer threads, rows of up to 1024 vectors.)
template <typename T, typename W, int kC, bool kAdd, bool kWeight, int kPer>
__global__ void __launch_bounds__(1024 / kPer)
    norm_forward_register_rows_kernel(const T* __restrict__ x, int64_t x_row_stride, const T* __restrict__ residual,
                                      int64_t residual_row_stride, T* __restrict__ h_out,
                                      const W* __restrict__ weight, opmath_t<T> offset, T* __restrict__ y,
                                      opmath_t<T>* __restrict__ rstd, int64_t rows, int64_t n, opmath_t<T> eps) {
  using A = opmath_t<T>;
  using S = RowSum<T>;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  constexpr bool kHints = !kAdd && sizeof(T) == 4;
  __shared__ S scratch[2][kWarpSize];
  // A row's threads: whole warps, kPer vectors each; blockDim / row_threads rows a block (launched with one: two
  // ran 0-4% slower). The row guard below also keeps ptxas from sinking the weight's loads and residual_out's
  // stores past the row's shuffles, as it did with one row a block as a constant (no guard); this form's SASS is
  // the one timed (history/tuning/norm_forward_block_rows_variants.py).
  const int row_threads = static_cast<int>(n / kC) / kPer;
  const int per_block = static_cast<int>(blockDim.x) / row_threads;
  const int sub = static_cast<int>(threadIdx.x) / row_threads, t = static_cast<int>(threadIdx.x) % row_threads;
  const int row_warps = row_threads / kWarpSize;
  const uint64_t keep = l2_policy<L2Evict::kLast>(), drop = l2_policy<L2Evict::kFirst>();
  auto read = [&](const T* base, int c) {
    return load_vector_hinted<kHints, T, kC, L1Use::kNoAllocate>(base, c, drop);
  };
  auto write = [&](T* base, int c, const Chunk& v) { store_vector_hinted<kHints>(base, c, v, drop); };
  auto read_weight = [&](int c) {
    return load_vector_hinted<kHints && sizeof(W) == sizeof(T), W, kC, L1Use::kEvictLast>(weight, c, keep);
  };
  int parity = 0;  // group_row_sum's halves, alternating by row group
  for (int64_t group = blockIdx.x; group * per_block < rows; group += gridDim.x, parity ^= 1) {
    const int64_t row = group * per_block + sub;
    const bool valid = row < rows;  // uniform over each warp
    Chunk v[kPer];
    WChunk w[kPer];
    S ss = 0;
    if (valid) {
      const T* xr = x + row * x_row_stride;
#pragma unroll
      for (int k = 0; k < kPer; ++k) v[k] = read(xr, t + k * row_threads);
      if constexpr (kAdd) {
        const T* rr = residual + row * residual_row_stride;
        T* hr = h_out + row * n;
        Chunk o[kPer];
#pragma unroll
        for (int k = 0; k < kPer; ++k) o[k] = read(rr, t + k * row_threads);
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          v[k] = add_rounded<A>(v[k], o[k]);
          write(hr, t + k * row_threads, v[k]);
        }
      }
      if constexpr (kWeight) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) w[k] = read_weight(t + k * row_threads);
      }
#pragma unroll
      for (int k = 0; k < kPer; ++k) ss += chunk_squares<A>(v[k]);
#pragma unroll
      for (int k = 0; k < kPer; ++k) keep_packed(v[k]);
    }
    const S total = group_row_sum(ss, scratch, parity, sub, row_warps);
    if (valid) {
      const A r = inverse_rms(total, n, eps);
      if (rstd != nullptr && t == 0) rstd[row] = r;
      T* yr = y + row * n;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int c = t + k * row_threads;
        write(yr, c, kWeight ? normalize(v[k], w[k], r, offset) : normalize(v[k], r));
      }
    }
  }
}

// Rows a register_rows launch takes at most, per SM: on the H200 (132 SMs) 4224, where the register rows won at
// 4096 rows and lost at 16384 (history/log.md, "a sixteenth session").
constexpr int kRegisterRowsPerSm = 32;

// The vectors a thread of norm_forward_register_rows_kernel takes for rows of `chunks` 16-byte vectors, or 0 where
// other kernels measured faster (f64 rows, not measured, keep them). Kernel time with the host held ahead, three
// interleaved rounds, us, against the launch before: rms_norm f32 4096x2048 (512 vectors) 20.70 against 22.24 (Liger
// 20.22 in an earlier call, where this form took 19.95), 8192x2048 36.35 against 36.93, bf16 4096x4096 21.42 against
// 22.53; add_rms_norm bf16 4096x2048 (256 vectors) 21.01 against 22.18 (torch.compile 20.42 in the earlier call, where
// this form took 20.64), 8192x2048 35.87 against 36.62, f32 4096x2048 36.78 against 37.50. Over more rows it lost:
// rms_norm f32 16384x2048 72.61 against 68.58, bf16 16384x4096 70.27 against 68.59, add_rms_norm f32 8192x2048 68.59
// against 67.41, bf16 16384x4096 135.74 against 129.63. Plain rows of 256 vectors keep the warp rows (bf16 4096x2048:
// 64-thread register rows 12.50 against 12.48). This form's time, unlike the stream kernel's, can depend on what the
// GPU ran just before it, differently from one machine to the next and not through the SM clock: f32 4096x2048 ran
// 20.0-22.6 us across orders and machines (on one machine 21.6-21.8 in every order), the stream kernel 21.7-22.3; after
// a bf16 GEMM the two forms are within 1 us either way (history/log.md, "a seventeenth session"). Kept because the
// bench met more of its bars with it (8-10 of 14 in three runs) than with the stream kernel (6 of 14).
template <bool kAdd>
int register_rows(int64_t chunks, int64_t rows, int device) {
  if (rows > int64_t{kRegisterRowsPerSm} * device_attribute(cudaDevAttrMultiProcessorCount, device)) return 0;
  if (chunks == 4 * kRegisterRowThreads) return 4;
  return kAdd && chunks == 2 * kRegisterRowThreads ? 2 : 0;
}

// Warp rows two at a time: a warp takes adjacent rows 2p and 2p + 1 (the second past the end only when the
// rows are odd), issues both rows' loads before using any, reduces both and loads the weight once for the
// two; the rows of 16-byte vectors that fit the lane's kSlots kept chunks (row_config's warp shapes). Only
// where it measured faster than one row a warp (kWarpPairs below).
template <typename T, typename W, int kSlots, int kC, bool kAdd>
__global__ void __launch_bounds__(kWarpBlockThreads)
    norm_forward_warp_pair_kernel(const T* __restrict__ x, int64_t x_row_stride, const T* __restrict__ residual,
                                  int64_t residual_row_stride, T* __restrict__ h_out, const W* __restrict__ weight,
                                  opmath_t<T> offset, T* __restrict__ y, opmath_t<T>* __restrict__ rstd, int64_t rows,
                                  int64_t n, opmath_t<T> eps) {
  using A = opmath_t<T>;
  using S = RowSum<T>;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  const int n_chunks = static_cast<int>(n / kC);  // exact, and at most kSlots * kWarpSize (row_config)
  const int lane = threadIdx.x % kWarpSize;
  const int per_block = blockDim.x / kWarpSize;
  const int64_t pair_step = static_cast<int64_t>(gridDim.x) * per_block;
  for (int64_t pair = static_cast<int64_t>(blockIdx.x) * per_block + threadIdx.x / kWarpSize; pair * 2 < rows;
       pair += pair_step) {
    const int64_t first = pair * 2;
    const int count = first + 1 < rows ? 2 : 1;  // uniform over the warp
    auto has = [&](int q, int s) { return q < count && lane + s * kWarpSize < n_chunks; };
    Chunk cache[2][kSlots];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (has(q, s)) cache[q][s] = load_vector<T, kC>(x + (first + q) * x_row_stride, lane + s * kWarpSize);
      }
    }
    if constexpr (kAdd) {
      Chunk other[2][kSlots];
#pragma unroll
      for (int q = 0; q < 2; ++q) {
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          if (has(q, s)) {
            other[q][s] = load_vector<T, kC>(residual + (first + q) * residual_row_stride, lane + s * kWarpSize);
          }
        }
      }
#pragma unroll
      for (int q = 0; q < 2; ++q) {
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          if (has(q, s)) {
            cache[q][s] = add_rounded<A>(cache[q][s], other[q][s]);
            store_vector<T, kC>(h_out + (first + q) * n, lane + s * kWarpSize, cache[q][s]);
          }
        }
      }
    }
    S ss[2] = {0, 0};
#pragma unroll
    for (int q = 0; q < 2; ++q) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (has(q, s)) ss[q] += chunk_squares<A>(cache[q][s]);
        keep_packed(cache[q][s]);
      }
    }
    A r[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      r[q] = inverse_rms(warp_sum(ss[q]), n, eps);  // the two rows' shuffles are independent: they interleave
      if (rstd != nullptr && lane == 0 && q < count) rstd[first + q] = r[q];
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int c = lane + s * kWarpSize;
      if (c >= n_chunks) continue;
      if (weight != nullptr) {
        const WChunk w = load_vector<W, kC>(weight, c);
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          if (q < count) store_vector<T, kC>(y + (first + q) * n, c, normalize(cache[q][s], w, r[q], offset));
        }
      } else {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          if (q < count) store_vector<T, kC>(y + (first + q) * n, c, normalize(cache[q][s], r[q]));
        }
      }
    }
  }
}

// Where warp rows go in pairs (history/log.md, "warp rows in pairs"; the forward alone through torchops,
// against one row a warp, us): rms_norm bf16 262144x128 53.2 / 69.1, 131072x512 70.3 / 84.5, 65536x1024
// 69.8 / 70.4, f32 262144x128 70.0 / 76.7; add_rms_norm bf16 262144x128 78.7 / 93.4. Where a lane keeps 8
// chunks the pairs lost (bf16 32768x2048 71.7 / 70.1, add_rms_norm bf16 4096x2048 26.0 / 23.2), and
// add_rms_norm at 4 (bf16 65536x1024 135.4 / 134.5; f32 131072x512 267.4 / 263.6): a pair's input and
// residual take twice the registers (140 a thread at 4 chunks, 3 blocks an SM). Plain rows of 128 vectors
// or more (bf16 65536x1024 among them) have since moved to the stream blocks (stream_threads).
template <int kSlots, bool kAdd>
constexpr bool kWarpPairs = kAdd ? kSlots == 1 : kSlots <= 4;

// The pointers of one forward launch.
template <typename T, typename W>
struct ForwardArgs {
  const T* x;
  int64_t x_row_stride;
  const T* residual;  // null: plain rms_norm
  int64_t residual_row_stride;
  T* h_out;
  const W* weight;
  T* y;
  opmath_t<T>* rstd;
};

// Launches a forward kernel: they all take one launch's pointers, offset and eps in the same order. In
// clusters of `cluster` blocks where it is more than 1 (blocks a multiple of it).
template <typename T, typename W, typename... Params>
void launch_forward_kernel(void (*kernel)(Params...), unsigned int blocks, int threads, size_t smem,
                           cudaStream_t stream, const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps,
                           double offset, int cluster = 1) {
  using A = opmath_t<T>;
  launch_in_clusters(kernel, blocks, threads, smem, cluster, stream, a.x, a.x_row_stride, a.residual,
                     a.residual_row_stride, a.h_out, a.weight, static_cast<A>(offset), a.y, a.rstd, rows, n,
                     static_cast<A>(eps));
}

// add_rms_norm keeps two rows' worth in sweep 1 (input and residual): at 8 units a thread ptxas spilled
// ~400 bytes a thread, and its forward ran at ~60% of copy bandwidth.
struct AddForwardShapes {
  static constexpr int kUnits = 4, kThreads = 512, kLongUnits = 4, kLongThreads = 512, kMinBlocks = 1;
};

// The stream block for rows of `chunks` 16-byte vectors, or 0 where the kept-in-registers blocks were
// measured faster (rows of fewer than 128 vectors; add_rms_norm's rows up to its kept units). Plain rows: 4
// vectors a thread (one sweep-1 batch) from 32 to 512 threads, 512 up to 4096 vectors, then 1024. From 128
// vectors (f32 N = 512, 16-bit 1024) they beat the warp rows, forward alone, one build, us: f32 65536x1024 /
// 131072x512 / 4096x2048 131.7 / 131.8 / 21.9 against 135.8 / 136.4 / 22.7, bf16 4096x2048 / 32768x2048 12.4 /
// 69.2 against 13.0 / 70.2, bf16 65536x1024 even (69.9 against 69.6); at 64 vectors they lost (f32 262144x256
// 166.7 against 137.3, bf16 131072x512 87.1 against 70.7). Sweep 2 reads a row
// again from L1 only while the rows in flight on an SM fit it: at 1024 threads one or two long rows do; at
// 512 threads those rows fell out of L1 and ran 13-27% slower. 512 threads for 2048-4096 vectors, unless
// the blocks an SM holds at once then bring more rows than kStreamL1Bytes (stream_fits_l1): bf16 with a
// weight takes 32 registers, four 512-thread blocks an SM, and its 64 KiB rows at 4096x32768 ran 143 us
// at 512 threads against 132 at 1024 (768: 155; history/tuning/rms_norm_kernels.py); f32 (46 registers,
// two blocks) keeps 512. 672-thread blocks ran f32 8192x16384 at 389 us against 255 (a thread's 6-7
// vectors need more dependent rounds than 2 full batches).
// Plain rows of exactly 128 or 256 vectors go a warp a row instead (norm_forward_warp_rows_kernel), and rows of
// 512 vectors (add_rms_norm's of 256 too) on at most kRegisterRowsPerSm rows an SM a block a row in registers
// (register_rows).
// add_rms_norm: 1024-thread blocks from rows of 2048 vectors up (but 2048 exactly: below), measured fastest when it
// read residual_out back from L2 (its rows do not fit L1 at any size); they keep that size with residual_out in shared
// memory (stream_rows). Rows of 128 to 512 vectors in whole warps (bf16 N = 1024-4096, f32 512-2048) and of exactly
// 1024 or 2048 (bf16 N = 8192 / 16384, f32 4096 / 8192) read input and residual twice, as Inductor's kernel for
// `F.rms_norm(x + r), x + r` does: one vector a thread in blocks of one row's vectors, or kAddAgainThreads threads
// with 2 or 4 vectors each. Sweep 1 reads both with L1 and L2 "evict last" and stores nothing; sweep 2 reads them
// again "evict first" (mostly from L1), adds them again and stores residual_out and the output. Other rows under
// 2048 vectors take the kept blocks. The 1024 and 2048 rows, written apart from the library
// (benchmarks/history/tuning/norm_add_mid_variants.cu, history/log.md, "a fourteenth session"), us, against the
// library's launch before: bf16 16384x8192 254.6 against 261.5, 8192x16384 256.6 against 263.0; f32 32768x4096
// 498.7 against 519.7, 16384x8192 511.9 against 515.0; the same form without hints, or with L1 or L2 priorities
// alone, ran even with the library or slower, and at 1024 threads 5-17% slower. The rows of one vector a thread,
// through the op, kernel time with the host held ahead, three interleaved rounds, us (history/log.md, "a fifteenth
// session"): bf16 32768x4096 252.1 against the kept blocks' 265.0 (Liger 266.8), f32 4096x2048 37.3 against 38.9
// (Liger 37.2), bf16 65536x1024 129.8 against 132.3 in 32-thread blocks of 4 vectors a thread with residual_out in
// registers (torch.compile 131.4), f32 65536x1024 253.7 against 258.7 (Liger 259.3); bf16 4096x2048 even (21.9
// against 21.7, rounds 21.0-21.8; Liger 20.5). Without the four-block launch bound the kernel took 43 registers
// and ran bf16 32768x4096 at 359 us.
template <bool kAdd>
int stream_threads(int64_t chunks) {
  if constexpr (kAdd) {
    if (chunks % kWarpSize == 0 && chunks >= 4 * kWarpSize && chunks <= kAddAgainThreads) {
      return static_cast<int>(chunks);
    }
    if (chunks == 2 * kAddAgainThreads || chunks == 4 * kAddAgainThreads) return kAddAgainThreads;
    if (chunks >= int64_t{AddForwardShapes::kThreads} * AddForwardShapes::kUnits) return kStreamMaxThreads;
    return 0;
  } else {
    if (chunks < 4 * kWarpSize) return 0;
    if (chunks <= 4 * 512) return round_to_warps(chunks / 4);
    return chunks <= 4096 ? 512 : kStreamMaxThreads;
  }
}

// The bytes of rows in flight on an SM that sweep 2 still finds in L1 (of its 256 KiB with no shared memory
// in use): three 64 KiB rows did, four did not.
constexpr int64_t kStreamL1Bytes = 192 * 1024;

// Whether `threads`-thread blocks of `kernel`, as many as an SM holds at once, keep their rows in L1.
template <typename Kernel>
bool stream_fits_l1(Kernel kernel, OccupancyCache& occupancy, int device, int threads, int64_t row_bytes) {
  const int resident = occupancy.get(device, threads, 0, [&] { return resident_blocks_per_sm(kernel, threads); });
  return resident * row_bytes <= kStreamL1Bytes;
}

// How norm_forward_stream_kernel takes rows of `chunks` vectors in `threads`-thread blocks: kPer (0: the
// loop kernel), where sweep 2 finds the row, and the blocks of the cluster a row is split over (1: none).
struct StreamRows {
  int per;
  Keep keep;
  int cluster = 1;
};

// add_rms_norm's rows whose residual_out does not fit one block's shared memory (f32 past 57344 elements,
// 16-bit past 114688): the fewest blocks of a cluster (sm_90+) whose parts are exactly 4 or 8 vectors a
// thread of kStreamMaxThreads threads and fit `smem_limit`; 1 where none does (the row is then read back).
// Each block keeps its part in shared memory and the blocks add their sums through distributed shared memory
// (cluster_row_sum): f32 2048x65536, forward alone, one build, 571.3 us against 584.1 read back from L2
// (torch.compile 695.5; history/log.md, "an eleventh session"), 90% of copy in the bench (was 88%).
inline int add_stream_cluster(int64_t chunks, size_t smem_limit, int device) {
  if (device_attribute(cudaDevAttrComputeCapabilityMajor, device) < 9) return 1;
  for (int cluster = 2; cluster <= kMaxClusterBlocks; ++cluster) {
    const int64_t threads = int64_t{cluster} * kStreamMaxThreads;
    const int64_t per = chunks % threads == 0 ? chunks / threads : 0;
    if ((per == 4 || per == 8) && static_cast<size_t>(chunks / cluster) * kVectorBytes <= smem_limit) return cluster;
  }
  return 1;
}

// Plain rows: exactly 8 vectors a thread take the kPer kernel, and so do exactly 4 in blocks of 128-256 threads
// (rows of 512-1024 vectors: bf16 N = 4096 / 8192, f32 2048 / 4096), with Inductor's L1 priorities on top of the
// L2 hints (sweep 1 "evict last", sweep 2 "evict first"). Kernel time with the host held ahead, three interleaved
// rounds, us (history/log.md, "a fifteenth session"): bf16 16384x8192 128.6 against the loop kernel's 130.4
// (torch.compile 128.3), f32 32768x4096 252.4 against 253.5 (252.1), bf16 32768x4096 129.8 against 129.9; the
// kPer kernel with or without the L1 priorities ran even at f32 32768x4096 and bf16 32768x4096. Other plain rows of
// 4 stay on the loop kernel: in blocks of 64 threads (bf16 4096x2048 13.5 against 12.4) and 512 (8192x16384
// 138.6 against 130.5) the straight-line kernel lost; holding the row in registers instead of reading it
// again lost 4-11% (f32 16384x8192 271.3 against 256.3, bf16 16384x8192 143.4 against 130.8). Plain rows
// longer than 8 vectors a thread read back from L2: split over a cluster into parts of exactly 8 (each block
// reading its 128 KiB part again from L1, as one block does a bf16 65536 row) they lost 5-19%, forward alone,
// one build, us: f32 2048x65536 372.7 against 318.5, bf16 1024x131072 202.1 against 188.4, f16 2048x131072
// 372.7 against 330.4 (only f64 1024x65536 gained, 371.3 against 388.5).
// add_rms_norm reads input and residual twice in blocks of up to kAddAgainThreads (stream_threads: 1, 2 or 4
// vectors a thread), else keeps residual_out in shared memory where the row fits (`fits_smem`; with `cluster` >
// 1, `chunks` is one block's part of a row split by add_stream_cluster), else it reads it back. At 4 vectors a
// thread of 1024 shared memory and registers ran even (bf16 4096x32768 260.3 / 260.8, f32 8192x16384 512.0 /
// 512.7; history/log.md, "an eleventh session").
template <bool kAdd>
StreamRows stream_rows(int64_t chunks, int threads, bool fits_smem, int cluster = 1) {
  const int per = chunks % threads == 0 ? static_cast<int>(chunks / threads) : 0;
  if constexpr (kAdd) {
    if (cluster > 1) return {per, Keep::kShared, cluster};  // `chunks` is a block's part (add_stream_cluster)
    if (threads <= kAddAgainThreads) return {per, Keep::kInputsAgain};  // stream_threads: per is 1, 2 or 4
    if (!fits_smem) return {0, Keep::kReadBack};
    return {per == 4 || per == 8 ? per : 0, Keep::kShared};
  } else {
    const bool straight = per == 8 || (per == 4 && threads >= 4 * kWarpSize && threads <= 8 * kWarpSize);
    return {straight ? per : 0, Keep::kReadBack};
  }
}

// The stream kernel that takes `rows` (stream_rows), weight given or not. add_rms_norm's 512- and 1024-thread
// kPer kernels take the block size as a constant, but at one vector a thread (blocks of 128-512 threads, one
// row's vectors) read it from blockDim.
template <typename T, typename W, int kC, bool kAdd, bool kWeight>
auto stream_kernel_for(StreamRows rows) {
  constexpr int kFixed = kStreamMaxThreads;
  if constexpr (kAdd) {
    if (rows.keep == Keep::kInputsAgain) {
      constexpr int kAgain = kAddAgainThreads;
      if (rows.per == 1) return norm_forward_stream_kernel<T, W, kC, kAdd, kWeight, Keep::kInputsAgain, 1>;
      return rows.per == 2 ? norm_forward_stream_kernel<T, W, kC, kAdd, kWeight, Keep::kInputsAgain, 2, kAgain>
                           : norm_forward_stream_kernel<T, W, kC, kAdd, kWeight, Keep::kInputsAgain, 4, kAgain>;
    }
    if (rows.cluster > 1) {
      return rows.per == 4 ? norm_forward_stream_kernel<T, W, kC, kAdd, kWeight, Keep::kShared, 4, kFixed, true>
                           : norm_forward_stream_kernel<T, W, kC, kAdd, kWeight, Keep::kShared, 8, kFixed, true>;
    }
    if (rows.keep == Keep::kShared) {
      if (rows.per == 4) return norm_forward_stream_kernel<T, W, kC, kAdd, kWeight, Keep::kShared, 4, kFixed>;
      if (rows.per == 8) return norm_forward_stream_kernel<T, W, kC, kAdd, kWeight, Keep::kShared, 8, kFixed>;
      return norm_forward_stream_kernel<T, W, kC, kAdd, kWeight, Keep::kShared>;
    }
  } else {
    if (rows.per == 4) return norm_forward_stream_kernel<T, W, kC, kAdd, kWeight, Keep::kReadBack, 4>;
    if (rows.per == 8) return norm_forward_stream_kernel<T, W, kC, kAdd, kWeight, Keep::kReadBack, 8>;
  }
  return norm_forward_stream_kernel<T, W, kC, kAdd, kWeight, Keep::kReadBack>;
}

template <typename T, typename W, int kC, bool kAdd>
auto stream_kernel(bool weighted, StreamRows rows) {
  return weighted ? stream_kernel_for<T, W, kC, kAdd, true>(rows) : stream_kernel_for<T, W, kC, kAdd, false>(rows);
}

template <typename T, typename W, int kC, bool kAdd>
void launch_forward(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps, double offset,
                    cudaStream_t stream) {
  using Shapes = std::conditional_t<kAdd, AddForwardShapes, ForwardShapes>;
  // The kernels' column loops step a 32-bit index by up to kStreamInFlight blocks of threads: it must not wrap.
  constexpr int64_t kMaxStep = int64_t{1} << 16;
  static_assert(int64_t{kStreamMaxThreads} * kStreamInFlight * kC <= kMaxStep, "a step of the column loops");
  TORCH_CHECK(n < (int64_t{1} << 31) - kMaxStep,
              "rms_norm: rows of 2^31 - 2^16 elements or more are not supported on CUDA, got ", n);
  if constexpr (kC > 1) {
    const int64_t chunks = n / kC;
    const int device = c10::cuda::current_device();
    if constexpr (!std::is_same_v<T, double>) {
      if (const int per = register_rows<kAdd>(chunks, rows, device); per > 0) {
        auto pick = [&](auto per_c) {
          constexpr int kPer = decltype(per_c)::value;
          return a.weight != nullptr ? norm_forward_register_rows_kernel<T, W, kC, kAdd, true, kPer>
                                     : norm_forward_register_rows_kernel<T, W, kC, kAdd, false, kPer>;
        };
        auto kernel = pick(std::integral_constant<int, 4>{});
        if constexpr (kAdd) {
          if (per == 2) kernel = pick(std::integral_constant<int, 2>{});
        }
        launch_forward_kernel(kernel, blocks_to_cover(rows, 1), kRegisterRowThreads, 0, stream, a, rows, n, eps,
                              offset);
        return;
      }
    }
    if constexpr (!kAdd) {
      if (chunks == 4 * kWarpSize || chunks == 8 * kWarpSize) {
        auto pick = [&](auto per) {
          constexpr int kPer = decltype(per)::value;
          return a.weight != nullptr ? norm_forward_warp_rows_kernel<T, W, kC, true, kPer>
                                     : norm_forward_warp_rows_kernel<T, W, kC, false, kPer>;
        };
        const auto kernel = chunks == 4 * kWarpSize ? pick(std::integral_constant<int, 4>{})
                                                    : pick(std::integral_constant<int, 8>{});
        launch_forward_kernel(kernel, blocks_to_cover(rows, kWarpRowsPerBlock), kWarpRowsPerBlock * kWarpSize, 0,
                              stream, a, rows, n, eps, offset);
        return;
      }
    }
    int threads = stream_threads<kAdd>(chunks);
    if (threads > 0) {
      const bool weighted = a.weight != nullptr;
      const size_t smem_limit = row_kernel_smem_limit<T>(device);
      // kAdd: residual_out's row (each block's part of it, in a cluster) in shared memory where it fits; kAdd's
      // blocks are not resized below
      auto smem_for = [&](int64_t part) {
        return static_cast<size_t>((part + threads - 1) / threads) * threads * kVectorBytes;
      };
      int cluster = 1;
      if constexpr (kAdd) {
        if (smem_for(chunks) > smem_limit) cluster = add_stream_cluster(chunks, smem_limit, device);
      }
      const size_t row_smem = smem_for(chunks / cluster);
      StreamRows plan = stream_rows<kAdd>(chunks / cluster, threads, kAdd && row_smem <= smem_limit, cluster);
      auto kernel = stream_kernel<T, W, kC, kAdd>(weighted, plan);
      // the kernels' static shared memory: row_sum's scratch and (kCluster) cluster_sums
      constexpr size_t kStaticBytes = kRowSumScratchBytes<T> + 2 * sizeof(RowSum<T>);
      if (plan.cluster > 1) {
        static OccupancyCache cluster_occupancy[2];  // [weighted]
        allow_shared_memory(kernel, row_smem, kStaticBytes);
        if (cluster_occupancy[weighted].get(
                device, threads, row_smem,
                [&] { return resident_clusters(kernel, threads, row_smem, plan.cluster); }, plan.cluster) == 0) {
          // no cluster of these blocks fits the device: one block a row, reading residual_out back (no shared
          // memory)
          plan = stream_rows<kAdd>(chunks, threads, false);
          kernel = stream_kernel<T, W, kC, kAdd>(weighted, plan);
        }
      }
      static OccupancyCache occupancy[2][3];  // the plain kernels: [weighted][kPer / 4]
      if (!kAdd && threads < kStreamMaxThreads &&
          !stream_fits_l1(kernel, occupancy[weighted][plan.per / 4], device, threads,
                          n * static_cast<int64_t>(sizeof(T)))) {
        threads = kStreamMaxThreads;
        plan = stream_rows<kAdd>(chunks, threads, false);
        kernel = stream_kernel<T, W, kC, kAdd>(weighted, plan);
      }
      const size_t smem = plan.keep == Keep::kShared ? row_smem : 0;
      allow_shared_memory(kernel, smem, kStaticBytes);
      // a cluster a row: blocks_to_cover's cap, in whole clusters
      const int64_t groups = std::min<int64_t>(blocks_to_cover(rows, 1), INT32_MAX / plan.cluster);
      const auto blocks = static_cast<unsigned int>(groups * plan.cluster);
      launch_forward_kernel(kernel, blocks, threads, smem, stream, a, rows, n, eps, offset, plan.cluster);
      return;
    }
  }
  const RowConfig cfg = row_config<T, Shapes, kC>(n);
  with_row_shape<T, kC, Shapes>(cfg, [&](auto slots, auto block_per_row, auto max_threads, auto min_blocks) {
    constexpr int kSlots = decltype(slots)::value;
    constexpr bool kPairs = kC > 1 && !decltype(block_per_row)::value && kWarpPairs<kSlots, kAdd>;
    if constexpr (kPairs) {
      launch_forward_kernel(norm_forward_warp_pair_kernel<T, W, kSlots, kC, kAdd>,
                            blocks_to_cover(rows, 2 * cfg.rows_per_block()), cfg.threads, 0, stream, a, rows, n, eps,
                            offset);
    } else if constexpr (kC > 1 && !kAdd) {
      // Plain rows of vectors get here under 128 vectors only (the rest stream: stream_threads), which are
      // warp rows of up to 4 vectors a lane, all in pairs: no kernel is instantiated for the other shapes.
      TORCH_INTERNAL_ASSERT(false, "rms_norm: no forward kernel for rows of ", n, " elements");
    } else {
      launch_forward_kernel(norm_forward_kernel<T, W, kSlots, kC, decltype(block_per_row)::value, kAdd,
                                                decltype(max_threads)::value, decltype(min_blocks)::value>,
                            blocks_to_cover(rows, cfg.rows_per_block()), cfg.threads, 0, stream, a, rows, n, eps,
                            offset);
    }
  });
}

// add_rms_norm's launch (add_rms_norm.cu), for the dtype pairs of dispatch_norm_types.
template <typename T, typename W>
void launch_add_forward(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps, double offset, bool vectors,
                        cudaStream_t stream);

}  // namespace rms_norm_kernels
}  // namespace torchops
