// Autograd for sddmm: out[p, h] = f(a[i, h], b[j, h]) for each nonzero p = (i, j), with S = (crow, col, grad_out)
// the sparse matrix of the incoming gradient (per head):
//   dot   d a = S @ b                   d b = S^T @ a                 (spmm_reduce, "sum")
//   mul   the same with D = 1 (a and b viewed (rows, [H,] 1))
//   add   d a = row sums of S           d b = column sums of S       (S @ 1 and S^T @ 1)
// S^T through _csr_transpose (deterministic). The formulas call myns ops, so sddmm is differentiable again.
// Forward mode: dot and mul are bilinear (op(da, b) + op(a, db)), add is linear (op(da, db), a missing tangent
// a zero).
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <string>

#include "../core/autograd_node.h"
#include "../core/autograd_utils.h"
#include "../csr/csr.h"
#include "../csr/csr_autograd.h"

namespace torchops {
namespace {

using namespace csr_autograd;

// Saved: crow, col, a, b. attrs: the op's name. Edges: a, b.
variable_list sddmm_backward_formula(const BackwardContext& ctx, const variable_list& saved,
                                     const variable_list& grads) {
  const at::Tensor &crow = saved[0], &col = saved[1], &a = saved[2], &b = saved[3];
  const std::string name = ctx.attrs[0].toStringRef();
  const SddmmOp kind = parse_sddmm_op("sddmm", name);
  const at::Tensor& g = grads[0];
  at::Tensor grad_a, grad_b;
  if (!g.defined()) return {grad_a, grad_b};
  // What S and S^T multiply: b and a themselves (dot), as (rows, [H,] 1) (mul), or ones shaped so (add).
  const auto operand = [&](const at::Tensor& t) {
    if (kind == SddmmOp::kDot) return t;
    return (kind == SddmmOp::kMul ? t : at::ones_like(t)).unsqueeze(-1);
  };
  const auto result = [&](const at::Tensor& t) { return kind == SddmmOp::kDot ? t : t.squeeze(-1); };
  if (ctx.needs_input_grad(0)) grad_a = result(spmm_reduce_op().call(crow, col, g, operand(b), "sum"));
  if (ctx.needs_input_grad(1)) {
    grad_b = result(transposed_sum(crow, col, g, operand(a), b.sym_size(0), {}, {}, {}));
  }
  return {grad_a, grad_b};
}

at::Tensor sddmm_autograd(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& a, const at::Tensor& b,
                          c10::string_view name) {
  const SddmmOp kind = parse_sddmm_op("sddmm", name);
  const auto op = [&](const at::Tensor& x, const at::Tensor& y) { return sddmm_op().call(crow, col, x, y, name); };
  OpNodePtr node;
  if (needs_grad(a, b)) {
    node = make_op_node("SddmmBackward", &sddmm_backward_formula, {a, b});
    node->save({crow, col, a, b});
    node->attrs = {c10::IValue(std::string(name))};
  }
  at::Tensor out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    out = op(a, b);
  }
  if (node) record_outputs(node, {out});
  if (has_forward_grad(a, b)) {
    const at::Tensor ta = a._fw_grad(kForwardGradLevel), tb = b._fw_grad(kForwardGradLevel);
    at::Tensor tangent;
    if (kind == SddmmOp::kAdd) {
      tangent = op(ta.defined() ? ta : at::zeros_like(a), tb.defined() ? tb : at::zeros_like(b));
    } else {
      if (ta.defined()) tangent = op(ta, forward_primal(b));
      if (tb.defined()) {
        at::Tensor from_b = op(forward_primal(a), tb);
        tangent = tangent.defined() ? tangent + from_b : from_b;
      }
    }
    out._set_fw_grad(tangent, kForwardGradLevel, /*is_inplace_op=*/false);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, Autograd, m) {
  m.impl("sddmm", &sddmm_autograd);
}

}  // namespace torchops
