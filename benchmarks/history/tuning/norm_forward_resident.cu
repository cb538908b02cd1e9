// Tuning experiment for rms_norm's CUDA forward at the long rows where it trails a peer: add_rms_norm bf16
// 4096x32768 (Liger's one-program-a-row kernel keeps the row in registers and runs 5-6% faster) and rms_norm
// f32 4096x32768 (torch.compile's looped reduction runs 5% faster). Written apart from the library so that
// the forms compare on equal terms: one 1024-thread block a row, kPer 16-byte vectors a thread, all of a
// thread's loads issued before any is used, a block sum (warp shuffles, one value a warp in shared memory).
// The forms (kMode):
//   kRegs: the row stays in registers over the row sum (packed 16-bit values, as Liger's Triton kernel);
//   kSmem: add_rms_norm's shipped form: residual_out kept in shared memory, each thread its own vectors;
//   kReread: rms_norm's shipped form: the row read again after the row sum (from L1 when it fits).
// kHints: the shipped L2 hints (the first read of a row read twice "evict last", reads read once, the
// second read and the stores "evict first"); without: plain accesses.
// Each time is the median of 30 runs, a 256 MiB memset before each (as triton's do_bench flushes L2),
// events around the kernel only; "copy" is a device copy of the same bytes timed the same way. Every form's
// output is compared with a float64 reference on its first and last rows. Build and run on the GPU:
//   nvcc -ccbin /usr/bin/g++ -O3 -arch=sm_90 -std=c++17 -o /tmp/norm_resident \
//     benchmarks/history/tuning/norm_forward_resident.cu && /tmp/norm_resident
// `/tmp/norm_resident short` times add_rms_norm's rows of 2048 vectors (1 or 2 a thread) instead.
// With -DWITH_LIBRARY it also times the library's own stream kernel (norm_forward_stream_kernel, 1024
// threads; add_rms_norm keeps residual_out in shared memory), both its loop form (kPer = 0) and its form for
// rows of exactly kPer vectors a thread, on the same tensors in the same harness; it needs torch's headers
// and c10 (as norm_rows_variants.cu). The library's loop kernel timed here as through the op (add bf16
// 4096x32768 280.1 us, f32 4096x32768 270.9), so the gap to the forms above was the code, not the harness;
// its kPer kernel without the add's hints ran as the forms here (add bf16 263.0 against 262.5); history/log.md,
// "a tenth session":
//   nvcc -ccbin /usr/bin/g++ -O3 -arch=sm_90 -std=c++20 --expt-relaxed-constexpr -D__CUDA_NO_HALF_OPERATORS__ \
//     -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ \
//     -DWITH_LIBRARY $(python3 -c "from torch.utils.cpp_extension import include_paths as p; print(*('-I' + i for i in p()))") \
//     -L$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))")/lib -lc10 -lc10_cuda \
//     -Xlinker -rpath=$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))")/lib \
//     -o /tmp/norm_resident benchmarks/history/tuning/norm_forward_resident.cu && /tmp/norm_resident
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_check.h"
#include "norm_vec.h"
#ifdef WITH_LIBRARY
#include "../../../csrc/cuda/rms_norm_forward.cuh"
#endif

enum Mode { kRegs, kSmem, kReread };
constexpr int kThreads = 1024;

__device__ __forceinline__ uint64_t policy_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t policy_last() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}

template <bool kHint, bool kL1 = true>
__device__ __forceinline__ uint4 load16(const void* p, uint64_t policy) {
  uint4 u;
  if constexpr (!kHint) {
    u = *reinterpret_cast<const uint4*>(p);
  } else if constexpr (kL1) {
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p), "l"(policy));
  } else {
    asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p), "l"(policy));
  }
  return u;
}

template <bool kHint>
__device__ __forceinline__ void store16(void* p, uint4 u, uint64_t policy) {
  if constexpr (!kHint) {
    *reinterpret_cast<uint4*>(p) = u;
  } else {
    asm volatile("st.global.L1::no_allocate.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(u.x),
                 "r"(u.y), "r"(u.z), "r"(u.w), "l"(policy)
                 : "memory");
  }
}

__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = scratch[threadIdx.x % 32];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  return v;
}

