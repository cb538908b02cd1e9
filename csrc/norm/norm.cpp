#include "norm.h"

namespace torchops {

namespace {

// input: a float tensor of at least one dimension with a non-empty last one.
void check_norm_rows(const char* op, NamedTensor input) {
  // Sizes are read as SymInts: the Autograd kernel runs this on fake tensors with symbolic shapes too
  // (TORCH_SYM_CHECK turns a symbolic condition into a runtime assertion of the traced graph).
  check_defined(op, input);
  TORCHOPS_CHECK(input.tensor.dim() >= 1, op, input.name, " must have at least 1 dimension, got a 0-dim tensor");
  check_dtype_in(op, input, {TORCHOPS_FLOAT_DTYPES});
  const c10::SymInt& n = input.tensor.sym_size(-1);
  TORCH_SYM_CHECK(n.sym_ge(1), "myns::", op, ": ", input.name,
                  "'s last dimension (the normalised one) must be at least 1, got shape ", input.tensor.sym_sizes());
}

// A per-column parameter (weight, bias): 1-D of input's last size on its device, of its dtype or (16-bit
// input) float32.
void check_norm_param(const char* op, NamedTensor input, NamedTensor param) {
  const at::Tensor& w = param.tensor;
  const c10::SymInt& n = input.tensor.sym_size(-1);
  check_same_device(op, input, param);
  TORCHOPS_CHECK(w.dim() == 1, op, param.name, " must be 1-D of size ", n, " (", input.name,
                 "'s last dimension), got shape ", w.sym_sizes());
  TORCH_SYM_CHECK(w.sym_size(0).sym_eq(n), "myns::", op, ": ", param.name, " must be 1-D of size ", n, " (",
                  input.name, "'s last dimension), got shape ", w.sym_sizes());
  const auto dtype = input.tensor.scalar_type();
  const bool reduced = is_16bit_float_dtype(dtype);
  TORCHOPS_CHECK(w.scalar_type() == dtype || (reduced && w.scalar_type() == at::kFloat), op, param.name,
                 " must have ", input.name, "'s dtype (", dtype, ")", reduced ? " or Float" : "", ", got ",
                 w.scalar_type());
}

bool given(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

}  // namespace

void check_norm_input(const char* op, NamedTensor input, const std::optional<at::Tensor>& weight,
                      double weight_offset) {
  check_norm_rows(op, input);
  if (!given(weight)) {
    TORCHOPS_CHECK(weight_offset == 0.0, op,
                   "weight_offset is non-zero but weight is None; pass a weight (ones to scale by 1 + weight_offset)");
    return;
  }
  check_norm_param(op, input, {"weight", *weight});
}

void check_layer_norm_input(const char* op, NamedTensor input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias) {
  check_norm_rows(op, input);
  if (given(weight)) check_norm_param(op, input, {"weight", *weight});
  if (given(bias)) check_norm_param(op, input, {"bias", *bias});
  if (given(weight) && given(bias)) check_same_dtype(op, {"weight", *weight}, {"bias", *bias});
}

void check_norm_row_limit(const char* op, NamedTensor input, int64_t max_row) {
  const int64_t n = input.tensor.size(-1);
  TORCHOPS_CHECK(n <= max_row, op, input.name, "'s rows of ", n,
                 " elements are longer than this device's kernels take (",
                 max_row, ")");
}

void check_norm_input_pair(const char* op, NamedTensor input, NamedTensor other,
                           const std::optional<at::Tensor>& weight, double weight_offset) {
  check_norm_input(op, input, weight, weight_offset);
  check_defined_on(op, input, other);
  check_same_dtype(op, input, other);
  // Symbolic-safe (the Autograd kernel checks fake tensors too): one runtime assertion per dimension.
  const auto xs = input.tensor.sym_sizes(), ys = other.tensor.sym_sizes();
  TORCHOPS_CHECK(xs.size() == ys.size(), op, input.name, " and ", other.name, " must have the same shape, got ", xs,
                 " and ", ys);
  for (size_t d = 0; d < xs.size(); ++d) {
    TORCH_SYM_CHECK(xs[d].sym_eq(ys[d]), "myns::", op, ": ", input.name, " and ", other.name,
                    " must have the same shape, got ", xs, " and ", ys);
  }
}

void check_norm_stat(const char* op, NamedTensor input, NamedTensor stat) {
  check_defined_on(op, input, stat);
  const auto leading = input.tensor.sizes().slice(0, input.tensor.dim() - 1);
  const auto stat_dtype = norm_stat_dtype(input.tensor.scalar_type());
  TORCHOPS_CHECK(stat.tensor.sizes().equals(leading) && stat.tensor.scalar_type() == stat_dtype, op, stat.name,
                 " must have shape ", leading, " (", input.name, "'s leading dimensions) and dtype ", stat_dtype,
                 ", got shape ", stat.tensor.sizes(), " and dtype ", stat.tensor.scalar_type());
}

void check_norm_backward(const char* op, NamedTensor grad_out, NamedTensor input,
                         const std::optional<at::Tensor>& weight, NamedTensor stat, bool weight_grad,
                         double weight_offset) {
  check_norm_input(op, input, weight, weight_offset);
  check_like(op, input, grad_out);
  check_norm_stat(op, input, stat);
  TORCHOPS_CHECK(!weight_grad || given(weight), op, "weight_grad is true but weight is None");
}

NormRows norm_rows(const at::Tensor& t) {
  NormRows view;
  view.cols = t.size(-1);
  view.rows = view.cols == 0 ? 0 : t.numel() / view.cols;
  view.row_stride = view.cols;
  bool rows_with_stride = view.cols == 1 || t.stride(-1) == 1;
  // The leading dimensions must collapse to one: each (non-size-1) dimension's stride equals the next inner
  // one's stride times its size. The innermost one sets the row stride.
  int64_t expected = -1;
  for (int64_t d = t.dim() - 2; d >= 0 && rows_with_stride; --d) {
    if (t.size(d) == 1) continue;
    if (expected < 0) {
      view.row_stride = t.stride(d);
    } else if (t.stride(d) != expected) {
      rows_with_stride = false;
    }
    expected = t.stride(d) * t.size(d);
  }
  if (rows_with_stride) {
    view.tensor = t;
  } else {
    view.tensor = t.contiguous();
    view.row_stride = view.cols;
  }
  return view;
}

at::Tensor dense_weight(const std::optional<at::Tensor>& weight) {
  if (!weight.has_value() || !weight->defined()) return at::Tensor();
  return weight->contiguous();
}

}  // namespace torchops
