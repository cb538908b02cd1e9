// rms_norm on CUDA. Rows are handled by "row processors": one warp per row while N fits 32 lanes x 8
// 16-byte vectors (N <= 2048 for 16-bit, 1024 for f32, 512 for f64), one block per row above that.
//   forward  - each thread keeps its part of the row in registers (up to kSlots accesses; a longer row's
//              remainder is read again for the second sweep), sums squares in f32 (f64 for f64), reduces
//              by warp shuffles (+ shared memory across the block's warps), then writes
//              (x * rstd) * weight rounded once. 16-byte vector accesses when every row start is aligned
//              (N a multiple of the vector width, aligned base and row stride, aligned weight); otherwise the
//              same kernels with element-wise (still coalesced) accesses.
//   backward - the same processors, each on a contiguous chunk of rows: dx in one pass after the row's dot
//              product, dweight accumulated per processor in shared memory; each block writes one f32 partial
//              row, and a second small kernel sums the partial rows in block order. No atomics, so dweight is
//              bit-identical from run to run on a device. When N is too large for the shared-memory
//              accumulator, dweight's partial rows come from a column-parallel kernel instead.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <type_traits>

#include "../common/cuda_utils.cuh"
#include "../common/dispatch.h"
#include "../common/empty.h"
#include "../common/norm.h"

namespace torchops {
namespace {

using namespace torchops::cuda;

constexpr int kWarpsPerBlock = 4;  // warp-per-row kernels: 4 rows at a time per 128-thread block
constexpr int kWarpMaxUnits = 8;   // 16-byte units per lane at most in warp-per-row mode
constexpr int kBlockUnits = 4;     // 16-byte units per thread cached in block-per-row mode
// Block-per-row thread caps, which are also the kernels' launch bounds (so register budgets: 64 per
// thread at 1024, 128 at 512). The backward keeps two rows' worth (x and dy) in registers: at 1024
// threads ptxas spilled its bf16 variant.
constexpr int kForwardMaxThreads = 1024;
constexpr int kBackwardMaxThreads = 512;
constexpr int kReduceRows = 16;    // dweight reduction: partial rows summed in parallel per column
constexpr size_t kDefaultSmem = 48 * 1024;

// ------------------------------------------------------------------------------------ device helpers

__device__ __forceinline__ float inverse_rms(float sum_squares, int64_t n, float eps) {
  return 1.f / sqrtf(sum_squares / static_cast<float>(n) + eps);  // mean, + eps, 1/sqrt: F.rms_norm's order
}
__device__ __forceinline__ double inverse_rms(double sum_squares, int64_t n, double eps) {
  return 1.0 / sqrt(sum_squares / static_cast<double>(n) + eps);
}

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullWarpMask, v, offset);
  return v;  // a butterfly: every lane ends with the same bits
}

// Where a thread sits: the warp (kBlockPerRow = false) or the block handles a row.
template <bool kBlockPerRow>
struct Processor {
  __device__ static int tid() { return kBlockPerRow ? threadIdx.x : threadIdx.x % kWarpSize; }
  __device__ static int threads() { return kBlockPerRow ? blockDim.x : kWarpSize; }
  __device__ static int per_block() { return kBlockPerRow ? 1 : blockDim.x / kWarpSize; }
  __device__ static int in_block() { return kBlockPerRow ? 0 : threadIdx.x / kWarpSize; }
};

// Sum over the threads of one row processor. Block mode: every thread of the block must call it (it syncs);
// `scratch` holds one value per warp.
template <bool kBlockPerRow, typename A>
__device__ __forceinline__ A row_sum(A v, A* scratch) {
  v = warp_sum(v);
  if constexpr (kBlockPerRow) {
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < static_cast<int>(blockDim.x / kWarpSize) ? scratch[lane] : A(0);
    v = warp_sum(v);
    __syncthreads();  // scratch is reused by the next row
  }
  return v;
}

