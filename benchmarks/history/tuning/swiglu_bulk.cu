// Tuning experiment for swiglu on the H200, outside torch: does feeding the math with Hopper's bulk copy
// engine (cp.async.bulk, 1-D, completing on an mbarrier; results written by plain stores or by bulk
// stores from shared memory) move more bytes per second than the shipped one-vector-per-thread kernel,
// which runs at parity with Inductor's (benchmarks/history/log.md)? bf16 and f32, forward and backward, on the
// bar shape of issue 3: the halves of x.chunk(2, -1) of a (16384, 28672) tensor read in place.
//   nvcc -O3 -arch=sm_90 -o /tmp/swiglu_bulk benchmarks/history/tuning/swiglu_bulk.cu && /tmp/swiglu_bulk
// Prints per variant the median of 30 timed runs, % of a device-to-device copy timed in the same program,
// and whether its output bits equal the reference (first) variant's.
// Run on the H200 on 2026-11-30 (benchmarks/history/log.md, "swiglu — H200, fourth session"): the flat launch at full
// occupancy was the fastest in every case (102-104% of copy); persistent grids ran at 91-94%, the bulk copy
// engine at 88-95%, capped occupancy lost up to 30%, and f32 with the fast sigmoid ran as fast as without.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda_check.h"

constexpr int kRows = 16384, kCols = 14336, kRowStride = 2 * kCols;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// The shipped kernels' two flavours; kFast takes the 16-bit one for f32 as well (fewer instructions).
template <typename T, bool kFast>
__device__ __forceinline__ float sigmoid(float x) {
  if constexpr (sizeof(T) == 2 || kFast) return __fdividef(0x1p-64f, (1.0f + __expf(-x)) * 0x1p-64f);
  return 1.0f / (1.0f + expf(-x));
}

template <bool kFast>
struct FwdT {
  static constexpr int kIn = 2, kOut = 1;
  template <typename T>
  __device__ static void apply(const float (&x)[kIn], float (&y)[kOut]) {
    y[0] = x[0] * sigmoid<T, kFast>(x[0]) * x[1];
  }
};

template <bool kFast>
struct BwdT {
  static constexpr int kIn = 3, kOut = 2;
  template <typename T>
  __device__ static void apply(const float (&x)[kIn], float (&y)[kOut]) {
    const float s = sigmoid<T, kFast>(x[1]);
    y[0] = x[0] * x[2] * (s * (1.0f + x[1] * (1.0f - s)));
    y[1] = x[0] * (x[1] * s);
  }
};

template <typename T>
struct Operands {
  const T* in[3];
  int64_t in_stride[3];  // elements between rows
  T* out[2];             // dense rows of kCols
};

// 16 bytes of each input -> 16 bytes of each output.
template <typename T, typename Op>
__device__ __forceinline__ void vector_math(const uint4 (&x)[Op::kIn], uint4 (&y)[Op::kOut]) {
  constexpr int kN = 16 / sizeof(T);
#pragma unroll
  for (int e = 0; e < kN; ++e) {
    float a[Op::kIn], b[Op::kOut];
#pragma unroll
    for (int k = 0; k < Op::kIn; ++k) a[k] = to_float(reinterpret_cast<const T*>(&x[k])[e]);
    Op::template apply<T>(a, b);
#pragma unroll
    for (int k = 0; k < Op::kOut; ++k) reinterpret_cast<T*>(&y[k])[e] = from_float<T>(b[k]);
  }
}

// ------------------------------------------------------------- reference: one vector per thread, flat

// Vector i of the rows (kCols / vector-width per row): load it from every input, compute, store.
template <typename T, typename Op>
__device__ __forceinline__ void one_vector(const Operands<T>& p, int64_t i) {
  constexpr int kVecsPerRow = kCols * sizeof(T) / 16;
  const int64_t row = i / kVecsPerRow, v = i % kVecsPerRow;
  uint4 x[Op::kIn], y[Op::kOut];
#pragma unroll
  for (int k = 0; k < Op::kIn; ++k) x[k] = reinterpret_cast<const uint4*>(p.in[k] + row * p.in_stride[k])[v];
  vector_math<T, Op>(x, y);
#pragma unroll
  for (int k = 0; k < Op::kOut; ++k) reinterpret_cast<uint4*>(p.out[k] + row * kCols)[v] = y[k];
}

