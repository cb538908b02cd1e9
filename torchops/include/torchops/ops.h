// torchops from C++: typed entry points for the public myns ops, each a call through the PyTorch dispatcher
// (so autograd, CPU and CUDA kernels, and errors behave as torch.ops.myns.<op> does in Python).
//
// Link libtorchops.so (CMake: find_package(torchops) + target_link_libraries(app torchops::torchops)): its
// static initialisers register the ops. Bad input throws c10::Error with the same message as Python's
// RuntimeError ("myns::<op>: ..."); an op the loaded library lacks throws c10::Error on its first call.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>

namespace torchops {
namespace detail {

// The dispatcher handle of myns::<name>, typed by the C++ signature Fn. Looked up on the first call (after
// static initialisation registered the op) and checked against the registered schema: a signature that
// disagrees with the schema throws instead of calling the kernel with the wrong arguments.
template <class Fn>
c10::TypedOperatorHandle<Fn> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

}  // namespace detail

// One entry point per public op. Each mirrors the op's schema in csrc/ops.cpp (defaults included) and holds
// its handle in a function-local static; a new op or a changed schema is one such function here.
#define TORCHOPS_CALL(name, ...)                                                     \
  [&] {                                                                              \
    static const auto op = ::torchops::detail::find_op<decltype(name)>("myns::" #name); \
    return op.call(__VA_ARGS__);                                                     \
  }()

// a + b (same shape, dtype and device); a new contiguous tensor.
inline at::Tensor vector_add(const at::Tensor& a, const at::Tensor& b) {
  return TORCHOPS_CALL(vector_add, a, b);
}

// Writes a + b into out (which may be a or b).
inline void vector_add_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  TORCHOPS_CALL(vector_add_out, a, b, out);
}

// silu(gate) * up.
inline at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  return TORCHOPS_CALL(swiglu, gate, up);
}

// gelu(gate) * up, gelu as F.gelu with approximate "none" (erf) or "tanh".
inline at::Tensor gelu_and_mul(const at::Tensor& gate, const at::Tensor& up, c10::string_view approximate = "none") {
  return TORCHOPS_CALL(gelu_and_mul, gate, up, approximate);
}

// A @ dense for the M x K CSR matrix A = (crow_indices, col_indices, values), K = dense.size(0).
inline at::Tensor csr_spmm(const at::Tensor& crow_indices, const at::Tensor& col_indices, const at::Tensor& values,
                           const at::Tensor& dense) {
  return TORCHOPS_CALL(csr_spmm, crow_indices, col_indices, values, dense);
}

// input * rsqrt(mean(input^2, -1) + eps) * weight, over the last dimension.
inline at::Tensor rms_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight = std::nullopt,
                           double eps = 1e-6, double weight_offset = 0.0) {
  return TORCHOPS_CALL(rms_norm, input, weight, eps, weight_offset);
}

// residual_out = input + residual; out = rms_norm(residual_out, weight, eps, weight_offset).
inline std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& input, const at::Tensor& residual,
                                                       const std::optional<at::Tensor>& weight = std::nullopt,
                                                       double eps = 1e-6, double weight_offset = 0.0) {
  return TORCHOPS_CALL(add_rms_norm, input, residual, weight, eps, weight_offset);
}

#undef TORCHOPS_CALL

}  // namespace torchops
