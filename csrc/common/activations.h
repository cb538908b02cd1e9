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

template <typename A>
C10_HOST_DEVICE inline A sigmoid(A x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<A, float>) {
    // expf (2 ulp) rather than __expf, whose error grows with |x| (~25 ulp at |x| = 20): the kernels are
    // memory-bound, so the accurate version costs no time. __frcp_rn is the correctly rounded 1/x.
    return __frcp_rn(1.0f + expf(-x));
  } else {
    return A(1) / (A(1) + ::exp(-x));
  }
#else
  return A(1) / (A(1) + std::exp(-x));
#endif
}

// swiglu(gate, up) = silu(gate) * up: (gate, up) -> out.
struct SwigluForward {
  static constexpr int kIn = 2;
  static constexpr int kOut = 1;

  template <typename A>
  C10_HOST_DEVICE void operator()(const A (&x)[kIn], A (&y)[kOut]) const {
    const A gate = x[0], up = x[1];
    y[0] = gate * sigmoid(gate) * up;
  }
};

// (grad_out, gate, up) -> (grad_gate, grad_up), with s = sigmoid(gate) recomputed:
//   grad_gate = grad_out * up * s * (1 + gate * (1 - s))     (silu'(gate) = s * (1 + gate * (1 - s)))
//   grad_up   = grad_out * silu(gate)
struct SwigluBackward {
  static constexpr int kIn = 3;
  static constexpr int kOut = 2;

  template <typename A>
  C10_HOST_DEVICE void operator()(const A (&x)[kIn], A (&y)[kOut]) const {
    const A grad = x[0], gate = x[1], up = x[2];
    const A s = sigmoid(gate);
    y[0] = grad * up * (s * (A(1) + gate * (A(1) - s)));
    y[1] = grad * (gate * s);
  }
};

}  // namespace torchops
