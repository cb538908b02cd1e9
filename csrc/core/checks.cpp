#include "checks.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace torchops {

namespace {

std::string dtype_list(std::initializer_list<at::ScalarType> dtypes) {
  std::string s;
  for (auto t : dtypes) {
    if (!s.empty()) s += ", ";
    s += c10::toString(t);
  }
  return s;
}

// ---------------------------------------------------------------------------------------------- overlap
// Whether two strided views share an element comes down to: is there a point x with 0 <= x_k <= range_k
// and sum(coef_k * x_k) == target? (Element offsets of one view minus those of the other.) A depth-first
// search over the terms, largest coefficient first, pruned by the bounds the remaining terms can reach
// and by divisibility (the remaining terms only reach multiples of their gcd, so x_k is fixed modulo
// a step), decides it in a few steps for the layouts tensors have (slices, transposes, chunks). A search
// that exceeds its budget falls back to listing the elements of small tensors, else gives up (kUnknown).

enum class Overlap { kNo, kYes, kUnknown };

constexpr int64_t kSearchBudget = int64_t{1} << 16;     // search nodes before giving up
constexpr int64_t kEnumerationLimit = int64_t{1} << 18;  // elements listed at most, all operands together
// Offsets and sums beyond this are left to the enumeration (or kUnknown), so no arithmetic can overflow.
constexpr int64_t kMaxMagnitude = int64_t{1} << 60;

struct Term {
  int64_t coef;   // > 0
  int64_t range;  // x in [0, range]
};

// x with (a * x) % m == 1, for gcd(a, m) == 1, m > 1.
int64_t mod_inverse(int64_t a, int64_t m) {
  int64_t r0 = m, r1 = a % m, s0 = 0, s1 = 1;
  while (r1 != 0) {
    const int64_t q = r0 / r1;
    std::tie(r0, r1) = std::make_pair(r1, r0 - q * r1);
    std::tie(s0, s1) = std::make_pair(s1, s0 - q * s1);
  }
  return ((s0 % m) + m) % m;
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

class TermSearch {
 public:
  // `center`, when given (one per term), excludes that point: the search then looks for another one.
  TermSearch(std::vector<Term> terms, std::vector<int64_t> center = {})
      : terms_(std::move(terms)), center_(std::move(center)) {
    const size_t n = terms_.size();
    rest_max_.assign(n + 1, 0);
    rest_gcd_.assign(n + 1, 0);
    for (size_t k = n; k-- > 0;) {
      rest_max_[k] = rest_max_[k + 1] + terms_[k].coef * terms_[k].range;
      rest_gcd_[k] = std::gcd(rest_gcd_[k + 1], terms_[k].coef);
    }
  }

  Overlap has_solution(int64_t target) {
    try {
      return visit(0, target, center_.empty()) ? Overlap::kYes : Overlap::kNo;
    } catch (const OutOfBudget&) {
      return Overlap::kUnknown;
    }
  }

 private:
  struct OutOfBudget {};

  // Is there x[k..] reaching `target`? `moved`: some earlier x differs from the excluded center.
  bool visit(size_t k, int64_t target, bool moved) {
    if (++nodes_ > kSearchBudget) throw OutOfBudget{};
    if (k == terms_.size()) return target == 0 && moved;
    if (target < 0 || target > rest_max_[k] || target % rest_gcd_[k] != 0) return false;
    const int64_t c = terms_[k].coef;
    const int64_t lo = std::max<int64_t>(0, ceil_div(target - rest_max_[k + 1], c));
    const int64_t hi = std::min(terms_[k].range, target / c);
    // The later terms reach multiples of g only: c * x == target (mod g) fixes x modulo step.
    const int64_t g = rest_gcd_[k + 1];
    int64_t first = lo, step = 1;
    if (g > 1) {
      const int64_t h = std::gcd(c, g);  // divides target: target % rest_gcd_[k] == 0
      step = g / h;
      if (step > 1) {
        const auto residue = static_cast<int64_t>(static_cast<__int128>((target / h) % step) *
                                                  mod_inverse((c / h) % step, step) % step);
        first = lo + (((residue - lo) % step) + step) % step;
      }
    }
    for (int64_t x = first; x <= hi; x += step) {
      if (visit(k + 1, target - c * x, moved || (!center_.empty() && x != center_[k]))) return true;
    }
    return false;
  }

  std::vector<Term> terms_;
  std::vector<int64_t> center_;
  std::vector<int64_t> rest_max_, rest_gcd_;
  int64_t nodes_ = 0;
};

// Largest element offset of t (its smallest is 0), or -1 when beyond kMaxMagnitude.
int64_t max_offset(const at::Tensor& t) {
  __int128 extent = 0;
  for (int64_t d = 0; d < t.dim(); ++d) extent += static_cast<__int128>(t.size(d) - 1) * std::abs(t.stride(d));
  return extent > kMaxMagnitude ? -1 : static_cast<int64_t>(extent);
}

// Element offsets of every element of t, sorted (t.numel() <= kEnumerationLimit).
std::vector<int64_t> element_offsets(const at::Tensor& t) {
  std::vector<int64_t> offsets{0};
  for (int64_t d = 0; d < t.dim(); ++d) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * t.size(d));
    for (int64_t o : offsets) {
      for (int64_t j = 0; j < t.size(d); ++j) next.push_back(o + j * t.stride(d));
    }
    offsets = std::move(next);
  }
  std::sort(offsets.begin(), offsets.end());
  return offsets;
}

