// Autograd for the gated ops and their backward ops, one template for the family: each row of GatedFamily
// (activations.h) gives an op y = act(gate) * up its schemas' and nodes' names, and its activations with
// their derivatives in ATen ops; the op's extra non-tensor arguments (its form) are saved on the nodes.
//
// The forward saves its inputs (not the activation: the backward recomputes it) and its backward is the
// row's backward myns op, called through the dispatcher so torch.compile / torch.export trace it as one
// node. Forward mode (jvp) is that backward op again: d out = act'(gate) up dgate + act(gate) dup, which are
// the grad_gate and grad_up it computes for grad_out = dgate and dup.
//
// The backward writes the gate's gradient into the incoming gradient's memory when nothing else can see it
// (the backward op's out= form): one new buffer instead of two, 128 MiB less at a LLaMA MLP of 8192 tokens x
// 8192 (Liger overwrites the saved gate and up instead, which a caller may still hold).
//
// The backward op is differentiable too (double backward, e.g. Hessian-vector products), in ATen ops: with
// f, f', f'' the activation and its derivatives at the gate and A, B the grads flowing into (grad_gate,
// grad_up):
//   d/d grad_out = A up f' + B f,  d/d gate = A grad_out up f'' + B grad_out f',  d/d up = A grad_out f'.
// Forward mode through it (e.g. jacfwd(jacrev(op))): grad_gate = grad_out up f' and grad_up = grad_out f,
// so with d the tangents:
//   d grad_gate = d grad_out up f' + grad_out d up f' + grad_out up f'' d gate,
//   d grad_up = d grad_out f + grad_out f' d gate.
#include <ATen/TensorOperators.h>
#include <ATen/TensorSubclassLikeUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/GradMode.h>
#include <c10/util/string_view.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../core/autograd_node.h"
#include "../core/autograd_utils.h"
#include "../elementwise/activations.h"

namespace torchops {
namespace {

// Extra arguments saved on a node (node->attrs) and read back in its formula.
inline c10::IValue to_attr(c10::string_view s) { return c10::IValue(std::string(s)); }

template <typename Extra>
Extra from_attr(const c10::IValue& v);
template <>
c10::string_view from_attr<c10::string_view>(const c10::IValue& v) {
  return c10::string_view(v.toStringRef());
}

// a + b where either may be undefined (a zero term).
at::Tensor add_terms(const at::Tensor& a, const at::Tensor& b) {
  return !a.defined() ? b : !b.defined() ? a : a + b;
}

template <typename Row, typename Extra = typename Row::Extra>
struct GatedAutograd;

template <typename Row, typename... Extra>
struct GatedAutograd<Row, ExtraArgs<Extra...>> {
  using Grads = std::tuple<at::Tensor, at::Tensor>;
  using Indices = std::index_sequence_for<Extra...>;

  static const auto& op() {
    static const auto handle = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, Extra...)>(
        (std::string("myns::") + Row::kName).c_str());
    return handle;
  }
  static const auto& backward_op() {
    static const auto handle = find_op<Grads(const at::Tensor&, const at::Tensor&, const at::Tensor&, Extra...)>(
        (std::string("myns::") + Row::kBackwardName).c_str());
    return handle;
  }

  // The activation's derivatives at x for the form the extra arguments select.
  static TensorDerivatives derivatives(const at::Tensor& x, Extra... extra) {
    return Row::with_form(
        Row::kBackwardName, [&](auto act, GatedNodes) { return decltype(act)::derivatives(x); }, extra...);
  }

