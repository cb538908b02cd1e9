// The normalisations' backward kernels on the CUDA row engine (norm/norm_cuda.cuh), in the two forms of
// norm/norm_plan.h, and their launch from a plan. Over the normalised rows h (rms_norm's and layer_norm's input,
// add_rms_norm's residual_out), with g = dy * (weight + offset) (dy without a weight), mean 0 for rms_norm:
//   dx = rstd * g - rstd * mean(g) [layer_norm] - rstd^3 * (h - mean) * mean(g * (h - mean)) (+ grad_residual_out)
//   dweight = sum over rows of dy * (h - mean) * rstd,   dbias = sum over rows of dy   [layer_norm]
// Each row group (a block or a cluster) takes a contiguous chunk of rows and writes one partial row of dweight
// (and dbias) in RowSum<T>; the engine's column reduction sums the partial rows in group order. No atomics: the
// gradients are bit-identical from run to run on a device. norm_backward_{rms,layer}.cu instantiate it.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../core/empty.h"
#include "../norm/norm_cuda.cuh"
#include "../norm/norm_plan.h"

namespace torchops {
namespace norm_cuda {

// The pointers and scalars of one backward launch (null where absent or not wanted).
template <typename T, typename W>
struct BackwardArgs {
  Rows<T> dy;
  Rows<T> h;
  Rows<T> dres;  // added to dx (add_rms_norm's grad_residual_out)
  const W* weight;
  const opmath_t<T>* mean;  // layer_norm
  const opmath_t<T>* rstd;
  T* dx;
  RowSum<T>* dw_partial;  // [groups, n] (kept rows: [groups * rows a block, n] when in global memory)
  RowSum<T>* db_partial;  // layer_norm's dbias, as dw_partial
  int64_t rows;
  int n;
  int64_t rows_per_group;
  int part_chunks;  // staged rows in a cluster: a block's chunks of a row
  opmath_t<T> offset;
};

template <typename T, typename W>
using BackwardKernel = void (*)(BackwardArgs<T, W>);

// A chunk's terms of the backward (kLayer: layer_norm). `scale` multiplies dy by (w + offset).
template <bool kLayer, typename T>
struct BackMath {
  using A = opmath_t<T>;
  using S = RowSum<T>;
  static constexpr int kStats = kLayer ? 2 : 1;
  using Stats = Sums<S, kStats>;

  // Adds the chunk's sum of g * (h - mean) (and, layer_norm, of g) to s.
  template <typename W, int kC>
  __device__ static __forceinline__ void add_chunk(Stats& s, const AlignedVector<T, kC>& hv,
                                                   const AlignedVector<T, kC>& gv, const AlignedVector<W, kC>& wv,
                                                   bool scale, A offset, A mean) {
    A d = 0, d1 = 0;
#pragma unroll
    for (int e = 0; e < kC; ++e) {
      A g = static_cast<A>(gv.val[e]);
      if (scale) g *= static_cast<A>(wv.val[e]) + offset;
      d += g * (kLayer ? static_cast<A>(hv.val[e]) - mean : static_cast<A>(hv.val[e]));
      if constexpr (kLayer) d1 += g;
    }
    s.v[0] += d;
    if constexpr (kLayer) s.v[1] += d1;
  }

