// Tuning experiment for add_rms_norm's CUDA forward at rows of 256-2048 16-byte vectors (bf16 N = 2048-16384,
// f32 N = 2048-8192), where Inductor's kernel for `F.rms_norm(x + r), x + r` ran 1.3-4.4% faster than the
// library's (history/log.md, "a thirteenth session"). Written apart from the library so that block shape and
// L2 hints can be varied alone: a block of R rows, each row on `threads` = vectors / kPer threads.
// add_norm keeps its kPer vectors a thread in registers (input and residual loaded before any is used,
// residual_out stored, the row sum in the library's precision: f64 per thread for f32 input, f32 for bf16;
// warp shuffles, then one value a warp in shared memory), then stores the normalised row. Its L2 hints (kHints):
//   kPlain:    plain loads and stores (the library's kept blocks);
//   kYFirst:   plain loads, the output stored "evict first" (the stream kernel's former Keep::kRegisters form);
//   kLoadsFirst: input and residual loaded L2 "evict first", the weight "evict last", plain stores;
//   kAllFirst:   kLoadsFirst, and both stores "evict first".
// add_norm_twice is Inductor's form (its looped reduction): sweep 1 reads input and residual and sums the
// squares of their rounded sum, storing nothing; sweep 2 reads both again, stores residual_out and the output;
// plain, or with "evict last" on sweep 1's loads and the weight and "evict first" on sweep 2's, for L2, L1 or
// both (Triton's eviction_policy on sm_90 sets both).
// Also timed: the library's own launch for these rows (launch_forward, as the op calls it: needs torch's
// headers and c10), and a device copy of the same bytes. Each time is the median of 30 runs, a 256 MiB
// memset before each (L2 flushed), events around the kernel only; two interleaved rounds. Every form's output
// is compared with a float64 reference on its first and last rows (residual_out too). `l1` as the first
// argument times only the library, the plain forms and the read-twice forms.
// What it showed (history/log.md, "a fourteenth session"; the library's launch then was the kept blocks, or
// residual_out in registers at 1024 threads for 2048 vectors): the register forms at any block shape and hint
// ran even with the library or slower (L2 "evict first" on the loads 3-5% slower); Inductor's form with both
// levels' priorities at 512 threads ran 2.4-4.6% faster at bf16 N = 4096-16384 and f32 4096 (bf16 32768x4096
// 250.3 us against 262.4, f32 32768x4096 498.7 against 519.7), 0.6% at f32 16384x8192, even at f32 4096x2048
// and slower at bf16 4096x2048 (256 vectors); the same form plain or with one level's priorities ran even or
// slower, at 1024 threads 5-17% slower. Build and run on the GPU:
//   nvcc -ccbin /usr/bin/g++ -O3 -arch=sm_90 -std=c++20 --expt-relaxed-constexpr -D__CUDA_NO_HALF_OPERATORS__ \
//     -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ \
//     $(python3 -c "from torch.utils.cpp_extension import include_paths as p; print(*('-I' + i for i in p()))") \
//     -L$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))")/lib -lc10 -lc10_cuda \
//     -Xlinker -rpath=$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))")/lib \
//     -o /tmp/norm_add_mid benchmarks/history/tuning/norm_add_mid_variants.cu && /tmp/norm_add_mid [l1] [f32|bf16]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "../../../csrc/cuda/rms_norm_forward.cuh"
#include "cuda_check.h"
#include "norm_vec.h"

namespace {

bool g_l1_only = false;  // `l1` on the command line: the library, the plain forms and the read-twice forms only

enum Hints { kPlain, kYFirst, kLoadsFirst, kAllFirst };
const char* const kHintNames[] = {"plain", "y first", "loads first", "all first"};

__device__ __forceinline__ uint64_t policy(bool first) {
  uint64_t p;
  if (first) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  }
  return p;
}

template <bool kHint>
__device__ __forceinline__ uint4 load16(const uint4* p, uint64_t pol) {
  uint4 u;
  if constexpr (!kHint) {
    u = *p;
  } else {
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p), "l"(pol));
  }
  return u;
}

