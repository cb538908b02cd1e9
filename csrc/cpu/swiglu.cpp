// swiglu and swiglu_backward on the CPU: one pass over (gate, up) [and grad_out], any strides; the halves
// of x.chunk(2, -1) are read in place, row by row. f32/f16/bf16 run 8 lanes of f32 math at a time
// (AVX2/FMA/F16C, picked at run time), f64 runs in f64; at::parallel_for across cores.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <tuple>

#include "../common/activations.h"
#include "../common/cpu_elementwise.h"
#include "../common/dispatch.h"
#include "../common/elementwise.h"
#include "../common/empty.h"

namespace torchops {
namespace {

// Elements per task: each element costs an exp and a division, so smaller than vector_add's grain.
constexpr int64_t kGrainSize = 16384;

// The ops of activations.h plus their 8-lane f32 forms, in the same order of operations.
// T is the storage type the lanes were loaded from: 16-bit gates look their sigmoid up by their stored bits
// (src, cpu_avx2.h).
struct SwigluForwardCpu : SwigluForward {
#ifdef TORCHOPS_HAS_AVX2_PATH
  template <typename T>
  TORCHOPS_TARGET_AVX2 static void vec8(const __m256 (&x)[kIn], const cpu::Lanes8<T> (&src)[kIn], __m256 (&y)[kOut]) {
    const __m256 gate = x[0], up = x[1];
    y[0] = _mm256_mul_ps(_mm256_mul_ps(gate, cpu::sigmoid8_of<T>(gate, src[0])), up);
  }
#endif
};

struct SwigluBackwardCpu : SwigluBackward {
#ifdef TORCHOPS_HAS_AVX2_PATH
  template <typename T>
  TORCHOPS_TARGET_AVX2 static void vec8(const __m256 (&x)[kIn], const cpu::Lanes8<T> (&src)[kIn], __m256 (&y)[kOut]) {
    const __m256 grad = x[0], gate = x[1], up = x[2];
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 s = cpu::sigmoid8_of<T>(gate, src[1]);
    const __m256 dsilu = _mm256_mul_ps(s, _mm256_add_ps(one, _mm256_mul_ps(gate, _mm256_sub_ps(one, s))));
    y[0] = _mm256_mul_ps(_mm256_mul_ps(grad, up), dsilu);
    y[1] = _mm256_mul_ps(grad, _mm256_mul_ps(gate, s));
  }
#endif
};

at::Tensor swiglu_cpu(const at::Tensor& gate, const at::Tensor& up) {
  return binary_elementwise("swiglu", {"gate", gate}, {"up", up}, {TORCHOPS_FLOAT_DTYPES}, empty_like_dense_cpu,
                            [](const at::Tensor& g, const at::Tensor& u, const at::Tensor& out) {
                              TORCHOPS_DISPATCH_FLOAT_TYPES(out.scalar_type(), "swiglu_cpu", [&] {
                                cpu::elementwise_kernel<scalar_t, SwigluForwardCpu>("swiglu", {out}, {g, u},
                                                                                    kGrainSize);
                              });
                            });
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward_cpu(const at::Tensor& grad_out, const at::Tensor& gate,
                                                       const at::Tensor& up) {
  auto grads = multi_output_elementwise<2>(
      "swiglu_backward", {{"grad_out", grad_out}, {"gate", gate}, {"up", up}}, {TORCHOPS_FLOAT_DTYPES},
      empty_like_dense_cpu, [&](const std::array<at::Tensor, 2>& outs, const std::array<at::Tensor, 3>& ins) {
        TORCHOPS_DISPATCH_FLOAT_TYPES(gate.scalar_type(), "swiglu_backward_cpu", [&] {
          cpu::elementwise_kernel<scalar_t, SwigluBackwardCpu>("swiglu_backward", outs, ins,
                                                               kGrainSize);
        });
      });
  return {std::move(grads[0]), std::move(grads[1])};
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, CPU, m) {
  m.impl("swiglu", &swiglu_cpu);
  m.impl("swiglu_backward", &swiglu_backward_cpu);
}

}  // namespace torchops
