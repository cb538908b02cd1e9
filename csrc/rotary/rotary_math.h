// The rotation of one pair of a row, shared by the CPU and CUDA kernels.
//
// A row's first `rot` elements form rot / 2 pairs (a, b): (i, i + rot / 2) in transformers' rotate-half layout,
// (2i, 2i + 1) in GPT-J's interleaved one; the elements past rot pass through. With c and s the cos and sin of
// each element (transformers' cos and sin rows give every element its own value),
//   forward      y_a = c_a x_a - s_a x_b,   y_b = c_b x_b + s_b x_a     (x * cos + rotate_half(x) * sin)
//   transposed   y_a = c_a x_a + s_b x_b,   y_b = c_b x_b - s_a x_a     (the backward: the forward's transpose,
//                                                                      the negative angle where c_a = c_b, s_a = s_b)
// The transposed rotation is the forward one with s'_a = -s_b and s'_b = -s_a, which is how the CPU kernels run it.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

namespace torchops {
namespace rotary {

template <bool kTransposed, typename A>
C10_HOST_DEVICE C10_ALWAYS_INLINE void rotate_pair(A xa, A xb, A ca, A cb, A sa, A sb, A& ya, A& yb) {
  if constexpr (kTransposed) {
    ya = ca * xa + sb * xb;
    yb = cb * xb - sa * xa;
  } else {
    ya = ca * xa - sa * xb;
    yb = cb * xb + sb * xa;
  }
}

// The elements of pair i of a row whose rotated part has `half` = rot / 2 pairs.
C10_HOST_DEVICE C10_ALWAYS_INLINE int64_t pair_first(int64_t i, int64_t half, bool interleaved) {
  return interleaved ? 2 * i : i;
}
C10_HOST_DEVICE C10_ALWAYS_INLINE int64_t pair_second(int64_t i, int64_t half, bool interleaved) {
  return interleaved ? 2 * i + 1 : i + half;
}

}  // namespace rotary
}  // namespace torchops
