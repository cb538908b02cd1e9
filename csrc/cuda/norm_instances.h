// The launch functions of the norm kernels, one instance per (input dtype, parameter dtype) pair of
// dispatch_norm_types and access width (16-byte vectors, or single elements): declared extern where they are
// called (norm.cu), defined by one translation unit per op so the kernels compile in parallel.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#define TORCHOPS_NORM_TYPE_PAIRS(X, ...)                                                                  \
  X(double, double, __VA_ARGS__) X(float, float, __VA_ARGS__) X(c10::Half, c10::Half, __VA_ARGS__)        \
  X(c10::Half, float, __VA_ARGS__) X(c10::BFloat16, c10::BFloat16, __VA_ARGS__)                           \
  X(c10::BFloat16, float, __VA_ARGS__)

#define TORCHOPS_NORM_FORWARD_INSTANCE(T, W, PREFIX, OP)                                                  \
  PREFIX template void launch_forward<T, W, vector_size<T>(), OP>(const ForwardArgs<T, W>&, int, cudaStream_t); \
  PREFIX template void launch_forward<T, W, 1, OP>(const ForwardArgs<T, W>&, int, cudaStream_t);

#define TORCHOPS_NORM_BACKWARD_INSTANCE(T, W, PREFIX, LAYER)                                              \
  PREFIX template void launch_backward<T, W, vector_size<T>(), LAYER>(BackwardArgs<T, W>, const at::Tensor&, \
                                                                      const at::Tensor&, int, cudaStream_t); \
  PREFIX template void launch_backward<T, W, 1, LAYER>(BackwardArgs<T, W>, const at::Tensor&, const at::Tensor&, int, \
                                                       cudaStream_t);
