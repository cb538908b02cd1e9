// What each op's definition (define() in csrc/ops.cpp) declares beyond its schema, recorded as the schemas
// register; torchops._C.declarations() hands it to Python (the autocast tests, torchops.distributed).
// Plain types only: the Python module includes this without torch's headers.
#pragma once

#include <string>
#include <vector>

namespace torchops {

struct OpDeclaration {
  std::string name;           // without the namespace, e.g. "rms_norm"
  std::string autocast_cpu;   // cast_policy_name() of the declared policy; empty when none was declared
  std::string autocast_cuda;
  bool pointwise = false;     // tagged at::Tag::pointwise
  std::vector<std::string> linear_in;  // pointwise ops: the tensor arguments the op is jointly linear in
};

// Every op defined so far, in definition order.
const std::vector<OpDeclaration>& op_declarations();

}  // namespace torchops
