// Shared by the sparse ops, CPU and CUDA alike: argument checks (messages from meta_kernels/_checks.py's
// table), the CPU-side validation of a CSR structure, the operands of each op family as its kernels read them,
// and the front half of every kernel over a backend (CsrKernels).
//
// Op families (each backend implements the engines, CsrKernels turns them into the registered ops):
//   spmm      out[i, h, :] = reduce over row i's nonzeros p of w(p, h) * dense[col[p], h, :], reduce sum, mean,
//             max or min (csr_spmm, spmm_reduce, _spmm_reduce_forward, _csr_spmm_with_transpose), and the
//             gradient of a max/min through the selected nonzeros (_spmm_reduce_backward);
//   sddmm     one value per nonzero from a's row and b's column (dot over the last dimension, add, mul);
//   softmax   over each row's nonzeros (csr_softmax, _csr_softmax_backward);
//   transpose A^T's structure (_csr_transpose).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "../core/checks.h"

namespace torchops {

// crow_indices and col_indices: defined, on `device_of`'s device, 1-D, int32 or int64 (the same for both),
// and crow_indices holds M + 1 >= 1 entries.
void check_csr_indices(const char* op, NamedTensor crow, NamedTensor col, NamedTensor device_of);

// crow_indices alone (the ops without column indices): defined, on `device_of`'s device, 1-D, M + 1 >= 1
// entries, int32 or int64.
void check_crow_indices(const char* op, NamedTensor crow, NamedTensor device_of);

// A defined 2-D float matrix on `device_of`'s device.
void check_csr_matrix(const char* op, NamedTensor t, NamedTensor device_of);

// Everything csr_spmm(crow_indices, col_indices, values, dense) needs before its kernel runs.
void check_csr_spmm_args(const char* op, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                         const at::Tensor& dense);

// _csr_transpose(crow_indices, col_indices, K): the indices, and K >= 0.
void check_csr_transpose_input(const char* op, const at::Tensor& crow, const at::Tensor& col, int64_t K);

// A transpose handed to an op (_csr_spmm_with_transpose, _spmm_reduce_backward): metadata only (its values
// are read in bounds whatever they are; a backward that uses it validates it like any input).
void check_csr_transpose_args(const char* op, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& dense,
                              const at::Tensor& t_crow, const at::Tensor& t_col, const at::Tensor& t_perm);

// values[t_perm] for a transpose a caller handed in: on CUDA its entries are clamped into [0, nnz) first, so a
// malformed one reads in bounds (index_select's device assert would end the process's CUDA context); the CPU's
// index_select raises on one. (t_perm holds nnz entries: check_csr_transpose_args.)
inline at::Tensor permuted_values(const at::Tensor& values, const at::Tensor& t_perm) {
  if (!values.is_cuda() || values.size(0) == 0) return values.index_select(0, t_perm);
  return values.index_select(0, t_perm.clamp(0, values.size(0) - 1));
}

// CPU only (it reads the indices): crow_indices[0] == 0, non-decreasing, crow_indices[M] == nnz and every
// column in [0, K). Raises a RuntimeError naming the first offending entry.
void check_csr_structure_cpu(const char* op, const at::Tensor& crow, const at::Tensor& col, int64_t K);

// The same for the row offsets alone, nnz being the length of the tensor named `of`.
void check_crow_structure_cpu(const char* op, const at::Tensor& crow, int64_t nnz, const char* of);

// `t` itself when its rows are dense (unit column stride; any row stride, 0 included), else a contiguous
// copy. The kernels read a matrix through one row stride.
at::Tensor with_unit_column_stride(const at::Tensor& t);

// ------------------------------------------------------------------------------------------------ spmm

// The reductions of spmm_reduce. Max and min select one nonzero per output element: the first of the row
// (lowest position in col_indices) whose product is the largest (smallest), NaN above every number.
enum class Reduce { kSum, kMean, kMax, kMin };

// "sum", "mean", "max" or "min"; anything else raises, naming the op.
Reduce parse_reduce(const char* op, c10::string_view reduce);
// Its inverse: the name parse_reduce takes.
const char* reduce_name(Reduce r);

inline bool selects(Reduce r) { return r == Reduce::kMax || r == Reduce::kMin; }

// What a sparse product's operands share: the indices of A (M x K with nnz nonzeros), contiguous, and the heads x
// features of each nonzero's terms. set_matrix fills the first part from arguments already checked.
struct CsrProduct {
  at::Tensor crow, col;
  int64_t M = 0, K = 0, H = 1, D = 0, nnz = 0;
  std::vector<int64_t> out_sizes;

