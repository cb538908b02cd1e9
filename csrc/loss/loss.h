// The loss family's front half, shared by the CPU and CUDA backends: argument checks, the rows one launch of a
// backend's row kernel takes, and the drivers every backend runs (linear_cross_entropy's chunk loop over ATen
// matmuls, cross_entropy's single pass, the reductions). A backend contributes only its row kernel
// (CrossEntropyRowsKernel: cpu/linear_cross_entropy.cpp, cuda/linear_cross_entropy.cu); the row math is
// cross_entropy_math.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>

#include "../core/checks.h"

namespace torchops {

enum class LossReduction { kNone, kMean, kSum };

// "none", "mean" or "sum"; anything else raises.
LossReduction parse_reduction(const char* op, c10::string_view reduction);

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  std::optional<double> softcap;
};

// input (..., H) of a float dtype; linear_weight (V, H), V >= 1, of input's dtype and device; target of
// input.shape[:-1], int32 or int64, on input's device; linear_bias (V) of input's dtype and device, or
// absent; label_smoothing in [0, 1]; softcap positive and finite, or absent. Symbolic-safe (the Autograd
// kernels check fake tensors too).
void check_linear_cross_entropy_args(const char* op, const at::Tensor& input, const at::Tensor& linear_weight,
                                     const at::Tensor& target, const std::optional<at::Tensor>& linear_bias,
                                     const CrossEntropyOptions& options);

// logits (..., V) of a float dtype, V >= 1; target of logits.shape[:-1] as above; the options as above.
void check_cross_entropy_args(const char* op, const at::Tensor& logits, const at::Tensor& target,
                              const CrossEntropyOptions& options);

// chunk_size >= 0 (0: chosen from the sizes).
void check_chunk_size(const char* op, int64_t chunk_size);

// Every target in [0, classes) or equal to ignore_index, else raises naming the first bad one. Reads the
// target: CPU tensors only (the CUDA kernels never synchronise to check: such a row's loss is NaN there).
void check_targets_cpu(const char* op, const at::Tensor& target, int64_t classes, int64_t ignore_index);

// One launch of a backend's row kernel: rows of logits, each with its target. For each row the kernel
//   - takes lse from lse_in when given, else computes it (and writes it to lse_out when given);
//   - writes the row's loss to loss_out when given: 0 at ignore_index, NaN for a target outside [0, V);
//   - writes dloss/dlogits times the row's scale to grad when given (grad may be logits itself: each element
//     is read before it is written); a row whose target is ignore_index or outside [0, V) gets zeros.
// Tensors: logits rows x V with unit column stride (any row stride), target rows (int32/int64, dense),
// lse_in/lse_out/loss_out rows and scale (one value, or rows) dense in the math dtype (float32, float64 for
// float64 logits), grad rows x V dense in logits' dtype.
struct CrossEntropyRows {
  at::Tensor logits, target;
  CrossEntropyOptions options;
  at::Tensor lse_in, lse_out, loss_out;
  at::Tensor grad, scale;
};

using CrossEntropyRowsKernel = void (*)(const CrossEntropyRows&);

// The math dtype of a loss over logits of `dtype`: float64 for float64, else float32.
inline at::ScalarType loss_math_dtype(at::ScalarType dtype) { return dtype == at::kDouble ? at::kDouble : at::kFloat; }

// Tokens per chunk of linear_cross_entropy: `requested` when positive, else chosen from the sizes (see
// loss.cpp).
int64_t linear_cross_entropy_chunk_rows(int64_t tokens, int64_t classes, int64_t itemsize, int64_t requested);

// The per-token losses (target's shape, the math dtype) reduced as asked, in the loss dtype `dtype`: "mean"
// divides the sum by the count of targets that are not ignore_index (0 of them: NaN, as torch). ATen ops, so
// autograd and DTensor follow them.
at::Tensor reduce_loss(const at::Tensor& loss, const at::Tensor& target, LossReduction reduction,
                       int64_t ignore_index, at::ScalarType dtype);

// ---------------------------------------------------------------------------------------- the drivers
// Each checks its arguments under `op`'s name and runs `rows` on the backend's tensors.

// _linear_cross_entropy_forward: the per-token losses and, where asked, the gradients of
// grad_scale * loss.sum() (grad_scale absent: 1); an output not asked for is a [0]-shaped placeholder.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_forward(
    const char* op, CrossEntropyRowsKernel rows, const at::Tensor& input, const at::Tensor& linear_weight,
    const at::Tensor& target, const std::optional<at::Tensor>& linear_bias, const CrossEntropyOptions& options,
    const std::optional<at::Tensor>& grad_scale, bool input_grad, bool weight_grad, bool bias_grad,
    int64_t chunk_size);

// _linear_cross_entropy_backward: the gradients of sum(grad_loss * loss) (grad_loss of target's shape), the
// logits recomputed chunk by chunk.
std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_backward(
    const char* op, CrossEntropyRowsKernel rows, const at::Tensor& grad_loss, const at::Tensor& input,
    const at::Tensor& linear_weight, const at::Tensor& target, const std::optional<at::Tensor>& linear_bias,
    const CrossEntropyOptions& options, bool input_grad, bool weight_grad, bool bias_grad, int64_t chunk_size);

// linear_cross_entropy (and its chunked twin): the forward without gradients, reduced.
at::Tensor linear_cross_entropy(const char* op, CrossEntropyRowsKernel rows, const at::Tensor& input,
                                const at::Tensor& linear_weight, const at::Tensor& target,
                                const std::optional<at::Tensor>& linear_bias, c10::string_view reduction,
                                const CrossEntropyOptions& options, int64_t chunk_size);

// _cross_entropy_forward: (loss, lse) per token, in the math dtype.
std::tuple<at::Tensor, at::Tensor> cross_entropy_forward(const char* op, CrossEntropyRowsKernel rows,
                                                         const at::Tensor& logits, const at::Tensor& target,
                                                         const CrossEntropyOptions& options);

// _cross_entropy_backward: dloss/dlogits scaled row by row by grad_loss (target's shape), from the saved lse.
at::Tensor cross_entropy_backward(const char* op, CrossEntropyRowsKernel rows, const at::Tensor& grad_loss,
                                  const at::Tensor& logits, const at::Tensor& target, const at::Tensor& lse,
                                  const CrossEntropyOptions& options);

// cross_entropy: the forward, reduced.
at::Tensor cross_entropy(const char* op, CrossEntropyRowsKernel rows, const at::Tensor& logits,
                         const at::Tensor& target, c10::string_view reduction, const CrossEntropyOptions& options);

}  // namespace torchops
