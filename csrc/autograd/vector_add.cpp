// Autograd for vector_add: d(a + b)/da = d(a + b)/db = identity, so backward hands grad_out to both and
// forward mode's tangent is tangent(a) + tangent(b).
// vector_add_out is a mutation: its Autograd kernel refuses inputs that need gradients (like torch's
// out= ops), and its ADInplaceOrView kernel bumps out's version counter, which must happen under
// inference_mode too (that mode skips the Autograd key, not ADInplaceOrView, for normal tensors).
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include "../core/autograd_node.h"
#include "../core/autograd_utils.h"

namespace torchops {
namespace {

const OpRef<at::Tensor(const at::Tensor&, const at::Tensor&)> vector_add_op{"myns::vector_add"};
const OpRef<void(const at::Tensor&, const at::Tensor&, const at::Tensor&)> vector_add_out_op{
    "myns::vector_add_out"};

at::Tensor vector_add_below_autograd(const at::Tensor& a, const at::Tensor& b) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return vector_add_op().call(a, b);
}

// d(a + b)/da = d(a + b)/db = identity: grad_out goes to both edges.
variable_list vector_add_backward(const BackwardContext& /*ctx*/, const variable_list& /*saved*/,
                                  const variable_list& grads) {
  return {grads[0], grads[0]};
}

at::Tensor vector_add_autograd(const at::Tensor& a, const at::Tensor& b) {
  // No graph node when nothing needs a gradient: small calls stay as cheap as torch.add's.
  OpNodePtr node;
  if (needs_grad(a, b)) node = make_op_node("VectorAddBackward", &vector_add_backward, {a, b});
  at::Tensor out = vector_add_below_autograd(a, b);
  if (node) record_outputs(node, {out});
  if (has_forward_grad(a, b)) {
    const at::Tensor ta = a._fw_grad(kForwardGradLevel), tb = b._fw_grad(kForwardGradLevel);
    // Through the dispatcher: the tangent is itself differentiable (reverse over forward).
    const at::Tensor tangent = !ta.defined() ? tb : !tb.defined() ? ta : vector_add_op().call(ta, tb);
    out._set_fw_grad(tangent, kForwardGradLevel, /*is_inplace_op=*/false);
  }
  return out;
}

void vector_add_out_autograd(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  check_out_variant_not_differentiable("vector_add_out", {{"a", a}, {"b", b}, {"out", out}});
  at::AutoDispatchBelowAutograd guard;
  vector_add_out_op().call(a, b, out);  // through ADInplaceOrView below
}

void vector_add_out_ad_inplace_or_view(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    vector_add_out_op().call(a, b, out);
  }
  torch::autograd::impl::bump_version(out);
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, Autograd, m) {
  m.impl("vector_add", &vector_add_autograd);
  m.impl("vector_add_out", &vector_add_out_autograd);
}

TORCH_LIBRARY_IMPL(myns, ADInplaceOrView, m) {
  m.impl("vector_add_out", &vector_add_out_ad_inplace_or_view);
}

}  // namespace torchops
