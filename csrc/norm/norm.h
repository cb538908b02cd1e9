// Shared front half of the normalisations over the last dimension (rms_norm, add_rms_norm, layer_norm), used by
// the CPU and CUDA backends alike: argument checks, the rows x cols view of an input, the arguments of one
// forward or backward call.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

#include "../core/checks.h"
#include "../core/dispatch.h"

namespace torchops {

// input: a float tensor with at least one dimension and a non-empty last dimension N. weight (when given):
// 1-D of size N on input's device, of input's dtype, or float32 when input is float16/bfloat16. A non-zero
// weight_offset needs a weight (it offsets the weight; without one there is nothing to offset, and silently
// ignoring it would hide a mistake).
void check_norm_input(const char* op, NamedTensor input, const std::optional<at::Tensor>& weight,
                      double weight_offset);

// check_norm_input for layer_norm: bias (when given) follows weight's rule, and has weight's dtype when both are.
void check_layer_norm_input(const char* op, NamedTensor input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias);

// A backend's longest row (elements), checked under the op's name; INT64_MAX: no limit.
void check_norm_row_limit(const char* op, NamedTensor input, int64_t max_row);

// check_norm_input, plus `other` (a residual, a gradient added to dx) of input's shape, dtype and device.
void check_norm_input_pair(const char* op, NamedTensor input, NamedTensor other,
                           const std::optional<at::Tensor>& weight, double weight_offset);

// Backward arguments: input and weight as above; grad_out like input (shape, dtype, device); `stat` (rstd,
// mean, ...) of shape input.shape[:-1] and dtype float32 (float64 for float64 input) on input's device;
// weight_grad only with a weight.
void check_norm_backward(const char* op, NamedTensor grad_out, NamedTensor input,
                         const std::optional<at::Tensor>& weight, NamedTensor stat, bool weight_grad,
                         double weight_offset);

// A per-row statistic (rstd, mean) of input's leading shape and the stat dtype, on input's device.
void check_norm_stat(const char* op, NamedTensor input, NamedTensor stat);

// What a norm does with a row x: rms_norm scales it, x * rstd (rstd = 1 / sqrt(mean(x^2) + eps)); layer_norm
// centres it, (x - mean) * rstd (rstd = 1 / sqrt(var + eps), the biased variance), then adds the bias.
enum class NormKind { kRms, kLayer };

// One forward call, as the entry points (norm_ops.h) hand it to a backend. Tensors are undefined where absent
// or not wanted; outputs are dense and allocated.
struct NormForward {
  NormKind kind = NormKind::kRms;
  at::Tensor input, residual;  // residual: add_rms_norm (then residual_out = input + residual is normalised)
  at::Tensor weight, bias;     // dense 1-D
  double eps = 0.0, weight_offset = 0.0;
  at::Tensor out, residual_out;
  at::Tensor mean, rstd;  // per row, when saved for the backward (mean: layer_norm)
};

// One backward call: the gradients of the rows `input` (add_rms_norm: residual_out) normalised with the saved
// statistics. grad_residual_out (add_rms_norm) is added to grad_input. Outputs are allocated where wanted and
// undefined otherwise.
struct NormBackward {
  NormKind kind = NormKind::kRms;
  at::Tensor grad_out, input, grad_residual_out;
  at::Tensor weight, mean, rstd;
  double weight_offset = 0.0;
  at::Tensor grad_input, grad_weight, grad_bias;
};

// Dtype of per-row statistics (rstd) and of dweight accumulation: float64 for float64, else float32.
inline at::ScalarType norm_stat_dtype(at::ScalarType input) {
  return input == at::kDouble ? at::kDouble : at::kFloat;
}

// A tensor of shape [..., N] read as `rows` rows of `cols` = N contiguous elements, row r starting at
// element r * row_stride. `tensor` is the argument itself when its leading dimensions collapse to one
// stride and its last dimension is dense (any row stride, including 0 for a broadcast row), otherwise a
// contiguous copy: that costs one extra read and write of the input, but keeps the kernels to a single
// row layout (such inputs -- e.g. a transposed matrix -- are rare in practice).
struct NormRows {
  at::Tensor tensor;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
};

NormRows norm_rows(const at::Tensor& t);

// The weight as a dense 1-D tensor (a copy only when it is strided), or an undefined tensor when absent.
at::Tensor dense_weight(const std::optional<at::Tensor>& weight);

// Calls fn(T{}, W{}) for the input's dtype T, with W = T, or W = float for a float32 weight with 16-bit input.
template <typename Fn>
void dispatch_norm_types(at::ScalarType input, const at::Tensor& weight, Fn&& fn) {
  TORCHOPS_DISPATCH_FLOAT_TYPES(input, "norm", [&] {
    if constexpr (is_16bit_float<scalar_t>) {
      if (weight.defined() && weight.scalar_type() == at::kFloat) return fn(scalar_t{}, float{});
    }
    fn(scalar_t{}, scalar_t{});
  });
}

}  // namespace torchops