  template <size_t... I>
  static Grads call_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& u,
                             const std::vector<c10::IValue>& attrs, std::index_sequence<I...>) {
    return backward_op().call(g, x, u, from_attr<Extra>(attrs[I])...);
  }
  static const auto& backward_out_op() {
    static const auto handle = find_op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, Extra...,
                                            const at::Tensor&, const at::Tensor&)>(
        (std::string("myns::") + Row::kBackwardOutName).c_str());
    return handle;
  }
  template <size_t... I>
  static void call_backward_out(const at::Tensor& g, const at::Tensor& x, const at::Tensor& u, const at::Tensor& gx,
                                const at::Tensor& gu, const std::vector<c10::IValue>& attrs, std::index_sequence<I...>) {
    backward_out_op().call(g, x, u, from_attr<Extra>(attrs[I])..., gx, gu);
  }

  // Whether the incoming gradient g may take grad_gate: a plain dense tensor of the gate's shape, dtype and
  // device that only this call holds (no other reference to it or its memory: not kept by a hook, another
  // node or a Python object, not handed to another edge too), in a backward that records nothing (no
  // create_graph, no tangents). A view (a linear's gradient reshaped to [b, s, n]) keeps its base, which
  // nothing else may hold either.
  static bool may_overwrite(const at::Tensor& g, const at::Tensor& gate, const at::Tensor& up) {
    if (c10::GradMode::is_enabled() || at::isTensorSubclassLike(g) || g.requires_grad() || !g.has_storage() ||
        g.use_count() != 1 || !g.is_non_overlapping_and_dense() || g.scalar_type() != gate.scalar_type() ||
        g.device() != gate.device() || !g.sizes().equals(gate.sizes()) || has_forward_grad(g, gate, up)) {
      return false;
    }
    const bool view = g.is_view();
    if (view && g._base().use_count() != 1) return false;
    return g.storage().use_count() == (view ? 2 : 1);
  }

  template <size_t... I>
  static TensorDerivatives saved_derivatives(const at::Tensor& x, const std::vector<c10::IValue>& attrs,
                                             std::index_sequence<I...>) {
    return derivatives(x, from_attr<Extra>(attrs[I])...);
  }

  static variable_list backward_formula(const BackwardContext& ctx, const variable_list& saved,
                                        const variable_list& grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const at::Tensor& g = grads[0];
    if (ctx.needs_input_grad(0) && may_overwrite(g, saved[0], saved[1])) {
      const at::Tensor grad_up = at::empty_like(g);
      call_backward_out(g, saved[0], saved[1], g, grad_up, ctx.attrs, Indices{});
      return {g, ctx.needs_input_grad(1) ? grad_up : at::Tensor()};
    }
    // Through the dispatcher (Autograd key included): create_graph=True records the backward op's own node.
    auto [grad_gate, grad_up] = call_backward(grads[0], saved[0], saved[1], ctx.attrs, Indices{});
    return {grad_gate, grad_up};
  }

  static variable_list backward_backward_formula(const BackwardContext& ctx, const variable_list& saved,
                                                 const variable_list& grads) {
    const at::Tensor &g = saved[0], &x = saved[1], &u = saved[2];
    const at::Tensor &a = grads[0], &b = grads[1];  // into grad_gate, grad_up (undefined when unused)
    if (!a.defined() && !b.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const TensorDerivatives f = saved_derivatives(x, ctx.attrs, Indices{});
    at::Tensor d_grad_out, d_gate, d_up;
    if (ctx.needs_input_grad(0)) {
      d_grad_out = add_terms(a.defined() ? a * u * f.df : at::Tensor(), b.defined() ? b * f.f : at::Tensor());
    }
    if (ctx.needs_input_grad(1)) {
      d_gate = add_terms(a.defined() ? a * g * u * f.d2f : at::Tensor(), b.defined() ? b * g * f.df : at::Tensor());
    }
    if (ctx.needs_input_grad(2) && a.defined()) d_up = a * g * f.df;
    return {d_grad_out, d_gate, d_up};
  }

  static at::Tensor forward(const at::Tensor& gate, const at::Tensor& up, Extra... extra) {
    OpNodePtr node;
    if (needs_grad(gate, up)) {
      const GatedNodes nodes = Row::with_form(Row::kName, [](auto, GatedNodes n) { return n; }, extra...);
      node = make_op_node(nodes.forward, &backward_formula, {gate, up});
      node->save({gate, up});
      node->attrs = {to_attr(extra)...};
    }
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      out = op().call(gate, up, extra...);
    }
    if (node) record_outputs(node, {out});
    if (has_forward_grad(gate, up)) {
      const at::Tensor pg = forward_primal(gate), pu = forward_primal(up);
      const at::Tensor tg = gate._fw_grad(kForwardGradLevel), tu = up._fw_grad(kForwardGradLevel);
      // d out = act'(gate) up dgate + act(gate) dup: the backward op's grad_gate for grad_out = dgate and
      // its grad_up for grad_out = dup.
      at::Tensor tangent;
      if (tg.defined()) tangent = std::get<0>(backward_op().call(tg, pg, pu, extra...));
      if (tu.defined()) tangent = add_terms(tangent, std::get<1>(backward_op().call(tu, pg, pu, extra...)));
      out._set_fw_grad(tangent, kForwardGradLevel, /*is_inplace_op=*/false);
    }
    return out;
  }

  // The out= form is a mutation: refused where a gradient would be recorded (like torch's out= ops); its
  // ADInplaceOrView kernel bumps the written tensors' versions.
  static void backward_out(const at::Tensor& grad_out, const at::Tensor& gate, const at::Tensor& up, Extra... extra,
                           const at::Tensor& grad_gate, const at::Tensor& grad_up) {
    check_out_variant_not_differentiable(Row::kBackwardOutName, {{"grad_out", grad_out}, {"gate", gate}, {"up", up},
                                                                 {"grad_gate", grad_gate}, {"grad_up", grad_up}});
    at::AutoDispatchBelowAutograd guard;
    backward_out_op().call(grad_out, gate, up, extra..., grad_gate, grad_up);
  }

  static void backward_out_ad_inplace_or_view(const at::Tensor& grad_out, const at::Tensor& gate, const at::Tensor& up,
                                              Extra... extra, const at::Tensor& grad_gate, const at::Tensor& grad_up) {
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      backward_out_op().call(grad_out, gate, up, extra..., grad_gate, grad_up);
    }
    torch::autograd::impl::bump_version(grad_gate);
    torch::autograd::impl::bump_version(grad_up);
  }

  static Grads backward(const at::Tensor& grad_out, const at::Tensor& gate, const at::Tensor& up, Extra... extra) {
    OpNodePtr node;
    if (needs_grad(grad_out, gate, up)) {
      const GatedNodes nodes = Row::with_form(Row::kBackwardName, [](auto, GatedNodes n) { return n; }, extra...);
      node = make_op_node(nodes.backward, &backward_backward_formula, {grad_out, gate, up});
      node->save({grad_out, gate, up});
      node->attrs = {to_attr(extra)...};
    }
    Grads grads;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      grads = backward_op().call(grad_out, gate, up, extra...);
    }
    auto& [grad_gate, grad_up] = grads;
    if (node) record_outputs(node, {grad_gate, grad_up});
    if (has_forward_grad(grad_out, gate, up)) {
      // grad_gate = g u f'(x), grad_up = g f(x); their tangents, a missing tangent being zero.
      const at::Tensor g = forward_primal(grad_out), x = forward_primal(gate), u = forward_primal(up);
      const at::Tensor tg = grad_out._fw_grad(kForwardGradLevel), tx = gate._fw_grad(kForwardGradLevel),
                       tu = up._fw_grad(kForwardGradLevel);
      const TensorDerivatives f = derivatives(x, extra...);
      at::Tensor t_gate = tg.defined() ? tg * u * f.df : at::Tensor();
      if (tu.defined()) t_gate = add_terms(t_gate, g * tu * f.df);
      if (tx.defined()) t_gate = add_terms(t_gate, g * u * f.d2f * tx);
      at::Tensor t_up = tg.defined() ? tg * f.f : at::Tensor();
      if (tx.defined()) t_up = add_terms(t_up, g * f.df * tx);
      if (t_gate.defined()) grad_gate._set_fw_grad(t_gate, kForwardGradLevel, /*is_inplace_op=*/false);
      if (t_up.defined()) grad_up._set_fw_grad(t_up, kForwardGradLevel, /*is_inplace_op=*/false);
    }
    return grads;
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(myns, Autograd, m) {
  std::apply(
      [&m](auto... rows) {
        ((m.impl(decltype(rows)::kName, &GatedAutograd<decltype(rows)>::forward),
          m.impl(decltype(rows)::kBackwardName, &GatedAutograd<decltype(rows)>::backward),
          m.impl(decltype(rows)::kBackwardOutName, &GatedAutograd<decltype(rows)>::backward_out)),
         ...);
      },
      GatedFamily{});
}

TORCH_LIBRARY_IMPL(myns, ADInplaceOrView, m) {
  std::apply(
      [&m](auto... rows) {
        (m.impl(decltype(rows)::kBackwardOutName, &GatedAutograd<decltype(rows)>::backward_out_ad_inplace_or_view),
         ...);
      },
      GatedFamily{});
}

}  // namespace torchops
