// Autograd for the rotary ops, as graph nodes PyTorch's torch.func transforms accept (csrc/core/autograd_node.h).
//
// rotary_embedding is linear in q and k (cos and sin are constants: a clear error if either requires grad or
// carries a tangent): its backward is _rotary_embedding_backward (the transposed rotation), whose own backward is
// rotary_embedding again, so derivatives of any order and forward mode (the tangent is the rotated tangent) are
// the two myns ops calling each other through the dispatcher. Where only one of the two gradients (or tangents)
// flows, the op rotates that one as both of its arguments (k may be q) and keeps the result it needs.
//
// qk_norm_rope: out = R(x * rstd * (w + weight_offset)) per head row (R the rotation), so with gn = R^T g the
// gradient rotated back, the rest is rms_norm's backward of the row: dx = rstd (gn w' - x̂ mean(gn w' x̂)),
// dw = sum over rows of gn x̂ (x̂ = x rstd, w' = w + weight_offset). _qk_norm_rope_backward computes it (rstd
// recomputed from x: the kernels read x anyway); it is a first derivative only and refuses to be differentiated,
// by name. Under create_graph=True (torch.func.grad / vjp / jacrev, gradgradcheck) qk_norm_rope's backward runs
// in ATen ops instead, differentiable to any order; forward mode is ATen too: d out = R(dx̂ w' + x̂ dw), dx̂ =
// rstd (dx - x̂ mean(x̂ dx)). The ATen math runs in float32 for 16-bit input (float64 for float64), as the kernels.
//
// rotary_embedding_ writes query and key in place and records no gradient: its Autograd kernel refuses inputs that
// require grad (or carry a tangent), its ADInplaceOrView kernel bumps both versions (under inference_mode too).
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/stack.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "../core/autograd_node.h"
#include "../core/autograd_utils.h"
#include "../rotary/rotary.h"

namespace torchops {
namespace {

using Pair = std::tuple<at::Tensor, at::Tensor>;
using RotateSig = Pair(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, bool);
using QkNormSig = Pair(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                       const at::Tensor&, double, double, int64_t, bool);
using QkNormBackwardSig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const OptTensor&, const OptTensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, const at::Tensor&, double, double, int64_t, bool, bool, bool);
using CacheSig = void(const at::Tensor&, const at::Tensor&, const OptTensor&, int64_t, const at::Tensor&, bool);

const OpRef<RotateSig> rotary_embedding_op{"myns::rotary_embedding"};
const OpRef<RotateSig> rotary_embedding_backward_op{"myns::_rotary_embedding_backward"};
const OpRef<QkNormSig> qk_norm_rope_op{"myns::qk_norm_rope"};
const OpRef<QkNormBackwardSig> qk_norm_rope_backward_op{"myns::_qk_norm_rope_backward"};
const OpRef<CacheSig> rotary_embedding_inplace_op{"myns::rotary_embedding_"};

at::Tensor tangent_of(const at::Tensor& t) { return t.defined() ? t._fw_grad(kForwardGradLevel) : at::Tensor(); }

// a + b where either may be undefined (a zero term).
at::Tensor add_terms(const at::Tensor& a, const at::Tensor& b) {
  return !a.defined() ? b : !b.defined() ? a : a + b;
}

// `op` (rotary_embedding or its backward) on a pair where either may be undefined (nothing flows there): the one
// given is rotated as both arguments. Undefined results where the input was.
Pair rotate_pair_of(const c10::TypedOperatorHandle<RotateSig>& op, const at::Tensor& a, const at::Tensor& b,
                    const at::Tensor& cos, const at::Tensor& sin, int64_t unsqueeze_dim, bool interleaved) {
  if (!a.defined() && !b.defined()) return {at::Tensor(), at::Tensor()};
  auto [ra, rb] = op.call(a.defined() ? a : b, b.defined() ? b : a, cos, sin, unsqueeze_dim, interleaved);
  return {a.defined() ? ra : at::Tensor(), b.defined() ? rb : at::Tensor()};
}

// Saved: cos, sin. attrs: unsqueeze_dim, interleaved. Edges: the two rotated inputs.
template <bool kOfBackward>
variable_list rotation_formula(const BackwardContext& ctx, const variable_list& saved, const variable_list& grads) {
  // Through the dispatcher: under create_graph=True each call records its own node. The transpose of the
  // forward rotation is the backward's, and the other way round.
  const auto& op = kOfBackward ? rotary_embedding_op() : rotary_embedding_backward_op();
  auto [ga, gb] = rotate_pair_of(op, grads[0], grads[1], saved[0], saved[1], ctx.attrs[0].toInt(), ctx.attrs[1].toBool());
  return {ctx.needs_input_grad(0) ? ga : at::Tensor(), ctx.needs_input_grad(1) ? gb : at::Tensor()};
}

// rotary_embedding (kOfBackward false) or _rotary_embedding_backward (true), with their graph node and tangents.
template <bool kOfBackward>
Pair rotation_autograd(const at::Tensor& a, const at::Tensor& b, const at::Tensor& cos, const at::Tensor& sin,
                       int64_t unsqueeze_dim, bool interleaved) {
  const char* name = kOfBackward ? "_rotary_embedding_backward" : "rotary_embedding";
  check_rotary_constants(name, {"cos", cos}, {"sin", sin});
  const auto& op = kOfBackward ? rotary_embedding_backward_op() : rotary_embedding_op();
  OpNodePtr node;
  if (needs_grad(a, b)) {
    node = make_op_node(kOfBackward ? "RotaryEmbeddingBackwardBackward" : "RotaryEmbeddingBackward",
                        &rotation_formula<kOfBackward>, {a, b});
    node->save({cos, sin});
    node->attrs = {unsqueeze_dim, interleaved};
  }
  at::Tensor ra, rb;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(ra, rb) = op.call(a, b, cos, sin, unsqueeze_dim, interleaved);
  }
  if (node) record_outputs(node, {ra, rb});
  if (has_forward_grad(a, b)) {
    // Linear: the outputs' tangents are the inputs' tangents rotated the same way (through the dispatcher, so
    // the tangents are differentiable in turn).
    auto [ta, tb] = rotate_pair_of(op, tangent_of(a), tangent_of(b), cos, sin, unsqueeze_dim, interleaved);
    if (ta.defined()) ra._set_fw_grad(ta, kForwardGradLevel, /*is_inplace_op=*/false);
    if (tb.defined()) rb._set_fw_grad(tb, kForwardGradLevel, /*is_inplace_op=*/false);
  }
  return {ra, rb};
}

