// Autograd for the sparse x dense products: csr_spmm, spmm_reduce, _csr_spmm_with_transpose and
// _spmm_reduce_forward (out = reduce over row i of w(p) * dense[col[p]], A = (crow, col, values)), one node for
// all of them, and the refusal to differentiate _spmm_reduce_backward.
//
//   sum / mean   g' = grad_out (mean: divided by each row's length)
//                d values = sddmm(crow, col, g', dense, "dot")             (summed over heads for 1-D values)
//                d dense  = A^T @ g' = spmm_reduce(t_crow, t_col, values[t_perm], g', "sum")
//   max / min    _spmm_reduce_backward through the selected positions (arg, from _spmm_reduce_forward)
//
// A^T comes from _csr_transpose (a stable sort: deterministic, so the dense gradient is bit-identical from run
// to run), computed in backward and only when dense needs a gradient; _csr_spmm_with_transpose takes it
// precomputed instead (torchops.spmm caches it per sparse tensor). The sum / mean formulas call myns ops through
// the dispatcher, so they are differentiable again (double backward) and visible to torch.compile. The index
// tensors never get gradients.
// Forward mode (torch.func.jvp, forward_ad): sum and mean are bilinear in (values, dense), so the tangent is
// op(d values, dense) + op(values, d dense); max and min are that at the selected positions (ATen gathers).
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "../core/autograd_node.h"
#include "../core/autograd_utils.h"
#include "../core/dispatch.h"
#include "../csr/csr.h"
#include "../csr/csr_autograd.h"