// Does t (no dimension of stride 0 and size > 1, which has_internal_overlap already reports) have two
// elements at one offset? Two dimensions of one stride do; otherwise: a nonzero t_k in [-range_k, range_k]
// with sum(stride_k * t_k) == 0, i.e. x_k = t_k + range_k in [0, 2 range_k] reaching sum(stride_k * range_k)
// at a point other than the center.
Overlap internal_overlap(const at::Tensor& t) {
  if (max_offset(t) < 0) return Overlap::kUnknown;
  std::vector<Term> terms;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) terms.push_back({std::abs(t.stride(d)), t.size(d) - 1});
  }
  std::sort(terms.begin(), terms.end(), [](const Term& x, const Term& y) { return x.coef > y.coef; });
  std::vector<int64_t> center;
  int64_t target = 0;
  for (size_t k = 0; k < terms.size(); ++k) {
    if (terms[k].coef == 0 || (k > 0 && terms[k].coef == terms[k - 1].coef)) return Overlap::kYes;
    center.push_back(terms[k].range);
    target += terms[k].coef * terms[k].range;
    terms[k].range *= 2;
  }
  const Overlap answer = TermSearch(terms, center).has_solution(target);
  if (answer != Overlap::kUnknown || t.numel() > kEnumerationLimit) return answer;
  const auto offsets = element_offsets(t);
  return std::adjacent_find(offsets.begin(), offsets.end()) != offsets.end() ? Overlap::kYes : Overlap::kNo;
}

