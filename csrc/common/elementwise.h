// Front halves of elementwise ops (vector_add, swiglu, swiglu_backward, ...), shared by the CPU and CUDA
// backends: validate, allocate or validate the output, then hand (a, b, out) to the backend's kernel.
//
// Any rank and any strides: a layout that does not collapse to kMaxDims dimensions (strided.h), which
// takes more than 16 dimensions that no stride pattern merges, is handed to the kernel as dense copies of
// the inputs (and, for out=, a dense result copied into `out`), a slower path that only such layouts take.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstddef>
#include <initializer_list>

#include "checks.h"
#include "strided.h"

namespace torchops {

// `kernel(a, b, out)` must write every element of `out`, a new dense tensor of a's shape made by
// `empty_like_dense(a)` (the backend's allocator, called directly: a small call can't afford a trip
// through the dispatcher for at::empty).
template <typename EmptyLikeDense, typename Kernel>
at::Tensor binary_elementwise(const char* op, NamedTensor a, NamedTensor b,
                              std::initializer_list<at::ScalarType> dtypes, EmptyLikeDense&& empty_like_dense,
                              Kernel&& kernel) {
  check_elementwise(op, {a, b}, dtypes);
  at::Tensor out = empty_like_dense(a.tensor);
  if (out.numel() == 0) return out;
  if (fits_strided_layout<3>({out, a.tensor, b.tensor})) {
    kernel(a.tensor, b.tensor, out);
  } else {
    kernel(a.tensor.contiguous(), b.tensor.contiguous(), out);  // all dense: one dimension
  }
  return out;
}

// Several outputs (e.g. swiglu_backward's two grads): `kernel(outs, ins)` must write every element of the
// kOut new dense tensors `outs` of inputs[0]'s shape and dtype from the kIn tensors `ins` (the inputs, or
// dense copies of them).
template <size_t kOut, size_t kIn, typename EmptyLikeDense, typename Kernel>
std::array<at::Tensor, kOut> multi_output_elementwise(const char* op, const NamedTensor (&inputs)[kIn],
                                                      std::initializer_list<at::ScalarType> dtypes,
                                                      EmptyLikeDense&& empty_like_dense, Kernel&& kernel) {
  check_elementwise(op, {inputs, inputs + kIn}, dtypes);
  std::array<at::Tensor, kOut> outs;
  for (auto& out : outs) out = empty_like_dense(inputs[0].tensor);
  if (outs[0].numel() == 0) return outs;
  std::array<at::Tensor, kOut + kIn> all;
  std::array<at::Tensor, kIn> ins;
  for (size_t k = 0; k < kOut; ++k) all[k] = outs[k];
  for (size_t k = 0; k < kIn; ++k) all[kOut + k] = ins[k] = inputs[k].tensor;
  if (!fits_strided_layout<static_cast<int>(kOut + kIn)>(all)) {
    for (auto& in : ins) in = in.contiguous();
  }
  kernel(outs, ins);
  return outs;
}

// out= form: `out` must match a and b exactly (no resizing) and may alias either of them exactly.
template <typename Kernel>
void binary_elementwise_out(const char* op, NamedTensor a, NamedTensor b, NamedTensor out,
                            std::initializer_list<at::ScalarType> dtypes, Kernel&& kernel) {
  check_elementwise(op, {a, b, out}, dtypes);
  check_out_overlap(op, out, {a, b});
  if (out.tensor.numel() == 0) return;
  if (fits_strided_layout<3>({out.tensor, a.tensor, b.tensor})) {
    kernel(a.tensor, b.tensor, out.tensor);
    return;
  }
  // A dense result in a's dense copy (an exact alias, which kernels allow), then copied into out.
  at::Tensor result = a.tensor.clone(at::MemoryFormat::Contiguous);
  kernel(result, b.tensor.contiguous(), result);
  out.tensor.copy_(result);
}

}  // namespace torchops
