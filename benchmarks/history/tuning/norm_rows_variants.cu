// Tuning experiment for rms_norm's CUDA forward (csrc/cuda/rms_norm_forward.cuh) at the grid shapes where it
// trails torch.compile: long rows (N >= 16384, one 512/1024-thread block per row, half the row kept in
// registers and the rest read twice) and bf16 65536x1024 (a warp per row). The shipped launch is
// instantiated from the header itself; every variant's output is compared with it (a differently ordered
// sum may move an output by one unit in the last place, nothing more). Build and run on the GPU:
//   nvcc -ccbin /usr/bin/g++ -O3 -arch=sm_90 -std=c++20 --expt-relaxed-constexpr -D__CUDA_NO_HALF_OPERATORS__ \
//     -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ \
//     $(python3 -c "from torch.utils.cpp_extension import include_paths as p; print(*('-I' + i for i in p()))") \
//     -L$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))")/lib -lc10 -lc10_cuda \
//     -Xlinker -rpath=$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))")/lib \
//     -o /tmp/norm_rows benchmarks/history/tuning/norm_rows_variants.cu && /tmp/norm_rows
// The variants:
//   stream<threads, hint> x occupancy: a block per row keeping nothing in registers, Inductor's shape for
//     long rows: sweep 1 sums the squares (4 vectors in flight a thread), sweep 2 reads the row again and
//     writes it. hint: sweep 1's loads ask L2 to keep the lines (createpolicy evict_last), sweep 2's reads
//     and the stores ask it to drop them first, so the second read hits L2 even with many rows in flight.
//     occupancy caps the resident blocks per SM with dynamic shared memory (fewer rows in flight: less L2).
//   group<lanes, units, wpre>: `lanes` lanes per row (32: the shipped warp path; 16: two rows a warp),
//     each keeping `units` 16-byte vectors; wpre: the weight loaded with the row, before the reduction.
// Each time is the median of 30 runs, an L2 flush (256 MiB memset) before each, events around the kernel
// only. "copy" columns: a 1 GiB device copy's bandwidth and a copy of the same bytes (one M x N tensor).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "../../../csrc/cuda/rms_norm_forward.cuh"
#include "cuda_check.h"

using BF16 = c10::BFloat16;
using torchops::cuda::AlignedVector;
using torchops::cuda::kWarpSize;
using torchops::cuda::vector_size;

// ---- L2 eviction-priority accesses of one 16-byte vector: the engine's (cuda_utils.cuh) on uint4
using torchops::cuda::L2Evict;
__device__ __forceinline__ uint64_t policy_keep() { return torchops::cuda::l2_policy<L2Evict::kLast>(); }
__device__ __forceinline__ uint64_t policy_drop() { return torchops::cuda::l2_policy<L2Evict::kFirst>(); }
using torchops::cuda::L1Use;
template <L1Use kL1 = L1Use::kNormal>
__device__ __forceinline__ uint4 load_hint(const uint4* p, uint64_t policy) {
  const auto v = torchops::cuda::load_vector_l2<uint32_t, 4, kL1>(reinterpret_cast<const uint32_t*>(p), 0, policy);
  return make_uint4(v.val[0], v.val[1], v.val[2], v.val[3]);
}
__device__ __forceinline__ uint4 load_hint_no_l1(const uint4* p, uint64_t policy) {
  return load_hint<L1Use::kNoAllocate>(p, policy);
}
__device__ __forceinline__ void store_hint(uint4* p, uint4 v, uint64_t policy) {
  const torchops::cuda::AlignedVector<uint32_t, 4> w{{v.x, v.y, v.z, v.w}};
  torchops::cuda::store_vector_l2(reinterpret_cast<uint32_t*>(p), 0, w, policy);
}

template <typename T>
using Vec = AlignedVector<T, vector_size<T>()>;
template <typename T>
__device__ __forceinline__ Vec<T> as_vec(uint4 u) {
  return *reinterpret_cast<Vec<T>*>(&u);
}
template <typename T>
__device__ __forceinline__ uint4 as_u4(const Vec<T>& v) {
  return *reinterpret_cast<const uint4*>(&v);
}
template <typename T>
using Sum = torchops::norm_cuda::RowSum<T>;

