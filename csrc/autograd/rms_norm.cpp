// Autograd for rms_norm and add_rms_norm (the same pattern for both), as graph nodes PyTorch's torch.func
// transforms accept (csrc/core/autograd_node.h).
//
// With a gradient to record, the forward runs as _rms_norm_forward (out plus each row's rstd, saved for
// backward) and the backward is _rms_norm_backward, both myns ops with their own kernels, so torch.compile /
// export trace them. Without one, the plain rms_norm kernel runs (no rstd). _rms_norm_forward is
// differentiable the same way (through out; rstd gets no graph history: it is not differentiable).
//
// Higher derivatives of rms_norm. _rms_norm_backward takes rstd as an argument, which is a function of input
// it cannot differentiate through, so the backward kernel is a first derivative only: differentiating it
// (called directly, or add_rms_norm's under create_graph=True) raises by name. rms_norm's own backward, when
// the backward is itself recorded (create_graph=True, which torch.func.grad / vjp / jacrev always use),
// computes the same gradient in ATen ops from input, recomputing rstd from input and eps, so any order of
// derivative (torch.func.hessian, gradgradcheck) follows from ATen's derivatives. With x̂ = x rstd,
// rstd = (mean(x²) + eps)^(-1/2), w' = weight + weight_offset, v = grad_out w' (per row):
//   grad_input = rstd (v - x̂ mean(v x̂)),   grad_weight = sum over rows of grad_out x̂.
// Forward mode (jvp), in ATen ops too: d x̂ = rstd (dx - x̂ mean(x̂ dx)), d out = d x̂ w' + x̂ dweight; for
// add_rms_norm the same at residual_out = input + residual, whose tangent is dinput + dresidual. The ATen
// math runs in float32 for 16-bit input (float64 for float64), as the kernels do.
#include <ATen/core/Tensor.h>
#include <ATen/TensorOperators.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "../core/autograd_node.h"
#include "../core/autograd_utils.h"
#include "../norm/norm.h"

namespace torchops {
namespace {

using RmsNormSig = at::Tensor(const at::Tensor&, const OptTensor&, double, double);
using ForwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const OptTensor&, double, double);
using BackwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const OptTensor&,
                                                       const at::Tensor&, bool, bool, double);
using AddSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const OptTensor&, double,
                                                  double);
using AddForwardSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                     const OptTensor&, double, double);
using AddBackwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const OptTensor&, const at::Tensor&,
                                                          const OptTensor&, const at::Tensor&, bool, double);

const OpRef<RmsNormSig> rms_norm_op{"myns::rms_norm"};
const OpRef<AddSig> add_rms_norm_op{"myns::add_rms_norm"};
const OpRef<AddForwardSig> add_rms_norm_forward_op{"myns::_add_rms_norm_forward"};
const OpRef<AddBackwardSig> add_rms_norm_backward_op{"myns::_add_rms_norm_backward"};
const OpRef<ForwardSig> rms_norm_forward_op{"myns::_rms_norm_forward"};
const OpRef<BackwardSig> rms_norm_backward_op{"myns::_rms_norm_backward"};

// a + b where either may be undefined (a zero term).
at::Tensor add_terms(const at::Tensor& a, const at::Tensor& b) {
  return !a.defined() ? b : !b.defined() ? a : a + b;
}

// x̂ = x rstd and rstd, in ATen ops (differentiable in x to any order), in the compute dtype.
struct Normalized {
  at::Tensor rstd, xhat;
  Normalized(const at::Tensor& input, double eps) {
    const at::Tensor x = input.to(norm_stat_dtype(input.scalar_type()));
    rstd = (x * x).mean({-1}, /*keepdim=*/true).add(eps).rsqrt();
    xhat = x * rstd;
  }
};

// weight + weight_offset in the compute dtype (undefined without a weight: a scale of 1).
at::Tensor effective_weight(const at::Tensor& weight, double weight_offset, at::ScalarType dtype) {
  if (!weight.defined()) return at::Tensor();
  const at::Tensor w = weight.to(dtype);
  return weight_offset == 0.0 ? w : w + weight_offset;
}

