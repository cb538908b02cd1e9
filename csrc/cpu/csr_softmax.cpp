// csr_softmax and its backward on the CPU: for each row and head, over the row's nonzeros,
//   forward   y = exp(x - max) / sum(exp(x - max))   (f32 math for 16-bit and f32, f64 for f64; a NaN makes
//             its row NaN, as torch.softmax does);
//   backward  grad_x = y * (grad_y - sum(grad_y * y)), y recomputed from x.
// Each exp(x - max) is computed once per row and kept (a row's worth per thread) for the outputs.
// Rows in parallel (csr_cpu.h), each row's heads side by side (a nonzero's H values are adjacent).
#include <ATen/core/Tensor.h>

#include <cmath>
#include <vector>

#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../csr/csr_cpu.h"

namespace torchops {
namespace {

// A row's softmax statistics per head: its largest value (NaN if any is) and the sum of exp(x - largest), with
// each exp(x - largest) in e (nonzero begin + i, head h at e[i * H + h]).
template <typename T, typename Acc>
void row_stats(const T* x, int64_t begin, int64_t end, int64_t H, std::vector<Acc>& top, std::vector<Acc>& sum,
               std::vector<Acc>& e) {
  for (int64_t h = 0; h < H; ++h) top[h] = static_cast<Acc>(x[begin * H + h]);
  for (int64_t p = begin + 1; p < end; ++p) {
    for (int64_t h = 0; h < H; ++h) {
      const Acc v = static_cast<Acc>(x[p * H + h]);
      if (top[h] == top[h] && (v > top[h] || v != v)) top[h] = v;
    }
  }
  std::fill(sum.begin(), sum.end(), Acc(0));
  if (static_cast<int64_t>(e.size()) < (end - begin) * H) e.resize((end - begin) * H);
  for (int64_t p = begin; p < end; ++p) {
    Acc* ep = e.data() + (p - begin) * H;
    for (int64_t h = 0; h < H; ++h) {
      ep[h] = std::exp(static_cast<Acc>(x[p * H + h]) - top[h]);
      sum[h] += ep[h];
    }
  }
}

// The softmax of each row (grad undefined), or its gradient given grad_y: one routine, both directions
// recompute the row's statistics the same way.
at::Tensor softmax_cpu(const char* op, const at::Tensor& crow_in, const at::Tensor& values_in,
                       const at::Tensor& grad_in) {
  const bool backward = grad_in.defined();
  const at::Tensor crow = crow_in.contiguous(), values = values_in.contiguous();
  const at::Tensor g = backward ? grad_in.contiguous() : at::Tensor();
  const int64_t nnz = values.size(0), M = crow.numel() - 1, H = values.dim() == 2 ? values.size(1) : 1;
  check_crow_structure_cpu(op, crow, nnz, "values");
  at::Tensor out = empty_dense_cpu(values.sizes(), values.scalar_type());
  if (out.numel() == 0) return out;
  TORCHOPS_DISPATCH_INDEX_TYPES(crow.scalar_type(), "csr_softmax_cpu", [&] {
    TORCHOPS_DISPATCH_FLOAT_TYPES(values.scalar_type(), "csr_softmax_cpu", [&] {
      using acc_t = opmath_t<scalar_t>;
      const index_t* pc = crow.const_data_ptr<index_t>();
      const scalar_t* x = values.const_data_ptr<scalar_t>();
      const scalar_t* pg = backward ? g.const_data_ptr<scalar_t>() : nullptr;
      scalar_t* po = out.mutable_data_ptr<scalar_t>();
      cpu::parallel_over_rows(pc, M, H, [&](int64_t r0, int64_t r1) {
        std::vector<acc_t> top(H), sum(H), dot(H), e;
        int64_t begin = 0;
        const auto y = [&](int64_t p, int64_t h) { return e[(p - begin) * H + h] / sum[h]; };
        for (int64_t r = r0; r < r1; ++r) {
          begin = pc[r];
          const int64_t end = pc[r + 1];
          if (begin == end) continue;
          row_stats(x, begin, end, H, top, sum, e);
          if (!backward) {
            for (int64_t p = begin; p < end; ++p) {
              for (int64_t h = 0; h < H; ++h) po[p * H + h] = static_cast<scalar_t>(y(p, h));
            }
            continue;
          }
          std::fill(dot.begin(), dot.end(), acc_t(0));
          for (int64_t p = begin; p < end; ++p) {
            for (int64_t h = 0; h < H; ++h) dot[h] += static_cast<acc_t>(pg[p * H + h]) * y(p, h);
          }
          for (int64_t p = begin; p < end; ++p) {
            for (int64_t h = 0; h < H; ++h) {
              po[p * H + h] = static_cast<scalar_t>(y(p, h) * (static_cast<acc_t>(pg[p * H + h]) - dot[h]));
            }
          }
        }
      });
    });
  });
  return out;
}

}  // namespace

template <>
at::Tensor CpuCsrBackend::softmax(const char* op, const at::Tensor& crow, const at::Tensor& values) {
  return softmax_cpu(op, crow, values, at::Tensor());
}

template <>
at::Tensor CpuCsrBackend::softmax_backward(const char* op, const at::Tensor& crow, const at::Tensor& grad_out,
                                           const at::Tensor& values) {
  return softmax_cpu(op, crow, values, grad_out);
}

}  // namespace torchops
