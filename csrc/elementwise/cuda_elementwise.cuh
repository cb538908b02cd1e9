// The CUDA elementwise engine: a functor (activations.h: kIn, kOut, a __host__ __device__ operator() on the
// op-math type, so 16-bit values are computed in f32) run by `elementwise_kernel` over operands (outs...,
// ins...) of one shape (elementwise.h builds them): outputs new dense tensors or an out= tensor, inputs with
// any strides. `Backend` at the end is the engine's CUDA backend for elementwise.h.
//
// Four paths, picked from the collapsed layout of the operands:
//   1-D     - one dimension after merging, outputs dense: 16-byte vector stores (the first elements up to
//             the outputs' 16-byte boundary and the last ones after the final whole vector go one per
//             thread), 16-byte loads where an input is dense and aligned like the outputs, strided loads
//             otherwise (e.g. a[:, ::2] beside a dense b);
//   rows    - two dimensions with unit stride along the last one in every operand: `rows` rows with a row
//             stride per operand, e.g. the halves of x.chunk(2, -1) (row stride 2H) read in place. 16-byte
//             vectors when every row of every operand starts 16-byte aligned, one element per thread
//             otherwise (still coalesced);
//   tiled   - two dimensions, outputs dense row-major and an input column-major (a transpose): 32x32 tiles
//             (64x64 for 16-bit types) of each such input staged in shared memory, so its reads and the
//             outputs' writes are both coalesced;
//   strided - anything else: per-element offsets (OffsetCalculator).
// Vectors (1-D, rows) or elements (strided) per thread: Op::kVectorsPerThread; the strided path takes
// kElementwiseUnroll. Index math is 32-bit below max_32bit_work, 64-bit past it (tensors of ~2^31 vectors or
// elements).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "../core/cuda_utils.cuh"
#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../core/strided.h"
#include "elementwise.h"

