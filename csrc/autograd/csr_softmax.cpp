// Autograd for csr_softmax: y = softmax over each row's nonzeros (per head) of values.
//   d values = _csr_softmax_backward(crow, grad_out, values) = y * (grad_out - rowsum(grad_out * y)),
// y recomputed there from values (a node cannot save its own output without a reference cycle).
// The Jacobian of a softmax is symmetric, so the tangent of forward mode is the same op applied to the
// tangent of values. _csr_softmax_backward itself is a graph node whose own derivative is refused, by name.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include "../core/autograd_node.h"
#include "../core/autograd_utils.h"

namespace torchops {
namespace {

using TensorRef = const at::Tensor&;

const OpRef<at::Tensor(TensorRef, TensorRef)> softmax_op{"myns::csr_softmax"};
const OpRef<at::Tensor(TensorRef, TensorRef, TensorRef)> softmax_backward_op{
    "myns::_csr_softmax_backward"};

// Saved: crow, values. Edges: values.
variable_list softmax_backward_formula(const BackwardContext& ctx, const variable_list& saved,
                                       const variable_list& grads) {
  if (!grads[0].defined() || !ctx.needs_input_grad(0)) return {at::Tensor()};
  return {softmax_backward_op().call(saved[0], grads[0], saved[1])};
}

at::Tensor csr_softmax_autograd(const at::Tensor& crow, const at::Tensor& values) {
  OpNodePtr node;
  if (needs_grad(values)) {
    node = make_op_node("CsrSoftmaxBackward", &softmax_backward_formula, {values});
    node->save({crow, values});
  }
  at::Tensor out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    out = softmax_op().call(crow, values);
  }
  if (node) record_outputs(node, {out});
  if (has_forward_grad(values)) {
    const at::Tensor tangent = softmax_backward_op().call(crow, values._fw_grad(kForwardGradLevel), forward_primal(values));
    out._set_fw_grad(tangent, kForwardGradLevel, /*is_inplace_op=*/false);
  }
  return out;
}

at::Tensor csr_softmax_backward_autograd(const at::Tensor& crow, const at::Tensor& grad_out, const at::Tensor& values) {
  return call_differentiable_once("CsrSoftmaxBackwardBackward", "_csr_softmax_backward", "", {grad_out, values},
                                  [&] { return softmax_backward_op().call(crow, grad_out, values); });
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, Autograd, m) {
  m.impl("csr_softmax", &csr_softmax_autograd);
  m.impl("_csr_softmax_backward", &csr_softmax_backward_autograd);
}

}  // namespace torchops
