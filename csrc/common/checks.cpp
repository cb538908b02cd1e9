#include "checks.h"

#include <ATen/MemoryOverlap.h>

#include <string>

namespace torchops {

namespace {

std::string dtype_list(std::initializer_list<at::ScalarType> dtypes) {
  std::string s;
  for (auto t : dtypes) {
    if (!s.empty()) s += ", ";
    s += c10::toString(t);
  }
  return s;
}

}  // namespace

void check_defined(const char* op, NamedTensor t) {
  TORCHOPS_CHECK(t.tensor.defined(), op, t.name, " must be a defined tensor");
}

void check_dtype_in(const char* op, NamedTensor t, std::initializer_list<at::ScalarType> allowed) {
  for (auto d : allowed) {
    if (t.tensor.scalar_type() == d) return;
  }
  TORCHOPS_CHECK(false, op, t.name, " has unsupported dtype ", t.tensor.scalar_type(),
                 "; supported: ", dtype_list(allowed));
}

void check_same_shape(const char* op, NamedTensor x, NamedTensor y) {
  TORCHOPS_CHECK(x.tensor.sizes().equals(y.tensor.sizes()), op, x.name, " and ", y.name,
                 " must have the same shape, got ", x.tensor.sizes(), " and ", y.tensor.sizes());
}

void check_same_dtype(const char* op, NamedTensor x, NamedTensor y) {
  TORCHOPS_CHECK(x.tensor.scalar_type() == y.tensor.scalar_type(), op, x.name, " and ", y.name,
                 " must have the same dtype, got ", x.tensor.scalar_type(), " and ", y.tensor.scalar_type());
}

void check_same_device(const char* op, NamedTensor x, NamedTensor y) {
  TORCHOPS_CHECK(x.tensor.device() == y.tensor.device(), op, x.name, " and ", y.name,
                 " must be on the same device, got ", x.tensor.device(), " and ", y.tensor.device());
}

void check_elementwise(const char* op, std::initializer_list<NamedTensor> tensors,
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

void check_out_overlap(const char* op, NamedTensor out, std::initializer_list<NamedTensor> inputs) {
  TORCHOPS_CHECK(at::has_internal_overlap(out.tensor) != at::MemOverlap::Yes, op, out.name,
                 " has internal overlap (several elements share memory, e.g. an expanded tensor); "
                 "it cannot be written");
  for (const auto& in : inputs) {
    // TooHard (PyTorch can't tell for non-dense views) is refused too when the two share a storage: it
    // may hide a partial overlap.
    const auto status = at::get_overlap_status(out.tensor, in.tensor);
    const bool same_view = out.tensor.data_ptr() == in.tensor.data_ptr() &&
                           out.tensor.sizes().equals(in.tensor.sizes()) &&
                           out.tensor.strides().equals(in.tensor.strides());
    const bool same_storage = out.tensor.has_storage() && in.tensor.has_storage() &&
                              out.tensor.storage().is_alias_of(in.tensor.storage());
    const bool too_hard = status == at::MemOverlapStatus::TooHard && same_storage && !same_view;
    TORCHOPS_CHECK(status != at::MemOverlapStatus::Partial && !too_hard, op, out.name, " partially overlaps ",
                   in.name, " (or may: both are strided views of one storage); ",
                   "pass the same tensor or a non-overlapping one");
  }
}

void fail_too_many_dims(const char* op, int max_dims) {
  TORCH_CHECK(false, "myns::", op, ": tensors with more than ", max_dims,
              " non-mergeable dimensions are not supported");
}

}  // namespace torchops
