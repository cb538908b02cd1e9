// Helpers shared by the standalone norm tuning programs (norm_forward_resident.cu, norm_add_mid_variants.cu):
// a 16-byte vector of bf16 or f32 held as uint4 (Vec<T>: element i as a float, and back; add_vec), a barrier against
// ptxas unpacking it, a scalar's conversions to and from float, and a grid-stride device copy as the
// reference for "a copy of the same bytes".
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

// The 16-byte vector's elements as floats, and back (bf16: 8 a vector, rounded to nearest even; f32: 4).
// Sum: the row sum's type in the library (RowSum: f32 for 16-bit input, f64 for f32).
template <typename T>
struct Vec;
template <>
struct Vec<__nv_bfloat16> {
  static constexpr int kN = 8;
  using Sum = float;
  __device__ static float get(const uint4& u, int i) {
    const uint32_t w = (&u.x)[i / 2];
    return __uint_as_float(i % 2 ? (w & 0xffff0000u) : (w << 16));
  }
  __device__ static void set(uint4& u, int i, float f) {
    const uint32_t b = __bfloat16_as_ushort(__float2bfloat16_rn(f));
    uint32_t& w = (&u.x)[i / 2];
    w = i % 2 ? ((w & 0xffffu) | (b << 16)) : ((w & 0xffff0000u) | b);
  }
};
template <>
struct Vec<float> {
  static constexpr int kN = 4;
  using Sum = double;
  __device__ static float get(const uint4& u, int i) { return __uint_as_float((&u.x)[i]); }
  __device__ static void set(uint4& u, int i, float f) { (&u.x)[i] = __float_as_uint(f); }
};

// Element-wise a + b, each sum rounded to T (residual_out).
template <typename T>
__device__ __forceinline__ uint4 add_vec(const uint4& a, const uint4& b) {
  uint4 s = {0, 0, 0, 0};
#pragma unroll
  for (int i = 0; i < Vec<T>::kN; ++i) Vec<T>::set(s, i, Vec<T>::get(a, i) + Vec<T>::get(b, i));
  return s;
}

__device__ __forceinline__ void opaque(uint4& u) {  // keeps a packed vector packed over the row sum
  asm volatile("" : "+r"(u.x), "+r"(u.y), "+r"(u.z), "+r"(u.w));
}

template <typename T>
__host__ __device__ inline float to_float(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return __bfloat162float(v);
  }
}

template <typename T>
__host__ __device__ inline T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return __float2bfloat16_rn(v);
  }
}

__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = src[i];
  }
}