  void set_matrix(const at::Tensor& crow_indices, const at::Tensor& col_indices, int64_t columns) {
    crow = crow_indices.contiguous();
    col = col_indices.contiguous();
    M = crow.numel() - 1;
    nnz = col.numel();
    K = columns;
  }
};

// The operands of spmm_reduce as the kernels read them: A is M x K with nnz nonzeros, dense K x H x D (H = 1
// for a 2-D dense), out M x H x D contiguous (the op's result is (M, D) for a 2-D dense). The weight of
// nonzero p in head h is values[p * value_stride + h * value_head_stride], or 1 without values; dense[k, h, d]
// is at dense_row_stride * k + dense_head_stride * h + d.
struct SpmmOperands : CsrProduct {
  at::Tensor values, dense;  // values contiguous (undefined: all ones)
  int64_t value_stride = 1, value_head_stride = 0;
  int64_t dense_row_stride = 0, dense_head_stride = 0;
};

// SpmmOperands' weights and dense side as raw pointers: the part of the CPU and CUDA engines' arguments that is
// the same. Nonzero p's weight in head h is val[p * vs + h * vhs]; dense's row k of head h starts at
// dense + k * ld + h * dhs, with a unit column stride.
template <typename T>
struct SpmmInputs {
  const T* val;  // null: every weight is 1
  int64_t vs, vhs;
  const T* dense;
  int64_t ld, dhs;
  int64_t H;

