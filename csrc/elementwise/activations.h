// The math of the elementwise ops, shared by the CPU and CUDA engines (cpu_elementwise.h,
// cuda_elementwise.cuh): their functors, and the rows that make ops of them (elementwise.h and gated.h turn
// a row into kernels, autograd/gated.cpp a gated row into autograd).
//
// A functor derives from ElementwiseFunctor (the engines' settings, which it may override) and has kIn
// inputs, kOut outputs and a scalar `operator()(const A (&x)[kIn], A (&y)[kOut])` on the op-math type A (f32
// for f16/bf16/f32 storage, the type itself otherwise), so 16-bit inputs are computed in f32; on the CPU it
// may add an 8-lane f32 form `vec8` (cpu_elementwise.h) that the engine then uses.
//
// Gated activations: op(gate, up) = act(gate) * up, backward (grad_out, gate, up) -> (grad_out * up *
// act'(gate), grad_out * act(gate)). An activation is a struct with
//   template <bool kFast, typename A> static A value(A x);                              act(x)
//   template <bool kFast, typename A> static void value_and_derivative(A x, A& f, A& df);  act(x), act'(x)
//   static TensorDerivatives derivatives(const at::Tensor& x);   act, act', act'' in ATen ops, for autograd
// (kFast: fast exp/reciprocal allowed, CUDA with 16-bit storage only, where rounding hides them) and,
// optionally, on x86-64 the 8-lane forms value8 / value_and_derivative8 (T: the storage type the lanes were
// loaded from, src: where, for lookups by stored bits). A gated op is then a row at the end of this file.
//
// Large |x| never produces inf/inf or inf*0 where the true value is finite: sigmoid is 1 / (1 + exp(-x)),
// which is exactly 0 once exp(-x) overflows (x*0 = -0 for silu(-1e4)) and 1 once it underflows; the
// derivatives' products are arranged (or guarded) so that a saturated factor gives 0, not 0 * inf.
// Infinite and NaN inputs give NaN where the formula meets inf * 0 (act(-inf) for silu and gelu, the
// derivatives at +-inf for gelu), as torch's own kernels do.
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>
#include <c10/util/string_view.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "../core/checks.h"

#if !defined(__CUDACC__)
#include "../core/cpu_avx2.h"
#endif

namespace torchops {

// The engines' settings; a functor derives from this and overrides what it needs.
struct ElementwiseFunctor {
  // Integer dtypes too (core/dispatch.h's float and int lists), else the float list.
  static constexpr bool kIntegers = false;
  // CPU: elements per task; with a transcendental function per element, small tasks pay for their hand-off.
  static constexpr int64_t kCpuGrainSize = 16384;
  // CUDA, 1-D and rows paths: 16-byte vectors of each operand per thread. One keeps the gated kernels'
  // registers low enough for full occupancy.
  static constexpr int kVectorsPerThread = 1;
  // CUDA, tiled path: resident blocks per SM, which caps the registers (65536 / (256 threads x blocks)).
  // 3 (85 registers) is where no gated kernel spills; 16-bit gated kernels spilled at 4.
  static constexpr int kTileBlocksPerSM = 3;
};

// An activation and its first two derivatives, as tensors.
struct TensorDerivatives {
  at::Tensor f, df, d2f;
};

// kFastExp: __expf and a fast reciprocal, for 16-bit storage only. Their error (~25 f32 ulp at |x| = 20,
// < 2^-17 relative up to |x| = 88) is far below half an f16/bf16 ulp, so the rounded result stays within
// 1 ulp; with 16-bit elements the accurate forms made the kernels compute-bound, not memory-bound.
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

template <bool kFastExp = false, typename A>
C10_HOST_DEVICE inline A exp_of(A x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<A, float>) {
    if constexpr (kFastExp) {
      return __expf(x);
    } else {
      return expf(x);
    }
  } else {
    return ::exp(x);
  }
#else
  return std::exp(x);
#endif
}

// 1 / d for d in [1, 2] (no huge denominators, where __fdividef fails): the fast form for 16-bit storage.
template <bool kFast = false, typename A>
C10_HOST_DEVICE inline A reciprocal_1_2(A d) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<A, float> && kFast) {
    return __fdividef(1.0f, d);
  }
