// The backward kernels' instances for layer_norm (norm_backward.cuh), in their own translation unit.
#include "norm_backward.cuh"
#include "norm_instances.h"

namespace torchops {
namespace norm_cuda {

TORCHOPS_NORM_TYPE_PAIRS(TORCHOPS_NORM_BACKWARD_INSTANCE, , true)

}  // namespace norm_cuda
}  // namespace torchops