  // add_chunk for 16-bit inputs with dweight's (and dbias') terms in the same sweep: p = dy * (h - mean) once,
  // dw += p * rstd and the row sum's (w + offset) * p. Rounded explicitly (__fmul_rn / __fmaf_rn): left to the
  // compiler, the copies with and without dweight contracted differently, and dx's bits then depended on
  // whether dweight was asked for.
  template <typename W, int kC>
  __device__ static __forceinline__ void add_chunk_and_params(Stats& s, const AlignedVector<T, kC>& hv,
                                                              const AlignedVector<T, kC>& gv,
                                                              const AlignedVector<W, kC>& wv, bool scale, A offset,
                                                              A mean, bool want_dw, bool want_db, A r, S (&dw)[kC],
                                                              S (&db)[kC]) {
    static_assert(is_16bit_float<T>, "f32 partial sums: 16-bit inputs only");
    float d = 0, d1 = 0;
#pragma unroll
    for (int e = 0; e < kC; ++e) {
      const float dy = static_cast<float>(gv.val[e]);
      const float hc = kLayer ? __fsub_rn(static_cast<float>(hv.val[e]), mean) : static_cast<float>(hv.val[e]);
      const float p = __fmul_rn(dy, hc);
      if (want_dw) dw[e] = __fmaf_rn(p, r, dw[e]);
      if (kLayer && want_db) db[e] = __fadd_rn(db[e], dy);
      const float ws = scale ? static_cast<float>(wv.val[e]) + offset : 1.0f;
      d = scale ? __fmaf_rn(ws, p, d) : __fadd_rn(d, p);
      if constexpr (kLayer) d1 = scale ? __fmaf_rn(ws, dy, d1) : __fadd_rn(d1, dy);
    }
    s.v[0] += d;
    if constexpr (kLayer) s.v[1] += d1;
  }

  // The row's coefficients from its reduced sums: dx = r * g - c1 - xhat * c2, xhat = (h - mean) * r, so no term
  // under- or overflows before the result does (c2 = r * mean(g * xhat), c1 = r * mean(g)).
  __device__ static __forceinline__ void coefficients(const Stats& s, int n, A r, A& c1, A& c2) {
    c2 = static_cast<A>(static_cast<S>(r) * (static_cast<S>(r) * s.v[0]) / static_cast<S>(n));
    c1 = kLayer ? static_cast<A>(static_cast<S>(r) * s.v[kStats - 1] / static_cast<S>(n)) : A(0);
  }

  // dx of a chunk (+ extra, add_rms_norm's grad_residual_out, when kExtra).
  template <bool kExtra, typename W, int kC>
  __device__ static __forceinline__ AlignedVector<T, kC> input_grad(const AlignedVector<T, kC>& hv,
                                                                    const AlignedVector<T, kC>& gv,
                                                                    const AlignedVector<W, kC>& wv, bool scale,
                                                                    A offset, A mean, A r, A c1, A c2,
                                                                    const AlignedVector<T, kC>& extra) {
    AlignedVector<T, kC> out;
#pragma unroll
    for (int e = 0; e < kC; ++e) {
      A g = static_cast<A>(gv.val[e]);
      if (scale) g *= static_cast<A>(wv.val[e]) + offset;
      const A xhat = (kLayer ? static_cast<A>(hv.val[e]) - mean : static_cast<A>(hv.val[e])) * r;
      A v = r * g - xhat * c2;
      if constexpr (kLayer) v -= c1;
      if constexpr (kExtra) v += static_cast<A>(extra.val[e]);
      out.val[e] = static_cast<T>(v);
    }
    return out;
  }

