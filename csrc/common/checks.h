// Input validation shared by every op. Each failure is a RuntimeError (TORCH_CHECK) whose message starts
// with "myns::<op>: " and names the argument, so a user can tell which call and which tensor was wrong.
#pragma once

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <string>

namespace torchops {

#define TORCHOPS_CHECK(cond, op, ...) TORCH_CHECK((cond), "myns::", op, ": ", __VA_ARGS__)

// A tensor argument together with the name the schema gives it.
struct NamedTensor {
  const char* name;
  const at::Tensor& tensor;
};

inline std::string dtype_list(std::initializer_list<at::ScalarType> dtypes) {
  std::string s;
  for (auto t : dtypes) {
    if (!s.empty()) s += ", ";
    s += c10::toString(t);
  }
  return s;
}

inline void check_defined(const char* op, NamedTensor t) {
  TORCHOPS_CHECK(t.tensor.defined(), op, t.name, " must be a defined tensor");
}

inline void check_dtype_in(const char* op, NamedTensor t, std::initializer_list<at::ScalarType> allowed) {
  for (auto d : allowed) {
    if (t.tensor.scalar_type() == d) return;
  }
  TORCHOPS_CHECK(false, op, t.name, " has unsupported dtype ", t.tensor.scalar_type(),
                 "; supported: ", dtype_list(allowed));
}

inline void check_same_shape(const char* op, NamedTensor x, NamedTensor y) {
  TORCHOPS_CHECK(x.tensor.sizes().equals(y.tensor.sizes()), op, x.name, " and ", y.name,
                 " must have the same shape, got ", x.tensor.sizes(), " and ", y.tensor.sizes());
}

inline void check_same_dtype(const char* op, NamedTensor x, NamedTensor y) {
  TORCHOPS_CHECK(x.tensor.scalar_type() == y.tensor.scalar_type(), op, x.name, " and ", y.name,
                 " must have the same dtype, got ", x.tensor.scalar_type(), " and ", y.tensor.scalar_type());
}

inline void check_same_device(const char* op, NamedTensor x, NamedTensor y) {
  TORCHOPS_CHECK(x.tensor.device() == y.tensor.device(), op, x.name, " and ", y.name,
                 " must be on the same device, got ", x.tensor.device(), " and ", y.tensor.device());
}

// The usual contract of an elementwise op: every tensor defined, same shape, dtype and device as the first,
// and the first's dtype among `allowed`.
inline void check_elementwise(const char* op, std::initializer_list<NamedTensor> tensors,
                              std::initializer_list<at::ScalarType> allowed) {
  const NamedTensor& first = *tensors.begin();
  for (const auto& t : tensors) check_defined(op, t);
  for (const auto& t : tensors) {
    if (&t == &first) continue;
    check_same_device(op, first, t);
    check_same_dtype(op, first, t);
    check_same_shape(op, first, t);
  }
  check_dtype_in(op, first, allowed);
}

// An out= tensor may alias an input exactly (same storage, same strides), but must not overlap itself
// (e.g. an expanded tensor) nor partially overlap an input: either would make the result depend on
// the order threads run in.
inline void check_out_overlap(const char* op, NamedTensor out, std::initializer_list<NamedTensor> inputs) {
  TORCHOPS_CHECK(at::has_internal_overlap(out.tensor) != at::MemOverlap::Yes, op, out.name,
                 " has internal overlap (several elements share memory, e.g. an expanded tensor); "
                 "it cannot be written");
  for (const auto& in : inputs) {
    const auto status = at::get_overlap_status(out.tensor, in.tensor);
    TORCHOPS_CHECK(status != at::MemOverlapStatus::Partial, op, out.name, " partially overlaps ", in.name,
                   "; pass the same tensor or a non-overlapping one");
  }
}

}  // namespace torchops
