#include "math_bits.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>


#include <utility>
#include <vector>

namespace torchops {

namespace {

bool has_math_bits(const at::Tensor& t) { return t.defined() && (t.is_neg() || t.is_conj()); }

at::Tensor resolved(const at::Tensor& t) { return t.resolve_conj().resolve_neg(); }

}  // namespace

void resolve_math_bits_then_call(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t n = arguments.size(), first = stack->size() - n;
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // (the caller's view, the resolved stand-in)
  for (size_t i = 0; i < n; ++i) {
    c10::IValue& value = (*stack)[first + i];
    if (!value.isTensor() || !has_math_bits(value.toTensor())) continue;
    at::Tensor view = value.toTensor();
    at::Tensor stand_in = resolved(view);  // holds the view's logical values: an out may also be an input
    const auto* alias = arguments[i].alias_info();
    const bool is_written = alias != nullptr && alias->isWrite();
    // The stand-in is dense, so the op's own check would pass and the write-back fail with an error that
    // names neither op nor argument: refuse here, as the op does for a plain view.
    TORCH_CHECK(!is_written || at::has_internal_overlap(view) != at::MemOverlap::Yes, op.schema().name(), ": ",
                arguments[i].name(), " has internal overlap (several elements share memory, e.g. an expanded "
                "tensor); it cannot be written");
    if (is_written) written.emplace_back(view, stand_in);
    value = std::move(stand_in);
  }
  // Below both math-bit keys (whichever of them brought us here), so the kernels see plain tensors.
  const auto below = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Negative);
  op.redispatchBoxed(below.remove(c10::DispatchKey::Conjugate), stack);
  for (auto& [view, stand_in] : written) {
    view.copy_(stand_in);
    // A returned alias of the stand-in (an out= op that returns its out) becomes the caller's view again.
    for (size_t r = stack->size() - op.schema().returns().size(); r < stack->size(); ++r) {
      if ((*stack)[r].isTensor() && (*stack)[r].toTensor().is_same(stand_in)) (*stack)[r] = view;
    }
  }
}

void register_math_bits_kernels(torch::Library& m, const char* name) {
  for (auto key : {c10::DispatchKey::Negative, c10::DispatchKey::Conjugate}) {
    m.impl(name, torch::dispatch(key, torch::CppFunction::makeFromBoxedFunction<&resolve_math_bits_then_call>()));
  }
}

}  // namespace torchops
