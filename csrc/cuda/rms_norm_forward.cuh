// rms_norm's forward kernel on the CUDA row engine (common/norm_cuda.cuh), shared by rms_norm.cu (plain
// rows) and add_rms_norm.cu (kAdd: the residual added in the same pass), two translation units so that
// the two sets of instantiations compile in parallel. See rms_norm.cu for the kernel's design.
#pragma once

#include <type_traits>

#include "../common/dispatch.h"
#include "../common/norm_cuda.cuh"

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
// kCluster: a row is split over the CTAs of a thread-block cluster (block mode only), CTA k of the cluster
// taking the contiguous part [k * part_chunks, (k + 1) * part_chunks) of the row's chunks; their sums of
// squares meet in distributed shared memory, added in rank order (every CTA gets the same bits). A row too
// long for one block's registers is then kept whole in a cluster's, instead of reading its rest twice.
template <typename T, typename W, int kSlots, int kC, bool kBlockPerRow, bool kAdd, int kMaxThreads, int kMinBlocks,
          bool kCluster = false>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks)
    norm_forward_kernel(const T* __restrict__ x, int64_t x_row_stride, const T* __restrict__ residual,
                        int64_t residual_row_stride, T* __restrict__ h_out, const W* __restrict__ weight,
                        opmath_t<T> offset, T* __restrict__ y, opmath_t<T>* __restrict__ rstd, int64_t rows,
                        int64_t n, opmath_t<T> eps, int part_chunks = 0) {
  using A = opmath_t<T>;
  using S = RowSum<T>;
  using P = Processor<kBlockPerRow>;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  static_assert(!kCluster || kBlockPerRow, "a cluster splits block rows");
  // The loops over the rest of a row longer than the kept chunks (block rows only): unrolled in a warp
  // kernel, where they never run, their loads took registers.
  constexpr int kRestUnroll = kBlockPerRow ? 4 : 1;
  __shared__ S scratch[kWarpSize];
  const int threads = P::threads();
  // exact: the vector path requires n % kC == 0. 32-bit column math (n < 2^31, checked at launch): with
  // 64-bit chunk indices ptxas spent ~2 registers per kept chunk on addresses.
  int n_chunks = static_cast<int>(n / kC);
  int tid = P::tid();  // this thread's first chunk of the row: chunks tid, tid + threads, ... below n_chunks
  int64_t first_row = static_cast<int64_t>(blockIdx.x) * P::per_block() + P::in_block();
  int64_t row_step = static_cast<int64_t>(gridDim.x) * P::per_block();
  [[maybe_unused]] int cluster_size = 1;
  [[maybe_unused]] unsigned int rank = 0;
  if constexpr (kCluster) {
    cluster_size = static_cast<int>(cluster_blocks());
    rank = cluster_rank();
    tid += static_cast<int>(rank) * part_chunks;
    n_chunks = min(n_chunks, static_cast<int>(rank + 1) * part_chunks);
    first_row = blockIdx.x / cluster_size;
    row_step = gridDim.x / cluster_size;
  }
  // The cluster's partial sums, one slot per row parity: a CTA rewrites a slot two rows later, after the
  // next row's cluster barrier, which every CTA reaches only after reading this row's partials.
  [[maybe_unused]] __shared__ S cluster_partial[2];
  int parity = 0;
  for (int64_t row = first_row; row < rows; row += row_step, parity ^= 1) {  // uniform over the processor
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
    if constexpr (kCluster) {
      if (threadIdx.x == 0) cluster_partial[parity] = ss;
      cluster_barrier();  // release this CTA's partial, acquire every peer's
      ss = 0;
      for (int k = 0; k < cluster_size; ++k) ss += *cluster_peer(&cluster_partial[parity], k);  // rank order
    }
    const A r = inverse_rms(ss, n, eps);
    if (rstd != nullptr && P::tid() == 0 && rank == 0) rstd[row] = r;
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
  if constexpr (kCluster) cluster_barrier();  // peers may still read this CTA's partials: stay until they are done
}

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

// add_rms_norm keeps two rows' worth in sweep 1 (input and residual): at 8 units a thread ptxas spilled
// ~400 bytes a thread, and its forward ran at ~60% of copy bandwidth.
struct AddForwardShapes {
  static constexpr int kUnits = 4, kThreads = 512, kLongUnits = 4, kLongThreads = 512, kMinBlocks = 1;
  static constexpr int kClusterThreads = 0, kClusterMinBlocks = 1;  // no clusters (measured: no gain)
};

template <typename T, typename W, int kC, bool kAdd>
void launch_forward(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps, double offset,
                    cudaStream_t stream, int device) {
  using Shapes = std::conditional_t<kAdd, AddForwardShapes, ForwardShapes>;
  using A = opmath_t<T>;
  // The kernel's column loops step a 32-bit index by up to a block's threads: it must not wrap.
  TORCH_CHECK(n <= INT32_MAX - Shapes::kLongThreads * kC,
              "rms_norm: rows of 2^31 - 2^13 elements or more are not supported on CUDA, got ", n);
  // 16-bit rows longer than a block's registers: split over a cluster. Measured on the H200 (bf16
  // 2048x65536): 197 us against 231 us for the long block reading half the row twice. For f32 rows the
  // long block won (4096x32768: 319 us against 394 us with a cluster of 4), as it did for add_rms_norm.
  if constexpr (kC > 1 && !kAdd && is_16bit_float<T>) {
    const ClusterConfig cl = cluster_config<Shapes>(n / kC, device);
    if (cl.cluster > 0) {
      constexpr auto kernel = norm_forward_kernel<T, W, Shapes::kUnits, kC, true, false, Shapes::kClusterThreads,
                                                  Shapes::kClusterMinBlocks, true>;
      launch_cluster(kernel, rows, cl, stream, a.x, a.x_row_stride, a.residual, a.residual_row_stride, a.h_out,
                     a.weight, static_cast<A>(offset), a.y, a.rstd, rows, n, static_cast<A>(eps), cl.part_chunks);
      return;
    }
  }
  const RowConfig cfg = row_config<T, Shapes, kC>(n);
  const unsigned int blocks = blocks_to_cover(rows, cfg.rows_per_block());
  with_row_shape<T, kC, Shapes>(cfg, [&](auto slots, auto block_per_row, auto max_threads, auto min_blocks) {
    norm_forward_kernel<T, W, decltype(slots)::value, kC, decltype(block_per_row)::value, kAdd,
                        decltype(max_threads)::value, decltype(min_blocks)::value><<<blocks, cfg.threads, 0, stream>>>(
        a.x, a.x_row_stride, a.residual, a.residual_row_stride, a.h_out, a.weight, static_cast<A>(offset), a.y,
        a.rstd, rows, n, static_cast<A>(eps));
    TORCHOPS_CUDA_LAUNCH_CHECK();
  });
}

// add_rms_norm's launch (add_rms_norm.cu), for the dtype pairs of dispatch_norm_types.
template <typename T, typename W>
void launch_add_forward(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps, double offset, bool vectors,
                        cudaStream_t stream, int device);

}  // namespace rms_norm_kernels
}  // namespace torchops
