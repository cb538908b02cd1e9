// Shared by the sparse ops, CPU and CUDA alike: argument checks (messages from meta_kernels/_checks.py's
// table), the CPU-side validation of a CSR structure, and the sparse x dense product's front half.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "../core/checks.h"

namespace torchops {

// crow_indices and col_indices: defined, on `device_of`'s device, 1-D, int32 or int64 (the same for both),
// and crow_indices holds M + 1 >= 1 entries.
void check_csr_indices(const char* op, NamedTensor crow, NamedTensor col, NamedTensor device_of);

// A defined 2-D float matrix on `device_of`'s device.
void check_csr_matrix(const char* op, NamedTensor t, NamedTensor device_of);

// Everything csr_spmm(crow_indices, col_indices, values, dense) needs before its kernel runs.
void check_csr_spmm_args(const char* op, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                         const at::Tensor& dense);

// _csr_sddmm(crow_indices, col_indices, grad_out, dense): grad_out is M x N, dense K x N, same float dtype.
void check_csr_sddmm_args(const char* op, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& grad_out,
                          const at::Tensor& dense);

// _csr_transpose(crow_indices, col_indices, K): the indices, and K >= 0.
void check_csr_transpose_input(const char* op, const at::Tensor& crow, const at::Tensor& col, int64_t K);

// The transpose handed to _csr_spmm_with_transpose: metadata only (backward, which uses it, validates it
// like any csr_spmm input).
void check_csr_transpose_args(const char* op, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& dense,
                              const at::Tensor& t_crow, const at::Tensor& t_col, const at::Tensor& t_perm);

// CPU only (it reads the indices): crow_indices[0] == 0, non-decreasing, crow_indices[M] == nnz and every
// column in [0, K). Raises a RuntimeError naming the first offending entry.
void check_csr_structure_cpu(const char* op, const at::Tensor& crow, const at::Tensor& col, int64_t K);

// `t` itself when its rows are dense (unit column stride; any row stride, 0 included), else a contiguous
// copy. The kernels read a matrix through one row stride.
at::Tensor with_unit_column_stride(const at::Tensor& t);

// Leading stride of a matrix whose columns are dense; 0 is valid (every row the same), rows = 1 has any.
inline int64_t row_stride(const at::Tensor& t) {
  return t.size(0) <= 1 ? t.size(1) : t.stride(0);
}

// csr_spmm's and _csr_spmm_with_transpose's kernels on a backend: the checks, then the backend's product
// `static at::Tensor spmm(const char* op, crow, col, values, dense)` (the transpose serves autograd only).
template <typename Backend>
struct CsrSpmmKernels {
  static at::Tensor csr_spmm(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                             const at::Tensor& dense) {
    check_csr_spmm_args("csr_spmm", crow, col, values, dense);
    return Backend::spmm("csr_spmm", crow, col, values, dense);
  }

  static at::Tensor with_transpose(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                                   const at::Tensor& dense, const at::Tensor& t_crow, const at::Tensor& t_col,
                                   const at::Tensor& t_perm) {
    const char* op = "_csr_spmm_with_transpose";
    check_csr_spmm_args(op, crow, col, values, dense);
    check_csr_transpose_args(op, crow, col, dense, t_crow, t_col, t_perm);
    return Backend::spmm(op, crow, col, values, dense);
  }

  static void register_kernels(torch::Library& m) {
    m.impl("csr_spmm", &csr_spmm);
    m.impl("_csr_spmm_with_transpose", &with_transpose);
  }
};

}  // namespace torchops