// An L1 eviction priority (ld.global.L1::evict_last / evict_first), with kL2 also the L2 policy `pol`: what
// Triton emits on sm_90 for tl.load's eviction_policy (both levels; on older GPUs L1 alone).
template <bool kLast, bool kL2 = false>
__device__ __forceinline__ uint4 load16_l1(const uint4* p, uint64_t pol = 0) {
  uint4 u;
  if constexpr (kL2 && kLast) {
    asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p), "l"(pol));
  } else if constexpr (kL2) {
    asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p), "l"(pol));
  } else if constexpr (kLast) {
    asm volatile("ld.global.L1::evict_last.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p));
  } else {
    asm volatile("ld.global.L1::evict_first.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p));
  }
  return u;
}

template <bool kHint>
__device__ __forceinline__ void store16(uint4* p, uint4 u, uint64_t pol) {
  if constexpr (!kHint) {
    *p = u;
  } else {
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(u.x), "r"(u.y),
                 "r"(u.z), "r"(u.w), "l"(pol)
                 : "memory");
  }
}

// The sum over the blockDim.x threads of this thread's row (threadIdx.y), the same bits in each of them.
template <typename S>
__device__ __forceinline__ S row_sum(S v, S* scratch) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warps = blockDim.x / 32;
  if (warps == 1) return v;
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) scratch[threadIdx.y * warps + warp] = v;
  __syncthreads();
  S s = 0;
  for (int i = 0; i < warps; ++i) s += scratch[threadIdx.y * warps + i];
  __syncthreads();
  return s;
}

// blockDim.y rows a block, a row of exactly kPer * blockDim.x vectors.
template <typename T, int kPer, Hints kHints>
__global__ void __launch_bounds__(1024)
    add_norm(const T* __restrict__ x, const T* __restrict__ r, const T* __restrict__ w, T* __restrict__ h,
             T* __restrict__ y, int rows, int nv, float eps) {
  using V = Vec<T>;
  using S = typename V::Sum;
  constexpr bool kLoadHint = kHints == kLoadsFirst || kHints == kAllFirst;
  constexpr bool kHStoreHint = kHints == kAllFirst, kYStoreHint = kHints == kYFirst || kHints == kAllFirst;
  __shared__ S scratch[32];
  const uint64_t first = policy(true), last = policy(false);
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // whole rows of the block only (rows % blockDim.y == 0 in the shapes timed)
  const int64_t base = static_cast<int64_t>(row) * nv;
  const uint4* xr = reinterpret_cast<const uint4*>(x) + base;
  const uint4* rr = reinterpret_cast<const uint4*>(r) + base;
  uint4* hr = reinterpret_cast<uint4*>(h) + base;
  uint4* yr = reinterpret_cast<uint4*>(y) + base;
  const int t = threadIdx.x, threads = blockDim.x;
  uint4 v[kPer], o[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) v[k] = load16<kLoadHint>(xr + k * threads + t, first);
#pragma unroll
  for (int k = 0; k < kPer; ++k) o[k] = load16<kLoadHint>(rr + k * threads + t, first);
  S ss = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const uint4 s = add_vec<T>(v[k], o[k]);
    v[k] = s;
    store16<kHStoreHint>(hr + k * threads + t, s, first);
#pragma unroll
    for (int i = 0; i < V::kN; ++i) {
      const S f = V::get(s, i);
      ss += f * f;
    }
    opaque(v[k]);
  }
  const float rs = 1.f / sqrtf(static_cast<float>(row_sum(ss, scratch) / nv / V::kN) + eps);
  const uint4* wr = reinterpret_cast<const uint4*>(w);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int c = k * threads + t;
    const uint4 wv = load16<kLoadHint>(wr + c, last);
    uint4 out = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < V::kN; ++i) V::set(out, i, V::get(v[k], i) * rs * V::get(wv, i));
    store16<kYStoreHint>(yr + c, out, first);
  }
}

