// Allocation of new dense outputs straight from the backend's allocator (no dispatcher round trip,
// which costs a noticeable share of a small op call).
#pragma once

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#ifdef __CUDACC__
#include <ATen/cuda/EmptyTensor.h>
#endif

namespace torchops {

// Asks Linux for transparent huge pages over the 2 MiB-aligned part of a large fresh CPU buffer. glibc
// serves a buffer above its largest mmap threshold (32 MiB on 64-bit) with a new mmap on every call, so
// the kernel's first writes page-fault it in 4 KiB at a time; with THP in "madvise" mode (the default
// here) the advice makes that 2 MiB at a time, which makes first writes markedly cheaper. Smaller buffers
// come from the heap once glibc's threshold has risen: already faulted in, so the advice would gain nothing
// there and would mark part of the heap for huge pages for good. (PyTorch's own allocator advises every
// tensor when THP_MEM_ALLOC_ENABLE=1 is set.) A buffer of exactly 32 MiB (a 4096 x 4096 bf16 output) is one
// of glibc's own mmaps too: its chunk, with the allocator's alignment and glibc's header, is past the
// threshold, so buffers within a page of it are advised as well. Advice only: on failure, or on other
// systems, nothing changes.
inline void advise_huge_pages(const at::Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  constexpr size_t kMmapThresholdMax = size_t{32} << 20;  // glibc's DEFAULT_MMAP_THRESHOLD_MAX: above it, own mmap
  constexpr size_t kPage = 4096;
  const size_t bytes = t.nbytes();
  if (bytes + kPage <= kMmapThresholdMax) return;
  const auto base = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  const uintptr_t begin = (base + kHugePage - 1) & ~(kHugePage - 1), end = (base + bytes) & ~(kHugePage - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)t;
#endif
}

// A new dense CPU tensor (outputs and scratch alike).
inline at::Tensor empty_dense_cpu(c10::IntArrayRef sizes, at::ScalarType dtype) {
  at::Tensor out = at::detail::empty_cpu(sizes, dtype, /*pin_memory=*/false, at::MemoryFormat::Contiguous);
  advise_huge_pages(out);
  return out;
}

inline at::Tensor empty_like_dense_cpu(const at::Tensor& like) {
  return empty_dense_cpu(like.sizes(), like.scalar_type());
}

// Through a family's Backend, whose static empty(sizes, dtype, device_of) allocates on device_of's device:
// a dense tensor like `like`, and an output a call may not want (a [0]-shaped placeholder of its dtype then).
template <typename Backend>
at::Tensor backend_empty_like(const at::Tensor& like) {
  return Backend::empty(like.sizes(), like.scalar_type(), like);
}

template <typename Backend>
at::Tensor backend_empty_if(bool wanted, c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& device_of) {
  return Backend::empty(wanted ? sizes : c10::IntArrayRef({0}), dtype, device_of);
}

#ifdef __CUDACC__
// A new dense tensor on `device` (a CUDA device).
inline at::Tensor empty_dense_cuda(c10::IntArrayRef sizes, at::ScalarType dtype, c10::Device device) {
  return at::detail::empty_cuda(sizes, dtype, device, at::MemoryFormat::Contiguous);
}

inline at::Tensor empty_like_dense_cuda(const at::Tensor& like) {
  return empty_dense_cuda(like.sizes(), like.scalar_type(), like.device());
}
#endif

}  // namespace torchops
