// The normalisations on CUDA: the backend of the shared entry points (norm/norm_ops.h) turns one NormForward /
// NormBackward into the kernels' arguments and launches them (norm_forward.cuh, norm_backward.cuh, instantiated
// by norm_forward_*.cu and norm_backward_*.cu). 16-byte vector accesses when every row start (and the weight,
// bias and outputs) is aligned, else the same kernels with element accesses.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../core/empty.h"
#include "../norm/norm.h"
#include "../norm/norm_ops.h"
#include "norm_backward.cuh"
#include "norm_forward.cuh"
#include "norm_instances.h"

namespace torchops {
namespace norm_cuda {

TORCHOPS_NORM_TYPE_PAIRS(TORCHOPS_NORM_FORWARD_INSTANCE, extern, NormOp::kRms)
TORCHOPS_NORM_TYPE_PAIRS(TORCHOPS_NORM_FORWARD_INSTANCE, extern, NormOp::kAddRms)
TORCHOPS_NORM_TYPE_PAIRS(TORCHOPS_NORM_FORWARD_INSTANCE, extern, NormOp::kLayer)
TORCHOPS_NORM_TYPE_PAIRS(TORCHOPS_NORM_BACKWARD_INSTANCE, extern, false)
TORCHOPS_NORM_TYPE_PAIRS(TORCHOPS_NORM_BACKWARD_INSTANCE, extern, true)

}  // namespace norm_cuda

namespace {

using namespace torchops::norm_cuda;

template <typename T>
const T* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<T>() : nullptr;
}

template <typename T>
T* mutable_or_null(const at::Tensor& t) {
  return t.defined() ? t.mutable_data_ptr<T>() : nullptr;
}

// Calls fn(std::integral_constant<int, kC>) with 16-byte vectors when `vectors`, else single elements.
template <typename T, typename Fn>
void with_access(bool vectors, Fn&& fn) {
  if (vectors) {
    fn(std::integral_constant<int, vector_size<T>()>{});
  } else {
    fn(std::integral_constant<int, 1>{});
  }
}

void forward_cuda(const NormForward& f) {
  const c10::cuda::CUDAGuard device_guard(f.input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int device = f.input.device().index();
  const NormRows x = norm_rows(f.input);
  if (x.rows == 0) return;
  const bool add = f.residual.defined();
  const NormRows res = add ? norm_rows(f.residual) : NormRows{};
  dispatch_norm_types(f.input.scalar_type(), f.weight.defined() ? f.weight : f.bias, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    using A = opmath_t<T>;
    const ForwardArgs<T, W> a{{x.tensor.const_data_ptr<T>(), x.row_stride},
                              {add ? res.tensor.const_data_ptr<T>() : nullptr, res.row_stride},
                              mutable_or_null<T>(f.residual_out),
                              data_or_null<W>(f.weight),
                              data_or_null<W>(f.bias),
                              f.out.mutable_data_ptr<T>(),
                              mutable_or_null<A>(f.mean),
                              mutable_or_null<A>(f.rstd),
                              x.rows,
                              x.cols,
                              static_cast<A>(f.eps),
                              static_cast<A>(f.weight_offset)};
    const int64_t n = x.cols;
    const bool vectors = rows_aligned(a.x, n) && rows_aligned<T>({a.y, n}, n) && param_aligned<T>(a.weight) &&
                         param_aligned<T>(a.bias) &&
                         (!add || (rows_aligned(a.residual, n) && rows_aligned<T>({a.h_out, n}, n)));
    with_access<T>(vectors, [&](auto c) {
      constexpr int kC = decltype(c)::value;
      if (f.kind == NormKind::kLayer) {
        launch_forward<T, W, kC, NormOp::kLayer>(a, device, stream);
      } else if (add) {
        launch_forward<T, W, kC, NormOp::kAddRms>(a, device, stream);
      } else {
        launch_forward<T, W, kC, NormOp::kRms>(a, device, stream);
      }
    });
  });
}

void backward_cuda(const NormBackward& b) {
  const c10::cuda::CUDAGuard device_guard(b.input.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int device = b.input.device().index();
  const NormRows x = norm_rows(b.input);
  if (x.rows == 0) {  // sums over no rows
    if (b.grad_weight.defined()) b.grad_weight.zero_();
    if (b.grad_bias.defined()) b.grad_bias.zero_();
    return;
  }
  const NormRows dy = norm_rows(b.grad_out);
  const bool dres = b.grad_residual_out.defined();
  const NormRows dr = dres ? norm_rows(b.grad_residual_out) : NormRows{};
  const at::Tensor rstd = b.rstd.contiguous();
  const at::Tensor mean = b.mean.defined() ? b.mean.contiguous() : at::Tensor();
  dispatch_norm_types(b.input.scalar_type(), b.weight, [&](auto t_tag, auto w_tag) {
    using T = decltype(t_tag);
    using W = decltype(w_tag);
    using A = opmath_t<T>;
    const BackwardArgs<T, W> a{{dy.tensor.const_data_ptr<T>(), dy.row_stride},
                               {x.tensor.const_data_ptr<T>(), x.row_stride},
                               {dres ? dr.tensor.const_data_ptr<T>() : nullptr, dr.row_stride},
                               data_or_null<W>(b.weight),
                               data_or_null<A>(mean),
                               rstd.const_data_ptr<A>(),
                               mutable_or_null<T>(b.grad_input),
                               nullptr,
                               nullptr,
                               x.rows,
                               static_cast<int>(x.cols),
                               0,
                               0,
                               static_cast<A>(b.weight_offset)};
    const int64_t n = x.cols;
    const bool vectors = rows_aligned(a.dy, n) && rows_aligned(a.h, n) && param_aligned<T>(a.weight) &&
                         (a.dx == nullptr || rows_aligned<T>({a.dx, n}, n)) &&
                         (a.dres.data == nullptr || rows_aligned(a.dres, n));
    with_access<T>(vectors, [&](auto c) {
      constexpr int kC = decltype(c)::value;
      if (b.kind == NormKind::kLayer) {
        launch_backward<T, W, kC, true>(a, b.grad_weight, b.grad_bias, device, stream);
      } else {
        launch_backward<T, W, kC, false>(a, b.grad_weight, at::Tensor(), device, stream);
      }
    });
  });
}

// What the shared entry points (norm_ops.h) call on CUDA.
struct CudaNorm {
  // The kernels' column indices are 32-bit and step by up to 2^16 (a stream sweep's batch).
  static constexpr int64_t kMaxRow = (int64_t{1} << 31) - (int64_t{1} << 16) - 1;
  static at::Tensor empty(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& like) {
    return empty_dense_cuda(sizes, dtype, like.device());
  }
  static void forward(const NormForward& f) { forward_cuda(f); }
  static void backward(const NormBackward& b) { backward_cuda(b); }
};

}  // namespace

TORCH_LIBRARY_IMPL(myns, CUDA, m) { register_norm_ops<CudaNorm>(m); }

}  // namespace torchops
