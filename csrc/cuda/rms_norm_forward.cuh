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

// Hides a kept chunk's value from the optimizer between the sweeps: otherwise it keeps sweep 1's f32
// conversions of 16-bit values live until sweep 2 (twice the registers of the packed values) and spills.
template <typename T, int kC>
__device__ __forceinline__ void keep_packed(AlignedVector<T, kC>& v) {
  if constexpr (sizeof(v) % 4 == 0 && !std::is_same_v<T, double>) {
    auto* words = reinterpret_cast<unsigned int*>(&v);
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(v) / 4); ++i) asm volatile("" : "+r"(words[i]));
  }
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
  __shared__ S scratch[kWarpSize];
  const int tid = P::tid(), threads = P::threads();
  // exact: the vector path requires n % kC == 0. 32-bit column math (n < 2^31, checked at launch): with
  // 64-bit chunk indices ptxas spent ~2 registers per kept chunk on addresses.
  const int n_chunks = static_cast<int>(n / kC);
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
    if (rstd != nullptr && tid == 0) rstd[row] = r;
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
};

template <typename T, typename W, int kC, bool kAdd>
void launch_forward(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps, double offset,
                    cudaStream_t stream) {
  using Shapes = std::conditional_t<kAdd, AddForwardShapes, ForwardShapes>;
  // The kernel's column loops step a 32-bit index by up to a block's threads: it must not wrap.
  TORCH_CHECK(n <= INT32_MAX - Shapes::kLongThreads * kC,
              "rms_norm: rows of 2^31 - 2^13 elements or more are not supported on CUDA, got ", n);
  const RowConfig cfg = row_config<T, Shapes, kC>(n);
  const unsigned int blocks = blocks_to_cover(rows, cfg.rows_per_block());
  with_row_shape<T, kC, Shapes>(cfg, [&](auto slots, auto block_per_row, auto max_threads, auto min_blocks) {
    norm_forward_kernel<T, W, decltype(slots)::value, kC, decltype(block_per_row)::value, kAdd,
                        decltype(max_threads)::value, decltype(min_blocks)::value><<<blocks, cfg.threads, 0, stream>>>(
        a.x, a.x_row_stride, a.residual, a.residual_row_stride, a.h_out, a.weight, static_cast<opmath_t<T>>(offset),
        a.y, a.rstd, rows, n, static_cast<opmath_t<T>>(eps));
    TORCHOPS_CUDA_LAUNCH_CHECK();
  });
}

// add_rms_norm's launch (add_rms_norm.cu), for the dtype pairs of dispatch_norm_types.
template <typename T, typename W>
void launch_add_forward(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps, double offset, bool vectors,
                        cudaStream_t stream);

}  // namespace rms_norm_kernels
}  // namespace torchops
