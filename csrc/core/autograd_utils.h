// Helpers for the Autograd-key kernels: calling a myns op below autograd, and refusing autograd for
// out= variants the way built-in out= ops do. The graph node they record is in autograd_node.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/variable.h>
#include <c10/core/GradMode.h>

#include <initializer_list>
#include <mutex>
#include <optional>

#include "checks.h"

namespace torchops {

// Typed handle to a registered myns op.
template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// A myns op as a namespace-scope constant, `const OpRef<Sig> forward_op{"myns::_x_forward"};` called as
// `forward_op().call(...)`: looked up once, at the first call, since the op may be registered after this object.
template <typename Signature>
class OpRef {
 public:
  explicit OpRef(const char* name) : name_(name) {}

  const c10::TypedOperatorHandle<Signature>& operator()() const {
    std::call_once(once_, [this] { handle_.emplace(find_op<Signature>(name_)); });
    return *handle_;
  }

 private:
  const char* name_;
  mutable std::once_flag once_;
  mutable std::optional<c10::TypedOperatorHandle<Signature>> handle_;
};

// An optional tensor argument and the undefined tensor, each as the other: absent is undefined.
inline at::Tensor given_or_undefined(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }
inline std::optional<at::Tensor> optional_of(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// Whether autograd must record this call: grad mode on and some input requiring grad.
template <typename... Tensors>
bool needs_grad(const Tensors&... inputs) {
  return c10::GradMode::is_enabled() && ((inputs.defined() && inputs.requires_grad()) || ...);
}
inline bool needs_grad(std::initializer_list<at::Tensor> inputs) {
  if (!c10::GradMode::is_enabled()) return false;
  for (const at::Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

// Forward-mode AD keeps tangents at level 0, as PyTorch's generated kernels read them: torch.autograd.forward_ad
// and torch.func.jvp alike (nested jvp/jacfwd nest through functorch's per-level tensor wrappers, each
// carrying its own level-0 tangent).
constexpr uint64_t kForwardGradLevel = 0;

template <typename... Tensors>
bool has_forward_grad(const Tensors&... inputs) {
  return ((inputs.defined() && inputs._fw_grad(kForwardGradLevel).defined()) || ...);
}

// For an op without forward-mode AD: raises by name (the hint appended) when any tensor carries a tangent.
inline void refuse_forward_ad(const char* op, std::initializer_list<at::Tensor> tensors, const char* hint = "") {
  for (const at::Tensor& t : tensors) {
    TORCHOPS_CHECK(!has_forward_grad(t), op, "forward-mode AD is not supported", hint);
  }
}

// The tensor without its tangent (still tracked by backward-mode autograd).
inline at::Tensor forward_primal(const at::Tensor& t) {
  return t.defined() && t._fw_grad(kForwardGradLevel).defined() ? t._fw_primal(kForwardGradLevel) : t;
}

// An out= op records no graph: like torch's own out= ops, raise if any argument would need one
// (backward mode, or a forward-mode tangent that the write would silently drop).
inline void check_out_variant_not_differentiable(const char* op, std::initializer_list<NamedTensor> tensors) {
  for (const auto& t : tensors) {
    TORCHOPS_CHECK(!(c10::GradMode::is_enabled() && t.tensor.defined() && t.tensor.requires_grad()), op,
                   "out= variants don't support automatic differentiation, but ", t.name,
                   " requires grad; use the functional op instead");
    TORCHOPS_CHECK(!has_forward_grad(t.tensor), op, "out= variants don't support forward-mode AD, but ", t.name,
                   " has a tangent; use the functional op instead");
  }
}

}  // namespace torchops
