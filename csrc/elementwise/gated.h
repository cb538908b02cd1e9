// The gated-activation family (swiglu, gelu_and_mul): act(gate) * up and its backward, for any backend.
// The activations are the functors of activations.h; a backend (cpu/gated.cpp, cuda/gated.cu) supplies
// its allocator and its engine as a `Backend` struct:
//   static at::Tensor empty_like_dense(const at::Tensor&);
//   template <template <typename, bool> class Family, typename Act, size_t N>
//   static void run(const char* op, const std::array<at::Tensor, N>& operands);  // dispatch + engine
// and registers GatedOps<Backend>. A new gated activation is its functor in activations.h plus its rows in
// GatedOps below (and its schema, fake kernel, wrapper, autograd spec: README "Adding an op").
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <array>
#include <tuple>

#include "activations.h"
#include "../core/checks.h"
#include "../core/dispatch.h"
#include "elementwise.h"

namespace torchops {

template <typename Backend, typename Act>
at::Tensor gated_forward(const char* op, const at::Tensor& gate, const at::Tensor& up) {
  return elementwise(op, {{"gate", gate}, {"up", up}}, {TORCHOPS_FLOAT_DTYPES}, Backend::empty_like_dense,
                     [op](const Operands<1, 2>& operands) { Backend::template run<GatedForward, Act>(op, operands); });
}

template <typename Backend, typename Act>
std::tuple<at::Tensor, at::Tensor> gated_backward(const char* op, const at::Tensor& grad_out, const at::Tensor& gate,
                                                  const at::Tensor& up) {
  auto grads = elementwise_outputs<2>(
      op, {{"grad_out", grad_out}, {"gate", gate}, {"up", up}}, {TORCHOPS_FLOAT_DTYPES}, Backend::empty_like_dense,
      [op](const Operands<2, 3>& operands) { Backend::template run<GatedBackward, Act>(op, operands); });
  return {std::move(grads[0]), std::move(grads[1])};
}

// The family's schemas' kernels on one backend: one row per op.
template <typename Backend>
struct GatedOps {
  static at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
    return gated_forward<Backend, Silu>("swiglu", gate, up);
  }
  static std::tuple<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad_out, const at::Tensor& gate,
                                                            const at::Tensor& up) {
    return gated_backward<Backend, Silu>("swiglu_backward", grad_out, gate, up);
  }
  static at::Tensor gelu_and_mul(const at::Tensor& gate, const at::Tensor& up, c10::string_view approximate) {
    return gelu_uses_tanh("gelu_and_mul", approximate) ? gated_forward<Backend, GeluTanh>("gelu_and_mul", gate, up)
                                                       : gated_forward<Backend, GeluErf>("gelu_and_mul", gate, up);
  }
  static std::tuple<at::Tensor, at::Tensor> gelu_and_mul_backward(const at::Tensor& grad_out, const at::Tensor& gate,
                                                                  const at::Tensor& up, c10::string_view approximate) {
    constexpr const char* op = "gelu_and_mul_backward";
    return gelu_uses_tanh(op, approximate) ? gated_backward<Backend, GeluTanh>(op, grad_out, gate, up)
                                           : gated_backward<Backend, GeluErf>(op, grad_out, gate, up);
  }

  static void register_kernels(torch::Library& m) {
    m.impl("swiglu", &swiglu);
    m.impl("swiglu_backward", &swiglu_backward);
    m.impl("gelu_and_mul", &gelu_and_mul);
    m.impl("gelu_and_mul_backward", &gelu_and_mul_backward);
  }
};

}  // namespace torchops