namespace torchops {
namespace cuda {

constexpr int kElementwiseThreads = 128;
constexpr int kElementwiseUnroll = 2;  // strided path: scalar accesses, two in flight per thread

// Largest work count (vectors or elements) for 32-bit index math when each thread takes `per_thread` items
// per round: a thread's index plus the grid stride (< 2 * (work + one block's items)) stays below 2^32, and
// every index below 2^31 (FastDivmod, OffsetCalculator).
constexpr int64_t max_32bit_work(int per_thread) {
  return INT32_MAX - int64_t{kElementwiseThreads} * per_thread;
}

template <typename T, int kIn, int kOut>
struct ElementwisePointers {
  const T* in[kIn];
  T* out[kOut];
};

template <int kIn>
struct InputStrides {  // elements between consecutive elements (1-D) or rows (rows path)
  int64_t in[kIn];
};

template <int kIn, int kOut>
struct RowStrides {  // elements between consecutive rows
  int64_t in[kIn];
  int64_t out[kOut];
};

// A grid-stride loop in rounds of kElementwiseThreads x kUnroll items: body(base) for each of this thread's
// rounds, base its first item (its others: base + u * kElementwiseThreads, u < kUnroll).
template <int kUnroll, typename Index, typename Body>
__device__ __forceinline__ void for_each_round(Index total, Body&& body) {
  constexpr int kRound = kElementwiseThreads * kUnroll;
  const Index step = static_cast<Index>(gridDim.x) * kRound;
  for (Index base = static_cast<Index>(blockIdx.x) * kRound + threadIdx.x; base < total; base += step) body(base);
}

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

// The kN elements of vector `vector_index` of a 1-D operand: one 16-byte load when the operand is dense
// and aligned (kVectorLoads), else kN independent strided loads.
template <bool kVectorLoads, typename T, int kN>
__device__ __forceinline__ AlignedVector<T, kN> load_elements(const T* base, int64_t stride, int64_t vector_index) {
  if constexpr (kVectorLoads) {
    return load_vector<T, kN>(base, vector_index);
  } else {
    AlignedVector<T, kN> v;
#pragma unroll
    for (int k = 0; k < kN; ++k) v.val[k] = base[(vector_index * kN + k) * stride];
    return v;
  }
}

// Element j of a 1-D layout whose outputs are dense.
template <typename T, typename Op>
__device__ __forceinline__ void one_element_1d(const ElementwisePointers<T, Op::kIn, Op::kOut>& p,
                                               const InputStrides<Op::kIn>& s, int64_t j, const Op& op) {
  AlignedVector<T, 1> x[Op::kIn], y[Op::kOut];
#pragma unroll
  for (int k = 0; k < Op::kIn; ++k) x[k].val[0] = p.in[k][j * s.in[k]];
  apply_lanes(op, x, y);
#pragma unroll
  for (int k = 0; k < Op::kOut; ++k) p.out[k][j] = y[k].val[0];
}

// 1-D path. Elements [head, head + n_vec * kVec) go as vectors (stores aligned: head is the outputs'
// misalignment); the `head` elements before them and the remainder after them one per thread in block 0.
template <typename T, int kVec, bool kVectorLoads, typename Index, typename Op>
__global__ void __launch_bounds__(kElementwiseThreads)
    elementwise_1d_kernel(ElementwisePointers<T, Op::kIn, Op::kOut> p, InputStrides<Op::kIn> s, Index n_vec,
                          int64_t n, int head, Op op) {
  constexpr int kIn = Op::kIn, kOut = Op::kOut;
  constexpr int kThreads = kElementwiseThreads, kUnroll = Op::kVectorsPerThread;
  using Vec = AlignedVector<T, kVec>;
  for_each_round<kUnroll>(n_vec, [&](Index base) {
    Vec x[kUnroll][kIn];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index i = base + u * kThreads;
      if (i < n_vec) {
#pragma unroll
        for (int k = 0; k < kIn; ++k) {
          x[u][k] = load_elements<kVectorLoads, T, kVec>(p.in[k] + head * s.in[k], s.in[k], i);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index i = base + u * kThreads;
      if (i < n_vec) {
        Vec y[kOut];
        apply_lanes(op, x[u], y);
#pragma unroll
        for (int k = 0; k < kOut; ++k) store_vector<T, kVec>(p.out[k] + head, i, y[k]);
      }
    }
  });

  if (blockIdx.x == 0) {
    const int64_t t = threadIdx.x;
    if (t < head) one_element_1d(p, s, t, op);
    const int64_t tail = head + static_cast<int64_t>(n_vec) * kVec + t;
    if (tail < n) one_element_1d(p, s, tail, op);
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

// Rows path. Vector i (of `total` = rows * vecs_per_row) is vector i % vecs_per_row of row i / vecs_per_row.
template <typename T, int kVec, typename Index, typename Op>
__global__ void __launch_bounds__(kElementwiseThreads)
    rows_elementwise_kernel(ElementwisePointers<T, Op::kIn, Op::kOut> p, RowStrides<Op::kIn, Op::kOut> rs,
                            Index total, Index vecs_per_row, FastDivmod row_div, Op op) {
  constexpr int kIn = Op::kIn, kOut = Op::kOut;
  constexpr int kThreads = kElementwiseThreads, kUnroll = Op::kVectorsPerThread;
  using Vec = AlignedVector<T, kVec>;
  for_each_round<kUnroll>(total, [&](Index base) {
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
  });
}

// Tiled path: a block of 32 x kTileRows threads covers a kTile x kTile tile, kTile = 32 * kPerThread, so
// that a warp's row of the tile is 128 bytes for 2-byte types too (each thread takes kPerThread columns).
template <typename T>
constexpr int tile_per_thread() {
  return sizeof(T) >= 4 ? 1 : 4 / static_cast<int>(sizeof(T));
}
constexpr int kTileRows = 8;

template <int kIn>
struct TileStrides {
  int64_t row[kIn];
  int64_t col[kIn];
};

// rows x cols outputs, row-major and dense. The inputs flagged in kStaged (bit q: input q has unit stride
// along rows) are read with consecutive threads walking their rows and staged in shared memory; the others
// are read directly along columns, like the outputs are written. The mask is a template argument, so each
// instantiation stages only its column-major inputs with no runtime test (a mask tested per input at run
// time made the kernel markedly slower). Each thread first issues all of its direct reads for the tile,
// then computes and stores, so they are in flight together. Residency: Op::kTileBlocksPerSM.
template <typename T, typename Op, unsigned kStaged>
__global__ void __launch_bounds__(kWarpSize * kTileRows, Op::kTileBlocksPerSM)
    tiled_elementwise_kernel(ElementwisePointers<T, Op::kIn, Op::kOut> p, TileStrides<Op::kIn> s, int64_t rows,
                             int64_t cols, Op op) {
  constexpr int kIn = Op::kIn, kOut = Op::kOut;
  constexpr int kPerThread = tile_per_thread<T>();
  constexpr int kTile = kWarpSize * kPerThread;
  constexpr int kSteps = kTile / kTileRows;
  __shared__ T tiles[kIn][kTile][kTile + 1];  // +1 column: the transposed reads hit distinct banks
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;

  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    for (int64_t ct = blockIdx.x; ct < col_tiles; ct += gridDim.x) {
      const int64_t r0 = rt * kTile, c0 = ct * kTile;
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        const int k = ty + step * kTileRows;
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) {
          const int tr = tx + kWarpSize * j;
          const int64_t r = r0 + tr, c = c0 + k;
          if (r < rows && c < cols) {
#pragma unroll
            for (int q = 0; q < kIn; ++q) {
              if ((kStaged >> q) & 1u) tiles[q][tr][k] = p.in[q][r * s.row[q] + c * s.col[q]];
            }
          }
        }
      }
      __syncthreads();
      AlignedVector<T, 1> x[kSteps][kPerThread][kIn];
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) {
          const int64_t r = r0 + ty + step * kTileRows, c = c0 + tx + kWarpSize * j;
          if (r < rows && c < cols) {
#pragma unroll
            for (int q = 0; q < kIn; ++q) {
              if (!((kStaged >> q) & 1u)) x[step][j][q].val[0] = p.in[q][r * s.row[q] + c * s.col[q]];
            }
          }
        }
      }
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) {
          const int k = ty + step * kTileRows, tc = tx + kWarpSize * j;
          const int64_t r = r0 + k, c = c0 + tc;
          if (r < rows && c < cols) {
#pragma unroll
            for (int q = 0; q < kIn; ++q) {
              if ((kStaged >> q) & 1u) x[step][j][q].val[0] = tiles[q][k][tc];
            }
            AlignedVector<T, 1> y[kOut];
            apply_lanes(op, x[step][j], y);
#pragma unroll
            for (int q = 0; q < kOut; ++q) p.out[q][r * cols + c] = y[q].val[0];
          }
        }
      }
      __syncthreads();  // the tiles are refilled next iteration
    }
  }
}

