// Autograd for vector_add: d(a + b)/da = d(a + b)/db = identity, so backward hands grad_out to both.
// vector_add_out is a mutation and records no graph; it bumps out's version counter so autograd sees
// the write (the ADInplaceOrView step, done here because this kernel dispatches below it).
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "../common/autograd_utils.h"

namespace torchops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor vector_add_below_autograd(const at::Tensor& a, const at::Tensor& b) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("myns::vector_add");
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(a, b);
}

class VectorAddFunction : public torch::autograd::Function<VectorAddFunction> {
 public:
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& a, const at::Tensor& b) {
    return vector_add_below_autograd(a, b);
  }

  static variable_list backward(AutogradContext* /*ctx*/, variable_list grad_outputs) {
    return {grad_outputs[0], grad_outputs[0]};
  }
};

at::Tensor vector_add_autograd(const at::Tensor& a, const at::Tensor& b) {
  // Skipping the graph node when nothing needs a gradient keeps small calls as cheap as torch.add's.
  if (!needs_grad(a, b)) return vector_add_below_autograd(a, b);
  return VectorAddFunction::apply(a, b);
}

void vector_add_out_autograd(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  static const auto op =
      find_op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&)>("myns::vector_add_out");
  check_out_variant_not_differentiable("vector_add_out", {{"a", a}, {"b", b}, {"out", out}});
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.call(a, b, out);
  }
  torch::autograd::impl::bump_version(out);
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, Autograd, m) {
  m.impl("vector_add", &vector_add_autograd);
  m.impl("vector_add_out", &vector_add_out_autograd);
}

}  // namespace torchops
