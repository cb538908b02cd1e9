#include "csr.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <limits>

#include "../core/dispatch.h"

namespace torchops {

namespace {

void check_1d(const char* op, NamedTensor t) {
  TORCHOPS_CHECK(t.tensor.dim() == 1, op, t.name, " must be 1-D, got shape ", t.tensor.sym_sizes());
}

// Lowest index in [0, n) where bad(i) holds, or n; parallel, so a large valid input costs little.
template <typename Bad>
int64_t first_bad_index(int64_t n, Bad&& bad) {
  std::atomic<int64_t> first{n};
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end && i < first.load(std::memory_order_relaxed); ++i) {
      if (bad(i)) {
        int64_t seen = first.load();
        while (i < seen && !first.compare_exchange_weak(seen, i)) {
        }
        return;
      }
    }
  });
  return first.load();
}

template <typename Index>
void check_structure(const char* op, const Index* crow, int64_t M, int64_t nnz, const char* of) {
  TORCHOPS_CHECK(crow[0] == 0, op, "crow_indices[0] must be 0, got ", static_cast<int64_t>(crow[0]));
  const int64_t down = first_bad_index(M, [&](int64_t i) { return crow[i] > crow[i + 1]; });
  TORCHOPS_CHECK(down == M, op, "crow_indices must be non-decreasing, got crow_indices[", down,
                 "] = ", static_cast<int64_t>(crow[down < M ? down : 0]), " > crow_indices[", down + 1, "] = ",
                 static_cast<int64_t>(crow[down < M ? down + 1 : 0]));
  TORCHOPS_CHECK(static_cast<int64_t>(crow[M]) == nnz, op, "crow_indices[-1] must equal nnz = ", nnz,
                 " (the length of ", of, "), got ", static_cast<int64_t>(crow[M]));
}

template <typename Index>
void check_columns(const char* op, const Index* col, int64_t nnz, int64_t K) {
  const int64_t bad = first_bad_index(nnz, [&](int64_t p) { return col[p] < 0 || col[p] >= K; });
  TORCHOPS_CHECK(bad == nnz, op, "col_indices must lie in [0, K) with K = ", K, ", got col_indices[", bad,
                 "] = ", static_cast<int64_t>(col[bad < nnz ? bad : 0]));
}

// t has between lo and hi dimensions; `what` says which shapes (e.g. "1-D (nnz) or 2-D (nnz, H)").
void check_dims(const char* op, NamedTensor t, int64_t lo, int64_t hi, const char* what) {
  TORCHOPS_CHECK(t.tensor.dim() >= lo && t.tensor.dim() <= hi, op, t.name, " must be ", what, ", got shape ",
                 t.tensor.sym_sizes());
}

// A per-nonzero tensor (values) holds one entry (or one row) per column index.
void check_nnz(const char* op, const at::Tensor& col, const at::Tensor& values) {
  TORCHOPS_CHECK(col.sym_numel() == values.sym_size(0), op,
                 "col_indices and values must have the same length (nnz), got ", col.sym_numel(), " and ",
                 values.sym_size(0));
}

// A per-row tensor holds one row per row of the sparse matrix.
void check_rows(const char* op, NamedTensor t, int64_t m) {
  TORCHOPS_CHECK(t.tensor.size(0) == m, op, t.name, " must have crow_indices.numel() - 1 = ", m, " rows, got ",
                 t.tensor.size(0));
}

}  // namespace

void check_csr_indices(const char* op, NamedTensor crow, NamedTensor col, NamedTensor device_of) {
  check_crow_indices(op, crow, device_of);
  check_defined_on(op, device_of, col);
  check_1d(op, col);
  check_same_dtype(op, crow, col);
}

void check_crow_indices(const char* op, NamedTensor crow, NamedTensor device_of) {
  check_defined_on(op, device_of, crow);
  check_1d(op, crow);
  TORCHOPS_CHECK(crow.tensor.sym_numel() >= 1, op, crow.name, " must hold M + 1 >= 1 entries, got none");
  check_dtype_in(op, crow, {TORCHOPS_INT_DTYPES});
}

