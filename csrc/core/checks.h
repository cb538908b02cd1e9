// Input validation shared by every op. Each failure is a RuntimeError (TORCH_CHECK) whose message starts
// with "myns::<op>: " and names the argument, so a user can tell which call and which tensor was wrong.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>

#include <initializer_list>
#include <optional>

namespace torchops {

using OptTensor = std::optional<at::Tensor>;

#define TORCHOPS_CHECK(cond, op, ...) TORCH_CHECK((cond), "myns::", op, ": ", __VA_ARGS__)

// A tensor argument together with the name the schema gives it.
struct NamedTensor {
  const char* name;
  const at::Tensor& tensor;
};

// Defined once in checks.cpp rather than inline: the message-building code is compiled in one place
// instead of in every backend's translation unit (nvcc ones included).
void check_defined(const char* op, NamedTensor t);
void check_dtype_in(const char* op, NamedTensor t, std::initializer_list<at::ScalarType> allowed);
void check_same_shape(const char* op, NamedTensor x, NamedTensor y);
void check_same_dtype(const char* op, NamedTensor x, NamedTensor y);
void check_same_device(const char* op, NamedTensor x, NamedTensor y);
// t defined and on device_of's device (the "must be on the same device" message names device_of first).
void check_defined_on(const char* op, NamedTensor device_of, NamedTensor t);
// t defined, on like's device, with like's dtype and shape (a gradient of like, an operand of an elementwise op).
void check_like(const char* op, NamedTensor like, NamedTensor t);

// The usual contract of an elementwise op: every tensor defined, same shape, dtype and device as the first,
// and the first's dtype among `allowed`.
void check_elementwise(const char* op, c10::ArrayRef<NamedTensor> tensors,
                       std::initializer_list<at::ScalarType> allowed);

// An out= tensor may alias an input exactly (same elements in the same order), but must not overlap itself
// (e.g. an expanded tensor) nor share any element with an input otherwise: either would make the result
// depend on the order threads run in. Both are decided exactly for any strides (a bounded search; views
// sharing no element, such as x[0::2] and x[1::2], are accepted); a layout too costly to decide is
// refused, saying so. Several out= tensors (`other_outs`) must share no element with each other at all.
void check_out_overlap(const char* op, NamedTensor out, c10::ArrayRef<NamedTensor> inputs,
                       c10::ArrayRef<NamedTensor> other_outs = {});

// An out= tensor for a result like `like`: defined, of like's device and dtype, and resized to like's shape
// the way torch's out= ops resize theirs (silently when empty, else with torch's deprecation warning).
void check_and_resize_out(const char* op, NamedTensor out, NamedTensor like);

// F.gelu's `approximate` argument: false for "none" (erf), true for "tanh"; anything else raises.
bool gelu_uses_tanh(const char* op, c10::string_view approximate);

// Raised by collapse_layout (strided.h) for layouts with more than `max_dims` non-mergeable dimensions.
[[noreturn]] void fail_too_many_dims(const char* op, int max_dims);

}  // namespace torchops
