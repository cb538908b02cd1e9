// linear_cross_entropy and cross_entropy on CUDA: the loss family's row kernel (loss/loss.h) and the
// registrations; the drivers (cuBLAS matmuls through ATen, reductions, checks) are loss/loss.cpp.
//
// One block per row of logits: a first pass keeps each thread's running max, sum of exp and sum of logits
// (online softmax, one rescale per 16-byte vector), a block reduction gives the row's lse, and a second pass
// writes the gradient (in place when the row is a chunk's own logits). f32 math for 16-bit logits (their
// exp at the fast intrinsic's precision, which their rounding hides), f64 for f64. Nothing is validated on
// the device: a target outside [0, V) other than ignore_index reads nothing out of bounds, gives the row a
// NaN loss and a zero gradient.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "../core/cuda_utils.cuh"
#include "../core/dispatch.h"
#include "../loss/cross_entropy_math.h"
#include "../loss/loss.h"
#include "../loss/loss_ops.h"

namespace torchops {
namespace {

using cuda::AlignedVector;
using cuda::is_aligned;
using cuda::kFullWarpMask;
using cuda::kVectorBytes;
using cuda::kWarpSize;
using cuda::load_vector;
using cuda::store_vector;
using cuda::vector_size;
using cuda::VectorWidths;
using cuda::with_vector_size;

constexpr int kMaxThreads = 256;
constexpr int kMinBlocks = 2;  // resident blocks an SM must hold: one streams while another reduces
constexpr int kMaxWarps = kMaxThreads / kWarpSize;
constexpr int kBatch = 4;  // vectors a thread loads before using them: memory accesses in flight

template <typename T, typename Index>
struct RowsArgs {
  using A = opmath_t<T>;
  const T* logits;
  int64_t ld;
  int64_t rows, classes;
  const Index* target;
  int64_t ignore_index;
  CrossEntropyMath<A> math;
  const A* lse_in;
  A* lse_out;
  A* loss_out;
  T* grad;
  int64_t grad_ld;
  const A* scale;
  int64_t scale_step;  // 0: one scale for every row
};

template <typename T>
__device__ __forceinline__ opmath_t<T> exp_of(opmath_t<T> x) {
  if constexpr (std::is_same_v<T, double>) {
    return ::exp(x);
  } else if constexpr (is_16bit_float<T>) {
    return __expf(x);
  } else {
    return expf(x);
  }
}

template <typename T>
__device__ __forceinline__ opmath_t<T> capped(opmath_t<T> z, const CrossEntropyMath<opmath_t<T>>& math) {
  if (!math.capped()) return z;
  if constexpr (std::is_same_v<T, double>) {
    return math.softcap * ::tanh(z * math.inverse_softcap);
  } else {
    return math.softcap * tanhf(z * math.inverse_softcap);
  }
}

// A running (max, sum of exp relative to max, sum of logits).
template <typename A>
struct Running {
  A max, sum_exp, sum;
};

template <typename T>
__device__ __forceinline__ void combine(Running<opmath_t<T>>& r, opmath_t<T> other_max, opmath_t<T> other_sum_exp,
                                        opmath_t<T> other_sum) {
  using A = opmath_t<T>;
  const A m = r.max > other_max ? r.max : other_max;
  if (m == -INFINITY) {  // both empty (or every logit -inf): nothing to rescale
    r.sum += other_sum;
    return;
  }
  r.sum_exp = r.sum_exp * exp_of<T>(r.max - m) + other_sum_exp * exp_of<T>(other_max - m);
  r.max = m;
  r.sum += other_sum;
}

// Adds capped logits to a thread's running statistics: exps relative to its running max, rescaled only when the
// max grows (rarely, after the first vectors), so about one exp per logit. NaN logits never become the max, and
// their exp makes the sum NaN.
template <typename T, int kN>
__device__ __forceinline__ void accumulate(Running<opmath_t<T>>& r, const opmath_t<T> (&c)[kN]) {
  using A = opmath_t<T>;
  A vmax = -INFINITY, vsum = A(0);
#pragma unroll
  for (int e = 0; e < kN; ++e) {
    vmax = c[e] > vmax ? c[e] : vmax;
    vsum += c[e];
  }
  if (vmax > r.max) {
    r.sum_exp *= exp_of<T>(r.max - vmax);  // exp(-inf) = 0 while nothing was seen
    r.max = vmax;
  }
  if (r.max != -INFINITY) {
#pragma unroll
    for (int e = 0; e < kN; ++e) r.sum_exp += exp_of<T>(c[e] - r.max);
  }
  r.sum += vsum;
}

// The block's combined statistics, in every thread.
template <typename T>
__device__ Running<opmath_t<T>> block_reduce(Running<opmath_t<T>> r) {
  using A = opmath_t<T>;
  __shared__ A shared_max[kMaxWarps], shared_sum_exp[kMaxWarps], shared_sum[kMaxWarps];
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const A m = __shfl_xor_sync(kFullWarpMask, r.max, offset);
    const A s = __shfl_xor_sync(kFullWarpMask, r.sum_exp, offset);
    const A c = __shfl_xor_sync(kFullWarpMask, r.sum, offset);
    combine<T>(r, m, s, c);
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, warps = blockDim.x / kWarpSize;
  if (lane == 0) {
    shared_max[warp] = r.max;
    shared_sum_exp[warp] = r.sum_exp;
    shared_sum[warp] = r.sum;
  }
  __syncthreads();
  Running<A> total{shared_max[0], shared_sum_exp[0], shared_sum[0]};
  for (int w = 1; w < warps; ++w) combine<T>(total, shared_max[w], shared_sum_exp[w], shared_sum[w]);
  __syncthreads();  // the shared slots are reused by the next row
  return total;
}

template <typename T, typename Index, int kVec>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) cross_entropy_rows_kernel(RowsArgs<T, Index> a) {
  using A = opmath_t<T>;
  using Vec = AlignedVector<T, kVec>;
  const int64_t vectors = a.classes / kVec, vector_end = vectors * kVec;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kBatch;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* z = a.logits + row * a.ld;
    const auto t = static_cast<int64_t>(a.target[row]);
    const bool ignored = t == a.ignore_index, valid = !ignored && t >= 0 && t < a.classes;
    // Read before the row may be overwritten by its gradient (the block reduction below separates the two).
    const A target_logit = valid && a.loss_out && threadIdx.x == 0 ? capped<T>(static_cast<A>(z[t]), a.math) : A(0);
    A lse = A(0);
    if (a.lse_in) {
      lse = a.lse_in[row];
    } else if (a.lse_out || (valid && (a.loss_out || a.grad))) {
      Running<A> r{-INFINITY, A(0), A(0)};
      for (int64_t base = threadIdx.x; base < vectors; base += stride) {
        Vec v[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int64_t i = base + static_cast<int64_t>(u) * blockDim.x;
          if (i < vectors) v[u] = load_vector<T, kVec>(z, i);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int64_t i = base + static_cast<int64_t>(u) * blockDim.x;
          if (i >= vectors) break;
          A c[kVec];
#pragma unroll
          for (int e = 0; e < kVec; ++e) c[e] = capped<T>(static_cast<A>(v[u].val[e]), a.math);
          accumulate<T>(r, c);
        }
      }
      for (int64_t j = vector_end + threadIdx.x; j < a.classes; j += blockDim.x) {
        const A c[1] = {capped<T>(static_cast<A>(z[j]), a.math)};
        accumulate<T>(r, c);
      }
      const Running<A> total = block_reduce<T>(r);
      lse = total.max + ::log(total.sum_exp);
      if (threadIdx.x == 0) {
        if (a.lse_out) a.lse_out[row] = lse;
        if (a.loss_out && valid) a.loss_out[row] = a.math.loss(lse, target_logit, total.sum);
      }
    }
    if (a.loss_out && !valid && threadIdx.x == 0) a.loss_out[row] = ignored ? A(0) : A(NAN);
    if (a.grad) {
      T* g = a.grad + row * a.grad_ld;
      const A scale = a.scale ? a.scale[row * a.scale_step] : A(1);
      for (int64_t base = threadIdx.x; base < vectors; base += stride) {
        Vec v[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int64_t i = base + static_cast<int64_t>(u) * blockDim.x;
          if (i < vectors && valid) v[u] = load_vector<T, kVec>(z, i);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int64_t i = base + static_cast<int64_t>(u) * blockDim.x;
          if (i >= vectors) break;
          Vec out;
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            A d = A(0);
            if (valid) {
              const A c = capped<T>(static_cast<A>(v[u].val[e]), a.math);
              d = a.math.grad(exp_of<T>(c - lse), c);
              if (i * kVec + e == t) d += a.math.target_term(c);
              d *= scale;
            }
            out.val[e] = static_cast<T>(d);
          }
          store_vector<T, kVec>(g, i, out);
        }
      }
      for (int64_t j = vector_end + threadIdx.x; j < a.classes; j += blockDim.x) {
        A d = A(0);
        if (valid) {
          const A c = capped<T>(static_cast<A>(z[j]), a.math);
          d = a.math.grad(exp_of<T>(c - lse), c);
          if (j == t) d += a.math.target_term(c);
          d *= scale;
        }
        g[j] = static_cast<T>(d);
      }
    }
  }
}

