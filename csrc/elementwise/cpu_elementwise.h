// The CPU elementwise engine: a functor run by `elementwise_kernel` over operands (outs..., ins...) of one
// shape (elementwise.h builds them): outputs dense or any out= layout, inputs with any strides. The
// collapsed layout is split across cores with at::parallel_for (Op::kCpuGrainSize elements a task) and
// walked run by run (for_each_run), so rows with a row stride and a contiguous last dim (the halves of
// x.chunk(2, -1)) stream through the vector loop without copies. `Backend` at the end is the engine's CPU
// backend for elementwise.h.
//
// An Op is a functor (activations.h) with kIn, kOut and a scalar `operator()(const A (&x)[kIn], A
// (&y)[kOut])` on the op-math type A (opmath_t: f32 for 16-bit floats, the type itself otherwise). On x86-64
// it may also have
//   template <typename T>
//   TORCHOPS_TARGET_AVX2 static void vec8(const __m256 (&x)[kIn], const Lanes8<T> (&src)[kIn], __m256 (&y)[kOut]);
// (T: the storage type the lanes were loaded from, src: where from, for ops that want the stored bits),
// used for f32/f16/bf16 when the processor has AVX2+FMA+F16C. Other types (f64, integers) run the scalar
// operator(), compiled for AVX2 on such processors so dense runs vectorise at 256 bits.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <array>
#include <type_traits>
#include <utility>

#include "../core/cpu_avx2.h"
#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../core/strided.h"
#include "elementwise.h"

namespace torchops {
namespace cpu {

// Pointers and innermost strides of one run: in[k][j * in_stride[k]] for j in [0, n).
template <typename T, int kIn, int kOut>
struct Run {
  const T* in[kIn];
  int64_t in_stride[kIn];
  T* out[kOut];
  int64_t out_stride[kOut];

