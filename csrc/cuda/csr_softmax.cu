// csr_softmax and its backward on CUDA: per row and head, over the row's nonzeros,
//   forward   y = exp(x - max) / sum(exp(x - max));
//   backward  grad_x = y * (grad_y - sum(grad_y * y)), y recomputed from x.
// Two walks over merge-path units (csr/csr_cuda.cuh), as many heads side by side as fit a warp (G lanes per
// nonzero, G the power of two >= min(H, 32); more heads take further tiles, grid.y), the warp's 32 / G groups
// on consecutive nonzeros (so a warp reads a contiguous stretch of the (nnz, H) values):
//   1. the statistics of each row, online: (max m, sum s of exp(x - m)) and for the backward
//      q = sum of grad_y * exp(x - m), each new maximum rescaling the sums; rows several units share are
//      completed by merge_carry_kernel (the merge of two such partials is commutative, bit for bit);
//   2. each nonzero's result from its row's statistics: y = exp(x - m) / s, and grad_x = y (grad_y - q / s).
// f32 math for 16-bit values and f32, f64 for f64. An empty partial has s = 0 (a nonempty one has s >= 1, or
// NaN); a NaN makes its row NaN, as in torch.softmax. Deterministic: every sum is taken in a fixed order that
// depends on the shapes and the GPU only. Indices are never validated (no host sync): crow values are
// clamped as everywhere in csr_cuda.cuh, and positions stay below nnz.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <limits>

#include "../core/cuda_utils.cuh"
#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../csr/csr.h"
#include "../csr/csr_cuda.cuh"

namespace torchops {
namespace {

using namespace torchops::cuda;

template <typename Acc>
struct Stat {
  Acc m, s, q;  // running max, sum of exp(x - m), sum of grad_y * exp(x - m) (backward)
};

template <typename Acc>
__device__ __forceinline__ Stat<Acc> empty_stat() {
  return {-std::numeric_limits<Acc>::infinity(), Acc(0), Acc(0)};
}

// The statistics of two disjoint parts of a row (commutative: either order gives the same bits).
template <typename Acc>
__device__ __forceinline__ Stat<Acc> merge(const Stat<Acc>& a, const Stat<Acc>& b) {
  if (a.s == Acc(0)) return b;
  if (b.s == Acc(0)) return a;
  const Acc top = (a.m != a.m || b.m != b.m) ? a.m + b.m : ::max(a.m, b.m);  // NaN stays
  // Equal maxima scale by exactly 1: two parts of a row whose maximum is -inf (or +inf) would otherwise take
  // exp(inf - inf), a NaN the CPU's two-pass softmax never forms for them.
  const Acc ea = a.m == top ? Acc(1) : ::exp(a.m - top), eb = b.m == top ? Acc(1) : ::exp(b.m - top);
  return {top, a.s * ea + b.s * eb, a.q * ea + b.q * eb};
}

// One element x (with its incoming gradient g) added to a row's statistics.
template <typename Acc>
__device__ __forceinline__ void add(Stat<Acc>& st, Acc x, Acc g) {
  if (st.s == Acc(0)) {
    st = {x, Acc(1), g};
  } else if (x > st.m) {
    const Acc e = ::exp(st.m - x);
    st = {x, st.s * e + Acc(1), st.q * e + g};
  } else {
    const Acc e = x == st.m ? Acc(1) : ::exp(x - st.m);  // a second -inf adds 1, as exp(x - max) on the CPU
    st.s += e;
    st.q += g * e;
  }
}

template <typename T, typename Index>
struct SoftmaxArgs : MergePathArgs<Index> {  // N: H
  const T* x;      // nnz x H
  const T* grad;   // nnz x H (backward), or null
  T* out;          // nnz x H
  using Acc = opmath_t<T>;
  Stat<Acc>* stats;  // M x H
  Stat<Acc>* carry;  // units x H
  Stat<Acc>* head;   // units x H: the part of row start.row a unit u > 0 ends
  int64_t* carry_row;
};

// The combination over the warp's 32 / G groups (butterfly).
template <int G, typename Acc>
__device__ __forceinline__ Stat<Acc> merge_over_groups(Stat<Acc> st) {
#pragma unroll
  for (int offset = G; offset < kWarpSize; offset <<= 1) {
    const Stat<Acc> other{__shfl_xor_sync(kFullWarpMask, st.m, offset), __shfl_xor_sync(kFullWarpMask, st.s, offset),
                          __shfl_xor_sync(kFullWarpMask, st.q, offset)};
    st = merge(st, other);
  }
  return st;
}

// Walk 1: the statistics of the rows that end in each unit (of the carried-in first row: its last part, in
// head), and the unit's carry.
template <typename T, typename Index, int G, bool kBackward>
__global__ void __launch_bounds__(kWarpBlockThreads) softmax_stats_kernel(const SoftmaxArgs<T, Index> a) {
  using Acc = opmath_t<T>;
  constexpr int kGroups = kWarpSize / G;
  const int lane = threadIdx.x % kWarpSize;
  const int group = lane / G;
  int64_t unit;
  MergeCoord start, end;
  if (!warp_merge_unit(a, unit, start, end)) return;  // whole warps only
  const bool has_carry = end.row < a.M && end.row >= start.row;
  if (blockIdx.y == 0 && lane == 0) a.carry_row[unit] = has_carry ? end.row : -1;
  const int64_t H = a.N;
  for (int64_t tile = blockIdx.y; tile * kWarpSize < H; tile += gridDim.y) {
    const int64_t h = tile * kWarpSize + lane % G;
    const bool hok = h < H;  // G lanes span min(H, 32) heads, rounded up to a power of two
    Stat<Acc> st = empty_stat<Acc>();
    int64_t j = start.nz;
    for (int64_t r = start.row; r <= end.row && r < a.M; ++r) {
      const int64_t re = unit_row_end(a.crow, r, j, end, a.nnz);
      if (hok) {
        for (int64_t p = j + group; p < re; p += kGroups) {
          const Acc g = kBackward ? static_cast<Acc>(a.grad[p * H + h]) : Acc(0);
          add(st, static_cast<Acc>(a.x[p * H + h]), g);
        }
      }
      j = re;
      if (r < end.row) {
        st = merge_over_groups<G>(st);
        if (group == 0 && hok) {
          if (r == start.row && unit > 0) {
            a.head[unit * H + h] = st;  // began in an earlier unit, which carries it
          } else {
            a.stats[r * H + h] = st;
          }
        }
        st = empty_stat<Acc>();
      }
    }
    if (has_carry) {
      st = merge_over_groups<G>(st);
      if (group == 0 && hok) a.carry[unit * H + h] = st;
    }
  }
}

// merge_carry_kernel's policy: a shared row's statistics from its run's carries and the ending unit's part.
template <typename AccScalar>
struct SoftmaxCarry {
  using Acc = Stat<AccScalar>;
  const Acc* carry;
  const Acc* head;
  Acc* stats;
  int64_t units, columns;