// Do a and b (any shapes) share a byte? Element k of a view covers itemsize bytes from its offset.
Overlap shares_memory(const at::Tensor& a, const at::Tensor& b) {
  if (a.itemsize() != b.itemsize()) return Overlap::kUnknown;
  const auto isz = static_cast<int64_t>(a.itemsize());
  const int64_t a_max = max_offset(a), b_max = max_offset(b);
  if (a_max < 0 || b_max < 0) return Overlap::kUnknown;
  // Element offsets are relative to each view's first element (strides are positive in PyTorch; a
  // negative one is folded in as x -> range - x below). `shift`: b's base minus a's, in bytes.
  const auto a_base = reinterpret_cast<intptr_t>(a.const_data_ptr()), b_base = reinterpret_cast<intptr_t>(b.const_data_ptr());
  const __int128 shift = static_cast<__int128>(b_base) - a_base;
  int64_t a_low = 0, b_low = 0;  // the lowest offsets (negative strides lower them)
  for (int64_t d = 0; d < a.dim(); ++d) a_low += std::min<int64_t>(0, (a.size(d) - 1) * a.stride(d));
  for (int64_t d = 0; d < b.dim(); ++d) b_low += std::min<int64_t>(0, (b.size(d) - 1) * b.stride(d));
  // Disjoint byte ranges: no overlap (the common case of two separate tensors).
  const __int128 a_begin = static_cast<__int128>(a_low) * isz, a_end = static_cast<__int128>(a_low + a_max + 1) * isz;
  const __int128 b_begin = shift + static_cast<__int128>(b_low) * isz, b_end = shift + static_cast<__int128>(b_low + b_max + 1) * isz;
  if (a_end <= b_begin || b_end <= a_begin) return Overlap::kNo;
  // Element p of a and q of b share bytes iff p - q == shift / isz, or (a fractional shift, from views
  // of one storage as another dtype) either integer next to it.
  const int64_t whole = static_cast<int64_t>(shift >= 0 ? shift / isz : -((-shift + isz - 1) / isz));
  std::vector<int64_t> differences{whole};
  if (shift % isz != 0) differences.push_back(whole + 1);

  // sum(a.stride * x) - sum(b.stride * y) == difference, with each negative coefficient c folded as
  // c * x = c * range + |c| * (range - x); equal coefficients merged (x + y over [0, r1] x [0, r2] is
  // exactly [0, r1 + r2]).
  std::vector<Term> terms;
  int64_t fold = 0;
  auto add = [&](int64_t coef, int64_t range) {
    if (coef == 0 || range == 0) return;
    if (coef < 0) {
      fold += -coef * range;
      coef = -coef;
    }
    terms.push_back({coef, range});
  };
  for (int64_t d = 0; d < a.dim(); ++d) add(a.stride(d), a.size(d) - 1);
  for (int64_t d = 0; d < b.dim(); ++d) add(-b.stride(d), b.size(d) - 1);
  std::sort(terms.begin(), terms.end(), [](const Term& x, const Term& y) { return x.coef > y.coef; });
  std::vector<Term> merged;
  for (const Term& t : terms) {
    if (!merged.empty() && merged.back().coef == t.coef) {
      merged.back().range += t.range;
    } else {
      merged.push_back(t);
    }
  }
  bool unknown = false;
  for (int64_t difference : differences) {
    const Overlap answer = TermSearch(merged).has_solution(difference + fold);
    if (answer == Overlap::kYes) return Overlap::kYes;
    unknown = unknown || answer == Overlap::kUnknown;
  }
  if (!unknown) return Overlap::kNo;
  if (a.numel() + b.numel() > kEnumerationLimit) return Overlap::kUnknown;
  const auto a_offsets = element_offsets(a), b_offsets = element_offsets(b);
  for (int64_t q : b_offsets) {
    for (int64_t difference : differences) {
      if (std::binary_search(a_offsets.begin(), a_offsets.end(), q + difference)) return Overlap::kYes;
    }
  }
  return Overlap::kNo;
}

// The same elements in the same logical order: equal base and equal strides wherever the size is > 1.
bool same_view(const at::Tensor& a, const at::Tensor& b) {
  if (a.const_data_ptr() != b.const_data_ptr() || a.itemsize() != b.itemsize() || !a.sizes().equals(b.sizes())) {
    return false;
  }
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

}  // namespace

void check_defined(const char* op, NamedTensor t) {
  TORCHOPS_CHECK(t.tensor.defined(), op, t.name, " must be a defined tensor");
}

void check_dtype_in(const char* op, NamedTensor t, std::initializer_list<at::ScalarType> allowed) {
  for (auto d : allowed) {
    if (t.tensor.scalar_type() == d) return;
  }
  TORCHOPS_CHECK(false, op, t.name, " has unsupported dtype ", t.tensor.scalar_type(),
                 "; supported: ", dtype_list(allowed));
}

void check_same_shape(const char* op, NamedTensor x, NamedTensor y) {
  TORCHOPS_CHECK(x.tensor.sizes().equals(y.tensor.sizes()), op, x.name, " and ", y.name,
                 " must have the same shape, got ", x.tensor.sizes(), " and ", y.tensor.sizes());
}

void check_same_dtype(const char* op, NamedTensor x, NamedTensor y) {
  TORCHOPS_CHECK(x.tensor.scalar_type() == y.tensor.scalar_type(), op, x.name, " and ", y.name,
                 " must have the same dtype, got ", x.tensor.scalar_type(), " and ", y.tensor.scalar_type());
}

