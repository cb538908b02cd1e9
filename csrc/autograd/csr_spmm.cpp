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
#include <ATen/core/Tensor.h>
#include <ATen/ops/index_select.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "../common/autograd_utils.h"

namespace torchops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Transpose = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

const auto& csr_spmm_op() {
  static const auto op =
      find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
          "myns::csr_spmm");
  return op;
}

const auto& csr_spmm_with_transpose_op() {
  static const auto op =
      find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         const at::Tensor&, const at::Tensor&, const at::Tensor&)>("myns::_csr_spmm_with_transpose");
  return op;
}

const auto& csr_sddmm_op() {
  static const auto op =
      find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
          "myns::_csr_sddmm");
  return op;
}

const auto& csr_transpose_op() {
  static const auto op =
      find_op<Transpose(const at::Tensor&, const at::Tensor&, c10::SymInt)>("myns::_csr_transpose");
  return op;
}

// A^T @ g for A = (crow, col, values) with K columns, through the transpose (computed when not given).
at::Tensor transposed_spmm(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                           const at::Tensor& g, const c10::SymInt& K, at::Tensor t_crow, at::Tensor t_col,
                           at::Tensor t_perm) {
  if (!t_crow.defined()) std::tie(t_crow, t_col, t_perm) = csr_transpose_op().call(crow, col, K);
  return csr_spmm_op().call(t_crow, t_col, values.index_select(0, t_perm), g);
}

// Inputs: crow, col, values, dense, then t_crow, t_col, t_perm (nullopt for plain csr_spmm: an undefined
// tensor can't be a custom Function's input).
using OptTensor = std::optional<at::Tensor>;

class CsrSpmmFunction : public torch::autograd::Function<CsrSpmmFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& crow, const at::Tensor& col,
                            const at::Tensor& values, const at::Tensor& dense, const OptTensor& t_crow,
                            const OptTensor& t_col, const OptTensor& t_perm) {
    const at::Tensor tc = t_crow.value_or(at::Tensor()), tk = t_col.value_or(at::Tensor()),
                     tp = t_perm.value_or(at::Tensor());
    ctx->save_for_backward({crow, col, values, dense, tc, tk, tp});
    at::AutoDispatchBelowADInplaceOrView guard;
    return tc.defined() ? csr_spmm_with_transpose_op().call(crow, col, values, dense, tc, tk, tp)
                        : csr_spmm_op().call(crow, col, values, dense);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &crow = saved[0], &col = saved[1], &values = saved[2], &dense = saved[3];
    const at::Tensor& g = grad_outputs[0];
    at::Tensor grad_values, grad_dense;
    if (g.defined() && ctx->needs_input_grad(2)) grad_values = csr_sddmm_op().call(crow, col, g, dense);
    if (g.defined() && ctx->needs_input_grad(3)) {
      grad_dense = transposed_spmm(crow, col, values, g, dense.sym_size(0), saved[4], saved[5], saved[6]);
    }
    return {at::Tensor(), at::Tensor(), grad_values, grad_dense, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// out[p] = grad_out[row(p)] . dense[col(p)]:  d grad_out = S @ dense,  d dense = S^T @ grad_out,
// with S = (crow, col, g) the sparse matrix of the incoming gradient.
class CsrSddmmFunction : public torch::autograd::Function<CsrSddmmFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& crow, const at::Tensor& col,
                            const at::Tensor& grad_out, const at::Tensor& dense) {
    ctx->save_for_backward({crow, col, grad_out, dense});
    at::AutoDispatchBelowADInplaceOrView guard;
    return csr_sddmm_op().call(crow, col, grad_out, dense);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &crow = saved[0], &col = saved[1], &a = saved[2], &b = saved[3];
    const at::Tensor& g = grad_outputs[0];
    at::Tensor grad_a, grad_b;
    if (g.defined() && ctx->needs_input_grad(2)) grad_a = csr_spmm_op().call(crow, col, g, b);
    if (g.defined() && ctx->needs_input_grad(3)) {
      grad_b = transposed_spmm(crow, col, g, a, b.sym_size(0), at::Tensor(), at::Tensor(), at::Tensor());
    }
    return {at::Tensor(), at::Tensor(), grad_a, grad_b};
  }
};

at::Tensor csr_spmm_autograd(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                             const at::Tensor& dense) {
  if (needs_grad(values, dense)) {
    return CsrSpmmFunction::apply(crow, col, values, dense, OptTensor(), OptTensor(), OptTensor());
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return csr_spmm_op().call(crow, col, values, dense);
}

at::Tensor csr_spmm_with_transpose_autograd(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                                            const at::Tensor& dense, const at::Tensor& t_crow,
                                            const at::Tensor& t_col, const at::Tensor& t_perm) {
  if (needs_grad(values, dense)) {
    return CsrSpmmFunction::apply(crow, col, values, dense, OptTensor(t_crow), OptTensor(t_col), OptTensor(t_perm));
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return csr_spmm_with_transpose_op().call(crow, col, values, dense, t_crow, t_col, t_perm);
}

at::Tensor csr_sddmm_autograd(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& grad_out,
                              const at::Tensor& dense) {
  if (needs_grad(grad_out, dense)) return CsrSddmmFunction::apply(crow, col, grad_out, dense);
  at::AutoDispatchBelowADInplaceOrView guard;
  return csr_sddmm_op().call(crow, col, grad_out, dense);
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