  __device__ static Acc identity() { return empty_stat<AccScalar>(); }
  __device__ static Acc combine(const Acc& earlier, const Acc& later) { return merge(earlier, later); }
  __device__ Acc carry_of(int64_t unit, int64_t h) const { return carry[unit * columns + h]; }
  __device__ void finish(int64_t r, int64_t ending, int64_t h, const Acc& run) const {
    stats[r * columns + h] = ending < units ? merge(run, head[ending * columns + h]) : run;
  }
};

// Walk 2: every nonzero from its row's statistics.
template <typename T, typename Index, int G, bool kBackward>
__global__ void __launch_bounds__(kWarpBlockThreads) softmax_apply_kernel(const SoftmaxArgs<T, Index> a) {
  using Acc = opmath_t<T>;
  constexpr int kGroups = kWarpSize / G;
  const int lane = threadIdx.x % kWarpSize;
  const int group = lane / G;
  int64_t unit;
  MergeCoord start, end;
  if (!warp_merge_unit(a, unit, start, end)) return;
  const int64_t H = a.N;
  for (int64_t tile = blockIdx.y; tile * kWarpSize < H; tile += gridDim.y) {
    const int64_t h = tile * kWarpSize + lane % G;
    const bool hok = h < H;
    int64_t j = start.nz;
    for (int64_t r = start.row; r <= end.row && r < a.M; ++r) {
      const int64_t re = unit_row_end(a.crow, r, j, end, a.nnz);
      if (hok && j < re) {
        const Stat<Acc> st = a.stats[r * H + h];
        // A row whose maximum is +inf is NaN throughout, as the CPU's sum of exp(x - max) holds exp(inf - inf).
        const Acc s = st.m == std::numeric_limits<Acc>::infinity() ? std::numeric_limits<Acc>::quiet_NaN() : st.s;
        const Acc t = kBackward ? st.q / s : Acc(0);  // sum over the row of grad_y * y
        for (int64_t p = j + group; p < re; p += kGroups) {
          const Acc y = ::exp(static_cast<Acc>(a.x[p * H + h]) - st.m) / s;
          a.out[p * H + h] = static_cast<T>(kBackward ? y * (static_cast<Acc>(a.grad[p * H + h]) - t) : y);
        }
      }
      j = re;
    }
  }
}

template <typename T, typename Index, int G, bool kBackward>
void launch_softmax(SoftmaxArgs<T, Index> a, const at::Tensor& like, cudaStream_t stream) {
  using Acc = opmath_t<T>;
  constexpr auto kStats = softmax_stats_kernel<T, Index, G, kBackward>;
  constexpr auto kApply = softmax_apply_kernel<T, Index, G, kBackward>;
  const int64_t tiles = (a.N + kWarpSize - 1) / kWarpSize;
  const auto part = merge_partition(a.M, a.nnz, tiles, resident_warps<kStats, kWarpBlockThreads>(like.get_device()));
  a.per_unit = part.per_unit;
  a.units = part.units;
  constexpr auto kAccType = c10::CppTypeToScalarType<Acc>::value;
  constexpr int64_t kPerStat = sizeof(Stat<Acc>) / sizeof(Acc);
  const auto stats_of = [&](int64_t n) { return empty_dense_cuda({n * a.N * kPerStat}, kAccType, like.device()); };
  at::Tensor stats = stats_of(a.M), carry = stats_of(a.units), head = stats_of(a.units);
  at::Tensor carry_row = empty_dense_cuda({a.units}, at::kLong, like.device());
  a.stats = reinterpret_cast<Stat<Acc>*>(stats.mutable_data_ptr<Acc>());
  a.carry = reinterpret_cast<Stat<Acc>*>(carry.mutable_data_ptr<Acc>());
  a.head = reinterpret_cast<Stat<Acc>*>(head.mutable_data_ptr<Acc>());
  a.carry_row = carry_row.mutable_data_ptr<int64_t>();
  const dim3 grid(blocks_to_cover(a.units, kWarpsPerBlock), static_cast<unsigned int>(std::min<int64_t>(tiles, kMaxGridYZ)));
  kStats<<<grid, kWarpBlockThreads, 0, stream>>>(a);
  TORCHOPS_CUDA_LAUNCH_CHECK();
  SoftmaxCarry<Acc> policy{a.carry, a.head, a.stats, a.units, a.N};
  launch_merge_carry(a, a.carry_row, policy, stream);
  kApply<<<grid, kWarpBlockThreads, 0, stream>>>(a);
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

// The forward (grad undefined) or the backward.
at::Tensor softmax_into(const at::Tensor& crow_in, const at::Tensor& values_in, const at::Tensor& grad_in) {
  const c10::cuda::CUDAGuard device_guard(values_in.device());
  const bool backward = grad_in.defined();
  at::Tensor out = empty_like_dense_cuda(values_in);
  if (out.numel() == 0) return out;
  const at::Tensor crow = crow_in.contiguous(), values = values_in.contiguous();
  const at::Tensor grad = backward ? grad_in.contiguous() : at::Tensor();
  const int64_t H = values.dim() == 2 ? values.size(1) : 1;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCHOPS_DISPATCH_INDEX_TYPES(crow.scalar_type(), "csr_softmax_cuda", [&] {
    TORCHOPS_DISPATCH_FLOAT_TYPES(values.scalar_type(), "csr_softmax_cuda", [&] {
      SoftmaxArgs<scalar_t, index_t> a{};
      a.crow = crow.const_data_ptr<index_t>();
      a.col = nullptr;
      a.M = crow.numel() - 1;
      a.K = 0;
      a.N = H;
      a.nnz = values.size(0);
      a.x = values.const_data_ptr<scalar_t>();
      a.grad = backward ? grad.const_data_ptr<scalar_t>() : nullptr;
      a.out = out.mutable_data_ptr<scalar_t>();
      const int64_t heads = std::min<int64_t>(H, kWarpSize);
      int g = 1;
      while (g < heads) g *= 2;
      const auto launch = [&](auto lanes) {
        constexpr int G = decltype(lanes)::value;
        if (backward) {
          launch_softmax<scalar_t, index_t, G, true>(a, out, stream);
        } else {
          launch_softmax<scalar_t, index_t, G, false>(a, out, stream);
        }
      };
      switch (g) {
        case 1: return launch(std::integral_constant<int, 1>{});
        case 2: return launch(std::integral_constant<int, 2>{});
        case 4: return launch(std::integral_constant<int, 4>{});
        case 8: return launch(std::integral_constant<int, 8>{});
        case 16: return launch(std::integral_constant<int, 16>{});
        default: return launch(std::integral_constant<int, kWarpSize>{});
      }
    });
  });
  return out;
}

}  // namespace

template <>
at::Tensor CudaCsrBackend::softmax(const char* /*op*/, const at::Tensor& crow, const at::Tensor& values) {
  return softmax_into(crow, values, at::Tensor());
}

template <>
at::Tensor CudaCsrBackend::softmax_backward(const char* /*op*/, const at::Tensor& crow, const at::Tensor& grad_out,
                                            const at::Tensor& values) {
  return softmax_into(crow, values, grad_out);
}

}  // namespace torchops