// rms_norm's gradients in ATen ops (the header's formulas); undefined where not wanted.
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_in_aten(const at::Tensor& grad_out, const at::Tensor& input,
                                                             const at::Tensor& weight, double eps,
                                                             double weight_offset, bool input_grad,
                                                             bool weight_grad) {
  const Normalized n(input, eps);
  const at::Tensor g = grad_out.to(n.xhat.scalar_type());
  at::Tensor grad_input, grad_weight;
  if (input_grad) {
    const at::Tensor w = effective_weight(weight, weight_offset, n.xhat.scalar_type());
    const at::Tensor v = w.defined() ? g * w : g;
    grad_input = (n.rstd * (v - n.xhat * (v * n.xhat).mean({-1}, /*keepdim=*/true))).to(input.scalar_type());
  }
  if (weight_grad) {
    grad_weight = (g * n.xhat).reshape({-1, input.size(-1)}).sum(0).to(weight.scalar_type());
  }
  return {grad_input, grad_weight};
}

// rms_norm's tangent at input (tangents tx of input, tw of weight, either undefined: zero), in ATen ops;
// undefined when both are.
at::Tensor rms_norm_jvp(const at::Tensor& input, const at::Tensor& tx, const at::Tensor& weight,
                        const at::Tensor& tw, double eps, double weight_offset) {
  if (!tx.defined() && !tw.defined()) return at::Tensor();
  const Normalized n(input, eps);
  const auto dtype = n.xhat.scalar_type();
  at::Tensor tangent;
  if (tx.defined()) {
    const at::Tensor t = tx.to(dtype);
    const at::Tensor dxhat = n.rstd * (t - n.xhat * (n.xhat * t).mean({-1}, /*keepdim=*/true));
    const at::Tensor w = effective_weight(weight, weight_offset, dtype);
    tangent = w.defined() ? dxhat * w : dxhat;
  }
  if (tw.defined()) tangent = add_terms(tangent, n.xhat * tw.to(dtype));
  return tangent.to(input.scalar_type());
}

at::Tensor tangent_of(const at::Tensor& t) { return t.defined() ? t._fw_grad(kForwardGradLevel) : at::Tensor(); }

// Saved: input, weight (undefined without one), rstd. attrs: eps, weight_offset. Edges: input, weight.
variable_list rms_norm_backward_formula(const BackwardContext& ctx, const variable_list& saved,
                                        const variable_list& grads) {
  const at::Tensor &input = saved[0], &weight = saved[1], &rstd = saved[2];
  const at::Tensor& grad_out = grads[0];
  const bool input_grad = ctx.needs_input_grad(0);
  const bool weight_grad = weight.defined() && ctx.needs_input_grad(1);
  if (!grad_out.defined() || (!input_grad && !weight_grad)) return {at::Tensor(), at::Tensor()};
  const double eps = ctx.attrs[0].toDouble(), weight_offset = ctx.attrs[1].toDouble();
  at::Tensor grad_input, grad_weight;
  if (c10::GradMode::is_enabled()) {
    // The backward is being recorded (create_graph=True): ATen math, differentiable to any order.
    std::tie(grad_input, grad_weight) =
        rms_norm_backward_in_aten(grad_out, input, weight, eps, weight_offset, input_grad, weight_grad);
  } else {
    std::tie(grad_input, grad_weight) = rms_norm_backward_op().call(grad_out, input, optional_of(weight), rstd,
                                                                    input_grad, weight_grad, weight_offset);
  }
  return {input_grad ? grad_input : at::Tensor(), weight_grad ? grad_weight : at::Tensor()};
}

// out and rstd of _rms_norm_forward with rms_norm's graph node (on out) and tangent (of out).
std::tuple<at::Tensor, at::Tensor> rms_norm_forward_recorded(const at::Tensor& input, const OptTensor& weight,
                                                             double eps, double weight_offset) {
  const at::Tensor w = given_or_undefined(weight);
  OpNodePtr node = make_op_node("RmsNormBackward", &rms_norm_backward_formula, {input, w});
  at::Tensor out, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(out, rstd) = rms_norm_forward_op().call(input, weight, eps, weight_offset);
  }
  // rstd has no graph history (it is not differentiable), so saving it makes no reference cycle.
  node->save({input, w, rstd});
  node->attrs = {eps, weight_offset};
  record_outputs(node, {out});
  return {out, rstd};
}

