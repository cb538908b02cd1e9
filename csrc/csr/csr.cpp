#include "csr.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <limits>

#include "../core/dispatch.h"

namespace torchops {

namespace {

void check_1d(const char* op, NamedTensor t) {
  TORCHOPS_CHECK(t.tensor.dim() == 1, op, t.name, " must be 1-D, got shape ", t.tensor.sizes());
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
void check_structure(const char* op, const Index* crow, int64_t M, const Index* col, int64_t nnz, int64_t K) {
  TORCHOPS_CHECK(crow[0] == 0, op, "crow_indices[0] must be 0, got ", static_cast<int64_t>(crow[0]));
  const int64_t down = first_bad_index(M, [&](int64_t i) { return crow[i] > crow[i + 1]; });
  TORCHOPS_CHECK(down == M, op, "crow_indices must be non-decreasing, got crow_indices[", down,
                 "] = ", static_cast<int64_t>(crow[down < M ? down : 0]), " > crow_indices[", down + 1, "] = ",
                 static_cast<int64_t>(crow[down < M ? down + 1 : 0]));
  TORCHOPS_CHECK(static_cast<int64_t>(crow[M]) == nnz, op, "crow_indices[-1] must equal nnz = ", nnz,
                 " (the length of col_indices), got ", static_cast<int64_t>(crow[M]));
  const int64_t bad = first_bad_index(nnz, [&](int64_t p) { return col[p] < 0 || col[p] >= K; });
  TORCHOPS_CHECK(bad == nnz, op, "col_indices must lie in [0, K) with K = ", K, ", got col_indices[", bad,
                 "] = ", static_cast<int64_t>(col[bad < nnz ? bad : 0]));
}

}  // namespace

void check_csr_indices(const char* op, NamedTensor crow, NamedTensor col, NamedTensor device_of) {
  check_defined(op, crow);
  check_defined(op, col);
  check_same_device(op, device_of, crow);
  check_same_device(op, device_of, col);
  check_1d(op, crow);
  check_1d(op, col);
  TORCHOPS_CHECK(crow.tensor.numel() >= 1, op, crow.name, " must hold M + 1 >= 1 entries, got none");
  check_dtype_in(op, crow, {TORCHOPS_INT_DTYPES});
  check_same_dtype(op, crow, col);
}

void check_csr_matrix(const char* op, NamedTensor t, NamedTensor device_of) {
  check_defined(op, t);
  check_same_device(op, device_of, t);
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
  TORCHOPS_CHECK(col.numel() == values.numel(), op, "col_indices and values must have the same length (nnz), got ",
                 col.numel(), " and ", values.numel());
  check_csr_matrix(op, d, v);
  check_same_dtype(op, v, d);
}

void check_csr_sddmm_args(const char* op, const at::Tensor& crow, const at::Tensor& col, const at::Tensor& grad_out,
                          const at::Tensor& dense) {
  const NamedTensor g{"grad_out", grad_out}, d{"dense", dense};
  check_defined(op, g);
  check_csr_indices(op, {"crow_indices", crow}, {"col_indices", col}, g);
  check_csr_matrix(op, g, g);
  check_csr_matrix(op, d, g);
  check_same_dtype(op, g, d);
  TORCHOPS_CHECK(grad_out.size(0) == crow.numel() - 1, op, "grad_out must have crow_indices.numel() - 1 = ",
                 crow.numel() - 1, " rows, got ", grad_out.size(0));
  TORCHOPS_CHECK(grad_out.size(1) == dense.size(1), op,
                 "grad_out and dense must have the same number of columns, got ", grad_out.size(1), " and ",
                 dense.size(1));
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
  TORCHOPS_CHECK(t_crow.numel() == dense.size(0) + 1, op, "t_crow_indices must hold K + 1 = ", dense.size(0) + 1,
                 " entries (K = dense.size(0)), got ", t_crow.numel());
  TORCHOPS_CHECK(t_col.numel() == col.numel() && t_perm.numel() == col.numel(), op,
                 "t_col_indices and t_perm must hold nnz = ", col.numel(), " entries, got ", t_col.numel(), " and ",
                 t_perm.numel());
}

void check_csr_structure_cpu(const char* op, const at::Tensor& crow, const at::Tensor& col, int64_t K) {
  const at::Tensor c = crow.contiguous(), k = col.contiguous();
  TORCHOPS_DISPATCH_INDEX_TYPES(c.scalar_type(), "csr_structure", [&] {
    check_structure<index_t>(op, c.const_data_ptr<index_t>(), c.numel() - 1, k.const_data_ptr<index_t>(), k.numel(),
                             K);
  });
}

at::Tensor with_unit_column_stride(const at::Tensor& t) {
  return t.size(1) <= 1 || t.stride(1) == 1 ? t : t.contiguous();
}

}  // namespace torchops