template <typename T, typename W, int kC, typename A>
__device__ __forceinline__ AlignedVector<T, kC> normalize(const AlignedVector<T, kC>& v, const W* weight, int64_t c,
                                                          A r) {
  AlignedVector<T, kC> out;
  if (weight != nullptr) {
    const auto w = load_vector<W, kC>(weight, c);
#pragma unroll
    for (int e = 0; e < kC; ++e) out.val[e] = static_cast<T>(static_cast<A>(v.val[e]) * r * static_cast<A>(w.val[e]));
  } else {
#pragma unroll
    for (int e = 0; e < kC; ++e) out.val[e] = static_cast<T>(static_cast<A>(v.val[e]) * r);
  }
  return out;
}

// ----------------------------------------------------------------------------------------- forward

// Accesses are "chunks" of kC elements (one 16-byte vector, or one element); chunk c of a row covers
// elements [c * kC, c * kC + kC). A processor's thread t owns chunks t, t + threads, ...: the first kSlots
// of them stay in registers between the two sweeps. rstd may be null (rms_norm); otherwise rstd[row].
template <typename T, typename W, int kSlots, int kC, bool kBlockPerRow>
__global__ void __launch_bounds__(kBlockPerRow ? kForwardMaxThreads : kWarpSize * kWarpsPerBlock)
    rms_norm_forward_kernel(const T* __restrict__ x, int64_t x_row_stride, const W* __restrict__ weight,
                            T* __restrict__ y, opmath_t<T>* __restrict__ rstd, int64_t rows, int64_t n,
                            opmath_t<T> eps) {
  using A = opmath_t<T>;
  using P = Processor<kBlockPerRow>;
  using Chunk = AlignedVector<T, kC>;
  __shared__ A scratch[kWarpSize];
  const int tid = P::tid(), threads = P::threads();
  const int64_t n_chunks = n / kC;  // exact: the vector path requires n % kC == 0
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * P::per_block() + P::in_block();
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * P::per_block();
  for (int64_t row = first_row; row < rows; row += row_step) {  // uniform over the processor
    const T* xr = x + row * x_row_stride;
    T* yr = y + row * n;
    Chunk cache[kSlots];
    A ss = 0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int64_t c = tid + static_cast<int64_t>(s) * threads;
      if (c < n_chunks) {
        cache[s] = load_vector<T, kC>(xr, c);
#pragma unroll
        for (int e = 0; e < kC; ++e) {
          const A v = static_cast<A>(cache[s].val[e]);
          ss += v * v;
        }
      }
    }
    for (int64_t c = tid + static_cast<int64_t>(kSlots) * threads; c < n_chunks; c += threads) {
      const Chunk v = load_vector<T, kC>(xr, c);
#pragma unroll
      for (int e = 0; e < kC; ++e) {
        const A a = static_cast<A>(v.val[e]);
        ss += a * a;
      }
    }
    ss = row_sum<kBlockPerRow>(ss, scratch);
    const A r = inverse_rms(ss, n, eps);
    if (rstd != nullptr && tid == 0) rstd[row] = r;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int64_t c = tid + static_cast<int64_t>(s) * threads;
      if (c < n_chunks) store_vector<T, kC>(yr, c, normalize(cache[s], weight, c, r));
    }
    for (int64_t c = tid + static_cast<int64_t>(kSlots) * threads; c < n_chunks; c += threads) {
      store_vector<T, kC>(yr, c, normalize(load_vector<T, kC>(xr, c), weight, c, r));
    }
  }
}

// ---------------------------------------------------------------------------------------- backward

// sum over a chunk of (dy * w) * x (w = 1 when !scale_by_w).
template <typename A, typename T, typename W, int kC>
__device__ __forceinline__ A dot_dyw_x(const AlignedVector<T, kC>& xv, const AlignedVector<T, kC>& gv,
                                       const AlignedVector<W, kC>& wv, bool scale_by_w) {
  A s = 0;
#pragma unroll
  for (int e = 0; e < kC; ++e) {
    const A g = static_cast<A>(gv.val[e]);
    s += (scale_by_w ? g * static_cast<A>(wv.val[e]) : g) * static_cast<A>(xv.val[e]);
  }
  return s;
}

