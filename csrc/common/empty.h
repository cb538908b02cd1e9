// Allocation of new dense outputs straight from the backend's allocator (no dispatcher round trip,
// which costs a noticeable share of a small op call).
#pragma once

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>

#ifdef __CUDACC__
#include <ATen/cuda/EmptyTensor.h>
#endif

namespace torchops {

inline at::Tensor empty_like_dense_cpu(const at::Tensor& like) {
  return at::detail::empty_cpu(like.sizes(), like.scalar_type(), /*pin_memory=*/false, at::MemoryFormat::Contiguous);
}

#ifdef __CUDACC__
inline at::Tensor empty_like_dense_cuda(const at::Tensor& like) {
  return at::detail::empty_cuda(like.sizes(), like.scalar_type(), like.device(), at::MemoryFormat::Contiguous);
}
#endif

}  // namespace torchops
