// Lazy math bits (the negative and conjugate views, e.g. z.conj().imag) on the arguments an op writes.
//
// PyTorch's fallback for the Negative/Conjugate dispatch keys resolves the bits of inputs, but for a
// mutable op it assumes the op returns its out= argument (as native out= ops do): one that returns ()
// tripped an internal assert there and left the process corrupt. Every mutable myns schema therefore gets
// this kernel for both keys instead: arguments it only reads are resolved (materialised), each argument it
// writes is replaced by a resolved copy, the op runs below these keys, and the copy is written back
// through the view (copy_ honours the bits), so the result is what the same call on plain tensors gives.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

namespace torchops {

void resolve_math_bits_then_call(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

// Registers resolve_math_bits_then_call for the Negative and Conjugate keys of `name` in library `m`.
void register_math_bits_kernels(torch::Library& m, const char* name);

}  // namespace torchops