void check_csr_matrix(const char* op, NamedTensor t, NamedTensor device_of) {
  check_defined_on(op, device_of, t);
  TORCHOPS_CHECK(t.tensor.dim() == 2, op, t.name, " must be 2-D, got shape ", t.tensor.sizes());
  check_dtype_in(op, t, {TORCHOPS_FLOAT_DTYPES});
}

void check_csr_spmm_args(const char* op, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                         const at::Tensor& dense) {
  const NamedTensor v{"values", values}, d{"dense", dense};
  check_defined(op, v);
  check_csr_indices(op, {"crow_indices", crow}, {"col_indices", col}, v);
  check_1d(op, v);
  check_dtype_in(op, v, {TORCHOPS_FLOAT_DTYPES});
  check_nnz(op, col, values);
  check_csr_matrix(op, d, v);
  check_same_dtype(op, v, d);
}

void check_csr_transpose_input(const char* op, const at::Tensor& crow, const at::Tensor& col, int64_t K) {
  check_csr_indices(op, {"crow_indices", crow}, {"col_indices", col}, {"crow_indices", crow});
  TORCHOPS_CHECK(K >= 0, op, "K must be non-negative, got ", K);
}

void check_csr_transpose_args(const char* op, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& dense,
                              const at::Tensor& t_crow, const at::Tensor& t_col, const at::Tensor& t_perm) {
  const NamedTensor c{"crow_indices", crow}, tc{"t_crow_indices", t_crow}, tk{"t_col_indices", t_col},
      tp{"t_perm", t_perm};
  check_csr_indices(op, tc, tk, c);
  check_csr_indices(op, tc, tp, c);
  check_same_dtype(op, c, tc);
  TORCHOPS_CHECK(t_crow.sym_numel() == dense.sym_size(0) + 1, op, "t_crow_indices must hold K + 1 = ",
                 dense.sym_size(0) + 1, " entries (K = dense.size(0)), got ", t_crow.sym_numel());
  TORCHOPS_CHECK(t_col.sym_numel() == col.sym_numel() && t_perm.sym_numel() == col.sym_numel(), op,
                 "t_col_indices and t_perm must hold nnz = ", col.sym_numel(), " entries, got ", t_col.sym_numel(),
                 " and ", t_perm.sym_numel());
}

void check_csr_structure_cpu(const char* op, const at::Tensor& crow, const at::Tensor& col, int64_t K) {
  const at::Tensor c = crow.contiguous(), k = col.contiguous();
  TORCHOPS_DISPATCH_INDEX_TYPES(c.scalar_type(), "csr_structure", [&] {
    check_structure<index_t>(op, c.const_data_ptr<index_t>(), c.numel() - 1, k.numel(), "col_indices");
    check_columns<index_t>(op, k.const_data_ptr<index_t>(), k.numel(), K);
  });
}

void check_crow_structure_cpu(const char* op, const at::Tensor& crow, int64_t nnz, const char* of) {
  const at::Tensor c = crow.contiguous();
  TORCHOPS_DISPATCH_INDEX_TYPES(c.scalar_type(), "csr_structure", [&] {
    check_structure<index_t>(op, c.const_data_ptr<index_t>(), c.numel() - 1, nnz, of);
  });
}

at::Tensor with_unit_column_stride(const at::Tensor& t) {
  return t.size(1) <= 1 || t.stride(1) == 1 ? t : t.contiguous();
}

// ------------------------------------------------------------------------------------------------ spmm

namespace {
constexpr const char* kReduceNames[] = {"sum", "mean", "max", "min"};  // in Reduce's order
}  // namespace

Reduce parse_reduce(const char* op, c10::string_view reduce) {
  for (size_t r = 0; r < std::size(kReduceNames); ++r) {
    if (reduce == kReduceNames[r]) return static_cast<Reduce>(r);
  }
  TORCHOPS_CHECK(false, op, "reduce must be 'sum', 'mean', 'max' or 'min', got '", reduce, "'");
  return Reduce::kSum;  // not reached: the check throws
}

const char* reduce_name(Reduce r) { return kReduceNames[static_cast<int>(r)]; }

Reduce parse_selecting_reduce(const char* op, c10::string_view reduce) {
  if (reduce == "max") return Reduce::kMax;
  TORCHOPS_CHECK(reduce == "min", op, "reduce must be 'max' or 'min' (a reduction that selects one nonzero), got '",
                 reduce, "'");
  return Reduce::kMin;
}

