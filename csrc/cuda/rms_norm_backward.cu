// rms_norm and add_rms_norm backward on CUDA, on the row engine of norm/norm_cuda.cuh. Both are one
// kernel over the normalised rows h (rms_norm's input, add_rms_norm's residual_out):
//   dx = rstd * g - h * rstd^3 / N * sum(g * h) (+ grad_residual_out), g = dy * (weight + offset);
//   dweight = sum over rows of dy * h * rstd.
// The row processors each take a contiguous chunk of rows: dx in one pass after the row's dot product (in
// RowSum<T>), dweight accumulated per processor (in registers for the staged blocks, else in shared
// memory); each block writes one f32 partial row, and the engine's column reduction sums the partial rows
// in block order. No atomics, so dweight is bit-identical from run to run on a device. When N is too large
// for the shared-memory accumulator, dweight's partial rows come from a column-parallel kernel instead.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../norm/norm.h"
#include "../norm/norm_cuda.cuh"
#include "../norm/norm_ops.h"

namespace torchops {
namespace {

using namespace torchops::norm_cuda;

// sum over a chunk of g * h, g = dy * (w + offset) (dy when !scale_by_w).
template <typename A, typename T, typename W, int kC>
__device__ __forceinline__ A chunk_dot(const AlignedVector<T, kC>& hv, const AlignedVector<T, kC>& gv,
                                       const AlignedVector<W, kC>& wv, bool scale_by_w, A offset) {
  A s = 0;
#pragma unroll
  for (int e = 0; e < kC; ++e) {
    const A g = static_cast<A>(gv.val[e]);
    s += (scale_by_w ? g * (static_cast<A>(wv.val[e]) + offset) : g) * static_cast<A>(hv.val[e]);
  }
  return s;
}

// chunk_dot for 16-bit inputs with dweight's terms in the same sweep: p = dy * h once, dw[e] += p * rstd
// (when want_dw) and the dot product's w * p. Rounded explicitly (__fmul_rn / __fmaf_rn): left to the
// compiler, the copies of the loop with and without dweight contracted differently, and dx's bits then
// depended on whether dweight was asked for (f16: w * p is not exact in f32).
template <typename T, typename W, int kC>
__device__ __forceinline__ float dot_and_dw(const AlignedVector<T, kC>& hv, const AlignedVector<T, kC>& gv,
                                            const AlignedVector<W, kC>& wv, bool scale_by_w, float offset,
                                            bool want_dw, float r, float (&dw)[kC]) {
  static_assert(is_16bit_float<T>, "f32 partial sums: 16-bit inputs only");
  float s = 0;
#pragma unroll
  for (int e = 0; e < kC; ++e) {
    const float p = __fmul_rn(static_cast<float>(gv.val[e]), static_cast<float>(hv.val[e]));
    if (want_dw) dw[e] = __fmaf_rn(p, r, dw[e]);
    s = scale_by_w ? __fmaf_rn(static_cast<float>(wv.val[e]) + offset, p, s) : s + p;
  }
  return s;
}

// dx of a chunk: rstd * g - c3 * h (+ extra, add_rms_norm's grad_residual_out, when kExtra). The extra
// chunk is a value, not a pointer that may be null: taking a local's address gave the kept kernels a stack
// frame (16-32 bytes a thread, ptxas).
template <bool kExtra, typename T, typename W, int kC, typename A>
__device__ __forceinline__ AlignedVector<T, kC> input_grad(const AlignedVector<T, kC>& hv,
                                                           const AlignedVector<T, kC>& gv,
                                                           const AlignedVector<W, kC>& wv, bool scale_by_w, A offset,
                                                           A r, A c3, const AlignedVector<T, kC>& extra) {
  AlignedVector<T, kC> out;
#pragma unroll
  for (int e = 0; e < kC; ++e) {
    const A g = static_cast<A>(gv.val[e]);
    A v = r * (scale_by_w ? g * (static_cast<A>(wv.val[e]) + offset) : g) - c3 * static_cast<A>(hv.val[e]);
    if constexpr (kExtra) v += static_cast<A>(extra.val[e]);
    out.val[e] = static_cast<T>(v);
  }
  return out;
}

// input_grad with the extra term read from dres (when not null) at chunk c.
template <typename T, typename W, int kC, typename A>
__device__ __forceinline__ AlignedVector<T, kC> input_grad(const AlignedVector<T, kC>& hv,
                                                           const AlignedVector<T, kC>& gv,
                                                           const AlignedVector<W, kC>& wv, bool scale_by_w, A offset,
                                                           A r, A c3, const T* dres, int64_t c) {
  if (dres != nullptr) return input_grad<true>(hv, gv, wv, scale_by_w, offset, r, c3, load_vector<T, kC>(dres, c));
  return input_grad<false>(hv, gv, wv, scale_by_w, offset, r, c3, hv);
}

// acc[e * n_chunks + c] += dy * h * rstd for the chunk's elements. The kC shared-memory loads are issued
// before any store: written as kC read-modify-writes, the compiler (unable to tell the addresses apart)
// serialized them, a shared-memory round trip per element.
template <typename A, typename T, int kC>
__device__ __forceinline__ void accumulate_dw(A* acc, int n_chunks, int c, const AlignedVector<T, kC>& hv,
                                              const AlignedVector<T, kC>& gv, A r) {
  A sums[kC];
#pragma unroll
  for (int e = 0; e < kC; ++e) sums[e] = acc[e * n_chunks + c];
#pragma unroll
  for (int e = 0; e < kC; ++e) {
    acc[e * n_chunks + c] = sums[e] + static_cast<A>(gv.val[e]) * static_cast<A>(hv.val[e]) * r;
  }
}

// The pointers of one backward launch. dx, dres may be null; dw_partial ([blocks, n]) is null when
// dweight is not wanted from this kernel.
template <typename T, typename W>
struct BackwardArgs {
  const T* dy;
  int64_t dy_row_stride;
  const T* h;
  int64_t h_row_stride;
  const T* dres;  // added to dx (add_rms_norm's grad_residual_out)
  int64_t dres_row_stride;
  const W* weight;
  const opmath_t<T>* rstd;
  T* dx;
  opmath_t<T>* dw_partial;
};

// Block b takes rows [b * rows_per_block, (b + 1) * rows_per_block); its processors take every
// per_block()-th of them. dw_partial receives the block's sum of dy * h * rstd over its rows: each processor
// accumulates into its own shared-memory row (`procs x n` values of A, dynamic), summed in processor order
// at the end. That row is stored element-major (element e of chunk c at e * n_chunks + c): a thread owns
// whole chunks, so chunk-major order put a warp's lanes kC values apart, an 8-way bank conflict for bf16.
template <typename T, typename W, int kSlots, int kC, bool kBlockPerRow, int kMaxThreads, int kMinBlocks>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks)
    norm_backward_kernel(BackwardArgs<T, W> a, opmath_t<T> offset, int64_t rows, int n, int64_t rows_per_block) {
  using A = opmath_t<T>;
  using S = RowSum<T>;
  using P = Processor<kBlockPerRow>;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  __shared__ S scratch[kWarpSize];
  A* dw_acc = reinterpret_cast<A*>(dynamic_smem);
  A* my_acc = dw_acc + P::in_block() * n;
  // The loops over the rest of a row longer than the kept chunks (block rows only): unrolled in a warp
  // kernel, where they never run, their loads took registers (up to ~110 more a thread).
  constexpr int kRestUnroll = kBlockPerRow ? 4 : 1;
  const bool want_dw = a.dw_partial != nullptr;                   // uniform over the grid
  const bool scale_by_w = a.dx != nullptr && a.weight != nullptr;  // the weight enters dx only
  const int procs = P::per_block();
  if (want_dw) {
    for (int i = threadIdx.x; i < procs * n; i += blockDim.x) dw_acc[i] = A(0);  // fits: shared memory
    __syncthreads();
  }

  const int tid = P::tid(), threads = P::threads();
  const int n_chunks = n / kC;  // 32-bit column math: n < 2^31 (checked at launch), fewer registers
  // The rest of a row longer than the kept chunks is read twice (dot product, then dx and dweight): the
  // first read asks L2 to keep its lines, the second to drop them first (16-byte vectors only).
  [[maybe_unused]] const uint64_t keep = kBlockPerRow ? l2_policy<L2Evict::kLast>() : 0;
  [[maybe_unused]] const uint64_t drop = kBlockPerRow ? l2_policy<L2Evict::kFirst>() : 0;
  auto load_rest = [](const T* base, int c, uint64_t policy) {
    if constexpr (sizeof(T) * kC == kVectorBytes) {
      return load_vector_l2<T, kC>(base, c, policy);
    } else {
      (void)policy;
      return load_vector<T, kC>(base, c);
    }
  };
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t end = begin + rows_per_block < rows ? begin + rows_per_block : rows;
  for (int64_t row = begin + P::in_block(); row < end; row += procs) {  // uniform over the processor
    const T* dyr = a.dy + row * a.dy_row_stride;
    const T* hr = a.h + row * a.h_row_stride;
    const A r = a.rstd[row];
    // Every load of the row's cached part (h, dy and the weight) is issued before any of them is used, and
    // the flags are tested per row, not per element: the first version loaded each slot's weight after
    // the previous slot's arithmetic and branched per element, and ran at ~57% of copy for bf16.
    Chunk hc[kSlots], gc[kSlots];
    WChunk wc[kSlots];  // loaded and read only when scale_by_w (the ?: in the helpers)
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int c = tid + k * threads;
      if (c < n_chunks) {
        hc[k] = load_vector<T, kC>(hr, c);
        gc[k] = load_vector<T, kC>(dyr, c);
        if (scale_by_w) wc[k] = load_vector<W, kC>(a.weight, c);
      }
    }
    if (a.dx != nullptr) {
      S s = 0;  // sum over the row of g * h
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        if (tid + k * threads < n_chunks) s += chunk_dot<A>(hc[k], gc[k], wc[k], scale_by_w, offset);
      }
#pragma unroll kRestUnroll
      for (int c = tid + kSlots * threads; c < n_chunks; c += threads) {
        const WChunk w = scale_by_w ? load_vector<W, kC>(a.weight, c) : WChunk{};
        s += chunk_dot<A>(load_rest(hr, c, keep), load_rest(dyr, c, keep), w, scale_by_w, offset);
      }
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {  // converted again for dx, not kept live over the reduction
        keep_packed(hc[k]);
        keep_packed(gc[k]);
        keep_packed(wc[k]);
      }
      s = row_sum<kBlockPerRow>(s, scratch);
      const A c3 = static_cast<A>(static_cast<S>(r) * r * r * s / static_cast<S>(n));
      T* dxr = a.dx + row * n;
      const T* dresr = a.dres != nullptr ? a.dres + row * a.dres_row_stride : nullptr;
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        const int c = tid + k * threads;
        if (c < n_chunks) {
          store_vector<T, kC>(dxr, c, input_grad(hc[k], gc[k], wc[k], scale_by_w, offset, r, c3, dresr, c));
        }
      }
#pragma unroll kRestUnroll
      for (int c = tid + kSlots * threads; c < n_chunks; c += threads) {
        const WChunk w = scale_by_w ? load_vector<W, kC>(a.weight, c) : WChunk{};
        const Chunk hv = load_rest(hr, c, drop), gv = load_rest(dyr, c, drop);
        store_vector<T, kC>(dxr, c, input_grad(hv, gv, w, scale_by_w, offset, r, c3, dresr, c));
        if (want_dw) accumulate_dw(my_acc, n_chunks, c, hv, gv, r);  // the rest's only second read
      }
    }
    if (want_dw) {  // dweight += dy * h * rstd, element-major (see above): lanes hit consecutive banks
      // The accumulator's addresses are the same every row; hidden from the optimizer here, it recomputes
      // them instead of keeping them live over the row loop (ptxas: a few registers fewer, 94 -> 80 for
      // the bf16 one-unit warp kernel).
      A* acc = my_acc;
      int stride = n_chunks;
      asm volatile("" : "+r"(stride));
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        const int c = tid + k * threads;
        if (c < n_chunks) accumulate_dw(acc, stride, c, hc[k], gc[k], r);
      }
      if (a.dx == nullptr) {  // else the dx loop above accumulated the rest
#pragma unroll kRestUnroll
        for (int c = tid + kSlots * threads; c < n_chunks; c += threads) {
          accumulate_dw(my_acc, n_chunks, c, load_vector<T, kC>(hr, c), load_vector<T, kC>(dyr, c), r);
        }
      }
    }
  }

  if (want_dw) {
    __syncthreads();
    A* out = a.dw_partial + static_cast<int64_t>(blockIdx.x) * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int at = (i % kC) * n_chunks + i / kC;  // column i in the element-major accumulator
      A v = dw_acc[at];
      for (int p = 1; p < procs; ++p) v += dw_acc[p * n + at];
      out[i] = v;
    }
  }
}