  bool dense() const {
    bool all = true;
    for (int k = 0; k < kIn; ++k) all = all && in_stride[k] == 1;
    for (int k = 0; k < kOut; ++k) all = all && out_stride[k] == 1;
    return all;
  }
};

#ifdef TORCHOPS_HAS_AVX2_PATH
// Whether Op runs 8 lanes of storage type T at a time: T has an 8-lane f32 form (f32, f16, bf16) and Op a
// vec8 for it. (The arguments come from a struct: __m256 itself as a template argument loses its vector
// attributes.)
template <typename T, int kIn, int kOut>
struct Vec8Args {
  __m256 x[kIn];
  Lanes8<T> src[kIn];
  __m256 y[kOut];
};
template <typename Op, typename T, typename = void>
constexpr bool kHasVec8 = false;
template <typename Op, typename T>
constexpr bool kHasVec8<Op, T,
                        std::void_t<decltype(Op::template vec8<T>(std::declval<Vec8Args<T, Op::kIn, Op::kOut>&>().x,
                                                                  std::declval<Vec8Args<T, Op::kIn, Op::kOut>&>().src,
                                                                  std::declval<Vec8Args<T, Op::kIn, Op::kOut>&>().y))>> =
    std::is_same_v<T, float> || is_16bit_float<T>;
#endif

// The loops below copy a run's pointers and strides into locals first: stores through the outputs (and
// through the vector intrinsics' may-alias types) could otherwise alias the Run and force a reload of every
// pointer on every iteration.
template <typename T, typename Op>
__attribute__((always_inline)) inline void scalar_elements(const Run<T, Op::kIn, Op::kOut>& r, int64_t n) {
  using A = opmath_t<T>;
  constexpr int kIn = Op::kIn, kOut = Op::kOut;
  const Op op;
  const T* in[kIn];
  T* out[kOut];
  for (int k = 0; k < kIn; ++k) in[k] = r.in[k];
  for (int k = 0; k < kOut; ++k) out[k] = r.out[k];
  if (r.dense()) {  // unit strides spelled out, so the compiler vectorises the loop
    for (int64_t j = 0; j < n; ++j) {
      A x[kIn], y[kOut];
      for (int k = 0; k < kIn; ++k) x[k] = static_cast<A>(in[k][j]);
      op(x, y);
      for (int k = 0; k < kOut; ++k) out[k][j] = static_cast<T>(y[k]);
    }
    return;
  }
  int64_t in_stride[kIn], out_stride[kOut];
  for (int k = 0; k < kIn; ++k) in_stride[k] = r.in_stride[k];
  for (int k = 0; k < kOut; ++k) out_stride[k] = r.out_stride[k];
  for (int64_t j = 0; j < n; ++j) {
    A x[kIn], y[kOut];
    for (int k = 0; k < kIn; ++k) x[k] = static_cast<A>(in[k][j * in_stride[k]]);
    op(x, y);
    for (int k = 0; k < kOut; ++k) out[k][j * out_stride[k]] = static_cast<T>(y[k]);
  }
}

template <typename T, typename Op>
void scalar_run(const Run<T, Op::kIn, Op::kOut>& r, int64_t n) {
  scalar_elements<T, Op>(r, n);
}

#ifdef TORCHOPS_HAS_AVX2_PATH
template <typename T, typename Op>
TORCHOPS_TARGET_AVX2 void scalar_run_avx2(const Run<T, Op::kIn, Op::kOut>& r, int64_t n) {
  scalar_elements<T, Op>(r, n);
}

// 8 lanes at a time: dense loads/stores when every stride is 1; otherwise each operand with unit stride
// still loads/stores 8 lanes at once and only the others are gathered/scattered lane by lane. The last
// n % 8 elements go through a zero-padded buffer of stored values, so every element gets the same
// conversion and vector math whatever its position or layout.
template <typename T, typename Op>
TORCHOPS_TARGET_AVX2 void avx2_run(const Run<T, Op::kIn, Op::kOut>& r, int64_t n) {
  constexpr int kIn = Op::kIn, kOut = Op::kOut;
  const T* in[kIn];
  T* out[kOut];
  int64_t in_stride[kIn], out_stride[kOut];
  for (int k = 0; k < kIn; ++k) in[k] = r.in[k], in_stride[k] = r.in_stride[k];
  for (int k = 0; k < kOut; ++k) out[k] = r.out[k], out_stride[k] = r.out_stride[k];
  __m256 x[kIn], y[kOut];
  Lanes8<T> src[kIn];
  int64_t j = 0;
  if (r.dense()) {
    for (; j + 8 <= n; j += 8) {
      for (int k = 0; k < kIn; ++k) {
        src[k] = {in[k] + j, 1};
        x[k] = load8_as_float(in[k] + j);
      }
      Op::template vec8<T>(x, src, y);
      for (int k = 0; k < kOut; ++k) store8_from_float(out[k] + j, y[k]);
    }
  } else {
    for (; j + 8 <= n; j += 8) {
      for (int k = 0; k < kIn; ++k) {
        const T* p = in[k] + j * in_stride[k];
        src[k] = {p, in_stride[k]};
        x[k] = in_stride[k] == 1 ? load8_as_float(p) : gather8_as_float(p, in_stride[k]);
      }
      Op::template vec8<T>(x, src, y);
      for (int k = 0; k < kOut; ++k) {
        T* p = out[k] + j * out_stride[k];
        if (out_stride[k] == 1) {
          store8_from_float(p, y[k]);
        } else {
          scatter8_from_float(p, out_stride[k], y[k]);
        }
      }
    }
  }
  const int64_t rem = n - j;
  if (rem > 0) {
    T stored[kIn][8];
    for (int k = 0; k < kIn; ++k) {
      for (int e = 0; e < 8; ++e) stored[k][e] = e < rem ? in[k][(j + e) * in_stride[k]] : T(0);
      src[k] = {stored[k], 1};
      x[k] = load8_as_float(src[k].p);  // the dense path's conversion
    }
    Op::template vec8<T>(x, src, y);
    for (int k = 0; k < kOut; ++k) {
      T results[8];
      store8_from_float(results, y[k]);  // the dense path's conversion (f16 NaN payloads included)
      for (int e = 0; e < rem; ++e) out[k][(j + e) * out_stride[k]] = results[e];
    }
  }
}
#endif

template <typename T, typename Op>
void run_elementwise(const Run<T, Op::kIn, Op::kOut>& r, int64_t n) {
#ifdef TORCHOPS_HAS_AVX2_PATH
  if (cpu_has_avx2()) {
    if constexpr (kHasVec8<Op, T>) {
      return avx2_run<T, Op>(r, n);
    } else {
      return scalar_run_avx2<T, Op>(r, n);
    }
  }
#endif
  scalar_run<T, Op>(r, n);
}

// operands = (outs..., ins...): outs[k] = Op(ins...) elementwise over the common shape; `name` names the op
// in errors. An out= output may alias an input exactly: each element is read before it is written.
template <typename T, typename Op>
void elementwise_kernel(const char* name, const Operands<Op::kOut, Op::kIn>& operands) {
  constexpr int kIn = Op::kIn, kOut = Op::kOut;
  constexpr int64_t grain_size = Op::kCpuGrainSize;
  const auto layout = collapse_layout<kIn + kOut>(name, operands);
  Run<T, kIn, kOut> base;
  for (int k = 0; k < kOut; ++k) {
    base.out[k] = operands[k].template mutable_data_ptr<T>();
    base.out_stride[k] = inner_stride(layout, k);
  }
  for (int k = 0; k < kIn; ++k) {
    base.in[k] = operands[kOut + k].template const_data_ptr<T>();
    base.in_stride[k] = inner_stride(layout, kOut + k);
  }
  if (layout.ndim <= 1) {  // one run: chunks of it, no odometer
    at::parallel_for(0, operands[0].numel(), grain_size, [&](int64_t begin, int64_t end) {
      Run<T, kIn, kOut> r = base;
      for (int k = 0; k < kOut; ++k) r.out[k] += begin * r.out_stride[k];
      for (int k = 0; k < kIn; ++k) r.in[k] += begin * r.in_stride[k];
      run_elementwise<T, Op>(r, end - begin);
    });
    return;
  }
  at::parallel_for(0, operands[0].numel(), grain_size, [&](int64_t begin, int64_t end) {
    for_each_run(layout, begin, end, [&](const int64_t (&offsets)[kIn + kOut], int64_t n) {
      Run<T, kIn, kOut> r = base;
      for (int k = 0; k < kOut; ++k) r.out[k] += offsets[k];
      for (int k = 0; k < kIn; ++k) r.in[k] += offsets[kOut + k];
      run_elementwise<T, Op>(r, n);
    });
  });
}

// The engine's CPU backend (elementwise.h).
struct Backend {
  static at::Tensor empty_like_dense(const at::Tensor& like) { return empty_like_dense_cpu(like); }

  template <typename Op>
  static void run(const char* op, const Operands<Op::kOut, Op::kIn>& operands) {
    dispatch_elementwise<Op>(operands[0].scalar_type(),
                             [&](auto zero) { elementwise_kernel<decltype(zero), Op>(op, operands); });
  }
};

}  // namespace cpu
}  // namespace torchops
