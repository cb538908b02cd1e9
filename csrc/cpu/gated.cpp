// The gated activations (swiglu, gelu_and_mul, forward and backward) on the CPU: the family of gated.h on
// the elementwise engine (cpu_elementwise.h), one pass over (gate, up) [and grad_out], any strides; the
// halves of x.chunk(2, -1) are read in place, row by row. f32/f16/bf16 run 8 lanes of f32 math at a time
// (AVX2/FMA/F16C, picked at run time; 16-bit gates look their activation up by their stored bits), f64
// runs in f64; at::parallel_for across cores.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <array>

#include "../elementwise/cpu_elementwise.h"
#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../elementwise/gated.h"

namespace torchops {
namespace {

// Elements per task: each element costs a transcendental function, so smaller than vector_add's grain.
constexpr int64_t kGrainSize = 16384;

struct CpuBackend {
  static at::Tensor empty_like_dense(const at::Tensor& like) { return empty_like_dense_cpu(like); }

  template <template <typename, bool> class Family, typename Act, size_t N>
  static void run(const char* op, const std::array<at::Tensor, N>& operands) {
    TORCHOPS_DISPATCH_FLOAT_TYPES(operands[0].scalar_type(), "gated_cpu", [&] {
      cpu::elementwise_kernel<scalar_t, Family<Act, false>>(op, operands, kGrainSize);
    });
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(myns, CPU, m) {
  GatedOps<CpuBackend>::register_kernels(m);
}

}  // namespace torchops