void check_spmm_reduce_args(const char* op, const at::Tensor& crow, const at::Tensor& col, const OptTensor& values,
                            const at::Tensor& dense) {
  const NamedTensor d{"dense", dense};
  check_defined(op, d);
  check_csr_indices(op, {"crow_indices", crow}, {"col_indices", col}, d);
  check_dims(op, d, 2, 3, "2-D (K, D) or 3-D (K, H, D)");
  check_dtype_in(op, d, {TORCHOPS_FLOAT_DTYPES});
  if (!values.has_value() || !values->defined()) return;
  const NamedTensor v{"values", *values};
  check_same_device(op, d, v);
  check_dims(op, v, 1, 2, "1-D (nnz) or 2-D (nnz, H)");
  check_same_dtype(op, v, d);
  check_nnz(op, col, *values);
  TORCHOPS_CHECK(values->dim() == 1 || (dense.dim() == 3 && dense.sym_size(1) == values->sym_size(1)), op,
                 "values of shape ", values->sym_sizes(),
                 " gives each nonzero one value per head, so dense must be 3-D (K, H, D) with H = ", values->sym_size(1),
                 ", got shape ", dense.sym_sizes());
}

SpmmOperands spmm_operands(const at::Tensor& crow, const at::Tensor& col, const OptTensor& values,
                           const at::Tensor& dense) {
  SpmmOperands s;
  s.set_matrix(crow, col, dense.size(0));
  const bool heads = dense.dim() == 3;
  s.H = heads ? dense.size(1) : 1;
  s.D = dense.size(-1);
  // The last dimension must be dense; the others are read through their strides (0 included).
  s.dense = s.D <= 1 || dense.stride(-1) == 1 ? dense : dense.contiguous();
  s.dense_row_stride = s.K <= 1 ? s.H * s.D : s.dense.stride(0);
  s.dense_head_stride = heads && s.H > 1 ? s.dense.stride(1) : s.D;
  if (values.has_value() && values->defined()) {
    s.values = values->contiguous();
    s.value_stride = s.values.dim() == 2 ? s.H : 1;
    s.value_head_stride = s.values.dim() == 2 ? 1 : 0;
  }
  s.out_sizes = heads ? std::vector<int64_t>{s.M, s.H, s.D} : std::vector<int64_t>{s.M, s.D};
  return s;
}

void check_spmm_reduce_backward_args(const char* op, const at::Tensor& grad_out, const at::Tensor& crow,
                                     const at::Tensor& col, const OptTensor& values, const at::Tensor& dense,
                                     const at::Tensor& arg, const OptTensor& t_crow, const OptTensor& t_col,
                                     const OptTensor& t_perm, bool values_grad) {
  check_spmm_reduce_args(op, crow, col, values, dense);
  const NamedTensor g{"grad_out", grad_out}, a{"arg", arg}, d{"dense", dense}, c{"crow_indices", crow};
  check_defined(op, g);
  check_defined(op, a);
  check_same_device(op, d, g);
  check_same_device(op, d, a);
  check_same_dtype(op, g, d);
  check_same_dtype(op, a, c);
  const std::vector<int64_t> out_sizes = dense.dim() == 3
                                             ? std::vector<int64_t>{crow.numel() - 1, dense.size(1), dense.size(2)}
                                             : std::vector<int64_t>{crow.numel() - 1, dense.size(1)};
  TORCHOPS_CHECK(grad_out.sizes() == c10::IntArrayRef(out_sizes), op, "grad_out must have the result's shape ",
                 c10::IntArrayRef(out_sizes), ", got ", grad_out.sizes());
  check_same_shape(op, g, a);
  TORCHOPS_CHECK(!values_grad || (values.has_value() && values->defined()), op,
                 "values_grad is true but values is None");
  const int given = int(t_crow.has_value() && t_crow->defined()) + int(t_col.has_value() && t_col->defined()) +
                    int(t_perm.has_value() && t_perm->defined());
  TORCHOPS_CHECK(given == 0 || given == 3, op,
                 "t_crow_indices, t_col_indices and t_perm are a transpose: give all three or none, got ", given);
  if (given == 3) check_csr_transpose_args(op, crow, col, dense, *t_crow, *t_col, *t_perm);
}