  void set_inputs(const SpmmOperands& s) {
    val = s.values.defined() ? s.values.const_data_ptr<T>() : nullptr;
    vs = s.value_stride;
    vhs = s.value_head_stride;
    dense = s.dense.const_data_ptr<T>();
    ld = s.dense_row_stride;
    dhs = s.dense_head_stride;
    H = s.H;
  }
};

// spmm_reduce's arguments: the indices (on dense's device), dense 2-D (K, D) or 3-D (K, H, D), values None,
// (nnz,) or (nnz, H) (then dense is 3-D with the same H), values and dense of one float dtype.
void check_spmm_reduce_args(const char* op, const at::Tensor& crow, const at::Tensor& col, const OptTensor& values,
                            const at::Tensor& dense);

// The operands of arguments that passed check_spmm_reduce_args (or check_csr_spmm_args).
SpmmOperands spmm_operands(const at::Tensor& crow, const at::Tensor& col, const OptTensor& values,
                           const at::Tensor& dense);

// _spmm_reduce_backward's arguments: grad_out and arg shaped like the forward's result, arg of the indices'
// dtype, the flags consistent with what is given, the transpose (all three or none) described by
// check_csr_transpose_args.
void check_spmm_reduce_backward_args(const char* op, const at::Tensor& grad_out, const at::Tensor& crow,
                                     const at::Tensor& col, const OptTensor& values, const at::Tensor& dense,
                                     const at::Tensor& arg, const OptTensor& t_crow, const OptTensor& t_col,
                                     const OptTensor& t_perm, bool values_grad);

// ----------------------------------------------------------------------------------------------- sddmm

// dot: sum over the last dimension of a[i, h, :] * b[j, h, :]; add: a[i, h] + b[j, h]; mul: a[i, h] * b[j, h].
enum class SddmmOp { kDot, kAdd, kMul };

// "dot", "add" or "mul"; anything else raises, naming the op.
SddmmOp parse_sddmm_op(const char* op, c10::string_view name);

// The operands of sddmm as the kernels read them: a M x H x D, b K x H x D (D = 1 for add and mul), each with
// a unit stride along D (or D = 1); out nnz x H contiguous (the op's result is (nnz,) without heads).
struct SddmmOperands : CsrProduct {
  at::Tensor a, b;
  int64_t a_row_stride = 0, a_head_stride = 0, b_row_stride = 0, b_head_stride = 0;
};

// sddmm's arguments: the indices (on a's device), a and b of one float dtype; dot: a (M, D) and b (K, D), or
// (M, H, D) and (K, H, D); add and mul: a (M,) and b (K,), or (M, H) and (K, H).
void check_sddmm_args(const char* op, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& a,
                      const at::Tensor& b, SddmmOp kind);

SddmmOperands sddmm_operands(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& a, const at::Tensor& b,
                             SddmmOp kind);

// --------------------------------------------------------------------------------------------- softmax

// csr_softmax(crow_indices, values): crow on values' device; values float, (nnz,) or (nnz, H).
void check_csr_softmax_args(const char* op, const at::Tensor& crow, const at::Tensor& values);

// _csr_softmax_backward(crow_indices, grad_out, values): values as csr_softmax's, grad_out alike.
void check_csr_softmax_backward_args(const char* op, const at::Tensor& crow, const at::Tensor& grad_out,
                                     const at::Tensor& values);

// ----------------------------------------------------------------------------------------- the kernels

// A backend's engines, one declaration for both devices: CsrBackend<c10::DeviceType::CPU> (csr_cpu.h) and
// CsrBackend<c10::DeviceType::CUDA> (csr_cuda.cuh) each define them in their own files. The CPU backend
// validates the structure it reads; the CUDA one stays in bounds on any indices.
template <c10::DeviceType Device>
struct CsrBackend {
  // out (M x H x D); for max and min, *arg (when arg is not null) receives the selected positions (-1 for an
  // empty row), shaped like out, of the indices' dtype.
  static at::Tensor spmm(const char* op, const SpmmOperands& s, Reduce reduce, at::Tensor* arg);
  // The gradients of a max / min (undefined where not asked for).
  static std::tuple<at::Tensor, at::Tensor> select_backward(const char* op, const at::Tensor& grad_out,
                                                            const SpmmOperands& s, const at::Tensor& arg,
                                                            const OptTensor& t_crow, const OptTensor& t_col,
                                                            const OptTensor& t_perm, bool values_grad,
                                                            bool dense_grad);
  // out (nnz x H).
  static at::Tensor sddmm(const char* op, const SddmmOperands& s, SddmmOp kind);
  static at::Tensor softmax(const char* op, const at::Tensor& crow, const at::Tensor& values);
  // The softmax recomputed from values.
  static at::Tensor softmax_backward(const char* op, const at::Tensor& crow, const at::Tensor& grad_out,
                                     const at::Tensor& values);
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> transpose(const char* op, const at::Tensor& crow,
                                                                   const at::Tensor& col, int64_t K);
  static at::Tensor empty(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& device_of);
};

// Every sparse op's kernel on a backend (a CsrBackend): the checks, the operands, then the backend's engines.
template <typename Backend>
struct CsrKernels {
  static at::Tensor csr_spmm(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                             const at::Tensor& dense) {
    check_csr_spmm_args("csr_spmm", crow, col, values, dense);
    return Backend::spmm("csr_spmm", spmm_operands(crow, col, values, dense), Reduce::kSum, nullptr);
  }

  static at::Tensor with_transpose(const at::Tensor& crow, const at::Tensor& col, const OptTensor& values,
                                   const at::Tensor& dense, const at::Tensor& t_crow, const at::Tensor& t_col,
                                   const at::Tensor& t_perm, c10::string_view reduce) {
    const char* op = "_csr_spmm_with_transpose";
    const Reduce r = parse_reduce(op, reduce);
    check_spmm_reduce_args(op, crow, col, values, dense);
    check_csr_transpose_args(op, crow, col, dense, t_crow, t_col, t_perm);
    return Backend::spmm(op, spmm_operands(crow, col, values, dense), r, nullptr);
  }

  static at::Tensor spmm_reduce(const at::Tensor& crow, const at::Tensor& col, const OptTensor& values,
                                const at::Tensor& dense, c10::string_view reduce) {
    const char* op = "spmm_reduce";
    const Reduce r = parse_reduce(op, reduce);
    check_spmm_reduce_args(op, crow, col, values, dense);
    return Backend::spmm(op, spmm_operands(crow, col, values, dense), r, nullptr);
  }

