// vector_add and vector_add_out on the CPU: the VectorAdd row (activations.h) on the elementwise engine's
// CPU backend (cpu_elementwise.h).
#include <torch/library.h>

#include "../elementwise/activations.h"
#include "../elementwise/cpu_elementwise.h"
#include "../elementwise/elementwise.h"

namespace torchops {

TORCH_LIBRARY_IMPL(myns, CPU, m) {
  BinaryKernels<cpu::Backend, VectorAdd>::register_kernels(m);
}

}  // namespace torchops
