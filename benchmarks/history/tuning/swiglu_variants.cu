// Tuning experiment for the bf16 swiglu kernels on the H200, outside torch: the same math in several launch
// shapes and memory-access styles, timed against a device-to-device copy of the same size in the same
// program. The inputs are the two halves of x.chunk(2, -1) of a (16384, 28672) bf16 tensor, read in place
// (row stride 28672), the outputs dense (16384, 14336): the bench shape of issue 3, where torch.compile's
// kernels ran at 102-103% of copy and ours at 98% (benchmarks/history/log.md). Build and run on the GPU:
//   nvcc -O3 -arch=sm_90 -o /tmp/swiglu_variants benchmarks/history/tuning/swiglu_variants.cu && /tmp/swiglu_variants
// Prints, per variant, the median of 30 timed runs and % of copy, counting each operand read or written once.
// Each variant's outputs are compared bit for bit with the first variant's (same math).
// Run on the H200 on 2026-11-30 (benchmarks/history/log.md, "swiglu — launch shape"): every variant within 101-102% of copy
// except evict-first loads (96%), contiguous vectors per thread (63-82%) and accurate math (88.5%); one
// vector per thread was the best launch shape, which led to the shipped kernel's kRowsUnroll = 1.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

constexpr int kRows = 16384, kCols = 14336, kRowStride = 2 * kCols;
constexpr int kVec = 8;                     // bf16 per 16-byte vector
constexpr int kVecsPerRow = kCols / kVec;  // 1792

// ------------------------------------------------------------------------------------------- math

enum Math { kFast = 0, kAccurate = 1, kNone = 2 };

template <Math M>
__device__ __forceinline__ float sigmoid(float x) {
  if constexpr (M == kFast) return __fdividef(0x1p-64f, (1.0f + __expf(-x)) * 0x1p-64f);  // the shipped one
  if constexpr (M == kAccurate) return __frcp_rn(1.0f + expf(-x));
  return 1.0f;
}

struct Fwd {  // (gate, up) -> out
  static constexpr int kIn = 2, kOut = 1;
  template <Math M>
  __device__ static void apply(const float (&x)[kIn], float (&y)[kOut]) {
    y[0] = x[0] * sigmoid<M>(x[0]) * x[1];
  }
};

struct Bwd {  // (grad, gate, up) -> (grad_gate, grad_up)
  static constexpr int kIn = 3, kOut = 2;
  template <Math M>
  __device__ static void apply(const float (&x)[kIn], float (&y)[kOut]) {
    const float s = sigmoid<M>(x[1]);
    y[0] = x[0] * x[2] * (s * (1.0f + x[1] * (1.0f - s)));
    y[1] = x[0] * (x[1] * s);
  }
};

// ---------------------------------------------------------------------------------- memory access

enum Access { kPlain = 0, kStreamStore = 1, kEvictFirstLoad = 2 };

template <Access A>
__device__ __forceinline__ uint4 load16(const uint4* p) {
  if constexpr (A == kEvictFirstLoad) return __ldcs(p);
  return *p;
}

template <Access A>
__device__ __forceinline__ void store16(uint4* p, uint4 v) {
  if constexpr (A == kStreamStore) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

struct Operands {
  const __nv_bfloat16* in[3];
  int64_t in_stride[3];    // elements between rows
  __nv_bfloat16* out[2];   // dense rows
};

template <typename Op, Math M, Access A>
__device__ __forceinline__ void do_vector(const Operands& p, int64_t row, int64_t vcol) {
  uint4 raw[Op::kIn];
#pragma unroll
  for (int k = 0; k < Op::kIn; ++k) raw[k] = load16<A>(reinterpret_cast<const uint4*>(p.in[k] + row * p.in_stride[k]) + vcol);
  uint4 res[Op::kOut];
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    float x[Op::kIn], y[Op::kOut];
#pragma unroll
    for (int k = 0; k < Op::kIn; ++k) x[k] = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(&raw[k])[e]);
    Op::template apply<M>(x, y);
#pragma unroll
    for (int k = 0; k < Op::kOut; ++k) reinterpret_cast<__nv_bfloat16*>(&res[k])[e] = __float2bfloat16(y[k]);
  }
