// The norm ops' entry points, shared by the CPU and CUDA backends (as elementwise.h is for the elementwise
// ops): check the arguments once under the op's name, allocate the outputs, hand one NormForward / NormBackward
// (norm.h) to the backend.
//
// `Backend` provides:
//   static at::Tensor empty(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& like);
//       a new dense tensor on like's device (empty.h's allocators);
//   static constexpr int64_t kMaxRow;            the longest row its kernels take (elements)
//   static void forward(const NormForward&);
//   static void backward(const NormBackward&);   (only where a translation unit registers a backward op)
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "../core/empty.h"
#include "norm.h"

namespace torchops {

template <typename Backend>
struct NormOps {
  // A per-row statistic: input.shape[:-1], the stat dtype.
  static at::Tensor empty_stat(const at::Tensor& input) {
    return Backend::empty(input.sizes().slice(0, input.dim() - 1), norm_stat_dtype(input.scalar_type()), input);
  }

  static at::Tensor optional_tensor(const OptTensor& t) { return t.has_value() && t->defined() ? *t : at::Tensor(); }

  // The forward call of rms_norm / add_rms_norm (residual defined) with its outputs allocated.
  static NormForward rms_forward(const char* op, const at::Tensor& input, const at::Tensor& residual,
                                 const OptTensor& weight, double eps, double weight_offset, bool save) {
    if (residual.defined()) {
      check_norm_input_pair(op, {"input", input}, {"residual", residual}, weight, weight_offset);
    } else {
      check_norm_input(op, {"input", input}, weight, weight_offset);
    }
    check_norm_row_limit(op, {"input", input}, Backend::kMaxRow);
    NormForward f{NormKind::kRms, input, residual, dense_weight(weight), at::Tensor(), eps, weight_offset,
                  backend_empty_like<Backend>(input)};
    if (residual.defined()) f.residual_out = backend_empty_like<Backend>(input);
    if (save) f.rstd = empty_stat(input);
    Backend::forward(f);
    return f;
  }

  static at::Tensor rms_norm(const at::Tensor& input, const OptTensor& weight, double eps, double weight_offset) {
    return rms_forward("rms_norm", input, at::Tensor(), weight, eps, weight_offset, false).out;
  }

  static std::tuple<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& input, const OptTensor& weight,
                                                             double eps, double weight_offset) {
    const NormForward f = rms_forward("_rms_norm_forward", input, at::Tensor(), weight, eps, weight_offset, true);
    return {f.out, f.rstd};
  }

