// The norm ops' entry points, shared by the CPU and CUDA backends (as elementwise.h is for the elementwise
// ops): check the arguments once under the op's name, allocate the outputs, hand them to the backend.
//
// `Backend` provides what the entry points a translation unit registers call (members of a class template
// are only instantiated when used, so a forward-only file need not define `backward`):
//   static at::Tensor empty(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& like);
//       a new dense tensor on like's device (empty.h's allocators);
//   static void forward_into(input, residual, weight, eps, weight_offset, out, residual_out, rstd);
//       residual / residual_out / rstd undefined when not wanted;
//   static std::tuple<at::Tensor, at::Tensor> backward(grad_out, h, grad_residual_out, weight, rstd,
//       input_grad, weight_grad, weight_offset);                    // grad_residual_out undefined when absent
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

#include "norm.h"

namespace torchops {

template <typename Backend>
struct NormOps {
  static at::Tensor empty_like_dense(const at::Tensor& like) {
    return Backend::empty(like.sizes(), like.scalar_type(), like);
  }

  // Each row's rstd: input.shape[:-1], the stat dtype.
  static at::Tensor empty_rstd(const at::Tensor& input) {
    return Backend::empty(input.sizes().slice(0, input.dim() - 1), norm_stat_dtype(input.scalar_type()), input);
  }

  static at::Tensor rms_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight, double eps,
                             double weight_offset) {
    check_norm_input("rms_norm", {"input", input}, weight, weight_offset);
    at::Tensor out = empty_like_dense(input);
    Backend::forward_into(input, at::Tensor(), weight, eps, weight_offset, out, at::Tensor(), at::Tensor());
    return out;
  }

  static std::tuple<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& input,
                                                             const std::optional<at::Tensor>& weight, double eps,
                                                             double weight_offset) {
    check_norm_input("_rms_norm_forward", {"input", input}, weight, weight_offset);
    at::Tensor out = empty_like_dense(input);
    at::Tensor rstd = empty_rstd(input);
    Backend::forward_into(input, at::Tensor(), weight, eps, weight_offset, out, at::Tensor(), rstd);
    return {out, rstd};
  }

  static std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& input, const at::Tensor& residual,
                                                         const std::optional<at::Tensor>& weight, double eps,
                                                         double weight_offset) {
    check_norm_input_pair("add_rms_norm", {"input", input}, {"residual", residual}, weight, weight_offset);
    at::Tensor out = empty_like_dense(input);
    at::Tensor residual_out = empty_like_dense(input);
    Backend::forward_into(input, residual, weight, eps, weight_offset, out, residual_out, at::Tensor());
    return {out, residual_out};
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_forward(const at::Tensor& input,
                                                                             const at::Tensor& residual,
                                                                             const std::optional<at::Tensor>& weight,
                                                                             double eps, double weight_offset) {
    check_norm_input_pair("_add_rms_norm_forward", {"input", input}, {"residual", residual}, weight, weight_offset);
    at::Tensor out = empty_like_dense(input);
    at::Tensor residual_out = empty_like_dense(input);
    at::Tensor rstd = empty_rstd(input);
    Backend::forward_into(input, residual, weight, eps, weight_offset, out, residual_out, rstd);
    return {out, residual_out, rstd};
  }

  static std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                                              const std::optional<at::Tensor>& weight,
                                                              const at::Tensor& rstd, bool input_grad,
                                                              bool weight_grad, double weight_offset) {
    check_norm_backward("_rms_norm_backward", {"grad_out", grad_out}, {"input", input}, weight, {"rstd", rstd},
                        weight_grad, weight_offset);
    return Backend::backward(grad_out, input, at::Tensor(), weight, rstd, input_grad, weight_grad, weight_offset);
  }

  static std::tuple<at::Tensor, at::Tensor> add_rms_norm_backward(const at::Tensor& grad_out,
                                                                  const std::optional<at::Tensor>& grad_residual_out,
                                                                  const at::Tensor& residual_out,
                                                                  const std::optional<at::Tensor>& weight,
                                                                  const at::Tensor& rstd, bool weight_grad,
                                                                  double weight_offset) {
    const char* op = "_add_rms_norm_backward";
    check_norm_backward(op, {"grad_out", grad_out}, {"residual_out", residual_out}, weight, {"rstd", rstd},
                        weight_grad, weight_offset);
    const at::Tensor dres = grad_residual_out.has_value() ? *grad_residual_out : at::Tensor();
    if (dres.defined()) {
      check_norm_input_pair(op, {"residual_out", residual_out}, {"grad_residual_out", dres}, weight, weight_offset);
    }
    return Backend::backward(grad_out, residual_out, dres, weight, rstd, true, weight_grad, weight_offset);
  }
};

}  // namespace torchops
