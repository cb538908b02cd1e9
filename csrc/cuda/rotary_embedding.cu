// The rotary ops on CUDA (rotary/rotary.h).
//   rotary_embedding and its backward: one flat grid over (position, head of q then k, unit), a unit being kV pairs
//     of a head (two kV-element vectors: (p, p + rot / 2) in the rotate-half layout, (2p, 2p + kV) interleaved) or
//     kV passed-through features. Consecutive threads take consecutive units of a head, and the heads of one
//     position one after another, so a position's cos and sin rows are read from L1 by all of its heads.
//   rotary_embedding_: the same over (token, head, rotation unit), in place; the cos / sin of each pair from the
//     cache row of the token's position. A position outside [0, max_position) leaves its token as it is (no read
//     of the cache, no write): the kernel never synchronises to report it.
//   qk_norm_rope: a group of G lanes per head row (G the power of two covering its units, at most a warp): a first
//     sweep sums the squares (a shuffle butterfly over the group), a second re-reads the row (L1), normalises,
//     rotates and stores. Its backward: the first sweep also sums gn w' x (gn the gradient rotated back), the second
//     writes dx and adds gn x rstd into the group's shared-memory row; each block sums its groups' rows in order
//     into one partial row of a fixed chunk of rows, and a column kernel sums the partials in chunk order: the same
//     bits on every run.
// kV: the widest 16-byte-or-less vector every row start, stride and rot / 2 allows (single elements otherwise).
// f32 math for 16-bit types (f64 for f64), each output rounded once. No host synchronisation.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "../core/cuda_utils.cuh"
#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../norm/norm.h"
#include "../rotary/rotary.h"
#include "../rotary/rotary_math.h"
#include "../rotary/rotary_ops.h"

namespace torchops {
namespace {

using namespace torchops::cuda;

constexpr int kThreads = 256;
constexpr int64_t kMaxChunks = 4096;       // qk_norm_rope backward: partial rows per side at most
constexpr size_t kPartialSmemBytes = 32 << 10;  // its groups' dweight rows per block

// Sums of the weights' gradient rows: f32 for 16-bit input (whose gradients round far coarser), f64 otherwise.
template <typename T>
using GradSum = std::conditional_t<is_16bit_float<T>, float, double>;

// kN values of C at p as A, in accesses of up to 16 bytes (p aligned to min(kN * sizeof(C), 16) bytes).
template <typename A, typename C, int kN>
__device__ __forceinline__ void load_as(const C* p, A* out) {
  constexpr int kPer = kN * static_cast<int>(sizeof(C)) <= kVectorBytes ? kN : kVectorBytes / static_cast<int>(sizeof(C));
#pragma unroll
  for (int v = 0; v < kN / kPer; ++v) {
    const AlignedVector<C, kPer> x = load_vector<C, kPer>(p + v * kPer, 0);
#pragma unroll
    for (int e = 0; e < kPer; ++e) out[v * kPer + e] = static_cast<A>(x.val[e]);
  }
}

template <typename T, int kN, typename A>
__device__ __forceinline__ void store_from(T* p, const A* in) {
  AlignedVector<T, kN> v;
#pragma unroll
  for (int e = 0; e < kN; ++e) v.val[e] = static_cast<T>(in[e]);
  store_vector<T, kN>(p, 0, v);
}

// A unit's two vectors as one array of 2 kV elements: pair j is (j, kV + j) in the rotate-half layout, (2j, 2j + 1)
// interleaved.
template <bool kInterleaved, int kV>
__device__ constexpr int elem_a(int j) {
  return kInterleaved ? 2 * j : j;
}
template <bool kInterleaved, int kV>
__device__ constexpr int elem_b(int j) {
  return kInterleaved ? 2 * j + 1 : kV + j;
}

// Where a rotation unit's two vectors start in its row: pairs [p0, p0 + kV).
template <bool kInterleaved, int kV>
__device__ __forceinline__ void unit_offsets(int64_t p0, int64_t half, int64_t& off0, int64_t& off1) {
  off0 = kInterleaved ? 2 * p0 : p0;
  off1 = kInterleaved ? 2 * p0 + kV : p0 + half;
}

// Per-pair cos / sin (a's and b's) from per-element values of the unit's two vectors.
template <bool kInterleaved, int kV, typename A>
__device__ __forceinline__ void pair_values(const A* e, A* va, A* vb) {
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    va[j] = e[elem_a<kInterleaved, kV>(j)];
    vb[j] = e[elem_b<kInterleaved, kV>(j)];
  }
}

// The unit's cos and sin, per pair, from transformers' rows (one value per element).
template <bool kInterleaved, int kV, typename T, typename A>
__device__ __forceinline__ void unit_cos_sin(const T* cos, const T* sin, int64_t off0, int64_t off1, A* ca, A* cb,
                                             A* sa, A* sb) {
  A c[2 * kV], s[2 * kV];
  load_as<A, T, kV>(cos + off0, c);
  load_as<A, T, kV>(cos + off1, c + kV);
  load_as<A, T, kV>(sin + off0, s);
  load_as<A, T, kV>(sin + off1, s + kV);
  pair_values<kInterleaved, kV>(c, ca, cb);
  pair_values<kInterleaved, kV>(s, sa, sb);
}

template <bool kTransposed, bool kInterleaved, int kV, typename A>
__device__ __forceinline__ void rotate_unit(const A* x, const A* ca, const A* cb, const A* sa, const A* sb, A* y) {
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    const int ia = elem_a<kInterleaved, kV>(j), ib = elem_b<kInterleaved, kV>(j);
    rotary::rotate_pair<kTransposed>(x[ia], x[ib], ca[j], cb[j], sa[j], sb[j], y[ia], y[ib]);
  }
}