#endif
  return A(1) / d;
}

template <typename A>
C10_HOST_DEVICE inline A erf_of(A x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<A, float>) {
    return erff(x);
  } else {
    return ::erf(x);
  }
#else
  return std::erf(x);
#endif
}

// ------------------------------------------------------------------------------------------ activations

// silu(x) = x * sigmoid(x); silu'(x) = s * (1 + x * (1 - s)) with s = sigmoid(x).
struct Silu {
  template <bool kFast, typename A>
  C10_HOST_DEVICE static A value(A x) {
    return x * sigmoid<kFast>(x);
  }
  template <bool kFast, typename A>
  C10_HOST_DEVICE static void value_and_derivative(A x, A& f, A& df) {
    const A s = sigmoid<kFast>(x);
    f = x * s;
    df = s * (A(1) + x * (A(1) - s));
  }
  // silu, silu' and silu'' = s (1 - s) (2 + x (1 - 2 s)) on tensors, for autograd's double backward.
  static TensorDerivatives derivatives(const at::Tensor& x) {
    const at::Tensor s = x.sigmoid();
    const at::Tensor one_minus_s = 1 - s;
    return {x * s, s * (1 + x * one_minus_s), s * one_minus_s * (2 + x * (1 - 2 * s))};
  }
#ifdef TORCHOPS_HAS_AVX2_PATH
  // 16-bit gates look their sigmoid up by their stored bits (sigmoid8_of).
  template <typename T>
  TORCHOPS_TARGET_AVX2 static __m256 value8(__m256 x, cpu::Lanes8<T> src) {
    return _mm256_mul_ps(x, cpu::sigmoid8_of<T>(x, src));
  }
  template <typename T>
  TORCHOPS_TARGET_AVX2 static void value_and_derivative8(__m256 x, cpu::Lanes8<T> src, __m256& f, __m256& df) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 s = cpu::sigmoid8_of<T>(x, src);
    f = _mm256_mul_ps(x, s);
    df = _mm256_mul_ps(s, _mm256_add_ps(one, _mm256_mul_ps(x, _mm256_sub_ps(one, s))));
  }
#endif
};

// gelu(x) = x * Phi(x), Phi the standard normal CDF = 0.5 * (1 + erf(x / sqrt 2)) (F.gelu's "none"):
// gelu'(x) = Phi(x) + x * phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
struct GeluErf {
  template <bool kFast, typename A>
  C10_HOST_DEVICE static A value(A x) {
    return x * (A(0.5) * (A(1) + erf_of(x * A(M_SQRT1_2))));
  }
  template <bool kFast, typename A>
  C10_HOST_DEVICE static void value_and_derivative(A x, A& f, A& df) {
    const A cdf = A(0.5) * (A(1) + erf_of(x * A(M_SQRT1_2)));
    const A pdf = exp_of<kFast>(A(-0.5) * x * x) * A(0.5 * M_2_SQRTPI * M_SQRT1_2);
    f = x * cdf;
    df = cdf + x * pdf;
  }
  // gelu, gelu' = Phi + x phi and gelu'' = phi (2 - x^2) on tensors, for autograd's double backward.
  static TensorDerivatives derivatives(const at::Tensor& x) {
    const at::Tensor cdf = 0.5 * (1 + (x * M_SQRT1_2).erf());
    const at::Tensor pdf = (-0.5 * x * x).exp() * (0.5 * M_2_SQRTPI * M_SQRT1_2);
    return {x * cdf, cdf + x * pdf, pdf * (2 - x * x)};
  }
#ifdef TORCHOPS_HAS_AVX2_PATH
  struct Value8 {
    TORCHOPS_TARGET_AVX2 static __m256 apply(__m256 x) { return _mm256_mul_ps(x, cpu::normal_cdf8(x)); }
  };
  // cdf + x pdf, pdf = exp(-x^2 / 2) / sqrt(2 pi) (the exponential normal_cdf8 computes anyway).
  TORCHOPS_TARGET_AVX2 static __m256 derivative8(__m256 x, __m256 cdf, __m256 exp_half_sq) {
    const __m256 pdf = _mm256_mul_ps(exp_half_sq, _mm256_set1_ps(static_cast<float>(0.5 * M_2_SQRTPI * M_SQRT1_2)));
    return _mm256_fmadd_ps(x, pdf, cdf);
  }
  struct Derivative8 {
    TORCHOPS_TARGET_AVX2 static __m256 apply(__m256 x) {
      __m256 e;
      const __m256 cdf = cpu::normal_cdf8(x, e);
      return derivative8(x, cdf, e);
    }
  };
  template <typename T>
  TORCHOPS_TARGET_AVX2 static __m256 value8(__m256 x, cpu::Lanes8<T> src) {
    return cpu::by_bits8<T, Value8>(x, src);
  }
  template <typename T>
  TORCHOPS_TARGET_AVX2 static void value_and_derivative8(__m256 x, cpu::Lanes8<T> src, __m256& f, __m256& df) {
    if constexpr (std::is_same_v<T, float>) {  // one normal_cdf8 for both (the tables' values, computed once)
      __m256 e;
      const __m256 cdf = cpu::normal_cdf8(x, e);
      f = _mm256_mul_ps(x, cdf);
      df = derivative8(x, cdf, e);
    } else {
      f = cpu::by_bits8<T, Value8>(x, src);
      df = cpu::by_bits8<T, Derivative8>(x, src);
    }
  }
#endif
};

