// CUDA scaffolding shared by every kernel: launch shapes and grid sizing, 16-byte vector access with
// alignment checks and the dispatch over vector widths, fast index division for strided kernels, and launch
// error checks.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "strided.h"

namespace torchops {
namespace cuda {

#define TORCHOPS_CUDA_LAUNCH_CHECK() C10_CUDA_KERNEL_LAUNCH_CHECK()

constexpr int kVectorBytes = 16;
constexpr int kWarpSize = 32;
constexpr unsigned kFullWarpMask = 0xffffffffu;

// Launch shapes shared by the kernels.
// Kernels whose unit of work is one warp (a CSR merge-path unit, a normalised row) run 4 warps per block.
constexpr int kWarpsPerBlock = 4;
constexpr int kWarpBlockThreads = kWarpsPerBlock * kWarpSize;
// Grid-stride loops over a flat index range that are not elementwise ops (index bookkeeping, e.g. a CSR
// transpose); the elementwise engine has its own (cuda_elementwise.cuh).
constexpr int kIndexLoopThreads = 256;
// The hardware's limit on a grid's y and z dimensions.
constexpr unsigned int kMaxGridYZ = 65535;

// Blocks for a launch where each block takes `items_per_block` of `work_items` once: streaming kernels ran faster
// with such a grid than with a persistent grid-stride one (docs/design-decisions.md); kernels keep a grid-stride
// loop anyway, for the 2^31-1 block cap.
inline unsigned int blocks_to_cover(int64_t work_items, int64_t items_per_block) {
  const int64_t blocks = (work_items + items_per_block - 1) / items_per_block;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(blocks, INT32_MAX)));
}

// A positive per-device value (an attribute, a kernel's occupancy), asked of `query` once per device and
// slot of `cache`, then read from it: launch configuration asks on every call. Devices past the cache, or
// a slot index past it, ask every time.
constexpr int kCachedDevices = 64;
template <int kSlots, typename Query>
inline int cached_per_device(std::atomic<int> (&cache)[kCachedDevices][kSlots], int device, int slot, Query query) {
  if (device < 0 || device >= kCachedDevices || slot < 0 || slot >= kSlots) return query();
  int value = cache[device][slot].load(std::memory_order_relaxed);
  if (value == 0) {
    value = query();
    cache[device][slot].store(value, std::memory_order_relaxed);
  }
  return value;
}

// A device attribute (SM count, shared-memory limit, ...).
inline int device_attribute(cudaDeviceAttr attr, int device) {
  static std::atomic<int> cache[kCachedDevices][128] = {};
  return cached_per_device(cache, device, static_cast<int>(attr), [&] {
    int value = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
    return value;
  });
}

// How many blocks of `kernel` (blocks of `threads`, `smem` bytes of dynamic shared memory) one SM holds at
// once, at least 1.
template <typename Kernel>
inline int resident_blocks_per_sm(Kernel kernel, int threads, size_t smem = 0) {
  int blocks = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem));
  return std::max(blocks, 1);
}

// Lets `kernel` launch with `dynamic_bytes` of dynamic shared memory next to its `static_bytes`: past the
// 48 KiB (both together) every kernel may use, it must opt in, else its launch fails ("invalid argument").
template <typename Kernel>
inline void allow_shared_memory(Kernel kernel, size_t dynamic_bytes, size_t static_bytes) {
  constexpr size_t kDefaultLimit = 48 * 1024;
  if (dynamic_bytes + static_bytes > kDefaultLimit) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(dynamic_bytes)));
  }
}