  // dweight's and dbias' terms of a chunk, added in S.
  template <int kC>
  __device__ static __forceinline__ void add_params(const AlignedVector<T, kC>& hv, const AlignedVector<T, kC>& gv,
                                                    A mean, A r, bool want_dw, bool want_db, S (&dw)[kC],
                                                    S (&db)[kC]) {
#pragma unroll
    for (int e = 0; e < kC; ++e) {
      const A dy = static_cast<A>(gv.val[e]);
      const A hc = kLayer ? static_cast<A>(hv.val[e]) - mean : static_cast<A>(hv.val[e]);
      if (want_dw) dw[e] += static_cast<S>(dy * hc * r);
      if (kLayer && want_db) db[e] += static_cast<S>(dy);
    }
  }
};

// ------------------------------------------------------------------------------------------------ kept rows
// A warp (kBlockPerRow: a block) a row, kSlots chunks a thread kept in registers, a longer row's rest read twice
// (the dot product, then dx: "evict last", then "evict first"). Every load of the kept part (h, dy and the
// weight) is issued before any is used. dweight (and dbias) accumulate per row processor in its own row of
// `acc` (shared memory, or the group's rows of the partials in global memory when a row's worth does not fit),
// element-major (element e of chunk c at e * n_chunks + c, so a warp's lanes hit consecutive banks), summed in
// processor order at the end.
template <bool kBlockPerRow>
struct Processor {
  __device__ static int tid() { return kBlockPerRow ? threadIdx.x : threadIdx.x % kWarpSize; }
  __device__ static int threads() { return kBlockPerRow ? blockDim.x : kWarpSize; }
  __device__ static int per_block() { return kBlockPerRow ? 1 : blockDim.x / kWarpSize; }
  __device__ static int in_block() { return kBlockPerRow ? 0 : threadIdx.x / kWarpSize; }
};

template <typename T, typename W, int kC, bool kLayer, int kSlots, bool kBlockPerRow, bool kSmemAcc>
__global__ void __launch_bounds__(kBlockPerRow ? kKeptThreads : 4 * kWarpSize, 1)
    norm_kept_rows_backward_kernel(BackwardArgs<T, W> a) {
  using M = BackMath<kLayer, T>;
  using A = opmath_t<T>;
  using S = RowSum<T>;
  using P = Processor<kBlockPerRow>;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  __shared__ S scratch[2][M::kStats][kWarpSize];
  constexpr int kRestUnroll = kBlockPerRow ? 4 : 1;  // in a warp kernel the rest never runs
  constexpr bool kVec = sizeof(T) * kC == kVectorBytes;
  const int n = a.n, n_chunks = n / kC, procs = P::per_block();
  const bool want_dw = a.dw_partial != nullptr, want_db = kLayer && a.db_partial != nullptr;  // uniform
  const int params = static_cast<int>(want_dw) + static_cast<int>(want_db);
  // accumulator rows: [param][proc][n] in shared memory, element-major (idx); else each processor's own partial
  // row in global memory (natural order), [block * procs + proc][n]
  const int64_t own = kSmemAcc ? P::in_block() : static_cast<int64_t>(blockIdx.x) * procs + P::in_block();
  S* smem_acc = reinterpret_cast<S*>(dynamic_smem);
  S* dw_acc = kSmemAcc ? smem_acc + own * n : (want_dw ? a.dw_partial + own * n : nullptr);
  S* db_acc = kSmemAcc ? smem_acc + (static_cast<int>(want_dw) * procs + own) * n
                       : (want_db ? a.db_partial + own * n : nullptr);
  auto idx = [&](int e, int c) { return kSmemAcc ? e * n_chunks + c : c * kC + e; };
  if (params > 0) {
    if constexpr (kSmemAcc) {
      for (int i = threadIdx.x; i < params * procs * n; i += blockDim.x) smem_acc[i] = S(0);
    } else {
      for (int i = P::tid(); i < n; i += P::threads()) {
        if (want_dw) dw_acc[i] = S(0);
        if (want_db) db_acc[i] = S(0);
      }
    }
    __syncthreads();
  }
  auto accumulate = [&](int c, const Chunk& hv, const Chunk& gv, A mean, A r) {
    S dw[kC], db[kC];
#pragma unroll
    for (int e = 0; e < kC; ++e) {  // all loads before any store: the compiler cannot tell the addresses apart
      dw[e] = want_dw ? dw_acc[idx(e, c)] : S(0);
      db[e] = want_db ? db_acc[idx(e, c)] : S(0);
    }
    M::add_params(hv, gv, mean, r, want_dw, want_db, dw, db);
#pragma unroll
    for (int e = 0; e < kC; ++e) {
      if (want_dw) dw_acc[idx(e, c)] = dw[e];
      if (want_db) db_acc[idx(e, c)] = db[e];
    }
  };
  const bool scale = a.dx != nullptr && a.weight != nullptr;  // the weight enters dx only
  const uint64_t keep = kVec && kBlockPerRow ? l2_policy<L2Evict::kLast>() : 0;
  const uint64_t drop = kVec && kBlockPerRow ? l2_policy<L2Evict::kFirst>() : 0;
  const int tid = P::tid(), threads = P::threads();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * a.rows_per_group;
  const int64_t end = begin + a.rows_per_group < a.rows ? begin + a.rows_per_group : a.rows;
  int parity = 0;
  for (int64_t row = begin + P::in_block(); row < end; row += procs, parity ^= 1) {  // uniform over the processor
    const T* dyr = a.dy.row(row);
    const T* hr = a.h.row(row);
    const A r = a.rstd[row];
    const A mean = kLayer ? a.mean[row] : A(0);
    Chunk hc[kSlots], gc[kSlots];
    WChunk wc[kSlots];
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int c = tid + k * threads;
      if (c < n_chunks) {
        hc[k] = load_vector<T, kC>(hr, c);
        gc[k] = load_vector<T, kC>(dyr, c);
        if (scale) wc[k] = load_vector<W, kC>(a.weight, c);
      }
    }
    if (a.dx != nullptr) {
      typename M::Stats s = zero_sums<S, M::kStats>();
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        if (tid + k * threads < n_chunks) M::add_chunk(s, hc[k], gc[k], wc[k], scale, a.offset, mean);
      }
#pragma unroll kRestUnroll
      for (int c = tid + kSlots * threads; c < n_chunks; c += threads) {
        const WChunk w = scale ? load_vector<W, kC>(a.weight, c) : WChunk{};
        M::add_chunk(s, read_chunk<T, kC>(hr, c, keep, kVec), read_chunk<T, kC>(dyr, c, keep, kVec), w, scale,
                     a.offset, mean);
      }
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {  // converted again for dx, not kept live over the reduction
        keep_packed(hc[k]);
        keep_packed(gc[k]);
        keep_packed(wc[k]);
      }
      s = kBlockPerRow ? warps_sum(s, scratch, parity, 0, threads / kWarpSize) : lanes_sum(s, kWarpSize);
      A c1, c2;
      M::coefficients(s, n, r, c1, c2);
      T* dxr = a.dx + row * n;
      const T* dresr = a.dres.data != nullptr ? a.dres.row(row) : nullptr;
      auto dx_chunk = [&](int c, const Chunk& hv, const Chunk& gv, const WChunk& w) {
        if (dresr != nullptr) {
          return M::template input_grad<true>(hv, gv, w, scale, a.offset, mean, r, c1, c2,
                                              load_vector<T, kC>(dresr, c));
        }
        return M::template input_grad<false>(hv, gv, w, scale, a.offset, mean, r, c1, c2, hv);
      };
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        const int c = tid + k * threads;
        if (c < n_chunks) store_vector<T, kC>(dxr, c, dx_chunk(c, hc[k], gc[k], wc[k]));
      }
#pragma unroll kRestUnroll
      for (int c = tid + kSlots * threads; c < n_chunks; c += threads) {
        const WChunk w = scale ? load_vector<W, kC>(a.weight, c) : WChunk{};
        const Chunk hv = read_chunk<T, kC>(hr, c, drop, kVec), gv = read_chunk<T, kC>(dyr, c, drop, kVec);
        store_vector<T, kC>(dxr, c, dx_chunk(c, hv, gv, w));
        if (params > 0) accumulate(c, hv, gv, mean, r);  // the rest's only second read
      }
    }
    if (params > 0) {
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        const int c = tid + k * threads;
        if (c < n_chunks) accumulate(c, hc[k], gc[k], mean, r);
      }
      if (a.dx == nullptr) {  // else the dx loop above accumulated the rest
#pragma unroll kRestUnroll
        for (int c = tid + kSlots * threads; c < n_chunks; c += threads) {
          accumulate(c, load_vector<T, kC>(hr, c), load_vector<T, kC>(dyr, c), mean, r);
        }
      }
    }
  }
  if (!kSmemAcc || params == 0) return;  // global accumulators are the partial rows already
  __syncthreads();
  // the block's partial row: its processors' rows summed in order, columns back in natural order
  for (int q = 0; q < params; ++q) {
    S* out = (q == 0 && want_dw ? a.dw_partial : a.db_partial) + static_cast<int64_t>(blockIdx.x) * n;
    const S* rows_of = smem_acc + q * procs * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int at = (i % kC) * n_chunks + i / kC;
      S v = rows_of[at];
      for (int p = 1; p < procs; ++p) v += rows_of[p * n + at];
      out[i] = v;
    }
  }
}

