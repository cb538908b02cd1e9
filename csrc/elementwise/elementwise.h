// Front halves of elementwise ops (vector_add, swiglu, gelu_and_mul and their backwards), shared by the CPU
// and CUDA backends: validate, allocate or validate the outputs, then hand the operands to the backend's
// engine (cpu_elementwise.h, cuda_elementwise.cuh) as one array, outputs first: (outs..., ins...), the
// order the engines collapse and walk them in. The array is built once per call and passed by reference,
// so a small call pays one reference count per operand (vector_add's host cost is at torch.add's).
//
// Any rank and any strides: a layout that does not collapse to kMaxDims dimensions (strided.h), which
// takes more than 16 dimensions that no stride pattern merges, is handed to the kernel as dense copies of
// the inputs (and, for out=, a dense result copied into `out`), a slower path that only such layouts take.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstddef>
#include <initializer_list>
#include <utility>

#include "../core/checks.h"
#include "../core/strided.h"

namespace torchops {

// (outs..., ins...): what an engine takes.
template <size_t kOut, size_t kIn>
using Operands = std::array<at::Tensor, kOut + kIn>;

// kOut new dense outputs of inputs[0]'s shape and dtype (made by `empty_like_dense`, the backend's
// allocator, called directly: a small call can't afford a trip through the dispatcher for at::empty) from
// the kIn inputs. `kernel(operands)` must write every element of the outputs.
template <size_t kOut, size_t kIn, typename EmptyLikeDense, typename Kernel>
std::array<at::Tensor, kOut> elementwise_outputs(const char* op, const NamedTensor (&inputs)[kIn],
                                                 std::initializer_list<at::ScalarType> dtypes,
                                                 EmptyLikeDense&& empty_like_dense, Kernel&& kernel) {
  check_elementwise(op, {inputs, inputs + kIn}, dtypes);
  Operands<kOut, kIn> operands;
  for (size_t k = 0; k < kOut; ++k) operands[k] = empty_like_dense(inputs[0].tensor);
  if (operands[0].numel() != 0) {
    for (size_t k = 0; k < kIn; ++k) operands[kOut + k] = inputs[k].tensor;
    if (!fits_strided_layout<static_cast<int>(kOut + kIn)>(operands)) {
      for (size_t k = kOut; k < kOut + kIn; ++k) operands[k] = operands[k].contiguous();  // all dense: one dimension
    }
    kernel(std::as_const(operands));
  }
  std::array<at::Tensor, kOut> outs;
  for (size_t k = 0; k < kOut; ++k) outs[k] = std::move(operands[k]);
  return outs;
}

// One output: the form of most ops.
template <size_t kIn, typename EmptyLikeDense, typename Kernel>
at::Tensor elementwise(const char* op, const NamedTensor (&inputs)[kIn], std::initializer_list<at::ScalarType> dtypes,
                       EmptyLikeDense&& empty_like_dense, Kernel&& kernel) {
  return std::move(elementwise_outputs<1, kIn>(op, inputs, dtypes, empty_like_dense, kernel)[0]);
}

// out= form of a binary op: `out` must match a and b exactly (no resizing) and may alias either of them
// exactly (each element is read before it is written, by the same thread).
template <typename Kernel>
void binary_elementwise_out(const char* op, NamedTensor a, NamedTensor b, NamedTensor out,
                            std::initializer_list<at::ScalarType> dtypes, Kernel&& kernel) {
  check_elementwise(op, {a, b, out}, dtypes);
  check_out_overlap(op, out, {a, b});
  if (out.tensor.numel() == 0) return;
  const Operands<1, 2> operands{out.tensor, a.tensor, b.tensor};
  if (fits_strided_layout<3>(operands)) {
    kernel(operands);
    return;
  }
  // A dense result in a's dense copy (an exact alias, which kernels allow), then copied into out.
  at::Tensor result = a.tensor.clone(at::MemoryFormat::Contiguous);
  kernel(Operands<1, 2>{result, result, b.tensor.contiguous()});
  out.tensor.copy_(result);
}

}  // namespace torchops
