// The gated activations (swiglu, gelu_and_mul, forward and backward) on CUDA: the family of gated.h on the
// elementwise engine (cuda_elementwise.cuh): one pass, f32 math for 16-bit types (with fast exp where the
// rounding to 16 bits hides it), the activation recomputed in the backward. The activation (silu, gelu's
// erf or tanh form) is a template argument of the kernel, chosen once per call on the host.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <array>

#include "../elementwise/cuda_elementwise.cuh"
#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../elementwise/gated.h"

namespace torchops {
namespace {

struct CudaBackend {
  static at::Tensor empty_like_dense(const at::Tensor& like) { return empty_like_dense_cuda(like); }

  template <template <typename, bool> class Family, typename Act, size_t N>
  static void run(const char* op, const std::array<at::Tensor, N>& operands) {
    const c10::cuda::CUDAGuard device_guard(operands[0].device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    TORCHOPS_DISPATCH_FLOAT_TYPES(operands[0].scalar_type(), "gated_cuda", [&] {
      using Op = Family<Act, is_16bit_float<scalar_t>>;
      cuda::elementwise_kernel<scalar_t, Op>(op, operands, Op{}, stream);
    });
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  GatedOps<CudaBackend>::register_kernels(m);
}

}  // namespace torchops