template <typename T>
__device__ __forceinline__ float squares(uint4 u) {
  const Vec<T> v = as_vec<T>(u);
  float s = 0;
#pragma unroll
  for (int e = 0; e < vector_size<T>(); ++e) s += static_cast<float>(v.val[e]) * static_cast<float>(v.val[e]);
  return s;
}
template <typename T>
__device__ __forceinline__ uint4 apply(uint4 xu, uint4 wu, float r) {
  const Vec<T> x = as_vec<T>(xu), w = as_vec<T>(wu);
  Vec<T> y;
#pragma unroll
  for (int e = 0; e < vector_size<T>(); ++e) {
    y.val[e] = static_cast<T>(static_cast<float>(x.val[e]) * r * static_cast<float>(w.val[e]));
  }
  return as_u4<T>(y);
}

template <typename T>
__device__ __forceinline__ uint4 add_rounded(uint4 au, uint4 bu) {
  const Vec<T> a = as_vec<T>(au), b = as_vec<T>(bu);
  Vec<T> out;
#pragma unroll
  for (int e = 0; e < vector_size<T>(); ++e) out.val[e] = static_cast<T>(static_cast<float>(a.val[e]) + static_cast<float>(b.val[e]));
  return as_u4<T>(out);
}

// ---- stream: a block per row, nothing kept. kAdd: add_rms_norm (h = x + r rounded to T is written in
// sweep 1, with the keep hint, and read back in sweep 2).
template <typename T, int kThreads, bool kHint, bool kAdd>
__global__ void __launch_bounds__(kThreads) stream_kernel(const T* __restrict__ x, const T* __restrict__ res,
                                                          const T* __restrict__ w, T* __restrict__ h,
                                                          T* __restrict__ y, int rows, int n, float eps) {
  extern __shared__ char occupancy_pad[];
  constexpr int kInFlight = 4;
  __shared__ Sum<T> scratch[kWarpSize];
  const int units = n / vector_size<T>();
  const uint64_t keep = kHint ? policy_keep() : 0, drop = kHint ? policy_drop() : 0;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  auto first_read = [&](const uint4* p) { return kHint ? load_hint(p, kAdd ? drop : keep) : *p; };
  auto sweep1 = [&](const uint4* xr, const uint4* rr, uint4* hr, int c, Sum<T>& ss) {
    uint4 v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) v[k] = first_read(xr + c + k * kThreads);
    if constexpr (kAdd) {
      uint4 o[kInFlight];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) o[k] = first_read(rr + c + k * kThreads);
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        v[k] = add_rounded<T>(v[k], o[k]);
        if (kHint) store_hint(hr + c + k * kThreads, v[k], keep); else hr[c + k * kThreads] = v[k];
      }
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) ss += squares<T>(v[k]);
  };
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const uint4* xr = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(row) * n);
    const uint4* rr = kAdd ? reinterpret_cast<const uint4*>(res + static_cast<int64_t>(row) * n) : nullptr;
    uint4* hr = kAdd ? reinterpret_cast<uint4*>(h + static_cast<int64_t>(row) * n) : nullptr;
    uint4* yr = reinterpret_cast<uint4*>(y + static_cast<int64_t>(row) * n);
    Sum<T> ss = 0;
    int c = threadIdx.x;
    for (; c + (kInFlight - 1) * kThreads < units; c += kInFlight * kThreads) sweep1(xr, rr, hr, c, ss);
    for (; c < units; c += kThreads) {
      uint4 v = first_read(xr + c);
      if constexpr (kAdd) {
        v = add_rounded<T>(v, first_read(rr + c));
        if (kHint) store_hint(hr + c, v, keep); else hr[c] = v;
      }
      ss += squares<T>(v);
    }
    ss = torchops::norm_cuda::row_sum<true>(ss, scratch);
    const float r = torchops::rms_norm_kernels::inverse_rms<float>(ss, n, eps);
    const uint4* again = kAdd ? hr : xr;
    c = threadIdx.x;
    for (; c + (kInFlight - 1) * kThreads < units; c += kInFlight * kThreads) {
      uint4 v[kInFlight], wu[kInFlight];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        v[k] = kHint ? load_hint_no_l1(again + c + k * kThreads, drop) : again[c + k * kThreads];
        wu[k] = kHint ? load_hint(wv + c + k * kThreads, keep) : wv[c + k * kThreads];
      }
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const uint4 out = apply<T>(v[k], wu[k], r);
        if (kHint) store_hint(yr + c + k * kThreads, out, drop); else yr[c + k * kThreads] = out;
      }
    }
    for (; c < units; c += kThreads) {
      const uint4 out =
          apply<T>(kHint ? load_hint_no_l1(again + c, drop) : again[c], kHint ? load_hint(wv + c, keep) : wv[c], r);
      if (kHint) store_hint(yr + c, out, drop); else yr[c] = out;
    }
  }
}