// dx of a chunk: rstd * (dy * w) - c3 * x, with c3 = rstd^3 / N * sum((dy * w) * x).
template <typename T, typename W, int kC, typename A>
__device__ __forceinline__ AlignedVector<T, kC> input_grad(const AlignedVector<T, kC>& xv,
                                                           const AlignedVector<T, kC>& gv,
                                                           const AlignedVector<W, kC>& wv, bool scale_by_w, A r,
                                                           A c3) {
  AlignedVector<T, kC> out;
#pragma unroll
  for (int e = 0; e < kC; ++e) {
    const A g = static_cast<A>(gv.val[e]);
    out.val[e] = static_cast<T>(r * (scale_by_w ? g * static_cast<A>(wv.val[e]) : g) - c3 * static_cast<A>(xv.val[e]));
  }
  return out;
}

// acc[e * n_chunks + c] += dy * x * rstd for the chunk's elements. The kC shared-memory loads are issued
// before any store: written as kC read-modify-writes, the compiler (unable to tell the addresses apart)
// serialized them, a shared-memory round trip per element.
template <typename A, typename T, int kC>
__device__ __forceinline__ void accumulate_dw(A* acc, int n_chunks, int c, const AlignedVector<T, kC>& xv,
                                              const AlignedVector<T, kC>& gv, A r) {
  A sums[kC];
#pragma unroll
  for (int e = 0; e < kC; ++e) sums[e] = acc[e * n_chunks + c];
#pragma unroll
  for (int e = 0; e < kC; ++e) {
    acc[e * n_chunks + c] = sums[e] + static_cast<A>(gv.val[e]) * static_cast<A>(xv.val[e]) * r;
  }
}

// Block b takes rows [b * rows_per_block, (b + 1) * rows_per_block); its processors take every
// per_block()-th of them. dx may be null (not requested). dw_partial ([gridDim.x, n], or null when dweight
// is not wanted here) receives the block's sum of dy * x * rstd over its rows: each processor accumulates
// into its own shared-memory row (`procs x n` values of A, dynamic), summed in processor order at the end.
// That row is stored element-major (element e of chunk c at e * n_chunks + c): a thread owns whole chunks,
// so chunk-major order put a warp's lanes kC values apart, an 8-way bank conflict for bf16 vectors.
template <typename T, typename W, int kSlots, int kC, bool kBlockPerRow>
__global__ void __launch_bounds__(kBlockPerRow ? kBackwardMaxThreads : kWarpSize * kWarpsPerBlock)
    rms_norm_backward_kernel(const T* __restrict__ dy, int64_t dy_row_stride, const T* __restrict__ x,
                             int64_t x_row_stride, const W* __restrict__ weight,
                             const opmath_t<T>* __restrict__ rstd, T* __restrict__ dx,
                             opmath_t<T>* __restrict__ dw_partial, int64_t rows, int n, int64_t rows_per_block) {
  using A = opmath_t<T>;
  using P = Processor<kBlockPerRow>;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  __shared__ A scratch[kWarpSize];
  A* dw_acc = reinterpret_cast<A*>(dynamic_smem);
  A* my_acc = dw_acc + P::in_block() * n;
  const bool want_dw = dw_partial != nullptr;                     // uniform over the grid
  const bool scale_by_w = dx != nullptr && weight != nullptr;  // the weight enters dx only
  const int procs = P::per_block();
  if (want_dw) {
    for (int i = threadIdx.x; i < procs * n; i += blockDim.x) dw_acc[i] = A(0);  // fits: shared memory
    __syncthreads();
  }

  const int tid = P::tid(), threads = P::threads();
  const int n_chunks = n / kC;  // 32-bit column math: n < 2^31 (checked at launch), fewer registers
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t end = begin + rows_per_block < rows ? begin + rows_per_block : rows;
  for (int64_t row = begin + P::in_block(); row < end; row += procs) {  // uniform over the processor
    const T* dyr = dy + row * dy_row_stride;
    const T* xr = x + row * x_row_stride;
    const A r = rstd[row];
    // Every load of the row's cached part (x, dy and the weight) is issued before any of them is used, and
    // the flags are tested per row, not per element: the first version loaded each slot's weight after
    // the previous slot's arithmetic and branched per element, and ran at ~57% of copy for bf16.
    Chunk xc[kSlots], gc[kSlots];
    WChunk wc[kSlots];  // loaded and read only when scale_by_w (the ?: in the helpers)
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int c = tid + k * threads;
      if (c < n_chunks) {
        xc[k] = load_vector<T, kC>(xr, c);
        gc[k] = load_vector<T, kC>(dyr, c);
        if (scale_by_w) wc[k] = load_vector<W, kC>(weight, c);
      }
    }
    A s = 0;  // sum over the row of (dy * w) * x, needed for dx only
    if (dx != nullptr) {
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        if (tid + k * threads < n_chunks) s += dot_dyw_x<A>(xc[k], gc[k], wc[k], scale_by_w);
      }
      for (int c = tid + kSlots * threads; c < n_chunks; c += threads) {
        const WChunk w = scale_by_w ? load_vector<W, kC>(weight, c) : WChunk{};
        s += dot_dyw_x<A>(load_vector<T, kC>(xr, c), load_vector<T, kC>(dyr, c), w, scale_by_w);
      }
      s = row_sum<kBlockPerRow>(s, scratch);
      // dx = rstd * (dy * w) - x * rstd^3 / N * s
      const A c3 = r * r * r * s / static_cast<A>(n);
      T* dxr = dx + row * n;
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        const int c = tid + k * threads;
        if (c < n_chunks) store_vector<T, kC>(dxr, c, input_grad(xc[k], gc[k], wc[k], scale_by_w, r, c3));
      }
      for (int c = tid + kSlots * threads; c < n_chunks; c += threads) {
        const WChunk w = scale_by_w ? load_vector<W, kC>(weight, c) : WChunk{};
        store_vector<T, kC>(dxr, c, input_grad(load_vector<T, kC>(xr, c), load_vector<T, kC>(dyr, c), w, scale_by_w,
                                               r, c3));
      }
    }
    if (want_dw) {  // dweight += dy * x * rstd, element-major (see above): lanes hit consecutive banks
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        const int c = tid + k * threads;
        if (c < n_chunks) accumulate_dw(my_acc, n_chunks, c, xc[k], gc[k], r);
      }
      for (int c = tid + kSlots * threads; c < n_chunks; c += threads) {
        accumulate_dw(my_acc, n_chunks, c, load_vector<T, kC>(xr, c), load_vector<T, kC>(dyr, c), r);
      }
    }
  }

  if (want_dw) {
    __syncthreads();
    A* out = dw_partial + static_cast<int64_t>(blockIdx.x) * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int at = (i % kC) * n_chunks + i / kC;  // column i in the element-major accumulator
      A v = dw_acc[at];
      for (int p = 1; p < procs; ++p) v += dw_acc[p * n + at];
      out[i] = v;
    }
  }
}

