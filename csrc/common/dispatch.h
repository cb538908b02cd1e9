// Dtype sets and dispatch macros shared by every op, so the supported-dtype list of an op is written once.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <type_traits>

#define TORCHOPS_FLOAT_DTYPES at::kHalf, at::kBFloat16, at::kFloat, at::kDouble
#define TORCHOPS_FLOAT_AND_INT_DTYPES TORCHOPS_FLOAT_DTYPES, at::kInt, at::kLong

// f16, bf16, f32, f64: binds `scalar_t` inside __VA_ARGS__.
#define TORCHOPS_DISPATCH_FLOAT_TYPES(TYPE, NAME, ...)          \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                \
                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__)     \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)    \
                     AT_DISPATCH_CASE(at::kDouble, __VA_ARGS__))

// The float types plus i32 and i64.
#define TORCHOPS_DISPATCH_FLOAT_AND_INT_TYPES(TYPE, NAME, ...)  \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                \
                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__)     \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)    \
                     AT_DISPATCH_CASE(at::kDouble, __VA_ARGS__)   \
                     AT_DISPATCH_CASE(at::kInt, __VA_ARGS__)      \
                     AT_DISPATCH_CASE(at::kLong, __VA_ARGS__))

namespace torchops {
template <typename T>
constexpr bool is_16bit_float = std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;

// Arithmetic type for a storage type: f32 for f16/bf16, the type itself otherwise.
template <typename T>
using opmath_t = at::opmath_type<T>;
}  // namespace torchops
