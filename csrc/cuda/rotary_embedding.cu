// The rotary ops on CUDA (rotary/rotary.h); qk_norm_rope's kernels are in qk_norm_rope.cu.
//   rotary_embedding and its backward: one flat grid over (position, head of q then k, unit) (rotary_cuda.cuh).
//     Consecutive threads take consecutive units of a head, and the heads of one position one after another, so a
//     position's cos and sin rows are read from L1 by all of its heads.
//   rotary_embedding_: the same over (token, head, rotation unit), in place; the cos / sin of each pair from the
//     cache row of the token's position. A position outside [0, max_position) leaves its token as it is (no read
//     of the cache, no write): the kernel never synchronises to report it.
// kV: the widest 16-byte-or-less vector every row start, stride and rot / 2 allows (single elements otherwise).
// f32 math for 16-bit types (f64 for f64), each output rounded once. No host synchronisation.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../rotary/rotary_ops.h"
#include "rotary_cuda.cuh"

namespace torchops {
namespace {

using namespace torchops::rotary_cuda;

// ------------------------------------------------------------------------------------- rotary_embedding
template <typename T>
struct RotaryArgs {
  Rows<T> q, k;
  MutableRows<T> q_out, k_out;
  CosSin<T> cs;
  int64_t heads_q, rot, half, rot_units, units, total;
};

template <typename T, int kV, bool kTransposed, bool kInterleaved>
__device__ __forceinline__ void rotary_unit(const RotaryArgs<T>& a, const T* x, T* y, const T* cos, const T* sin,
                                            int64_t unit) {
  using A = opmath_t<T>;
  if (unit < a.rot_units) {
    int64_t off0, off1;
    unit_offsets<kInterleaved, kV>(unit * kV, a.half, off0, off1);
    A ca[kV], cb[kV], sa[kV], sb[kV], xe[2 * kV], ye[2 * kV];
    unit_cos_sin<kInterleaved, kV>(cos, sin, off0, off1, ca, cb, sa, sb);
    load_as<A, T, kV>(x + off0, xe);
    load_as<A, T, kV>(x + off1, xe + kV);
    rotate_unit<kTransposed, kInterleaved, kV>(xe, ca, cb, sa, sb, ye);
    store_from<T, kV>(y + off0, ye);
    store_from<T, kV>(y + off1, ye + kV);
  } else {
    const int64_t off = a.rot + (unit - a.rot_units) * kV;
    store_vector<T, kV>(y + off, 0, load_vector<T, kV>(x + off, 0));
  }
}

template <typename T, int kV, bool kTransposed, bool kInterleaved>
__global__ void rotary_kernel(const RotaryArgs<T> a, const FlatIndex index) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.total; i += step) {
    int64_t unit, head, b, s;
    index.decode(i, unit, head, b, s);
    const bool is_q = head < a.heads_q;
    const int64_t h = is_q ? head : head - a.heads_q;
    const T* x = is_q ? a.q.row(b, h, s) : a.k.row(b, h, s);
    T* y = is_q ? a.q_out.row(b, h, s) : a.k_out.row(b, h, s);
    rotary_unit<T, kV, kTransposed, kInterleaved>(a, x, y, a.cs.cos_row(b, s), a.cs.sin_row(b, s), unit);
  }
}

void rotate_cuda(const RotaryCall& call) {
  const RotaryShape& sh = call.shape;
  const int64_t heads = sh.heads_q + sh.heads_k;
  if (sh.batch * sh.seq == 0 || heads == 0 || sh.head_dim == 0) return;
  const c10::cuda::CUDAGuard device_guard(call.q.tensor.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCHOPS_DISPATCH_FLOAT_TYPES(call.q.tensor.scalar_type(), "rotary_embedding_cuda", [&] {
    using T = scalar_t;
    RotaryArgs<T> a{rows_of<T>(call.q), rows_of<T>(call.k), mutable_rows_of<T>(call.q_out),
                    mutable_rows_of<T>(call.k_out), cos_sin_of<T>(call.cs), sh.heads_q, sh.rot, sh.rot / 2, 0, 0, 0};
    const int item = sizeof(T);
    const int kv = widest_vector<T>(
        {sh.rot / 2, sh.head_dim, a.q.b, a.q.h, a.q.s, a.k.b, a.k.h, a.k.s, a.q_out.b, a.q_out.h, a.q_out.s,
         a.k_out.b, a.k_out.h, a.k_out.s, a.cs.cos_b, a.cs.cos_s, a.cs.sin_b, a.cs.sin_s},
        {{a.q.data, item}, {a.k.data, item}, {a.q_out.data, item}, {a.k_out.data, item}, {a.cs.cos, item},
         {a.cs.sin, item}});
    with_vector_size<T>(kv, [&](auto width) {
      constexpr int kV = decltype(width)::value;
      a.rot_units = a.half / kV;
      a.units = a.rot_units + (sh.head_dim - sh.rot) / kV;
      a.total = sh.batch * sh.seq * heads * a.units;
      const FlatIndex index(a.units, heads, sh.seq, a.total);
      const unsigned int blocks = blocks_to_cover(a.total, kThreads);
      auto launch = [&](auto transposed, auto interleaved) {
        rotary_kernel<T, kV, decltype(transposed)::value, decltype(interleaved)::value>
            <<<blocks, kThreads, 0, stream>>>(a, index);
        TORCHOPS_CUDA_LAUNCH_CHECK();
      };
      using False = std::false_type;
      using True = std::true_type;
      if (call.transposed) {
        call.interleaved ? launch(True{}, True{}) : launch(True{}, False{});
      } else {
        call.interleaved ? launch(False{}, True{}) : launch(False{}, False{});
      }
    });
  });
}

// ------------------------------------------------------------------------------------ rotary_embedding_
template <typename T, typename C, typename I>
struct CacheArgs {
  T* query;
  T* key;
  int64_t q_token, q_head, k_token, k_head, heads_q;
  const C* cache;
  int64_t cache_stride, max_position;
  const I* positions;
  int64_t half, units, total;  // units: rotation units a head (the features past rot stay where they are)
};

template <typename T, typename C, typename I, int kV, bool kInterleaved>
__global__ void rotary_cache_kernel(const CacheArgs<T, C, I> a, const FlatIndex index) {
  using A = opmath_t<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.total; i += step) {
    int64_t unit, head, zero, t;
    index.decode(i, unit, head, zero, t);  // one "batch entry" of `tokens` positions
    const int64_t pos = static_cast<int64_t>(a.positions[t]);
    if (pos < 0 || pos >= a.max_position) continue;  // out of range: the token stays as it is
    const bool is_q = head < a.heads_q;
    T* x = is_q ? a.query + t * a.q_token + head * a.q_head : a.key + t * a.k_token + (head - a.heads_q) * a.k_head;
    const C* row = a.cache + pos * a.cache_stride;
    const int64_t p0 = unit * kV;
    A c[kV], s[kV], xe[2 * kV], ye[2 * kV];
    load_as<A, C, kV>(row + p0, c);
    load_as<A, C, kV>(row + a.half + p0, s);
    int64_t off0, off1;
    unit_offsets<kInterleaved, kV>(p0, a.half, off0, off1);
    load_as<A, T, kV>(x + off0, xe);
    load_as<A, T, kV>(x + off1, xe + kV);
    rotate_unit<false, kInterleaved, kV>(xe, c, c, s, s, ye);
    store_from<T, kV>(x + off0, ye);
    store_from<T, kV>(x + off1, ye + kV);
  }
}