#pragma unroll
  for (int k = 0; k < Op::kOut; ++k) store16<A>(reinterpret_cast<uint4*>(p.out[k] + row * kCols) + vcol, res[k]);
}

// 1-D over all vectors, row = i / vectors-per-row (the shipped rows_elementwise_kernel's indexing, with a
// plain division where it uses a multiply-shift: the compiler turns the constant divisor into the same).
// Loads of all kUnroll vectors first, then math and stores, as the shipped kernel does.
template <typename Op, Math M, Access A, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) flat_kernel(Operands p) {
  const int64_t total = int64_t{kRows} * kVecsPerRow;
  const int64_t base = int64_t{blockIdx.x} * (kThreads * kUnroll) + threadIdx.x;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = base + u * kThreads;
    if (i < total) do_vector<Op, M, A>(p, i / kVecsPerRow, i % kVecsPerRow);
  }
}

// 2-D: blockIdx.y is the row, so no division at all; blockIdx.x covers the row's vectors.
template <typename Op, Math M, Access A, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) rows2d_kernel(Operands p) {
  const int64_t row = blockIdx.y;
  const int v0 = blockIdx.x * (kThreads * kUnroll) + threadIdx.x;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int v = v0 + u * kThreads;
    if (v < kVecsPerRow) do_vector<Op, M, A>(p, row, v);
  }
}

// Each thread takes kUnroll consecutive vectors (32-64 contiguous bytes per operand per thread).
template <typename Op, Math M, Access A, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) contiguous_per_thread_kernel(Operands p) {
  const int64_t row = blockIdx.y;
  const int v0 = (blockIdx.x * kThreads + threadIdx.x) * kUnroll;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int v = v0 + u;
    if (v < kVecsPerRow) do_vector<Op, M, A>(p, row, v);
  }
}

// ----------------------------------------------------------------------------------------- harness

