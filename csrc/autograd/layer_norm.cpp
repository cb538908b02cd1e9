// Autograd for layer_norm, as graph nodes PyTorch's torch.func transforms accept (csrc/core/autograd_node.h);
// the same pattern as rms_norm's (csrc/autograd/rms_norm.cpp).
//
// With a gradient to record, the forward runs as _layer_norm_forward (out plus each row's mean and rstd,
// saved for backward) and the backward is _layer_norm_backward, both myns ops with their own kernels, so
// torch.compile / export trace them. Without one, the plain layer_norm kernel runs.
//
// Higher derivatives: _layer_norm_backward takes mean and rstd as arguments, functions of input it cannot
// differentiate through, so it is a first derivative only: differentiating it raises by name. layer_norm's
// own backward, when itself recorded (create_graph=True, as torch.func.grad / vjp / jacrev use), computes the
// same gradients in ATen ops from input, recomputing mean and rstd, so any order of derivative follows from
// ATen's derivatives, for every combination of weight and bias. With x̂ = (x - mean) rstd,
// rstd = (var + eps)^(-1/2) (the biased variance), g = grad_out weight (per row):
//   grad_input = rstd (g - mean(g) - x̂ mean(g x̂)),  grad_weight = sum over rows of grad_out x̂,
//   grad_bias = sum over rows of grad_out.
// Forward mode (jvp), in ATen ops too: d x̂ = rstd (dx - mean(dx) - x̂ mean(x̂ dx)), d out = d x̂ weight +
// x̂ dweight + dbias. The ATen math runs in float32 for 16-bit input (float64 for float64), as the kernels do.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
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

using LayerNormSig = at::Tensor(const at::Tensor&, const OptTensor&, const OptTensor&, double);
using ForwardSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const OptTensor&,
                                                                  const OptTensor&, double);
using BackwardSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                   const OptTensor&, const at::Tensor&,
                                                                   const at::Tensor&, bool, bool, bool);

const OpRef<LayerNormSig> layer_norm_op{"myns::layer_norm"};
const OpRef<ForwardSig> layer_norm_forward_op{"myns::_layer_norm_forward"};
const OpRef<BackwardSig> layer_norm_backward_op{"myns::_layer_norm_backward"};

// x̂ and rstd of each row in ATen ops (differentiable in x to any order), in the compute dtype.
struct Centred {
  at::Tensor rstd, xhat;
  Centred(const at::Tensor& input, double eps) {
    const at::Tensor x = input.to(norm_stat_dtype(input.scalar_type()));
    const at::Tensor xc = x - x.mean({-1}, /*keepdim=*/true);
    rstd = (xc * xc).mean({-1}, /*keepdim=*/true).add(eps).rsqrt();
    xhat = xc * rstd;
  }
};

// Sum over all rows of a [..., N] tensor, as `dtype`.
at::Tensor column_sum(const at::Tensor& t, at::ScalarType dtype) {
  return t.reshape({-1, t.size(-1)}).sum(0).to(dtype);
}

// layer_norm's gradients in ATen ops (the header's formulas); undefined where not wanted.
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_in_aten(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& weight, double eps, bool input_grad,
    bool weight_grad, bool bias_grad, at::ScalarType bias_dtype) {
  const Centred c(input, eps);
  const at::Tensor dy = grad_out.to(c.xhat.scalar_type());
  at::Tensor grad_input, grad_weight, grad_bias;
  if (input_grad) {
    const at::Tensor g = weight.defined() ? dy * weight.to(dy.scalar_type()) : dy;
    grad_input = c.rstd * (g - g.mean({-1}, /*keepdim=*/true) - c.xhat * (g * c.xhat).mean({-1}, /*keepdim=*/true));
    grad_input = grad_input.to(input.scalar_type());
  }
  if (weight_grad) grad_weight = column_sum(dy * c.xhat, weight.scalar_type());
  if (bias_grad) grad_bias = column_sum(dy, bias_dtype);
  return {grad_input, grad_weight, grad_bias};
}

at::Tensor tangent_of(const at::Tensor& t) { return t.defined() ? t._fw_grad(kForwardGradLevel) : at::Tensor(); }

// layer_norm's tangent (tangents tx, tw, tb of input, weight, bias, each undefined: zero), in ATen ops;
// undefined when all are.
at::Tensor layer_norm_jvp(const at::Tensor& input, const at::Tensor& tx, const at::Tensor& weight,
                          const at::Tensor& tw, const at::Tensor& tb, double eps) {
  if (!tx.defined() && !tw.defined() && !tb.defined()) return at::Tensor();
  const Centred c(input, eps);
  const auto dtype = c.xhat.scalar_type();
  at::Tensor tangent = at::zeros_like(c.xhat);
  if (tx.defined()) {
    const at::Tensor t = tx.to(dtype);
    const at::Tensor dxhat = c.rstd * (t - t.mean({-1}, /*keepdim=*/true) -
                                       c.xhat * (c.xhat * t).mean({-1}, /*keepdim=*/true));
    tangent = weight.defined() ? dxhat * weight.to(dtype) : dxhat;
  }
  if (tw.defined()) tangent = tangent + c.xhat * tw.to(dtype);
  if (tb.defined()) tangent = tangent + tb.to(dtype);
  return tangent.to(input.scalar_type());
}

