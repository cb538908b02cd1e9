#include "autograd_node.h"

#include <torch/csrc/autograd/functions/utils.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace torchops {

void OpNode::save(std::initializer_list<at::Tensor> tensors) {
  saved_.reserve(saved_.size() + tensors.size());
  for (const auto& t : tensors) saved_.emplace_back(t, /*is_output=*/false);
}

void OpNode::release_variables() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& sv : saved_) sv.reset_data();
}

BackwardContext OpNode::context() const {
  BackwardContext ctx;
  ctx.needs_grad.reserve(num_outputs());
  for (size_t i = 0; i < num_outputs(); ++i) ctx.needs_grad.push_back(task_should_compute_output(i));
  ctx.attrs = attrs;
  ctx.edges = &next_edges();
  return ctx;
}

variable_list OpNode::apply(variable_list&& grads) {
  variable_list saved;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    saved.reserve(saved_.size());
    // unpack() raises PyTorch's usual errors: a saved tensor modified in place since, or a second
    // backward after release_variables() (without retain_graph).
    for (const auto& sv : saved_) saved.push_back(sv.unpack());
  }
  return formula_(context(), saved, grads);
}

#if TORCHOPS_COMPILED_AUTOGRAD
namespace {

using torch::dynamo::autograd::PackedArgs;

// What the compiled backward graph calls back: the formula, on the arguments apply_with_saved packed.
variable_list apply_packed(const variable_list& grads, const std::vector<c10::IValue>& packed) {
  PackedArgs args(packed);
  const auto formula = reinterpret_cast<BackwardFormula>(args.unpack<int64_t>());
  const auto saved = args.unpack<variable_list>();
  BackwardContext ctx;
  ctx.needs_grad = args.unpack<std::vector<bool>>();
  const auto num_attrs = args.unpack<int64_t>();
  for (int64_t i = 0; i < num_attrs; ++i) ctx.attrs.push_back(args.unpack<c10::IValue>());
  return formula(ctx, saved, grads);
}

// Compiled autograd keeps the functions it is given in one namespace per process and refuses a name twice,
// so each (node name, packed-argument types) pair is bound once, as PyTorch's own nodes do; a second type
// layout under the same node name gets a numbered name.
std::string bind_once(const torch::dynamo::autograd::PyCompilerInterface& py, PyObject* compiler,
                      const std::string& name, const std::vector<at::TypePtr>& schema) {
  static std::mutex mutex;
  static std::unordered_map<std::string, std::string> bound;       // name + types -> bound name
  static std::unordered_map<std::string, int> layouts_per_name;    // name -> type layouts bound so far
  std::string key = name;
  for (const auto& type : schema) key += "|" + type->str();
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = bound.find(key);
  if (found != bound.end()) return found->second;
  const int layout = layouts_per_name[name]++;
  const std::string fn_name = py.bind_function(compiler, layout == 0 ? name : name + std::to_string(layout),
                                               &apply_packed, schema, /*is_custom_function=*/false,
                                               /*is_traceable=*/false);
  bound.emplace(std::move(key), fn_name);
  return fn_name;
}

}  // namespace

void OpNode::compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const {
  args.collect(std::string(name_));
  args.collect(saved_, /*is_output=*/false);
  args.collect(attrs);
}

variable_list OpNode::apply_with_saved(const variable_list& inputs,
                                       torch::dynamo::autograd::SwapSavedVariables& saved) {
  for (auto& sv : saved_) saved.before(sv);
  PackedArgs args;
  // A function of this process, as is the compiled graph that calls it back.
  args.pack(reinterpret_cast<int64_t>(formula_));
  variable_list saved_tensors;
  saved_tensors.reserve(saved_.size());
  for (const auto& sv : saved_) saved_tensors.push_back(sv.unpack());
  args.pack(saved_tensors);
  args.pack(context().needs_grad);
  args.pack(static_cast<int64_t>(attrs.size()));
  for (const auto& a : attrs) args.pack(a);
  const std::vector<c10::IValue> packed = std::move(args).vec();

  std::vector<at::TypePtr> schema;
  schema.reserve(packed.size());
  for (const auto& v : packed) schema.push_back(v.isTensor() ? at::TensorType::get() : v.type());
  const auto& py = torch::dynamo::autograd::getPyCompilerInterface();
  const std::string fn_name = bind_once(*py, saved.get_py_compiler(), name_, schema);
  const auto output_metadata =
      torch::dynamo::autograd::IValuePacker<std::vector<std::optional<torch::autograd::InputMetadata>>>::pack(
          torch::dynamo::autograd::get_input_metadata(next_edges()));
  variable_list result =
      py->call_function(saved.get_py_compiler(), "apply_functional", fn_name, inputs, packed, output_metadata);
  for (auto& sv : saved_) saved.after(sv);
  return result;
}
#endif

namespace {

// Each tensor's gradient edge (an empty edge for an undefined one).
torch::autograd::edge_list edges_of(std::initializer_list<at::Tensor> tensors) {
  torch::autograd::edge_list edges;
  edges.reserve(tensors.size());
  for (const auto& t : tensors) {
    edges.push_back(t.defined() ? torch::autograd::impl::gradient_edge(t) : torch::autograd::Edge());
  }
  return edges;
}

}  // namespace

OpNodePtr make_op_node(const char* name, BackwardFormula formula, std::initializer_list<at::Tensor> edges) {
  OpNodePtr node = make_node<OpNode>(name, formula);
  node->set_next_edges(edges_of(edges));
  return node;
}

void record_outputs(const OpNodePtr& node, std::initializer_list<at::Tensor> outputs) {
  for (const auto& out : outputs) torch::autograd::set_history(out, node);
}

namespace {

// attrs: the op's name and the hint, as make_refusing_node stores them.
variable_list refuse_differentiation(const BackwardContext& ctx, const variable_list& /*saved*/,
                                     const variable_list& /*grads*/) {
  TORCHOPS_CHECK(false, ctx.attrs[0].toStringRef(),
                 "double backward (differentiating the gradients it returns) is not supported",
                 ctx.attrs[1].toStringRef());
  return {};
}

}  // namespace

OpNodePtr make_refusing_node(const char* name, const char* op, const char* hint,
                             std::initializer_list<at::Tensor> edges) {
  return make_refusing_node(name, op, hint, edges_of(edges));
}

OpNodePtr make_refusing_node(const char* name, const char* op, const char* hint, torch::autograd::edge_list edges) {
  OpNodePtr node = make_node<OpNode>(name, &refuse_differentiation);
  node->set_next_edges(std::move(edges));
  node->attrs = {std::string(op), std::string(hint)};
  return node;
}

}  // namespace torchops
