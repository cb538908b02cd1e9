// The loss family's ops as a backend registers them: each op's kernel is a driver of loss.h run with the
// backend's row kernel (a template argument, since registered kernels carry no state). A backend's file is
// its row kernel and one LossOps<its kernel>::register_kernels(m).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "loss.h"

namespace torchops {

template <CrossEntropyRowsKernel kRows>
struct LossOps {
  static CrossEntropyOptions options(int64_t ignore_index, double label_smoothing, std::optional<double> softcap) {
    return CrossEntropyOptions{ignore_index, label_smoothing, softcap};
  }

  static at::Tensor linear_cross_entropy(const at::Tensor& input, const at::Tensor& linear_weight,
                                         const at::Tensor& target, const OptTensor& linear_bias,
                                         c10::string_view reduction, int64_t ignore_index, double label_smoothing,
                                         std::optional<double> softcap) {
    return torchops::linear_cross_entropy("linear_cross_entropy", kRows, input, linear_weight, target, linear_bias,
                                          reduction, options(ignore_index, label_smoothing, softcap), 0);
  }

  static at::Tensor linear_cross_entropy_chunked(const at::Tensor& input, const at::Tensor& linear_weight,
                                                 const at::Tensor& target, const OptTensor& linear_bias,
                                                 c10::string_view reduction, int64_t ignore_index,
                                                 double label_smoothing, std::optional<double> softcap,
                                                 int64_t chunk_size) {
    return torchops::linear_cross_entropy("_linear_cross_entropy_chunked", kRows, input, linear_weight, target,
                                          linear_bias, reduction, options(ignore_index, label_smoothing, softcap),
                                          chunk_size);
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward(
      const at::Tensor& input, const at::Tensor& linear_weight, const at::Tensor& target, const OptTensor& linear_bias,
      int64_t ignore_index, double label_smoothing, std::optional<double> softcap, const OptTensor& grad_scale,
      bool input_grad, bool weight_grad, bool bias_grad, int64_t chunk_size) {
    return linear_cross_entropy_forward("_linear_cross_entropy_forward", kRows, input, linear_weight, target,
                                        linear_bias, options(ignore_index, label_smoothing, softcap), grad_scale,
                                        input_grad, weight_grad, bias_grad, chunk_size);
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(
      const at::Tensor& grad_loss, const at::Tensor& input, const at::Tensor& linear_weight, const at::Tensor& target,
      const OptTensor& linear_bias, int64_t ignore_index, double label_smoothing, std::optional<double> softcap,
      bool input_grad, bool weight_grad, bool bias_grad, int64_t chunk_size) {
    return linear_cross_entropy_backward("_linear_cross_entropy_backward", kRows, grad_loss, input, linear_weight,
                                         target, linear_bias, options(ignore_index, label_smoothing, softcap),
                                         input_grad, weight_grad, bias_grad, chunk_size);
  }

  static at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target, c10::string_view reduction,
                                  int64_t ignore_index, double label_smoothing, std::optional<double> softcap) {
    return torchops::cross_entropy("cross_entropy", kRows, logits, target, reduction,
                                   options(ignore_index, label_smoothing, softcap));
  }

  static std::tuple<at::Tensor, at::Tensor> cross_entropy_forward(const at::Tensor& logits, const at::Tensor& target,
                                                                  int64_t ignore_index, double label_smoothing,
                                                                  std::optional<double> softcap) {
    return torchops::cross_entropy_forward("_cross_entropy_forward", kRows, logits, target,
                                           options(ignore_index, label_smoothing, softcap));
  }

  static at::Tensor cross_entropy_backward(const at::Tensor& grad_loss, const at::Tensor& logits,
                                           const at::Tensor& target, const at::Tensor& lse, int64_t ignore_index,
                                           double label_smoothing, std::optional<double> softcap) {
    return torchops::cross_entropy_backward("_cross_entropy_backward", kRows, grad_loss, logits, target, lse,
                                            options(ignore_index, label_smoothing, softcap));
  }

  static void register_kernels(torch::Library& m) {
    m.impl("linear_cross_entropy", &LossOps::linear_cross_entropy);
    m.impl("_linear_cross_entropy_chunked", &LossOps::linear_cross_entropy_chunked);
    m.impl("_linear_cross_entropy_forward", &LossOps::forward);
    m.impl("_linear_cross_entropy_backward", &LossOps::backward);
    m.impl("cross_entropy", &LossOps::cross_entropy);
    m.impl("_cross_entropy_forward", &LossOps::cross_entropy_forward);
    m.impl("_cross_entropy_backward", &LossOps::cross_entropy_backward);
  }
};

}  // namespace torchops
