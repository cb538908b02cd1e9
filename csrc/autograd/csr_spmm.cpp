// Autograd for csr_spmm (out = A @ dense, A = (crow_indices, col_indices, values)) and its helpers.
//
//   d values = _csr_sddmm(crow, col, grad_out, dense)          grad_out[i] . dense[j] for each nonzero (i, j)
//   d dense  = A^T @ grad_out = csr_spmm(t_crow, t_col, values[t_perm], grad_out)
//
// A^T comes from _csr_transpose (a stable sort: deterministic, so the dense gradient is bit-identical from
// run to run, deterministic mode or not), computed in backward and only when dense needs a gradient.
// _csr_spmm_with_transpose takes it precomputed instead (torchops.spmm caches it per sparse tensor). The
// backward formulas call the myns ops through the dispatcher, so they are differentiable again (double
// backward) and visible to torch.compile. _csr_sddmm is differentiable the same way; _csr_transpose
// returns index tensors only. The index tensors never get gradients.
// Forward mode (torch.func.jvp, forward_ad): csr_spmm is bilinear in (values, dense), so its tangent is
// csr_spmm(crow, col, d values, dense) + csr_spmm(crow, col, values, d dense); _csr_sddmm likewise in
// (grad_out, dense).
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/index_select.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <tuple>

#include "../core/autograd_node.h"
#include "../core/autograd_utils.h"

