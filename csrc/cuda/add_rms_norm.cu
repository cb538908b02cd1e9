// add_rms_norm's forward launches: the kAdd instantiations of rms_norm's forward kernel
// (rms_norm_forward.cuh), in their own translation unit so they compile alongside rms_norm.cu's.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "rms_norm_forward.cuh"

namespace torchops {
namespace rms_norm_kernels {

template <typename T, typename W>
void launch_add_forward(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps, double offset, bool vectors,
                        cudaStream_t stream) {
  with_vector_size<T, VectorWidths::kFullOrScalar>(vectors ? vector_size<T>() : 1, [&](auto v) {
    launch_forward<T, W, decltype(v)::value, true>(a, rows, n, eps, offset, stream);
  });
}

template void launch_add_forward<double, double>(const ForwardArgs<double, double>&, int64_t, int64_t, double, double,
                                                 bool, cudaStream_t);
template void launch_add_forward<float, float>(const ForwardArgs<float, float>&, int64_t, int64_t, double, double,
                                               bool, cudaStream_t);
template void launch_add_forward<c10::Half, c10::Half>(const ForwardArgs<c10::Half, c10::Half>&, int64_t, int64_t,
                                                       double, double, bool, cudaStream_t);
template void launch_add_forward<c10::Half, float>(const ForwardArgs<c10::Half, float>&, int64_t, int64_t, double,
                                                   double, bool, cudaStream_t);
template void launch_add_forward<c10::BFloat16, c10::BFloat16>(const ForwardArgs<c10::BFloat16, c10::BFloat16>&,
                                                               int64_t, int64_t, double, double, bool, cudaStream_t);
template void launch_add_forward<c10::BFloat16, float>(const ForwardArgs<c10::BFloat16, float>&, int64_t, int64_t,
                                                       double, double, bool, cudaStream_t);

}  // namespace rms_norm_kernels
}  // namespace torchops
