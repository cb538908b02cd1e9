// Every myns schema, in one place. Kernels for the schemas live in cpu/, cuda/ and autograd/; their fake
// (meta) kernels in the Python module meta_kernels.<op>, which set_python_module names (exactly: PyTorch
// checks) before each group. The Python extension module itself is csrc/python/module.cpp.
#include <torch/library.h>

#include <string>

#include "common/math_bits.h"

namespace {

// Defines a schema with the tags every myns op carries; an op that writes an argument also gets the
// math-bits kernels (common/math_bits.h), so no mutable schema, now or later, reaches PyTorch's fallback.
void define(torch::Library& m, const char* schema) {
  m.def(schema, {at::Tag::pt2_compliant_tag});
  const c10::FunctionSchema parsed = torch::schema(schema);
  if (parsed.is_mutable()) torchops::register_math_bits_kernels(m, parsed.name().c_str());
}

}  // namespace

TORCH_LIBRARY(myns, m) {
  m.set_python_module("meta_kernels.vector_add");
  define(m, "vector_add(Tensor a, Tensor b) -> Tensor");
  define(m, "vector_add_out(Tensor a, Tensor b, Tensor(a!) out) -> ()");

  m.set_python_module("meta_kernels.swiglu");
  define(m, "swiglu(Tensor gate, Tensor up) -> Tensor");
  define(m, "swiglu_backward(Tensor grad_out, Tensor gate, Tensor up) -> (Tensor, Tensor)");

  m.set_python_module("meta_kernels.gelu_and_mul");
  // F.gelu(gate, approximate=approximate) * up; approximate is "none" (erf) or "tanh".
  define(m, "gelu_and_mul(Tensor gate, Tensor up, str approximate=\"none\") -> Tensor");
  define(m, "gelu_and_mul_backward(Tensor grad_out, Tensor gate, Tensor up, str approximate=\"none\") "
            "-> (Tensor, Tensor)");

  m.set_python_module("meta_kernels.csr_spmm");
  // A @ dense for A = (crow_indices, col_indices, values), an M x K CSR matrix with K = dense.size(0).
  define(m, "csr_spmm(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor dense) -> Tensor");
  // Same result; backward takes dense's gradient through the given transpose (from _csr_transpose).
  define(m, "_csr_spmm_with_transpose(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor dense, "
            "Tensor t_crow_indices, Tensor t_col_indices, Tensor t_perm) -> Tensor");
  // out[p] = dot(grad_out[row(p)], dense[col_indices[p]]) for every nonzero p: the gradient of values.
  define(m, "_csr_sddmm(Tensor crow_indices, Tensor col_indices, Tensor grad_out, Tensor dense) -> Tensor");
  // The K x M transpose in CSR form (= A in CSC): (t_crow_indices[K + 1], t_col_indices[nnz] = row of each
  // nonzero, t_perm[nnz] = its position in A), stable: rows ascending within each column.
  define(m, "_csr_transpose(Tensor crow_indices, Tensor col_indices, SymInt K) -> (Tensor, Tensor, Tensor)");

  m.set_python_module("meta_kernels.rms_norm");
  // out = x * rstd * (weight + weight_offset), rstd = rsqrt(mean(x^2, -1) + eps); the offset is added in f32
  // (Gemma stores w and scales by 1 + w).
  define(m, "rms_norm(Tensor input, Tensor? weight=None, float eps=1e-06, float weight_offset=0.0) -> Tensor");
  // Internal, for autograd: out plus each row's rstd (shape input.shape[:-1]; float32, float64 for float64).
  define(m, "_rms_norm_forward(Tensor input, Tensor? weight, float eps=1e-06, float weight_offset=0.0) "
            "-> (Tensor out, Tensor rstd)");
  // Internal: grad_input (when input_grad) and grad_weight (when weight_grad; needs a weight); an output not
  // asked for is a [0]-shaped placeholder. The offset enters grad_input only.
  define(m, "_rms_norm_backward(Tensor grad_out, Tensor input, Tensor? weight, Tensor rstd, bool input_grad, "
            "bool weight_grad, float weight_offset=0.0) -> (Tensor grad_input, Tensor grad_weight)");
  // residual_out = input + residual (rounded to input's dtype), out = rms_norm(residual_out, ...), in one pass.
  define(m, "add_rms_norm(Tensor input, Tensor residual, Tensor? weight=None, float eps=1e-06, "
            "float weight_offset=0.0) -> (Tensor out, Tensor residual_out)");
  // Internal, for autograd: add_rms_norm's outputs plus each row's rstd.
  define(m, "_add_rms_norm_forward(Tensor input, Tensor residual, Tensor? weight, float eps=1e-06, "
            "float weight_offset=0.0) -> (Tensor out, Tensor residual_out, Tensor rstd)");
  // Internal: the gradient reaching input and residual alike (rms_norm's grad_input of residual_out, plus
  // grad_residual_out when given) and grad_weight (when weight_grad; else a [0]-shaped placeholder).
  define(m, "_add_rms_norm_backward(Tensor grad_out, Tensor? grad_residual_out, Tensor residual_out, Tensor? weight, "
            "Tensor rstd, bool weight_grad, float weight_offset=0.0) -> (Tensor grad_input, Tensor grad_weight)");
}
