// Dtype lists shared by every op, and the dispatch macros generated from them, so the supported dtypes of an
// op are written once: the braced list its argument checks get and the cases its kernels are compiled for
// come from the same list and cannot disagree.
//
// Each list is an X-macro: TORCHOPS_FOR_EACH_<LIST>_DTYPE(F, ...) expands to F(dtype, ...) for each of its
// dtypes. From it come
//   TORCHOPS_<LIST>_DTYPES                 the dtypes, comma-separated: write `{TORCHOPS_FLOAT_DTYPES}`;
//   TORCHOPS_DISPATCH_<LIST>_TYPES(t, name, fn)  a switch over them binding `scalar_t` (`index_t` for the
//                                          index dispatch) inside fn, like AT_DISPATCH_FLOATING_TYPES.
// A new list is one FOR_EACH line plus these two. meta_kernels/_checks.py holds the same lists for the fake
// kernels; tests/test_dtype_lists.py checks them against what the kernels built from these accept.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <type_traits>

// f16, bf16, f32, f64.
#define TORCHOPS_FOR_EACH_FLOAT_DTYPE(F, ...) \
  F(at::kHalf, __VA_ARGS__) F(at::kBFloat16, __VA_ARGS__) F(at::kFloat, __VA_ARGS__) F(at::kDouble, __VA_ARGS__)
// i32, i64: integer elements and sparse index dtypes (AT_DISPATCH_INDEX_TYPES's pair).
#define TORCHOPS_FOR_EACH_INT_DTYPE(F, ...) F(at::kInt, __VA_ARGS__) F(at::kLong, __VA_ARGS__)
#define TORCHOPS_FOR_EACH_FLOAT_AND_INT_DTYPE(F, ...) \
  TORCHOPS_FOR_EACH_FLOAT_DTYPE(F, __VA_ARGS__) TORCHOPS_FOR_EACH_INT_DTYPE(F, __VA_ARGS__)

// `dtype,`: a braced list allows the trailing comma this leaves.
#define TORCHOPS_PRIVATE_LIST_ENTRY(dtype, ...) dtype,
#define TORCHOPS_FLOAT_DTYPES TORCHOPS_FOR_EACH_FLOAT_DTYPE(TORCHOPS_PRIVATE_LIST_ENTRY, )
#define TORCHOPS_INT_DTYPES TORCHOPS_FOR_EACH_INT_DTYPE(TORCHOPS_PRIVATE_LIST_ENTRY, )
#define TORCHOPS_FLOAT_AND_INT_DTYPES TORCHOPS_FOR_EACH_FLOAT_AND_INT_DTYPE(TORCHOPS_PRIVATE_LIST_ENTRY, )

// Binds `scalar_t` inside __VA_ARGS__.
#define TORCHOPS_DISPATCH_FLOAT_TYPES(TYPE, NAME, ...) \
  AT_DISPATCH_SWITCH(TYPE, NAME, TORCHOPS_FOR_EACH_FLOAT_DTYPE(AT_DISPATCH_CASE, __VA_ARGS__))
#define TORCHOPS_DISPATCH_FLOAT_AND_INT_TYPES(TYPE, NAME, ...) \
  AT_DISPATCH_SWITCH(TYPE, NAME, TORCHOPS_FOR_EACH_FLOAT_AND_INT_DTYPE(AT_DISPATCH_CASE, __VA_ARGS__))

// The int dtypes as index types: binds `index_t` (so it nests around a dispatch binding `scalar_t`).
#define TORCHOPS_PRIVATE_INDEX_CASE(dtype, ...) AT_PRIVATE_CASE_TYPE_USING_HINT(dtype, index_t, __VA_ARGS__)
#define TORCHOPS_DISPATCH_INDEX_TYPES(TYPE, NAME, ...) \
  AT_DISPATCH_SWITCH(TYPE, NAME, TORCHOPS_FOR_EACH_INT_DTYPE(TORCHOPS_PRIVATE_INDEX_CASE, __VA_ARGS__))

namespace torchops {
template <typename T>
constexpr bool is_16bit_float = std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;

// The same, for a dtype known at run time.
constexpr bool is_16bit_float_dtype(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// Arithmetic type for a storage type: f32 for f16/bf16, the type itself otherwise.
template <typename T>
using opmath_t = at::opmath_type<T>;
}  // namespace torchops
