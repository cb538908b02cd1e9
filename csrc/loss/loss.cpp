#include "loss.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>

#include <c10/util/accumulate.h>

#include <algorithm>
#include <cmath>

#include "../core/dispatch.h"

namespace torchops {

namespace {

// Logits per chunk of linear_cross_entropy, in bytes. Large enough that every chunk's matmuls run at full
// speed (a chunk of ~1024 tokens of a 128k vocabulary in bf16; smaller chunks leave the weight-gradient
// update, a read and write of all of grad_weight per chunk, bound by memory), small next to the logits an
// unchunked loss keeps (several buffers of tokens x vocabulary).
constexpr int64_t kChunkBytes = int64_t{256} << 20;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool given(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

void check_target(const char* op, NamedTensor scores, NamedTensor target) {
  // scores: input or logits, whose leading dimensions target has.
  check_same_device(op, scores, target);
  check_dtype_in(op, target, {TORCHOPS_INT_DTYPES});
  const auto leading = scores.tensor.sym_sizes().slice(0, scores.tensor.dim() - 1);
  const auto got = target.tensor.sym_sizes();
  TORCHOPS_CHECK(got.size() == leading.size(), op, "target must have shape ", leading, " (", scores.name,
                 "'s leading dimensions), got shape ", got);
  for (size_t d = 0; d < got.size(); ++d) {
    TORCH_SYM_CHECK(got[d].sym_eq(leading[d]), "myns::", op, ": target must have shape ", leading, " (",
                    scores.name, "'s leading dimensions), got shape ", got);
  }
}

void check_options(const char* op, const CrossEntropyOptions& options) {
  const double e = options.label_smoothing;
  TORCHOPS_CHECK(e >= 0.0 && e <= 1.0, op, "label_smoothing must lie in [0, 1], got ", e);
  if (options.softcap) {
    const double cap = *options.softcap;
    TORCHOPS_CHECK(cap > 0.0 && std::isfinite(cap), op, "softcap must be positive and finite, got ", cap);
  }
}

void check_float_scores(const char* op, NamedTensor scores) {
  check_defined(op, scores);
  TORCHOPS_CHECK(scores.tensor.dim() >= 1, op, scores.name, " must have at least 1 dimension, got a 0-dim tensor");
  check_dtype_in(op, scores, {TORCHOPS_FLOAT_DTYPES});
}

// A per-token tensor of target's shape on its device (grad_loss): any float dtype.
void check_per_token(const char* op, NamedTensor target, NamedTensor t) {
  check_defined_on(op, target, t);
  check_dtype_in(op, t, {TORCHOPS_FLOAT_DTYPES});
  check_same_shape(op, target, t);
}

void check_grad_flags(const char* op, const std::optional<at::Tensor>& linear_bias, bool bias_grad) {
  TORCHOPS_CHECK(!bias_grad || given(linear_bias), op, "bias_grad is true but linear_bias is None");
}

// The CPU kernels read the targets before any work (the CUDA ones never synchronise to: see loss.h).
void check_target_values(const char* op, const at::Tensor& target, int64_t classes, int64_t ignore_index) {
  if (target.is_cpu()) check_targets_cpu(op, target, classes, ignore_index);
}

// A [0]-shaped placeholder for an output not asked for.
at::Tensor placeholder(const at::Tensor& like) { return at::empty({0}, like.options()); }

// The problem of one linear_cross_entropy call, as the chunk loop sees it.
struct LinearChunks {
  at::Tensor x;       // N x H
  at::Tensor weight;  // V x H
  at::Tensor bias;    // V, or undefined
  at::Tensor target;  // N, dense
  CrossEntropyOptions options;
  at::Tensor scale;   // one value or N values (math dtype): the gradients' multiplier; undefined: 1
  bool input_grad = false, weight_grad = false, bias_grad = false;
  bool want_loss = false;
  int64_t chunk_size = 0;

  at::Tensor loss, grad_input, grad_weight, grad_bias;

  // Logits of a chunk of tokens at a time (ATen matmuls: cuBLAS on CUDA), each turned in place by the row
  // kernel into its loss terms and, when a gradient is wanted, into the gradient of the logits, which two
  // more matmuls take to grad_input's rows and grad_weight; the full logits never exist.
  void run(CrossEntropyRowsKernel rows_kernel) {
    const int64_t n = x.size(0), v = weight.size(0), h = x.size(1);
    const auto math = loss_math_dtype(x.scalar_type());
    const bool any_grad = input_grad || weight_grad || bias_grad;
    if (want_loss) loss = at::empty({n}, x.options().dtype(math));
    if (input_grad) grad_input = at::empty({n, h}, x.options());
    if (weight_grad) grad_weight = at::empty({v, h}, weight.options());
    at::Tensor bias_sum;  // in the math dtype, like the row sums of 16-bit logits
    const int64_t chunk = linear_cross_entropy_chunk_rows(n, v, x.element_size(), chunk_size);
    at::Tensor buffer = n > 0 ? at::empty({std::min(chunk, n), v}, x.options()) : at::Tensor();
    const at::Tensor weight_t = weight.t();
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t rows = std::min(chunk, n - start);
      const at::Tensor xs = x.narrow(0, start, rows);
      at::Tensor logits = buffer.narrow(0, 0, rows);
      if (bias.defined()) {
        at::addmm_out(logits, bias, xs, weight_t);
      } else {
        at::mm_out(logits, xs, weight_t);
      }
      CrossEntropyRows r;
      r.logits = logits;
      r.target = target.narrow(0, start, rows);
      r.options = options;
      if (want_loss) r.loss_out = loss.narrow(0, start, rows);
      if (any_grad) {
        r.grad = logits;
        if (scale.defined()) r.scale = scale.dim() == 0 ? scale : scale.narrow(0, start, rows);
      }
      rows_kernel(r);
      if (input_grad) {
        at::Tensor rows_of_grad = grad_input.narrow(0, start, rows);
        at::mm_out(rows_of_grad, logits, weight);
      }
      if (weight_grad) {
        if (start == 0) {
          at::mm_out(grad_weight, logits.t(), xs);
        } else {
          grad_weight.addmm_(logits.t(), xs);
        }
      }
      if (bias_grad) {
        at::Tensor s = at::sum(logits, {0}, /*keepdim=*/false, math);
        bias_sum = start == 0 ? s : bias_sum.add_(s);
      }
    }
    if (n == 0) {
      if (weight_grad) grad_weight.zero_();
      if (bias_grad) bias_sum = at::zeros({v}, x.options().dtype(math));
    }
    if (bias_grad) grad_bias = bias_sum.to(bias.scalar_type());
  }
};

// The problem of a call: input as N x H rows, target as N dense values, the outputs asked for.
LinearChunks problem(const at::Tensor& input, const at::Tensor& linear_weight, const at::Tensor& target,
                     const std::optional<at::Tensor>& linear_bias, const CrossEntropyOptions& options,
                     int64_t chunk_size, bool want_loss, bool input_grad, bool weight_grad, bool bias_grad) {
  LinearChunks p;
  // The token count from the leading dimensions: reshape's -1 cannot infer it when H is 0.
  p.x = input.reshape({c10::multiply_integers(input.sizes().slice(0, input.dim() - 1)), input.size(-1)});
  p.weight = linear_weight;
  p.bias = given(linear_bias) ? *linear_bias : at::Tensor();
  p.target = target.reshape({-1}).contiguous();
  p.options = options;
  p.chunk_size = chunk_size;
  p.want_loss = want_loss;
  p.input_grad = input_grad;
  p.weight_grad = weight_grad;
  p.bias_grad = bias_grad;
  return p;
}

// The gradients of a run in the ops' output form: input's shape, [0]-shaped placeholders where not asked.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gradients(const LinearChunks& p, const at::Tensor& input) {
  return {p.input_grad ? p.grad_input.view(input.sizes()) : placeholder(input),
          p.weight_grad ? p.grad_weight : placeholder(input), p.bias_grad ? p.grad_bias : placeholder(input)};
}

// The checks after the tensors' own: the flags, the chunk size, then (CPU) the target values.
void check_run(const char* op, const std::optional<at::Tensor>& linear_bias, bool bias_grad, int64_t chunk_size,
               const at::Tensor& target, int64_t classes, int64_t ignore_index) {
  check_grad_flags(op, linear_bias, bias_grad);
  check_chunk_size(op, chunk_size);
  check_target_values(op, target, classes, ignore_index);
}

}  // namespace

