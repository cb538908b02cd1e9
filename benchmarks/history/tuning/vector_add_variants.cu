// Tuning experiment for the dense vector_add kernel, outside torch: several launch shapes and memory
// access styles timed against a device-to-device copy on the same buffers. Build and run on the GPU:
//   nvcc -O3 -arch=sm_90 -o /tmp/variants benchmarks/history/tuning/vector_add_variants.cu && /tmp/variants
// Prints GB/s counting 2 reads + 1 write per element. Kept as the record of how the shipped
// configuration was chosen (see benchmarks/history/log.md).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda_check.h"

struct alignas(16) V16 {
  uint4 v;
};

template <typename T>
__device__ __forceinline__ uint4 add16(uint4 x, uint4 y);

template <>
__device__ __forceinline__ uint4 add16<float>(uint4 x, uint4 y) {
  float4 a = *reinterpret_cast<float4*>(&x), b = *reinterpret_cast<float4*>(&y), r;
  r.x = a.x + b.x; r.y = a.y + b.y; r.z = a.z + b.z; r.w = a.w + b.w;
  return *reinterpret_cast<uint4*>(&r);
}

template <>
__device__ __forceinline__ uint4 add16<__nv_bfloat16>(uint4 x, uint4 y) {
  const __nv_bfloat16* a = reinterpret_cast<const __nv_bfloat16*>(&x);
  const __nv_bfloat16* b = reinterpret_cast<const __nv_bfloat16*>(&y);
  uint4 out;
  __nv_bfloat16* r = reinterpret_cast<__nv_bfloat16*>(&out);
#pragma unroll
  for (int k = 0; k < 8; ++k) r[k] = __float2bfloat16(__bfloat162float(a[k]) + __bfloat162float(b[k]));
  return out;
}

enum LoadKind { kPlain = 0, kNoAlloc = 1 };

template <LoadKind L>
__device__ __forceinline__ uint4 ld(const uint4* p) {
  if constexpr (L == kNoAlloc) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
  } else {
    return *p;
  }
}

// Grid-stride (persistent) or one-chunk-per-block (grid covers everything) depending on the grid size.
template <typename T, int kUnroll, LoadKind L, bool kStreamStore>
__global__ void add_kernel(const uint4* a, const uint4* b, uint4* out, long long n_vec) {
  const long long step = (long long)gridDim.x * blockDim.x * kUnroll;
  for (long long base = (long long)blockIdx.x * blockDim.x * kUnroll + threadIdx.x; base < n_vec; base += step) {
    uint4 x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      long long i = base + (long long)u * blockDim.x;
      if (i < n_vec) { x[u] = ld<L>(a + i); y[u] = ld<L>(b + i); }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      long long i = base + (long long)u * blockDim.x;
      if (i < n_vec) {
        uint4 r = add16<T>(x[u], y[u]);
        if constexpr (kStreamStore) __stcs(out + i, r); else out[i] = r;
      }
    }
  }
}

template <typename T, int kUnroll, LoadKind L, bool kSS>
void run(const char* name, const uint4* a, const uint4* b, uint4* o, long long n_vec, int threads, long long blocks,
         double bytes, double copy_gbs) {
  if (blocks <= 0) blocks = (n_vec + (long long)threads * kUnroll - 1) / ((long long)threads * kUnroll);
  float ms = time_ms([&] { add_kernel<T, kUnroll, L, kSS><<<(unsigned)blocks, threads>>>(a, b, o, n_vec); });
  CHECK(cudaGetLastError());
  double gbs = bytes / ms / 1e6;
  printf("%-44s threads %4d blocks %8lld  %8.1f us  %7.1f GB/s  %5.1f%% of copy\n", name, threads, blocks, ms * 1e3, gbs,
         100 * gbs / copy_gbs);
}

int main() {
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const long long n_bytes = 1LL << 30;  // per operand: 2^28 f32 / 2^29 bf16
  const long long n_vec = n_bytes / 16;
  uint4 *a, *b, *o;
  CHECK(cudaMalloc(&a, n_bytes)); CHECK(cudaMalloc(&b, n_bytes)); CHECK(cudaMalloc(&o, n_bytes));
  CHECK(cudaMemset(a, 0x3c, n_bytes)); CHECK(cudaMemset(b, 0x3d, n_bytes));
  float copy_ms = time_ms([&] { cudaMemcpyAsync(o, a, n_bytes, cudaMemcpyDeviceToDevice); });
  double copy_gbs = 2.0 * n_bytes / copy_ms / 1e6;
  printf("copy %.1f us  %.1f GB/s (read+write)\n", copy_ms * 1e3, copy_gbs);
  const double bytes = 3.0 * n_bytes;
#define RUN(T, U, L, SS, TH, BL) run<T, U, L, SS>(#T " u" #U " " #L " ss" #SS, a, b, o, n_vec, TH, BL, bytes, copy_gbs)
  for (int pass = 0; pass < 2; ++pass) {
    printf("--- pass %d\n", pass);
    RUN(float, 4, kPlain, false, 256, (long long)sms * 8);
    RUN(float, 4, kPlain, false, 256, 0);
    RUN(float, 2, kPlain, false, 256, 0);
    RUN(float, 1, kPlain, false, 256, 0);
    RUN(float, 4, kPlain, false, 128, 0);
    RUN(float, 2, kPlain, false, 128, 0);
    RUN(float, 4, kNoAlloc, false, 256, 0);
    RUN(float, 4, kNoAlloc, true, 256, 0);
    RUN(float, 4, kPlain, true, 256, 0);
    RUN(float, 2, kNoAlloc, true, 128, 0);
    RUN(float, 4, kPlain, false, 512, (long long)sms * 4);
    RUN(float, 8, kPlain, false, 256, (long long)sms * 8);
    RUN(float, 4, kPlain, false, 256, (long long)sms * 16);
    RUN(float, 4, kPlain, false, 256, (long long)sms * 32);
    RUN(__nv_bfloat16, 4, kPlain, false, 256, (long long)sms * 8);
    RUN(__nv_bfloat16, 4, kPlain, false, 256, 0);
    RUN(__nv_bfloat16, 2, kPlain, false, 256, 0);
    RUN(__nv_bfloat16, 1, kPlain, false, 256, 0);
    RUN(__nv_bfloat16, 2, kPlain, false, 128, 0);
    RUN(__nv_bfloat16, 4, kNoAlloc, true, 256, 0);
  }
  return 0;
}