int main() {
  const size_t in_elems = size_t{kRows} * kRowStride, out_elems = size_t{kRows} * kCols;
  __nv_bfloat16 *x, *grad, *o0, *o1;
  CHECK(cudaMalloc(&x, in_elems * 2));
  CHECK(cudaMalloc(&grad, out_elems * 2));
  CHECK(cudaMalloc(&o0, out_elems * 2));
  CHECK(cudaMalloc(&o1, out_elems * 2));
  {  // random bf16 of either sign with magnitudes 2^-7 .. 2^8: every branch of the sigmoid's range
    std::vector<uint16_t> h(in_elems);
    uint32_t s = 12345;
    for (auto& v : h) {
      s = s * 1664525u + 1013904223u;
      v = static_cast<uint16_t>(((s >> 31) << 15) | (0x3c00u + ((s >> 16) & 0x7ff)));
    }
    CHECK(cudaMemcpy(x, h.data(), in_elems * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(grad, h.data(), out_elems * 2, cudaMemcpyHostToDevice));
  }
  const double copy_bps = copy_bytes_per_second();

  const Operands fwd{{x, x + kCols, nullptr}, {kRowStride, kRowStride, 0}, {o0, nullptr}};
  const Operands bwd{{grad, x, x + kCols}, {kCols, kRowStride, kRowStride}, {o0, o1}};
  struct Row {
    const char* name;
    bool backward;
    bool same_math;  // compared bit for bit with the first row of its pass
    void (*launch)(const Operands&);
  };
#define FLAT(OP, M, A, T, U)                                                                     \
  [](const Operands& p) {                                                                        \
    const int64_t total = int64_t{kRows} * kVecsPerRow;                                          \
    flat_kernel<OP, M, A, T, U><<<static_cast<unsigned>((total + T * U - 1) / (T * U)), T>>>(p); \
  }
#define ROWS2D(OP, M, A, T, U) \
  [](const Operands& p) { rows2d_kernel<OP, M, A, T, U><<<dim3((kVecsPerRow + T * U - 1) / (T * U), kRows), T>>>(p); }
#define CONTIG(OP, M, A, T, U)                                                                                \
  [](const Operands& p) {                                                                                     \
    contiguous_per_thread_kernel<OP, M, A, T, U><<<dim3((kVecsPerRow + T * U - 1) / (T * U), kRows), T>>>(p); \
  }
  const Row rows[] = {
      {"fwd flat 128x2 (shipped)", false, true, FLAT(Fwd, kFast, kPlain, 128, 2)},
      {"fwd flat 128x1", false, true, FLAT(Fwd, kFast, kPlain, 128, 1)},
      {"fwd flat 256x1", false, true, FLAT(Fwd, kFast, kPlain, 256, 1)},
      {"fwd flat 128x4", false, true, FLAT(Fwd, kFast, kPlain, 128, 4)},
      {"fwd 2d 128x2", false, true, ROWS2D(Fwd, kFast, kPlain, 128, 2)},
      {"fwd 2d 256x1", false, true, ROWS2D(Fwd, kFast, kPlain, 256, 1)},
      {"fwd 2d 128x4", false, true, ROWS2D(Fwd, kFast, kPlain, 128, 4)},
      {"fwd 2d 128x2 streaming stores", false, true, ROWS2D(Fwd, kFast, kStreamStore, 128, 2)},
      {"fwd 2d 128x2 evict-first loads", false, true, ROWS2D(Fwd, kFast, kEvictFirstLoad, 128, 2)},
      {"fwd contiguous 128x2 per thread", false, true, CONTIG(Fwd, kFast, kPlain, 128, 2)},
      {"fwd contiguous 256x2 per thread", false, true, CONTIG(Fwd, kFast, kPlain, 256, 2)},
      {"fwd flat 128x2 accurate exp/rcp", false, false, FLAT(Fwd, kAccurate, kPlain, 128, 2)},
      {"fwd flat 128x2 no sigmoid (memory only)", false, false, FLAT(Fwd, kNone, kPlain, 128, 2)},
      {"bwd flat 128x2 (shipped)", true, true, FLAT(Bwd, kFast, kPlain, 128, 2)},
      {"bwd flat 256x1", true, true, FLAT(Bwd, kFast, kPlain, 256, 1)},
      {"bwd 2d 128x2", true, true, ROWS2D(Bwd, kFast, kPlain, 128, 2)},
      {"bwd 2d 256x1", true, true, ROWS2D(Bwd, kFast, kPlain, 256, 1)},
      {"bwd 2d 128x2 streaming stores", true, true, ROWS2D(Bwd, kFast, kStreamStore, 128, 2)},
      {"bwd contiguous 128x2 per thread", true, true, CONTIG(Bwd, kFast, kPlain, 128, 2)},
      {"bwd flat 128x2 no sigmoid (memory only)", true, false, FLAT(Bwd, kNone, kPlain, 128, 2)},
  };
  std::vector<uint16_t> want_fwd, want_bwd, got(2 * out_elems);
  for (const Row& r : rows) {
    CHECK(cudaMemset(o0, 0xff, out_elems * 2));  // poison: an unwritten element shows as a different bit
    CHECK(cudaMemset(o1, 0xff, out_elems * 2));
    const Operands& p = r.backward ? bwd : fwd;
    const float ms = time_ms([&] { r.launch(p); });
    const double bytes = (r.backward ? 5.0 : 3.0) * 2.0 * out_elems;
    printf("%-44s %9.2f us  %6.1f%% of copy", r.name, ms * 1e3, 100.0 * bytes / (ms * 1e-3) / copy_bps);
    CHECK(cudaMemcpy(got.data(), o0, out_elems * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(got.data() + out_elems, o1, out_elems * 2, cudaMemcpyDeviceToHost));
    if (!r.backward) std::fill(got.begin() + out_elems, got.end(), 0);
    std::vector<uint16_t>& want = r.backward ? want_bwd : want_fwd;
    if (r.same_math) {
      if (want.empty()) {
        want = got;
        printf("  (reference)");
      } else {
        printf("  %s", want == got ? "same bits" : "DIFFERENT BITS");
      }
    }
    printf("\n");
  }
  return 0;
}