void check_chunk_size(const char* op, int64_t chunk_size) {
  TORCHOPS_CHECK(chunk_size >= 0, op, "chunk_size must be non-negative (0: chosen from the sizes), got ", chunk_size);
}

LossReduction parse_reduction(const char* op, c10::string_view reduction) {
  if (reduction == "none") return LossReduction::kNone;
  if (reduction == "mean") return LossReduction::kMean;
  if (reduction == "sum") return LossReduction::kSum;
  TORCHOPS_CHECK(false, op, "reduction must be 'none', 'mean' or 'sum', got '", reduction, "'");
  return LossReduction::kMean;
}

void check_linear_cross_entropy_args(const char* op, const at::Tensor& input, const at::Tensor& linear_weight,
                                     const at::Tensor& target, const std::optional<at::Tensor>& linear_bias,
                                     const CrossEntropyOptions& options) {
  const NamedTensor x{"input", input}, w{"linear_weight", linear_weight};
  check_float_scores(op, x);
  check_defined_on(op, x, w);
  TORCHOPS_CHECK(linear_weight.dim() == 2, op, "linear_weight must be 2-D, got shape ", linear_weight.sym_sizes());
  check_same_dtype(op, x, w);
  TORCH_SYM_CHECK(linear_weight.sym_size(1).sym_eq(input.sym_size(-1)), "myns::", op, ": linear_weight must have ",
                  input.sym_size(-1), " columns (input's last dimension), got shape ", linear_weight.sym_sizes());
  TORCH_SYM_CHECK(linear_weight.sym_size(0).sym_ge(1), "myns::", op,
                  ": linear_weight holds no classes (its first dimension is empty), got shape ",
                  linear_weight.sym_sizes());
  check_defined(op, {"target", target});
  check_target(op, x, {"target", target});
  if (given(linear_bias)) {
    const NamedTensor b{"linear_bias", *linear_bias};
    check_same_device(op, x, b);
    TORCHOPS_CHECK(linear_bias->dim() == 1, op, "linear_bias must be 1-D of size ", linear_weight.sym_size(0),
                   " (linear_weight's rows), got shape ", linear_bias->sym_sizes());
    TORCH_SYM_CHECK(linear_bias->sym_size(0).sym_eq(linear_weight.sym_size(0)), "myns::", op,
                    ": linear_bias must be 1-D of size ", linear_weight.sym_size(0),
                    " (linear_weight's rows), got shape ", linear_bias->sym_sizes());
    check_same_dtype(op, x, b);
  }
  check_options(op, options);
}