void rotate_cache_cuda(const RotaryCacheCall& call) {
  const RotaryCacheShape& sh = call.shape;
  const int64_t heads = sh.heads_q + (call.key.defined() ? sh.heads_k : 0);
  if (sh.tokens == 0 || heads == 0 || sh.rot == 0) return;
  const c10::cuda::CUDAGuard device_guard(call.query.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCHOPS_DISPATCH_FLOAT_TYPES(call.query.scalar_type(), "rotary_embedding__cuda", [&] {
    using T = scalar_t;
    auto run = [&](auto c_tag) {
      using C = decltype(c_tag);
      TORCHOPS_DISPATCH_INDEX_TYPES(call.positions.scalar_type(), "rotary_embedding__cuda", [&] {
        CacheArgs<T, C, index_t> a{call.query.mutable_data_ptr<T>(),
                                   call.key.defined() ? call.key.mutable_data_ptr<T>() : nullptr,
                                   call.query_token_stride,
                                   call.query_head_stride,
                                   call.key_token_stride,
                                   call.key_head_stride,
                                   sh.heads_q,
                                   call.cache.const_data_ptr<C>(),
                                   call.cache_stride,
                                   sh.max_position,
                                   call.positions.const_data_ptr<index_t>(),
                                   sh.rot / 2,
                                   0,
                                   0};
        const int kv = widest_vector<T>(
            {sh.rot / 2, a.q_token, a.q_head, a.k_token, a.k_head, a.cache_stride},
            {{a.query, sizeof(T)}, {a.key, sizeof(T)}, {a.cache, sizeof(C)}});
        with_vector_size<T>(kv, [&](auto width) {
          constexpr int kV = decltype(width)::value;
          a.units = a.half / kV;
          a.total = sh.tokens * heads * a.units;
          const FlatIndex index(a.units, heads, sh.tokens, a.total);
          const unsigned int blocks = blocks_to_cover(a.total, kThreads);
          if (call.is_neox) {
            rotary_cache_kernel<T, C, index_t, kV, false><<<blocks, kThreads, 0, stream>>>(a, index);
          } else {
            rotary_cache_kernel<T, C, index_t, kV, true><<<blocks, kThreads, 0, stream>>>(a, index);
          }
          TORCHOPS_CUDA_LAUNCH_CHECK();
        });
      });
    };
    if constexpr (is_16bit_float<T>) {
      if (call.cache.scalar_type() == at::kFloat) return run(float{});
    }
    run(T{});
  });
}

// What the shared entry points (rotary/rotary_ops.h) call on CUDA.
struct CudaRotary {
  // qk_norm_rope's groups keep a row's weight-gradient partials in shared memory (kPartialSmemBytes a block,
  // qk_norm_rope.cu).
  static constexpr int64_t kMaxNormHeadDim = 4096;
  static at::Tensor empty(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& like) {
    return empty_dense_cuda(sizes, dtype, like.device());
  }
  static at::Tensor empty_strided(c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype,
                                  const at::Tensor& like) {
    return at::detail::empty_strided_cuda(sizes, strides, dtype, like.device());
  }
  static void rotate(const RotaryCall& call) { rotate_cuda(call); }
  static void qk_norm_forward(const QkNormCall& call) { qk_norm_forward_cuda(call); }
  static void qk_norm_backward(const QkNormCall& call) { qk_norm_backward_cuda(call); }
  static void rotate_cache(const RotaryCacheCall& call) { rotate_cache_cuda(call); }
};
using Ops = RotaryOps<CudaRotary>;

}  // namespace

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  Ops::register_kernels(m);
}

}  // namespace torchops
