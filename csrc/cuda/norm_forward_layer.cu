// The forward kernels' instances for layer_norm (norm_forward.cuh), in their own translation unit.
#include "norm_forward.cuh"
#include "norm_instances.h"

namespace torchops {
namespace norm_cuda {

TORCHOPS_NORM_TYPE_PAIRS(TORCHOPS_NORM_FORWARD_INSTANCE, , NormOp::kLayer)

}  // namespace norm_cuda
}  // namespace torchops