// ---- group: kLanes lanes per row, kUnits vectors a lane kept
template <typename T, int kLanes, int kUnits, bool kWPre, int kMinBlocks>
__global__ void __launch_bounds__(128, kMinBlocks) group_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                    T* __restrict__ y, int rows, int n, float eps) {
  const int units = n / vector_size<T>();
  const int lane = threadIdx.x % kLanes;
  const int per_block = blockDim.x / kLanes;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  for (int row = blockIdx.x * per_block + threadIdx.x / kLanes; row < rows; row += gridDim.x * per_block) {
    const uint4* xr = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(row) * n);
    uint4* yr = reinterpret_cast<uint4*>(y + static_cast<int64_t>(row) * n);
    uint4 v[kUnits], wu[kUnits];
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const int c = lane + k * kLanes;
      if (c < units) v[k] = xr[c];
    }
    if (kWPre) {
#pragma unroll
      for (int k = 0; k < kUnits; ++k) {
        const int c = lane + k * kLanes;
        if (c < units) wu[k] = wv[c];
      }
    }
    Sum<T> ss = 0;
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      if (lane + k * kLanes < units) ss += squares<T>(v[k]);
    }
#pragma unroll
    for (int o = kLanes / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = torchops::rms_norm_kernels::inverse_rms<float>(ss, n, eps);
    if (!kWPre) {
#pragma unroll
      for (int k = 0; k < kUnits; ++k) {
        const int c = lane + k * kLanes;
        if (c < units) wu[k] = wv[c];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const int c = lane + k * kLanes;
      if (c < units) yr[c] = apply<T>(v[k], wu[k], r);
    }
  }
}

// ---- host
__global__ void fill_kernel(uint16_t* p16, float* p32, int64_t count, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float v = (static_cast<float>(h & 0xffffff) / 16777216.0f) * 4.0f - 2.0f;
    if (p16 != nullptr) p16[i] = BF16(v).x;
    if (p32 != nullptr) p32[i] = v;
  }
}

template <typename T>
void fill(T* p, int64_t count, uint32_t seed) {
  if constexpr (sizeof(T) == 2) {
    fill_kernel<<<1024, 256>>>(reinterpret_cast<uint16_t*>(p), nullptr, count, seed);
  } else {
    fill_kernel<<<1024, 256>>>(nullptr, reinterpret_cast<float*>(p), count, seed);
  }
  CHECK(cudaGetLastError());
}

// The largest |a - b| over the largest |b| (on the device: the tensors are up to 512 MiB), and how many
// elements differ. Non-negative floats order like their bits, so atomicMax on the bits takes the largest.
template <typename T>
__global__ void compare_kernel(const T* got, const T* want, int64_t count, unsigned int* worst_scale,
                               unsigned long long* differ) {
  float worst = 0, scale = 0;
  unsigned long long n = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const float a = static_cast<float>(got[i]), b = static_cast<float>(want[i]);
    if (!(a == b)) ++n;
    worst = fmaxf(worst, a == a ? fabsf(a - b) : INFINITY);
    scale = fmaxf(scale, fabsf(b));
  }
  atomicMax(&worst_scale[0], __float_as_uint(worst));
  atomicMax(&worst_scale[1], __float_as_uint(scale));
  atomicAdd(differ, n);
}