// ------------------------------------------------------------------------------------ index decoding
// (position, head, unit) of a flat index, through 32-bit multiply-shift division below 2^31.
struct FlatIndex {
  FastDivmod units, heads, seq;
  int64_t units64, heads64, seq64;
  bool small;

  FlatIndex(int64_t u, int64_t h, int64_t s, int64_t total)
      : units(static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(u, INT32_MAX)))),
        heads(static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(h, INT32_MAX)))),
        seq(static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(s, INT32_MAX)))),
        units64(u),
        heads64(h),
        seq64(s),
        small(total < INT32_MAX) {}

  __device__ __forceinline__ void decode(int64_t i, int64_t& unit, int64_t& head, int64_t& b, int64_t& s) const {
    if (small) {
      const uint32_t i32 = static_cast<uint32_t>(i);
      const uint32_t rest = units.div(i32);
      unit = i32 - rest * units.divisor;
      const uint32_t pos = heads.div(rest);
      head = rest - pos * heads.divisor;
      const uint32_t bb = seq.div(pos);
      s = pos - bb * seq.divisor;
      b = bb;
    } else {
      const int64_t rest = i / units64;
      unit = i - rest * units64;
      const int64_t pos = rest / heads64;
      head = rest - pos * heads64;
      b = pos / seq64;
      s = pos - b * seq64;
    }
  }
};

// ---------------------------------------------------------------------------------------- kernel views
// One side (q or k) of a call: its input rows, output rows (and, in qk_norm_rope's backward, the incoming gradient's
// rows and the weight); element (b, h, s, j) at b * b_stride + h * h_stride + s * s_stride + j.
template <typename T>
struct Rows {
  const T* data = nullptr;
  int64_t b = 0, h = 0, s = 0;
  __device__ __forceinline__ const T* row(int64_t bi, int64_t hi, int64_t si) const { return data + bi * b + hi * h + si * s; }
};

template <typename T>
struct MutableRows {
  T* data = nullptr;
  int64_t b = 0, h = 0, s = 0;
  __device__ __forceinline__ T* row(int64_t bi, int64_t hi, int64_t si) const { return data + bi * b + hi * h + si * s; }
};

template <typename T>
Rows<T> rows_of(const HeadRows& r) {
  return {r.tensor.defined() ? r.tensor.const_data_ptr<T>() : nullptr, r.batch_stride, r.head_stride, r.seq_stride};
}

template <typename T>
MutableRows<T> mutable_rows_of(const HeadRows& r) {
  return {r.tensor.defined() ? r.tensor.mutable_data_ptr<T>() : nullptr, r.batch_stride, r.head_stride, r.seq_stride};
}

template <typename T>
struct CosSin {
  const T* cos;
  const T* sin;
  int64_t cos_b, cos_s, sin_b, sin_s;
  __device__ __forceinline__ const T* cos_row(int64_t b, int64_t s) const { return cos + b * cos_b + s * cos_s; }
  __device__ __forceinline__ const T* sin_row(int64_t b, int64_t s) const { return sin + b * sin_b + s * sin_s; }
};

template <typename T>
CosSin<T> cos_sin_of(const CosSinRows& cs) {
  return {cs.cos.const_data_ptr<T>(), cs.sin.const_data_ptr<T>(), cs.cos_batch, cs.cos_seq, cs.sin_batch, cs.sin_seq};
}

// The widest vector (elements, a power of two up to `widest`, at most 16 bytes of T) every count divides and every
// pointer is aligned to.
template <typename T>
int widest_vector(std::initializer_list<int64_t> counts, std::initializer_list<std::pair<const void*, int>> pointers,
                  int widest = vector_size<T>()) {
  for (int w = widest; w > 1; w /= 2) {
    bool ok = true;
    for (int64_t c : counts) ok = ok && c % w == 0;
    for (const auto& [p, item] : pointers) ok = ok && (p == nullptr || is_aligned(p, std::min(w * item, kVectorBytes)));
    if (ok) return w;
  }
  return 1;
}

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

// out[col] = the sum of the chunks' partial rows at col, in chunk order.
template <typename S, typename W>
__global__ void weight_grad_columns_kernel(const S* partial, int64_t chunks, int64_t n, W* out) {
  for (int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < n;
       col += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    S sum = 0;
    for (int64_t c = 0; c < chunks; ++c) sum += partial[c * n + col];
    out[col] = static_cast<W>(sum);
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
      const unsigned int column_blocks = blocks_to_cover(a.n, kThreads);
      if (call.grad_q_weight.defined()) {
        weight_grad_columns_kernel<S, W><<<column_blocks, kThreads, 0, stream>>>(
            a.partial, a.chunks_q, a.n, call.grad_q_weight.mutable_data_ptr<W>());
        TORCHOPS_CUDA_LAUNCH_CHECK();
      }
      if (call.grad_k_weight.defined()) {
        weight_grad_columns_kernel<S, W><<<column_blocks, kThreads, 0, stream>>>(
            a.partial + a.chunks_q * a.n, chunks_k, a.n, call.grad_k_weight.mutable_data_ptr<W>());
        TORCHOPS_CUDA_LAUNCH_CHECK();
      }
    });
  });
}

// What the shared entry points (rotary/rotary_ops.h) call on CUDA.
struct CudaRotary {
  // qk_norm_rope's groups keep a row's weight-gradient partials in shared memory (kPartialSmemBytes a block).
  static constexpr int64_t kMaxNormHeadDim = 4096;
  static at::Tensor empty(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& like) {
    return empty_dense_cuda(sizes, dtype, like.device());
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
