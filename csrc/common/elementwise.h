// Front halves of elementwise ops (vector_add, swiglu, swiglu_backward, ...), shared by the CPU and CUDA
// backends: validate, allocate or validate the output, then hand (a, b, out) to the backend's kernel.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <initializer_list>

#include "checks.h"

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
  if (out.numel() > 0) kernel(a.tensor, b.tensor, out);
  return out;
}

// Several outputs (e.g. swiglu_backward's two grads): `kernel(outs)` must write every element of the
// kOut new dense tensors of inputs[0]'s shape and dtype (the kernel captures the inputs itself).
template <size_t kOut, typename EmptyLikeDense, typename Kernel>
std::array<at::Tensor, kOut> multi_output_elementwise(const char* op, std::initializer_list<NamedTensor> inputs,
                                                      std::initializer_list<at::ScalarType> dtypes,
                                                      EmptyLikeDense&& empty_like_dense, Kernel&& kernel) {
  check_elementwise(op, inputs, dtypes);
  std::array<at::Tensor, kOut> outs;
  for (auto& out : outs) out = empty_like_dense(inputs.begin()->tensor);
  if (outs[0].numel() > 0) kernel(outs);
  return outs;
}

// out= form: `out` must match a and b exactly (no resizing) and may alias either of them exactly.
template <typename Kernel>
void binary_elementwise_out(const char* op, NamedTensor a, NamedTensor b, NamedTensor out,
                            std::initializer_list<at::ScalarType> dtypes, Kernel&& kernel) {
  check_elementwise(op, {a, b, out}, dtypes);
  check_out_overlap(op, out, {a, b});
  if (out.tensor.numel() > 0) kernel(a.tensor, b.tensor, out.tensor);
}

}  // namespace torchops
