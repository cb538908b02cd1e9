// The gated ops (GatedFamily, activations.h) on CUDA: gated.h's kernels on the elementwise engine's CUDA
// backend (cuda_elementwise.cuh), f32 math for 16-bit types (with fast exp where the rounding to 16 bits
// hides it); the backward recomputes the activation.
#include <torch/library.h>

#include "../elementwise/cuda_elementwise.cuh"
#include "../elementwise/gated.h"

namespace torchops {

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  register_gated_kernels<cuda::Backend>(m);
}

}  // namespace torchops
