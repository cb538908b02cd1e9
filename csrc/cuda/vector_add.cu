// vector_add on CUDA. Three paths, picked from the collapsed layout of (out, a, b):
//   1-D     - out dense, inputs dense or evenly strided: 16-byte vector stores (and loads where the
//             inputs are dense), kUnroll vectors in flight per thread, scalar head/tail;
//   tiled   - 2-D with a column-major (e.g. transposed) operand: 32x32 tiles (64x64 for 16-bit types)
//             staged in shared memory, so that operand's reads and the output's writes are coalesced;
//   strided - anything else: per-element offsets, 32-bit index math when the tensor allows it.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../common/elementwise.h"
#include "../common/cuda_utils.cuh"
#include "../common/dispatch.h"
#include "../common/empty.h"

namespace torchops {
namespace {

using namespace torchops::cuda;

constexpr int kThreads = 128;
constexpr int kUnroll = 2;  // vectors per operand per thread; measured best with a grid covering the tensor
                            // once (benchmarks/tuning/vector_add_variants.cu): ~104% of copy on the H200

template <typename T>
__device__ __forceinline__ T add(T x, T y) {
  return static_cast<T>(static_cast<opmath_t<T>>(x) + static_cast<opmath_t<T>>(y));
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

// 1-D: out dense, a and b with any strides. Elements [head, head + n_vec * kVec) are stored as aligned
// 16-byte vectors; the `head` elements before them (out's misalignment) and the remainder after them go
// one per thread in block 0. kVectorLoads: both inputs are dense and aligned like out.
template <typename T, bool kVectorLoads>
__global__ void __launch_bounds__(kThreads)
    vector_add_1d_kernel(const T* a, int64_t a_stride, const T* b, int64_t b_stride, T* out, int64_t n,
                         int64_t head) {
  constexpr int kVec = vector_size<T>();
  using Vec = AlignedVector<T, kVec>;
  const int64_t n_vec = (n - head) / kVec;
  const T* a_body = a + head * a_stride;
  const T* b_body = b + head * b_stride;
  T* out_body = out + head;

  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < n_vec;
       base += step) {
    Vec x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < n_vec) {
        x[u] = load_elements<kVectorLoads, T, kVec>(a_body, a_stride, i);
        y[u] = load_elements<kVectorLoads, T, kVec>(b_body, b_stride, i);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < n_vec) {
        Vec r;
#pragma unroll
        for (int k = 0; k < kVec; ++k) r.val[k] = add(x[u].val[k], y[u].val[k]);
        store_vector<T, kVec>(out_body, i, r);
      }
    }
  }

  if (blockIdx.x == 0) {
    const int64_t t = threadIdx.x;
    if (t < head) out[t] = add(a[t * a_stride], b[t * b_stride]);
    const int64_t tail = head + n_vec * kVec + t;
    if (tail < n) out[tail] = add(a[tail * a_stride], b[tail * b_stride]);
  }
}

// Any layout. Index is uint32_t (fast division) when numel < 2^31, else int64_t.
template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads)
    vector_add_strided_kernel(const T* a, const T* b, T* out, OffsetCalculator<3> calc, Index n) {
  const Index step = static_cast<Index>(gridDim.x) * kThreads * kUnroll;
  for (Index base = static_cast<Index>(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < n; base += step) {
    T x[kUnroll], y[kUnroll];
    int64_t out_offset[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index i = base + u * kThreads;
      if (i < n) {
        int64_t off[3];
        calc.offsets(i, off);
        out_offset[u] = off[0];
        x[u] = a[off[1]];
        y[u] = b[off[2]];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * kThreads < n) out[out_offset[u]] = add(x[u], y[u]);
    }
  }
}

// Tiled path: a block of 32 x 8 threads covers a kTile x kTile tile, kTile = 32 * kPerThread, so that a
// warp's row of the tile is 128 bytes for 2-byte types too (each thread takes kPerThread columns).
template <typename T>
constexpr int tile_per_thread() {
  return sizeof(T) >= 4 ? 1 : 4 / static_cast<int>(sizeof(T));
}
constexpr int kTileRows = 8;

// rows x cols output, row-major and dense. An operand flagged column-major (unit stride along rows) is
// read with consecutive threads walking its rows and staged in shared memory; the others are read
// directly along columns, like the output is written.
template <typename T>
__global__ void __launch_bounds__(32 * kTileRows)
    vector_add_tiled_kernel(const T* a, const T* b, T* out, int64_t rows, int64_t cols, int64_t a_row_stride,
                            int64_t a_col_stride, int64_t b_row_stride, int64_t b_col_stride, bool a_col_major,
                            bool b_col_major) {
  constexpr int kPerThread = tile_per_thread<T>();
  constexpr int kTile = 32 * kPerThread;
  __shared__ T tile_a[kTile][kTile + 1];  // +1 column: the transposed reads hit distinct banks
  __shared__ T tile_b[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;

  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    for (int64_t ct = blockIdx.x; ct < col_tiles; ct += gridDim.x) {
      const int64_t r0 = rt * kTile, c0 = ct * kTile;
      for (int k = ty; k < kTile; k += kTileRows) {
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) {
          const int tr = tx + 32 * j;
          const int64_t r = r0 + tr, c = c0 + k;
          if (r < rows && c < cols) {
            if (a_col_major) tile_a[tr][k] = a[r * a_row_stride + c * a_col_stride];
            if (b_col_major) tile_b[tr][k] = b[r * b_row_stride + c * b_col_stride];
          }
        }
      }
      __syncthreads();
      for (int k = ty; k < kTile; k += kTileRows) {
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) {
          const int tc = tx + 32 * j;
          const int64_t r = r0 + k, c = c0 + tc;
          if (r < rows && c < cols) {
            const T x = a_col_major ? tile_a[k][tc] : a[r * a_row_stride + c * a_col_stride];
            const T y = b_col_major ? tile_b[k][tc] : b[r * b_row_stride + c * b_col_stride];
            out[r * cols + c] = add(x, y);
          }
        }
      }
      __syncthreads();  // the tile is refilled next iteration
    }
  }
}

