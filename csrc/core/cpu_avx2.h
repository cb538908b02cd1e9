// AVX2/F16C loads and stores of 8 f16/bf16/f32 values as f32, f32 exp/sigmoid/normal CDF and lookups by
// stored bits, for the CPU kernels' hot loops.
//
// Extensions are compiled for baseline x86-64 (like libtorch itself, which dispatches at run time), so
// at::vec::Vectorized<Half/BFloat16> falls back to per-element software conversion there, far slower than
// torch's own kernels for f16. These helpers are compiled for AVX2+FMA+F16C per function (target attribute) and
// are only called after cpu_has_avx2() says the processor has them.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#define TORCHOPS_HAS_AVX2_PATH 1
#include <immintrin.h>

#define TORCHOPS_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace torchops {
namespace cpu {

inline bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return has;
}

// 8 f16/bf16 values as raw 16-bit lanes <-> 8 f32 lanes. T selects the format.
template <typename T>
TORCHOPS_TARGET_AVX2 inline __m256 bits8_to_float(__m128i bits) {
  if constexpr (std::is_same_v<T, c10::Half>) {
    return _mm256_cvtph_ps(bits);
  } else {  // bf16 is the top half of an f32
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  }
}

template <typename T>
TORCHOPS_TARGET_AVX2 inline __m128i float8_to_bits(__m256 v) {
  if constexpr (std::is_same_v<T, c10::Half>) {
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {  // round to nearest even exactly as c10::BFloat16(float) does, NaN -> 0x7FC0
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), is_nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
  }
}

// T is c10::Half, c10::BFloat16 or float.
template <typename T>
TORCHOPS_TARGET_AVX2 inline __m256 load8_as_float(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_loadu_ps(p);
  } else {
    return bits8_to_float<T>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

template <typename T>
TORCHOPS_TARGET_AVX2 inline void store8_from_float(T* p, __m256 v) {
  if constexpr (std::is_same_v<T, float>) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), float8_to_bits<T>(v));
  }
}

// Sum of the 8 lanes (pairwise: lanes i and i+4, then i and i+2, then the last two).
TORCHOPS_TARGET_AVX2 inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Strided: the 8 values p[0], p[s], ..., p[7s] assembled in a register (a round trip through a small
// buffer would stall on store-to-load forwarding), and the reverse.
template <typename T>
TORCHOPS_TARGET_AVX2 inline __m256 gather8_as_float(const T* p, int64_t s) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_setr_ps(p[0], p[s], p[2 * s], p[3 * s], p[4 * s], p[5 * s], p[6 * s], p[7 * s]);
  }
  const auto* q = reinterpret_cast<const uint16_t*>(p);
  return bits8_to_float<T>(_mm_setr_epi16(q[0], q[s], q[2 * s], q[3 * s], q[4 * s], q[5 * s], q[6 * s], q[7 * s]));
}

template <typename T>
TORCHOPS_TARGET_AVX2 inline void scatter8_from_float(T* p, int64_t s, __m256 v) {
  if constexpr (std::is_same_v<T, float>) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    for (int k = 0; k < 8; ++k) p[k * s] = lanes[k];
    return;
  }
  const __m128i bits = float8_to_bits<T>(v);
  auto* q = reinterpret_cast<uint16_t*>(p);
  q[0] = _mm_extract_epi16(bits, 0);
  q[s] = _mm_extract_epi16(bits, 1);
  q[2 * s] = _mm_extract_epi16(bits, 2);
  q[3 * s] = _mm_extract_epi16(bits, 3);
  q[4 * s] = _mm_extract_epi16(bits, 4);
  q[5 * s] = _mm_extract_epi16(bits, 5);
  q[6 * s] = _mm_extract_epi16(bits, 6);
  q[7 * s] = _mm_extract_epi16(bits, 7);
}

// exp of 8 f32 lanes, within ~2 ulp of the exact value over the whole range (checked exhaustively against
// f64 when written): inf above ~88.72, gradual underflow to 0 below ~-87.3, NaN stays NaN.
// exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 split in two so
// the reduction is exact), exp(r) = 1 + r + r^2 q(r) with q a degree-4 fit of relative error 4e-9.
TORCHOPS_TARGET_AVX2 inline __m256 exp8(__m256 x) {
  // Outside [-104, 89] exp rounds to 0 or overflows anyway; clamping keeps n within the scaling below.
  // Operand order keeps NaN: min/max return their second operand when either is NaN.
  x = _mm256_min_ps(_mm256_set1_ps(89.0f), _mm256_max_ps(_mm256_set1_ps(-104.0f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);  // ln 2, high bits: n * hi is exact
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.4286068202862268e-6f), r);    // ln 2 - hi
  __m256 q = _mm256_set1_ps(1.3751621590927243e-3f);
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(8.368915878236294e-3f));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(4.166952893137932e-2f));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.66665181517601e-1f));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(4.9999988079071045e-1f));
  const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(q, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  // 2^n in two factors 2^(n/2), each a normal float for n in [-150, 128]: the products overflow to inf
  // and underflow through the subnormals as exp itself does.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(e, p1), p2);
}

