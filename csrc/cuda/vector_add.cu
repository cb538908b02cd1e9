// vector_add on CUDA: the Add functor (activations.h) on the elementwise engine (cuda_elementwise.cuh):
// 16-byte vectors for dense and 1-D strided layouts, shared-memory tiles for transposed ones, per-element
// offsets otherwise.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../elementwise/activations.h"
#include "../elementwise/cuda_elementwise.cuh"
#include "../core/dispatch.h"
#include "../elementwise/elementwise.h"
#include "../core/empty.h"

namespace torchops {
namespace {

void vector_add_cuda_into(const Operands<1, 2>& operands) {
  const c10::cuda::CUDAGuard device_guard(operands[0].device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCHOPS_DISPATCH_FLOAT_AND_INT_TYPES(operands[0].scalar_type(), "vector_add_cuda", [&] {
    cuda::elementwise_kernel<scalar_t, Add>("vector_add", operands, Add{}, stream);
  });
}

at::Tensor vector_add_cuda(const at::Tensor& a, const at::Tensor& b) {
  return elementwise("vector_add", {{"a", a}, {"b", b}}, {TORCHOPS_FLOAT_AND_INT_DTYPES}, empty_like_dense_cuda,
                     vector_add_cuda_into);
}

void vector_add_out_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  binary_elementwise_out("vector_add_out", {"a", a}, {"b", b}, {"out", out}, {TORCHOPS_FLOAT_AND_INT_DTYPES},
                         vector_add_cuda_into);
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  m.impl("vector_add", &vector_add_cuda);
  m.impl("vector_add_out", &vector_add_out_cuda);
}

}  // namespace torchops