// Sets out's tangent from the inputs' tangents, if any.
void record_rms_norm_tangent(const at::Tensor& out, const at::Tensor& input, const at::Tensor& weight, double eps,
                             double weight_offset) {
  if (!has_forward_grad(input, weight)) return;
  const at::Tensor tangent = rms_norm_jvp(forward_primal(input), tangent_of(input), forward_primal(weight),
                                          tangent_of(weight), eps, weight_offset);
  out._set_fw_grad(tangent, kForwardGradLevel, /*is_inplace_op=*/false);
}

at::Tensor rms_norm_autograd(const at::Tensor& input, const OptTensor& weight, double eps, double weight_offset) {
  const at::Tensor w = given_or_undefined(weight);
  at::Tensor out;
  if (needs_grad(input, w)) {
    // Checked here under this op's name: the kernels below are _rms_norm_forward's.
    check_norm_input("rms_norm", {"input", input}, weight, weight_offset);
    out = std::get<0>(rms_norm_forward_recorded(input, weight, eps, weight_offset));
  } else {
    at::AutoDispatchBelowADInplaceOrView guard;
    out = rms_norm_op().call(input, weight, eps, weight_offset);
  }
  record_rms_norm_tangent(out, input, w, eps, weight_offset);
  return out;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_autograd(const at::Tensor& input, const OptTensor& weight,
                                                             double eps, double weight_offset) {
  const at::Tensor w = given_or_undefined(weight);
  at::Tensor out, rstd;
  if (needs_grad(input, w)) {
    std::tie(out, rstd) = rms_norm_forward_recorded(input, weight, eps, weight_offset);
  } else {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(out, rstd) = rms_norm_forward_op().call(input, weight, eps, weight_offset);
  }
  record_rms_norm_tangent(out, input, w, eps, weight_offset);
  return {out, rstd};
}

// add_rms_norm: residual_out = input + residual, out = rms_norm(residual_out). Both of input's and
// residual's gradients are d(residual_out) = rms_norm's input gradient + grad_residual_out: one tensor,
// computed once by _add_rms_norm_backward and handed to both edges.
// Saved: residual_out, weight, rstd. attrs: weight_offset. Edges: input, residual, weight. Grads: out,
// residual_out.
variable_list add_rms_norm_backward_formula(const BackwardContext& ctx, const variable_list& saved,
                                            const variable_list& grads) {
  const at::Tensor &residual_out = saved[0], &weight = saved[1], &rstd = saved[2];
  const at::Tensor &grad_out = grads[0], &grad_residual_out = grads[1];
  const bool inputs_grad = ctx.needs_input_grad(0) || ctx.needs_input_grad(1);
  const bool weight_grad = weight.defined() && ctx.needs_input_grad(2) && grad_out.defined();
  at::Tensor grad_input, grad_weight;
  if (grad_out.defined() && (inputs_grad || weight_grad)) {
    // Through the dispatcher: under create_graph=True the result hangs off _add_rms_norm_backward's node,
    // which refuses to be differentiated, by name.
    std::tie(grad_input, grad_weight) =
        add_rms_norm_backward_op().call(grad_out, optional_of(grad_residual_out), residual_out, optional_of(weight),
                                        rstd, weight_grad, ctx.attrs[0].toDouble());
  } else {
    grad_input = grad_residual_out;  // out unused: residual_out's gradient passes straight through the add
  }
  return {ctx.needs_input_grad(0) ? grad_input : at::Tensor(), ctx.needs_input_grad(1) ? grad_input : at::Tensor(),
          weight_grad ? grad_weight : at::Tensor()};
}

// out, residual_out and rstd of _add_rms_norm_forward, with add_rms_norm's graph node (on out and
// residual_out) and tangents.
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_forward_recorded(const at::Tensor& input,
                                                                             const at::Tensor& residual,
                                                                             const OptTensor& weight, double eps,
                                                                             double weight_offset) {
  const at::Tensor w = given_or_undefined(weight);
  OpNodePtr node;
  if (needs_grad(input, residual, w)) {
    node = make_op_node("AddRmsNormBackward", &add_rms_norm_backward_formula, {input, residual, w});
  }
  at::Tensor out, residual_out, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(out, residual_out, rstd) = add_rms_norm_forward_op().call(input, residual, weight, eps, weight_offset);
  }
  if (node) {
    // residual_out is an output of this node: saved as a detached alias (same data and version counter, so
    // an in-place change before backward is still caught), without the grad_fn that would make a cycle.
    // The backward only reads its values (its own derivative is refused).
    node->save({residual_out.detach(), w, rstd});
    node->attrs = {weight_offset};
    record_outputs(node, {out, residual_out});
  }
  if (has_forward_grad(input, residual, w)) {
    const at::Tensor t_residual_out = add_terms(tangent_of(input), tangent_of(residual));
    // residual_out recomputed from the primals in ATen (bit-equal to the kernel's add), so the tangent stays
    // differentiable in them.
    const at::Tensor h = forward_primal(input) + forward_primal(residual);
    const at::Tensor t_out =
        rms_norm_jvp(h, t_residual_out, forward_primal(w), tangent_of(w), eps, weight_offset);
    if (t_out.defined()) out._set_fw_grad(t_out, kForwardGradLevel, /*is_inplace_op=*/false);
    if (t_residual_out.defined()) {
      residual_out._set_fw_grad(t_residual_out, kForwardGradLevel, /*is_inplace_op=*/false);
    }
  }
  return {out, residual_out, rstd};
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_autograd(const at::Tensor& input, const at::Tensor& residual,
                                                         const OptTensor& weight, double eps, double weight_offset) {
  const at::Tensor w = given_or_undefined(weight);
  if (!needs_grad(input, residual, w) && !has_forward_grad(input, residual, w)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return add_rms_norm_op().call(input, residual, weight, eps, weight_offset);
  }
  // Checked here under this op's name: the kernels below are _add_rms_norm_forward's.
  check_norm_input_pair("add_rms_norm", {"input", input}, {"residual", residual}, weight, weight_offset);
  auto [out, residual_out, rstd] = add_rms_norm_forward_recorded(input, residual, weight, eps, weight_offset);
  return {out, residual_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_forward_autograd(const at::Tensor& input,
                                                                             const at::Tensor& residual,
                                                                             const OptTensor& weight, double eps,
                                                                             double weight_offset) {
  return add_rms_norm_forward_recorded(input, residual, weight, eps, weight_offset);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_autograd(const at::Tensor& grad_out, const at::Tensor& input,
                                                              const OptTensor& weight, const at::Tensor& rstd,
                                                              bool input_grad, bool weight_grad,
                                                              double weight_offset) {
  const at::Tensor w = given_or_undefined(weight);
  return call_differentiable_once("RmsNormBackwardBackward", "_rms_norm_backward",
                                  "; differentiate rms_norm's own backward under create_graph=True instead",
                                  {grad_out, input, w, rstd}, [&] {
                                    return rms_norm_backward_op().call(grad_out, input, weight, rstd, input_grad,
                                                                       weight_grad, weight_offset);
                                  });
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_backward_autograd(const at::Tensor& grad_out,
                                                                  const OptTensor& grad_residual_out,
                                                                  const at::Tensor& residual_out,
                                                                  const OptTensor& weight, const at::Tensor& rstd,
                                                                  bool weight_grad, double weight_offset) {
  const at::Tensor w = given_or_undefined(weight);
  const at::Tensor dres = given_or_undefined(grad_residual_out);
  return call_differentiable_once("AddRmsNormBackwardBackward", "_add_rms_norm_backward",
                                  "; differentiate add_rms_norm's own backward under create_graph=True instead",
                                  {grad_out, dres, residual_out, w, rstd}, [&] {
                                    return add_rms_norm_backward_op().call(grad_out, grad_residual_out,
                                                                           residual_out, weight, rstd, weight_grad,
                                                                           weight_offset);
                                  });
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, Autograd, m) {
  m.impl("rms_norm", &rms_norm_autograd);
  m.impl("_rms_norm_forward", &rms_norm_forward_autograd);
  m.impl("_rms_norm_backward", &rms_norm_backward_autograd);
  m.impl("add_rms_norm", &add_rms_norm_autograd);
  m.impl("_add_rms_norm_forward", &add_rms_norm_forward_autograd);
  m.impl("_add_rms_norm_backward", &add_rms_norm_backward_autograd);
}

}  // namespace torchops
