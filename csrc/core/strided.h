// Strided iteration shared by the CPU and CUDA kernels: several tensors of one shape, each with its own
// strides, walked in the logical (row-major) order of that shape. Dimensions that are contiguous with
// their neighbour in every operand are merged first, so most layouts collapse to 1 or 2 dimensions.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>

#include "checks.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>

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

// The collapsed layout of tensors that all have `tensors[0]`'s shape, or nullopt when it needs more than
// kMaxDims dimensions. Size-1 dimensions are dropped; dimension d merges into d+1 when, for every operand,
// stride[d] == stride[d+1] * size[d+1].
template <int kOperands>
std::optional<StridedLayout<kOperands>> try_collapse_layout(const std::array<at::Tensor, kOperands>& tensors) {
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
    if (n == kMaxDims) return std::nullopt;
    layout.sizes[n] = shape[d];
    for (int k = 0; k < kOperands; ++k) layout.strides[k][n] = tensors[k].stride(d);
    layout.ndim = n + 1;
  }
  return layout;
}

// The kernels' form: a layout past kMaxDims raises. The front ends (elementwise.h) check
// fits_strided_layout first and give the kernels dense copies instead, so no op reaches the error.
template <int kOperands>
StridedLayout<kOperands> collapse_layout(const char* op, const std::array<at::Tensor, kOperands>& tensors) {
  auto layout = try_collapse_layout<kOperands>(tensors);
  if (!layout) fail_too_many_dims(op, kMaxDims);
  return *layout;
}

// Whether collapse_layout can represent `tensors`. Free for the usual case: a rank of at most kMaxDims
// always fits.
template <int kOperands>
bool fits_strided_layout(const std::array<at::Tensor, kOperands>& tensors) {
  return tensors[0].dim() <= kMaxDims || try_collapse_layout<kOperands>(tensors).has_value();
}

// Operand k's stride along the innermost dimension (1 for a single element).
template <int kOperands>
int64_t inner_stride(const StridedLayout<kOperands>& layout, int operand) {
  return layout.ndim == 0 ? 1 : layout.strides[operand][layout.ndim - 1];
}

// CPU loops: calls fn(offsets, run) for consecutive runs of the innermost dimension that together cover
// the logical elements [begin, end). offsets[k] is operand k's element offset of the run's first
// element; inside a run, operand k steps by inner_stride(layout, k). An odometer over the outer
// dimensions, so a chunk of at::parallel_for may start and end mid-run.
template <int kOperands, typename Fn>
void for_each_run(const StridedLayout<kOperands>& layout, int64_t begin, int64_t end, Fn&& fn) {
  if (begin >= end) return;
  if (layout.ndim == 0) {
    const int64_t zero[kOperands] = {};
    fn(zero, int64_t{1});
    return;
  }
  const int inner = layout.ndim - 1;
  const int64_t inner_size = layout.sizes[inner];
  int64_t index[kMaxDims];
  int64_t rest = begin;
  for (int d = inner; d >= 0; --d) {
    index[d] = rest % layout.sizes[d];
    rest /= layout.sizes[d];
  }
  for (int64_t pos = begin; pos < end;) {
    int64_t offsets[kOperands] = {};
    for (int d = 0; d <= inner; ++d) {
      for (int k = 0; k < kOperands; ++k) offsets[k] += index[d] * layout.strides[k][d];
    }
    const int64_t run = std::min(inner_size - index[inner], end - pos);
    fn(offsets, run);
    pos += run;
    index[inner] += run;
    for (int d = inner; d > 0 && index[d] == layout.sizes[d]; --d) {
      index[d] = 0;
      ++index[d - 1];
    }
  }
}

// A layout seen as `rows` rows of `cols` elements with unit stride inside a row in every operand, e.g.
// both halves of x.chunk(2, -1) (row stride 2H) next to a dense output (row stride H).
template <int kOperands>
struct RowsView {
  int64_t rows = 1;
  int64_t cols = 1;
  int64_t row_stride[kOperands] = {};  // elements between consecutive rows, per operand
};

// The rows view of a collapsed layout of at most 2 dimensions whose innermost stride is 1 everywhere;
// nullopt for any other layout (transposed, sliced, 3+ unmergeable dimensions).
template <int kOperands>
std::optional<RowsView<kOperands>> as_rows(const StridedLayout<kOperands>& layout) {
  if (layout.ndim > 2) return std::nullopt;
  RowsView<kOperands> view;
  if (layout.ndim == 0) return view;
  const int inner = layout.ndim - 1;
  for (int k = 0; k < kOperands; ++k) {
    if (layout.strides[k][inner] != 1) return std::nullopt;
  }
  view.cols = layout.sizes[inner];
  if (layout.ndim == 2) {
    view.rows = layout.sizes[0];
    for (int k = 0; k < kOperands; ++k) view.row_stride[k] = layout.strides[k][0];
  }
  return view;
}

}  // namespace torchops