// Inductor's form (its kernel for `F.rms_norm(x + r), x + r`, a looped reduction): sweep 1 reads input and
// residual and sums the squares of their rounded sum, storing nothing; sweep 2 reads both again (from L1 or
// L2), and stores residual_out and the output. kHinted 1: sweep 1's loads L2 "evict last", sweep 2's "evict
// first", the weight "evict last", plain stores; 2: the same priorities for L1; 3: for both (what Triton
// emits for Inductor's eviction_policy on sm_90); 0: plain accesses.
template <typename T, int kPer, int kHinted>
__global__ void __launch_bounds__(1024)
    add_norm_twice(const T* __restrict__ x, const T* __restrict__ r, const T* __restrict__ w, T* __restrict__ h,
                   T* __restrict__ y, int rows, int nv, float eps) {
  using V = Vec<T>;
  using S = typename V::Sum;
  __shared__ S scratch[32];
  const uint64_t first = policy(true), last = policy(false);
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  const int64_t base = static_cast<int64_t>(row) * nv;
  const uint4* xr = reinterpret_cast<const uint4*>(x) + base;
  const uint4* rr = reinterpret_cast<const uint4*>(r) + base;
  uint4* hr = reinterpret_cast<uint4*>(h) + base;
  uint4* yr = reinterpret_cast<uint4*>(y) + base;
  const int t = threadIdx.x, threads = blockDim.x;
  auto load = [&](const uint4* q, bool keep) {
    if constexpr (kHinted == 2) {
      return keep ? load16_l1<true>(q) : load16_l1<false>(q);
    } else if constexpr (kHinted == 3) {
      return keep ? load16_l1<true, true>(q, last) : load16_l1<false, true>(q, first);
    } else {
      return load16<kHinted == 1>(q, keep ? last : first);
    }
  };
  S ss = 0;
  {
    uint4 v[kPer], o[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) v[k] = load(xr + k * threads + t, true);
#pragma unroll
    for (int k = 0; k < kPer; ++k) o[k] = load(rr + k * threads + t, true);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const uint4 s = add_vec<T>(v[k], o[k]);
#pragma unroll
      for (int i = 0; i < V::kN; ++i) {
        const S f = V::get(s, i);
        ss += f * f;
      }
    }
  }
  const float rs = 1.f / sqrtf(static_cast<float>(row_sum(ss, scratch) / nv / V::kN) + eps);
  const uint4* wr = reinterpret_cast<const uint4*>(w);
  uint4 v[kPer], o[kPer], wv[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) v[k] = load(xr + k * threads + t, false);
#pragma unroll
  for (int k = 0; k < kPer; ++k) o[k] = load(rr + k * threads + t, false);
#pragma unroll
  for (int k = 0; k < kPer; ++k) wv[k] = load(wr + k * threads + t, true);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int c = k * threads + t;
    const uint4 s = add_vec<T>(v[k], o[k]);
    store16<false>(hr + c, s, first);
    uint4 out = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < V::kN; ++i) V::set(out, i, V::get(s, i) * rs * V::get(wv[k], i));
    store16<false>(yr + c, out, first);
  }
}

// Values in [-1, 1) from a hash of the index, written on the device (the large inputs would take seconds on
// the host); the host recomputes the rows it checks.
__host__ __device__ inline float hashed(uint64_t i, uint32_t salt) {
  uint32_t s = static_cast<uint32_t>(i * 2654435761u) ^ salt ^ static_cast<uint32_t>(i >> 32);
  s ^= s >> 16;
  s *= 0x7feb352du;
  s ^= s >> 15;
  s *= 0x846ca68bu;
  s ^= s >> 16;
  return (s >> 8) / float(1 << 24) * 2.f - 1.f;
}

template <typename T>
__global__ void fill(T* p, int64_t n, uint32_t salt) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = from_float<T>(hashed(i, salt));
  }
}