template <typename T>
void compare(const T* got, const T* want, int64_t count, double* rel, int64_t* differ) {
  static unsigned int* stats = nullptr;
  if (stats == nullptr) CHECK(cudaMalloc(&stats, 16));
  CHECK(cudaMemset(stats, 0, 16));
  compare_kernel<<<1024, 256>>>(got, want, count, stats, reinterpret_cast<unsigned long long*>(stats + 2));
  CHECK(cudaGetLastError());
  unsigned int host[4];
  CHECK(cudaMemcpy(host, stats, 16, cudaMemcpyDeviceToHost));
  float worst, scale;
  memcpy(&worst, &host[0], 4);
  memcpy(&scale, &host[1], 4);
  unsigned long long n;
  memcpy(&n, &host[2], 8);
  *rel = worst / scale;
  *differ = static_cast<int64_t>(n);
}

template <typename T>
struct Case {
  int rows, n;
  bool add;
  T *x, *res, *w, *h, *y, *h_ref, *ref;
  double copy_bps;
  // forward: x read, y written; add: x and r read, h and y written
  double bytes() const { return (add ? 4.0 : 2.0) * rows * double(n) * sizeof(T); }
  const char* label() const { return add ? (sizeof(T) == 2 ? "add bf16" : "add f32") : (sizeof(T) == 2 ? "bf16" : "f32"); }

  void report(const char* name, float ms) {
    double rel = 0, h_rel = 0;
    int64_t differ = 0, h_differ = 0;
    const int64_t count = int64_t{rows} * n;
    compare(y, ref, count, &rel, &differ);
    if (add) compare(h, h_ref, count, &h_rel, &h_differ);
    printf("%-8s %6dx%-6d %-32s %9.1f us %6.1f%% of copy  diff %.1e (%lld)%s\n", label(), rows, n, name, ms * 1e3,
           100.0 * bytes() / (ms * 1e-3) / copy_bps, rel, static_cast<long long>(differ),
           add && h_differ != 0 ? "  RESIDUAL_OUT DIFFERS" : "");
    CHECK(cudaMemset(y, 0xff, count * sizeof(T)));  // poison for the next variant
    if (add) CHECK(cudaMemset(h, 0xff, count * sizeof(T)));
  }

  template <int kThreads, bool kHint, bool kAdd>
  void stream(int blocks_per_sm) {
    auto kernel = stream_kernel<T, kThreads, kHint, kAdd>;
    int smem_per_sm = 0;
    CHECK(cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
    size_t pad = 0;
    if (blocks_per_sm > 0) {
      pad = smem_per_sm / blocks_per_sm - 2048;  // room for exactly blocks_per_sm blocks
      CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(pad)));
    }
    int resident = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, pad));
    const float ms = time_ms_flushed([&] { kernel<<<rows, kThreads, pad>>>(x, res, w, h, y, rows, n, 1e-6f); });
    char name[96];
    snprintf(name, sizeof(name), "stream t%d%s %d/SM", kThreads, kHint ? " hint" : "", resident);
    report(name, ms);
  }

  template <int kLanes, int kUnits, bool kWPre, int kMinBlocks = 1>
  void group() {
    if (n / vector_size<T>() > kLanes * kUnits) return;
    const int per_block = 128 / kLanes;
    const float ms = time_ms_flushed([&] {
      group_kernel<T, kLanes, kUnits, kWPre, kMinBlocks><<<(rows + per_block - 1) / per_block, 128>>>(x, w, y, rows, n, 1e-6f);
    });
    char name[96];
    snprintf(name, sizeof(name), "group lanes%d units%d%s mb%d", kLanes, kUnits, kWPre ? " wpre" : "", kMinBlocks);
    report(name, ms);
  }
};

