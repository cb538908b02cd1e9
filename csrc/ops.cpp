// Every myns schema, in one place, each with what the generic layers derive from its definition:
//   - the autocast policy (autocast.h): the AutocastCPU/AutocastCUDA kernels are registered from it;
//   - Pointwise{...}: elementwise in every tensor argument, outputs shaped like the inputs: tagged
//     at::Tag::pointwise, and torchops.distributed gives it the generic elementwise sharding rule (Partial
//     passes through the arguments it is declared linear in);
//   - the comment right above a public op's define() becomes its doc comment in the generated C++ header
//     <torchops/ops.h> (scripts/gen_ops_header.py; public: no leading underscore, no _backward).
// Kernels for the schemas live in cpu/, cuda/ and autograd/; their fake (meta) kernels in the Python module
// torchops._meta_kernels.<op> (the repo's meta_kernels/<op>.py), which set_python_module names (exactly:
// PyTorch checks) before each group. The Python extension module itself is csrc/python/module.cpp.
#include <torch/library.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autocast.h"
#include "core/math_bits.h"
#include "declarations.h"

namespace torchops {
namespace {

// Function-local, so it exists whenever the first define() runs, whatever the static initialisation order.
std::vector<OpDeclaration>& declarations() {
  static std::vector<OpDeclaration> declared;
  return declared;
}

}  // namespace

const std::vector<OpDeclaration>& op_declarations() { return declarations(); }

}  // namespace torchops

namespace {

using Cast = torchops::CastPolicy;
using torchops::AutocastPolicy;

// See the top of this file. `linear_in` names tensor arguments of the schema.
struct Pointwise {
  std::vector<std::string> linear_in;
  Pointwise(std::initializer_list<const char*> linear = {}) : linear_in(linear.begin(), linear.end()) {}
};

// Defines a schema with the tags every myns op carries (plus pointwise when declared), registers its
// autocast kernels from its policy and records both (declarations.h); an op that writes an argument also
// gets the math-bits kernels (core/math_bits.h), so no mutable schema, now or later, reaches PyTorch's
// fallback.
void define(torch::Library& m, const char* schema, std::optional<AutocastPolicy> autocast = std::nullopt,
            std::optional<Pointwise> pointwise = std::nullopt) {
  if (pointwise) {
    m.def(schema, {at::Tag::pt2_compliant_tag, at::Tag::pointwise});
  } else {
    m.def(schema, {at::Tag::pt2_compliant_tag});
  }
  const c10::FunctionSchema parsed = torch::schema(schema);
  const std::string name = parsed.name();
  if (parsed.is_mutable()) torchops::register_math_bits_kernels(m, name.c_str());

  torchops::OpDeclaration declared;
  declared.name = name;
  if (autocast) {
    torchops::register_autocast_kernels(m, name.c_str(), *autocast);
    declared.autocast_cpu = torchops::cast_policy_name(autocast->cpu);
    declared.autocast_cuda = torchops::cast_policy_name(autocast->cuda);
  }
  if (pointwise) {
    declared.pointwise = true;
    for (const std::string& arg : pointwise->linear_in) {
      const auto index = parsed.argumentIndexWithName(arg);
      TORCH_INTERNAL_ASSERT(index && parsed.arguments()[*index].type()->kind() == c10::TypeKind::TensorType,
                            "myns::", name, ": Pointwise names ", arg, ", which is no Tensor argument");
    }
    declared.linear_in = pointwise->linear_in;
  }
  torchops::declarations().push_back(std::move(declared));
}

void define(torch::Library& m, const char* schema, Pointwise pointwise) {
  define(m, schema, std::nullopt, std::move(pointwise));
}

}  // namespace