// ----------------------------------------------------------------------------------------------- sddmm

SddmmOp parse_sddmm_op(const char* op, c10::string_view name) {
  if (name == "dot") return SddmmOp::kDot;
  if (name == "add") return SddmmOp::kAdd;
  TORCHOPS_CHECK(name == "mul", op, "op must be 'dot', 'add' or 'mul', got '", name, "'");
  return SddmmOp::kMul;
}

void check_sddmm_args(const char* op, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& a,
                      const at::Tensor& b, SddmmOp kind) {
  const NamedTensor na{"a", a}, nb{"b", b};
  check_defined(op, na);
  check_csr_indices(op, {"crow_indices", crow}, {"col_indices", col}, na);
  check_defined_on(op, na, nb);
  const bool dot = kind == SddmmOp::kDot;
  const char* what = dot ? "2-D (rows, D) or 3-D (rows, H, D)" : "1-D (rows) or 2-D (rows, H)";
  check_dims(op, na, dot ? 2 : 1, dot ? 3 : 2, what);
  check_dims(op, nb, dot ? 2 : 1, dot ? 3 : 2, what);
  check_dtype_in(op, na, {TORCHOPS_FLOAT_DTYPES});
  check_same_dtype(op, na, nb);
  TORCHOPS_CHECK(a.dim() == b.dim() && a.sizes().slice(1) == b.sizes().slice(1), op,
                 "a and b must have the same size in every dimension but the first, got shapes ", a.sizes(), " and ",
                 b.sizes());
  check_rows(op, na, crow.numel() - 1);
}

SddmmOperands sddmm_operands(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& a, const at::Tensor& b,
                             SddmmOp kind) {
  SddmmOperands s;
  s.set_matrix(crow, col, b.size(0));
  // Every operand as rows x heads x D: add and mul have D = 1, no heads means H = 1.
  const bool dot = kind == SddmmOp::kDot;
  const bool heads = a.dim() == (dot ? 3 : 2);
  const auto as_3d = [&](const at::Tensor& t) {
    at::Tensor v = dot ? (heads ? t : t.unsqueeze(1)) : (heads ? t.unsqueeze(2) : t.unsqueeze(1).unsqueeze(2));
    return v.size(2) <= 1 || v.stride(2) == 1 ? v : v.contiguous();
  };
  s.a = as_3d(a);
  s.b = as_3d(b);
  s.H = s.a.size(1);
  s.D = s.a.size(2);
  const auto strides = [&](const at::Tensor& t, int64_t& row, int64_t& head) {
    row = t.size(0) <= 1 ? s.H * s.D : t.stride(0);
    head = s.H <= 1 ? s.D : t.stride(1);
  };
  strides(s.a, s.a_row_stride, s.a_head_stride);
  strides(s.b, s.b_row_stride, s.b_head_stride);
  s.out_sizes = heads ? std::vector<int64_t>{s.nnz, s.H} : std::vector<int64_t>{s.nnz};
  return s;
}

// --------------------------------------------------------------------------------------------- softmax

void check_csr_softmax_args(const char* op, const at::Tensor& crow, const at::Tensor& values) {
  const NamedTensor v{"values", values};
  check_defined(op, v);
  check_crow_indices(op, {"crow_indices", crow}, v);
  check_dims(op, v, 1, 2, "1-D (nnz) or 2-D (nnz, H)");
  check_dtype_in(op, v, {TORCHOPS_FLOAT_DTYPES});
}

void check_csr_softmax_backward_args(const char* op, const at::Tensor& crow, const at::Tensor& grad_out,
                                     const at::Tensor& values) {
  const NamedTensor g{"grad_out", grad_out}, o{"values", values};
  check_defined(op, o);
  check_crow_indices(op, {"crow_indices", crow}, o);
  check_defined_on(op, o, g);
  check_dims(op, o, 1, 2, "1-D (nnz) or 2-D (nnz, H)");
  check_dtype_in(op, o, {TORCHOPS_FLOAT_DTYPES});
  check_same_dtype(op, g, o);
  check_same_shape(op, g, o);
}


}  // namespace torchops