template <typename T>
void run_shape(int rows, int n, bool add, double copy_bps) {
  namespace K = torchops::rms_norm_kernels;
  const int64_t count = int64_t{rows} * n;
  Case<T> c{rows, n, add, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, copy_bps};
  CHECK(cudaMalloc(&c.x, count * sizeof(T)));
  CHECK(cudaMalloc(&c.y, count * sizeof(T)));
  CHECK(cudaMalloc(&c.ref, count * sizeof(T)));
  CHECK(cudaMalloc(&c.w, n * sizeof(T)));
  if (add) {
    CHECK(cudaMalloc(&c.res, count * sizeof(T)));
    CHECK(cudaMalloc(&c.h, count * sizeof(T)));
    CHECK(cudaMalloc(&c.h_ref, count * sizeof(T)));
    fill(c.res, count, 3);
  }
  fill(c.x, count, 1);
  fill(c.w, n, 2);
  // The same bytes as copies (one tensor's worth; two for add): the ceiling for this shape.
  const float copy_ms = time_ms_flushed([&] {
    CHECK(cudaMemcpyAsync(c.y, c.x, count * sizeof(T), cudaMemcpyDeviceToDevice));
    if (add) CHECK(cudaMemcpyAsync(c.h, c.res, count * sizeof(T), cudaMemcpyDeviceToDevice));
  });
  K::ForwardArgs<T, T> a{c.x, n, c.res, n, c.h_ref, c.w, c.ref, nullptr};
  constexpr int kC = vector_size<T>();
  auto shipped = [&] {
    if (add) K::launch_forward<T, T, kC, true>(a, rows, n, 1e-6, 0.0, nullptr);
    else K::launch_forward<T, T, kC, false>(a, rows, n, 1e-6, 0.0, nullptr);
  };
  shipped();
  CHECK(cudaDeviceSynchronize());
  const float ms = time_ms_flushed(shipped);
  printf("%-8s %6dx%-6d %-32s %9.1f us %6.1f%% of copy  (same-bytes copy %.1f us = %.1f%% of copy)\n", c.label(),
         rows, n, "shipped", ms * 1e3, 100.0 * c.bytes() / (ms * 1e-3) / copy_bps, copy_ms * 1e3,
         100.0 * c.bytes() / (copy_ms * 1e-3) / copy_bps);
  const int units = n / kC;
  if (!add && units <= 256) {
    c.template group<32, 4, false>();
    c.template group<32, 4, true>();
    c.template group<16, 8, false>();
    c.template group<16, 8, true>();
    c.template group<32, 8, false>();
  }
  auto streams = [&](auto add_tag) {
    constexpr bool kAdd = decltype(add_tag)::value;
    for (int occ : {0, 4, 2}) {
      c.template stream<128, true, kAdd>(occ);
      c.template stream<256, true, kAdd>(occ);
      c.template stream<512, true, kAdd>(occ);
    }
    c.template stream<256, false, kAdd>(0);
    c.template stream<512, false, kAdd>(0);
    c.template stream<1024, true, kAdd>(0);
    c.template stream<1024, true, kAdd>(1);
  };
  if (add) streams(std::true_type{}); else streams(std::false_type{});
  T* buffers[] = {c.x, c.y, c.ref, c.w, c.res, c.h, c.h_ref};
  for (T* p : buffers) CHECK(cudaFree(p));
}

int main() {
  const double copy_bps = copy_bytes_per_second();
  const int grid[][2] = {{4096, 2048}, {65536, 1024}, {32768, 4096}, {16384, 8192},
                         {8192, 16384}, {4096, 32768}, {2048, 65536}};
  for (bool add : {false, true}) {
    for (const auto& s : grid) run_shape<BF16>(s[0], s[1], add, copy_bps);
    for (const auto& s : grid) run_shape<float>(s[0], s[1], add, copy_bps);
  }
  return 0;
}