// ---------------------------------------------------------------------------------------------- staged rows
// A block (kCluster: the blocks of a cluster, each its part of the row) walks its group's rows with the next
// row's h, dy (and dres) copies in flight into a shared-memory ring (RowRing) while it works on one; the weight
// stays in registers for the block's life and dweight (dbias) accumulate in registers (a thread owns the same
// columns in every row), so the shared memory is all staging. The row is read from its buffer twice (the row's
// sums, then dx and dweight). In a cluster, thread 0 copies each row's rstd (and mean) with the row, into a ring
// of kStages + 1 slots read past the row's barrier (layer_norm's mean, needed before it, is loaded with the row).
// With 16-bit inputs one block adds dweight's terms in the
// first sweep (add_chunk_and_params): fewer instructions past the barrier.
template <typename T, typename W, bool kLayer, bool kDres, bool kCluster>
__global__ void __launch_bounds__(kStagedThreads, 1) norm_staged_rows_backward_kernel(BackwardArgs<T, W> a) {
  using M = BackMath<kLayer, T>;
  using A = opmath_t<T>;
  using S = RowSum<T>;
  constexpr int kC = vector_size<T>();
  constexpr int kU = kStagedUnits;
  constexpr int kStages = kStagedStages;
  constexpr int kTensors = kDres ? 3 : 2;  // h, dy (, dres)
  constexpr bool kParamsFirst = !kCluster && is_16bit_float<T>;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  using Ring = RowRing<T, kC, kTensors, kU, kStages>;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  __shared__ S scratch[2][M::kStats][kWarpSize];
  __shared__ typename M::Stats cluster_slots[2];
  __shared__ A stat_ring[kCluster ? kStages + 1 : 1];  // rstd
  Ring ring(dynamic_smem);
  const int tid = threadIdx.x, threads = blockDim.x, n = a.n;
  const int cluster = kCluster ? static_cast<int>(cluster_blocks()) : 1;
  const int first = kCluster ? static_cast<int>(cluster_rank()) * a.part_chunks : 0;
  const int n_chunks = kCluster ? min(a.part_chunks, n / kC - first) : n / kC;
  const int64_t col = static_cast<int64_t>(first) * kC;
  const int64_t group = blockIdx.x / cluster;
  const int64_t begin = group * a.rows_per_group;
  const int64_t end = begin + a.rows_per_group < a.rows ? begin + a.rows_per_group : a.rows;
  const bool scale = a.weight != nullptr;
  const bool want_dw = a.dw_partial != nullptr, want_db = kLayer && a.db_partial != nullptr;  // uniform
  auto stat_slot = [&](int64_t row) { return static_cast<int>((row - begin) % (kStages + 1)); };
  auto fetch = [&](int64_t row, int stage) {
    const bool valid = row < end;
    const int64_t at = valid ? row : begin;  // no out-of-range pointer arithmetic past the rows
    const T* src[kTensors];
    src[0] = a.h.row(at) + col;
    src[1] = a.dy.row(at) + col;
    if constexpr (kDres) src[2] = a.dres.row(at) + col;
    if (kCluster && valid && threadIdx.x == 0) copy_async_4(&stat_ring[stat_slot(row)], a.rstd + row);
    ring.fetch(stage, src, n_chunks, valid);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) fetch(begin + s, s);
  const W* weight = scale ? a.weight + col : nullptr;
  WChunk wc[kU];
  S dw[kU][kC], db[kU][kC];
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    const int c = tid + k * threads;
    wc[k] = scale && c < n_chunks ? load_vector<W, kC>(weight, c) : WChunk{};
#pragma unroll
    for (int e = 0; e < kC; ++e) dw[k][e] = db[k][e] = S(0);
  }
  int stage = 0;
  for (int64_t row = begin; row < end; ++row) {
    // the row kStages - 1 ahead goes into the buffer the previous row freed
    fetch(row + kStages - 1, stage == 0 ? kStages - 1 : stage - 1);
    const A r_loaded = kCluster ? A(0) : a.rstd[row];
    // layer_norm's first sweep needs the mean (its sums are of g * (h - mean)): loaded with the row everywhere
    const A mean = kLayer ? a.mean[row] : A(0);
    Ring::wait();
    typename M::Stats s = zero_sums<S, M::kStats>();
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      if (tid + k * threads < n_chunks) {
        if constexpr (kParamsFirst) {
          M::add_chunk_and_params(s, ring.at(stage, 0, k), ring.at(stage, 1, k), wc[k], scale, a.offset, mean,
                                  want_dw, want_db, r_loaded, dw[k], db[k]);
        } else {
          M::add_chunk(s, ring.at(stage, 0, k), ring.at(stage, 1, k), wc[k], scale, a.offset, mean);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kU; ++k) keep_packed(wc[k]);  // converted per row, not kept as f32 over the loop
    const int parity = static_cast<int>((row - begin) & 1);
    s = warps_sum(s, scratch, parity, 0, threads / kWarpSize);
    if constexpr (kCluster) s = cluster_sum(s, cluster_slots, parity, cluster);
    const A r = kCluster ? stat_ring[stat_slot(row)] : r_loaded;  // thread 0's copy, past the row's barrier
    A c1, c2;
    M::coefficients(s, n, r, c1, c2);
    T* dxr = a.dx + row * n + col;
    // The row is read again from shared memory (kept in registers over the reduction, 16-bit rows spilled).
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int c = tid + k * threads;
      if (c < n_chunks) {
        const Chunk hv = ring.at(stage, 0, k), gv = ring.at(stage, 1, k);
        const Chunk dr = ring.at(stage, kDres ? 2 : 0, k);  // (h again when there is no dres: not used)
        store_vector<T, kC>(dxr, c, M::template input_grad<kDres>(hv, gv, wc[k], scale, a.offset, mean, r, c1, c2, dr));
        if (!kParamsFirst) M::add_params(hv, gv, mean, r, want_dw, want_db, dw[k], db[k]);
      }
    }
    stage = stage + 1 == kStages ? 0 : stage + 1;
  }
  if constexpr (kCluster) cluster_barrier();  // no block exits while a peer may still read its slots
  auto store_partial = [&](S* partial, S (&v)[kU][kC]) {
    S* out = partial + group * n + col;
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int c = tid + k * threads;
      if (c < n_chunks) {
#pragma unroll
        for (int e = 0; e < kC; ++e) out[c * kC + e] = v[k][e];
      }
    }
  };
  if (want_dw) store_partial(a.dw_partial, dw);
  if (want_db) store_partial(a.db_partial, db);
}

