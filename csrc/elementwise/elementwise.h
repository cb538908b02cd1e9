// The front half of the elementwise engine, shared by its CPU and CUDA backends: validate, allocate or
// validate the outputs, then hand the operands to the backend as one array, outputs first: (outs..., ins...),
// the order the engines collapse and walk them in. The array is built once per call and passed by
// reference, so a small call pays one reference count per operand.
//
// A backend (cpu::Backend in cpu_elementwise.h, cuda::Backend in cuda_elementwise.cuh) is
//   static at::Tensor empty_like_dense(const at::Tensor&);       its allocator, called directly: a small
//                                                                call can't afford a dispatcher trip
//   template <typename Op> static void run(const char* op, const Operands<Op::kOut, Op::kIn>&);
//                                                                Op's dtype dispatch and its engine
//
// Any rank and any strides: a layout that does not collapse to kMaxDims dimensions (strided.h), which
// takes more than 16 dimensions that no stride pattern merges, is handed to the kernel as dense copies of
// the inputs (and, for out=, a dense result copied into `out`), a slower path that only such layouts take.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <array>
#include <cstddef>
#include <utility>

#include "../core/checks.h"
#include "../core/dispatch.h"
#include "../core/strided.h"

namespace torchops {

// (outs..., ins...): what an engine takes.
template <size_t kOut, size_t kIn>
using Operands = std::array<at::Tensor, kOut + kIn>;

// The usual elementwise contract (check_elementwise) over Op's dtypes: core/dispatch.h's float list, and its
// int list when Op::kIntegers. dispatch_elementwise dispatches over the same list.
template <typename Op>
void check_elementwise_args(const char* op, c10::ArrayRef<NamedTensor> tensors) {
  if constexpr (Op::kIntegers) {
    check_elementwise(op, tensors, {TORCHOPS_FLOAT_AND_INT_DTYPES});
  } else {
    check_elementwise(op, tensors, {TORCHOPS_FLOAT_DTYPES});
  }
}

// fn(T{}) for the storage type T of `dtype`, one of Op's dtypes.
template <typename Op, typename Fn>
void dispatch_elementwise(at::ScalarType dtype, Fn&& fn) {
  if constexpr (Op::kIntegers) {
    TORCHOPS_DISPATCH_FLOAT_AND_INT_TYPES(dtype, "elementwise", [&] { fn(scalar_t{}); });
  } else {
    TORCHOPS_DISPATCH_FLOAT_TYPES(dtype, "elementwise", [&] { fn(scalar_t{}); });
  }
}

// Op's kOut new dense outputs of inputs[0]'s shape and dtype, from its kIn inputs.
template <typename Op, typename Backend, size_t kIn>
std::array<at::Tensor, Op::kOut> elementwise_outputs(const char* op, const NamedTensor (&inputs)[kIn]) {
  constexpr size_t kOut = Op::kOut;
  static_assert(kIn == Op::kIn, "one named tensor per input of the functor");
  check_elementwise_args<Op>(op, {inputs, inputs + kIn});
  Operands<kOut, kIn> operands;
  for (size_t k = 0; k < kOut; ++k) operands[k] = Backend::empty_like_dense(inputs[0].tensor);
  if (operands[0].numel() != 0) {
    for (size_t k = 0; k < kIn; ++k) operands[kOut + k] = inputs[k].tensor;
    if (!fits_strided_layout<static_cast<int>(kOut + kIn)>(operands)) {
      for (size_t k = kOut; k < kOut + kIn; ++k) operands[k] = operands[k].contiguous();  // all dense: one dimension
    }
    Backend::template run<Op>(op, std::as_const(operands));
  }
  std::array<at::Tensor, kOut> outs;
  for (size_t k = 0; k < kOut; ++k) outs[k] = std::move(operands[k]);
  return outs;
}

// One output: the form of most ops.
template <typename Op, typename Backend, size_t kIn>
at::Tensor elementwise(const char* op, const NamedTensor (&inputs)[kIn]) {
  return std::move(elementwise_outputs<Op, Backend>(op, inputs)[0]);
}

// out= form: Op's kOut results written into `outs`, which take inputs[0]'s dtype and device, are resized to
// its shape as torch's out= ops resize theirs, and may each alias an input exactly (every path reads an
// element and writes it in the same thread) but share no element with each other.
template <typename Op, typename Backend, size_t kIn>
void elementwise_out(const char* op, const NamedTensor (&inputs)[kIn], const NamedTensor (&outs)[Op::kOut]) {
  constexpr size_t kOut = Op::kOut;
  static_assert(kIn == Op::kIn, "one named tensor per input of the functor");
  check_elementwise_args<Op>(op, {inputs, inputs + kIn});
  for (const auto& out : outs) check_and_resize_out(op, out, inputs[0]);
  for (size_t k = 0; k < kOut; ++k) check_out_overlap(op, outs[k], {inputs, inputs + kIn}, {outs, outs + k});
  if (outs[0].tensor.numel() == 0) return;
  Operands<kOut, kIn> operands;
  for (size_t k = 0; k < kOut; ++k) operands[k] = outs[k].tensor;
  for (size_t k = 0; k < kIn; ++k) operands[kOut + k] = inputs[k].tensor;
  if (fits_strided_layout<static_cast<int>(kOut + kIn)>(operands)) {
    Backend::template run<Op>(op, std::as_const(operands));
    return;
  }
  // Dense results of dense copies of the inputs, then copied into outs.
  for (size_t k = 0; k < kOut; ++k) operands[k] = Backend::empty_like_dense(inputs[0].tensor);
  for (size_t k = kOut; k < kOut + kIn; ++k) operands[k] = operands[k].contiguous();
  Backend::template run<Op>(op, std::as_const(operands));
  for (size_t k = 0; k < kOut; ++k) outs[k].tensor.copy_(operands[k]);
}

// The kernels of a binary row (activations.h) on a backend: op(a, b) and op_out(a, b, out).
template <typename Backend, typename Row>
struct BinaryKernels {
  using Op = typename Row::Op;

  static at::Tensor forward(const at::Tensor& a, const at::Tensor& b) {
    return elementwise<Op, Backend>(Row::kName, {{"a", a}, {"b", b}});
  }

  static void forward_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
    elementwise_out<Op, Backend>(Row::kOutName, {{"a", a}, {"b", b}}, {{"out", out}});
  }

  static void register_kernels(torch::Library& m) {
    m.impl(Row::kName, &forward);
    m.impl(Row::kOutName, &forward_out);
  }
};

}  // namespace torchops