// dweight's partial rows when N is too large for the shared-memory accumulator: thread = one column,
// blockIdx.y = one chunk of rows_per_part rows, summed in row order.
template <typename T>
__global__ void rms_norm_dw_columns_kernel(const T* __restrict__ dy, int64_t dy_row_stride, const T* __restrict__ x,
                                           int64_t x_row_stride, const opmath_t<T>* __restrict__ rstd,
                                           opmath_t<T>* __restrict__ dw_partial, int64_t rows, int64_t n,
                                           int64_t rows_per_part) {
  using A = opmath_t<T>;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= n) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_part;
  const int64_t end = begin + rows_per_part < rows ? begin + rows_per_part : rows;
  A v = 0;
  for (int64_t row = begin; row < end; ++row) {
    v += static_cast<A>(dy[row * dy_row_stride + col]) * static_cast<A>(x[row * x_row_stride + col]) * rstd[row];
  }
  dw_partial[static_cast<int64_t>(blockIdx.y) * n + col] = v;
}

// dweight[col] = sum over p of partial[p, col], in a fixed order: thread (x, y) sums p = y, y + kReduceRows,
// ... in order, then row y == 0 adds the kReduceRows sums in order of y.
template <typename A, typename W>
__global__ void __launch_bounds__(kWarpSize * kReduceRows)
    rms_norm_dw_reduce_kernel(const A* __restrict__ partial, int64_t parts, int64_t n, W* __restrict__ dw) {
  __shared__ A sums[kReduceRows][kWarpSize + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarpSize + threadIdx.x;
  A v = 0;
  if (col < n) {
    for (int64_t p = threadIdx.y; p < parts; p += kReduceRows) v += partial[p * n + col];
  }
  sums[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    A total = sums[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < kReduceRows; ++k) total += sums[k][threadIdx.x];
    dw[col] = static_cast<W>(total);
  }
}

// ------------------------------------------------------------------------------------------ launches

// Chunks of kC elements a thread keeps in registers per 16-byte unit of its share: one vector, or half a
// vector's worth of single elements (element-wise, each value takes a whole register; ptxas spilled
// with a full vector's worth).
template <typename T, int kC>
constexpr int chunks_per_unit() {
  return kC == 1 ? (vector_size<T>() / 2 > 1 ? vector_size<T>() / 2 : 1) : 1;
}

// The geometry of a launch. Row sizes are counted in 16-byte units of T.
struct RowConfig {
  bool block_per_row;
  int units;    // 16-byte units per thread kept in registers: 1, 4 or 8 (warp), kBlockUnits (block)
  int threads;  // per block
};

// Warp per row up to 32 lanes x kWarpMaxUnits units, else a block per row with enough threads to hold
// the row (kBlockUnits units each, up to max_threads; the rest of a longer row is read twice).
template <typename T, int kC>
RowConfig row_config(int64_t n, int max_threads) {
  constexpr int kUnit = vector_size<T>();
  const int64_t n_units = (n + kUnit - 1) / kUnit;
  if (n_units <= int64_t{kWarpSize} * kWarpMaxUnits) {
    const int units = n_units <= kWarpSize ? 1 : n_units <= 4 * kWarpSize ? 4 : kWarpMaxUnits;
    return {false, units, kWarpSize * kWarpsPerBlock};
  }
  const int64_t per_thread = int64_t{kBlockUnits} * chunks_per_unit<T, kC>() * kC;  // elements
  const int64_t threads = (n + per_thread - 1) / per_thread;
  const int64_t rounded = (threads + kWarpSize - 1) / kWarpSize * kWarpSize;
  return {true, kBlockUnits, static_cast<int>(std::min<int64_t>(max_threads, rounded))};
}

// Every row start of x (and of the dense output rows) 16-byte aligned, and the weight aligned for its own
// kUnit-wide loads: then chunks are whole vectors.
template <typename T, typename W>
bool rows_vectorizable(const T* x, int64_t x_row_stride, const T* out, int64_t n, const W* weight) {
  constexpr int kUnit = vector_size<T>();
  return n % kUnit == 0 && x_row_stride % kUnit == 0 && is_aligned(x) && is_aligned(out) &&
         (weight == nullptr || is_aligned(weight, static_cast<int>(sizeof(W)) * kUnit));
}

// Calls fn(std::integral_constant<int, kSlots>, std::bool_constant<kBlockPerRow>) for the config.
template <typename T, int kC, typename Fn>
void with_slots(const RowConfig& cfg, Fn&& fn) {
  constexpr int kPerUnit = chunks_per_unit<T, kC>();
  if (cfg.block_per_row) return fn(std::integral_constant<int, kBlockUnits * kPerUnit>{}, std::true_type{});
  switch (cfg.units) {
    case 1: return fn(std::integral_constant<int, 1 * kPerUnit>{}, std::false_type{});
    case 4: return fn(std::integral_constant<int, 4 * kPerUnit>{}, std::false_type{});
    default: return fn(std::integral_constant<int, kWarpMaxUnits * kPerUnit>{}, std::false_type{});
  }
}

template <typename T, typename W, int kC>
void launch_forward(const NormRows& x, const W* w, T* y, opmath_t<T>* rstd, double eps, cudaStream_t stream) {
  const RowConfig cfg = row_config<T, kC>(x.cols, kForwardMaxThreads);
  const int per_block = cfg.block_per_row ? 1 : cfg.threads / kWarpSize;
  const unsigned int blocks = blocks_to_cover(x.rows, per_block);
  with_slots<T, kC>(cfg, [&](auto slots, auto block_per_row) {
    rms_norm_forward_kernel<T, W, decltype(slots)::value, kC, decltype(block_per_row)::value>
        <<<blocks, cfg.threads, 0, stream>>>(x.tensor.const_data_ptr<T>(), x.row_stride, w, y, rstd, x.rows, x.cols,
                                             static_cast<opmath_t<T>>(eps));
    TORCHOPS_CUDA_LAUNCH_CHECK();
  });
}

void forward_cuda_into(const at::Tensor& input, const std::optional<at::Tensor>& weight, double eps,
                       const at::Tensor& out, const at::Tensor& rstd) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const NormRows x = norm_rows(input);
  if (x.rows == 0) return;
  const at::Tensor w = dense_weight(weight);
  dispatch_norm_types(input.scalar_type(), w, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    const T* px = x.tensor.const_data_ptr<T>();
    const W* pw = w.defined() ? w.const_data_ptr<W>() : nullptr;
    T* py = out.mutable_data_ptr<T>();
    opmath_t<T>* pr = rstd.defined() ? rstd.mutable_data_ptr<opmath_t<T>>() : nullptr;
    if (rows_vectorizable(px, x.row_stride, py, x.cols, pw)) {
      launch_forward<T, W, vector_size<T>()>(x, pw, py, pr, eps, stream);
    } else {
      launch_forward<T, W, 1>(x, pw, py, pr, eps, stream);
    }
  });
}

