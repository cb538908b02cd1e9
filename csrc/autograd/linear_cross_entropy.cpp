// Autograd for the loss family: linear_cross_entropy (and _linear_cross_entropy_chunked), cross_entropy and
// their internal ops, as graph nodes (csrc/core/autograd_node.h).
//
// linear_cross_entropy, "mean" and "sum": the gradient of a scalar loss is known up to its incoming
// gradient g (a scalar) while the logits are at hand, so _linear_cross_entropy_forward computes grad_input,
// grad_weight and grad_bias in the same pass over the chunks (one logits matmul, not two) and the backward
// only scales them by g: in place when the graph will not be run again (no second buffer of grad_weight's
// size), a copy when it is retained. "mean" divides by the count of targets that are not ignore_index,
// counted on the device and handed to the forward as grad_scale = 1 / count (no synchronisation, and under
// DTensor the count of every shard).
// "none": each token's gradient has its own incoming factor, which grad_weight sums over, so the forward
// computes the losses only and _linear_cross_entropy_forward's own node recomputes the logits in backward
// (_linear_cross_entropy_backward).
// cross_entropy: the forward (_cross_entropy_forward) saves each row's lse, the backward
// (_cross_entropy_backward) reads the logits once more and writes their gradient, scaled per token; the
// reduction is ATen ops on the per-token losses, which autograd (and DTensor) follow.
//
// First derivatives only: differentiating a backward raises, naming the op; forward-mode AD raises.
#include <ATen/TensorOperators.h>
#include <ATen/TensorSubclassLikeUtils.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "../core/autograd_node.h"
#include "../core/autograd_utils.h"
#include "../loss/loss.h"

namespace torchops {
namespace {

using OptDouble = std::optional<double>;
using Tensor4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using ForwardSig = Tensor4(const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&, int64_t, double,
                           OptDouble, const OptTensor&, bool, bool, bool, int64_t);
using BackwardSig = Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const OptTensor&, int64_t, double, OptDouble, bool, bool, bool, int64_t);
using CeForwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, int64_t, double,
                                                        OptDouble);
using CeBackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                 double, OptDouble);

const OpRef<ForwardSig> forward_op{"myns::_linear_cross_entropy_forward"};
const OpRef<BackwardSig> backward_op{"myns::_linear_cross_entropy_backward"};
const OpRef<CeForwardSig> ce_forward_op{"myns::_cross_entropy_forward"};
const OpRef<CeBackwardSig> ce_backward_op{"myns::_cross_entropy_backward"};

// Targets are validated here under the public op's name where they can be read: dense CPU tensors (not a
// fake, functional, functorch or DTensor wrapper, whose data this kernel cannot read).
bool readable_cpu(const at::Tensor& t) { return t.is_cpu() && !at::isTensorSubclassLike(t); }

// ------------------------------------------------------------------------------ linear_cross_entropy

// Saved: grad_input, grad_weight, grad_bias of the forward (placeholders where not computed); not the
// inputs, so the last hidden states are freed after the forward, as an unfused loss frees them. Edges: input,
// linear_weight, linear_bias.
variable_list scaled_gradients_formula(const BackwardContext& ctx, const variable_list& saved,
                                       const variable_list& grads) {
  const at::Tensor& g = grads[0];
  variable_list out(3);
  if (!g.defined()) return out;
  const bool recorded = c10::GradMode::is_enabled();  // create_graph=True
  // A graph run once releases the saved gradients right after this: scale them where they are.
  const bool reusable = recorded || torch::autograd::get_current_graph_task_keep_graph();
  for (size_t i = 0; i < 3; ++i) {
    if (!ctx.needs_input_grad(i) || !saved[i].defined()) continue;
    if (reusable || at::isTensorSubclassLike(saved[i])) {
      const at::AutoGradMode no_grad(false);
      out[i] = saved[i] * g;
    } else {
      out[i] = saved[i].mul_(g);
    }
  }
  if (recorded && ctx.edges) {  // no edges: compiled autograd, which bypasses itself under create_graph=True
    // The saved gradients are constants to autograd: differentiating these results would silently drop
    // their dependence on the inputs, so a node that refuses takes their place.
    torch::autograd::edge_list edges{torch::autograd::impl::gradient_edge(g)};
    edges.insert(edges.end(), ctx.edges->begin(), ctx.edges->end());
    OpNodePtr node = make_refusing_node("LinearCrossEntropyBackwardBackward", "linear_cross_entropy", "",
                                        std::move(edges));
    record_outputs(node, {out[0], out[1], out[2]});
  }
  return out;
}