// Threads per row: enough for kBatch vectors each, a power of two from a warp to kMaxThreads.
int threads_for(int64_t classes, int vec) {
  int threads = kWarpSize;
  while (threads < kMaxThreads && static_cast<int64_t>(threads) * vec * kBatch < classes) threads *= 2;
  return threads;
}

template <typename T, typename Index>
void launch(const CrossEntropyRows& r) {
  using A = opmath_t<T>;
  RowsArgs<T, Index> a{r.logits.const_data_ptr<T>(),
                       r.logits.stride(0),
                       r.logits.size(0),
                       r.logits.size(1),
                       r.target.const_data_ptr<Index>(),
                       r.options.ignore_index,
                       CrossEntropyMath<A>(r.options.label_smoothing, r.logits.size(1), r.options.softcap),
                       r.lse_in.defined() ? r.lse_in.const_data_ptr<A>() : nullptr,
                       r.lse_out.defined() ? r.lse_out.mutable_data_ptr<A>() : nullptr,
                       r.loss_out.defined() ? r.loss_out.mutable_data_ptr<A>() : nullptr,
                       r.grad.defined() ? r.grad.mutable_data_ptr<T>() : nullptr,
                       r.grad.defined() ? r.grad.stride(0) : 0,
                       r.scale.defined() ? r.scale.const_data_ptr<A>() : nullptr,
                       r.scale.defined() && r.scale.dim() > 0 ? 1 : 0};
  // 16-byte vectors when every row of logits (and of grad) starts on a 16-byte boundary.
  constexpr int kFull = vector_size<T>();
  const auto row_aligned = [&](const void* base, int64_t ld) {
    return is_aligned(base) && (ld * static_cast<int64_t>(sizeof(T))) % kVectorBytes == 0;
  };
  const bool aligned = row_aligned(a.logits, a.ld) && (a.grad == nullptr || row_aligned(a.grad, a.grad_ld));
  const int vec = aligned ? kFull : 1;
  const int threads = threads_for(a.classes, vec);
  const auto blocks = static_cast<unsigned int>(std::min<int64_t>(a.rows, INT_MAX));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  with_vector_size<T, VectorWidths::kFullOrScalar>(vec, [&](auto v) {
    cross_entropy_rows_kernel<T, Index, decltype(v)::value><<<blocks, threads, 0, stream>>>(a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void cuda_rows(const CrossEntropyRows& r) {
  const c10::cuda::CUDAGuard device_guard(r.logits.device());
  TORCHOPS_DISPATCH_FLOAT_TYPES(r.logits.scalar_type(), "cross_entropy_rows_cuda", [&] {
    TORCHOPS_DISPATCH_INDEX_TYPES(r.target.scalar_type(), "cross_entropy_rows_cuda",
                                  [&] { launch<scalar_t, index_t>(r); });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  LossOps<&cuda_rows>::register_kernels(m);
}

}  // namespace torchops
