// What the sparse ops' Autograd kernels share (autograd/csr_spmm.cpp, csr_sddmm.cpp, csr_softmax.cpp): typed
// handles to the myns ops their formulas call through the dispatcher (so torch.compile and torch.export trace
// them, and they are differentiable again), and A^T @ g as a spmm_reduce over the transpose.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/index_select.h>
#include <c10/core/SymInt.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>

#include "../core/autograd_utils.h"

namespace torchops {
namespace csr_autograd {

using TensorRef = const at::Tensor&;
using OptRef = const std::optional<at::Tensor>&;
using Transpose = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

inline const OpRef<at::Tensor(TensorRef, TensorRef, OptRef, TensorRef, c10::string_view)>
    spmm_reduce_op{"myns::spmm_reduce"};
inline const OpRef<at::Tensor(TensorRef, TensorRef, TensorRef, TensorRef, c10::string_view)>
    sddmm_op{"myns::sddmm"};
inline const OpRef<Transpose(TensorRef, TensorRef, c10::SymInt)> csr_transpose_op{"myns::_csr_transpose"};

// A^T @ g for A = (crow, col, values) with K columns (values undefined: every value 1), summed per head like
// spmm_reduce; through the given transpose, else one computed here.
inline at::Tensor transposed_sum(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                                 const at::Tensor& g, const c10::SymInt& K, at::Tensor t_crow, at::Tensor t_col,
                                 at::Tensor t_perm) {
  const bool given = t_crow.defined();
  if (!given) std::tie(t_crow, t_col, t_perm) = csr_transpose_op().call(crow, col, K);
  const auto permuted = values.defined() ? std::optional<at::Tensor>(given ? permuted_values(values, t_perm)
                                                                           : values.index_select(0, t_perm))
                                         : std::nullopt;
  return spmm_reduce_op().call(t_crow, t_col, permuted, g, "sum");
}

}  // namespace csr_autograd
}  // namespace torchops
