// rms_norm and add_rms_norm forward on CUDA, on the row engine of common/norm_cuda.cuh (row processors,
// row sums, launch shapes). One kernel serves both ops: kAdd reads input and residual once, stores
// h = input + residual rounded to T (residual_out) and normalises the rounded h.
//   sweep 1 - every load of the thread's kept chunks is issued before any is used (the first version
//             loaded and summed chunk by chunk, and reached 62-78% of copy bandwidth), then the squares are
//             summed in RowSum<T> and reduced over the row;
//   sweep 2 - (h * rstd) * (weight + offset), formed in f32 (f64 for f64) and rounded once: F.rms_norm's
//             order. The weight's loads go out in groups of kWeightGroup chunks, again before any is used.
// A row longer than the kept chunks reads its remainder a second time (add_rms_norm: from residual_out,
// which the same thread wrote). 16-byte vector accesses when every row start is aligned, else the same
// kernels with element-wise (still coalesced) accesses. The backward is in rms_norm_backward.cu.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>
#include <type_traits>

#include "../common/dispatch.h"
#include "../common/empty.h"
#include "../common/norm.h"
#include "../common/norm_cuda.cuh"

namespace torchops {
namespace {

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
  const int64_t n_chunks = n / kC;  // exact: the vector path requires n % kC == 0
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
      const int64_t c = tid + static_cast<int64_t>(s) * threads;
      if (c < n_chunks) cache[s] = load_vector<T, kC>(xr, c);
    }
    if constexpr (kAdd) {
      Chunk other[kSlots];
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int64_t c = tid + static_cast<int64_t>(s) * threads;
        if (c < n_chunks) other[s] = load_vector<T, kC>(rr, c);
      }
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int64_t c = tid + static_cast<int64_t>(s) * threads;
        if (c < n_chunks) {
          cache[s] = add_rounded<A>(cache[s], other[s]);
          store_vector<T, kC>(hr, c, cache[s]);
        }
      }
    }
    S ss = 0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (tid + static_cast<int64_t>(s) * threads < n_chunks) ss += chunk_squares<A>(cache[s]);
    }
    for (int64_t c = tid + static_cast<int64_t>(kSlots) * threads; c < n_chunks; c += threads) {
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
          const int64_t c = tid + static_cast<int64_t>(g + k) * threads;
          if (c < n_chunks) wc[k] = load_vector<W, kC>(weight, c);
        }
#pragma unroll
        for (int k = 0; k < kWeightGroup && g + k < kSlots; ++k) {
          const int64_t c = tid + static_cast<int64_t>(g + k) * threads;
          if (c < n_chunks) store_vector<T, kC>(yr, c, normalize(cache[g + k], wc[k], r, offset));
        }
      }
    } else {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int64_t c = tid + static_cast<int64_t>(s) * threads;
        if (c < n_chunks) store_vector<T, kC>(yr, c, normalize(cache[s], r));
      }
    }
    for (int64_t c = tid + static_cast<int64_t>(kSlots) * threads; c < n_chunks; c += threads) {
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

template <typename T, typename W, int kC, bool kAdd>
void launch_forward(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps, double offset,
                    cudaStream_t stream) {
  const RowConfig cfg = row_config<T, ForwardShapes>(n);
  const unsigned int blocks = blocks_to_cover(rows, cfg.rows_per_block());
  with_row_shape<T, kC, ForwardShapes>(cfg, [&](auto slots, auto block_per_row, auto max_threads, auto min_blocks) {
    norm_forward_kernel<T, W, decltype(slots)::value, kC, decltype(block_per_row)::value, kAdd,
                        decltype(max_threads)::value, decltype(min_blocks)::value><<<blocks, cfg.threads, 0, stream>>>(
        a.x, a.x_row_stride, a.residual, a.residual_row_stride, a.h_out, a.weight, static_cast<opmath_t<T>>(offset),
        a.y, a.rstd, rows, n, static_cast<opmath_t<T>>(eps));
    TORCHOPS_CUDA_LAUNCH_CHECK();
  });
}

// Writes out, residual_out (with a residual) and, when `rstd` is defined, each row's rstd.
void forward_cuda_into(const at::Tensor& input, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
                       double eps, double weight_offset, const at::Tensor& out, const at::Tensor& residual_out,
                       const at::Tensor& rstd) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const NormRows x = norm_rows(input);
  if (x.rows == 0) return;
  const NormRows res = residual.defined() ? norm_rows(residual) : NormRows{};
  const at::Tensor w = dense_weight(weight);
  dispatch_norm_types(input.scalar_type(), w, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    const bool add = residual.defined();
    ForwardArgs<T, W> a{x.tensor.const_data_ptr<T>(),
                        x.row_stride,
                        add ? res.tensor.const_data_ptr<T>() : nullptr,
                        res.row_stride,
                        add ? residual_out.mutable_data_ptr<T>() : nullptr,
                        w.defined() ? w.const_data_ptr<W>() : nullptr,
                        out.mutable_data_ptr<T>(),
                        rstd.defined() ? rstd.mutable_data_ptr<opmath_t<T>>() : nullptr};
    const int64_t n = x.cols;
    const bool vectors = rows_aligned(a.x, a.x_row_stride, n) && rows_aligned<T>(a.y, n, n) &&
                         weight_aligned<T>(a.weight) &&
                         (!add || (rows_aligned(a.residual, a.residual_row_stride, n) && rows_aligned<T>(a.h_out, n, n)));
    constexpr int kV = vector_size<T>();
    if (add) {
      vectors ? launch_forward<T, W, kV, true>(a, x.rows, n, eps, weight_offset, stream)
              : launch_forward<T, W, 1, true>(a, x.rows, n, eps, weight_offset, stream);
    } else {
      vectors ? launch_forward<T, W, kV, false>(a, x.rows, n, eps, weight_offset, stream)
              : launch_forward<T, W, 1, false>(a, x.rows, n, eps, weight_offset, stream);
    }
  });
}

