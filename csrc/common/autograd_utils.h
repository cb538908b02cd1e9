// Helpers for the Autograd-key kernels: calling a myns op below autograd, and refusing autograd for
// out= variants the way built-in out= ops do.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/variable.h>
#include <c10/core/GradMode.h>

#include <initializer_list>

#include "checks.h"

namespace torchops {

// Typed handle to a registered myns op, looked up once.
template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// Whether autograd must record this call: grad mode on and some input requiring grad.
template <typename... Tensors>
bool needs_grad(const Tensors&... inputs) {
  return c10::GradMode::is_enabled() && ((inputs.defined() && inputs.requires_grad()) || ...);
}

// An out= op records no graph: like torch's own out= ops, raise if any argument would need one.
inline void check_out_variant_not_differentiable(const char* op, std::initializer_list<NamedTensor> tensors) {
  if (!c10::GradMode::is_enabled()) return;
  for (const auto& t : tensors) {
    TORCHOPS_CHECK(!(t.tensor.defined() && t.tensor.requires_grad()), op,
                   "out= variants don't support automatic differentiation, but ", t.name,
                   " requires grad; use the functional op instead");
  }
}

}  // namespace torchops