// fn(std::integral_constant<unsigned, kMask>{}) with kMask == mask, for a non-zero mask of kIn bits.
template <int kIn, unsigned kMask = 1, typename Fn>
void with_staged_mask(unsigned mask, Fn&& fn) {
  if (mask == kMask) return fn(std::integral_constant<unsigned, kMask>{});
  if constexpr (kMask + 1 < (1u << kIn)) {
    return with_staged_mask<kIn, kMask + 1>(mask, std::forward<Fn>(fn));
  } else {
    TORCH_INTERNAL_ASSERT(false, "tiled kernel: no instantiation for input mask ", mask);
  }
}

// Any layout: per-element offsets, operands ordered (outputs..., inputs...) as in the layout.
template <typename T, typename Index, typename Op>
__global__ void __launch_bounds__(kElementwiseThreads)
    strided_elementwise_kernel(ElementwisePointers<T, Op::kIn, Op::kOut> p,
                               OffsetCalculator<Op::kIn + Op::kOut> calc, Index n, Op op) {
  constexpr int kIn = Op::kIn, kOut = Op::kOut;
  constexpr int kThreads = kElementwiseThreads, kUnroll = kElementwiseUnroll;
  for_each_round<kUnroll>(n, [&](Index base) {
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
  });
}

template <typename T, typename Op>
void launch_strided(const ElementwisePointers<T, Op::kIn, Op::kOut>& p,
                    const StridedLayout<Op::kIn + Op::kOut>& layout, int64_t n, Op op, cudaStream_t stream) {
  const OffsetCalculator<Op::kIn + Op::kOut> calc(layout);
  const unsigned int blocks = blocks_to_cover(n, kElementwiseThreads * kElementwiseUnroll);
  if (n <= max_32bit_work(kElementwiseUnroll)) {
    strided_elementwise_kernel<T, uint32_t, Op><<<blocks, kElementwiseThreads, 0, stream>>>(
        p, calc, static_cast<uint32_t>(n), op);
  } else {
    strided_elementwise_kernel<T, int64_t, Op><<<blocks, kElementwiseThreads, 0, stream>>>(p, calc, n, op);
  }
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

// 1-D layouts with dense outputs (the caller checked): false when the outputs are not 16-byte aligned
// alike, which no output of one allocation rule is, and the caller takes the strided path.
template <typename T, typename Op>
bool launch_1d(const ElementwisePointers<T, Op::kIn, Op::kOut>& p, const InputStrides<Op::kIn>& s, int64_t n, Op op,
               cudaStream_t stream) {
  constexpr int kVec = vector_size<T>(), kUnroll = Op::kVectorsPerThread;
  const auto misalignment = reinterpret_cast<uintptr_t>(p.out[0]) % kVectorBytes;
  const int64_t head = std::min<int64_t>(n, misalignment == 0 ? 0 : (kVectorBytes - misalignment) / sizeof(T));
  bool vector_loads = true;
  for (int k = 0; k < Op::kOut; ++k) {
    if (!is_aligned(p.out[k] + head)) return false;
  }
  for (int k = 0; k < Op::kIn; ++k) vector_loads = vector_loads && s.in[k] == 1 && is_aligned(p.in[k] + head);
  const int64_t n_vec = (n - head) / kVec;
  const unsigned int blocks = blocks_to_cover(n_vec, kElementwiseThreads * kUnroll);
  const int h = static_cast<int>(head);
  if (n_vec <= max_32bit_work(kUnroll)) {
    const auto nv = static_cast<uint32_t>(n_vec);
    if (vector_loads) {
      elementwise_1d_kernel<T, kVec, true, uint32_t, Op><<<blocks, kElementwiseThreads, 0, stream>>>(p, s, nv, n, h, op);
    } else {
      elementwise_1d_kernel<T, kVec, false, uint32_t, Op><<<blocks, kElementwiseThreads, 0, stream>>>(p, s, nv, n, h, op);
    }
  } else if (vector_loads) {
    elementwise_1d_kernel<T, kVec, true, int64_t, Op><<<blocks, kElementwiseThreads, 0, stream>>>(p, s, n_vec, n, h, op);
  } else {
    elementwise_1d_kernel<T, kVec, false, int64_t, Op><<<blocks, kElementwiseThreads, 0, stream>>>(p, s, n_vec, n, h, op);
  }
  TORCHOPS_CUDA_LAUNCH_CHECK();
  return true;
}

template <typename T, int kVec, typename Op>
void launch_rows(const ElementwisePointers<T, Op::kIn, Op::kOut>& p, const RowsView<Op::kIn + Op::kOut>& view,
                 Op op, cudaStream_t stream) {
  constexpr int kIn = Op::kIn, kOut = Op::kOut, kUnroll = Op::kVectorsPerThread;
  RowStrides<kIn, kOut> rs;
  for (int k = 0; k < kOut; ++k) rs.out[k] = view.row_stride[k];
  for (int k = 0; k < kIn; ++k) rs.in[k] = view.row_stride[kOut + k];
  const int64_t vecs_per_row = view.cols / kVec;  // exact: the caller takes kVec > 1 only when it divides
  const int64_t total = view.rows * vecs_per_row;
  const unsigned int blocks = blocks_to_cover(total, kElementwiseThreads * kUnroll);
  if (total <= max_32bit_work(kUnroll)) {
    const FastDivmod row_div(static_cast<uint32_t>(std::max<int64_t>(vecs_per_row, 1)));
    rows_elementwise_kernel<T, kVec, uint32_t, Op><<<blocks, kElementwiseThreads, 0, stream>>>(
        p, rs, static_cast<uint32_t>(total), static_cast<uint32_t>(vecs_per_row), row_div, op);
  } else {
    rows_elementwise_kernel<T, kVec, int64_t, Op><<<blocks, kElementwiseThreads, 0, stream>>>(
        p, rs, total, vecs_per_row, FastDivmod(), op);
  }
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

template <typename T, typename Op>
void launch_tiled(const ElementwisePointers<T, Op::kIn, Op::kOut>& p, const StridedLayout<Op::kIn + Op::kOut>& layout,
                  unsigned col_major, Op op, cudaStream_t stream) {
  constexpr int kTile = kWarpSize * tile_per_thread<T>();
  TileStrides<Op::kIn> s;
  for (int k = 0; k < Op::kIn; ++k) {
    s.row[k] = layout.strides[Op::kOut + k][0];
    s.col[k] = layout.strides[Op::kOut + k][1];
  }
  const int64_t rows = layout.sizes[0], cols = layout.sizes[1];
  const dim3 grid(blocks_to_cover(cols, kTile), std::min(blocks_to_cover(rows, kTile), kMaxGridYZ));
  with_staged_mask<Op::kIn>(col_major, [&](auto staged) {
    tiled_elementwise_kernel<T, Op, decltype(staged)::value>
        <<<grid, dim3(kWarpSize, kTileRows), 0, stream>>>(p, s, rows, cols, op);
    TORCHOPS_CUDA_LAUNCH_CHECK();
  });
}

// operands = (outs..., ins...): outs[k] = Op(ins...) elementwise, on `stream`; the caller holds the device
// guard and has returned early for empty tensors (elementwise.h). `name` names the op in errors. An out=
// output may alias an input exactly: every path reads an element and writes it in the same thread.
template <typename T, typename Op>
void elementwise_kernel(const char* name, const Operands<Op::kOut, Op::kIn>& operands, Op op, cudaStream_t stream) {
  constexpr int kIn = Op::kIn, kOut = Op::kOut;
  constexpr int kVec = vector_size<T>();
  const auto layout = collapse_layout<kIn + kOut>(name, operands);
  ElementwisePointers<T, kIn, kOut> p;
  for (int k = 0; k < kOut; ++k) p.out[k] = operands[k].template mutable_data_ptr<T>();
  for (int k = 0; k < kIn; ++k) p.in[k] = operands[kOut + k].template const_data_ptr<T>();
  const int64_t n = operands[0].numel();
  bool outs_dense = true;
  for (int k = 0; k < kOut; ++k) outs_dense = outs_dense && layout.is_contiguous(k);

  if (layout.ndim <= 1 && outs_dense) {
    InputStrides<kIn> s;
    for (int k = 0; k < kIn; ++k) s.in[k] = inner_stride(layout, kOut + k);
    if (launch_1d<T, Op>(p, s, n, op, stream)) return;
  } else if (const auto view = as_rows(layout)) {
    // 16-byte vectors only when every row of every operand starts aligned.
    bool vectors = view->cols % kVec == 0;
    for (int k = 0; k < kOut; ++k) vectors = vectors && is_aligned(p.out[k]);
    for (int k = 0; k < kIn; ++k) vectors = vectors && is_aligned(p.in[k]);
    for (int k = 0; k < kIn + kOut; ++k) vectors = vectors && view->row_stride[k] % kVec == 0;
    if (vectors) {
      launch_rows<T, kVec, Op>(p, *view, op, stream);
    } else {
      launch_rows<T, 1, Op>(p, *view, op, stream);
    }
    return;
  } else if (layout.ndim == 2 && outs_dense) {
    unsigned col_major = 0;
    for (int k = 0; k < kIn; ++k) {
      const auto& st = layout.strides[kOut + k];
      if (st[0] == 1 && st[1] != 1) col_major |= 1u << k;
    }
    if (col_major != 0) {
      launch_tiled<T, Op>(p, layout, col_major, op, stream);
      return;
    }
  }
  launch_strided<T, Op>(p, layout, n, op, stream);
}

// The functor run for storage type T: Op itself, or for a functor template Family<Act, kFast> (the gated
// ones) its fast-math form on 16-bit storage, where the rounding hides the error of fast exp.
template <typename Op, typename T>
struct CudaFunctor {
  using type = Op;
};
template <template <typename, bool> class Family, typename Act, typename T>
struct CudaFunctor<Family<Act, false>, T> {
  using type = Family<Act, is_16bit_float<T>>;
};

// The engine's CUDA backend (elementwise.h): on the operands' device and its current stream.
struct Backend {
  static at::Tensor empty_like_dense(const at::Tensor& like) { return empty_like_dense_cuda(like); }

  template <typename Op>
  static void run(const char* op, const Operands<Op::kOut, Op::kIn>& operands) {
    const c10::cuda::CUDAGuard device_guard(operands[0].device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    dispatch_elementwise<Op>(operands[0].scalar_type(), [&](auto zero) {
      using T = decltype(zero);
      using Functor = typename CudaFunctor<Op, T>::type;
      elementwise_kernel<T, Functor>(op, operands, Functor{}, stream);
    });
  }
};

}  // namespace cuda
}  // namespace torchops