at::Tensor empty_rstd(const at::Tensor& input) {
  return at::detail::empty_cuda(input.sizes().slice(0, input.dim() - 1), norm_stat_dtype(input.scalar_type()),
                                input.device(), at::MemoryFormat::Contiguous);
}

at::Tensor rms_norm_cuda(const at::Tensor& input, const std::optional<at::Tensor>& weight, double eps,
                         double weight_offset) {
  check_norm_input("rms_norm", {"input", input}, weight, weight_offset);
  at::Tensor out = empty_like_dense_cuda(input);
  forward_cuda_into(input, at::Tensor(), weight, eps, weight_offset, out, at::Tensor(), at::Tensor());
  return out;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_cuda(const at::Tensor& input,
                                                         const std::optional<at::Tensor>& weight, double eps,
                                                         double weight_offset) {
  check_norm_input("_rms_norm_forward", {"input", input}, weight, weight_offset);
  at::Tensor out = empty_like_dense_cuda(input);
  at::Tensor rstd = empty_rstd(input);
  forward_cuda_into(input, at::Tensor(), weight, eps, weight_offset, out, at::Tensor(), rstd);
  return {out, rstd};
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cuda(const at::Tensor& input, const at::Tensor& residual,
                                                     const std::optional<at::Tensor>& weight, double eps,
                                                     double weight_offset) {
  check_norm_input_pair("add_rms_norm", {"input", input}, {"residual", residual}, weight, weight_offset);
  at::Tensor out = empty_like_dense_cuda(input);
  at::Tensor residual_out = empty_like_dense_cuda(input);
  forward_cuda_into(input, residual, weight, eps, weight_offset, out, residual_out, at::Tensor());
  return {out, residual_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_forward_cuda(const at::Tensor& input,
                                                                         const at::Tensor& residual,
                                                                         const std::optional<at::Tensor>& weight,
                                                                         double eps, double weight_offset) {
  check_norm_input_pair("_add_rms_norm_forward", {"input", input}, {"residual", residual}, weight, weight_offset);
  at::Tensor out = empty_like_dense_cuda(input);
  at::Tensor residual_out = empty_like_dense_cuda(input);
  at::Tensor rstd = empty_rstd(input);
  forward_cuda_into(input, residual, weight, eps, weight_offset, out, residual_out, rstd);
  return {out, residual_out, rstd};
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  m.impl("rms_norm", &rms_norm_cuda);
  m.impl("_rms_norm_forward", &rms_norm_forward_cuda);
  m.impl("add_rms_norm", &add_rms_norm_cuda);
  m.impl("_add_rms_norm_forward", &add_rms_norm_forward_cuda);
}

}  // namespace torchops