void check_cross_entropy_args(const char* op, const at::Tensor& logits, const at::Tensor& target,
                              const CrossEntropyOptions& options) {
  const NamedTensor z{"logits", logits};
  check_float_scores(op, z);
  TORCH_SYM_CHECK(logits.sym_size(-1).sym_ge(1), "myns::", op,
                  ": logits holds no classes (its last dimension is empty), got shape ", logits.sym_sizes());
  check_defined(op, {"target", target});
  check_target(op, z, {"target", target});
  check_options(op, options);
}

void check_targets_cpu(const char* op, const at::Tensor& target, int64_t classes, int64_t ignore_index) {
  const at::Tensor t = target.reshape({-1}).contiguous();
  TORCHOPS_DISPATCH_INDEX_TYPES(t.scalar_type(), "check_targets_cpu", [&] {
    const index_t* p = t.const_data_ptr<index_t>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      const auto v = static_cast<int64_t>(p[i]);
      TORCHOPS_CHECK(v == ignore_index || (v >= 0 && v < classes), op, "target must lie in [0, ", classes,
                     ") or equal ignore_index (", ignore_index, "), got ", v, " at index ", i);
    }
  });
}

int64_t linear_cross_entropy_chunk_rows(int64_t tokens, int64_t classes, int64_t itemsize, int64_t requested) {
  if (requested > 0) return requested;
  const int64_t fit = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, classes * itemsize));
  if (tokens <= fit) return std::max<int64_t>(tokens, 1);
  // The fewest chunks that fit, of equal size (no short last chunk to run at a poor matmul shape).
  return ceil_div(tokens, ceil_div(tokens, fit));
}

