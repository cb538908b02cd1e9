// Autograd for swiglu and swiglu_backward.
//
// swiglu saves its inputs (not the activation: the backward recomputes the sigmoid) and its backward is
// the myns::swiglu_backward op, called through the dispatcher so torch.compile / torch.export trace it as
// one node. Forward mode (jvp) is swiglu_backward again: d out = silu'(gate) up dgate + silu(gate) dup,
// which are the grad_gate and grad_up swiglu_backward computes for grad_out = dgate and dup.
//
// swiglu_backward is differentiable too (double backward of swiglu, e.g. Hessian-vector products), in
// ATen ops: with s = sigmoid(gate), silu' = s (1 + gate (1 - s)), silu'' = s (1 - s) (2 + gate (1 - 2 s))
// and A, B the grads flowing into (grad_gate, grad_up):
//   d/d grad_out = A up silu' + B silu,  d/d gate = A grad_out up silu'' + B grad_out silu',
//   d/d up = A grad_out silu'.
// Forward-mode AD through swiglu_backward is refused with a clear error.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <tuple>

#include "../common/autograd_utils.h"

namespace torchops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const auto& swiglu_op() {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("myns::swiglu");
  return op;
}

const auto& swiglu_backward_op() {
  static const auto op =
      find_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
          "myns::swiglu_backward");
  return op;
}

at::Tensor swiglu_below_autograd(const at::Tensor& gate, const at::Tensor& up) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return swiglu_op().call(gate, up);
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward_below_autograd(const at::Tensor& grad_out, const at::Tensor& gate,
                                                                  const at::Tensor& up) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return swiglu_backward_op().call(grad_out, gate, up);
}

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return swiglu_below_autograd(gate, up);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    // Through the dispatcher (Autograd key included): create_graph=True records swiglu_backward's own node.
    auto [grad_gate, grad_up] = swiglu_backward_op().call(grad_outputs[0], saved[0], saved[1]);
    return {grad_gate, grad_up};
  }
};

class SwigluBackwardFunction : public torch::autograd::Function<SwigluBackwardFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad_out, const at::Tensor& gate,
                               const at::Tensor& up) {
    ctx->save_for_backward({grad_out, gate, up});
    auto [grad_gate, grad_up] = swiglu_backward_below_autograd(grad_out, gate, up);
    return {grad_gate, grad_up};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &g = saved[0], &x = saved[1], &u = saved[2];
    const at::Tensor &a = grads[0], &b = grads[1];  // into grad_gate, grad_up (zeros when unused)
    const at::Tensor s = x.sigmoid();
    const at::Tensor one_minus_s = 1 - s;
    const at::Tensor silu = x * s;
    const at::Tensor dsilu = s * (1 + x * one_minus_s);
    const at::Tensor d2silu = s * one_minus_s * (2 + x * (1 - 2 * s));
    at::Tensor d_grad_out, d_gate, d_up;
    if (ctx->needs_input_grad(0)) d_grad_out = a * u * dsilu + b * silu;
    if (ctx->needs_input_grad(1)) d_gate = a * g * u * d2silu + b * g * dsilu;
    if (ctx->needs_input_grad(2)) d_up = a * g * dsilu;
    return {d_grad_out, d_gate, d_up};
  }
};

at::Tensor swiglu_autograd(const at::Tensor& gate, const at::Tensor& up) {
  if (!has_forward_grad(gate, up)) {
    return needs_grad(gate, up) ? SwigluFunction::apply(gate, up) : swiglu_below_autograd(gate, up);
  }
  const at::Tensor pg = forward_primal(gate), pu = forward_primal(up);
  at::Tensor out = needs_grad(pg, pu) ? SwigluFunction::apply(pg, pu) : swiglu_below_autograd(pg, pu);
  const at::Tensor tg = gate._fw_grad(kForwardGradLevel), tu = up._fw_grad(kForwardGradLevel);
  at::Tensor tangent;
  if (tg.defined()) tangent = std::get<0>(swiglu_backward_op().call(tg, pg, pu));
  if (tu.defined()) {
    at::Tensor from_up = std::get<1>(swiglu_backward_op().call(tu, pg, pu));
    tangent = tangent.defined() ? tangent + from_up : from_up;
  }
  out._set_fw_grad(tangent, kForwardGradLevel, /*is_inplace_op=*/false);
  return out;
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward_autograd(const at::Tensor& grad_out, const at::Tensor& gate,
                                                            const at::Tensor& up) {
  TORCHOPS_CHECK(!has_forward_grad(grad_out, gate, up), "swiglu_backward",
                 "forward-mode AD (jvp) through swiglu_backward is not supported");
  if (!needs_grad(grad_out, gate, up)) return swiglu_backward_below_autograd(grad_out, gate, up);
  auto grads = SwigluBackwardFunction::apply(grad_out, gate, up);
  return {grads[0], grads[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, Autograd, m) {
  m.impl("swiglu", &swiglu_autograd);
  m.impl("swiglu_backward", &swiglu_backward_autograd);
}

}  // namespace torchops
