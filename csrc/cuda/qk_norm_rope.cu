// qk_norm_rope on CUDA (rotary/rotary.h; the rotary kernels' shared parts in rotary_cuda.cuh): a group of G lanes
// per head row (G the power of two covering its units, at most a warp): a first sweep sums the squares (a shuffle
// butterfly over the group), a second re-reads the row (L1), normalises, rotates and stores. Its backward: the first
// sweep also sums gn w' x (gn the gradient rotated back), the second writes dx and adds gn x rstd into the group's
// shared-memory row; each block sums its groups' rows in order into one partial row of a fixed chunk of rows, and a
// column kernel sums the partials in chunk order: the same bits on every run.
// f32 math for 16-bit types (f64 for f64), each output rounded once. No host synchronisation.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../norm/norm.h"
#include "../norm/norm_cuda.cuh"
#include "rotary_cuda.cuh"

namespace torchops::rotary_cuda {
namespace {

constexpr int64_t kMaxChunks = 1024;            // the backward's partial rows per side at most
constexpr size_t kPartialSmemBytes = 32 << 10;  // its groups' dweight rows per block

// Sums of the weights' gradient rows: f32 for 16-bit input (whose gradients round far coarser), f64 otherwise.
template <typename T>
using GradSum = std::conditional_t<is_16bit_float<T>, float, double>;

// ------------------------------------------------------------------------------------------ qk_norm_rope
template <typename T, typename W>
struct QkArgs {
  Rows<T> x[2];           // q, k
  MutableRows<T> out[2];  // forward: q_out, k_out; backward: grad_q, grad_k (null: not wanted)
  Rows<T> grad[2];        // backward: grad_q_out, grad_k_out
  const W* weight[2];
  GradSum<T>* partial;    // backward: [chunks of q, then of k][n] partial rows of the weights' gradients, or null
  CosSin<T> cs;
  int64_t batch, seq, heads[2], n, rot, half, rot_units, units;
  opmath_t<T> eps, offset;
  int group;                         // lanes a row
  int64_t rows_per_chunk, chunks_q;  // backward
};

// The sum of v over the `group` lanes of this thread's group (a power of two up to a warp), in each of them.
template <typename S>
__device__ __forceinline__ S group_sum(S v, int group) {
  const int lane = threadIdx.x % kWarpSize;
  const unsigned mask = group == kWarpSize ? kFullWarpMask : ((1u << group) - 1) << (lane & ~(group - 1));
  for (int offset = group / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(mask, v, offset);
  return v;
}

// A unit of a row as A (a rotation unit's two vectors, 2 kV elements, or a pass unit's one), and where it sits.
template <bool kInterleaved, int kV, typename T, typename A>
__device__ __forceinline__ int load_unit(const T* row, int64_t unit, int64_t rot_units, int64_t rot, int64_t half,
                                         A* e, int64_t& off0, int64_t& off1) {
  if (unit < rot_units) {
    unit_offsets<kInterleaved, kV>(unit * kV, half, off0, off1);
    load_as<A, T, kV>(row + off0, e);
    load_as<A, T, kV>(row + off1, e + kV);
    return 2 * kV;
  }
  off0 = off1 = rot + (unit - rot_units) * kV;
  load_as<A, T, kV>(row + off0, e);
#pragma unroll
  for (int i = kV; i < 2 * kV; ++i) e[i] = A(0);  // unused: defined values all the same
  return kV;
}

// w + offset at a unit's elements.
template <int kV, typename W, typename A>
__device__ __forceinline__ void load_weight(const W* w, int64_t off0, int64_t off1, int count, A offset, A* out) {
  load_as<A, W, kV>(w + off0, out);
  if (count > kV) {
    load_as<A, W, kV>(w + off1, out + kV);
  } else {
#pragma unroll
    for (int e = kV; e < 2 * kV; ++e) out[e] = A(0);
  }
#pragma unroll
  for (int e = 0; e < 2 * kV; ++e) out[e] += offset;
}

template <typename T, int kV, typename A>
__device__ __forceinline__ void store_unit(T* row, int64_t off0, int64_t off1, int count, const A* e) {
  store_from<T, kV>(row + off0, e);
  if (count > kV) store_from<T, kV>(row + off1, e + kV);
}

// Rows in (position, head) order over q's heads then k's: the row's side, batch entry, head and token.
struct RowOf {
  int side;
  int64_t b, h, s;
};

__device__ __forceinline__ RowOf row_of(int64_t r, int64_t heads, int64_t heads_q, int64_t seq) {
  const int64_t pos = r / heads, head = r - pos * heads, b = pos / seq;
  const int side = head < heads_q ? 0 : 1;
  return {side, b, side == 0 ? head : head - heads_q, pos - b * seq};
}

template <typename T, typename W, int kV, bool kInterleaved>
__global__ void qk_norm_rope_forward_kernel(const QkArgs<T, W> a) {
  using A = opmath_t<T>;
  const int lane = threadIdx.x % a.group, groups = blockDim.x / a.group;
  const int64_t heads = a.heads[0] + a.heads[1], rows = a.batch * a.seq * heads;
  const int64_t step = static_cast<int64_t>(gridDim.x) * groups;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * groups + threadIdx.x / a.group; r < rows; r += step) {
    const RowOf at = row_of(r, heads, a.heads[0], a.seq);
    const T* x = a.x[at.side].row(at.b, at.h, at.s);
    A e[2 * kV];
    int64_t off0, off1;
    A squares = 0;
    for (int64_t u = lane; u < a.units; u += a.group) {
      load_unit<kInterleaved, kV>(x, u, a.rot_units, a.rot, a.half, e, off0, off1);
#pragma unroll
      for (int i = 0; i < 2 * kV; ++i) squares += e[i] * e[i];  // a pass unit's second half is zeros
    }
    squares = group_sum(squares, a.group);
    const A rstd = A(1) / sqrt(squares / static_cast<A>(a.n) + a.eps);  // rms_norm's order: mean, + eps, 1 / sqrt
    T* y = a.out[at.side].row(at.b, at.h, at.s);
    for (int64_t u = lane; u < a.units; u += a.group) {  // the row again, from L1
      const int count = load_unit<kInterleaved, kV>(x, u, a.rot_units, a.rot, a.half, e, off0, off1);
      A w[2 * kV];
      load_weight<kV>(a.weight[at.side], off0, off1, count, a.offset, w);
#pragma unroll
      for (int i = 0; i < 2 * kV; ++i) e[i] = e[i] * rstd * w[i];
      if (count > kV) {
        A ca[kV], cb[kV], sa[kV], sb[kV], ye[2 * kV];
        unit_cos_sin<kInterleaved, kV>(a.cs.cos_row(at.b, at.s), a.cs.sin_row(at.b, at.s), off0, off1, ca, cb, sa, sb);
        rotate_unit<false, kInterleaved, kV>(e, ca, cb, sa, sb, ye);
        store_unit<T, kV>(y, off0, off1, count, ye);
      } else {
        store_unit<T, kV>(y, off0, off1, count, e);
      }
    }
  }
}

// A unit of the row's incoming gradient rotated back (gn: the normalised row's gradient) and of x, both as A.
template <bool kInterleaved, int kV, typename T, typename W, typename A>
__device__ __forceinline__ int load_backward_unit(const QkArgs<T, W>& a, const RowOf& at, const T* x, const T* g,
                                                  int64_t unit, A* xe, A* gn, A* w, int64_t& off0, int64_t& off1) {
  const int count = load_unit<kInterleaved, kV>(x, unit, a.rot_units, a.rot, a.half, xe, off0, off1);
  load_unit<kInterleaved, kV>(g, unit, a.rot_units, a.rot, a.half, gn, off0, off1);
  if (count > kV) {
    A ca[kV], cb[kV], sa[kV], sb[kV], ge[2 * kV];
#pragma unroll
    for (int i = 0; i < 2 * kV; ++i) ge[i] = gn[i];
    unit_cos_sin<kInterleaved, kV>(a.cs.cos_row(at.b, at.s), a.cs.sin_row(at.b, at.s), off0, off1, ca, cb, sa, sb);
    rotate_unit<true, kInterleaved, kV>(ge, ca, cb, sa, sb, gn);
  }
  load_weight<kV>(a.weight[at.side], off0, off1, count, a.offset, w);
  return count;
}

// Block c < chunks_q takes rows [c R, (c + 1) R) of q's (position, head) rows, the others k's likewise; its groups
// take the chunk's rows in turn. dx = rstd gn w' - x rstd^3 sum(gn w' x) / n; the weight's gradient adds gn x rstd.
template <typename T, typename W, int kV, bool kInterleaved>
__global__ void qk_norm_rope_backward_kernel(const QkArgs<T, W> a) {
  using A = opmath_t<T>;
  using S = GradSum<T>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  S* acc = reinterpret_cast<S*>(smem_bytes);  // [groups][n], when the weights' gradients are wanted
  const int lane = threadIdx.x % a.group, groups = blockDim.x / a.group, group = threadIdx.x / a.group;
  const int side = blockIdx.x < a.chunks_q ? 0 : 1;
  const int64_t chunk = side == 0 ? blockIdx.x : blockIdx.x - a.chunks_q;
  const int64_t heads = a.heads[side], rows = a.batch * a.seq * heads;
  const bool weight_grad = a.partial != nullptr;
  if (weight_grad) {
    for (int64_t i = threadIdx.x; i < groups * a.n; i += blockDim.x) acc[i] = S(0);
    __syncthreads();
  }
  S* mine = acc + group * a.n;
  const int64_t end = (chunk + 1) * a.rows_per_chunk, last = end < rows ? end : rows;
  for (int64_t r = chunk * a.rows_per_chunk + group; r < last; r += groups) {
    const int64_t pos = r / heads, b = pos / a.seq;
    const RowOf at{side, b, r - pos * heads, pos - b * a.seq};
    const T* x = a.x[side].row(at.b, at.h, at.s);
    const T* g = a.grad[side].row(at.b, at.h, at.s);
    A xe[2 * kV], gn[2 * kV], w[2 * kV];
    int64_t off0, off1;
    A squares = 0, dot = 0;
    for (int64_t u = lane; u < a.units; u += a.group) {
      load_backward_unit<kInterleaved, kV>(a, at, x, g, u, xe, gn, w, off0, off1);
#pragma unroll
      for (int i = 0; i < 2 * kV; ++i) {  // a pass unit's second half is zeros
        squares += xe[i] * xe[i];
        dot += gn[i] * w[i] * xe[i];
      }
    }
    squares = group_sum(squares, a.group);
    dot = group_sum(dot, a.group);
    const A rstd = A(1) / sqrt(squares / static_cast<A>(a.n) + a.eps);
    const A coef = rstd * rstd * rstd * dot / static_cast<A>(a.n);
    T* dx = a.out[side].data == nullptr ? nullptr : a.out[side].row(at.b, at.h, at.s);
    for (int64_t u = lane; u < a.units; u += a.group) {  // x and the gradient again, from L1
      const int count = load_backward_unit<kInterleaved, kV>(a, at, x, g, u, xe, gn, w, off0, off1);
      if (dx != nullptr) {
        A d[2 * kV];
#pragma unroll
        for (int i = 0; i < 2 * kV; ++i) d[i] = rstd * gn[i] * w[i] - coef * xe[i];
        store_unit<T, kV>(dx, off0, off1, count, d);
      }
      if (weight_grad) {  // this lane's columns of the group's row
#pragma unroll
        for (int i = 0; i < kV; ++i) mine[off0 + i] += static_cast<S>(gn[i] * xe[i] * rstd);
        if (count > kV) {
#pragma unroll
          for (int i = 0; i < kV; ++i) mine[off1 + i] += static_cast<S>(gn[kV + i] * xe[kV + i] * rstd);
        }
      }
    }
  }
  if (!weight_grad) return;
  __syncthreads();
  S* out = a.partial + static_cast<int64_t>(blockIdx.x) * a.n;
  for (int64_t col = threadIdx.x; col < a.n; col += blockDim.x) {
    S sum = 0;
    for (int gi = 0; gi < groups; ++gi) sum += acc[gi * a.n + col];  // in group order: the same bits every run
    out[col] = sum;
  }
}

// with_vector_size (core/cuda_utils.cuh) over the widths up to kWidest elements only.
template <int kWidest, typename Fn>
void with_width_up_to(int v, Fn&& fn) {
  if (v == kWidest) return fn(std::integral_constant<int, kWidest>{});
  if constexpr (kWidest > 1) {
    with_width_up_to<kWidest / 2>(v, std::forward<Fn>(fn));
  } else {
    TORCH_INTERNAL_ASSERT(false, "no kernel is compiled for a vector width of ", v, " elements");
  }
}

int next_power_of_two(int64_t v) {
  int p = 1;
  while (p < v && p < kWarpSize) p *= 2;
  return p;
}

// The kernels' view of a qk_norm_rope call (forward: out = q_out / k_out; backward: out = grad_q / grad_k), its
// vector width, and fn(args, width, interleaved) to launch with. The backward holds x, the gradient, its rotation
// back and the weight of a unit at once: with 16-byte vectors of 16-bit types that took ~126 registers a thread
// (two blocks an SM), so it reads 8-byte ones there.
template <typename T, typename W, bool kBackward, typename Fn>
void with_qk_args(const QkNormCall& call, Fn&& fn) {
  constexpr int kWidest = kBackward && is_16bit_float<T> ? 4 : vector_size<T>();
  constexpr bool backward = kBackward;
  const RotaryCall& r = call.rope;
  const RotaryShape& sh = r.shape;
  QkArgs<T, W> a{};
  a.x[0] = rows_of<T>(r.q);
  a.x[1] = rows_of<T>(r.k);
  const HeadRows grad_q_in = call.grad_q_in.defined() ? head_rows(call.grad_q_in, sh) : HeadRows{};
  const HeadRows grad_k_in = call.grad_k_in.defined() ? head_rows(call.grad_k_in, sh) : HeadRows{};
  a.out[0] = mutable_rows_of<T>(backward ? grad_q_in : r.q_out);
  a.out[1] = mutable_rows_of<T>(backward ? grad_k_in : r.k_out);
  a.grad[0] = rows_of<T>(call.grad_q);
  a.grad[1] = rows_of<T>(call.grad_k);
  a.weight[0] = call.q_weight.const_data_ptr<W>();
  a.weight[1] = call.k_weight.const_data_ptr<W>();
  a.partial = nullptr;
  a.cs = cos_sin_of<T>(r.cs);
  a.batch = sh.batch;
  a.seq = sh.seq;
  a.heads[0] = sh.heads_q;
  a.heads[1] = sh.heads_k;
  a.n = sh.head_dim;
  a.rot = sh.rot;
  a.half = sh.rot / 2;
  a.eps = static_cast<opmath_t<T>>(call.eps);
  a.offset = static_cast<opmath_t<T>>(call.weight_offset);
  const int item = sizeof(T), witem = sizeof(W);
  const int kv = widest_vector<T>(
      {a.half, a.n, a.x[0].b, a.x[0].h, a.x[0].s, a.x[1].b, a.x[1].h, a.x[1].s, a.out[0].b, a.out[0].h, a.out[0].s,
       a.out[1].b, a.out[1].h, a.out[1].s, a.grad[0].b, a.grad[0].h, a.grad[0].s, a.grad[1].b, a.grad[1].h,
       a.grad[1].s, a.cs.cos_b, a.cs.cos_s, a.cs.sin_b, a.cs.sin_s},
      {{a.x[0].data, item}, {a.x[1].data, item}, {a.out[0].data, item}, {a.out[1].data, item}, {a.grad[0].data, item},
       {a.grad[1].data, item}, {a.cs.cos, item}, {a.cs.sin, item}, {a.weight[0], witem}, {a.weight[1], witem}},
      kWidest);
  with_width_up_to<kWidest>(kv, [&](auto width) {
    constexpr int kV = decltype(width)::value;
    a.rot_units = a.half / kV;
    a.units = a.rot_units + (a.n - a.rot) / kV;
    a.group = next_power_of_two(a.units);
    if (r.interleaved) {
      fn(a, width, std::true_type{});
    } else {
      fn(a, width, std::false_type{});
    }
  });
}

}  // namespace

void qk_norm_forward_cuda(const QkNormCall& call) {
  const RotaryShape& sh = call.rope.shape;
  const int64_t rows = sh.batch * sh.seq * (sh.heads_q + sh.heads_k);
  if (rows == 0) return;
  const c10::cuda::CUDAGuard device_guard(call.rope.q.tensor.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_norm_types(call.rope.q.tensor.scalar_type(), call.q_weight, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    with_qk_args<T, W, false>(call, [&](const QkArgs<T, W>& a, auto width, auto interleaved) {
      const int groups = kThreads / a.group;
      qk_norm_rope_forward_kernel<T, W, decltype(width)::value, decltype(interleaved)::value>
          <<<blocks_to_cover(rows, groups), kThreads, 0, stream>>>(a);
      TORCHOPS_CUDA_LAUNCH_CHECK();
    });
  });
}

void qk_norm_backward_cuda(const QkNormCall& call) {
  const RotaryShape& sh = call.rope.shape;
  const c10::cuda::CUDAGuard device_guard(call.rope.q.tensor.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool weight_grad = call.grad_q_weight.defined() || call.grad_k_weight.defined();
  // A side runs where its output's gradient was given (its grad_*_in and grad_*_weight are then what is wanted).
  const int64_t rows_q = call.grad_q.tensor.defined() ? sh.batch * sh.seq * sh.heads_q : 0;
  const int64_t rows_k = call.grad_k.tensor.defined() ? sh.batch * sh.seq * sh.heads_k : 0;
  dispatch_norm_types(call.rope.q.tensor.scalar_type(), call.q_weight, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    using S = GradSum<T>;
    with_qk_args<T, W, true>(call, [&](QkArgs<T, W> a, auto width, auto interleaved) {
      // Groups a block: as many as the shared-memory rows of the weights' gradients allow (a fixed number for a
      // shape, so the chunks and the bits of the result are too).
      int groups = kThreads / a.group;
      if (weight_grad) {
        groups = static_cast<int>(std::clamp<int64_t>(static_cast<int64_t>(kPartialSmemBytes / (a.n * sizeof(S))), 1, groups));
      }
      const int threads = groups * a.group;
      const size_t smem = weight_grad ? static_cast<size_t>(groups) * a.n * sizeof(S) : 0;
      a.rows_per_chunk = std::max<int64_t>(2 * groups, (std::max(rows_q, rows_k) + kMaxChunks - 1) / kMaxChunks);
      a.chunks_q = (rows_q + a.rows_per_chunk - 1) / a.rows_per_chunk;
      const int64_t chunks_k = (rows_k + a.rows_per_chunk - 1) / a.rows_per_chunk;
      at::Tensor partial;
      if (weight_grad) {
        partial = empty_dense_cuda({std::max<int64_t>(1, a.chunks_q + chunks_k), a.n},
                                   std::is_same_v<S, double> ? at::kDouble : at::kFloat, call.rope.q.tensor.device());
        a.partial = partial.mutable_data_ptr<S>();
      }
      if (a.chunks_q + chunks_k > 0) {
        qk_norm_rope_backward_kernel<T, W, decltype(width)::value, decltype(interleaved)::value>
            <<<static_cast<unsigned int>(a.chunks_q + chunks_k), threads, smem, stream>>>(a);
        TORCHOPS_CUDA_LAUNCH_CHECK();
      }
      // The chunks' partial rows summed per column in a fixed order, as the norms' weight gradients are.
      if (call.grad_q_weight.defined()) {
        norm_cuda::launch_column_reduce<S, W>(a.partial, a.chunks_q, a.n, call.grad_q_weight.mutable_data_ptr<W>(),
                                              stream);
      }
      if (call.grad_k_weight.defined()) {
        norm_cuda::launch_column_reduce<S, W>(a.partial + a.chunks_q * a.n, chunks_k, a.n,
                                              call.grad_k_weight.mutable_data_ptr<W>(), stream);
      }
    });
  });
}

}  // namespace torchops::rotary_cuda
