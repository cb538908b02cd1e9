// Shared front half of normalisations over the last dimension (rms_norm; layer_norm would fit too), used
// by the CPU and CUDA backends alike: argument checks, the rows x cols view of an input, output shapes.
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

// check_norm_input, plus `other` (a residual, a gradient added to dx) of input's shape, dtype and device.
void check_norm_input_pair(const char* op, NamedTensor input, NamedTensor other,
                           const std::optional<at::Tensor>& weight, double weight_offset);

// Backward arguments: input and weight as above; grad_out like input (shape, dtype, device); `stat` (rstd,
// mean, ...) of shape input.shape[:-1] and dtype float32 (float64 for float64 input) on input's device;
// weight_grad only with a weight.
void check_norm_backward(const char* op, NamedTensor grad_out, NamedTensor input,
                         const std::optional<at::Tensor>& weight, NamedTensor stat, bool weight_grad,
                         double weight_offset);

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

// Outputs of a backward op: (grad_input of input's shape, grad_weight of weight's), each a [0]-shaped
// placeholder of its dtype when not requested. empty(sizes, dtype) is the backend's dense allocator.
template <typename Empty>
std::tuple<at::Tensor, at::Tensor> norm_backward_outputs(const at::Tensor& input, const at::Tensor& weight,
                                                         bool input_grad, bool weight_grad, Empty&& empty) {
  const auto weight_dtype = weight.defined() ? weight.scalar_type() : input.scalar_type();
  return {input_grad ? empty(input.sizes(), input.scalar_type()) : empty({0}, input.scalar_type()),
          weight_grad ? empty(weight.sizes(), weight_dtype) : empty({0}, weight_dtype)};
}

}  // namespace torchops
