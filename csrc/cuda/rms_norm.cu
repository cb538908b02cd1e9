// rms_norm and add_rms_norm forward on CUDA, on the row engine of common/norm_cuda.cuh (row processors,
// row sums, launch shapes). One kernel serves both ops: kAdd reads input and residual once, stores
// h = input + residual rounded to T (residual_out) and normalises the rounded h.
//   sweep 1 - every load of the thread's kept chunks is issued before any is used (the first version
//             loaded and summed chunk by chunk, and reached 62-78% of copy bandwidth), then the squares are
//             summed in RowSum<T> and reduced over the row;
//   sweep 2 - (h * rstd) * (weight + offset), formed in f32 (f64 for f64) and rounded once: F.rms_norm's
//             order. The weight's loads go out in groups of kWeightGroup chunks, again before any is used.
// A row longer than the kept chunks reads its remainder a second time (add_rms_norm: from residual_out,
// which the same thread wrote). 16-byte vector accesses when every row start is aligned, else the same
// kernels with element-wise (still coalesced) accesses. The backward is in rms_norm_backward.cu.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "../common/dispatch.h"
#include "../common/empty.h"
#include "../common/norm.h"
#include "../common/norm_cuda.cuh"
#include "rms_norm_forward.cuh"

namespace torchops {
namespace {

using namespace torchops::norm_cuda;
using namespace torchops::rms_norm_kernels;

// Writes out, residual_out (with a residual) and, when `rstd` is defined, each row's rstd.
void forward_cuda_into(const at::Tensor& input, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
                       double eps, double weight_offset, const at::Tensor& out, const at::Tensor& residual_out,
                       const at::Tensor& rstd) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const NormRows x = norm_rows(input);
  if (x.rows == 0) return;
  const NormRows res = residual.defined() ? norm_rows(residual) : NormRows{};
  const at::Tensor w = dense_weight(weight);
  dispatch_norm_types(input.scalar_type(), w, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    const bool add = residual.defined();
    ForwardArgs<T, W> a{x.tensor.const_data_ptr<T>(),
                        x.row_stride,
                        add ? res.tensor.const_data_ptr<T>() : nullptr,
                        res.row_stride,
                        add ? residual_out.mutable_data_ptr<T>() : nullptr,
                        w.defined() ? w.const_data_ptr<W>() : nullptr,
                        out.mutable_data_ptr<T>(),
                        rstd.defined() ? rstd.mutable_data_ptr<opmath_t<T>>() : nullptr};
    const int64_t n = x.cols;
    const bool vectors = rows_aligned(a.x, a.x_row_stride, n) && rows_aligned<T>(a.y, n, n) &&
                         weight_aligned<T>(a.weight) &&
                         (!add || (rows_aligned(a.residual, a.residual_row_stride, n) && rows_aligned<T>(a.h_out, n, n)));
    constexpr int kV = vector_size<T>();
    if (add) {
      launch_add_forward<T, W>(a, x.rows, n, eps, weight_offset, vectors, stream);
    } else {
      vectors ? launch_forward<T, W, kV, false>(a, x.rows, n, eps, weight_offset, stream)
              : launch_forward<T, W, 1, false>(a, x.rows, n, eps, weight_offset, stream);
    }
  });
}

at::Tensor empty_rstd(const at::Tensor& input) {
  return at::detail::empty_cuda(input.sizes().slice(0, input.dim() - 1), norm_stat_dtype(input.scalar_type()),
                                input.device(), at::MemoryFormat::Contiguous);
}

at::Tensor rms_norm_cuda(const at::Tensor& input, const std::optional<at::Tensor>& weight, double eps,
                         double weight_offset) {
  check_norm_input("rms_norm", {"input", input}, weight, weight_offset);
  at::Tensor out = empty_like_dense_cuda(input);
  forward_cuda_into(input, at::Tensor(), weight, eps, weight_offset, out, at::Tensor(), at::Tensor());
  return out;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_cuda(const at::Tensor& input,
                                                         const std::optional<at::Tensor>& weight, double eps,
                                                         double weight_offset) {
  check_norm_input("_rms_norm_forward", {"input", input}, weight, weight_offset);
  at::Tensor out = empty_like_dense_cuda(input);
  at::Tensor rstd = empty_rstd(input);
  forward_cuda_into(input, at::Tensor(), weight, eps, weight_offset, out, at::Tensor(), rstd);
  return {out, rstd};
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cuda(const at::Tensor& input, const at::Tensor& residual,
                                                     const std::optional<at::Tensor>& weight, double eps,
                                                     double weight_offset) {
  check_norm_input_pair("add_rms_norm", {"input", input}, {"residual", residual}, weight, weight_offset);
  at::Tensor out = empty_like_dense_cuda(input);
  at::Tensor residual_out = empty_like_dense_cuda(input);
  forward_cuda_into(input, residual, weight, eps, weight_offset, out, residual_out, at::Tensor());
  return {out, residual_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_forward_cuda(const at::Tensor& input,
                                                                         const at::Tensor& residual,
                                                                         const std::optional<at::Tensor>& weight,
                                                                         double eps, double weight_offset) {
  check_norm_input_pair("_add_rms_norm_forward", {"input", input}, {"residual", residual}, weight, weight_offset);
  at::Tensor out = empty_like_dense_cuda(input);
  at::Tensor residual_out = empty_like_dense_cuda(input);
  at::Tensor rstd = empty_rstd(input);
  forward_cuda_into(input, residual, weight, eps, weight_offset, out, residual_out, rstd);
  return {out, residual_out, rstd};
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  m.impl("rms_norm", &rms_norm_cuda);
  m.impl("_rms_norm_forward", &rms_norm_forward_cuda);
  m.impl("add_rms_norm", &add_rms_norm_cuda);
  m.impl("_add_rms_norm_forward", &add_rms_norm_forward_cuda);
}

}  // namespace torchops