inline bool is_aligned(const void* ptr, int bytes = kVectorBytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// kN elements of T packed into one 16-byte (or smaller) access.
template <typename T, int kN>
struct alignas(sizeof(T) * kN) AlignedVector {
  T val[kN];
};

template <typename T>
constexpr int vector_size() {
  return kVectorBytes / sizeof(T);
}

// The vector widths (elements per access) a kernel family is compiled for: every power of two up to 16
// bytes, or only 16 bytes and single elements (kernels whose accesses are either all aligned or not: half
// as many to compile).
enum class VectorWidths { kAll, kFullOrScalar };

namespace detail {
template <typename T, VectorWidths kWidths, int V, typename Fn>
void with_vector_size_from(int v, Fn&& fn) {
  if (v == V) return fn(std::integral_constant<int, V>{});
  if constexpr (V > 1) {
    return with_vector_size_from<T, kWidths, kWidths == VectorWidths::kAll ? V / 2 : 1>(v, std::forward<Fn>(fn));
  } else {
    TORCH_INTERNAL_ASSERT(false, "no kernel is compiled for a vector width of ", v, " elements");
  }
}
}  // namespace detail

// Calls fn(std::integral_constant<int, V>{}) with V == v: the one place where a vector width chosen at run
// time (from N, strides and pointer alignment) becomes a kernel's template argument. v must be one of
// kWidths; fn returns nothing.
template <typename T, VectorWidths kWidths = VectorWidths::kAll, typename Fn>
void with_vector_size(int v, Fn&& fn) {
  detail::with_vector_size_from<T, kWidths, vector_size<T>()>(v, std::forward<Fn>(fn));
}

template <typename T, int kN>
__device__ __forceinline__ AlignedVector<T, kN> zero_vector() {
  AlignedVector<T, kN> z;
#pragma unroll
  for (int e = 0; e < kN; ++e) z.val[e] = static_cast<T>(0.f);
  return z;
}

template <typename T, int kN>
__device__ __forceinline__ AlignedVector<T, kN> load_vector(const T* base, int64_t vector_index) {
  return reinterpret_cast<const AlignedVector<T, kN>*>(base)[vector_index];
}

template <typename T, int kN>
__device__ __forceinline__ void store_vector(T* base, int64_t vector_index, const AlignedVector<T, kN>& v) {
  reinterpret_cast<AlignedVector<T, kN>*>(base)[vector_index] = v;
}

// L2 eviction priorities (sm_80+; plain accesses on older devices): a policy is made once per thread
// (l2_policy<L2Evict::kLast> / <L2Evict::kFirst>) and passed to each access of a 16-byte vector. A kernel
// that reads its data twice marks the first read "keep" (evict last) and the second "drop" (evict first),
// so the lines it still needs outlive the ones it is done with. The load's L1 use (L1Use): allocate as
// usual, not at all (a line read for the last time), or with an L1 eviction priority of its own (evict last
// on a first read whose line the same SM reads again soon, evict first on that second read: what Triton
// emits on sm_90 for tl.load's eviction_policy, the L1 and L2 priorities together).
enum class L2Evict { kLast, kFirst };
enum class L1Use { kNormal, kNoAllocate, kEvictLast, kEvictFirst };

template <L2Evict kWhich>
__device__ __forceinline__ uint64_t l2_policy() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kWhich == L2Evict::kLast) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  }
#endif
  return policy;
}

template <typename T, int kN, L1Use kL1 = L1Use::kNormal>
__device__ __forceinline__ AlignedVector<T, kN> load_vector_l2(const T* base, int64_t vector_index, uint64_t policy) {
  static_assert(sizeof(T) * kN == kVectorBytes, "a 16-byte vector");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto* p = reinterpret_cast<const AlignedVector<T, kN>*>(base) + vector_index;
  uint4 u;
  if constexpr (kL1 == L1Use::kNormal) {
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p), "l"(policy));
  } else if constexpr (kL1 == L1Use::kNoAllocate) {
    asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p), "l"(policy));
  } else if constexpr (kL1 == L1Use::kEvictLast) {
    asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p), "l"(policy));
  } else {
    asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p), "l"(policy));
  }
  AlignedVector<T, kN> v;
  memcpy(&v, &u, sizeof(v));
  return v;
