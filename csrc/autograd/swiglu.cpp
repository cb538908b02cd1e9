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
// Forward mode through swiglu_backward (e.g. jacfwd(jacrev(swiglu))): grad_gate = grad_out up silu' and
// grad_up = grad_out silu, so with d the tangents:
//   d grad_gate = d grad_out up silu' + grad_out d up silu' + grad_out up silu'' d gate,
//   d grad_up = d grad_out silu + grad_out silu' d gate.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <tuple>

#include "../common/autograd_node.h"
#include "../common/autograd_utils.h"

namespace torchops {
namespace {

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

variable_list swiglu_backward_formula(const BackwardContext& /*ctx*/, const variable_list& saved,
                                      const variable_list& grads) {
  if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
  // Through the dispatcher (Autograd key included): create_graph=True records swiglu_backward's own node.
  auto [grad_gate, grad_up] = swiglu_backward_op().call(grads[0], saved[0], saved[1]);
  return {grad_gate, grad_up};
}

// silu(x), silu'(x), silu''(x) from s = sigmoid(x).
struct SiluDerivatives {
  at::Tensor silu, dsilu, d2silu;
  explicit SiluDerivatives(const at::Tensor& x) {
    const at::Tensor s = x.sigmoid();
    const at::Tensor one_minus_s = 1 - s;
    silu = x * s;
    dsilu = s * (1 + x * one_minus_s);
    d2silu = s * one_minus_s * (2 + x * (1 - 2 * s));
  }
};

// a + b where either may be undefined (a zero term).
at::Tensor add_terms(const at::Tensor& a, const at::Tensor& b) {
  return !a.defined() ? b : !b.defined() ? a : a + b;
}

variable_list swiglu_backward_backward_formula(const BackwardContext& ctx, const variable_list& saved,
                                               const variable_list& grads) {
  const at::Tensor &g = saved[0], &x = saved[1], &u = saved[2];
  const at::Tensor &a = grads[0], &b = grads[1];  // into grad_gate, grad_up (undefined when unused)
  if (!a.defined() && !b.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
  const SiluDerivatives f(x);
  at::Tensor d_grad_out, d_gate, d_up;
  if (ctx.needs_input_grad(0)) {
    d_grad_out = add_terms(a.defined() ? a * u * f.dsilu : at::Tensor(), b.defined() ? b * f.silu : at::Tensor());
  }
  if (ctx.needs_input_grad(1)) {
    d_gate = add_terms(a.defined() ? a * g * u * f.d2silu : at::Tensor(), b.defined() ? b * g * f.dsilu : at::Tensor());
  }
  if (ctx.needs_input_grad(2) && a.defined()) d_up = a * g * f.dsilu;
  return {d_grad_out, d_gate, d_up};
}

at::Tensor swiglu_autograd(const at::Tensor& gate, const at::Tensor& up) {
  OpNodePtr node;
  if (needs_grad(gate, up)) {
    node = make_op_node("SwigluBackward", &swiglu_backward_formula, {gate, up});
    node->save({gate, up});
  }
  at::Tensor out = swiglu_below_autograd(gate, up);
  if (node) record_outputs(node, {out});
  if (has_forward_grad(gate, up)) {
    const at::Tensor pg = forward_primal(gate), pu = forward_primal(up);
    const at::Tensor tg = gate._fw_grad(kForwardGradLevel), tu = up._fw_grad(kForwardGradLevel);
    // d out = silu'(gate) up dgate + silu(gate) dup: swiglu_backward's grad_gate for grad_out = dgate and
    // its grad_up for grad_out = dup.
    at::Tensor tangent;
    if (tg.defined()) tangent = std::get<0>(swiglu_backward_op().call(tg, pg, pu));
    if (tu.defined()) tangent = add_terms(tangent, std::get<1>(swiglu_backward_op().call(tu, pg, pu)));
    out._set_fw_grad(tangent, kForwardGradLevel, /*is_inplace_op=*/false);
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward_autograd(const at::Tensor& grad_out, const at::Tensor& gate,
                                                            const at::Tensor& up) {
  OpNodePtr node;
  if (needs_grad(grad_out, gate, up)) {
    node = make_op_node("SwigluBackwardBackward", &swiglu_backward_backward_formula, {grad_out, gate, up});
    node->save({grad_out, gate, up});
  }
  auto [grad_gate, grad_up] = swiglu_backward_below_autograd(grad_out, gate, up);
  if (node) record_outputs(node, {grad_gate, grad_up});
  if (has_forward_grad(grad_out, gate, up)) {
    // grad_gate = g u silu'(x), grad_up = g silu(x); their tangents, a missing tangent being zero.
    const at::Tensor g = forward_primal(grad_out), x = forward_primal(gate), u = forward_primal(up);
    const at::Tensor tg = grad_out._fw_grad(kForwardGradLevel), tx = gate._fw_grad(kForwardGradLevel),
                     tu = up._fw_grad(kForwardGradLevel);
    const SiluDerivatives f(x);
    at::Tensor t_gate = tg.defined() ? tg * u * f.dsilu : at::Tensor();
    if (tu.defined()) t_gate = add_terms(t_gate, g * tu * f.dsilu);
    if (tx.defined()) t_gate = add_terms(t_gate, g * u * f.d2silu * tx);
    at::Tensor t_up = tg.defined() ? tg * f.silu : at::Tensor();
    if (tx.defined()) t_up = add_terms(t_up, g * f.dsilu * tx);
    if (t_gate.defined()) grad_gate._set_fw_grad(t_gate, kForwardGradLevel, /*is_inplace_op=*/false);
    if (t_up.defined()) grad_up._set_fw_grad(t_up, kForwardGradLevel, /*is_inplace_op=*/false);
  }
  return {grad_gate, grad_up};
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, Autograd, m) {
  m.impl("swiglu", &swiglu_autograd);
  m.impl("swiglu_backward", &swiglu_backward_autograd);
}

}  // namespace torchops