at::Tensor empty_cuda(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& like) {
  return at::detail::empty_cuda(sizes, dtype, like.device(), at::MemoryFormat::Contiguous);
}

at::Tensor rms_norm_cuda(const at::Tensor& input, const std::optional<at::Tensor>& weight, double eps) {
  check_norm_input("rms_norm", {"input", input}, weight);
  at::Tensor out = empty_like_dense_cuda(input);
  forward_cuda_into(input, weight, eps, out, at::Tensor());
  return out;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_cuda(const at::Tensor& input,
                                                         const std::optional<at::Tensor>& weight, double eps) {
  check_norm_input("_rms_norm_forward", {"input", input}, weight);
  at::Tensor out = empty_like_dense_cuda(input);
  at::Tensor rstd = empty_cuda(input.sizes().slice(0, input.dim() - 1), norm_stat_dtype(input.scalar_type()), input);
  forward_cuda_into(input, weight, eps, out, rstd);
  return {out, rstd};
}

template <typename T, typename W, int kC>
void launch_backward(const NormRows& dy, const NormRows& x, const W* w, const opmath_t<T>* rstd, T* dx,
                     const at::Tensor& grad_weight, int device, cudaStream_t stream) {
  using A = opmath_t<T>;
  const int64_t rows = x.rows, n = x.cols;
  // The kernel's column loops step a 32-bit index by up to kBackwardMaxThreads: it must not wrap.
  TORCH_CHECK(n <= INT32_MAX - kBackwardMaxThreads,
              "_rms_norm_backward: rows of more than 2^31 - 513 elements are not supported on CUDA, got ", n);
  const RowConfig cfg = row_config<T, kC>(n, kBackwardMaxThreads);
  const int per_block = cfg.block_per_row ? 1 : cfg.threads / kWarpSize;
  const bool want_dw = grad_weight.defined();
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount, device);
  with_slots<T, kC>(cfg, [&](auto slots, auto block_per_row) {
    const auto kernel = rms_norm_backward_kernel<T, W, decltype(slots)::value, kC, decltype(block_per_row)::value>;
    // dweight in shared memory when it fits (opting in above the default 48 KiB), else the column kernel.
    const size_t smem_bytes = static_cast<size_t>(per_block) * n * sizeof(A);
    const size_t smem_limit =
        static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) - kWarpSize * sizeof(A);
    const bool dw_in_smem = want_dw && smem_bytes <= smem_limit;
    const size_t smem = dw_in_smem ? smem_bytes : 0;
    if (smem > kDefaultSmem) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    }
    // A grid as large as fits on the device at once (each block loops over its own chunk of rows), so
    // there are as few dweight partial rows as possible. Fixed for a device and shape: deterministic.
    const int64_t max_blocks = static_cast<int64_t>(sms) * resident_blocks_per_sm(kernel, cfg.threads, smem);
    const int64_t wanted = (rows + per_block - 1) / per_block;
    int64_t blocks = std::max<int64_t>(1, std::min(max_blocks, wanted));
    const int64_t rows_per_block = (rows + blocks - 1) / blocks;
    blocks = (rows + rows_per_block - 1) / rows_per_block;

    TORCH_INTERNAL_ASSERT(blocks <= 65535);  // the column kernel's grid.y; blocks <= SMs x resident blocks

    at::Tensor partial;
    if (want_dw) partial = at::detail::empty_cuda({blocks, n}, at::CppTypeToScalarType<A>::value, grad_weight.device(),
                                                  at::MemoryFormat::Contiguous);
    if (dx != nullptr || dw_in_smem) {
      kernel<<<static_cast<unsigned int>(blocks), cfg.threads, smem, stream>>>(
          dy.tensor.const_data_ptr<T>(), dy.row_stride, x.tensor.const_data_ptr<T>(), x.row_stride, w, rstd, dx,
          dw_in_smem ? partial.mutable_data_ptr<A>() : nullptr, rows, static_cast<int>(n), rows_per_block);
      TORCHOPS_CUDA_LAUNCH_CHECK();
    }
    if (!want_dw) return;
    if (!dw_in_smem) {  // dweight's partial rows from a second read of dy and x
      constexpr int kColThreads = 256;
      const dim3 grid(blocks_to_cover(n, kColThreads), static_cast<unsigned int>(blocks));
      rms_norm_dw_columns_kernel<T><<<grid, kColThreads, 0, stream>>>(
          dy.tensor.const_data_ptr<T>(), dy.row_stride, x.tensor.const_data_ptr<T>(), x.row_stride, rstd,
          partial.mutable_data_ptr<A>(), rows, n, rows_per_block);
      TORCHOPS_CUDA_LAUNCH_CHECK();
    }
    rms_norm_dw_reduce_kernel<A, W><<<blocks_to_cover(n, kWarpSize), dim3(kWarpSize, kReduceRows), 0, stream>>>(
        partial.const_data_ptr<A>(), blocks, n, grad_weight.mutable_data_ptr<W>());
    TORCHOPS_CUDA_LAUNCH_CHECK();
  });
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cuda(const at::Tensor& grad_out, const at::Tensor& input,
                                                          const std::optional<at::Tensor>& weight,
                                                          const at::Tensor& rstd, bool input_grad, bool weight_grad) {
  check_norm_backward("_rms_norm_backward", {"grad_out", grad_out}, {"input", input}, weight, {"rstd", rstd},
                      weight_grad);
  const c10::cuda::CUDAGuard device_guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor w = dense_weight(weight);
  at::Tensor grad_input, grad_weight;
  std::tie(grad_input, grad_weight) = norm_backward_outputs(
      input, w, input_grad, weight_grad,
      [&](c10::IntArrayRef sizes, at::ScalarType dtype) { return empty_cuda(sizes, dtype, input); });
  if (!input_grad && !weight_grad) return {grad_input, grad_weight};
  const NormRows x = norm_rows(input);
  if (x.rows == 0) {
    if (weight_grad) grad_weight.zero_();  // a sum over no rows
    return {grad_input, grad_weight};
  }
  const NormRows dy = norm_rows(grad_out);
  const at::Tensor r = rstd.contiguous();
  dispatch_norm_types(input.scalar_type(), w, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    const T* px = x.tensor.const_data_ptr<T>();
    const T* pdy = dy.tensor.const_data_ptr<T>();
    const W* pw = w.defined() ? w.const_data_ptr<W>() : nullptr;
    T* pdx = input_grad ? grad_input.mutable_data_ptr<T>() : nullptr;
    const opmath_t<T>* pr = r.const_data_ptr<opmath_t<T>>();
    const at::Tensor gw = weight_grad ? grad_weight : at::Tensor();
    const int device = input.device().index();
    // The dense output (dx, or a stand-in aligned pointer when dx isn't written) shares x's alignment test.
    const T* out_for_alignment = pdx != nullptr ? pdx : px;
    if (rows_vectorizable(px, x.row_stride, out_for_alignment, x.cols, pw) && dy.row_stride % vector_size<T>() == 0 &&
        is_aligned(pdy)) {
      launch_backward<T, W, vector_size<T>()>(dy, x, pw, pr, pdx, gw, device, stream);
    } else {
      launch_backward<T, W, 1>(dy, x, pw, pr, pdx, gw, device, stream);
    }
  });
  return {grad_input, grad_weight};
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  m.impl("rms_norm", &rms_norm_cuda);
  m.impl("_rms_norm_forward", &rms_norm_forward_cuda);
  m.impl("_rms_norm_backward", &rms_norm_backward_cuda);
}

}  // namespace torchops
