// vector_add and vector_add_out on CUDA: the VectorAdd row (activations.h) on the elementwise engine's CUDA
// backend (cuda_elementwise.cuh).
#include <torch/library.h>

#include "../elementwise/activations.h"
#include "../elementwise/cuda_elementwise.cuh"
#include "../elementwise/elementwise.h"

namespace torchops {

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  BinaryKernels<cuda::Backend, VectorAdd>::register_kernels(m);
}

}  // namespace torchops