namespace torchops {
namespace {

using Transpose = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using TensorRef = const at::Tensor&;
// (crow_indices, col_indices, x, y) -> out: csr_spmm (x = values) and _csr_sddmm (x = grad_out).
using CsrBilinearSig = at::Tensor(TensorRef, TensorRef, TensorRef, TensorRef);

const OpRef<CsrBilinearSig> csr_spmm_op{"myns::csr_spmm"};
const OpRef<at::Tensor(TensorRef, TensorRef, TensorRef, TensorRef, TensorRef, TensorRef, TensorRef)>
    csr_spmm_with_transpose_op{"myns::_csr_spmm_with_transpose"};
const OpRef<CsrBilinearSig> csr_sddmm_op{"myns::_csr_sddmm"};
const OpRef<Transpose(TensorRef, TensorRef, c10::SymInt)> csr_transpose_op{"myns::_csr_transpose"};

// A^T @ g for A = (crow, col, values) with K columns, through the transpose (computed when not given).
at::Tensor transposed_spmm(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                           const at::Tensor& g, const c10::SymInt& K, at::Tensor t_crow, at::Tensor t_col,
                           at::Tensor t_perm) {
  if (!t_crow.defined()) std::tie(t_crow, t_col, t_perm) = csr_transpose_op().call(crow, col, K);
  return csr_spmm_op().call(t_crow, t_col, values.index_select(0, t_perm), g);
}

// Saved: crow, col, values, dense, t_crow, t_col, t_perm (undefined for plain csr_spmm). Edges: values, dense.
variable_list csr_spmm_backward_formula(const BackwardContext& ctx, const variable_list& saved,
                                        const variable_list& grads) {
  const at::Tensor &crow = saved[0], &col = saved[1], &values = saved[2], &dense = saved[3];
  const at::Tensor& g = grads[0];
  at::Tensor grad_values, grad_dense;
  if (g.defined() && ctx.needs_input_grad(0)) grad_values = csr_sddmm_op().call(crow, col, g, dense);
  if (g.defined() && ctx.needs_input_grad(1)) {
    grad_dense = transposed_spmm(crow, col, values, g, dense.sym_size(0), saved[4], saved[5], saved[6]);
  }
  return {grad_values, grad_dense};
}

// out[p] = grad_out[row(p)] . dense[col(p)]:  d grad_out = S @ dense,  d dense = S^T @ grad_out,
// with S = (crow, col, g) the sparse matrix of the incoming gradient.
// Saved: crow, col, grad_out, dense. Edges: grad_out, dense.
variable_list csr_sddmm_backward_formula(const BackwardContext& ctx, const variable_list& saved,
                                         const variable_list& grads) {
  const at::Tensor &crow = saved[0], &col = saved[1], &a = saved[2], &b = saved[3];
  const at::Tensor& g = grads[0];
  at::Tensor grad_a, grad_b;
  if (g.defined() && ctx.needs_input_grad(0)) grad_a = csr_spmm_op().call(crow, col, g, b);
  if (g.defined() && ctx.needs_input_grad(1)) {
    grad_b = transposed_spmm(crow, col, g, a, b.sym_size(0), at::Tensor(), at::Tensor(), at::Tensor());
  }
  return {grad_a, grad_b};
}

// Runs `op` below autograd on (values, dense) and records what autograd needs. Both ops are bilinear in
// (x, y) = (values, dense) resp. (grad_out, dense), so the tangent is op(dx, y) + op(x, dy), each term
// through the dispatcher (differentiable again) and skipped where a tangent is missing.
template <class Op>
at::Tensor record_bilinear(const char* node_name, BackwardFormula formula, const at::Tensor& x, const at::Tensor& y,
                           std::initializer_list<at::Tensor> saved, const Op& op) {
  OpNodePtr node;
  if (needs_grad(x, y)) {
    node = make_op_node(node_name, formula, {x, y});
    node->save(saved);
  }
  at::Tensor out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    out = op(x, y);
  }
  if (node) record_outputs(node, {out});
  if (has_forward_grad(x, y)) {
    const at::Tensor tx = x._fw_grad(kForwardGradLevel), ty = y._fw_grad(kForwardGradLevel);
    at::Tensor tangent;
    if (tx.defined()) tangent = op(tx, forward_primal(y));
    if (ty.defined()) {
      at::Tensor from_y = op(forward_primal(x), ty);
      tangent = tangent.defined() ? tangent + from_y : from_y;
    }
    out._set_fw_grad(tangent, kForwardGradLevel, /*is_inplace_op=*/false);
  }
  return out;
}

at::Tensor csr_spmm_autograd(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                             const at::Tensor& dense) {
  return record_bilinear("CsrSpmmBackward", &csr_spmm_backward_formula, values, dense,
                         {crow, col, values, dense, at::Tensor(), at::Tensor(), at::Tensor()},
                         [&](const at::Tensor& v, const at::Tensor& d) { return csr_spmm_op().call(crow, col, v, d); });
}

at::Tensor csr_spmm_with_transpose_autograd(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                                            const at::Tensor& dense, const at::Tensor& t_crow,
                                            const at::Tensor& t_col, const at::Tensor& t_perm) {
  return record_bilinear("CsrSpmmBackward", &csr_spmm_backward_formula, values, dense,
                         {crow, col, values, dense, t_crow, t_col, t_perm},
                         [&](const at::Tensor& v, const at::Tensor& d) {
                           return csr_spmm_with_transpose_op().call(crow, col, v, d, t_crow, t_col, t_perm);
                         });
}

at::Tensor csr_sddmm_autograd(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& grad_out,
                              const at::Tensor& dense) {
  return record_bilinear("CsrSddmmBackward", &csr_sddmm_backward_formula, grad_out, dense,
                         {crow, col, grad_out, dense},
                         [&](const at::Tensor& g, const at::Tensor& d) {
                           return csr_sddmm_op().call(crow, col, g, d);
                         });
}

// Integer outputs only: nothing to differentiate.
Transpose csr_transpose_autograd(const at::Tensor& crow, const at::Tensor& col, c10::SymInt K) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return csr_transpose_op().call(crow, col, std::move(K));
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, Autograd, m) {
  m.impl("csr_spmm", &csr_spmm_autograd);
  m.impl("_csr_spmm_with_transpose", &csr_spmm_with_transpose_autograd);
  m.impl("_csr_sddmm", &csr_sddmm_autograd);
  m.impl("_csr_transpose", &csr_transpose_autograd);
}

}  // namespace torchops