  static std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& input, const at::Tensor& residual,
                                                         const OptTensor& weight, double eps, double weight_offset) {
    check_defined("add_rms_norm", {"residual", residual});  // an undefined residual must not mean "no residual"
    const NormForward f = rms_forward("add_rms_norm", input, residual, weight, eps, weight_offset, false);
    return {f.out, f.residual_out};
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_forward(const at::Tensor& input,
                                                                             const at::Tensor& residual,
                                                                             const OptTensor& weight, double eps,
                                                                             double weight_offset) {
    check_defined("_add_rms_norm_forward", {"residual", residual});
    const NormForward f = rms_forward("_add_rms_norm_forward", input, residual, weight, eps, weight_offset, true);
    return {f.out, f.residual_out, f.rstd};
  }

  static NormForward layer_forward(const char* op, const at::Tensor& input, const OptTensor& weight,
                                   const OptTensor& bias, double eps, bool save) {
    check_layer_norm_input(op, {"input", input}, weight, bias);
    check_norm_row_limit(op, {"input", input}, Backend::kMaxRow);
    NormForward f{NormKind::kLayer, input, at::Tensor(), dense_weight(weight), dense_weight(bias), eps, 0.0,
                  backend_empty_like<Backend>(input)};
    if (save) {
      f.mean = empty_stat(input);
      f.rstd = empty_stat(input);
    }
    Backend::forward(f);
    return f;
  }

  static at::Tensor layer_norm(const at::Tensor& input, const OptTensor& weight, const OptTensor& bias, double eps) {
    return layer_forward("layer_norm", input, weight, bias, eps, false).out;
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward(const at::Tensor& input,
                                                                           const OptTensor& weight,
                                                                           const OptTensor& bias, double eps) {
    const NormForward f = layer_forward("_layer_norm_forward", input, weight, bias, eps, true);
    return {f.out, f.mean, f.rstd};
  }

  // Allocates the wanted gradients and runs the backend when any is wanted. grad_weight has weight's dtype;
  // layer_norm's grad_bias too, or the stat dtype without a weight (the backward does not see the bias: its
  // Autograd kernel casts).
  static void run_backward(NormBackward& b, bool input_grad, bool weight_grad, bool bias_grad) {
    const auto input_dtype = b.input.scalar_type();
    const auto weight_dtype = b.weight.defined() ? b.weight.scalar_type() : input_dtype;
    const auto bias_dtype = b.weight.defined() ? weight_dtype : norm_stat_dtype(input_dtype);
    const int64_t columns[] = {b.input.size(-1)};
    b.grad_input = backend_empty_if<Backend>(input_grad, b.input.sizes(), input_dtype, b.input);
    b.grad_weight = backend_empty_if<Backend>(weight_grad, columns, weight_dtype, b.input);
    b.grad_bias = backend_empty_if<Backend>(bias_grad, columns, bias_dtype, b.input);
    if (input_grad || weight_grad || bias_grad) {
      NormBackward run = b;  // the backend sees only the outputs wanted
      if (!input_grad) run.grad_input = at::Tensor();
      if (!weight_grad) run.grad_weight = at::Tensor();
      if (!bias_grad) run.grad_bias = at::Tensor();
      Backend::backward(run);
    }
  }

  static std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_out, const at::Tensor& input,
                                                              const OptTensor& weight, const at::Tensor& rstd,
                                                              bool input_grad, bool weight_grad,
                                                              double weight_offset) {
    check_norm_backward("_rms_norm_backward", {"grad_out", grad_out}, {"input", input}, weight, {"rstd", rstd},
                        weight_grad, weight_offset);
    NormBackward b{NormKind::kRms, grad_out, input, at::Tensor(), dense_weight(weight), at::Tensor(), rstd,
                   weight_offset};
    run_backward(b, input_grad, weight_grad, false);
    return {b.grad_input, b.grad_weight};
  }

  static std::tuple<at::Tensor, at::Tensor> add_rms_norm_backward(const at::Tensor& grad_out,
                                                                  const OptTensor& grad_residual_out,
                                                                  const at::Tensor& residual_out,
                                                                  const OptTensor& weight, const at::Tensor& rstd,
                                                                  bool weight_grad, double weight_offset) {
    const char* op = "_add_rms_norm_backward";
    check_norm_backward(op, {"grad_out", grad_out}, {"residual_out", residual_out}, weight, {"rstd", rstd},
                        weight_grad, weight_offset);
    NormBackward b{NormKind::kRms, grad_out, residual_out, optional_tensor(grad_residual_out), dense_weight(weight),
                   at::Tensor(), rstd, weight_offset};
    if (b.grad_residual_out.defined()) {
      check_norm_input_pair(op, {"residual_out", residual_out}, {"grad_residual_out", b.grad_residual_out}, weight,
                            weight_offset);
    }
    run_backward(b, true, weight_grad, false);
    return {b.grad_input, b.grad_weight};
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
      const at::Tensor& grad_out, const at::Tensor& input, const OptTensor& weight, const at::Tensor& mean,
      const at::Tensor& rstd, bool input_grad, bool weight_grad, bool bias_grad) {
    const char* op = "_layer_norm_backward";
    check_layer_norm_input(op, {"input", input}, weight, std::nullopt);
    check_like(op, {"input", input}, {"grad_out", grad_out});
    check_norm_stat(op, {"input", input}, {"mean", mean});
    check_norm_stat(op, {"input", input}, {"rstd", rstd});
    TORCHOPS_CHECK(!weight_grad || (weight.has_value() && weight->defined()), op,
                   "weight_grad is true but weight is None");
    NormBackward b{NormKind::kLayer, grad_out, input, at::Tensor(), dense_weight(weight), mean, rstd, 0.0};
    run_backward(b, input_grad, weight_grad, bias_grad);
    return {b.grad_input, b.grad_weight, b.grad_bias};
  }
};

// Registers every norm op's kernel of a backend (in its TORCH_LIBRARY_IMPL block).
template <typename Backend>
void register_norm_ops(torch::Library& m) {
  using Ops = NormOps<Backend>;
  m.impl("rms_norm", &Ops::rms_norm);
  m.impl("_rms_norm_forward", &Ops::rms_norm_forward);
  m.impl("_rms_norm_backward", &Ops::rms_norm_backward);
  m.impl("add_rms_norm", &Ops::add_rms_norm);
  m.impl("_add_rms_norm_forward", &Ops::add_rms_norm_forward);
  m.impl("_add_rms_norm_backward", &Ops::add_rms_norm_backward);
  m.impl("layer_norm", &Ops::layer_norm);
  m.impl("_layer_norm_forward", &Ops::layer_norm_forward);
  m.impl("_layer_norm_backward", &Ops::layer_norm_backward);
}

}  // namespace torchops