// F.gelu's "tanh" form: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as x * sigmoid(w),
// w = 2u (the same function: 1 + tanh(u) = 2 sigmoid(2u)), which reuses sigmoid's saturation. With s =
// sigmoid(w): gelu'(x) = s + x s (1 - s) w'(x), w'(x) = 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2); where
// s (1 - s) underflows to 0 the second term is 0 for finite x although w' may overflow (|x| > 1.8e19 in
// f32), so it is taken as x * 0 there (NaN only for x = +-inf).
struct GeluTanh {
  static constexpr double kBeta = M_SQRT2 * M_2_SQRTPI * 0.5;  // sqrt(2 / pi)
  static constexpr double kKappa = 0.044715;

  template <typename A>
  C10_HOST_DEVICE static A two_u(A x) {
    return A(2 * kBeta) * (x + A(kKappa) * x * x * x);
  }
  template <bool kFast, typename A>
  C10_HOST_DEVICE static A value(A x) {
    return x * sigmoid<kFast>(two_u(x));
  }
  // s and s (1 - s) from one e = exp(-|w|) <= 1: sigmoid(|w|) = 1 / (1 + e), sigmoid(-|w|) = e / (1 + e), so
  // s (1 - s) = e / (1 + e)^2 keeps its relative accuracy where s rounds to 1 (1 - s would be 0 there, and
  // x s (1 - s) w' is still ~1e-6 at x = 5 in f32).
  template <bool kFast, typename A>
  C10_HOST_DEVICE static void value_and_derivative(A x, A& f, A& df) {
    const A w = two_u(x);
    const A e = exp_of<kFast>(w < A(0) ? w : -w);
    const A r = reciprocal_1_2<kFast>(A(1) + e);  // 1 + e in [1, 2]
    const A s = w >= A(0) ? r : e * r;  // NaN w: e * r is NaN
    const A slope = e * r * r;
    f = x * s;
    df = s + (slope == A(0) ? x * A(0) : x * (slope * (A(2 * kBeta) * (A(1) + A(3 * kKappa) * x * x))));
  }
  // On tensors, for autograd's double backward: with s' = s (1 - s) w' and s'' = s (1 - s) ((1 - 2 s) w'^2 +
  // w''), gelu' = s + x s' and gelu'' = 2 s' + x s''.
  static TensorDerivatives derivatives(const at::Tensor& x) {
    constexpr double kTwoBeta = 2 * kBeta;
    const at::Tensor x2 = x * x;
    const at::Tensor s = (kTwoBeta * (x + kKappa * x2 * x)).sigmoid();
    const at::Tensor slope = s * (1 - s);
    const at::Tensor dw = kTwoBeta * (1 + 3 * kKappa * x2);
    const at::Tensor ds = slope * dw;
    const at::Tensor d2s = slope * ((1 - 2 * s) * dw * dw + (6 * kTwoBeta * kKappa) * x);
    return {x * s, s + x * ds, 2 * ds + x * d2s};
  }
#ifdef TORCHOPS_HAS_AVX2_PATH
  TORCHOPS_TARGET_AVX2 static __m256 two_u8(__m256 x) {
    const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    return _mm256_mul_ps(_mm256_set1_ps(static_cast<float>(2 * kBeta)),
                         _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(kKappa)), x3, x));
  }
  struct Value8 {
    TORCHOPS_TARGET_AVX2 static __m256 apply(__m256 x) { return _mm256_mul_ps(x, cpu::sigmoid8(two_u8(x))); }
  };
  struct Derivative8 {
    TORCHOPS_TARGET_AVX2 static __m256 apply(__m256 x) {
      const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
      const __m256 w = two_u8(x);
      const __m256 minus_abs_w = _mm256_or_ps(w, _mm256_set1_ps(-0.0f));
      const __m256 e = cpu::exp8(minus_abs_w);
      const __m256 r = _mm256_div_ps(one, _mm256_add_ps(one, e));
      const __m256 er = _mm256_mul_ps(e, r);
      // w >= 0: s = r; else (NaN too) s = e r.
      const __m256 s = _mm256_blendv_ps(er, r, _mm256_cmp_ps(w, zero, _CMP_GE_OQ));
      const __m256 slope = _mm256_mul_ps(er, r);
      const __m256 du = _mm256_mul_ps(_mm256_set1_ps(static_cast<float>(2 * kBeta)),
                                      _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(3 * kKappa)),
                                                      _mm256_mul_ps(x, x), one));
      const __m256 term = _mm256_mul_ps(x, _mm256_mul_ps(slope, du));
      const __m256 saturated = _mm256_cmp_ps(slope, zero, _CMP_EQ_OQ);
      return _mm256_add_ps(s, _mm256_blendv_ps(term, _mm256_mul_ps(x, zero), saturated));
    }
  };
  template <typename T>
  TORCHOPS_TARGET_AVX2 static __m256 value8(__m256 x, cpu::Lanes8<T> src) {
    return cpu::by_bits8<T, Value8>(x, src);
  }
  template <typename T>
  TORCHOPS_TARGET_AVX2 static void value_and_derivative8(__m256 x, cpu::Lanes8<T> src, __m256& f, __m256& df) {
    f = cpu::by_bits8<T, Value8>(x, src);
    df = cpu::by_bits8<T, Derivative8>(x, src);
  }
