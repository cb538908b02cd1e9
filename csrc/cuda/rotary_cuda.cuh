// What the rotary CUDA files (rotary_embedding.cu: rotary_embedding, rotary_embedding_; qk_norm_rope.cu) share:
// vector loads and stores in the ops' math type, a rotation unit's pairs, flat-index decoding, the kernels' views
// of a call's rows, and the widest vector a call's strides and pointers allow. Included by those two files only.
// A unit: kV pairs of a head (two kV-element vectors: (p, p + rot / 2) in the rotate-half layout, (2p, 2p + kV)
// interleaved), or kV passed-through features.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "../core/cuda_utils.cuh"
#include "../rotary/rotary.h"
#include "../rotary/rotary_math.h"

namespace torchops::rotary_cuda {

using namespace torchops::cuda;

constexpr int kThreads = 256;


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

void qk_norm_forward_cuda(const QkNormCall& call);   // qk_norm_rope.cu
void qk_norm_backward_cuda(const QkNormCall& call);

}  // namespace torchops::rotary_cuda