// Staged rows: a block per row for rows past the warp's (and the warp's longer ones: kStagedFromChunks)
// that fit kStagedUnits chunks a thread on kStagedThreads threads (16-bit N <= 16384, f32 8192), with
// 16-byte vectors and dx wanted. The kept
// blocks above hold few blocks an SM (up to 128 registers and the dweight accumulator), so while one
// reduces a row little of the next is in flight. Here each block runs over its chunk of rows with the
// next kStages - 1 rows' h, dy (and dres) copies in flight into shared memory (RowRing), the weight in
// registers for the block's life and dweight accumulated in registers (a thread owns the same columns in
// every row), so the shared memory is all staging. The row is read from its buffer twice (the dot
// product, then dx and dweight); the buffer is refilled after its row is done (every value read from it
// consumed). Kernel alone against the kept blocks (history/tuning/rms_norm_kernels.py, % of copy,
// bf16 32768x4096 / 16384x8192 / 8192x16384): rms_norm 74.5 / 72.2 / 68.6% -> 85.4 / 81.3 / 72.6%,
// add_rms_norm 67.6 / 66.9 / 65.5% -> 89.3 / 90.0 / 88.9%; f32 32768x4096 and 16384x8192 91.4 / 86.2% ->
// 93.3 / 93.2%, add 77.5 / 76.1% -> 96.4 / 96.3%. Two buffers (one row ahead) ran faster than three or as
// fast (add_rms_norm bf16 16384x8192: 285 against 323 us, three buffers costing residency).
// Longer rows (sm_90+; staged_split) are split over a thread-block cluster: block q of the cluster takes
// chunks [q * part_chunks, (q + 1) * part_chunks) of every row, and the blocks' dot products meet in
// distributed shared memory (cluster_row_sum). The cluster walks its rows like one block and writes one
// partial row. Kernel alone against the kept long block (the same script, bf16 / f32): rms_norm
// 4096x32768 323 / 531 us against 355 / 648, 2048x65536 342 / 590 against 506 / 1012, f32 8192x16384 488
// against 557; add_rms_norm 2048x65536 403 / 753 against 637 / 1136.
// In a cluster, each block's thread 0 copies the row's rstd with the row's own copies, into a ring of
// kStages + 1 slots read past row_sum's barrier (a slot is written again at the start of the row two on,
// past the next row's barrier, which every thread reaches only after its read). Loaded per row instead, as
// one block does, the cluster kernels ran 6-29% slower (kernel alone, one build, same device: rms_norm f32
// 8192x16384 / 4096x32768 / 2048x65536 488 / 530 / 591 us against 432 / 465 / 499, bf16 4096x32768 /
// 2048x65536 328 / 343 against 311 / 324; add_rms_norm f32 8192x16384 / 4096x32768 596 / 672 against 528 /
// 551); staged on one block, the single-block kernels ran 7-15% slower (bf16 16384x8192 255 against 238 us,
// add_rms_norm 315 against 283).
// One block sums its rows with one barrier a row (block_row_sum; kernel alone, one build, three runs, us):
// bf16 16384x8192 / 8192x16384 230.6-230.8 / 261.1-261.5 against 237.0-237.1 / 265.9-266.5, add_rms_norm
// bf16 8192x16384 283.1-283.8 against 288.2-289.0; bf16 32768x4096 and f32 within 0.7% either way. In the
// cluster kernels it measured even (within 0.7%), and they keep row_sum.
// With 16-bit inputs one block adds dweight's terms in the first sweep (dot_and_dw: rstd is loaded with
// the row, and dy * h serves both sums), not the second: fewer instructions on the row's critical path
// past the barrier, and 4-12 registers fewer. Backward alone, one build, three rounds, us: bf16 8192x16384
// 217.2 against 262.6, 16384x8192 221.5 / 235.8, 32768x4096 223.0 / 225.8, add_rms_norm 277.4 / 283.3,
// 281.0 / 284.1, 283.9 / 286.7. With f32 inputs it measured even or up to 1.1% slower (32768x4096 418.8
// against 414.1), and in a cluster rstd arrives past the row's barrier (above).
template <typename T, typename W, bool kDres, bool kCluster>
__global__ void __launch_bounds__(kStagedThreads, 1)
    norm_backward_staged_kernel(BackwardArgs<T, W> a, opmath_t<T> offset, int64_t rows, int n,
                                int64_t rows_per_group, int part_chunks) {
  using A = opmath_t<T>;
  using S = RowSum<T>;
  constexpr int kC = vector_size<T>();
  constexpr int kU = kStagedUnits;
  constexpr int kTensors = kDres ? 3 : 2;  // h, dy (, dres)
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  constexpr int kStages = kStagedStages;
  // dweight in the first sweep (see above): one block, 16-bit inputs
  constexpr bool kDwFirst = !kCluster && is_16bit_float<T>;
  using Ring = RowRing<T, kC, kTensors, kU, kStages>;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  __shared__ S scratch[2][kWarpSize];  // row sums: block_row_sum's halves (one block), else row_sum's first
  __shared__ S cluster_sums[2];  // kCluster: the blocks' dot products (cluster_row_sum)
  __shared__ A rstd_ring[kCluster ? kStages + 1 : 1];  // kCluster: rstd staged with its row (see above)
  Ring ring(dynamic_smem);
  const int tid = threadIdx.x, threads = blockDim.x;
  const StagedPlace place = staged_place<kCluster, kC>(n, part_chunks, rows, rows_per_group);
  const int n_chunks = place.n_chunks;
  const int64_t col = place.col, begin = place.begin, end = place.end;
  const bool scale_by_w = a.weight != nullptr;
  const bool want_dw = a.dw_partial != nullptr;  // uniform over the grid
  auto rstd_slot = [&](int64_t row) { return static_cast<int>((row - begin) % (kStages + 1)); };
  auto fetch = [&](int64_t row, int stage) {
    const bool valid = row < end;
    const int64_t at = valid ? row : begin;  // no out-of-range pointer arithmetic past the rows
    const T* src[kTensors];
    src[0] = a.h + at * a.h_row_stride + col;
    src[1] = a.dy + at * a.dy_row_stride + col;
    if constexpr (kDres) src[2] = a.dres + at * a.dres_row_stride + col;
    if (kCluster && valid && threadIdx.x == 0) copy_async_4(&rstd_ring[rstd_slot(row)], a.rstd + row);
    ring.fetch(stage, src, n_chunks, valid);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) fetch(begin + s, s);
  const W* weight = scale_by_w ? a.weight + col : nullptr;
  WChunk wc[kU];
  A dw[kU][kC];
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    const int c = tid + k * threads;
    wc[k] = scale_by_w && c < n_chunks ? load_vector<W, kC>(weight, c) : WChunk{};
#pragma unroll
    for (int e = 0; e < kC; ++e) dw[k][e] = A(0);
  }
  int stage = 0;
  for (int64_t row = begin; row < end; ++row) {
    // the row kStages - 1 ahead goes into the buffer the previous row freed
    fetch(row + kStages - 1, stage == 0 ? kStages - 1 : stage - 1);
    const A r_loaded = kCluster ? A(0) : a.rstd[row];
    Ring::wait();
    S s = 0;
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      if (tid + k * threads < n_chunks) {
        if constexpr (kDwFirst) {
          s += dot_and_dw(ring.at(stage, 0, k), ring.at(stage, 1, k), wc[k], scale_by_w, offset, want_dw, r_loaded,
                          dw[k]);
        } else {
          s += chunk_dot<A>(ring.at(stage, 0, k), ring.at(stage, 1, k), wc[k], scale_by_w, offset);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kU; ++k) keep_packed(wc[k]);  // converted per row, not kept as f32 over the loop
    const int parity = static_cast<int>((row - begin) & 1);
    if constexpr (kCluster) {
      s = cluster_row_sum(row_sum<true>(s, scratch[0]), cluster_sums, parity, place.cluster);
    } else {
      s = block_row_sum(s, scratch, parity);
    }
    const A r = kCluster ? rstd_ring[rstd_slot(row)] : r_loaded;  // thread 0's copy, past row_sum's barrier
    const A c3 = static_cast<A>(static_cast<S>(r) * r * r * s / static_cast<S>(n));
    T* dxr = a.dx + row * n + col;
    // The row is read again from shared memory (not kept in registers over the reduction: ptxas spilled
    // 116-240 bytes a thread for 16-bit inputs that way).
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int c = tid + k * threads;
      if (c < n_chunks) {
        const Chunk hv = ring.at(stage, 0, k), gv = ring.at(stage, 1, k);
        const Chunk dr = ring.at(stage, kDres ? 2 : 0, k);  // (h again when there is no dres: not used)
        store_vector<T, kC>(dxr, c, input_grad<kDres>(hv, gv, wc[k], scale_by_w, offset, r, c3, dr));
        if (!kDwFirst && want_dw) {
#pragma unroll
          for (int e = 0; e < kC; ++e) dw[k][e] += static_cast<A>(gv.val[e]) * static_cast<A>(hv.val[e]) * r;
        }
      }
    }
    stage = stage + 1 == kStages ? 0 : stage + 1;
  }
  if constexpr (kCluster) cluster_barrier();  // no CTA exits while a peer may still read its cluster_sums
  if (want_dw) {
    A* out = a.dw_partial + place.group * n + col;
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int c = tid + k * threads;
      if (c < n_chunks) {
        AlignedVector<A, kC> v;
#pragma unroll
        for (int e = 0; e < kC; ++e) v.val[e] = dw[k][e];
        store_vector<A, kC>(out, c, v);
      }
    }
  }
}