// One row a block; a row of n = kPer * kThreads vectors exactly (the shapes timed here).
template <typename T, int kPer, bool kAdd, Mode kMode, bool kHints>
__global__ void __launch_bounds__(kThreads, 1)
    norm_forward(const T* __restrict__ x, const T* __restrict__ r, const T* __restrict__ w, T* __restrict__ h,
                 T* __restrict__ y, int n, float eps) {
  using V = Vec<T>;
  __shared__ float scratch[32];
  extern __shared__ uint4 kept[];  // kSmem: this thread's vectors at kept[k * kThreads + threadIdx.x]
  const uint64_t first = policy_first(), last = policy_last();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * n;
  const uint4* xr = reinterpret_cast<const uint4*>(x + base);
  const uint4* rr = reinterpret_cast<const uint4*>(kAdd ? r + base : nullptr);
  uint4* hr = reinterpret_cast<uint4*>(kAdd ? h + base : nullptr);
  uint4* yr = reinterpret_cast<uint4*>(y + base);
  uint4 v[kPer];
  float ss = 0.f;
  if constexpr (kAdd) {
    uint4 o[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) v[k] = load16<kHints>(xr + k * kThreads + threadIdx.x, first);
#pragma unroll
    for (int k = 0; k < kPer; ++k) o[k] = load16<kHints>(rr + k * kThreads + threadIdx.x, first);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const uint4 s = add_vec<T>(v[k], o[k]);
      v[k] = s;
      store16<kHints>(hr + k * kThreads + threadIdx.x, s, first);
      if constexpr (kMode == kSmem) kept[k * kThreads + threadIdx.x] = s;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      v[k] = load16<kHints>(xr + k * kThreads + threadIdx.x, kMode == kReread ? last : first);
    }
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
#pragma unroll
    for (int i = 0; i < V::kN; ++i) {
      const float f = V::get(v[k], i);
      ss += f * f;
    }
    opaque(v[k]);
  }
  const float rs = rsqrtf(block_sum(ss, scratch) / n + eps);
  const uint4* wr = reinterpret_cast<const uint4*>(w);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int c = k * kThreads + threadIdx.x;
    uint4 a;
    if constexpr (kMode == kRegs) {
      a = v[k];
    } else if constexpr (kMode == kSmem) {
      a = kept[c];
    } else {
      a = load16<kHints, false>(xr + c, first);
    }
    const uint4 wv = wr[c];
    uint4 out = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < V::kN; ++i) V::set(out, i, V::get(a, i) * rs * V::get(wv, i));
    store16<kHints>(yr + c, out, first);
  }
}

