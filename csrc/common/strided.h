// Strided iteration shared by the CPU and CUDA kernels: several tensors of one shape, each with its own
// strides, walked in the logical (row-major) order of that shape. Dimensions that are contiguous with
// their neighbour in every operand are merged first, so most layouts collapse to 1 or 2 dimensions.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>

#include "checks.h"

#include <array>
#include <cstdint>
#include <initializer_list>

namespace torchops {

constexpr int kMaxDims = 16;

template <int kOperands>
struct StridedLayout {
  int ndim = 0;                                  // 0 means a single element (0-dim or all sizes 1)
  int64_t sizes[kMaxDims];                       // innermost dimension last
  int64_t strides[kOperands][kMaxDims];          // in elements

  bool is_contiguous(int operand) const {
    int64_t expected = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      if (strides[operand][d] != expected) return false;
      expected *= sizes[d];
    }
    return true;
  }
};

// Builds the collapsed layout of tensors that all have `tensors[0]`'s shape. Size-1 dimensions are
// dropped; dimension d merges into d+1 when, for every operand, stride[d] == stride[d+1] * size[d+1].
template <int kOperands>
StridedLayout<kOperands> collapse_layout(const char* op, const std::array<at::Tensor, kOperands>& tensors) {
  StridedLayout<kOperands> layout;
  const auto shape = tensors[0].sizes();
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (shape[d] == 1) continue;
    const int n = layout.ndim;
    bool merge = n > 0;
    for (int k = 0; k < kOperands && merge; ++k) {
      merge = layout.strides[k][n - 1] == tensors[k].stride(d) * shape[d];
    }
    if (merge) {
      layout.sizes[n - 1] *= shape[d];
      for (int k = 0; k < kOperands; ++k) layout.strides[k][n - 1] = tensors[k].stride(d);
      continue;
    }
    if (n == kMaxDims) fail_too_many_dims(op, kMaxDims);
    layout.sizes[n] = shape[d];
    for (int k = 0; k < kOperands; ++k) layout.strides[k][n] = tensors[k].stride(d);
    layout.ndim = n + 1;
  }
  return layout;
}

}  // namespace torchops