at::Tensor reduce_loss(const at::Tensor& loss, const at::Tensor& target, LossReduction reduction,
                       int64_t ignore_index, at::ScalarType dtype) {
  switch (reduction) {
    case LossReduction::kNone:
      return loss.to(dtype);
    case LossReduction::kSum:
      return loss.sum().to(dtype);
    case LossReduction::kMean:
      // Counted on the device (no synchronisation); under DTensor both sums are over every shard.
      return (loss.sum() / target.ne(ignore_index).sum()).to(dtype);
  }
  TORCH_INTERNAL_ASSERT(false, "unknown reduction");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_forward(
    const char* op, CrossEntropyRowsKernel rows, const at::Tensor& input, const at::Tensor& linear_weight,
    const at::Tensor& target, const std::optional<at::Tensor>& linear_bias, const CrossEntropyOptions& options,
    const std::optional<at::Tensor>& grad_scale, bool input_grad, bool weight_grad, bool bias_grad,
    int64_t chunk_size) {
  check_linear_cross_entropy_args(op, input, linear_weight, target, linear_bias, options);
  if (given(grad_scale)) {
    const NamedTensor s{"grad_scale", *grad_scale};
    check_same_device(op, {"input", input}, s);
    TORCHOPS_CHECK(grad_scale->dim() == 0, op, "grad_scale must be a 0-dim tensor, got shape ", grad_scale->sizes());
    check_dtype_in(op, s, {TORCHOPS_FLOAT_DTYPES});
  }
  check_run(op, linear_bias, bias_grad, chunk_size, target, linear_weight.size(0), options.ignore_index);
  LinearChunks p = problem(input, linear_weight, target, linear_bias, options, chunk_size, /*want_loss=*/true,
                           input_grad, weight_grad, bias_grad);
  if (given(grad_scale)) p.scale = grad_scale->to(loss_math_dtype(input.scalar_type()));
  p.run(rows);
  auto [grad_input, grad_weight, grad_bias] = gradients(p, input);
  return {p.loss.view(target.sizes()), grad_input, grad_weight, grad_bias};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_backward(
    const char* op, CrossEntropyRowsKernel rows, const at::Tensor& grad_loss, const at::Tensor& input,
    const at::Tensor& linear_weight, const at::Tensor& target, const std::optional<at::Tensor>& linear_bias,
    const CrossEntropyOptions& options, bool input_grad, bool weight_grad, bool bias_grad, int64_t chunk_size) {
  check_linear_cross_entropy_args(op, input, linear_weight, target, linear_bias, options);
  check_per_token(op, {"target", target}, {"grad_loss", grad_loss});
  check_run(op, linear_bias, bias_grad, chunk_size, target, linear_weight.size(0), options.ignore_index);
  LinearChunks p = problem(input, linear_weight, target, linear_bias, options, chunk_size, /*want_loss=*/false,
                           input_grad, weight_grad, bias_grad);
  p.scale = grad_loss.reshape({-1}).to(loss_math_dtype(input.scalar_type())).contiguous();
  if (input_grad || weight_grad || bias_grad) p.run(rows);
  return gradients(p, input);
}

at::Tensor linear_cross_entropy(const char* op, CrossEntropyRowsKernel rows, const at::Tensor& input,
                                const at::Tensor& linear_weight, const at::Tensor& target,
                                const std::optional<at::Tensor>& linear_bias, c10::string_view reduction,
                                const CrossEntropyOptions& options, int64_t chunk_size) {
  check_linear_cross_entropy_args(op, input, linear_weight, target, linear_bias, options);
  const LossReduction r = parse_reduction(op, reduction);
  check_run(op, linear_bias, false, chunk_size, target, linear_weight.size(0), options.ignore_index);
  LinearChunks p = problem(input, linear_weight, target, linear_bias, options, chunk_size, /*want_loss=*/true, false,
                           false, false);
  p.run(rows);
  return reduce_loss(p.loss.view(target.sizes()), target, r, options.ignore_index, input.scalar_type());
}

namespace {

// logits as rows x V with unit column stride (a view where the layout allows, else a dense copy).
at::Tensor logit_rows(const at::Tensor& logits) {
  at::Tensor rows = logits.reshape({-1, logits.size(-1)});
  return rows.stride(1) == 1 || rows.size(1) == 1 ? rows : rows.contiguous();
}

}  // namespace

namespace {

std::tuple<at::Tensor, at::Tensor> cross_entropy_forward_checked(CrossEntropyRowsKernel rows, const at::Tensor& logits,
                                                                 const at::Tensor& target,
                                                                 const CrossEntropyOptions& options) {
  const auto math = loss_math_dtype(logits.scalar_type());
  at::Tensor loss = at::empty(target.sizes(), logits.options().dtype(math));
  at::Tensor lse = at::empty(target.sizes(), logits.options().dtype(math));
  if (loss.numel() > 0) {
    CrossEntropyRows r;
    r.logits = logit_rows(logits);
    r.target = target.reshape({-1}).contiguous();
    r.options = options;
    r.lse_out = lse.view({-1});
    r.loss_out = loss.view({-1});
    rows(r);
  }
  return {loss, lse};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> cross_entropy_forward(const char* op, CrossEntropyRowsKernel rows,
                                                         const at::Tensor& logits, const at::Tensor& target,
                                                         const CrossEntropyOptions& options) {
  check_cross_entropy_args(op, logits, target, options);
  check_target_values(op, target, logits.size(-1), options.ignore_index);
  return cross_entropy_forward_checked(rows, logits, target, options);
}

at::Tensor cross_entropy_backward(const char* op, CrossEntropyRowsKernel rows, const at::Tensor& grad_loss,
                                  const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                                  const CrossEntropyOptions& options) {
  check_cross_entropy_args(op, logits, target, options);
  check_per_token(op, {"target", target}, {"grad_loss", grad_loss});
  const auto math = loss_math_dtype(logits.scalar_type());
  check_defined_on(op, {"logits", logits}, {"lse", lse});
  const auto leading = logits.sizes().slice(0, logits.dim() - 1);
  TORCHOPS_CHECK(lse.sizes().equals(leading) && lse.scalar_type() == math, op, "lse must have shape ", leading,
                 " (logits's leading dimensions) and dtype ", math, ", got shape ", lse.sizes(), " and dtype ",
                 lse.scalar_type());
  check_target_values(op, target, logits.size(-1), options.ignore_index);
  at::Tensor grad = at::empty(logits.sizes(), logits.options().memory_format(at::MemoryFormat::Contiguous));
  if (grad.numel() > 0) {
    CrossEntropyRows r;
    r.logits = logit_rows(logits);
    r.target = target.reshape({-1}).contiguous();
    r.options = options;
    r.lse_in = lse.reshape({-1}).contiguous();
    r.grad = grad.view({-1, logits.size(-1)});
    r.scale = grad_loss.reshape({-1}).to(math).contiguous();
    rows(r);
  }
  return grad;
}

at::Tensor cross_entropy(const char* op, CrossEntropyRowsKernel rows, const at::Tensor& logits,
                         const at::Tensor& target, c10::string_view reduction, const CrossEntropyOptions& options) {
  check_cross_entropy_args(op, logits, target, options);
  const LossReduction r = parse_reduction(op, reduction);
  check_target_values(op, target, logits.size(-1), options.ignore_index);
  const at::Tensor loss = std::get<0>(cross_entropy_forward_checked(rows, logits, target, options));
  return reduce_loss(loss, target, r, options.ignore_index, logits.scalar_type());
}

}  // namespace torchops
