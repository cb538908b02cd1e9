// The row math of cross entropy shared by the CPU and CUDA row kernels (everything but exp and tanh, which
// each backend computes its own way). For one row of logits z (V classes, capped c = softcap tanh(z / softcap)
// when a softcap is given, else c = z), target t and smoothing e, with lse = log sum_j exp(c_j):
//   loss    = (1 - e) (lse - c_t) + e (lse - mean_j c_j)  =  lse - (1 - e) c_t - (e / V) sum_j c_j
//             (F.cross_entropy's label smoothing: the target mixed with the uniform distribution)
//   dloss/dz_j = (p_j - e / V - (1 - e) [j == t]) dc_j/dz_j,   p_j = exp(c_j - lse),
//             dc/dz = 1 - (c / softcap)^2 (tanh' from the capped value itself, no second tanh).
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>
#include <optional>

namespace torchops {

template <typename A>
struct CrossEntropyMath {
  A one_minus_smoothing;  // 1 - e: the target's weight
  A smoothing_per_class;  // e / V: every class's weight
  A softcap;              // 0: no cap
  A inverse_softcap;

  CrossEntropyMath(double label_smoothing, int64_t classes, std::optional<double> cap)
      : one_minus_smoothing(static_cast<A>(1.0 - label_smoothing)),
        smoothing_per_class(static_cast<A>(label_smoothing / static_cast<double>(classes))),
        softcap(static_cast<A>(cap.value_or(0.0))),
        inverse_softcap(static_cast<A>(cap ? 1.0 / *cap : 0.0)) {}

  C10_HOST_DEVICE bool capped() const { return softcap != A(0); }
  C10_HOST_DEVICE bool smoothed() const { return smoothing_per_class != A(0); }

  // The loss from the row's statistics: lse, the target's capped logit and the sum of the capped logits
  // (read only when smoothed).
  C10_HOST_DEVICE A loss(A lse, A target_logit, A sum_logits) const {
    A l = lse - one_minus_smoothing * target_logit;
    return smoothed() ? l - smoothing_per_class * sum_logits : l;
  }

  // dloss/dz_j from p_j = exp(c_j - lse) and c_j, without the target's term (subtract target_term() at t).
  C10_HOST_DEVICE A grad(A p, A c) const {
    const A d = p - smoothing_per_class;
    return capped() ? d * cap_slope(c) : d;
  }

  // What the target's class adds to grad(): -(1 - e) dc_t/dz_t.
  C10_HOST_DEVICE A target_term(A c) const {
    return capped() ? -one_minus_smoothing * cap_slope(c) : -one_minus_smoothing;
  }

  C10_HOST_DEVICE A cap_slope(A c) const {
    const A u = c * inverse_softcap;
    return A(1) - u * u;
  }
};

}  // namespace torchops
