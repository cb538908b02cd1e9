// Scalar math of the activation ops, shared by the CPU and CUDA kernels. `A` is the op-math type (f32
// for f16/bf16/f32 storage, f64 for f64), so 16-bit inputs are computed in f32.
//
// Large |x| never produces inf/inf or inf*0 where the true value is finite: sigmoid is 1 / (1 + exp(-x)),
// which is exactly 0 once exp(-x) overflows (x*0 = -0 for silu(-1e4)) and 1 once it underflows; the
// backward's x * (1 - s) is then x or 0. Infinite and NaN inputs give what torch's F.silu gives
// (silu(+inf) = inf, silu(-inf) = -inf * 0 = NaN).
#pragma once

#include <c10/macros/Macros.h>

#include <cmath>
#include <type_traits>

namespace torchops {

// kFastExp: __expf and a fast reciprocal, for 16-bit storage only. Their error (~25 f32 ulp at |x| = 20,
// < 2^-17 relative up to |x| = 88) is far below half an f16/bf16 ulp, so the rounded result stays within
// 1 ulp; and with 6 bytes moved per element the accurate expf + correctly rounded 1/x left the bf16
// kernels ALU-bound on the H200 (~90% of copy bandwidth against ~103% for f32).
template <bool kFastExp = false, typename A>
C10_HOST_DEVICE inline A sigmoid(A x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<A, float>) {
    if constexpr (kFastExp) {
      // __fdividef(a, d) returns 0 for 2^126 < |d| < 2^128, where 1 / d is a subnormal that silu's
      // x * sigmoid(x) turns back into a normal bf16 number (gate = -88: -5.3e-37); so numerator and
      // denominator are scaled by 2^-64 (exact), which keeps every finite d below 2^64. d = inf
      // (x < -88.72) still gives 0, as the accurate path's 1 / inf does.
      return __fdividef(0x1p-64f, (1.0f + __expf(-x)) * 0x1p-64f);
    } else {
      // expf (2 ulp) rather than __expf, whose error grows with |x|: f32 outputs would show it.
      // __frcp_rn is the correctly rounded 1/x.
      return __frcp_rn(1.0f + expf(-x));
    }
  } else {
    return A(1) / (A(1) + ::exp(-x));
  }
#else
  return A(1) / (A(1) + std::exp(-x));
#endif
}

// swiglu(gate, up) = silu(gate) * up: (gate, up) -> out.
template <bool kFastExp = false>
struct SwigluForwardT {
  static constexpr int kIn = 2;
  static constexpr int kOut = 1;

  template <typename A>
  C10_HOST_DEVICE void operator()(const A (&x)[kIn], A (&y)[kOut]) const {
    const A gate = x[0], up = x[1];
    y[0] = gate * sigmoid<kFastExp>(gate) * up;
  }
};
using SwigluForward = SwigluForwardT<false>;

// (grad_out, gate, up) -> (grad_gate, grad_up), with s = sigmoid(gate) recomputed:
//   grad_gate = grad_out * up * s * (1 + gate * (1 - s))     (silu'(gate) = s * (1 + gate * (1 - s)))
//   grad_up   = grad_out * silu(gate)
template <bool kFastExp = false>
struct SwigluBackwardT {
  static constexpr int kIn = 3;
  static constexpr int kOut = 2;

  template <typename A>
  C10_HOST_DEVICE void operator()(const A (&x)[kIn], A (&y)[kOut]) const {
    const A grad = x[0], gate = x[1], up = x[2];
    const A s = sigmoid<kFastExp>(gate);
    y[0] = grad * up * (s * (A(1) + gate * (A(1) - s)));
    y[1] = grad * (gate * s);
  }
};
using SwigluBackward = SwigluBackwardT<false>;

}  // namespace torchops
