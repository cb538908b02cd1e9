// The gated-activation family, act(gate) * up and its backward, on any backend of the elementwise engine
// (elementwise.h): the kernels of every row of GatedFamily (activations.h), registered by
// register_gated_kernels<Backend>(m) from a backend's TORCH_LIBRARY_IMPL block.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <tuple>
#include <utility>

#include "activations.h"
#include "elementwise.h"

namespace torchops {

template <typename Backend, typename Row, typename Extra = typename Row::Extra>
struct GatedKernels;

template <typename Backend, typename Row, typename... Extra>
struct GatedKernels<Backend, Row, ExtraArgs<Extra...>> {
  static at::Tensor forward(const at::Tensor& gate, const at::Tensor& up, Extra... extra) {
    return Row::with_form(
        Row::kName,
        [&](auto act, GatedNodes) {
          return elementwise<GatedForward<decltype(act)>, Backend>(Row::kName, {{"gate", gate}, {"up", up}});
        },
        extra...);
  }

  static std::tuple<at::Tensor, at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& gate,
                                                     const at::Tensor& up, Extra... extra) {
    return Row::with_form(
        Row::kBackwardName,
        [&](auto act, GatedNodes) {
          auto grads = elementwise_outputs<GatedBackward<decltype(act)>, Backend>(
              Row::kBackwardName, {{"grad_out", grad_out}, {"gate", gate}, {"up", up}});
          return std::tuple<at::Tensor, at::Tensor>(std::move(grads[0]), std::move(grads[1]));
        },
        extra...);
  }

  static void backward_out(const at::Tensor& grad_out, const at::Tensor& gate, const at::Tensor& up, Extra... extra,
                           const at::Tensor& grad_gate, const at::Tensor& grad_up) {
    Row::with_form(
        Row::kBackwardOutName,
        [&](auto act, GatedNodes) {
          elementwise_out<GatedBackward<decltype(act)>, Backend>(
              Row::kBackwardOutName, {{"grad_out", grad_out}, {"gate", gate}, {"up", up}},
              {{"grad_gate", grad_gate}, {"grad_up", grad_up}});
        },
        extra...);
  }

  static void register_kernels(torch::Library& m) {
    m.impl(Row::kName, &forward);
    m.impl(Row::kBackwardName, &backward);
    m.impl(Row::kBackwardOutName, &backward_out);
  }
};

template <typename Backend>
void register_gated_kernels(torch::Library& m) {
  std::apply([&m](auto... rows) { (GatedKernels<Backend, decltype(rows)>::register_kernels(m), ...); },
             GatedFamily{});
}

}  // namespace torchops