template <typename T, int kPer, bool kAdd>
void run_shape(int rows) {
  const int n = kPer * kThreads * Vec<T>::kN;
  const size_t elems = size_t(rows) * n, bytes = elems * sizeof(T);
  T *x, *r, *w, *h, *y;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&r, bytes));
  CHECK(cudaMalloc(&h, bytes));
  CHECK(cudaMalloc(&y, bytes));
  CHECK(cudaMalloc(&w, n * sizeof(T)));
  std::vector<T> hx(elems), hr(elems), hw(n);
  uint32_t s = 12345;
  auto rnd = [&] { s = s * 1664525u + 1013904223u; return (s >> 8) / float(1 << 24) * 2.f - 1.f; };
  for (auto& v : hx) v = from_float<T>(rnd());
  for (auto& v : hr) v = from_float<T>(rnd());
  for (auto& v : hw) v = from_float<T>(rnd());
  CHECK(cudaMemcpy(x, hx.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(r, hr.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(w, hw.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  const double moved = double(bytes) * (kAdd ? 4 : 2);
  // a copy of the same bytes (one tensor in, one out, as many times as the op's tensors pair up)
  uint4 *cs, *cd;
  CHECK(cudaMalloc(&cs, size_t(moved / 2)));
  CHECK(cudaMalloc(&cd, size_t(moved / 2)));
  const float copy_ms = time_ms_flushed([&] {
    copy_kernel<<<132 * 8, 512>>>(cs, cd, int64_t(moved / 2 / 16));
  });
  printf("%s %s %dx%d: copy of the same bytes %.1f us (%.2f TB/s)\n", kAdd ? "add" : "plain",
         std::is_same_v<T, float> ? "f32" : "bf16", rows, n, copy_ms * 1e3, moved / copy_ms / 1e9);
  auto check = [&](const char* name) {
    double worst = 0;
    for (int row : {0, rows - 1}) {
      std::vector<T> out(n);
      CHECK(cudaMemcpy(out.data(), y + size_t(row) * n, n * sizeof(T), cudaMemcpyDeviceToHost));
      std::vector<double> hv(n);
      double ss = 0;
      for (int i = 0; i < n; ++i) {
        const size_t k = size_t(row) * n + i;
        hv[i] = kAdd ? double(to_float(from_float<T>(to_float(hx[k]) + to_float(hr[k])))) : double(to_float(hx[k]));
        ss += hv[i] * hv[i];
      }
      const double rs = 1.0 / std::sqrt(ss / n + 1e-6);
      for (int i = 0; i < n; ++i) {
        const double ref = hv[i] * rs * double(to_float(hw[i]));
        worst = std::max(worst, std::fabs(double(to_float(out[i])) - ref) / (1.0 + std::fabs(ref)));
      }
    }
    const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-2;
    if (!(worst <= tol)) {
      printf("  %s: WRONG, worst error %.3g\n", name, worst);
      exit(1);
    }
  };
  auto time_form = [&](auto kernel, const char* name, size_t smem) {
    if (smem > 48 * 1024) CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CHECK(cudaMemset(y, 0xff, bytes));
    kernel<<<rows, kThreads, smem>>>(x, r, w, h, y, n, 1e-6f);
    CHECK(cudaDeviceSynchronize());
    check(name);
    int regs = 0;
    cudaFuncAttributes attr;
    CHECK(cudaFuncGetAttributes(&attr, kernel));
    regs = attr.numRegs;
    const float ms = time_ms_flushed([&] { kernel<<<rows, kThreads, smem>>>(x, r, w, h, y, n, 1e-6f); });
    printf("  %-22s %7.1f us  %5.1f%% of the same-bytes copy  (%d registers, %d spill bytes)\n", name, ms * 1e3,
           100.0 * copy_ms / ms, regs, int(attr.localSizeBytes));
  };
  const size_t row_smem = size_t(kPer) * kThreads * 16;
#ifdef WITH_LIBRARY
  // The library's kernel at the shape its launch picks for these rows (1024 threads; add_rms_norm keeps
  // residual_out in shared memory), with the weight, offset 0, rstd written.
  using L = std::conditional_t<std::is_same_v<T, float>, float, c10::BFloat16>;
  constexpr int kC = 16 / sizeof(T);
  float* rstd;
  CHECK(cudaMalloc(&rstd, rows * sizeof(float)));
  auto library = [&](auto kernel, const char* name) {
    const size_t smem = kAdd ? row_smem : 0;
    if (smem > 48 * 1024) CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    auto launch = [&] {
      kernel<<<rows, kThreads, smem>>>(reinterpret_cast<const L*>(x), n, reinterpret_cast<const L*>(r), n,
                                       reinterpret_cast<L*>(h), reinterpret_cast<const L*>(w), 0.f,
                                       reinterpret_cast<L*>(y), rstd, rows, n, 1e-6f);
    };
    CHECK(cudaMemset(y, 0xff, bytes));
    launch();
    CHECK(cudaDeviceSynchronize());
    check(name);
    cudaFuncAttributes attr;
    CHECK(cudaFuncGetAttributes(&attr, kernel));
    const float ms = time_ms_flushed(launch);
    printf("  %-22s %7.1f us  %5.1f%% of the same-bytes copy  (%d registers, %d spill bytes)\n", name,
           ms * 1e3, 100.0 * copy_ms / ms, attr.numRegs, int(attr.localSizeBytes));
  };
#endif
#ifdef WITH_LIBRARY
  // the library's Keep: add_rms_norm keeps residual_out in shared memory, rms_norm reads its row back
  using torchops::rms_norm_kernels::Keep;
  constexpr Keep kKeep = kAdd ? Keep::kShared : Keep::kReadBack;
#endif
  for (int round = 0; round < 2; ++round) {
#ifdef WITH_LIBRARY
    library(torchops::rms_norm_kernels::norm_forward_stream_kernel<L, L, kC, kAdd, true, kKeep>, "library loop kernel");
    if constexpr (kPer % 4 == 0) {  // the library's kPer kernel takes whole batches of 4
      library(torchops::rms_norm_kernels::norm_forward_stream_kernel<L, L, kC, kAdd, true, kKeep, kPer>,
              "library kPer kernel");
    }
#endif
    time_form(norm_forward<T, kPer, kAdd, kRegs, false>, "registers, no hints", 0);
    time_form(norm_forward<T, kPer, kAdd, kRegs, true>, "registers, hints", 0);
    if constexpr (kAdd) {
      time_form(norm_forward<T, kPer, kAdd, kSmem, true>, "shared (shipped), hints", row_smem);
      time_form(norm_forward<T, kPer, kAdd, kSmem, false>, "shared, no hints", row_smem);
    } else {
      time_form(norm_forward<T, kPer, kAdd, kReread, true>, "reread (shipped), hints", 0);
      time_form(norm_forward<T, kPer, kAdd, kReread, false>, "reread, no hints", 0);
    }
  }
#ifdef WITH_LIBRARY
  CHECK(cudaFree(rstd));
#endif
  for (void* p : {(void*)x, (void*)r, (void*)w, (void*)h, (void*)y, (void*)cs, (void*)cd}) CHECK(cudaFree(p));
}

int main(int argc, char** argv) {
  copy_bytes_per_second();
  if (argc > 1 && std::string(argv[1]) == "short") {
    // rows of 2 vectors a thread, where add_rms_norm still runs its kept blocks (2048 vectors) and trails Liger
    run_shape<__nv_bfloat16, 2, true>(8192);  // add_rms_norm bf16 8192x16384
    run_shape<float, 2, true>(16384);         // add_rms_norm f32 16384x8192
    run_shape<__nv_bfloat16, 1, true>(16384); // add_rms_norm bf16 16384x8192
    return 0;
  }
  run_shape<__nv_bfloat16, 4, true>(4096);  // add_rms_norm bf16 4096x32768
  run_shape<float, 4, true>(8192);          // add_rms_norm f32 8192x16384
  run_shape<float, 8, false>(4096);         // rms_norm f32 4096x32768
  run_shape<__nv_bfloat16, 4, false>(4096); // rms_norm bf16 4096x32768
  return 0;
}
