// torch.autocast for the myns ops: one boxed kernel for the AutocastCPU and AutocastCUDA keys, parameterised
// by a cast policy, registered per op from one table. Each op takes the policy its native counterpart has
// under autocast, so mixing it with native ops inside an autocast region works as it would with them:
//
//   vector_add, vector_add_out, swiglu   promote  like add/mul, which type promotion settles (autocast lists
//                                                 neither): the floating inputs are cast to the widest of
//                                                 their dtypes, e.g. (float32, bfloat16) -> float32
//   rms_norm                   CPU: as is, CUDA: float32, like F.rms_norm (aten::rms_norm is in autocast's
//                                                 CUDA fp32 list and in no CPU list)
//   csr_spmm                   lower precision    like torch.sparse.mm, whose addmm is in both devices'
//                                                 lower-precision lists: to autocast's dtype
//
// As torch's own autocast kernels do, only floating tensors on the autocast device other than float64 are
// cast ("eligible"); the others pass as they are. An argument the op writes (out=) is never cast nor
// counted: writing a converted copy would lose the result, so the op's own dtype check decides (torch's
// out= ops are not autocast either). Ops not in the table have no kernel here and fall through: the
// internal forward helpers, which the public ops' kernels call with their arguments already cast (and
// this kernel excludes autocast while the op runs), and the backward ops, which autograd runs with the
// dtypes the forward chose (autocast does not apply to backward passes).
#include <ATen/autocast_mode.h>  // get_autocast_dtype, cached_cast: only here in torch's headers
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>


namespace torchops {
namespace {

enum class CastPolicy {
  kAsIs,            // no kernel: autocast falls through
  kPromote,         // eligible inputs to the widest floating dtype among them
  kFloat32,         // eligible inputs to float32
  kLowerPrecision,  // eligible inputs to autocast's dtype for the device (torch.get_autocast_dtype)
};

struct OpCastPolicy {
  const char* name;
  CastPolicy cpu;
  CastPolicy cuda;
};

// A new op gets a row here (tests/test_autocast.py checks every public op against its expected policy).
// add_rms_norm: its input + residual follows add (promote: a bf16 block output added to an f32 residual
// stream), then rms_norm's CUDA policy.
constexpr OpCastPolicy kCastPolicies[] = {
    {"vector_add", CastPolicy::kPromote, CastPolicy::kPromote},
    {"vector_add_out", CastPolicy::kPromote, CastPolicy::kPromote},
    {"swiglu", CastPolicy::kPromote, CastPolicy::kPromote},
    {"gelu_and_mul", CastPolicy::kPromote, CastPolicy::kPromote},
    {"rms_norm", CastPolicy::kAsIs, CastPolicy::kFloat32},
    {"add_rms_norm", CastPolicy::kPromote, CastPolicy::kFloat32},
    {"csr_spmm", CastPolicy::kLowerPrecision, CastPolicy::kLowerPrecision},
    // torchops.spmm's eager path: the same product as csr_spmm, so the same policy.
    {"_csr_spmm_with_transpose", CastPolicy::kLowerPrecision, CastPolicy::kLowerPrecision},
};

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

void register_autocast_kernels(torch::Library& m, bool cuda) {
  for (const auto& row : kCastPolicies) {
    const CastPolicy policy = cuda ? row.cuda : row.cpu;
    if (policy != CastPolicy::kAsIs) m.impl(row.name, autocast_kernel(policy));
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, AutocastCPU, m) { register_autocast_kernels(m, /*cuda=*/false); }

TORCH_LIBRARY_IMPL(myns, AutocastCUDA, m) { register_autocast_kernels(m, /*cuda=*/true); }

}  // namespace torchops