void check_same_device(const char* op, NamedTensor x, NamedTensor y) {
  TORCHOPS_CHECK(x.tensor.device() == y.tensor.device(), op, x.name, " and ", y.name,
                 " must be on the same device, got ", x.tensor.device(), " and ", y.tensor.device());
}

void check_defined_on(const char* op, NamedTensor device_of, NamedTensor t) {
  check_defined(op, t);
  check_same_device(op, device_of, t);
}

void check_like(const char* op, NamedTensor like, NamedTensor t) {
  check_defined_on(op, like, t);
  check_same_dtype(op, like, t);
  check_same_shape(op, like, t);
}

void check_elementwise(const char* op, c10::ArrayRef<NamedTensor> tensors,
                       std::initializer_list<at::ScalarType> allowed) {
  const NamedTensor& first = *tensors.begin();
  for (const auto& t : tensors) check_defined(op, t);  // every None named before any mismatch
  for (const auto& t : tensors) {
    if (&t != &first) check_like(op, first, t);
  }
  check_dtype_in(op, first, allowed);
}

void check_and_resize_out(const char* op, NamedTensor out, NamedTensor like) {
  check_defined_on(op, like, out);
  check_same_dtype(op, like, out);
  at::native::resize_output(out.tensor, like.tensor.sizes());
}

namespace {

// Whether two views share an element: PyTorch's answer where it has one (dense tensors), the exact search for
// strided views it can't decide.
Overlap shared_elements(const at::Tensor& a, const at::Tensor& b) {
  const auto status = at::get_overlap_status(a, b);
  return status == at::MemOverlapStatus::No ? Overlap::kNo
         : status == at::MemOverlapStatus::TooHard ? shares_memory(a, b)
                                                   : Overlap::kYes;
}

}  // namespace

void check_out_overlap(const char* op, NamedTensor out, c10::ArrayRef<NamedTensor> inputs,
                       c10::ArrayRef<NamedTensor> other_outs) {
  const at::Tensor& o = out.tensor;
  if (o.numel() == 0) return;
  const auto internal = at::has_internal_overlap(o);
  const Overlap self = internal == at::MemOverlap::No    ? Overlap::kNo
                       : internal == at::MemOverlap::Yes ? Overlap::kYes
                                                         : internal_overlap(o);
  TORCHOPS_CHECK(self == Overlap::kNo, op, out.name,
                 self == Overlap::kYes ? " has internal overlap (several elements share memory, e.g. an expanded tensor)"
                                       : " may have internal overlap (deciding it exactly for this layout would take "
                                         "too long)",
                 "; it cannot be written");
  for (const auto& in : inputs) {
    const at::Tensor& i = in.tensor;
    if (i.numel() == 0 || same_view(o, i)) continue;
    const Overlap shared = shared_elements(o, i);
    TORCHOPS_CHECK(shared == Overlap::kNo, op, out.name, " partially overlaps ", in.name,
                   shared == Overlap::kYes ? " (they share memory but are not the same view)"
                                           : " (or may: deciding it exactly for these strided views of one storage "
                                             "would take too long)",
                   "; pass the same tensor or a non-overlapping one");
  }
  for (const auto& other : other_outs) {
    if (other.tensor.numel() == 0) continue;
    const Overlap shared = shared_elements(o, other.tensor);
    TORCHOPS_CHECK(shared == Overlap::kNo, op, out.name, " and ", other.name,
                   shared == Overlap::kYes ? " share memory" : " may share memory (deciding it would take too long)",
                   "; each result needs memory of its own");
  }
}

bool gelu_uses_tanh(const char* op, c10::string_view approximate) {
  if (approximate == "none") return false;
  TORCHOPS_CHECK(approximate == "tanh", op, "approximate must be 'none' or 'tanh', got '", approximate, "'");
  return true;
}

void fail_too_many_dims(const char* op, int max_dims) {
  TORCH_CHECK(false, "myns::", op, ": tensors with more than ", max_dims,
              " non-mergeable dimensions are not supported");
}

}  // namespace torchops