#endif
};

// --------------------------------------------------------------------------------------- gated family

// (gate, up) -> act(gate) * up.
template <typename Act, bool kFast = false>
struct GatedForward : ElementwiseFunctor {
  static constexpr int kIn = 2;
  static constexpr int kOut = 1;

  template <typename A>
  C10_HOST_DEVICE void operator()(const A (&x)[kIn], A (&y)[kOut]) const {
    y[0] = Act::template value<kFast>(x[0]) * x[1];
  }
#ifdef TORCHOPS_HAS_AVX2_PATH
  // Only where the activation has its 8-lane form (the engine falls back to operator() otherwise).
  template <typename T, typename A = Act>
  TORCHOPS_TARGET_AVX2 static auto vec8(const __m256 (&x)[kIn], const cpu::Lanes8<T> (&src)[kIn], __m256 (&y)[kOut])
      -> decltype(A::template value8<T>(x[0], src[0]), void()) {
    y[0] = _mm256_mul_ps(A::template value8<T>(x[0], src[0]), x[1]);
  }
#endif
};

// (grad_out, gate, up) -> (grad_gate, grad_up) = (grad_out * up * act'(gate), grad_out * act(gate)).
template <typename Act, bool kFast = false>
struct GatedBackward : ElementwiseFunctor {
  static constexpr int kIn = 3;
  static constexpr int kOut = 2;

  template <typename A>
  C10_HOST_DEVICE void operator()(const A (&x)[kIn], A (&y)[kOut]) const {
    const A grad = x[0], gate = x[1], up = x[2];
    A f, df;
    Act::template value_and_derivative<kFast>(gate, f, df);
    y[0] = grad * up * df;
    y[1] = grad * f;
  }
#ifdef TORCHOPS_HAS_AVX2_PATH
  template <typename T, typename A = Act>
  TORCHOPS_TARGET_AVX2 static auto vec8(const __m256 (&x)[kIn], const cpu::Lanes8<T> (&src)[kIn], __m256 (&y)[kOut])
      -> decltype(A::template value_and_derivative8<T>(x[1], src[1], y[0], y[1]), void()) {
    __m256 f, df;
    A::template value_and_derivative8<T>(x[1], src[1], f, df);
    y[0] = _mm256_mul_ps(_mm256_mul_ps(x[0], x[2]), df);
    y[1] = _mm256_mul_ps(x[0], f);
  }
#endif
};

