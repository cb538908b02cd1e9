// torch.autocast for the myns ops: one boxed kernel for the AutocastCPU and AutocastCUDA keys, parameterised
// by a cast policy. Each op declares its policy where its schema is defined (csrc/ops.cpp, define()), and
// takes the policy its native counterpart has under autocast, so mixing it with native ops inside an
// autocast region works as it would with them:
//
//   promote            like add/mul, which type promotion settles (autocast lists neither): the floating
//                      inputs are cast to the widest of their dtypes, e.g. (float32, bfloat16) -> float32
//   float32            like the ops in autocast's fp32 lists (F.rms_norm on CUDA)
//   lower precision    like mm/addmm (torch.sparse.mm), in both devices' lower-precision lists: to
//                      autocast's dtype
//   as is              no kernel: autocast falls through (F.rms_norm on the CPU, in no CPU list)
//
// As torch's own autocast kernels do, only floating tensors on the autocast device other than float64 are
// cast ("eligible"); the others pass as they are. An argument the op writes (out=) is never cast nor
// counted: writing a converted copy would lose the result, so the op's own dtype check decides (torch's
// out= ops are not autocast either). Ops that declare no policy have no kernel here and fall through: the
// internal forward helpers, which the public ops' kernels call with their arguments already cast (and
// this kernel excludes autocast while the op runs), and the backward ops, which autograd runs with the
// dtypes the forward chose (autocast does not apply to backward passes).
#include "autocast.h"

#include <ATen/autocast_mode.h>  // get_autocast_dtype, cached_cast: only here in torch's headers
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

namespace torchops {
namespace {

bool is_written(const c10::Argument& argument) {
  const auto* alias = argument.alias_info();
  return alias != nullptr && alias->isWrite();
}

// Replaces each tensor among the arguments the op only reads (Tensor, Tensor?, Tensor[]) by map(tensor);
// a map that returns its argument just visits them.
template <typename Map>
void map_read_tensors(const c10::FunctionSchema& schema, torch::jit::Stack& stack, size_t first, Map&& map) {
  const auto& arguments = schema.arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (is_written(arguments[i])) continue;
    c10::IValue& value = stack[first + i];
    if (value.isTensor()) {
      value = map(value.toTensor());
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) list[k] = map(list.get(k));
    }
  }
}

template <CastPolicy kPolicy>
void cast_then_call(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  // AutocastCUDA outranks AutocastCPU: with both in the set this call is the CUDA one, and the CPU kernel
  // (when that autocast is on too) runs next, below it.
  const bool cuda = keys.has(c10::DispatchKey::AutocastCUDA);
  const c10::DeviceType device = cuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  const c10::DispatchKey key = cuda ? c10::DispatchKey::AutocastCUDA : c10::DispatchKey::AutocastCPU;
  const auto& schema = op.schema();
  const size_t first = stack->size() - schema.arguments().size();

  at::ScalarType target = at::ScalarType::Undefined;
  if constexpr (kPolicy == CastPolicy::kFloat32) {
    target = at::kFloat;
  } else if constexpr (kPolicy == CastPolicy::kLowerPrecision) {
    target = at::autocast::get_autocast_dtype(device);
  } else {
    static_assert(kPolicy == CastPolicy::kPromote);
    map_read_tensors(schema, *stack, first, [&](const at::Tensor& t) {
      if (at::autocast::is_eligible(t, device)) {
        target = target == at::ScalarType::Undefined ? t.scalar_type() : at::promote_types(target, t.scalar_type());
      }
      return t;
    });
  }
  if (target != at::ScalarType::Undefined) {
    map_read_tensors(schema, *stack, first,
                      [&](const at::Tensor& t) { return at::autocast::cached_cast(target, t, device); });
  }
  // Autocast stays off for whatever the op calls, as in torch's autocast kernels.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, key), stack);
}

torch::CppFunction autocast_kernel(CastPolicy policy) {
  switch (policy) {
    case CastPolicy::kPromote:
      return torch::CppFunction::makeFromBoxedFunction<&cast_then_call<CastPolicy::kPromote>>();
    case CastPolicy::kFloat32:
      return torch::CppFunction::makeFromBoxedFunction<&cast_then_call<CastPolicy::kFloat32>>();
    case CastPolicy::kLowerPrecision:
      return torch::CppFunction::makeFromBoxedFunction<&cast_then_call<CastPolicy::kLowerPrecision>>();
    case CastPolicy::kAsIs:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "no autocast kernel for the as-is policy");
}

}  // namespace

const char* cast_policy_name(CastPolicy policy) {
  switch (policy) {
    case CastPolicy::kAsIs:
      return "as is";
    case CastPolicy::kPromote:
      return "promote";
    case CastPolicy::kFloat32:
      return "float32";
    case CastPolicy::kLowerPrecision:
      return "lower precision";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown cast policy");
}

void register_autocast_kernels(torch::Library& m, const char* name, AutocastPolicy policy) {
  // Registered through the defining library itself (torch::dispatch picks the key), so the kernels exist
  // exactly when the schema does, with no ordering between translation units to get wrong.
  if (policy.cpu != CastPolicy::kAsIs) {
    m.impl(name, torch::dispatch(c10::DispatchKey::AutocastCPU, autocast_kernel(policy.cpu)));
  }
  if (policy.cuda != CastPolicy::kAsIs) {
    m.impl(name, torch::dispatch(c10::DispatchKey::AutocastCUDA, autocast_kernel(policy.cuda)));
  }
}

}  // namespace torchops
