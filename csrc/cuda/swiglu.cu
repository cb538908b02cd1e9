// swiglu and swiglu_backward on CUDA: one pass, f32 math for 16-bit types, the sigmoid recomputed in the
// backward. Layouts go through cuda_elementwise.cuh: 16-byte vectors over rows with a row stride (the
// halves of x.chunk(2, -1) in place, a contiguous tensor as one row), per-element offsets otherwise.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "../common/activations.h"
#include "../common/cuda_elementwise.cuh"
#include "../common/dispatch.h"
#include "../common/elementwise.h"
#include "../common/empty.h"

namespace torchops {
namespace {

void swiglu_cuda_into(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& out) {
  const c10::cuda::CUDAGuard device_guard(out.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCHOPS_DISPATCH_FLOAT_TYPES(out.scalar_type(), "swiglu_cuda", [&] {
    using Op = SwigluForwardT<is_16bit_float<scalar_t>>;  // fast exp where the rounding hides it
    cuda::elementwise_kernel<scalar_t, Op>("swiglu", {out}, {gate, up}, Op{}, stream);
  });
}

at::Tensor swiglu_cuda(const at::Tensor& gate, const at::Tensor& up) {
  return binary_elementwise("swiglu", {"gate", gate}, {"up", up}, {TORCHOPS_FLOAT_DTYPES}, empty_like_dense_cuda,
                            swiglu_cuda_into);
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward_cuda(const at::Tensor& grad_out, const at::Tensor& gate,
                                                        const at::Tensor& up) {
  auto grads = multi_output_elementwise<2>(
      "swiglu_backward", {{"grad_out", grad_out}, {"gate", gate}, {"up", up}}, {TORCHOPS_FLOAT_DTYPES},
      empty_like_dense_cuda, [&](const std::array<at::Tensor, 2>& outs, const std::array<at::Tensor, 3>& ins) {
        const c10::cuda::CUDAGuard device_guard(gate.device());
        const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
        TORCHOPS_DISPATCH_FLOAT_TYPES(gate.scalar_type(), "swiglu_backward_cuda", [&] {
          using Op = SwigluBackwardT<is_16bit_float<scalar_t>>;
          cuda::elementwise_kernel<scalar_t, Op>("swiglu_backward", outs, ins, Op{}, stream);
        });
      });
  return {std::move(grads[0]), std::move(grads[1])};
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  m.impl("swiglu", &swiglu_cuda);
  m.impl("swiglu_backward", &swiglu_backward_cuda);
}

}  // namespace torchops