// Saved: input, linear_weight, target, linear_bias. attrs: ignore_index, label_smoothing, softcap,
// chunk_size. Edges: input, linear_weight, linear_bias. The gradient of the per-token losses (any values) by
// recomputing the logits.
variable_list recompute_formula(const BackwardContext& ctx, const variable_list& saved, const variable_list& grads) {
  const at::Tensor& g = grads[0];
  const bool input_grad = ctx.needs_input_grad(0), weight_grad = ctx.needs_input_grad(1);
  const bool bias_grad = saved[3].defined() && ctx.needs_input_grad(2);
  if (!g.defined() || !(input_grad || weight_grad || bias_grad)) return {at::Tensor(), at::Tensor(), at::Tensor()};
  // Through the dispatcher: under create_graph=True the results hang off _linear_cross_entropy_backward's
  // node, which refuses to be differentiated, by name.
  auto [gi, gw, gb] = backward_op().call(g, saved[0], saved[1], saved[2], optional_of(saved[3]), ctx.attrs[0].toInt(),
                                         ctx.attrs[1].toDouble(), ctx.attrs[2].toOptional<double>(), input_grad,
                                         weight_grad, bias_grad, ctx.attrs[3].toInt());
  return {input_grad ? gi : at::Tensor(), weight_grad ? gw : at::Tensor(), bias_grad ? gb : at::Tensor()};
}

at::Tensor linear_cross_entropy_recorded(const char* op, const at::Tensor& input, const at::Tensor& linear_weight,
                                         const at::Tensor& target, const OptTensor& linear_bias,
                                         c10::string_view reduction, int64_t ignore_index, double label_smoothing,
                                         OptDouble softcap, int64_t chunk_size) {
  const CrossEntropyOptions options{ignore_index, label_smoothing, softcap};
  check_linear_cross_entropy_args(op, input, linear_weight, target, linear_bias, options);
  const LossReduction reduction_kind = parse_reduction(op, reduction);
  check_chunk_size(op, chunk_size);
  if (readable_cpu(target)) check_targets_cpu(op, target, linear_weight.size(0), ignore_index);
  const at::Tensor bias = given_or_undefined(linear_bias);
  refuse_forward_ad(op, {input, linear_weight, bias});
  const auto dtype = input.scalar_type();
  if (!needs_grad(input, linear_weight, bias)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const at::Tensor loss = std::get<0>(forward_op().call(input, linear_weight, target, linear_bias, ignore_index,
                                                          label_smoothing, softcap, std::nullopt, false, false,
                                                          false, chunk_size));
    return reduce_loss(loss, target, reduction_kind, ignore_index, dtype);
  }
  if (reduction_kind == LossReduction::kNone) {
    // Recorded by _linear_cross_entropy_forward's own node (the backward recomputes the logits).
    const at::Tensor loss = std::get<0>(forward_op().call(input, linear_weight, target, linear_bias, ignore_index,
                                                          label_smoothing, softcap, std::nullopt, false, false,
                                                          false, chunk_size));
    return loss.to(dtype);
  }
  OptTensor grad_scale;
  at::Tensor count;
  if (reduction_kind == LossReduction::kMean) {
    count = target.ne(ignore_index).sum();
    grad_scale = count.to(loss_math_dtype(dtype)).reciprocal();
  }
  OpNodePtr node = make_op_node("LinearCrossEntropyBackward", &scaled_gradients_formula, {input, linear_weight, bias});
  at::Tensor loss, grad_input, grad_weight, grad_bias;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(loss, grad_input, grad_weight, grad_bias) =
        forward_op().call(input, linear_weight, target, linear_bias, ignore_index, label_smoothing, softcap, grad_scale,
                          input.requires_grad(), linear_weight.requires_grad(), bias.defined() && bias.requires_grad(),
                          chunk_size);
  }
  at::Tensor out = reduction_kind == LossReduction::kMean ? loss.sum() / count : loss.sum();
  out = out.to(dtype);
  // The gradients have no graph history (the forward op records none here), so saving them makes no cycle.
  node->save({grad_input, grad_weight, grad_bias});
  record_outputs(node, {out});
  return out;
}

