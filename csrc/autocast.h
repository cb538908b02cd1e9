// torch.autocast for the myns ops: the cast policies an op can declare where its schema is defined
// (csrc/ops.cpp), and the registration of the one boxed kernel (autocast.cpp) that applies them.
#pragma once

#include <torch/library.h>

namespace torchops {

enum class CastPolicy {
  kAsIs,            // no kernel: autocast falls through
  kPromote,         // eligible inputs to the widest floating dtype among them
  kFloat32,         // eligible inputs to float32
  kLowerPrecision,  // eligible inputs to autocast's dtype for the device (torch.get_autocast_dtype)
};

// An op's policy per device: one policy for both (`CastPolicy::kPromote`) or {cpu, cuda}.
struct AutocastPolicy {
  CastPolicy cpu;
  CastPolicy cuda;
  AutocastPolicy(CastPolicy both) : cpu(both), cuda(both) {}  // NOLINT(google-explicit-constructor)
  AutocastPolicy(CastPolicy cpu, CastPolicy cuda) : cpu(cpu), cuda(cuda) {}
};

// "as is", "promote", "float32" or "lower precision": the spelling tests and torchops._C report.
const char* cast_policy_name(CastPolicy policy);

// Registers the autocast kernel of op `name` (defined in `m`) for the AutocastCPU and AutocastCUDA keys,
// where its policy casts anything.
void register_autocast_kernels(torch::Library& m, const char* name, AutocastPolicy policy);

}  // namespace torchops
