// rms_norm and add_rms_norm forward on CUDA, on the row engine of norm/norm_cuda.cuh (row processors,
// row sums, launch shapes). Each kernel serves both ops: kAdd reads input and residual once, stores
// h = input + residual rounded to T (residual_out) and normalises the rounded h. The kept-in-registers
// kernel:
//   sweep 1 - every load of the thread's kept chunks is issued before any is used (the first version
//             loaded and summed chunk by chunk, and reached 62-78% of copy bandwidth), then the squares are
//             summed in RowSum<T> and reduced over the row;
//   sweep 2 - (h * rstd) * (weight + offset), formed in f32 (f64 for f64) and rounded once: F.rms_norm's
//             order. The weight's loads go out in groups of kWeightGroup chunks, again before any is used.
// A row longer than the kept chunks reads its remainder a second time (add_rms_norm: from residual_out,
// which the same thread wrote). 16-byte vector accesses when every row start is aligned, else the same
// kernels with element-wise (still coalesced) accesses. Rows of 16-byte vectors take other kernels where they measured
// faster (rms_norm_forward.cuh): the stream kernel, which keeps nothing and reads each row twice, the second time from
// L1 or L2 (rms_norm's rows from 128 vectors; add_rms_norm's of 128-512 vectors, 1024 and from 2048), a 128-thread
// block a row kept in registers for rows of 512 vectors (add_rms_norm's of 256 too) on at most 32 rows an SM, a warp a
// row for rms_norm's rows of exactly 128 or 256 vectors, and a warp per two rows, both in flight at once (rms_norm's
// shorter rows, add_rms_norm's of one vector a lane); plain rows of vectors never take the kept kernel. The backward is
// in rms_norm_backward.cu.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../norm/norm.h"
#include "../norm/norm_cuda.cuh"
#include "../norm/norm_ops.h"
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
    if (add) {
      launch_add_forward<T, W>(a, x.rows, n, eps, weight_offset, vectors, stream);
    } else {
      with_vector_size<T, VectorWidths::kFullOrScalar>(vectors ? vector_size<T>() : 1, [&](auto v) {
        launch_forward<T, W, decltype(v)::value, false>(a, x.rows, n, eps, weight_offset, stream);
      });
    }
  });
}

// What the shared entry points (norm_ops.h) call for the forward ops on CUDA.
struct CudaNormForward {
  static constexpr int64_t kMaxRow = (int64_t{1} << 31) - (int64_t{1} << 16) - 1;
  static at::Tensor empty(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& like) {
    return empty_dense_cuda(sizes, dtype, like.device());
  }
  static void forward(const NormForward& f) {
    TORCH_CHECK(f.kind == NormKind::kRms, "layer_norm: not yet on CUDA");
    forward_cuda_into(f.input, f.residual, f.weight.defined() ? std::optional<at::Tensor>(f.weight) : std::nullopt,
                      f.eps, f.weight_offset, f.out, f.residual_out, f.rstd);
  }
};
using Ops = NormOps<CudaNormForward>;

}  // namespace

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  m.impl("rms_norm", &Ops::rms_norm);
  m.impl("_rms_norm_forward", &Ops::rms_norm_forward);
  m.impl("add_rms_norm", &Ops::add_rms_norm);
  m.impl("_add_rms_norm_forward", &Ops::add_rms_norm_forward);
}

}  // namespace torchops