namespace torchops {
namespace {

using namespace csr_autograd;

const OpRef<at::Tensor(TensorRef, TensorRef, TensorRef, TensorRef)> csr_spmm_op{"myns::csr_spmm"};
const OpRef<at::Tensor(TensorRef, TensorRef, OptRef, TensorRef, TensorRef, TensorRef, TensorRef, c10::string_view)>
    with_transpose_op{"myns::_csr_spmm_with_transpose"};
const OpRef<std::tuple<at::Tensor, at::Tensor>(TensorRef, TensorRef, OptRef, TensorRef, c10::string_view)>
    spmm_reduce_forward_op{"myns::_spmm_reduce_forward"};
const OpRef<std::tuple<at::Tensor, at::Tensor>(TensorRef, TensorRef, TensorRef, OptRef, TensorRef, TensorRef, OptRef,
                                               OptRef, OptRef, bool, bool)>
    spmm_reduce_backward_op{"myns::_spmm_reduce_backward"};

// grad_out divided by each row's length (at least 1), in one pass into float32 (float64 for float64) by promotion.
at::Tensor per_row_mean(const at::Tensor& crow, const at::Tensor& g) {
  const int64_t M = crow.size(0) - 1;
  at::Tensor lengths = (crow.slice(0, 1) - crow.slice(0, 0, M)).clamp_min(1);
  std::vector<int64_t> shape(g.dim(), 1);
  shape[0] = M;
  const auto wide = g.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return g / lengths.to(wide).view(shape);
}

// Saved: crow, col, values, dense, arg, t_crow, t_col, t_perm (values, arg and the transpose may be undefined).
// attrs: the reduce. Edges: values, dense.
variable_list spmm_backward_formula(const BackwardContext& ctx, const variable_list& saved, const variable_list& grads) {
  const at::Tensor &crow = saved[0], &col = saved[1], &values = saved[2], &dense = saved[3], &arg = saved[4];
  const auto reduce = static_cast<Reduce>(ctx.attrs[0].toInt());
  const at::Tensor& g = grads[0];
  at::Tensor grad_values, grad_dense;
  if (!g.defined()) return {grad_values, grad_dense};
  const bool values_grad = values.defined() && ctx.needs_input_grad(0), dense_grad = ctx.needs_input_grad(1);
  if (selects(reduce)) {
    std::tie(grad_values, grad_dense) = spmm_reduce_backward_op().call(
        g, crow, col, optional_of(values), dense, arg, optional_of(saved[5]), optional_of(saved[6]), optional_of(saved[7]),
        values_grad, dense_grad);
    return {values_grad ? grad_values : at::Tensor(), dense_grad ? grad_dense : at::Tensor()};
  }
  // mean of a 16-bit gradient: g / length rounded to 16 bits would round every term of the products below, an
  // error relative to the terms instead of the result (it showed where they cancel), so g / length stays float32
  // and the products run in float32, their results rounded once.
  const bool widen = reduce == Reduce::kMean && is_16bit_float_dtype(g.scalar_type());
  const auto wide = [&](const at::Tensor& t) { return widen && t.defined() ? t.to(at::kFloat) : t; };
  const at::Tensor scaled = reduce == Reduce::kMean ? per_row_mean(crow, g) : g;
  if (values_grad) {
    // One value for every head: the dot over heads and features at once, so a 16-bit gradient is rounded once
    // (per head, then summed, missed the float64 one by several ulps where the heads cancel).
    const bool shared = values.dim() == 1 && dense.dim() == 3;
    const at::Tensor d = wide(dense);
    grad_values = (shared ? sddmm_op().call(crow, col, scaled.flatten(1), d.flatten(1), "dot")
                          : sddmm_op().call(crow, col, scaled, d, "dot"))
                      .to(values.scalar_type());
  }
  if (dense_grad) {
    grad_dense = transposed_sum(crow, col, wide(values), scaled, dense.sym_size(0), saved[5], saved[6], saved[7])
                     .to(dense.scalar_type());
  }
  return {grad_values, grad_dense};
}

// The forward's result at the selected positions, for tangents tv (of values) and td (of dense), either
// undefined: w(p, h) * dense[col[p], h, d] with p = arg[i, h, d], 0 where a row is empty.
at::Tensor selected_tangent(const at::Tensor& col, const at::Tensor& values, const at::Tensor& dense,
                            const at::Tensor& arg, const at::Tensor& tv, const at::Tensor& td) {
  const int64_t M = arg.size(0), columns = M > 0 ? arg.numel() / M : 0;
  const at::Tensor zeros = at::zeros(arg.sizes(), dense.options());
  if (arg.numel() == 0 || col.numel() == 0) return zeros;
  const at::Tensor pos = arg.clamp_min(0).to(at::kLong);
  const at::Tensor rows = col.to(at::kLong).index_select(0, pos.reshape({-1})).view({M, columns});
  const auto at_rows = [&](const at::Tensor& x) {  // x[rows[i, c], c]
    return x.reshape({x.size(0), columns}).gather(0, rows).view(arg.sizes());
  };
  const auto at_positions = [&](const at::Tensor& v) {  // v[pos, h] (every head alike for 1-D values)
    if (v.dim() == 1) return v.index_select(0, pos.reshape({-1})).view(arg.sizes());
    const int64_t H = v.size(1);
    const at::Tensor head = at::arange(H, pos.options()).view({1, H, 1});
    return v.reshape({-1}).index_select(0, (pos * H + head).reshape({-1})).view(arg.sizes());
  };
  at::Tensor t;
  if (tv.defined()) t = at_positions(tv) * at_rows(forward_primal(dense));
  if (td.defined()) {
    at::Tensor term = at_rows(td);
    if (values.defined()) term = at_positions(forward_primal(values)) * term;
    t = t.defined() ? t + term : term;
  }
  return at::where(arg.ge(0), t, zeros);
}

// Runs the product below autograd on (values, dense) and records what autograd needs. `op(values, dense)`
// calls the op being differentiated (null for _spmm_reduce_forward itself); max and min run
// _spmm_reduce_forward instead when they need the selected positions (for backward or forward mode). Returns
// (out, arg) (arg undefined for sum and mean).
template <class Op>
std::tuple<at::Tensor, at::Tensor> record_spmm(Reduce reduce, const at::Tensor& crow, const at::Tensor& col,
                                               const at::Tensor& values, const at::Tensor& dense, const at::Tensor& t_crow,
                                               const at::Tensor& t_col, const at::Tensor& t_perm, const Op* op) {
  OpNodePtr node;
  if (needs_grad(values, dense)) node = make_op_node("SpmmReduceBackward", &spmm_backward_formula, {values, dense});
  at::Tensor out, arg;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    if (selects(reduce) && (op == nullptr || node || has_forward_grad(values, dense))) {
      std::tie(out, arg) = spmm_reduce_forward_op().call(crow, col, optional_of(values), dense, reduce_name(reduce));
    } else {
      out = (*op)(values, dense);
    }
  }
  if (node) {
    node->save({crow, col, values, dense, arg, t_crow, t_col, t_perm});
    node->attrs = {c10::IValue(static_cast<int64_t>(reduce))};
    record_outputs(node, {out});
  }
  if (has_forward_grad(values, dense)) {
    const at::Tensor tv = values.defined() ? values._fw_grad(kForwardGradLevel) : at::Tensor();
    const at::Tensor td = dense._fw_grad(kForwardGradLevel);
    at::Tensor tangent;
    if (selects(reduce)) {
      tangent = selected_tangent(col, values, dense, arg, tv, td);
    } else {
      if (tv.defined()) tangent = (*op)(tv, forward_primal(dense));
      if (td.defined()) {
        at::Tensor from_dense = (*op)(forward_primal(values), td);
        tangent = tangent.defined() ? tangent + from_dense : from_dense;
      }
    }
    out._set_fw_grad(tangent, kForwardGradLevel, /*is_inplace_op=*/false);
  }
  return {out, arg};
}

at::Tensor csr_spmm_autograd(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                             const at::Tensor& dense) {
  const auto op = [&](const at::Tensor& v, const at::Tensor& d) { return csr_spmm_op().call(crow, col, v, d); };
  return std::get<0>(record_spmm(Reduce::kSum, crow, col, values, dense, {}, {}, {}, &op));
}

at::Tensor spmm_reduce_autograd(const at::Tensor& crow, const at::Tensor& col, const OptTensor& values,
                                const at::Tensor& dense, c10::string_view reduce) {
  const Reduce r = parse_reduce("spmm_reduce", reduce);
  // max and min run _spmm_reduce_forward below: checked here first, under this op's name.
  if (selects(r)) check_spmm_reduce_args("spmm_reduce", crow, col, values, dense);
  const auto op = [&](const at::Tensor& v, const at::Tensor& d) {
    return spmm_reduce_op().call(crow, col, optional_of(v), d, reduce);
  };
  return std::get<0>(record_spmm(r, crow, col, given_or_undefined(values), dense, {}, {}, {}, &op));
}

std::tuple<at::Tensor, at::Tensor> spmm_reduce_forward_autograd(const at::Tensor& crow, const at::Tensor& col,
                                                                const OptTensor& values, const at::Tensor& dense,
                                                                c10::string_view reduce) {
  const Reduce r = parse_selecting_reduce("_spmm_reduce_forward", reduce);
  using Unused = at::Tensor (*)(const at::Tensor&, const at::Tensor&);
  return record_spmm<Unused>(r, crow, col, given_or_undefined(values), dense, {}, {}, {}, nullptr);
}

at::Tensor with_transpose_autograd(const at::Tensor& crow, const at::Tensor& col, const OptTensor& values,
                                   const at::Tensor& dense, const at::Tensor& t_crow, const at::Tensor& t_col,
                                   const at::Tensor& t_perm, c10::string_view reduce) {
  const char* name = "_csr_spmm_with_transpose";
  const Reduce r = parse_reduce(name, reduce);
  if (selects(r)) {  // as in spmm_reduce_autograd
    check_spmm_reduce_args(name, crow, col, values, dense);
    check_csr_transpose_args(name, crow, col, dense, t_crow, t_col, t_perm);
  }
  const auto op = [&](const at::Tensor& v, const at::Tensor& d) {
    return with_transpose_op().call(crow, col, optional_of(v), d, t_crow, t_col, t_perm, reduce);
  };
  return std::get<0>(record_spmm(r, crow, col, given_or_undefined(values), dense, t_crow, t_col, t_perm, &op));
}

std::tuple<at::Tensor, at::Tensor> spmm_reduce_backward_autograd(
    const at::Tensor& grad_out, const at::Tensor& crow, const at::Tensor& col, const OptTensor& values,
    const at::Tensor& dense, const at::Tensor& arg, const OptTensor& t_crow, const OptTensor& t_col,
    const OptTensor& t_perm, bool values_grad, bool dense_grad) {
  const at::Tensor v = given_or_undefined(values);
  return call_differentiable_once("SpmmReduceBackwardBackward", "_spmm_reduce_backward", "", {grad_out, v, dense},
                                  [&] {
                                    return spmm_reduce_backward_op().call(grad_out, crow, col, values, dense, arg,
                                                                          t_crow, t_col, t_perm, values_grad,
                                                                          dense_grad);
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
  m.impl("spmm_reduce", &spmm_reduce_autograd);
  m.impl("_spmm_reduce_forward", &spmm_reduce_forward_autograd);
  m.impl("_spmm_reduce_backward", &spmm_reduce_backward_autograd);
  m.impl("_csr_spmm_with_transpose", &with_transpose_autograd);
  m.impl("_csr_transpose", &csr_transpose_autograd);
}

}  // namespace torchops
