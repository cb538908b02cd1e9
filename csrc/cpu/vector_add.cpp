// vector_add on the CPU: the Add functor (activations.h) on the elementwise engine (cpu_elementwise.h):
// 8 lanes of f32 math at a time for f32/f16/bf16, 256-bit loops for f64 and the integers, any strides,
// at::parallel_for across cores.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "../elementwise/activations.h"
#include "../elementwise/cpu_elementwise.h"
#include "../core/dispatch.h"
#include "../elementwise/elementwise.h"
#include "../core/empty.h"

namespace torchops {
namespace {

constexpr int64_t kGrainSize = 32768;  // elements per task: large enough to amortise thread hand-off

void vector_add_cpu_into(const Operands<1, 2>& operands) {
  TORCHOPS_DISPATCH_FLOAT_AND_INT_TYPES(operands[0].scalar_type(), "vector_add_cpu", [&] {
    cpu::elementwise_kernel<scalar_t, Add>("vector_add", operands, kGrainSize);
  });
}

at::Tensor vector_add_cpu(const at::Tensor& a, const at::Tensor& b) {
  return elementwise("vector_add", {{"a", a}, {"b", b}}, {TORCHOPS_FLOAT_AND_INT_DTYPES}, empty_like_dense_cpu,
                     vector_add_cpu_into);
}

void vector_add_out_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  binary_elementwise_out("vector_add_out", {"a", a}, {"b", b}, {"out", out}, {TORCHOPS_FLOAT_AND_INT_DTYPES},
                         vector_add_cpu_into);
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, CPU, m) {
  m.impl("vector_add", &vector_add_cpu);
  m.impl("vector_add_out", &vector_add_out_cpu);
}

}  // namespace torchops
