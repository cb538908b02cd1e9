// Autograd for rms_norm and add_rms_norm (the same pattern for both). With a gradient to record, the forward runs as _rms_norm_forward (out plus each
// row's rstd, saved for backward) and the backward is _rms_norm_backward, both myns ops with their own
// kernels, so torch.compile / export trace them. Without one, the plain rms_norm kernel runs (no rstd).
// _rms_norm_forward is differentiable the same way (through out; rstd is marked non-differentiable).
// _rms_norm_backward has no derivative of its own: differentiating it (double backward) raises by name,
// and forward-mode AD is refused for all three (C++ custom Functions have no jvp).
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "../common/autograd_utils.h"
#include "../common/norm.h"

namespace torchops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using OptTensor = std::optional<at::Tensor>;
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

OptTensor optional_of(const at::Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

const auto& rms_norm_op() {
  static const auto op = find_op<RmsNormSig>("myns::rms_norm");
  return op;
}

const auto& add_rms_norm_op() {
  static const auto op = find_op<AddSig>("myns::add_rms_norm");
  return op;
}

const auto& add_rms_norm_forward_op() {
  static const auto op = find_op<AddForwardSig>("myns::_add_rms_norm_forward");
  return op;
}

const auto& add_rms_norm_backward_op() {
  static const auto op = find_op<AddBackwardSig>("myns::_add_rms_norm_backward");
  return op;
}

const auto& rms_norm_forward_op() {
  static const auto op = find_op<ForwardSig>("myns::_rms_norm_forward");
  return op;
}

const auto& rms_norm_backward_op() {
  static const auto op = find_op<BackwardSig>("myns::_rms_norm_backward");
  return op;
}

class RMSNormFunction : public torch::autograd::Function<RMSNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const std::optional<at::Tensor>& weight,
                               double eps, double weight_offset) {
    at::Tensor out, rstd;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(out, rstd) = rms_norm_forward_op().call(input, weight, eps, weight_offset);
    }
    const bool has_weight = weight.has_value() && weight->defined();
    ctx->save_for_backward({input, has_weight ? *weight : at::Tensor(), rstd});
    ctx->saved_data["weight_offset"] = weight_offset;
    ctx->mark_non_differentiable({rstd});
    return {out, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& rstd = saved[2];
    const at::Tensor& grad_out = grad_outputs[0];
    // Edges exist for the tensor arguments only: input is edge 0, weight (when given) edge 1.
    const bool input_grad = ctx->needs_input_grad(0);
    const bool weight_grad = weight.defined() && ctx->needs_input_grad(1);
    if (!grad_out.defined() || (!input_grad && !weight_grad)) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    // Called through the dispatcher (not below autograd): under create_graph=True the result then hangs off
    // _rms_norm_backward's Autograd node, which refuses to be differentiated, by name.
    at::Tensor grad_input, grad_weight;
    std::tie(grad_input, grad_weight) = rms_norm_backward_op().call(
        grad_out, input, optional_of(weight), rstd, input_grad, weight_grad,
        ctx->saved_data["weight_offset"].toDouble());
    return {input_grad ? grad_input : at::Tensor(), weight_grad ? grad_weight : at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

void refuse_forward_ad(const char* op, const at::Tensor& input, const std::optional<at::Tensor>& weight) {
  const at::Tensor w = weight.has_value() ? *weight : at::Tensor();
  TORCHOPS_CHECK(!has_forward_grad(input, w), op,
                 "forward-mode AD (torch.func.jvp, forward_ad) is not supported; use backward mode");
}

at::Tensor rms_norm_autograd(const at::Tensor& input, const std::optional<at::Tensor>& weight, double eps,
                             double weight_offset) {
  refuse_forward_ad("rms_norm", input, weight);
  const at::Tensor w = weight.has_value() ? *weight : at::Tensor();
  if (!needs_grad(input, w)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return rms_norm_op().call(input, weight, eps, weight_offset);
  }
  // Checked here under this op's name: the kernels below are _rms_norm_forward's.
  check_norm_input("rms_norm", {"input", input}, weight, weight_offset);
  return RMSNormFunction::apply(input, weight, eps, weight_offset)[0];
}

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_autograd(const at::Tensor& input,
                                                             const std::optional<at::Tensor>& weight, double eps,
                                                             double weight_offset) {
  refuse_forward_ad("_rms_norm_forward", input, weight);
  const at::Tensor w = weight.has_value() ? *weight : at::Tensor();
  if (!needs_grad(input, w)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return rms_norm_forward_op().call(input, weight, eps, weight_offset);
  }
  const variable_list outs = RMSNormFunction::apply(input, weight, eps, weight_offset);
  return {outs[0], outs[1]};
}

// add_rms_norm: residual_out = input + residual, out = rms_norm(residual_out). Both of input's and
// residual's gradients are d(residual_out) = rms_norm's input gradient + grad_residual_out: one tensor,
// computed once by _add_rms_norm_backward and handed to both edges.
class AddRMSNormFunction : public torch::autograd::Function<AddRMSNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& residual,
                               const OptTensor& weight, double eps, double weight_offset) {
    at::Tensor out, residual_out, rstd;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(out, residual_out, rstd) = add_rms_norm_forward_op().call(input, residual, weight, eps, weight_offset);
    }
    const bool has_weight = weight.has_value() && weight->defined();
    ctx->save_for_backward({residual_out, has_weight ? *weight : at::Tensor(), rstd});
    ctx->saved_data["weight_offset"] = weight_offset;
    ctx->mark_non_differentiable({rstd});
    return {out, residual_out, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& residual_out = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& rstd = saved[2];
    const at::Tensor& grad_out = grad_outputs[0];
    const at::Tensor& grad_residual_out = grad_outputs[1];
    // Edges: input 0, residual 1, weight (when given) 2.
    const bool inputs_grad = ctx->needs_input_grad(0) || ctx->needs_input_grad(1);
    const bool weight_grad = weight.defined() && ctx->needs_input_grad(2) && grad_out.defined();
    at::Tensor grad_input, grad_weight;
    if (grad_out.defined() && (inputs_grad || weight_grad)) {
      std::tie(grad_input, grad_weight) = add_rms_norm_backward_op().call(
          grad_out, optional_of(grad_residual_out), residual_out, optional_of(weight), rstd, weight_grad,
          ctx->saved_data["weight_offset"].toDouble());
    } else {
      grad_input = grad_residual_out;  // out unused: residual_out's gradient passes straight through the add
    }
    return {ctx->needs_input_grad(0) ? grad_input : at::Tensor(), ctx->needs_input_grad(1) ? grad_input : at::Tensor(),
            weight_grad ? grad_weight : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> add_rms_norm_autograd(const at::Tensor& input, const at::Tensor& residual,
                                                         const OptTensor& weight, double eps, double weight_offset) {
  refuse_forward_ad("add_rms_norm", input, weight);
  TORCHOPS_CHECK(!has_forward_grad(residual), "add_rms_norm",
                 "forward-mode AD (torch.func.jvp, forward_ad) is not supported; use backward mode");
  const at::Tensor w = weight.has_value() ? *weight : at::Tensor();
  if (!needs_grad(input, residual, w)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return add_rms_norm_op().call(input, residual, weight, eps, weight_offset);
  }
  check_norm_input_pair("add_rms_norm", {"input", input}, {"residual", residual}, weight, weight_offset);
  const variable_list outs = AddRMSNormFunction::apply(input, residual, weight, eps, weight_offset);
  return {outs[0], outs[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_forward_autograd(const at::Tensor& input,
                                                                             const at::Tensor& residual,
                                                                             const OptTensor& weight, double eps,
                                                                             double weight_offset) {
  refuse_forward_ad("_add_rms_norm_forward", input, weight);
  TORCHOPS_CHECK(!has_forward_grad(residual), "_add_rms_norm_forward",
                 "forward-mode AD (torch.func.jvp, forward_ad) is not supported; use backward mode");
  const at::Tensor w = weight.has_value() ? *weight : at::Tensor();
  if (!needs_grad(input, residual, w)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return add_rms_norm_forward_op().call(input, residual, weight, eps, weight_offset);
  }
  const variable_list outs = AddRMSNormFunction::apply(input, residual, weight, eps, weight_offset);
  return {outs[0], outs[1], outs[2]};
}

// The backward op as a graph node whose own backward refuses: create_graph=True still works (e.g. for
// gradient penalties that don't differentiate through rms_norm twice), differentiating it raises by name.
class RMSNormBackwardFunction : public torch::autograd::Function<RMSNormBackwardFunction> {
 public:
  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& grad_out, const at::Tensor& input,
                               const std::optional<at::Tensor>& weight, const at::Tensor& rstd, bool input_grad,
                               bool weight_grad, double weight_offset) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor grad_input, grad_weight;
    std::tie(grad_input, grad_weight) =
        rms_norm_backward_op().call(grad_out, input, weight, rstd, input_grad, weight_grad, weight_offset);
    return {grad_input, grad_weight};
  }

  static variable_list backward(AutogradContext* /*ctx*/, variable_list /*grad_outputs*/) {
    TORCHOPS_CHECK(false, "_rms_norm_backward",
                   "double backward (differentiating rms_norm's backward) is not supported");
    return {};
  }
};

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_autograd(const at::Tensor& grad_out, const at::Tensor& input,
                                                              const std::optional<at::Tensor>& weight,
                                                              const at::Tensor& rstd, bool input_grad,
                                                              bool weight_grad, double weight_offset) {
  const at::Tensor w = weight.has_value() ? *weight : at::Tensor();
  TORCHOPS_CHECK(!has_forward_grad(grad_out, input, w, rstd), "_rms_norm_backward", "forward-mode AD is not supported");
  if (!needs_grad(grad_out, input, w, rstd)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return rms_norm_backward_op().call(grad_out, input, weight, rstd, input_grad, weight_grad, weight_offset);
  }
  const variable_list outs =
      RMSNormBackwardFunction::apply(grad_out, input, weight, rstd, input_grad, weight_grad, weight_offset);
  return {outs[0], outs[1]};
}

// Same contract for add_rms_norm's backward: a graph node whose own backward refuses, by name.
class AddRMSNormBackwardFunction : public torch::autograd::Function<AddRMSNormBackwardFunction> {
 public:
  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& grad_out, const OptTensor& grad_residual_out,
                               const at::Tensor& residual_out, const OptTensor& weight, const at::Tensor& rstd,
                               bool weight_grad, double weight_offset) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor grad_input, grad_weight;
    std::tie(grad_input, grad_weight) = add_rms_norm_backward_op().call(grad_out, grad_residual_out, residual_out,
                                                                        weight, rstd, weight_grad, weight_offset);
    return {grad_input, grad_weight};
  }

  static variable_list backward(AutogradContext* /*ctx*/, variable_list /*grad_outputs*/) {
    TORCHOPS_CHECK(false, "_add_rms_norm_backward",
                   "double backward (differentiating add_rms_norm's backward) is not supported");
    return {};
  }
};

std::tuple<at::Tensor, at::Tensor> add_rms_norm_backward_autograd(const at::Tensor& grad_out,
                                                                  const OptTensor& grad_residual_out,
                                                                  const at::Tensor& residual_out,
                                                                  const OptTensor& weight, const at::Tensor& rstd,
                                                                  bool weight_grad, double weight_offset) {
  const at::Tensor w = weight.has_value() ? *weight : at::Tensor();
  const at::Tensor dres = grad_residual_out.has_value() ? *grad_residual_out : at::Tensor();
  TORCHOPS_CHECK(!has_forward_grad(grad_out, dres, residual_out, w, rstd), "_add_rms_norm_backward",
                 "forward-mode AD is not supported");
  if (!needs_grad(grad_out, dres, residual_out, w, rstd)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return add_rms_norm_backward_op().call(grad_out, grad_residual_out, residual_out, weight, rstd, weight_grad,
                                           weight_offset);
  }
  const variable_list outs = AddRMSNormBackwardFunction::apply(grad_out, grad_residual_out, residual_out, weight, rstd,
                                                               weight_grad, weight_offset);
  return {outs[0], outs[1]};
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