// dweight's partial rows when N is too large for the shared-memory accumulator: thread = one column,
// blockIdx.y = one chunk of rows_per_part rows, summed in row order.
template <typename T>
__global__ void norm_dw_columns_kernel(const T* __restrict__ dy, int64_t dy_row_stride, const T* __restrict__ h,
                                       int64_t h_row_stride, const opmath_t<T>* __restrict__ rstd,
                                       opmath_t<T>* __restrict__ dw_partial, int64_t rows, int64_t n,
                                       int64_t rows_per_part) {
  using A = opmath_t<T>;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= n) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_part;
  const int64_t end = begin + rows_per_part < rows ? begin + rows_per_part : rows;
  A v = 0;
  for (int64_t row = begin; row < end; ++row) {
    v += static_cast<A>(dy[row * dy_row_stride + col]) * static_cast<A>(h[row * h_row_stride + col]) * rstd[row];
  }
  dw_partial[static_cast<int64_t>(blockIdx.y) * n + col] = v;
}

// The staged kernel's launch for block rows (cfg not the warp's) it takes (norm_backward_staged_kernel);
// false elsewhere (f64, dweight alone, rows too long for a cluster, shared memory short).
template <typename T, typename W>
bool launch_backward_staged(const BackwardArgs<T, W>& a, int64_t rows, int64_t n, double offset,
                            const at::Tensor& grad_weight, const at::Tensor& like, int device, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    using A = opmath_t<T>;
    constexpr int kC = vector_size<T>();
    if (a.dx == nullptr) return false;
    const StagedSplit split = staged_split<T>(n / kC, device);
    if (split.cluster == 0) return false;
    auto launch = [&](auto dres) {
      constexpr bool kDres = decltype(dres)::value;
      const size_t smem = RowRing<T, kC, kDres ? 3 : 2, kStagedUnits, kStagedStages>::bytes(split.threads);
      // the kernel's static shared memory past row_kernel_smem_limit's one row_sum scratch: its second
      // half, cluster_sums and rstd_ring
      constexpr size_t kStaticBytes =
          kRowSumScratchBytes<T> + 2 * sizeof(RowSum<T>) + (kStagedStages + 1) * sizeof(A);
      if (smem + kStaticBytes > row_kernel_smem_limit<T>(device)) return false;
      const auto kernel = split.cluster > 1 ? norm_backward_staged_kernel<T, W, kDres, true>
                                            : norm_backward_staged_kernel<T, W, kDres, false>;
      static OccupancyCache occupancy[2];  // one per kernel
      allow_shared_memory(kernel, smem, kRowSumScratchBytes<T> + kStaticBytes);
      const RowGroups grid =
          resident_grid(kernel, occupancy[split.cluster > 1], device, split.threads, smem, rows, 1, split.cluster);
      if (grid.groups == 0) return false;  // no cluster of these blocks fits the device
      at::Tensor partial;
      BackwardArgs<T, W> k = a;
      if (grad_weight.defined()) {
        partial = empty_dense_cuda({grid.groups, n}, at::CppTypeToScalarType<A>::value, like.device());
        k.dw_partial = partial.mutable_data_ptr<A>();
      }
      launch_staged(kernel, split, grid.groups, smem, stream, k, static_cast<A>(offset), rows, static_cast<int>(n),
                    grid.rows_per_group, split.part_chunks);
      if (grad_weight.defined()) {
        launch_column_reduce<A, W>(partial.const_data_ptr<A>(), grid.groups, n, grad_weight.mutable_data_ptr<W>(),
                                   stream);
      }
      return true;
    };
    return a.dres != nullptr ? launch(std::true_type{}) : launch(std::false_type{});
  }
}