#else
  (void)policy;
  return reinterpret_cast<const AlignedVector<T, kN>*>(base)[vector_index];
#endif
}

template <typename T, int kN>
__device__ __forceinline__ void store_vector_l2(T* base, int64_t vector_index, const AlignedVector<T, kN>& v,
                                                uint64_t policy) {
  static_assert(sizeof(T) * kN == kVectorBytes, "a 16-byte vector");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  auto* p = reinterpret_cast<AlignedVector<T, kN>*>(base) + vector_index;
  uint4 u;
  memcpy(&u, &v, sizeof(u));
  asm volatile("st.global.L1::no_allocate.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(u.x),
               "r"(u.y), "r"(u.z), "r"(u.w), "l"(policy)
               : "memory");
#else
  (void)policy;
  reinterpret_cast<AlignedVector<T, kN>*>(base)[vector_index] = v;
#endif
}

// A 16-byte vector access with the L2 policy (and, for loads, L1 use kL1) where kHinted, a plain one otherwise:
// for kernels whose hints are a compile-time choice per dtype or form.
template <bool kHinted, typename T, int kN, L1Use kL1 = L1Use::kNormal>
__device__ __forceinline__ AlignedVector<T, kN> load_vector_hinted(const T* base, int64_t vector_index,
                                                                   uint64_t policy) {
  if constexpr (kHinted) {
    return load_vector_l2<T, kN, kL1>(base, vector_index, policy);
  } else {
    return load_vector<T, kN>(base, vector_index);
  }
}

template <bool kHinted, typename T, int kN>
__device__ __forceinline__ void store_vector_hinted(T* base, int64_t vector_index, const AlignedVector<T, kN>& v,
                                                    uint64_t policy) {
  if constexpr (kHinted) {
    store_vector_l2(base, vector_index, v, policy);
  } else {
    store_vector<T, kN>(base, vector_index, v);
  }
}

// Asynchronous 16-byte copies from global to shared memory (cp.async, sm_80+; a plain copy, complete at
// once, on older devices). A thread commits the copies it has issued as a group; copy_async_wait<k>()
// returns once at most k of its groups are still in flight, and the data of the others is then visible to
// that thread (another thread reading it needs a barrier as well). The copies skip L1 (.cg).
__device__ __forceinline__ void copy_async_16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<unsigned int>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
#else
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
}

// A 4-byte copy into shared memory (through L1: .cg takes 16 bytes only), in the same groups as above.
__device__ __forceinline__ void copy_async_4(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<unsigned int>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
#else
  *static_cast<unsigned int*>(smem) = *static_cast<const unsigned int*>(gmem);
#endif
}

__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int kInFlight>
__device__ __forceinline__ void copy_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kInFlight) : "memory");
#endif
}

// Thread-block clusters (sm_90+; the host launches cluster kernels only there): the calling CTA's rank and
// the CTA count of its cluster (0 and 1 outside a cluster), a barrier over every thread of the cluster
// (release / acquire: shared-memory writes before it are visible to every peer CTA after it), and a peer
// CTA's address of a __shared__ variable (read through distributed shared memory).
template <bool kCount>
__device__ __forceinline__ unsigned int cluster_register() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned int v;
  if constexpr (kCount) {
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(v));
  } else {
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(v));
  }
  return v;
#else
  return kCount ? 1 : 0;
#endif
}

__device__ __forceinline__ unsigned int cluster_rank() { return cluster_register<false>(); }
__device__ __forceinline__ unsigned int cluster_blocks() { return cluster_register<true>(); }

__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __syncthreads();
#endif
}

template <typename S>
__device__ __forceinline__ const S* cluster_peer(const S* local, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t remote;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(remote) : "l"(reinterpret_cast<uint64_t>(local)), "r"(rank));
  return reinterpret_cast<const S*>(remote);
#else
  (void)rank;
  return local;