TORCH_LIBRARY(myns, m) {
  m.set_python_module("torchops._meta_kernels.vector_add");
  // a + b (same shape, dtype and device); a new contiguous tensor.
  define(m, "vector_add(Tensor a, Tensor b) -> Tensor", Cast::kPromote, Pointwise{"a", "b"});
  // Writes a + b into out (which may be a or b).
  define(m, "vector_add_out(Tensor a, Tensor b, Tensor(a!) out) -> ()", Cast::kPromote, Pointwise{});

  m.set_python_module("torchops._meta_kernels.swiglu");
  // silu(gate) * up.
  define(m, "swiglu(Tensor gate, Tensor up) -> Tensor", Cast::kPromote, Pointwise{});
  define(m, "swiglu_backward(Tensor grad_out, Tensor gate, Tensor up) -> (Tensor, Tensor)", Pointwise{"grad_out"});
  // swiglu_backward written into grad_gate and grad_up (each may be an input exactly: the backward writes the
  // gate's gradient into an incoming gradient that nothing else holds).
  define(m, "swiglu_backward_out(Tensor grad_out, Tensor gate, Tensor up, Tensor(a!) grad_gate, Tensor(b!) grad_up) "
            "-> ()",
         Pointwise{});

  m.set_python_module("torchops._meta_kernels.gelu_and_mul");
  // F.gelu(gate, approximate=approximate) * up; approximate is "none" (erf) or "tanh".
  define(m, "gelu_and_mul(Tensor gate, Tensor up, str approximate=\"none\") -> Tensor", Cast::kPromote, Pointwise{});
  define(m, "gelu_and_mul_backward(Tensor grad_out, Tensor gate, Tensor up, str approximate=\"none\") "
            "-> (Tensor, Tensor)",
         Pointwise{"grad_out"});
  define(m, "gelu_and_mul_backward_out(Tensor grad_out, Tensor gate, Tensor up, str approximate, "
            "Tensor(a!) grad_gate, Tensor(b!) grad_up) -> ()",
         Pointwise{});

  m.set_python_module("torchops._meta_kernels.csr_spmm");
  // A @ dense for the M x K CSR matrix A = (crow_indices, col_indices, values), K = dense.size(0).
  // Autocast: lower precision, like torch.sparse.mm (addmm).
  define(m, "csr_spmm(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor dense) -> Tensor",
         Cast::kLowerPrecision);
  // Row i of the result reduces values[p] * dense[col_indices[p]] over row i's nonzeros p with reduce "sum",
  // "mean", "max" or "min" (values None: every value is 1; an empty row gives 0). Heads: values (nnz,) or
  // (nnz, H), dense (K, D) or (K, H, D), result (M, D) or (M, H, D). max / min pass the gradient to the first
  // nonzero of the row (lowest position) reaching the extreme, a NaN product above every number.
  // Autocast: lower precision, like torch.sparse.mm.
  define(m, "spmm_reduce(Tensor crow_indices, Tensor col_indices, Tensor? values, Tensor dense, str reduce=\"sum\") "
            "-> Tensor",
         Cast::kLowerPrecision);
  // Internal, for autograd of max / min: the result and the selected positions (arg, shaped like it, the
  // indices' dtype, -1 for an empty row).
  define(m, "_spmm_reduce_forward(Tensor crow_indices, Tensor col_indices, Tensor? values, Tensor dense, "
            "str reduce) -> (Tensor out, Tensor arg)");
  // Internal: the gradients of a max / min through its arg (grad_values when values_grad, grad_dense when
  // dense_grad; else [0]-shaped placeholders). The transpose (all three or none) serves backends that need it.
  define(m, "_spmm_reduce_backward(Tensor grad_out, Tensor crow_indices, Tensor col_indices, Tensor? values, "
            "Tensor dense, Tensor arg, Tensor? t_crow_indices, Tensor? t_col_indices, Tensor? t_perm, "
            "bool values_grad, bool dense_grad) -> (Tensor grad_values, Tensor grad_dense)");
  // spmm_reduce whose backward takes dense's gradient through the given transpose (from _csr_transpose).
  // torchops.spmm's eager path: the same product as spmm_reduce, so the same autocast policy.
  define(m, "_csr_spmm_with_transpose(Tensor crow_indices, Tensor col_indices, Tensor? values, Tensor dense, "
            "Tensor t_crow_indices, Tensor t_col_indices, Tensor t_perm, str reduce=\"sum\") -> Tensor",
         Cast::kLowerPrecision);
  // The K x M transpose in CSR form (= A in CSC): (t_crow_indices[K + 1], t_col_indices[nnz] = row of each
  // nonzero, t_perm[nnz] = its position in A), stable: rows ascending within each column.
  define(m, "_csr_transpose(Tensor crow_indices, Tensor col_indices, SymInt K) -> (Tensor, Tensor, Tensor)");

  m.set_python_module("torchops._meta_kernels.csr_sddmm");
  // One value per nonzero (i, j) of the M x K CSR structure: op "dot" sums a[i, ..., :] * b[j, ..., :] over the
  // last dimension (a (M, D) or (M, H, D), b (K, D) or (K, H, D)), "add" gives a[i] + b[j] and "mul"
  // a[i] * b[j] (a (M,) or (M, H), b (K,) or (K, H)); the result is (nnz,) or (nnz, H).
  // Autocast: lower precision, like the products it generalises.
  define(m, "sddmm(Tensor crow_indices, Tensor col_indices, Tensor a, Tensor b, str op=\"dot\") -> Tensor",
         Cast::kLowerPrecision);

  m.set_python_module("torchops._meta_kernels.csr_softmax");
  // Softmax over each row's nonzeros of values (nnz,) or (nnz, H), per head; f32 math for 16-bit values.
  // Autocast: float32, like softmax.
  define(m, "csr_softmax(Tensor crow_indices, Tensor values) -> Tensor", Cast::kFloat32);
  // Internal: csr_softmax's gradient y * (grad_out - sum over the row of grad_out * y), y = csr_softmax(values)
  // recomputed (a graph node cannot keep its own output).
  define(m, "_csr_softmax_backward(Tensor crow_indices, Tensor grad_out, Tensor values) -> Tensor");

  m.set_python_module("torchops._meta_kernels.rms_norm");
  // input * rsqrt(mean(input^2, -1) + eps) * (weight + weight_offset), over the last dimension; the offset
  // is added in f32 (Gemma stores w and scales by 1 + w).
  // Autocast: as F.rms_norm, as is on the CPU (in no CPU list), float32 on CUDA (autocast's fp32 list).
  define(m, "rms_norm(Tensor input, Tensor? weight=None, float eps=1e-06, float weight_offset=0.0) -> Tensor",
         AutocastPolicy{Cast::kAsIs, Cast::kFloat32});
  // Internal, for autograd: out plus each row's rstd (shape input.shape[:-1]; float32, float64 for float64).
  define(m, "_rms_norm_forward(Tensor input, Tensor? weight, float eps=1e-06, float weight_offset=0.0) "
            "-> (Tensor out, Tensor rstd)");
  // Internal: grad_input (when input_grad) and grad_weight (when weight_grad; needs a weight); an output not
  // asked for is a [0]-shaped placeholder. The offset enters grad_input only.
  define(m, "_rms_norm_backward(Tensor grad_out, Tensor input, Tensor? weight, Tensor rstd, bool input_grad, "
            "bool weight_grad, float weight_offset=0.0) -> (Tensor grad_input, Tensor grad_weight)");
  // residual_out = input + residual (rounded to input's dtype); out = rms_norm(residual_out, weight, eps,
  // weight_offset), in one pass.
  // Autocast: input + residual follows add (promote: a bf16 block output added to an f32 residual stream),
  // then rms_norm's CUDA policy.
  define(m, "add_rms_norm(Tensor input, Tensor residual, Tensor? weight=None, float eps=1e-06, "
            "float weight_offset=0.0) -> (Tensor out, Tensor residual_out)",
         AutocastPolicy{Cast::kPromote, Cast::kFloat32});
  // Internal, for autograd: add_rms_norm's outputs plus each row's rstd.
  define(m, "_add_rms_norm_forward(Tensor input, Tensor residual, Tensor? weight, float eps=1e-06, "
            "float weight_offset=0.0) -> (Tensor out, Tensor residual_out, Tensor rstd)");
  // Internal: the gradient reaching input and residual alike (rms_norm's grad_input of residual_out, plus
  // grad_residual_out when given) and grad_weight (when weight_grad; else a [0]-shaped placeholder).
  define(m, "_add_rms_norm_backward(Tensor grad_out, Tensor? grad_residual_out, Tensor residual_out, Tensor? weight, "
            "Tensor rstd, bool weight_grad, float weight_offset=0.0) -> (Tensor grad_input, Tensor grad_weight)");

  m.set_python_module("torchops._meta_kernels.layer_norm");
  // F.layer_norm(input, (N,), weight, bias, eps) over the last dimension N: (input - mean) * rstd * weight + bias,
  // the mean and the biased variance in f32 (f64 for f64 input).
  // Autocast: as F.layer_norm, as is on the CPU, float32 on CUDA (autocast's fp32 list).
  define(m, "layer_norm(Tensor input, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor",
         AutocastPolicy{Cast::kAsIs, Cast::kFloat32});
  // Internal, for autograd: out plus each row's mean and rstd (shape input.shape[:-1]; float32, float64 for
  // float64).
  define(m, "_layer_norm_forward(Tensor input, Tensor? weight, Tensor? bias, float eps=1e-05) "
            "-> (Tensor out, Tensor mean, Tensor rstd)");
  // Internal: grad_input (when input_grad), grad_weight (when weight_grad; needs a weight; weight's dtype) and
  // grad_bias (when bias_grad; weight's dtype, or the stat dtype without a weight); an output not asked for is a
  // [0]-shaped placeholder.
  define(m, "_layer_norm_backward(Tensor grad_out, Tensor input, Tensor? weight, Tensor mean, Tensor rstd, "
            "bool input_grad, bool weight_grad, bool bias_grad) -> (Tensor grad_input, Tensor grad_weight, "
            "Tensor grad_bias)");

  m.set_python_module("torchops._meta_kernels.linear_cross_entropy");
  // F.cross_entropy(F.linear(input, linear_weight, linear_bias), target, reduction=reduction,
  // ignore_index=ignore_index, label_smoothing=label_smoothing) over the last dimension (the logits capped to
  // softcap * tanh(logits / softcap) when softcap is given), without ever holding all the logits: a chunk of
  // tokens at a time, the softmax in float32 (float64 for float64). input (..., H); linear_weight (V, H);
  // target of input's leading shape, int32 or int64; linear_bias (V). A target outside [0, V) other than
  // ignore_index raises on the CPU and gives a NaN loss (and no gradient) on CUDA.
  // Autocast: lower precision, like linear (the softmax runs in float32 regardless).
  define(m, "linear_cross_entropy(Tensor input, Tensor linear_weight, Tensor target, Tensor? linear_bias=None, "
            "str reduction=\"mean\", int ignore_index=-100, float label_smoothing=0.0, float? softcap=None) -> Tensor",
         Cast::kLowerPrecision);
  // Internal: linear_cross_entropy with chunk_size tokens a chunk (0: chosen from the sizes), what
  // torchops.linear_cross_entropy(..., chunk_size=) calls; the same autocast policy.
  define(m, "_linear_cross_entropy_chunked(Tensor input, Tensor linear_weight, Tensor target, "
            "Tensor? linear_bias=None, str reduction=\"mean\", int ignore_index=-100, float label_smoothing=0.0, "
            "float? softcap=None, int chunk_size=0) -> Tensor",
         Cast::kLowerPrecision);
  // Internal, for autograd: the per-token losses (target's shape; float32, float64 for float64) and, where
  // asked, the gradients of grad_scale * loss.sum() (grad_scale absent: 1) from the same chunks; an output not
  // asked for is a [0]-shaped placeholder.
  define(m, "_linear_cross_entropy_forward(Tensor input, Tensor linear_weight, Tensor target, Tensor? linear_bias, "
            "int ignore_index, float label_smoothing, float? softcap, Tensor? grad_scale, bool input_grad, "
            "bool weight_grad, bool bias_grad, int chunk_size=0) -> (Tensor loss, Tensor grad_input, "
            "Tensor grad_weight, Tensor grad_bias)");
  // Internal: the gradients of sum(grad_loss * loss) for any grad_loss of target's shape, the logits
  // recomputed chunk by chunk; outputs not asked for are [0]-shaped placeholders.
  define(m, "_linear_cross_entropy_backward(Tensor grad_loss, Tensor input, Tensor linear_weight, Tensor target, "
            "Tensor? linear_bias, int ignore_index, float label_smoothing, float? softcap, bool input_grad, "
            "bool weight_grad, bool bias_grad, int chunk_size=0) -> (Tensor grad_input, Tensor grad_weight, "
            "Tensor grad_bias)");
  // F.cross_entropy over the last dimension of logits (..., V) (the class dimension is the last one, whatever
  // the rank), target of logits' leading shape, int32 or int64; one pass forward and one backward, in float32
  // for 16-bit logits (float64 for float64) without a float32 copy of them. Options and invalid targets as
  // linear_cross_entropy's.
  // Autocast: as is (the math is float32 already; casting would copy the logits).
  define(m, "cross_entropy(Tensor logits, Tensor target, str reduction=\"mean\", int ignore_index=-100, "
            "float label_smoothing=0.0, float? softcap=None) -> Tensor",
         Cast::kAsIs);
  // Internal, for autograd: the per-token losses and each row's log-sum-exp (target's shape; float32, float64
  // for float64).
  define(m, "_cross_entropy_forward(Tensor logits, Tensor target, int ignore_index, float label_smoothing, "
            "float? softcap) -> (Tensor loss, Tensor lse)");
  // Internal: d(sum(grad_loss * loss))/dlogits from the saved lse, in logits' dtype.
  define(m, "_cross_entropy_backward(Tensor grad_loss, Tensor logits, Tensor target, Tensor lse, int ignore_index, "
            "float label_smoothing, float? softcap) -> Tensor");

  m.set_python_module("torchops._meta_kernels.rotary_embedding");
  // transformers' apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim): (q * cos + rotate_half(q) * sin, the same
  // for k) over the first rot = cos.size(-1) features, the rest passed through (partial rotary); q and k
  // [batch, heads, seq, head_dim] (unsqueeze_dim 1) or [batch, seq, heads, head_dim] (2), any strides, their heads
  // may differ (GQA); cos and sin [1 or batch, 1 or seq, rot]; interleaved: GPT-J's pairs (2i, 2i + 1).
  // Autocast: promote, like the products of its formula (mul).
  define(m, "rotary_embedding(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim=1, bool interleaved=False) "
            "-> (Tensor, Tensor)",
         Cast::kPromote);
  // Internal: the gradients of q and k from those of rotary_embedding's outputs (the transposed rotation).
  define(m, "_rotary_embedding_backward(Tensor grad_q, Tensor grad_k, Tensor cos, Tensor sin, int unsqueeze_dim=1, "
            "bool interleaved=False) -> (Tensor, Tensor)");
  // vLLM's rotary_embedding: rotates query and key ([tokens, heads * head_size] or [tokens, heads, head_size]) in
  // place by the row positions[t] of cos_sin_cache ([max_position, rot]: the cos of each pair, then its sin) over
  // their first rot features; is_neox: the rotate-half layout, else GPT-J's interleaved pairs. Inference only.
  // Autocast: as is (it writes query and key, which autocast never casts; the cache may be float32).
  define(m, "rotary_embedding_(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, "
            "Tensor cos_sin_cache, bool is_neox=True) -> ()",
         Cast::kAsIs);
  // rotary_embedding(rms_norm(q, q_weight, eps, weight_offset), rms_norm(k, k_weight, eps, weight_offset), cos, sin,
  // unsqueeze_dim, interleaved) in one pass per tensor: each head RMS-normalised over head_dim, then rotated (Qwen3,
  // Gemma 3).
  // Autocast: the composition's: promote on the CPU (rms_norm is as is there), float32 on CUDA (rms_norm's).
  define(m, "qk_norm_rope(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, Tensor cos, Tensor sin, "
            "float eps=1e-06, float weight_offset=0.0, int unsqueeze_dim=1, bool interleaved=False) -> (Tensor, Tensor)",
         AutocastPolicy{Cast::kPromote, Cast::kFloat32});
  // Internal: (grad_q, grad_k, grad_q_weight, grad_k_weight); a side's gradients exist where its output's gradient
  // is given (input_grad: of the input, weight_grad: of the weight), else are [0]-shaped placeholders.
  define(m, "_qk_norm_rope_backward(Tensor? grad_q_out, Tensor? grad_k_out, Tensor q, Tensor k, Tensor q_weight, "
            "Tensor k_weight, Tensor cos, Tensor sin, float eps, float weight_offset, int unsqueeze_dim, "
            "bool interleaved, bool input_grad, bool weight_grad) -> (Tensor grad_q, Tensor grad_k, "
            "Tensor grad_q_weight, Tensor grad_k_weight)");
}