template <typename T, typename Op, int kThreads>
__global__ void __launch_bounds__(kThreads) flat_kernel(Operands<T> p) {
  const int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (i < int64_t{kRows} * (kCols * sizeof(T) / 16)) one_vector<T, Op>(p, i);
}

// Same, persistent: a grid of resident blocks striding over the vectors.
template <typename T, typename Op, int kThreads>
__global__ void __launch_bounds__(kThreads) persistent_kernel(Operands<T> p) {
  const int64_t total = int64_t{kRows} * (kCols * sizeof(T) / 16);
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < total; i += int64_t{gridDim.x} * kThreads) {
    one_vector<T, Op>(p, i);
  }
}

// ------------------------------------------------------------------------- bulk copy engine variant

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
__device__ __forceinline__ void bulk_store(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_u32(src)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Tiles of kChunkBytes per operand along a row; block b takes tiles b, b + grid, ... (the grid works on
// one band of the tensor at a time). kStages tiles of inputs in flight per block; outputs by plain
// 16-byte stores, or (kBulkStore) staged in shared memory (two buffers) and written by the copy engine.
template <typename T, typename Op, int kThreads, int kStages, int kChunkBytes, bool kBulkStore>
__global__ void __launch_bounds__(kThreads) bulk_kernel(Operands<T> p) {
  constexpr int kIn = Op::kIn, kOut = Op::kOut;
  constexpr int kChunk = kChunkBytes / sizeof(T);
  constexpr int kTilesPerRow = (kCols + kChunk - 1) / kChunk;
  constexpr int64_t kTiles = int64_t{kRows} * kTilesPerRow;
  extern __shared__ __align__(128) unsigned char smem[];
  uint4* in_buf = reinterpret_cast<uint4*>(smem);                                   // [kStages][kIn][chunk]
  uint4* out_buf = in_buf + kStages * kIn * (kChunkBytes / 16);                      // [2][kOut][chunk]
  __shared__ uint64_t full[kStages];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(&full[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto tile_of = [&](int64_t k, int64_t& row, int& col0, int& n) {
    const int64_t t = blockIdx.x + k * gridDim.x;
    row = t / kTilesPerRow;
    col0 = static_cast<int>(t - row * kTilesPerRow) * kChunk;
    n = min(kChunk, kCols - col0);
    return t < kTiles;
  };
  auto issue = [&](int64_t k, int s) {
    int64_t row;
    int col0, n;
    if (!tile_of(k, row, col0, n)) return;
    const uint32_t bytes = n * sizeof(T);
    mbar_expect_tx(&full[s], bytes * kIn);
    for (int i = 0; i < kIn; ++i) {
      bulk_load(in_buf + (s * kIn + i) * (kChunkBytes / 16), p.in[i] + row * p.in_stride[i] + col0, bytes, &full[s]);
    }
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) issue(s, s);
  }
  for (int64_t k = 0;; ++k) {
    int64_t row;
    int col0, n;
    if (!tile_of(k, row, col0, n)) break;
    const int s = static_cast<int>(k % kStages);
    mbar_wait(&full[s], static_cast<uint32_t>((k / kStages) & 1));
    const int vecs = n * sizeof(T) / 16;
    uint4* out_stage = out_buf + (k & 1) * kOut * (kChunkBytes / 16);
    for (int v = threadIdx.x; v < vecs; v += kThreads) {
      uint4 x[kIn], y[kOut];
#pragma unroll
      for (int i = 0; i < kIn; ++i) x[i] = in_buf[(s * kIn + i) * (kChunkBytes / 16) + v];
      vector_math<T, Op>(x, y);
#pragma unroll
      for (int i = 0; i < kOut; ++i) {
        if constexpr (kBulkStore) {
          out_stage[i * (kChunkBytes / 16) + v] = y[i];
        } else {
          reinterpret_cast<uint4*>(p.out[i] + row * kCols + col0)[v] = y[i];
        }
      }
    }
    if constexpr (kBulkStore) fence_async_shared();
    __syncthreads();  // stage s read by everyone (and the outputs staged)
    if (threadIdx.x == 0) {
      if constexpr (kBulkStore) {
        for (int i = 0; i < kOut; ++i) {
          bulk_store(p.out[i] + row * kCols + col0, out_stage + i * (kChunkBytes / 16), n * sizeof(T));
        }
        bulk_commit();
        bulk_wait_read<1>();  // the other output buffer's stores have read it: free for tile k + 1
      }
      issue(k + kStages, s);
    }
    if constexpr (kBulkStore) __syncthreads();
  }
  if constexpr (kBulkStore) {
    if (threadIdx.x == 0) bulk_wait_read<0>();
  }
}

// ----------------------------------------------------------------------------------------- harness

template <typename K>
int resident_grid(K kernel, int threads, int smem) {
  int sms = 0, per_sm = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (smem > 0) CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  return sms * per_sm;
}

struct Variant {
  std::string name;
  std::function<void()> launch;
};

template <typename T, typename Op, int kThreads, int kStages, int kChunkBytes, bool kBulkStore>
Variant bulk_variant(const Operands<T>& p) {
  auto kernel = bulk_kernel<T, Op, kThreads, kStages, kChunkBytes, kBulkStore>;
  const int smem = (kStages * Op::kIn + (kBulkStore ? 2 * Op::kOut : 0)) * kChunkBytes;
  const int grid = resident_grid(kernel, kThreads, smem);
  char name[128];
  snprintf(name, sizeof(name), "bulk %s %d thr %d stages %d B (grid %d)", kBulkStore ? "ld+st" : "ld", kThreads,
           kStages, kChunkBytes, grid);
  return {name, [=] { kernel<<<grid, kThreads, smem>>>(p); }};
}

// Flat one-vector-per-thread kernel with dynamic shared memory that only caps how many blocks an SM holds.
template <typename T, typename Op>
Variant capped_variant(const Operands<T>& p, int smem) {
  constexpr int kVecsPerRow = kCols * sizeof(T) / 16;
  const int64_t total = int64_t{kRows} * kVecsPerRow;
  auto kernel = flat_kernel<T, Op, 128>;
  const int grid = resident_grid(kernel, 128, smem);
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return {"flat 128, " + std::to_string(grid / sms) + " blocks/SM",
          [=] { kernel<<<static_cast<unsigned>((total + 127) / 128), 128, smem>>>(p); }};
}

template <typename T, typename Op, typename FastOp>
void run_pass(const char* label, const Operands<T>& p, double copy_bps) {
  constexpr int kVecsPerRow = kCols * sizeof(T) / 16;
  const int64_t total = int64_t{kRows} * kVecsPerRow;
  const size_t out_elems = size_t{kRows} * kCols;
  std::vector<Variant> variants;
  variants.push_back({"flat 128 (shipped shape)", [=] {
                        flat_kernel<T, Op, 128><<<static_cast<unsigned>((total + 127) / 128), 128>>>(p);
                      }});
  variants.push_back({"flat 64", [=] {
                        flat_kernel<T, Op, 64><<<static_cast<unsigned>((total + 63) / 64), 64>>>(p);
                      }});
  {
    auto k = persistent_kernel<T, Op, 128>;
    const int grid = resident_grid(k, 128, 0);
    variants.push_back({"persistent 128 (grid " + std::to_string(grid) + ")", [=] { k<<<grid, 128>>>(p); }});
  }
  for (int kb : {15, 17, 21, 27, 37}) variants.push_back(capped_variant<T, Op>(p, kb * 1024));
  variants.push_back(bulk_variant<T, Op, 128, 4, 4096, false>(p));
  variants.push_back(bulk_variant<T, Op, 128, 4, 4096, true>(p));
  variants.push_back({"flat 128 (shipped shape) again", variants[0].launch});
  const size_t n_same = variants.size();
  if (sizeof(T) == 4) {
    variants.push_back({"flat 128 fast sigmoid (other bits)", [=] {
                          flat_kernel<T, FastOp, 128><<<static_cast<unsigned>((total + 127) / 128), 128>>>(p);
                        }});
  }
  std::vector<unsigned char> want, got(Op::kOut * out_elems * sizeof(T));
  const double bytes = (Op::kIn + Op::kOut) * double(out_elems) * sizeof(T);
  for (const Variant& v : variants) {
    for (int k = 0; k < Op::kOut; ++k) CHECK(cudaMemset(p.out[k], 0xff, out_elems * sizeof(T)));
    const float ms = time_ms(v.launch);
    for (int k = 0; k < Op::kOut; ++k) {
      CHECK(cudaMemcpy(got.data() + k * out_elems * sizeof(T), p.out[k], out_elems * sizeof(T), cudaMemcpyDeviceToHost));
    }
    const bool same_math = &v - variants.data() < static_cast<std::ptrdiff_t>(n_same);
    const char* bits = want.empty() ? "(reference)" : !same_math ? "" : (want == got ? "same bits" : "DIFFERENT BITS");
    if (want.empty()) want = got;
    printf("%-5s %-48s %9.2f us  %6.1f%% of copy  %s\n", label, v.name.c_str(), ms * 1e3,
           100.0 * bytes / (ms * 1e-3) / copy_bps, bits);
  }
}

template <typename T>
void run_dtype(const char* dtype, double copy_bps) {
  const size_t in_elems = size_t{kRows} * kRowStride, out_elems = size_t{kRows} * kCols;
  T *x, *grad, *o0, *o1;
  CHECK(cudaMalloc(&x, in_elems * sizeof(T)));
  CHECK(cudaMalloc(&grad, out_elems * sizeof(T)));
  CHECK(cudaMalloc(&o0, out_elems * sizeof(T)));
  CHECK(cudaMalloc(&o1, out_elems * sizeof(T)));
  {  // values of either sign, magnitudes about 2^-7 .. 2^8
    std::vector<float> h(in_elems);
    uint32_t s = 12345;
    for (auto& v : h) {
      s = s * 1664525u + 1013904223u;
      v = std::ldexp(1.0f + ((s >> 8) & 0xffff) / 65536.0f, static_cast<int>((s >> 24) % 16) - 7) * ((s >> 31) ? -1 : 1);
    }
    std::vector<T> ht(in_elems);
    for (size_t i = 0; i < in_elems; ++i) {
      if constexpr (sizeof(T) == 2) {
        uint32_t b;
        memcpy(&b, &h[i], 4);
        const uint16_t hb = static_cast<uint16_t>(b >> 16);
        memcpy(&ht[i], &hb, 2);
      } else {
        ht[i] = h[i];
      }
    }
    CHECK(cudaMemcpy(x, ht.data(), in_elems * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(grad, ht.data(), out_elems * sizeof(T), cudaMemcpyHostToDevice));
  }
  const Operands<T> fwd{{x, x + kCols, nullptr}, {kRowStride, kRowStride, 0}, {o0, nullptr}};
  const Operands<T> bwd{{grad, x, x + kCols}, {kCols, kRowStride, kRowStride}, {o0, o1}};
  std::string f = std::string(dtype) + " fwd", b = std::string(dtype) + " bwd";
  run_pass<T, FwdT<false>, FwdT<true>>(f.c_str(), fwd, copy_bps);
  run_pass<T, BwdT<false>, BwdT<true>>(b.c_str(), bwd, copy_bps);
  CHECK(cudaFree(x));
  CHECK(cudaFree(grad));
  CHECK(cudaFree(o0));
  CHECK(cudaFree(o1));
}

int main() {
  const double copy_bps = copy_bytes_per_second();
  run_dtype<__nv_bfloat16>("bf16", copy_bps);
  run_dtype<float>("f32", copy_bps);
  return 0;
}