// Rows of the warp kernel's length that the staged kernel takes instead (from these many 16-byte chunks, on
// 32-128 threads: staged_split): the warp kernel keeps a row's h, dy (and dres) in registers, and add_rms_norm's
// three rows' worth held 3-4 warps an SM. Backward alone against the warp kernel, one build, us:
// add_rms_norm bf16 131072x512 / 65536x1024 / 4096x2048 153.9 / 153.4 / 31.1 against 210.0 / 187.7 / 45.5,
// f32 262144x256 / 131072x512 / 65536x1024 282.5 / 276.1 / 275.1 against 323.6 / 290.8 / 342.5; rms_norm
// bf16 4096x2048 25.5 against 33.7, f32 65536x1024 213.3 against 213.2. Shorter plain rows stay on the warp
// kernel, which was faster there (bf16 131072x512 148.6 against 174.8 staged on 64 threads, f32 131072x512
// 212.2 against 219.6, 262144x256 219.3 against 250.4).
constexpr int64_t kStagedFromChunks = 256, kStagedFromChunksDres = 64;

template <typename T, typename W, int kC>
void launch_backward(BackwardArgs<T, W> a, int64_t rows, int64_t n, double offset, const at::Tensor& grad_weight,
                     const at::Tensor& like, cudaStream_t stream) {
  using A = opmath_t<T>;
  const int device = like.device().index();
  // The kernel's column loops step a 32-bit index by up to BackwardShapes::kLongThreads: it must not wrap.
  TORCH_CHECK(n <= INT32_MAX - BackwardShapes::kLongThreads,
              "rms_norm backward: rows of more than 2^31 - 513 elements are not supported on CUDA, got ", n);
  const RowConfig cfg = row_config<T, BackwardShapes, kC>(n);
  if constexpr (kC > 1) {
    const int64_t min_chunks = a.dres != nullptr ? kStagedFromChunksDres : kStagedFromChunks;
    if ((cfg.shape != RowShape::kWarp || n / kC >= min_chunks) &&
        launch_backward_staged(a, rows, n, offset, grad_weight, like, device, stream)) {
      return;
    }
  }
  const int per_block = cfg.rows_per_block();
  const bool want_dw = grad_weight.defined();
  with_row_shape<T, kC, BackwardShapes>(cfg, [&](auto slots, auto block_per_row, auto max_threads, auto min_blocks) {
    const auto kernel = norm_backward_kernel<T, W, decltype(slots)::value, kC, decltype(block_per_row)::value,
                                             decltype(max_threads)::value, decltype(min_blocks)::value>;
    static OccupancyCache occupancy;  // one per kernel
    // dweight in shared memory when it fits (opting in above the default 48 KiB), else the column kernel.
    const size_t smem_bytes = static_cast<size_t>(per_block) * n * sizeof(A);
    const bool dw_in_smem = want_dw && smem_bytes <= row_kernel_smem_limit<T>(device);
    const size_t smem = dw_in_smem ? smem_bytes : 0;
    allow_shared_memory(kernel, smem, kRowSumScratchBytes<T>);
    const auto [blocks, rows_per_block] = resident_grid(kernel, occupancy, device, cfg.threads, smem, rows, per_block);
    TORCH_INTERNAL_ASSERT(blocks <= kMaxGridYZ);  // the column kernel's grid.y; blocks <= SMs x resident blocks

    at::Tensor partial;
    if (want_dw) {
      partial = empty_dense_cuda({blocks, n}, at::CppTypeToScalarType<A>::value, like.device());
    }
    if (a.dx != nullptr || dw_in_smem) {
      BackwardArgs<T, W> k = a;
      k.dw_partial = dw_in_smem ? partial.mutable_data_ptr<A>() : nullptr;
      kernel<<<static_cast<unsigned int>(blocks), cfg.threads, smem, stream>>>(
          k, static_cast<A>(offset), rows, static_cast<int>(n), rows_per_block);
      TORCHOPS_CUDA_LAUNCH_CHECK();
    }
    if (!want_dw) return;
    if (!dw_in_smem) {  // dweight's partial rows from a second read of dy and h
      constexpr int kColThreads = 256;
      const dim3 grid(blocks_to_cover(n, kColThreads), static_cast<unsigned int>(blocks));
      norm_dw_columns_kernel<T><<<grid, kColThreads, 0, stream>>>(a.dy, a.dy_row_stride, a.h, a.h_row_stride, a.rstd,
                                                                  partial.mutable_data_ptr<A>(), rows, n,
                                                                  rows_per_block);
      TORCHOPS_CUDA_LAUNCH_CHECK();
    }
    launch_column_reduce<A, W>(partial.const_data_ptr<A>(), blocks, n, grad_weight.mutable_data_ptr<W>(), stream);
  });
}