at::Tensor linear_cross_entropy_autograd(const at::Tensor& input, const at::Tensor& linear_weight,
                                         const at::Tensor& target, const OptTensor& linear_bias,
                                         c10::string_view reduction, int64_t ignore_index, double label_smoothing,
                                         OptDouble softcap) {
  return linear_cross_entropy_recorded("linear_cross_entropy", input, linear_weight, target, linear_bias, reduction,
                                       ignore_index, label_smoothing, softcap, 0);
}

at::Tensor linear_cross_entropy_chunked_autograd(const at::Tensor& input, const at::Tensor& linear_weight,
                                                 const at::Tensor& target, const OptTensor& linear_bias,
                                                 c10::string_view reduction, int64_t ignore_index,
                                                 double label_smoothing, OptDouble softcap, int64_t chunk_size) {
  return linear_cross_entropy_recorded("_linear_cross_entropy_chunked", input, linear_weight, target, linear_bias,
                                       reduction, ignore_index, label_smoothing, softcap, chunk_size);
}

Tensor4 linear_cross_entropy_forward_autograd(const at::Tensor& input, const at::Tensor& linear_weight,
                                              const at::Tensor& target, const OptTensor& linear_bias,
                                              int64_t ignore_index, double label_smoothing, OptDouble softcap,
                                              const OptTensor& grad_scale, bool input_grad, bool weight_grad,
                                              bool bias_grad, int64_t chunk_size) {
  const char* op = "_linear_cross_entropy_forward";
  const at::Tensor bias = given_or_undefined(linear_bias);
  refuse_forward_ad(op, {input, linear_weight, bias});
  OpNodePtr node;
  if (needs_grad(input, linear_weight, bias)) {
    node = make_op_node("LinearCrossEntropyForwardBackward", &recompute_formula, {input, linear_weight, bias});
  }
  Tensor4 out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    out = forward_op().call(input, linear_weight, target, linear_bias, ignore_index, label_smoothing, softcap,
                            grad_scale, input_grad, weight_grad, bias_grad, chunk_size);
  }
  if (node) {
    // Through the per-token losses only: the computed gradients are not differentiable outputs.
    node->save({input, linear_weight, target, bias});
    node->attrs = {ignore_index, label_smoothing, softcap, chunk_size};
    record_outputs(node, {std::get<0>(out)});
  }
  return out;
}

Tensor3 linear_cross_entropy_backward_autograd(const at::Tensor& grad_loss, const at::Tensor& input,
                                               const at::Tensor& linear_weight, const at::Tensor& target,
                                               const OptTensor& linear_bias, int64_t ignore_index,
                                               double label_smoothing, OptDouble softcap, bool input_grad,
                                               bool weight_grad, bool bias_grad, int64_t chunk_size) {
  const at::Tensor bias = given_or_undefined(linear_bias);
  return call_differentiable_once("LinearCrossEntropyBackwardBackward", "_linear_cross_entropy_backward", "",
                                  {grad_loss, input, linear_weight, bias}, [&] {
                                    return backward_op().call(grad_loss, input, linear_weight, target, linear_bias,
                                                              ignore_index, label_smoothing, softcap, input_grad,
                                                              weight_grad, bias_grad, chunk_size);
                                  });
}

