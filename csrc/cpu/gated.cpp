// The gated ops (GatedFamily, activations.h) on the CPU: gated.h's kernels on the elementwise engine's CPU
// backend (cpu_elementwise.h). f32/f16/bf16 run 8 lanes of f32 math at a time where AVX2/FMA/F16C exist
// (16-bit gates look their activation up by their stored bits), f64 in f64.
#include <torch/library.h>

#include "../elementwise/cpu_elementwise.h"
#include "../elementwise/gated.h"

namespace torchops {

TORCH_LIBRARY_IMPL(myns, CPU, m) {
  register_gated_kernels<cpu::Backend>(m);
}

}  // namespace torchops