#endif
}

// The portable limit on a cluster's CTAs.
constexpr int kMaxClusterBlocks = 8;

inline cudaLaunchConfig_t cluster_launch_config(unsigned int blocks, int threads, size_t smem, int cluster,
                                                cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(static_cast<unsigned int>(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = static_cast<unsigned int>(cluster);
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  return config;
}

// How many clusters of `cluster` blocks of `kernel` the device holds at once (0: none fits).
template <typename... Params>
inline int resident_clusters(void (*kernel)(Params...), int threads, size_t smem, int cluster) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config =
      cluster_launch_config(static_cast<unsigned int>(cluster), threads, smem, cluster, nullptr, &attr);
  int clusters = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
  return clusters;
}

// kernel<<<blocks, threads, smem, stream>>>(args...), in clusters of `cluster` blocks where `cluster` is more
// than 1 (blocks a multiple of it); a cluster of one block is the plain launch.
template <typename... Params, typename... Args>
inline void launch_in_clusters(void (*kernel)(Params...), unsigned int blocks, int threads, size_t smem, int cluster,
                               cudaStream_t stream, Args&&... args) {
  if (cluster <= 1) {
    kernel<<<blocks, threads, smem, stream>>>(std::forward<Args>(args)...);
    TORCHOPS_CUDA_LAUNCH_CHECK();
    return;
  }
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = cluster_launch_config(blocks, threads, smem, cluster, stream, &attr);
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// The sum of v over the warp's 32 lanes, in every lane. A butterfly: every lane adds the same values in the
// same order, so every lane ends with the same bits.
template <typename S>
__device__ __forceinline__ S warp_sum(S v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullWarpMask, v, offset);
  return v;
}

// Unsigned 32-bit division by a divisor fixed at launch, as a multiply-high and a shift
// (Granlund & Montgomery). Exact for dividends below 2^31, which the 32-bit index paths guarantee.
struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 0;
  uint32_t shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(uint32_t d) : divisor(d) {
    while (shift < 32 && (uint64_t{1} << shift) < d) ++shift;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return (__umulhi(n, multiplier) + n) >> shift;
  }
};

// Per-operand element offsets of a linear index in a StridedLayout, for use inside kernels.
template <int kOperands>
struct OffsetCalculator {
  int ndim;
  FastDivmod divmods[kMaxDims];
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims][kOperands];

  explicit OffsetCalculator(const StridedLayout<kOperands>& layout) : ndim(layout.ndim) {
    for (int d = 0; d < ndim; ++d) {
      sizes[d] = layout.sizes[d];
      // Only used when every size (and the total) fits the 32-bit path.
      divmods[d] = FastDivmod(static_cast<uint32_t>(std::min<int64_t>(layout.sizes[d], UINT32_MAX)));
      for (int k = 0; k < kOperands; ++k) strides[d][k] = layout.strides[k][d];
    }
  }

  // 32-bit path: linear < 2^31.
  __device__ __forceinline__ void offsets(uint32_t linear, int64_t (&out)[kOperands]) const {
#pragma unroll
    for (int k = 0; k < kOperands; ++k) out[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const uint32_t q = divmods[d].div(linear);
      const int64_t r = linear - q * divmods[d].divisor;
#pragma unroll
      for (int k = 0; k < kOperands; ++k) out[k] += r * strides[d][k];
      linear = q;
    }
  }

  // 64-bit path for tensors of 2^31 elements or more.
  __device__ __forceinline__ void offsets(int64_t linear, int64_t (&out)[kOperands]) const {
#pragma unroll
    for (int k = 0; k < kOperands; ++k) out[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t q = linear / sizes[d];
      const int64_t r = linear - q * sizes[d];
#pragma unroll
      for (int k = 0; k < kOperands; ++k) out[k] += r * strides[d][k];
      linear = q;
    }
  }
};

}  // namespace cuda
}  // namespace torchops