// --------------------------------------------------------------------------------------------- add

// (a, b) -> a + b, for floats (in the op-math type) and integers.
struct Add : ElementwiseFunctor {
  static constexpr int kIn = 2;
  static constexpr int kOut = 1;
  static constexpr bool kIntegers = true;
  // A pure stream: larger CPU tasks, and on CUDA two vectors in flight per thread and more resident tile
  // blocks, hide memory latency best.
  static constexpr int64_t kCpuGrainSize = 32768;
  static constexpr int kVectorsPerThread = 2;
  static constexpr int kTileBlocksPerSM = 6;

  template <typename A>
  C10_HOST_DEVICE void operator()(const A (&x)[kIn], A (&y)[kOut]) const {
    y[0] = x[0] + x[1];
  }
#ifdef TORCHOPS_HAS_AVX2_PATH
  template <typename T>
  TORCHOPS_TARGET_AVX2 static void vec8(const __m256 (&x)[kIn], const cpu::Lanes8<T> (&)[kIn], __m256 (&y)[kOut]) {
    y[0] = _mm256_add_ps(x[0], x[1]);
  }
#endif
};

// -------------------------------------------------------------------------------------------------- rows
// An op is a row: its schemas' names and its functor (a binary op: elementwise.h's BinaryKernels) or its
// activations (a gated op: gated.h's GatedKernels, autograd/gated.cpp's GatedAutograd).

// op(a, b) -> a new tensor, and op_out(a, b, out).
struct VectorAdd {
  static constexpr const char* kName = "vector_add";
  static constexpr const char* kOutName = "vector_add_out";
  using Op = Add;
};

// The schema arguments of a gated op after its tensors, which select its form.
template <typename... T>
struct ExtraArgs {};

// The grad_fn names of one form of a gated op: its node and its backward op's node (one name per formula:
// compiled autograd binds each name once per process).
struct GatedNodes {
  const char* forward;
  const char* backward;
};

// A gated op: kName, kBackwardName and kBackwardOutName (the backward written into given tensors) name its
// schemas, Extra their arguments after the tensors, and
// with_form(op, fn, extra...) returns fn(Act{}, GatedNodes{...}) for the activation the arguments select,
// raising under `op`'s name for a value no form has.
struct Swiglu {
  static constexpr const char* kName = "swiglu";
  static constexpr const char* kBackwardName = "swiglu_backward";
  static constexpr const char* kBackwardOutName = "swiglu_backward_out";
  using Extra = ExtraArgs<>;
  template <typename Fn>
  static decltype(auto) with_form(const char* /*op*/, Fn&& fn) {
    return fn(Silu{}, GatedNodes{"SwigluBackward", "SwigluBackwardBackward"});
  }
};

struct GeluAndMul {
  static constexpr const char* kName = "gelu_and_mul";
  static constexpr const char* kBackwardName = "gelu_and_mul_backward";
  static constexpr const char* kBackwardOutName = "gelu_and_mul_backward_out";
  using Extra = ExtraArgs<c10::string_view>;  // approximate: "none" (erf) or "tanh"
  template <typename Fn>
  static decltype(auto) with_form(const char* op, Fn&& fn, c10::string_view approximate) {
    if (gelu_uses_tanh(op, approximate)) {
      return fn(GeluTanh{}, GatedNodes{"GeluAndMulTanhBackward", "GeluAndMulTanhBackwardBackward"});
    }
    return fn(GeluErf{}, GatedNodes{"GeluAndMulBackward", "GeluAndMulBackwardBackward"});
  }
};

// Every gated op: their CPU, CUDA and Autograd kernels are registered from this list.
using GatedFamily = std::tuple<Swiglu, GeluAndMul>;

}  // namespace torchops