// grad_input (when input_grad: rms_norm's gradient wrt h, plus dres when defined) and grad_weight (when
// weight_grad), of h's rows.
std::tuple<at::Tensor, at::Tensor> backward_cuda(const at::Tensor& grad_out, const at::Tensor& h,
                                                 const at::Tensor& dres, const std::optional<at::Tensor>& weight,
                                                 const at::Tensor& rstd, bool input_grad, bool weight_grad,
                                                 double weight_offset, at::Tensor grad_input, at::Tensor grad_weight) {
  const c10::cuda::CUDAGuard device_guard(h.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor w = dense_weight(weight);
  if (!input_grad && !weight_grad) return {grad_input, grad_weight};
  const NormRows x = norm_rows(h);
  if (x.rows == 0) {
    if (weight_grad) grad_weight.zero_();  // a sum over no rows
    return {grad_input, grad_weight};
  }
  const NormRows dy = norm_rows(grad_out);
  const NormRows dr = dres.defined() ? norm_rows(dres) : NormRows{};
  const at::Tensor r = rstd.contiguous();
  dispatch_norm_types(h.scalar_type(), w, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    BackwardArgs<T, W> a{dy.tensor.const_data_ptr<T>(),
                         dy.row_stride,
                         x.tensor.const_data_ptr<T>(),
                         x.row_stride,
                         dres.defined() ? dr.tensor.const_data_ptr<T>() : nullptr,
                         dr.row_stride,
                         w.defined() ? w.const_data_ptr<W>() : nullptr,
                         r.const_data_ptr<opmath_t<T>>(),
                         input_grad ? grad_input.mutable_data_ptr<T>() : nullptr,
                         nullptr};
    const at::Tensor gw = weight_grad ? grad_weight : at::Tensor();
    const int64_t n = x.cols;
    const bool vectors = rows_aligned(a.h, a.h_row_stride, n) && rows_aligned(a.dy, a.dy_row_stride, n) &&
                         weight_aligned<T>(a.weight) && (a.dx == nullptr || rows_aligned<T>(a.dx, n, n)) &&
                         (a.dres == nullptr || rows_aligned(a.dres, a.dres_row_stride, n));
    with_vector_size<T, VectorWidths::kFullOrScalar>(vectors ? vector_size<T>() : 1, [&](auto v) {
      launch_backward<T, W, decltype(v)::value>(a, x.rows, n, weight_offset, gw, h, stream);
    });
  });
  return {grad_input, grad_weight};
}

// What the shared entry points (norm_ops.h) call for the backward ops on CUDA.
struct CudaNormBackward {
  static constexpr int64_t kMaxRow = INT32_MAX - 512;
  static at::Tensor empty(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& like) {
    return empty_dense_cuda(sizes, dtype, like.device());
  }
  static void backward(const NormBackward& b) {
    TORCH_CHECK(b.kind == NormKind::kRms, "layer_norm: not yet on CUDA");
    backward_cuda(b.grad_out, b.input, b.grad_residual_out,
                  b.weight.defined() ? std::optional<at::Tensor>(b.weight) : std::nullopt, b.rstd,
                  b.grad_input.defined(), b.grad_weight.defined(), b.weight_offset, b.grad_input, b.grad_weight);
  }
};
using Ops = NormOps<CudaNormBackward>;

}  // namespace

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  m.impl("_rms_norm_backward", &Ops::rms_norm_backward);
  m.impl("_add_rms_norm_backward", &Ops::add_rms_norm_backward);
}

}  // namespace torchops