// 1 / (1 + exp(-x)): exactly 0 once exp(-x) overflows (x < ~-88.7, no inf/inf), 1 for large x.
TORCHOPS_TARGET_AVX2 inline __m256 sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 minus_x = _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(minus_x)));
}

// The standard normal CDF Phi(x) = 0.5 erfc(-x / sqrt 2) of 8 f32 lanes and exp(-x^2 / 2) (which the
// normal density is, up to 1 / sqrt(2 pi)), sharing that exponential: erfc(z) = t P(t) exp(-z^2),
// t = 1 / (1 + p z), z = |x| / sqrt 2 >= 0, Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7, the
// accuracy of torch's own vectorised erf), and erfc(-z) = 2 - erfc(z). Phi(+inf) = 1, Phi(-inf) = 0, NaN
// stays NaN.
TORCHOPS_TARGET_AVX2 inline __m256 normal_cdf8(__m256 x, __m256& exp_half_sq) {
  const __m256 abs_x = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f * 0.70710678118654752f), abs_x, one));
  __m256 p = _mm256_set1_ps(1.061405429f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
  exp_half_sq = exp8(_mm256_mul_ps(_mm256_set1_ps(-0.5f), _mm256_mul_ps(x, x)));
  const __m256 half_erfc = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), t), _mm256_mul_ps(p, exp_half_sq));
  const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  // x >= 0 (or NaN): 1 - Phi(-|x|); NaN propagates through half_erfc.
  return _mm256_blendv_ps(_mm256_sub_ps(one, half_erfc), half_erfc, negative);
}

TORCHOPS_TARGET_AVX2 inline __m256 normal_cdf8(__m256 x) {
  __m256 unused;
  return normal_cdf8(x, unused);
}

// A function of a 16-bit float tabulated over all 65536 bit patterns (256 KiB, built once, thread-safe) by
// its own 8-lane f32 form Fn::apply, so a lookup gives exactly what the vector math gives.
template <typename T, typename Fn>
TORCHOPS_TARGET_AVX2 inline std::vector<float> make_bits_table() {
  std::vector<float> table(1 << 16);
  for (int i = 0; i < (1 << 16); i += 8) {
    const __m128i bits = _mm_add_epi16(_mm_set1_epi16(static_cast<int16_t>(i)), _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_storeu_ps(table.data() + i, Fn::apply(bits8_to_float<T>(bits)));
  }
  return table;
}

template <typename T, typename Fn>
inline const float* bits_table() {
  static const std::vector<float> table = make_bits_table<T, Fn>();
  return table.data();
}

// Where an input's 8 lanes were loaded from: p[0], p[s], ..., p[7 s] of storage type T.
template <typename T>
struct Lanes8 {
  const T* p;
  int64_t s;
};

// Fn::apply(x) for x holding the 8 values at `src`: computed for f32, looked up by their stored bits (a
// table built by Fn::apply itself) for f16/bf16.
template <typename T, typename Fn>
TORCHOPS_TARGET_AVX2 inline __m256 by_bits8(__m256 x, Lanes8<T> src) {
  if constexpr (std::is_same_v<T, float>) {
    (void)src;
    return Fn::apply(x);
  } else {
    (void)x;
    const float* table = bits_table<T, Fn>();
    const auto* bits = reinterpret_cast<const uint16_t*>(src.p);
    const int64_t s = src.s;
    return _mm256_setr_ps(table[bits[0]], table[bits[s]], table[bits[2 * s]], table[bits[3 * s]], table[bits[4 * s]],
                          table[bits[5 * s]], table[bits[6 * s]], table[bits[7 * s]]);
  }
}

// sigmoid8 as a table-able function.
struct Sigmoid8 {
  TORCHOPS_TARGET_AVX2 static __m256 apply(__m256 x) { return sigmoid8(x); }
};

// sigmoid8(x) for x holding the 8 values at `src`: computed for f32; for f16/bf16 looked up in a table by
// their 16 bits (by_bits8): exp8 + division are the bulk of an element's cost, which the lookup saves. The
// bits are read straight from `src` with scalar loads, cheaper than a vgatherdps on indices shifted out of x
// where the processor splits 256-bit operations.
template <typename T>
TORCHOPS_TARGET_AVX2 inline __m256 sigmoid8_of(__m256 x, Lanes8<T> src) {
  return by_bits8<T, Sigmoid8>(x, src);
}

}  // namespace cpu
}  // namespace torchops
#endif
