// A backward graph node built the way PyTorch's generated autograd kernels (VariableType) build theirs:
// a torch::autograd::Node holding SavedVariables, wired with collect_next_edges / set_history.
//
// Why not torch::autograd::Function: its apply() refuses every functorch transform (torch.func.grad, vjp,
// jacrev, jvp, vmap) with an error that does not name the op. A plain Node is what built-in ops record,
// and functorch handles those: the Autograd kernel runs on the transform's wrapped tensors, the call below
// autograd reaches functorch's back-mode key, which unwraps, runs the level below and wraps the result.
//
// Use, in an Autograd-key kernel (see csrc/autograd/gated.cpp):
//   OpNodePtr node;
//   if (needs_grad(x, y)) {
//     node = make_op_node("MyOpBackward", &my_op_backward_formula, {x, y});  // the edges
//     node->save({x, y});
//   }
//   at::Tensor out = ...call the op below autograd...;
//   if (node) record_outputs(node, {out});
// and a formula   variable_list f(const BackwardContext& ctx, const variable_list& saved, const variable_list& grads)
// returning one gradient per edge (undefined where ctx.needs_input_grad(i) is false or nothing flows).
//
// Saving inputs as SavedVariable keeps PyTorch's usual checks: modifying a saved input in place before
// backward raises "modified by an inplace operation", and a second backward without retain_graph raises
// "Trying to backward through the graph a second time". Saved non-tensor state (an eps, a flag) goes in
// node->attrs.
#pragma once

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/dynamo/compiled_autograd.h>
#include <torch/version.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "autograd_utils.h"

// Compiled autograd's interface for C++ nodes (const compiled_args, bind_function / call_function,
// PackedArgs) is used as torch 2.14 has it; against older torch the node keeps Node's defaults, which raise
// "compiled_args not implemented: <node name>" under compiled autograd.
#define TORCHOPS_COMPILED_AUTOGRAD (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14))

namespace torchops {

using torch::autograd::variable_list;

// What a graph edge holds: std::shared_ptr<Node> up to torch 2.11, c10::intrusive_ptr<Node> after. Every
// pointer type below follows it, so the same source builds against both.
using NodeHandle = decltype(torch::autograd::Edge::function);
constexpr bool kIntrusiveNodes = !std::is_same_v<NodeHandle, std::shared_ptr<torch::autograd::Node>>;

template <class T>
using NodePtr = std::conditional_t<kIntrusiveNodes, c10::intrusive_ptr<T>, std::shared_ptr<T>>;

template <class T, class... Args>
NodePtr<T> make_node(Args&&... args) {
  if constexpr (kIntrusiveNodes) {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  } else {
    // torch's deleter frees long chains of nodes without deep recursion; found by argument-dependent
    // lookup (T derives from torch::autograd::Node), so it is only looked up where it exists.
    return std::shared_ptr<T>(new T(std::forward<Args>(args)...), [](T* node) { deleteNode(node); });
  }
}

// What a backward formula gets besides the tensors: which gradients are wanted, and the saved
// non-tensor state.
struct BackwardContext {
  std::vector<bool> needs_grad;  // one per edge
  std::vector<c10::IValue> attrs;
  // The node's edges, for a formula that ties a refusing node (below) to them under create_graph=True without
  // saving the inputs; null where the formula runs outside its node (compiled autograd, no create_graph).
  const torch::autograd::edge_list* edges = nullptr;
  bool needs_input_grad(size_t edge) const { return needs_grad[edge]; }
};

// The backward formula: saved tensors in the order saved, gradients of the outputs in the order recorded
// (undefined where nothing flows into an output). Returns one gradient per edge (undefined where not
// needed).
using BackwardFormula = variable_list (*)(const BackwardContext& ctx, const variable_list& saved,
                                          const variable_list& grads);

class OpNode final : public torch::autograd::Node {
 public:
  // name: a static string, shown as grad_fn's name; each op names its node after itself ("SwigluBackward").
  // One name per formula (compiled autograd keys on it).
  OpNode(const char* name, BackwardFormula formula) : name_(name), formula_(formula) {}

  std::string name() const override { return name_; }

  // Saves tensors the formula needs (undefined ones allowed). Inputs only: an output saved here would keep
  // a reference cycle through its own grad_fn.
  void save(std::initializer_list<at::Tensor> tensors);

  void release_variables() override;

#if TORCHOPS_COMPILED_AUTOGRAD
  // Compiled autograd (torch._dynamo.compiled_autograd): the node becomes one opaque call in the compiled
  // backward graph, fed the saved tensors, like PyTorch's C++ custom Functions.
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override;
  variable_list apply_with_saved(const variable_list& inputs,
                                 torch::dynamo::autograd::SwapSavedVariables& saved) override;
#endif

  // Saved non-tensor state for the formula (BackwardContext::attrs).
  std::vector<c10::IValue> attrs;

 protected:
  variable_list apply(variable_list&& grads) override;

 private:
  BackwardContext context() const;

  const char* name_;
  BackwardFormula formula_;
  std::vector<torch::autograd::SavedVariable> saved_;
};

using OpNodePtr = NodePtr<OpNode>;

// A node for an op whose differentiable inputs are `edges` (in the formula's gradient order).
OpNodePtr make_op_node(const char* name, BackwardFormula formula, std::initializer_list<at::Tensor> edges);

// Makes each output's grad_fn the node (output i receives grads[i] in the formula).
void record_outputs(const OpNodePtr& node, std::initializer_list<at::Tensor> outputs);

// A node that raises when differentiated: "myns::<op>: double backward (...) is not supported<hint>". Outputs
// that are constants to autograd yet depend on `edges` get it: differentiating them raises by name instead of
// silently dropping that dependence.
OpNodePtr make_refusing_node(const char* name, const char* op, const char* hint,
                             std::initializer_list<at::Tensor> edges);
OpNodePtr make_refusing_node(const char* name, const char* op, const char* hint, torch::autograd::edge_list edges);

// The Autograd kernel of an internal backward op, differentiable once but not twice: refuses forward-mode
// tangents, gives the outputs a refusing node (above) when an input requires grad, and returns `run()`, called
// below autograd. create_graph=True still works where the result is not differentiated again.
template <typename Run>
auto call_differentiable_once(const char* node_name, const char* op, const char* hint,
                              std::initializer_list<at::Tensor> inputs, Run&& run) {
  refuse_forward_ad(op, inputs, hint);
  OpNodePtr node;
  if (needs_grad(inputs)) node = make_refusing_node(node_name, op, hint, inputs);
  auto out = [&] {
    at::AutoDispatchBelowADInplaceOrView guard;
    return run();
  }();
  if (node) {
    if constexpr (std::is_same_v<decltype(out), at::Tensor>) {
      record_outputs(node, {out});
    } else {
      std::apply([&](const auto&... t) { record_outputs(node, {t...}); }, out);
    }
  }
  return out;
}

}  // namespace torchops