// ------------------------------------------------------------------------------------------------ launch
template <typename T, typename W, int kC, bool kLayer>
BackwardKernel<T, W> backward_kernel(const BackwardPlan& p, bool dres) {
  if (p.form == BackwardForm::kStagedRows) {
    if constexpr (sizeof(T) * kC == kVectorBytes && !std::is_same_v<T, double>) {
      if (p.cluster > 1) {
        return dres ? norm_staged_rows_backward_kernel<T, W, kLayer, !kLayer, true>
                    : norm_staged_rows_backward_kernel<T, W, kLayer, false, true>;
      }
      return dres ? norm_staged_rows_backward_kernel<T, W, kLayer, !kLayer, false>
                  : norm_staged_rows_backward_kernel<T, W, kLayer, false, false>;
    }
  }
  constexpr int kPerUnit = kC == 1 && vector_size<T>() > 2 ? vector_size<T>() / 2 : 1;  // element chunks a unit
  auto kept = [&](auto smem) -> BackwardKernel<T, W> {
    constexpr bool kSmem = decltype(smem)::value;
    if (p.block_per_row) return norm_kept_rows_backward_kernel<T, W, kC, kLayer, kKeptUnits * kPerUnit, true, kSmem>;
    if constexpr (kC > 1) {
      if (p.slots == 1) return norm_kept_rows_backward_kernel<T, W, kC, kLayer, 1, false, kSmem>;
      if (p.slots == 4) return norm_kept_rows_backward_kernel<T, W, kC, kLayer, 4, false, kSmem>;
    }
    return norm_kept_rows_backward_kernel<T, W, kC, kLayer, kWarpMaxSlots * kPerUnit, false, kSmem>;
  };
  return p.dw_in_smem ? kept(std::true_type{}) : kept(std::false_type{});
}