// The bias's dtype as a saved attribute (-1: no bias).
int64_t dtype_attr(const at::Tensor& bias) {
  return bias.defined() ? static_cast<int64_t>(bias.scalar_type()) : int64_t{-1};
}

// Saved: input, weight (undefined without one), mean, rstd. attrs: eps, bias dtype. Edges: input, weight,
// bias.
variable_list layer_norm_backward_formula(const BackwardContext& ctx, const variable_list& saved,
                                          const variable_list& grads) {
  const at::Tensor &input = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
  const at::Tensor& grad_out = grads[0];
  const int64_t bias_attr = ctx.attrs[1].toInt();
  const bool input_grad = ctx.needs_input_grad(0);
  const bool weight_grad = weight.defined() && ctx.needs_input_grad(1);
  const bool bias_grad = bias_attr >= 0 && ctx.needs_input_grad(2);
  if (!grad_out.defined() || (!input_grad && !weight_grad && !bias_grad)) return {at::Tensor(), at::Tensor(), at::Tensor()};
  const double eps = ctx.attrs[0].toDouble();
  const auto bias_dtype = bias_grad ? static_cast<at::ScalarType>(bias_attr) : at::ScalarType::Undefined;
  at::Tensor grad_input, grad_weight, grad_bias;
  if (c10::GradMode::is_enabled()) {
    // The backward is being recorded (create_graph=True): ATen math, differentiable to any order.
    std::tie(grad_input, grad_weight, grad_bias) = layer_norm_backward_in_aten(
        grad_out, input, weight, eps, input_grad, weight_grad, bias_grad, bias_dtype);
  } else {
    std::tie(grad_input, grad_weight, grad_bias) = layer_norm_backward_op().call(
        grad_out, input, optional_of(weight), mean, rstd, input_grad, weight_grad,
        bias_grad);
    if (bias_grad) grad_bias = grad_bias.to(bias_dtype);  // the kernel's is weight's or the stat dtype
  }
  return {input_grad ? grad_input : at::Tensor(), weight_grad ? grad_weight : at::Tensor(),
          bias_grad ? grad_bias : at::Tensor()};
}

// out, mean and rstd of _layer_norm_forward with layer_norm's graph node (on out) and tangent (of out).
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward_recorded(const at::Tensor& input,
                                                                           const OptTensor& weight,
                                                                           const OptTensor& bias, double eps) {
  const at::Tensor w = given_or_undefined(weight), b = given_or_undefined(bias);
  OpNodePtr node;
  if (needs_grad(input, w, b)) node = make_op_node("LayerNormBackward", &layer_norm_backward_formula, {input, w, b});
  at::Tensor out, mean, rstd;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(out, mean, rstd) = layer_norm_forward_op().call(input, weight, bias, eps);
  }
  if (node) {
    // mean and rstd have no graph history (they are not differentiable), so saving them makes no cycle.
    node->save({input, w, mean, rstd});
    node->attrs = {eps, dtype_attr(b)};
    record_outputs(node, {out});
  }
  if (has_forward_grad(input, w, b)) {
    const at::Tensor tangent = layer_norm_jvp(forward_primal(input), tangent_of(input), forward_primal(w),
                                              tangent_of(w), tangent_of(b), eps);
    out._set_fw_grad(tangent, kForwardGradLevel, /*is_inplace_op=*/false);
  }
  return {out, mean, rstd};
}

at::Tensor layer_norm_autograd(const at::Tensor& input, const OptTensor& weight, const OptTensor& bias,
                               double eps) {
  const at::Tensor w = given_or_undefined(weight), b = given_or_undefined(bias);
  if (!needs_grad(input, w, b) && !has_forward_grad(input, w, b)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return layer_norm_op().call(input, weight, bias, eps);
  }
  // Checked here under this op's name: the kernels below are _layer_norm_forward's.
  check_layer_norm_input("layer_norm", {"input", input}, weight, bias);
  return std::get<0>(layer_norm_forward_recorded(input, weight, bias, eps));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_autograd(
    const at::Tensor& grad_out, const at::Tensor& input, const OptTensor& weight, const at::Tensor& mean,
    const at::Tensor& rstd, bool input_grad, bool weight_grad, bool bias_grad) {
  const at::Tensor w = given_or_undefined(weight);
  return call_differentiable_once("LayerNormBackwardBackward", "_layer_norm_backward",
                                  "; differentiate layer_norm's own backward under create_graph=True instead",
                                  {grad_out, input, w, mean, rstd}, [&] {
                                    return layer_norm_backward_op().call(grad_out, input, weight, mean, rstd,
                                                                         input_grad, weight_grad, bias_grad);
                                  });
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, Autograd, m) {
  m.impl("layer_norm", &layer_norm_autograd);
  m.impl("_layer_norm_forward", &layer_norm_forward_recorded);
  m.impl("_layer_norm_backward", &layer_norm_backward_autograd);
}

}  // namespace torchops
