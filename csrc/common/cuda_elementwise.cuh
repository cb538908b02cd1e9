// CUDA driver for elementwise ops with several inputs and outputs (swiglu, swiglu_backward): outputs are
// new dense tensors, inputs have any strides; `Op` is a functor of activations.h (kIn, kOut, a
// __host__ __device__ operator() on the op-math type, so 16-bit values are computed in f32).
//
// Two paths, picked from the collapsed layout of (outputs..., inputs...):
//   rows    - at most 2-D with unit stride along the last dim in every operand: `rows` rows with a row
//             stride per operand, e.g. the halves of x.chunk(2, -1) (row stride 2H) read in place. 16-byte
//             vectors when every row of every operand starts 16-byte aligned (1-D: the bases are aligned,
//             the last cols % kVec elements are a scalar tail), one element per thread otherwise (still
//             coalesced); one vector of each operand per thread (kRowsUnroll), one pass over the data;
//   strided - anything else: per-element offsets (OffsetCalculator), 32-bit index math when it fits.
// Index math is 64-bit from ~2^31 vectors/elements on (kMax32BitWork).
#pragma once

#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "cuda_utils.cuh"
#include "dispatch.h"
#include "strided.h"

namespace torchops {
namespace cuda {

constexpr int kElementwiseThreads = 128;
// Vectors (rows path) or elements (strided path) of each operand per thread. The rows path takes one: on
// the H200, bf16 swiglu with two vectors per thread needed 56 (forward) and 80 (backward) registers, so
// fewer warps were resident, and ran at 0.96-0.97x Inductor's kernels at 16384 x 14336; with one vector,
// 32 and 36 registers and 1.00x (f32 unchanged at 0.99-1.00x; same run, do_bench medians).
constexpr int kRowsUnroll = 1;
constexpr int kElementwiseUnroll = 2;  // strided path: scalar accesses, as vector_add (measured there)
// Largest work count for 32-bit index math: a thread's index plus the grid stride (< 2 * (work + one
// block's items)) stays below 2^32, and every index below 2^31 (FastDivmod, OffsetCalculator).
constexpr int64_t kMax32BitWork = INT32_MAX - int64_t{kElementwiseThreads} * std::max(kRowsUnroll, kElementwiseUnroll);

template <typename T, int kIn, int kOut>
struct ElementwisePointers {
  const T* in[kIn];
  T* out[kOut];
};

template <int kIn, int kOut>
struct RowStrides {  // elements between consecutive rows
  int64_t in[kIn];
  int64_t out[kOut];
};

// y[k] = op(x...) lane by lane in the op-math type.
template <typename Op, typename T, int kN>
__device__ __forceinline__ void apply_lanes(const Op& op, const AlignedVector<T, kN> (&x)[Op::kIn],
                                            AlignedVector<T, kN> (&y)[Op::kOut]) {
  using A = opmath_t<T>;
#pragma unroll
  for (int e = 0; e < kN; ++e) {
    A xs[Op::kIn], ys[Op::kOut];
#pragma unroll
    for (int k = 0; k < Op::kIn; ++k) xs[k] = static_cast<A>(x[k].val[e]);
    op(xs, ys);
#pragma unroll
    for (int k = 0; k < Op::kOut; ++k) y[k].val[e] = static_cast<T>(ys[k]);
  }
}

template <typename Index>
__device__ __forceinline__ Index row_of(Index i, Index per_row, const FastDivmod& div) {
  if constexpr (std::is_same_v<Index, uint32_t>) {
    return div.div(i);
  } else {
    return i / per_row;
  }
}

// Rows path. Vector i (of `total` = rows * vecs_per_row) is vector i % vecs_per_row of row
// i / vecs_per_row. `tail` > 0 only for a single row: its last `tail` elements, one per thread of block 0.
template <typename T, int kVec, typename Index, typename Op>
__global__ void __launch_bounds__(kElementwiseThreads)
    rows_elementwise_kernel(ElementwisePointers<T, Op::kIn, Op::kOut> p, RowStrides<Op::kIn, Op::kOut> rs,
                            Index total, Index vecs_per_row, FastDivmod row_div, int tail, Op op) {
  constexpr int kIn = Op::kIn, kOut = Op::kOut;
  constexpr int kThreads = kElementwiseThreads, kUnroll = kRowsUnroll;
  using Vec = AlignedVector<T, kVec>;
  const Index step = static_cast<Index>(gridDim.x) * (kThreads * kUnroll);
  for (Index base = static_cast<Index>(blockIdx.x) * (kThreads * kUnroll) + threadIdx.x; base < total;
       base += step) {
    Vec x[kUnroll][kIn];
    Index row[kUnroll], col[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index i = base + u * kThreads;
      if (i < total) {
        row[u] = row_of(i, vecs_per_row, row_div);
        col[u] = i - row[u] * vecs_per_row;
#pragma unroll
        for (int k = 0; k < kIn; ++k) {
          x[u][k] = load_vector<T, kVec>(p.in[k] + static_cast<int64_t>(row[u]) * rs.in[k], col[u]);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * kThreads < total) {
        Vec y[kOut];
        apply_lanes(op, x[u], y);
#pragma unroll
        for (int k = 0; k < kOut; ++k) {
          store_vector<T, kVec>(p.out[k] + static_cast<int64_t>(row[u]) * rs.out[k], col[u], y[k]);
        }
      }
    }
  }

  if (tail > 0 && blockIdx.x == 0 && static_cast<int>(threadIdx.x) < tail) {
    const int64_t j = static_cast<int64_t>(vecs_per_row) * kVec + threadIdx.x;
    AlignedVector<T, 1> x1[kIn], y1[kOut];
#pragma unroll
    for (int k = 0; k < kIn; ++k) x1[k].val[0] = p.in[k][j];
    apply_lanes(op, x1, y1);
#pragma unroll
    for (int k = 0; k < kOut; ++k) p.out[k][j] = y1[k].val[0];
  }
}

// Any layout: per-element offsets, operands ordered (outputs..., inputs...) as in the layout.
template <typename T, typename Index, typename Op>
__global__ void __launch_bounds__(kElementwiseThreads)
    strided_elementwise_kernel(ElementwisePointers<T, Op::kIn, Op::kOut> p,
                               OffsetCalculator<Op::kIn + Op::kOut> calc, Index n, Op op) {
  constexpr int kIn = Op::kIn, kOut = Op::kOut;
  constexpr int kThreads = kElementwiseThreads, kUnroll = kElementwiseUnroll;
  const Index step = static_cast<Index>(gridDim.x) * (kThreads * kUnroll);
  for (Index base = static_cast<Index>(blockIdx.x) * (kThreads * kUnroll) + threadIdx.x; base < n; base += step) {
    AlignedVector<T, 1> x[kUnroll][kIn];
    int64_t out_offset[kUnroll][kOut];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index i = base + u * kThreads;
      if (i < n) {
        int64_t off[kIn + kOut];
        calc.offsets(i, off);
#pragma unroll
        for (int k = 0; k < kOut; ++k) out_offset[u][k] = off[k];
#pragma unroll
        for (int k = 0; k < kIn; ++k) x[u][k].val[0] = p.in[k][off[kOut + k]];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * kThreads < n) {
        AlignedVector<T, 1> y[kOut];
        apply_lanes(op, x[u], y);
#pragma unroll
        for (int k = 0; k < kOut; ++k) p.out[k][out_offset[u][k]] = y[k].val[0];
      }
    }
  }
}

template <typename T, int kVec, typename Op>
void launch_rows(const ElementwisePointers<T, Op::kIn, Op::kOut>& p, const RowsView<Op::kIn + Op::kOut>& view,
                 Op op, cudaStream_t stream) {
  constexpr int kIn = Op::kIn, kOut = Op::kOut;
  RowStrides<kIn, kOut> rs;
  for (int k = 0; k < kOut; ++k) rs.out[k] = view.row_stride[k];
  for (int k = 0; k < kIn; ++k) rs.in[k] = view.row_stride[kOut + k];
  const int64_t vecs_per_row = view.cols / kVec;
  // Non-zero only with a single row: the caller takes the vector path for several rows only when
  // cols % kVec == 0.
  const int tail = static_cast<int>(view.cols - vecs_per_row * kVec);
  const int64_t total = view.rows * vecs_per_row;
  const unsigned int blocks = blocks_to_cover(total, kElementwiseThreads * kRowsUnroll);
  if (total <= kMax32BitWork) {
    const FastDivmod row_div(static_cast<uint32_t>(std::max<int64_t>(vecs_per_row, 1)));
    rows_elementwise_kernel<T, kVec, uint32_t, Op><<<blocks, kElementwiseThreads, 0, stream>>>(
        p, rs, static_cast<uint32_t>(total), static_cast<uint32_t>(vecs_per_row), row_div, tail, op);
  } else {
    rows_elementwise_kernel<T, kVec, int64_t, Op><<<blocks, kElementwiseThreads, 0, stream>>>(
        p, rs, total, vecs_per_row, FastDivmod(), tail, op);
  }
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

template <typename T, typename Op>
void launch_strided(const ElementwisePointers<T, Op::kIn, Op::kOut>& p,
                    const StridedLayout<Op::kIn + Op::kOut>& layout, int64_t n, Op op, cudaStream_t stream) {
  const OffsetCalculator<Op::kIn + Op::kOut> calc(layout);
  const unsigned int blocks = blocks_to_cover(n, kElementwiseThreads * kElementwiseUnroll);
  if (n <= kMax32BitWork) {
    strided_elementwise_kernel<T, uint32_t, Op><<<blocks, kElementwiseThreads, 0, stream>>>(
        p, calc, static_cast<uint32_t>(n), op);
  } else {
    strided_elementwise_kernel<T, int64_t, Op><<<blocks, kElementwiseThreads, 0, stream>>>(p, calc, n, op);
  }
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

// outs[k] (new dense tensors) = Op(ins...) elementwise, on `stream`; the caller holds the device guard
// and has returned early for empty tensors. `name` names the op in errors.
template <typename T, typename Op>
void elementwise_kernel(const char* name, const std::array<at::Tensor, Op::kOut>& outs,
                        const std::array<at::Tensor, Op::kIn>& ins, Op op, cudaStream_t stream) {
  constexpr int kIn = Op::kIn, kOut = Op::kOut;
  constexpr int kVec = vector_size<T>();
  std::array<at::Tensor, kIn + kOut> all;
  for (int k = 0; k < kOut; ++k) all[k] = outs[k];
  for (int k = 0; k < kIn; ++k) all[kOut + k] = ins[k];
  const auto layout = collapse_layout<kIn + kOut>(name, all);
  ElementwisePointers<T, kIn, kOut> p;
  bool aligned = true;
  for (int k = 0; k < kOut; ++k) {
    p.out[k] = outs[k].template mutable_data_ptr<T>();
    aligned = aligned && is_aligned(p.out[k]);
  }
  for (int k = 0; k < kIn; ++k) {
    p.in[k] = ins[k].template const_data_ptr<T>();
    aligned = aligned && is_aligned(p.in[k]);
  }
  const auto view = as_rows(layout);
  if (!view) {
    launch_strided<T, Op>(p, layout, outs[0].numel(), op, stream);
    return;
  }
  // Several rows take 16-byte vectors only when every row of every operand starts aligned.
  bool rows_aligned = view->rows == 1 || view->cols % kVec == 0;
  for (int k = 0; k < kIn + kOut; ++k) rows_aligned = rows_aligned && (view->rows == 1 || view->row_stride[k] % kVec == 0);
  if (aligned && rows_aligned) {
    launch_rows<T, kVec, Op>(p, *view, op, stream);
  } else {
    launch_rows<T, 1, Op>(p, *view, op, stream);
  }
}

}  // namespace cuda
}  // namespace torchops