// ------------------------------------------------------------------------------------ qk_norm_rope in ATen
at::ScalarType compute_dtype(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// rotate_half of transformers (interleaved: GPT-J's rotate_every_two): (-x_b, x_a) at (a, b) for every pair.
at::Tensor rotate_half(const at::Tensor& x, bool interleaved) {
  if (interleaved) {
    const at::Tensor even = x.slice(-1, 0, std::nullopt, 2), odd = x.slice(-1, 1, std::nullopt, 2);
    return at::stack({-odd, even}, -1).flatten(-2);
  }
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// x (compute dtype) rotated in ATen ops, forward (x c + rotate_half(x) s) or transposed (x c - rotate_half(x s));
// the features past rot pass through.
at::Tensor rotate_in_aten(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t unsqueeze_dim,
                          bool interleaved, bool transposed) {
  const int64_t rot = cos.size(-1), n = x.size(-1);
  const at::Tensor c = cos.to(x.scalar_type()).unsqueeze(unsqueeze_dim);
  const at::Tensor s = sin.to(x.scalar_type()).unsqueeze(unsqueeze_dim);
  const at::Tensor part = x.narrow(-1, 0, rot);
  const at::Tensor y = transposed ? part * c - rotate_half(part * s, interleaved) : part * c + rotate_half(part, interleaved) * s;
  return rot == n ? y : at::cat({y, x.narrow(-1, rot, n - rot)}, -1);
}

// One side (q or k) of qk_norm_rope: its row statistics in the compute dtype, differentiable in x to any order.
struct NormedRows {
  at::Tensor rstd, xhat, w;  // w: weight + weight_offset
  NormedRows(const at::Tensor& x, const at::Tensor& weight, double eps, double weight_offset) {
    const at::Tensor xf = x.to(compute_dtype(x));
    rstd = (xf * xf).mean({-1}, /*keepdim=*/true).add(eps).rsqrt();
    xhat = xf * rstd;
    w = weight.to(xf.scalar_type());
    if (weight_offset != 0.0) w = w + weight_offset;
  }
};

struct QkNormAttrs {
  double eps, weight_offset;
  int64_t unsqueeze_dim;
  bool interleaved;
};

// One side's gradients in ATen ops (undefined where not wanted).
std::tuple<at::Tensor, at::Tensor> qk_norm_side_backward_in_aten(const at::Tensor& grad, const at::Tensor& x,
                                                                 const at::Tensor& weight, const at::Tensor& cos,
                                                                 const at::Tensor& sin, const QkNormAttrs& a,
                                                                 bool input_grad, bool weight_grad) {
  const NormedRows r(x, weight, a.eps, a.weight_offset);
  const at::Tensor gn = rotate_in_aten(grad.to(r.xhat.scalar_type()), cos, sin, a.unsqueeze_dim, a.interleaved, true);
  at::Tensor dx, dw;
  if (input_grad) {
    const at::Tensor v = gn * r.w;
    dx = (r.rstd * (v - r.xhat * (v * r.xhat).mean({-1}, /*keepdim=*/true))).to(x.scalar_type());
  }
  if (weight_grad) dw = (gn * r.xhat).reshape({-1, x.size(-1)}).sum(0).to(weight.scalar_type());
  return {dx, dw};
}

// One side's tangent in ATen ops (tx, tw either undefined: zero); undefined when both are.
at::Tensor qk_norm_side_jvp(const at::Tensor& x, const at::Tensor& tx, const at::Tensor& weight, const at::Tensor& tw,
                            const at::Tensor& cos, const at::Tensor& sin, const QkNormAttrs& a) {
  if (!tx.defined() && !tw.defined()) return at::Tensor();
  const NormedRows r(x, weight, a.eps, a.weight_offset);
  const auto dtype = r.xhat.scalar_type();
  at::Tensor d;
  if (tx.defined()) {
    const at::Tensor t = tx.to(dtype);
    d = r.rstd * (t - r.xhat * (r.xhat * t).mean({-1}, /*keepdim=*/true)) * r.w;
  }
  if (tw.defined()) d = add_terms(d, r.xhat * tw.to(dtype));
  return rotate_in_aten(d, cos, sin, a.unsqueeze_dim, a.interleaved, false).to(x.scalar_type());
}

QkNormAttrs qk_norm_attrs(const std::vector<c10::IValue>& attrs) {
  return {attrs[0].toDouble(), attrs[1].toDouble(), attrs[2].toInt(), attrs[3].toBool()};
}

// Saved: q, k, q_weight, k_weight, cos, sin. attrs: eps, weight_offset, unsqueeze_dim, interleaved. Edges: q, k,
// q_weight, k_weight. Grads: q_out, k_out.
variable_list qk_norm_rope_backward_formula(const BackwardContext& ctx, const variable_list& saved,
                                            const variable_list& grads) {
  const at::Tensor &q = saved[0], &k = saved[1], &qw = saved[2], &kw = saved[3], &cos = saved[4], &sin = saved[5];
  const at::Tensor &gq = grads[0], &gk = grads[1];
  const QkNormAttrs a = qk_norm_attrs(ctx.attrs);
  at::Tensor dq, dk, dqw, dkw;
  if (c10::GradMode::is_enabled()) {
    // The backward is being recorded (create_graph=True): ATen math, differentiable to any order.
    if (gq.defined()) {
      std::tie(dq, dqw) = qk_norm_side_backward_in_aten(gq, q, qw, cos, sin, a, ctx.needs_input_grad(0),
                                                        ctx.needs_input_grad(2));
    }
    if (gk.defined()) {
      std::tie(dk, dkw) = qk_norm_side_backward_in_aten(gk, k, kw, cos, sin, a, ctx.needs_input_grad(1),
                                                        ctx.needs_input_grad(3));
    }
  } else if (gq.defined() || gk.defined()) {
    const bool input_grad = ctx.needs_input_grad(0) || ctx.needs_input_grad(1);
    const bool weight_grad = ctx.needs_input_grad(2) || ctx.needs_input_grad(3);
    std::tie(dq, dk, dqw, dkw) =
        qk_norm_rope_backward_op().call(optional_of(gq), optional_of(gk), q, k, qw, kw, cos, sin, a.eps,
                                        a.weight_offset, a.unsqueeze_dim, a.interleaved, input_grad, weight_grad);
    // Placeholders (a side whose output got no gradient, an output not asked for) are no gradients.
    if (!gq.defined()) dq = dqw = at::Tensor();
    if (!gk.defined()) dk = dkw = at::Tensor();
  }
  return {ctx.needs_input_grad(0) ? dq : at::Tensor(), ctx.needs_input_grad(1) ? dk : at::Tensor(),
          ctx.needs_input_grad(2) ? dqw : at::Tensor(), ctx.needs_input_grad(3) ? dkw : at::Tensor()};
}

Pair qk_norm_rope_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
                           const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin, double eps,
                           double weight_offset, int64_t unsqueeze_dim, bool interleaved) {
  check_rotary_constants("qk_norm_rope", {"cos", cos}, {"sin", sin});
  OpNodePtr node;
  if (needs_grad(q, k, q_weight, k_weight)) {
    node = make_op_node("QkNormRopeBackward", &qk_norm_rope_backward_formula, {q, k, q_weight, k_weight});
    node->save({q, k, q_weight, k_weight, cos, sin});
    node->attrs = {eps, weight_offset, unsqueeze_dim, interleaved};
  }
  at::Tensor q_out, k_out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(q_out, k_out) =
        qk_norm_rope_op().call(q, k, q_weight, k_weight, cos, sin, eps, weight_offset, unsqueeze_dim, interleaved);
  }
  if (node) record_outputs(node, {q_out, k_out});
  if (has_forward_grad(q, k, q_weight, k_weight)) {
    const QkNormAttrs a{eps, weight_offset, unsqueeze_dim, interleaved};
    const at::Tensor tq = qk_norm_side_jvp(forward_primal(q), tangent_of(q), forward_primal(q_weight),
                                           tangent_of(q_weight), cos, sin, a);
    const at::Tensor tk = qk_norm_side_jvp(forward_primal(k), tangent_of(k), forward_primal(k_weight),
                                           tangent_of(k_weight), cos, sin, a);
    if (tq.defined()) q_out._set_fw_grad(tq, kForwardGradLevel, /*is_inplace_op=*/false);
    if (tk.defined()) k_out._set_fw_grad(tk, kForwardGradLevel, /*is_inplace_op=*/false);
  }
  return {q_out, k_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> qk_norm_rope_backward_autograd(
    const OptTensor& grad_q_out, const OptTensor& grad_k_out, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& q_weight, const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin, double eps,
    double weight_offset, int64_t unsqueeze_dim, bool interleaved, bool input_grad, bool weight_grad) {
  const at::Tensor gq = grad_q_out.value_or(at::Tensor()), gk = grad_k_out.value_or(at::Tensor());
  check_rotary_constants("_qk_norm_rope_backward", {"cos", cos}, {"sin", sin});
  return call_differentiable_once(
      "QkNormRopeBackwardBackward", "_qk_norm_rope_backward",
      "; differentiate qk_norm_rope's own backward under create_graph=True instead", {gq, gk, q, k, q_weight, k_weight},
      [&] {
        return qk_norm_rope_backward_op().call(grad_q_out, grad_k_out, q, k, q_weight, k_weight, cos, sin, eps,
                                               weight_offset, unsqueeze_dim, interleaved, input_grad, weight_grad);
      });
}

// --------------------------------------------------------------------------------------- rotary_embedding_
void rotary_embedding_inplace_autograd(const at::Tensor& positions, const at::Tensor& query, const OptTensor& key,
                                       int64_t head_size, const at::Tensor& cos_sin_cache, bool is_neox) {
  check_rotary_inference_only("rotary_embedding_", {{"query", query},
                                                    {"key", key.value_or(at::Tensor())},
                                                    {"cos_sin_cache", cos_sin_cache}});
  at::AutoDispatchBelowAutograd guard;
  rotary_embedding_inplace_op().call(positions, query, key, head_size, cos_sin_cache, is_neox);  // ADInplaceOrView
}

void rotary_embedding_inplace_ad_inplace_or_view(const at::Tensor& positions, const at::Tensor& query,
                                                 const OptTensor& key, int64_t head_size,
                                                 const at::Tensor& cos_sin_cache, bool is_neox) {
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    rotary_embedding_inplace_op().call(positions, query, key, head_size, cos_sin_cache, is_neox);
  }
  torch::autograd::impl::bump_version(query);
  if (key.has_value() && key->defined()) torch::autograd::impl::bump_version(*key);
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, Autograd, m) {
  m.impl("rotary_embedding", &rotation_autograd<false>);
  m.impl("_rotary_embedding_backward", &rotation_autograd<true>);
  m.impl("qk_norm_rope", &qk_norm_rope_autograd);
  m.impl("_qk_norm_rope_backward", &qk_norm_rope_backward_autograd);
  m.impl("rotary_embedding_", &rotary_embedding_inplace_autograd);
}

TORCH_LIBRARY_IMPL(myns, ADInplaceOrView, m) {
  m.impl("rotary_embedding_", &rotary_embedding_inplace_ad_inplace_or_view);
}

}  // namespace torchops