  static std::tuple<at::Tensor, at::Tensor> spmm_reduce_forward(const at::Tensor& crow, const at::Tensor& col,
                                                                const OptTensor& values, const at::Tensor& dense,
                                                                c10::string_view reduce);

  static std::tuple<at::Tensor, at::Tensor> spmm_reduce_backward(
      const at::Tensor& grad_out, const at::Tensor& crow, const at::Tensor& col, const OptTensor& values,
      const at::Tensor& dense, const at::Tensor& arg, const OptTensor& t_crow, const OptTensor& t_col,
      const OptTensor& t_perm, bool values_grad, bool dense_grad);

  static at::Tensor sddmm(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& a, const at::Tensor& b,
                          c10::string_view name) {
    const char* op = "sddmm";
    const SddmmOp kind = parse_sddmm_op(op, name);
    check_sddmm_args(op, crow, col, a, b, kind);
    return Backend::sddmm(op, sddmm_operands(crow, col, a, b, kind), kind);
  }

  static at::Tensor csr_softmax(const at::Tensor& crow, const at::Tensor& values) {
    check_csr_softmax_args("csr_softmax", crow, values);
    return Backend::softmax("csr_softmax", crow, values);
  }

  static at::Tensor csr_softmax_backward(const at::Tensor& crow, const at::Tensor& grad_out,
                                         const at::Tensor& values) {
    const char* op = "_csr_softmax_backward";
    check_csr_softmax_backward_args(op, crow, grad_out, values);
    return Backend::softmax_backward(op, crow, grad_out, values);
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_transpose(const at::Tensor& crow, const at::Tensor& col,
                                                                      int64_t K) {
    const char* op = "_csr_transpose";
    check_csr_transpose_input(op, crow, col, K);
    return Backend::transpose(op, crow, col, K);
  }

  static void register_kernels(torch::Library& m) {
    m.impl("csr_spmm", &csr_spmm);
    m.impl("_csr_spmm_with_transpose", &with_transpose);
    m.impl("spmm_reduce", &spmm_reduce);
    m.impl("_spmm_reduce_forward", &spmm_reduce_forward);
    m.impl("_spmm_reduce_backward", &spmm_reduce_backward);
    m.impl("sddmm", &sddmm);
    m.impl("csr_softmax", &csr_softmax);
    m.impl("_csr_softmax_backward", &csr_softmax_backward);
    m.impl("_csr_transpose", &csr_transpose);
  }
};

// The reduce of _spmm_reduce_forward: max or min, else it raises.
Reduce parse_selecting_reduce(const char* op, c10::string_view reduce);

template <typename Backend>
std::tuple<at::Tensor, at::Tensor> CsrKernels<Backend>::spmm_reduce_forward(const at::Tensor& crow,
                                                                             const at::Tensor& col,
                                                                             const OptTensor& values,
                                                                             const at::Tensor& dense,
                                                                             c10::string_view reduce) {
  const char* op = "_spmm_reduce_forward";
  const Reduce r = parse_selecting_reduce(op, reduce);
  check_spmm_reduce_args(op, crow, col, values, dense);
  at::Tensor arg;
  at::Tensor out = Backend::spmm(op, spmm_operands(crow, col, values, dense), r, &arg);
  return {out, arg};
}

template <typename Backend>
std::tuple<at::Tensor, at::Tensor> CsrKernels<Backend>::spmm_reduce_backward(
    const at::Tensor& grad_out, const at::Tensor& crow, const at::Tensor& col, const OptTensor& values,
    const at::Tensor& dense, const at::Tensor& arg, const OptTensor& t_crow, const OptTensor& t_col,
    const OptTensor& t_perm, bool values_grad, bool dense_grad) {
  const char* op = "_spmm_reduce_backward";
  check_spmm_reduce_backward_args(op, grad_out, crow, col, values, dense, arg, t_crow, t_col, t_perm, values_grad);
  auto [grad_values, grad_dense] =
      Backend::select_backward(op, grad_out, spmm_operands(crow, col, values, dense), arg, t_crow, t_col, t_perm,
                               values_grad, dense_grad);
  const auto placeholder = [&] { return Backend::empty({0}, dense.scalar_type(), dense); };
  return {values_grad ? grad_values : placeholder(), dense_grad ? grad_dense : placeholder()};
}

}  // namespace torchops