// Plans and launches the backward of `a`'s rows; dw / db: the parameters' gradients (undefined when not wanted),
// `like` a tensor on the device for scratch.
template <typename T, typename W, int kC, bool kLayer>
void launch_backward(BackwardArgs<T, W> a, const at::Tensor& dw, const at::Tensor& db, int device,
                     cudaStream_t stream) {
  using S = RowSum<T>;
  // the kernels' static shared memory: the row sums' scratch and cluster slots, the staged rows' statistics ring
  constexpr size_t kStaticBytes =
      kReduceScratchBytes<RowSum<T>, BackMath<kLayer, T>::kStats> + 2 * (kStagedStages + 1) * sizeof(double);
  const int params = static_cast<int>(dw.defined()) + static_cast<int>(db.defined());
  const RowShape shape{kLayer ? NormOp::kLayer : NormOp::kRms, static_cast<int>(sizeof(T)), std::is_same_v<T, double>,
                       kC > 1, a.n, a.rows};
  const DeviceInfo info{device_attribute(cudaDevAttrMultiProcessorCount, device),
                        device_attribute(cudaDevAttrComputeCapabilityMajor, device), smem_limit(device, kStaticBytes)};
  const bool dres = a.dres.data != nullptr;
  auto residency = [&](const BackwardPlan& p) {
    const auto kernel = backward_kernel<T, W, kC, kLayer>(p, dres);
    allow_shared_memory(kernel, p.smem, kStaticBytes);
    return cached_residency(kernel, device, p.threads, p.smem, p.cluster);
  };
  const BackwardPlan plan =
      plan_backward(shape, info, a.dx != nullptr, dres, params, static_cast<int>(sizeof(S)), residency);
  const auto kernel = backward_kernel<T, W, kC, kLayer>(plan, dres);
  allow_shared_memory(kernel, plan.smem, kStaticBytes);
  // partial rows: one a group, or one a row processor when kept rows accumulate in global memory
  const int64_t procs = plan.form == BackwardForm::kKeptRows && !plan.dw_in_smem && !plan.block_per_row
                            ? plan.threads / kWarpSize
                            : 1;
  const int64_t parts = plan.groups * procs;
  const auto stat = at::CppTypeToScalarType<S>::value;
  at::Tensor dw_partial, db_partial;
  if (dw.defined()) {
    dw_partial = empty_dense_cuda({parts, a.n}, stat, dw.device());
    a.dw_partial = dw_partial.mutable_data_ptr<S>();
  }
  if (db.defined()) {
    db_partial = empty_dense_cuda({parts, a.n}, stat, db.device());
    a.db_partial = db_partial.mutable_data_ptr<S>();
  }
  a.rows_per_group = plan.rows_per_group;
  a.part_chunks = plan.part_chunks;
  launch_in_clusters(kernel, static_cast<unsigned int>(plan.groups * plan.cluster), plan.threads, plan.smem,
                     plan.cluster, stream, a);
  if (dw.defined()) launch_column_reduce<S, W>(a.dw_partial, parts, a.n, dw.mutable_data_ptr<W>(), stream);
  if (db.defined()) {  // weight's dtype, or the stat dtype without a weight
    using A = opmath_t<T>;
    if (db.scalar_type() == at::CppTypeToScalarType<W>::value) {
      launch_column_reduce<S, W>(a.db_partial, parts, a.n, db.mutable_data_ptr<W>(), stream);
    } else {
      launch_column_reduce<S, A>(a.db_partial, parts, a.n, db.mutable_data_ptr<A>(), stream);
    }
  }
}

}  // namespace norm_cuda
}  // namespace torchops