// ------------------------------------------------------------------------------------- cross_entropy

// Saved: logits, target, lse. attrs: ignore_index, label_smoothing, softcap. Edge: logits.
variable_list cross_entropy_formula(const BackwardContext& ctx, const variable_list& saved, const variable_list& grads) {
  const at::Tensor& g = grads[0];
  if (!g.defined() || !ctx.needs_input_grad(0)) return {at::Tensor()};
  return {ce_backward_op().call(g, saved[0], saved[1], saved[2], ctx.attrs[0].toInt(), ctx.attrs[1].toDouble(),
                                ctx.attrs[2].toOptional<double>())};
}

std::tuple<at::Tensor, at::Tensor> cross_entropy_forward_autograd(const at::Tensor& logits, const at::Tensor& target,
                                                                  int64_t ignore_index, double label_smoothing,
                                                                  OptDouble softcap) {
  refuse_forward_ad("_cross_entropy_forward", {logits});
  OpNodePtr node;
  if (needs_grad(logits)) node = make_op_node("CrossEntropyForwardBackward", &cross_entropy_formula, {logits});
  at::Tensor loss, lse;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(loss, lse) = ce_forward_op().call(logits, target, ignore_index, label_smoothing, softcap);
  }
  if (node) {
    // lse gets no graph history (it is not differentiable), so saving it makes no reference cycle.
    node->save({logits, target, lse});
    node->attrs = {ignore_index, label_smoothing, softcap};
    record_outputs(node, {loss});
  }
  return {loss, lse};
}

at::Tensor cross_entropy_autograd(const at::Tensor& logits, const at::Tensor& target, c10::string_view reduction,
                                  int64_t ignore_index, double label_smoothing, OptDouble softcap) {
  const char* op = "cross_entropy";
  const CrossEntropyOptions options{ignore_index, label_smoothing, softcap};
  check_cross_entropy_args(op, logits, target, options);
  const LossReduction reduction_kind = parse_reduction(op, reduction);
  if (readable_cpu(target)) check_targets_cpu(op, target, logits.size(-1), ignore_index);
  refuse_forward_ad(op, {logits});
  at::Tensor loss;
  if (needs_grad(logits)) {
    loss = std::get<0>(ce_forward_op().call(logits, target, ignore_index, label_smoothing, softcap));
  } else {
    at::AutoDispatchBelowADInplaceOrView guard;
    loss = std::get<0>(ce_forward_op().call(logits, target, ignore_index, label_smoothing, softcap));
  }
  // The reduction in ATen ops: its backward hands _cross_entropy_backward each token's factor (the incoming
  // gradient, divided by the count for "mean", broadcast without a copy).
  return reduce_loss(loss, target, reduction_kind, ignore_index, logits.scalar_type());
}

at::Tensor cross_entropy_backward_autograd(const at::Tensor& grad_loss, const at::Tensor& logits,
                                           const at::Tensor& target, const at::Tensor& lse, int64_t ignore_index,
                                           double label_smoothing, OptDouble softcap) {
  return call_differentiable_once("CrossEntropyBackwardBackward", "_cross_entropy_backward", "",
                                  {grad_loss, logits, lse}, [&] {
                                    return ce_backward_op().call(grad_loss, logits, target, lse, ignore_index,
                                                                 label_smoothing, softcap);
                                  });
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, Autograd, m) {
  m.impl("linear_cross_entropy", &linear_cross_entropy_autograd);
  m.impl("_linear_cross_entropy_chunked", &linear_cross_entropy_chunked_autograd);
  m.impl("_linear_cross_entropy_forward", &linear_cross_entropy_forward_autograd);
  m.impl("_linear_cross_entropy_backward", &linear_cross_entropy_backward_autograd);
  m.impl("cross_entropy", &cross_entropy_autograd);
  m.impl("_cross_entropy_forward", &cross_entropy_forward_autograd);
  m.impl("_cross_entropy_backward", &cross_entropy_backward_autograd);
}

}  // namespace torchops