// 1-D layouts with a dense output: the vector path when both inputs are dense and share out's alignment.
template <typename T>
void launch_1d(const T* a, int64_t a_stride, const T* b, int64_t b_stride, T* out, int64_t n, cudaStream_t stream) {
  constexpr int kVec = vector_size<T>();
  const auto misalignment = reinterpret_cast<uintptr_t>(out) % kVectorBytes;
  const int64_t head = std::min<int64_t>(n, misalignment == 0 ? 0 : (kVectorBytes - misalignment) / sizeof(T));
  const int64_t n_vec = (n - head) / kVec;
  const unsigned int blocks = blocks_to_cover(n_vec, kThreads * kUnroll);
  const bool vector_loads = a_stride == 1 && b_stride == 1 && is_aligned(a + head) && is_aligned(b + head);
  if (vector_loads) {
    vector_add_1d_kernel<T, true><<<blocks, kThreads, 0, stream>>>(a, a_stride, b, b_stride, out, n, head);
  } else {
    vector_add_1d_kernel<T, false><<<blocks, kThreads, 0, stream>>>(a, a_stride, b, b_stride, out, n, head);
  }
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

template <typename T>
void launch_tiled(const T* a, const T* b, T* out, const StridedLayout<3>& layout, cudaStream_t stream) {
  constexpr int kTile = 32 * tile_per_thread<T>();
  const int64_t rows = layout.sizes[0], cols = layout.sizes[1];
  const bool a_col_major = layout.strides[1][0] == 1;
  const bool b_col_major = layout.strides[2][0] == 1;
  const dim3 grid(blocks_to_cover(cols, kTile), std::min(blocks_to_cover(rows, kTile), 65535u));
  vector_add_tiled_kernel<T><<<grid, dim3(32, kTileRows), 0, stream>>>(
      a, b, out, rows, cols, layout.strides[1][0], layout.strides[1][1], layout.strides[2][0],
      layout.strides[2][1], a_col_major, b_col_major);
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

template <typename T>
void launch_strided(const T* a, const T* b, T* out, const StridedLayout<3>& layout, int64_t n,
                    cudaStream_t stream) {
  const OffsetCalculator<3> calc(layout);
  const unsigned int blocks = blocks_to_cover(n, kThreads * kUnroll);
  if (n < (int64_t{1} << 31)) {
    vector_add_strided_kernel<T, uint32_t><<<blocks, kThreads, 0, stream>>>(a, b, out, calc,
                                                                             static_cast<uint32_t>(n));
  } else {
    vector_add_strided_kernel<T, int64_t><<<blocks, kThreads, 0, stream>>>(a, b, out, calc, n);
  }
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

// The tiled path pays off when the output is a dense 2-D row-major matrix and an operand walks it
// column-major (a transpose); the other operand may have any strides.
bool wants_tiled_path(const StridedLayout<3>& layout) {
  if (layout.ndim != 2 || !layout.is_contiguous(0)) return false;
  const bool a_col_major = layout.strides[1][0] == 1 && layout.strides[1][1] != 1;
  const bool b_col_major = layout.strides[2][0] == 1 && layout.strides[2][1] != 1;
  return a_col_major || b_col_major;
}

void vector_add_cuda_into(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  const int64_t n = out.numel();
  const c10::cuda::CUDAGuard device_guard(out.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto layout = collapse_layout<3>("vector_add", {out, a, b});
  // 1-D (after merging) with a dense output: vector stores, and vector loads where the inputs allow.
  const bool one_d = layout.ndim <= 1 && layout.is_contiguous(0);
  TORCHOPS_DISPATCH_FLOAT_AND_INT_TYPES(out.scalar_type(), "vector_add_cuda", [&] {
    const scalar_t* pa = a.const_data_ptr<scalar_t>();
    const scalar_t* pb = b.const_data_ptr<scalar_t>();
    scalar_t* po = out.mutable_data_ptr<scalar_t>();
    if (one_d) {
      const int64_t a_stride = layout.ndim == 0 ? 1 : layout.strides[1][0];
      const int64_t b_stride = layout.ndim == 0 ? 1 : layout.strides[2][0];
      launch_1d(pa, a_stride, pb, b_stride, po, n, stream);
    } else if (wants_tiled_path(layout)) {
      launch_tiled(pa, pb, po, layout, stream);
    } else {
      launch_strided(pa, pb, po, layout, n, stream);
    }
  });
}

at::Tensor vector_add_cuda(const at::Tensor& a, const at::Tensor& b) {
  return binary_elementwise("vector_add", {"a", a}, {"b", b}, {TORCHOPS_FLOAT_AND_INT_DTYPES}, empty_like_dense_cuda,
                            vector_add_cuda_into);
}

void vector_add_out_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  binary_elementwise_out("vector_add_out", {"a", a}, {"b", b}, {"out", out}, {TORCHOPS_FLOAT_AND_INT_DTYPES},
                         vector_add_cuda_into);
}

}  // namespace

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  m.impl("vector_add", &vector_add_cuda);
  m.impl("vector_add_out", &vector_add_out_cuda);
}

}  // namespace torchops