template <typename T>
void run_shape(int rows, int n) {
  using V = Vec<T>;
  const int nv = n / V::kN;
  const size_t elems = size_t(rows) * n, bytes = elems * sizeof(T);
  T *x, *r, *w, *h, *y;
  for (T** p : {&x, &r, &h, &y}) CHECK(cudaMalloc(p, bytes));
  CHECK(cudaMalloc(&w, n * sizeof(T)));
  fill<<<1024, 256>>>(x, int64_t(elems), 1u);
  fill<<<1024, 256>>>(r, int64_t(elems), 2u);
  fill<<<1024, 256>>>(w, int64_t(n), 3u);
  CHECK(cudaDeviceSynchronize());
  const double moved = double(bytes) * 4 + n * sizeof(T);
  uint4 *cs, *cd;
  CHECK(cudaMalloc(&cs, size_t(moved / 2) + 16));
  CHECK(cudaMalloc(&cd, size_t(moved / 2) + 16));
  const float copy_ms = time_ms_flushed([&] { copy_kernel<<<132 * 8, 512>>>(cs, cd, int64_t(moved / 2 / 16)); });
  printf("add %s %dx%d (%d vectors a row): copy of the same bytes %.2f us (%.2f TB/s)\n",
         std::is_same_v<T, float> ? "f32" : "bf16", rows, n, nv, copy_ms * 1e3, moved / copy_ms / 1e9);
  auto check = [&](const std::string& name) {
    double worst = 0;
    for (int row : {0, rows - 1}) {
      std::vector<T> out(n), res(n);
      CHECK(cudaMemcpy(out.data(), y + size_t(row) * n, n * sizeof(T), cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(res.data(), h + size_t(row) * n, n * sizeof(T), cudaMemcpyDeviceToHost));
      std::vector<double> hv(n);
      double ss = 0;
      for (int i = 0; i < n; ++i) {
        const uint64_t k = uint64_t(row) * n + i;
        const float a = to_float(from_float<T>(hashed(k, 1u))), b = to_float(from_float<T>(hashed(k, 2u)));
        hv[i] = to_float(from_float<T>(a + b));
        if (to_float(res[i]) != hv[i]) {
          printf("  %s: WRONG residual_out at row %d, element %d\n", name.c_str(), row, i);
          exit(1);
        }
        ss += hv[i] * hv[i];
      }
      const double rs = 1.0 / std::sqrt(ss / n + 1e-6);
      for (int i = 0; i < n; ++i) {
        const double ref = hv[i] * rs * double(to_float(from_float<T>(hashed(i, 3u))));
        worst = std::max(worst, std::fabs(double(to_float(out[i])) - ref) / (1.0 + std::fabs(ref)));
      }
    }
    const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-2;
    if (!(worst <= tol)) {
      printf("  %s: WRONG, worst error %.3g\n", name.c_str(), worst);
      exit(1);
    }
  };
  auto report = [&](const std::string& name, auto launch, const void* kernel) {
    CHECK(cudaMemset(y, 0xff, bytes));
    CHECK(cudaMemset(h, 0xff, bytes));
    launch();
    CHECK(cudaDeviceSynchronize());
    check(name);
    const float ms = time_ms_flushed(launch);
    cudaFuncAttributes attr{};
    if (kernel != nullptr) CHECK(cudaFuncGetAttributes(&attr, kernel));
    printf("  %-34s %8.2f us  %5.1f%% of the same-bytes copy  (%d registers)\n", name.c_str(), ms * 1e3,
           100.0 * copy_ms / ms, attr.numRegs);
  };
  // the library's launch, as the op makes it (weight given, offset 0, rstd written)
  using L = std::conditional_t<std::is_same_v<T, float>, float, c10::BFloat16>;
  constexpr int kC = 16 / sizeof(T);
  float* rstd;
  CHECK(cudaMalloc(&rstd, rows * sizeof(float)));
  auto library = [&] {
    const torchops::rms_norm_kernels::ForwardArgs<L, L> a{reinterpret_cast<const L*>(x), n,
                                                          reinterpret_cast<const L*>(r), n,
                                                          reinterpret_cast<L*>(h),
                                                          reinterpret_cast<const L*>(w),
                                                          reinterpret_cast<L*>(y), rstd};
    torchops::rms_norm_kernels::launch_forward<L, L, kC, true>(a, rows, n, 1e-6, 0.0, nullptr);
  };
  auto form = [&](auto kernel, int per, int rows_per_block, const char* hints) {
    const int threads = nv / per;
    if (nv % per != 0 || threads < 32 || threads % 32 != 0 || threads * rows_per_block > 1024 ||
        rows % rows_per_block != 0) {
      return;
    }
    char name[96];
    snprintf(name, sizeof(name), "%d x %d thr x %d row, %s", per, threads, rows_per_block, hints);
    const dim3 block(threads, rows_per_block);
    report(name, [&] { kernel<<<rows / rows_per_block, block>>>(x, r, w, h, y, rows, nv, 1e-6f); },
           reinterpret_cast<const void*>(kernel));
  };
  for (int round = 0; round < 2; ++round) {
    printf(" round %d\n", round + 1);
    report("library (launch_forward)", library, nullptr);
    for (int rpb : {1, 2}) {
      if (!g_l1_only) {
        form(add_norm<T, 1, kPlain>, 1, rpb, kHintNames[kPlain]);
        form(add_norm<T, 1, kLoadsFirst>, 1, rpb, kHintNames[kLoadsFirst]);
        form(add_norm<T, 2, kYFirst>, 2, rpb, kHintNames[kYFirst]);
        form(add_norm<T, 2, kLoadsFirst>, 2, rpb, kHintNames[kLoadsFirst]);
        form(add_norm<T, 2, kAllFirst>, 2, rpb, kHintNames[kAllFirst]);
        form(add_norm<T, 4, kYFirst>, 4, rpb, kHintNames[kYFirst]);
        form(add_norm<T, 4, kLoadsFirst>, 4, rpb, kHintNames[kLoadsFirst]);
        form(add_norm<T, 4, kAllFirst>, 4, rpb, kHintNames[kAllFirst]);
        form(add_norm<T, 8, kPlain>, 8, rpb, kHintNames[kPlain]);
        form(add_norm<T, 8, kLoadsFirst>, 8, rpb, kHintNames[kLoadsFirst]);
        form(add_norm_twice<T, 1, 1>, 1, rpb, "read twice, L2 hints");
        form(add_norm_twice<T, 2, 1>, 2, rpb, "read twice, L2 hints");
        form(add_norm_twice<T, 4, 1>, 4, rpb, "read twice, L2 hints");
      }
      form(add_norm<T, 2, kPlain>, 2, rpb, kHintNames[kPlain]);
      form(add_norm<T, 4, kPlain>, 4, rpb, kHintNames[kPlain]);
      form(add_norm_twice<T, 1, 0>, 1, rpb, "read twice, plain");
      form(add_norm_twice<T, 2, 0>, 2, rpb, "read twice, plain");
      form(add_norm_twice<T, 4, 0>, 4, rpb, "read twice, plain");
      form(add_norm_twice<T, 1, 2>, 1, rpb, "read twice, L1 hints");
      form(add_norm_twice<T, 2, 2>, 2, rpb, "read twice, L1 hints");
      form(add_norm_twice<T, 4, 2>, 4, rpb, "read twice, L1 hints");
      form(add_norm_twice<T, 1, 3>, 1, rpb, "read twice, L1+L2 hints");
      form(add_norm_twice<T, 2, 3>, 2, rpb, "read twice, L1+L2 hints");
      form(add_norm_twice<T, 4, 3>, 4, rpb, "read twice, L1+L2 hints");
    }
  }
  CHECK(cudaFree(rstd));
  for (void* p : {(void*)x, (void*)r, (void*)w, (void*)h, (void*)y, (void*)cs, (void*)cd}) CHECK(cudaFree(p));
}

}  // namespace

int main(int argc, char** argv) {
  copy_bytes_per_second();
  std::string only = argc > 1 ? argv[1] : "";
  if (only == "l1") {
    g_l1_only = true;
    only = argc > 2 ? argv[2] : "";
  }
  auto want = [&](const char* tag) { return only.empty() || only == tag; };
  if (want("f32")) {
    run_shape<float>(4096, 2048);
    run_shape<float>(32768, 4096);
    run_shape<float>(16384, 8192);
  }
  if (want("bf16")) {
    run_shape<__nv_bfloat16>(4096, 2048);
    run_shape<__nv_bfloat16>(32768, 4096);
    run_shape<__nv_bfloat16>(16384, 8192);
    run_shape<__nv_bfloat16>(8192, 16384);
  }
  return 0;
}
