// rms_norm's forward kernel on the CUDA row engine (common/norm_cuda.cuh), shared by rms_norm.cu (plain
// rows) and add_rms_norm.cu (kAdd: the residual added in the same pass), two translation units so that
// the two sets of instantiations compile in parallel. See rms_norm.cu for the kernel's design.
#pragma once

#include <cstdlib>
#include <type_traits>

#include <c10/util/BFloat16.h>

#include "../common/dispatch.h"
#include "../common/norm_cuda.cuh"

namespace torchops {
namespace rms_norm_kernels {

using namespace torchops::norm_cuda;

constexpr int kWeightGroup = 4;

template <typename A, typename S>
__device__ __forceinline__ A inverse_rms(S sum_squares, int64_t n, A eps) {
  // mean, + eps, 1/sqrt in the working precision: F.rms_norm's order
  return A(1) / sqrt(static_cast<A>(sum_squares / static_cast<S>(n)) + eps);
}

template <typename A, typename T, int kC>
__device__ __forceinline__ A chunk_squares(const AlignedVector<T, kC>& v) {
  A s = 0;
#pragma unroll
  for (int e = 0; e < kC; ++e) {
    const A a = static_cast<A>(v.val[e]);
    s += a * a;
  }
  return s;
}

template <typename A, typename T, int kC>
__device__ __forceinline__ AlignedVector<T, kC> add_rounded(const AlignedVector<T, kC>& a,
                                                            const AlignedVector<T, kC>& b) {
  AlignedVector<T, kC> out;
#pragma unroll
  for (int e = 0; e < kC; ++e) out.val[e] = static_cast<T>(static_cast<A>(a.val[e]) + static_cast<A>(b.val[e]));
  return out;
}

// EXPERIMENT: streaming (evict-first) accesses for the data read or written once.
template <bool kStream, typename T, int kC>
__device__ __forceinline__ AlignedVector<T, kC> load_once(const T* base, int i) {
  if constexpr (kStream && sizeof(AlignedVector<T, kC>) == 16) {
    const int4 v = __ldcs(reinterpret_cast<const int4*>(base) + i);
    AlignedVector<T, kC> out;
    memcpy(&out, &v, 16);
    return out;
  } else {
    return load_vector<T, kC>(base, i);
  }
}
template <bool kStream, typename T, int kC>
__device__ __forceinline__ void store_once(T* base, int i, const AlignedVector<T, kC>& v) {
  if constexpr (kStream && sizeof(AlignedVector<T, kC>) == 16) {
    int4 w;
    memcpy(&w, &v, 16);
    __stcs(reinterpret_cast<int4*>(base) + i, w);
  } else {
    store_vector<T, kC>(base, i, v);
  }
}

template <typename T, typename W, int kC, typename A>
__device__ __forceinline__ AlignedVector<T, kC> normalize(const AlignedVector<T, kC>& v,
                                                          const AlignedVector<W, kC>& w, A r, A offset) {
  AlignedVector<T, kC> out;
#pragma unroll
  for (int e = 0; e < kC; ++e) {
    out.val[e] = static_cast<T>(static_cast<A>(v.val[e]) * r * (static_cast<A>(w.val[e]) + offset));
  }
  return out;
}

template <typename T, int kC, typename A>
__device__ __forceinline__ AlignedVector<T, kC> normalize(const AlignedVector<T, kC>& v, A r) {
  AlignedVector<T, kC> out;
#pragma unroll
  for (int e = 0; e < kC; ++e) out.val[e] = static_cast<T>(static_cast<A>(v.val[e]) * r);
  return out;
}

// rstd may be null (the plain ops); otherwise rstd[row]. residual / h_out only with kAdd.
// kCluster: a row is split over the CTAs of a thread-block cluster (block mode only), CTA k of the cluster
// taking the contiguous part [k * part_chunks, (k + 1) * part_chunks) of the row's chunks; their sums of
// squares meet in distributed shared memory. Long rows then keep a cluster's worth in registers with small
// CTAs, several per SM, so one row's reduction overlaps another's loads (one 512-thread CTA holding a
// whole 64 KiB row left the SM idle during each row's reduction: 84% of copy).
template <typename T, typename W, int kSlots, int kC, bool kBlockPerRow, bool kAdd, int kMaxThreads, int kMinBlocks,
          bool kCluster = false, bool kPrefetchWeight = false, bool kStream = false>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks)
    norm_forward_kernel(const T* __restrict__ x, int64_t x_row_stride, const T* __restrict__ residual,
                        int64_t residual_row_stride, T* __restrict__ h_out, const W* __restrict__ weight,
                        opmath_t<T> offset, T* __restrict__ y, opmath_t<T>* __restrict__ rstd, int64_t rows,
                        int64_t n, opmath_t<T> eps, int part_chunks = 0) {
  using A = opmath_t<T>;
  using S = RowSum<T>;
  using P = Processor<kBlockPerRow>;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  static_assert(!kCluster || kBlockPerRow, "a cluster splits block rows");
  // The loops over the rest of a row longer than the kept chunks (block rows only): unrolled in a warp
  // kernel, where they never run, their loads took registers.
  constexpr int kRestUnroll = kBlockPerRow ? 4 : 1;
  __shared__ S scratch[kWarpSize];
  const int threads = P::threads();
  // exact: the vector path requires n % kC == 0. 32-bit column math (n < 2^31, checked at launch): with
  // 64-bit chunk indices ptxas spent ~2 registers per kept chunk on addresses.
  int n_chunks = static_cast<int>(n / kC);
  int tid = P::tid();  // this thread's first chunk of the row: chunks tid, tid + threads, ... below n_chunks
  int64_t first_row = static_cast<int64_t>(blockIdx.x) * P::per_block() + P::in_block();
  int64_t row_step = static_cast<int64_t>(gridDim.x) * P::per_block();
  [[maybe_unused]] int cluster_size = 1;
  [[maybe_unused]] unsigned int rank = 0;
  if constexpr (kCluster) {
    cluster_size = static_cast<int>(cluster_blocks());
    rank = cluster_rank();
    tid += static_cast<int>(rank) * part_chunks;
    n_chunks = min(n_chunks, static_cast<int>(rank + 1) * part_chunks);
    first_row = blockIdx.x / cluster_size;
    row_step = gridDim.x / cluster_size;
  }
  // The cluster's partial sums, one slot per row parity: a CTA rewrites a slot two rows later, after the
  // next row's cluster barrier, which every CTA reaches only after reading this row's partials.
  [[maybe_unused]] __shared__ S cluster_partial[2];
  int parity = 0;
  for (int64_t row = first_row; row < rows; row += row_step, parity ^= 1) {  // uniform over the processor
    const T* xr = x + row * x_row_stride;
    const T* rr = kAdd ? residual + row * residual_row_stride : nullptr;
    T* hr = kAdd ? h_out + row * n : nullptr;
    T* yr = y + row * n;
    Chunk cache[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int c = tid + s * threads;
      if (c < n_chunks) cache[s] = load_once<kStream, T, kC>(xr, c);
    }
    [[maybe_unused]] WChunk wpre[kPrefetchWeight ? kSlots : 1];
    if constexpr (kPrefetchWeight) {  // EXPERIMENT: the weight's loads issued with the row's
      if (weight != nullptr) {
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          const int c = tid + s * threads;
          if (c < n_chunks) wpre[s] = load_vector<W, kC>(weight, c);
        }
      }
    }
    if constexpr (kAdd) {
      Chunk other[kSlots];
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int c = tid + s * threads;
        if (c < n_chunks) other[s] = load_once<kStream, T, kC>(rr, c);
      }
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int c = tid + s * threads;
        if (c < n_chunks) {
          cache[s] = add_rounded<A>(cache[s], other[s]);
          store_once<kStream, T, kC>(hr, c, cache[s]);
        }
      }
    }
    S ss = 0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (tid + s * threads < n_chunks) ss += chunk_squares<A>(cache[s]);
    }
#pragma unroll kRestUnroll
    for (int c = tid + kSlots * threads; c < n_chunks; c += threads) {
      Chunk v = load_vector<T, kC>(xr, c);
      if constexpr (kAdd) {
        v = add_rounded<A>(v, load_vector<T, kC>(rr, c));
        store_vector<T, kC>(hr, c, v);
      }
      ss += chunk_squares<A>(v);
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) keep_packed(cache[s]);
    ss = row_sum<kBlockPerRow>(ss, scratch);
    if constexpr (kCluster) {
      if (threadIdx.x == 0) cluster_partial[parity] = ss;
      cluster_barrier();  // release this CTA's partial, acquire every peer's
      ss = 0;
      for (int k = 0; k < cluster_size; ++k) ss += *cluster_peer(&cluster_partial[parity], k);  // rank order
    }
    const A r = inverse_rms(ss, n, eps);
    if (rstd != nullptr && P::tid() == 0 && rank == 0) rstd[row] = r;
    if (kPrefetchWeight && weight != nullptr) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int c = tid + s * threads;
        if (c < n_chunks) store_once<kStream, T, kC>(yr, c, normalize(cache[s], wpre[kPrefetchWeight ? s : 0], r, offset));
      }
    } else if (weight != nullptr) {
#pragma unroll
      for (int g = 0; g < kSlots; g += kWeightGroup) {
        WChunk wc[kWeightGroup];
#pragma unroll
        for (int k = 0; k < kWeightGroup && g + k < kSlots; ++k) {
          const int c = tid + (g + k) * threads;
          if (c < n_chunks) wc[k] = load_vector<W, kC>(weight, c);
        }
#pragma unroll
        for (int k = 0; k < kWeightGroup && g + k < kSlots; ++k) {
          const int c = tid + (g + k) * threads;
          if (c < n_chunks) store_once<kStream, T, kC>(yr, c, normalize(cache[g + k], wc[k], r, offset));
        }
      }
    } else {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int c = tid + s * threads;
        if (c < n_chunks) store_once<kStream, T, kC>(yr, c, normalize(cache[s], r));
      }
    }
#pragma unroll kRestUnroll
    for (int c = tid + kSlots * threads; c < n_chunks; c += threads) {
      const Chunk v = kAdd ? load_vector<T, kC>(hr, c) : load_vector<T, kC>(xr, c);
      if (weight != nullptr) {
        store_vector<T, kC>(yr, c, normalize(v, load_vector<W, kC>(weight, c), r, offset));
      } else {
        store_vector<T, kC>(yr, c, normalize(v, r));
      }
    }
  }
  if constexpr (kCluster) cluster_barrier();  // peers may still read this CTA's partials: stay until they are done
}

// The pointers of one forward launch.
template <typename T, typename W>
struct ForwardArgs {
  const T* x;
  int64_t x_row_stride;
  const T* residual;  // null: plain rms_norm
  int64_t residual_row_stride;
  T* h_out;
  const W* weight;
  T* y;
  opmath_t<T>* rstd;
};

// add_rms_norm keeps two rows' worth in sweep 1 (input and residual): at 8 units a thread ptxas spilled
// ~400 bytes a thread, and its forward ran at ~60% of copy bandwidth.
struct AddForwardShapes {
  static constexpr int kUnits = 4, kThreads = 512, kLongUnits = 4, kLongThreads = 512, kMinBlocks = 1;
};

// EXPERIMENT KNOBS (removed after measuring): read once per process.
inline int norm_knob(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != 0 ? std::atoi(v) : fallback;
}
inline int cluster_cta_threads() {  // 0: no clusters
  static const int v = norm_knob("TORCHOPS_NORM_CLUSTER", 256);
  return v;
}
inline int warp_min_blocks() {
  static const int v = norm_knob("TORCHOPS_NORM_WARP_MB", 1);
  return v;
}
inline bool streaming_accesses() {
  static const bool v = norm_knob("TORCHOPS_NORM_STREAM", 0) != 0;
  return v;
}
inline bool warp_prefetch_weight() {
  static const bool v = norm_knob("TORCHOPS_NORM_WPRE", 0) != 0;
  return v;
}
template <typename T, typename W>
constexpr bool kExperimentTypes =
    std::is_same_v<T, W> && (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>);

constexpr int kMaxCluster = 8;  // the portable cluster size limit

template <typename T, typename W, int kUnits, bool kAdd, int kThreads, int kMinBlocks, bool kStream = false>
void launch_forward_cluster(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, int cluster, int threads,
                            int part_chunks, double eps, double offset, cudaStream_t stream) {
  constexpr int kC = vector_size<T>();
  const auto kernel = norm_forward_kernel<T, W, kUnits, kC, true, kAdd, kThreads, kMinBlocks, true, false, kStream>;
  const int64_t clusters = std::min<int64_t>(rows, INT32_MAX / kMaxCluster);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned int>(clusters * cluster));
  config.blockDim = dim3(threads);
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, a.x, a.x_row_stride, a.residual, a.residual_row_stride, a.h_out,
                                    a.weight, static_cast<opmath_t<T>>(offset), a.y, a.rstd, rows, n,
                                    static_cast<opmath_t<T>>(eps), part_chunks));
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

// A row too long for one CTA's registers split over a cluster of up to kMaxCluster CTAs of cta_threads
// threads x kUnits units; false when the row is short enough for one CTA, too long for a cluster, or the
// device has no clusters.
template <typename T, typename W, typename Shapes, bool kAdd>
bool try_launch_forward_cluster(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps, double offset,
                                cudaStream_t stream, int device) {
  constexpr int kC = vector_size<T>();
  constexpr int kUnits = Shapes::kUnits;
  const int cta_threads = cluster_cta_threads();
  if (cta_threads == 0 || device_attribute(cudaDevAttrComputeCapabilityMajor, device) < 9) return false;
  const int64_t n_chunks = n / kC;
  const int64_t per_cta = static_cast<int64_t>(cta_threads) * kUnits;
  const int64_t single = kAdd ? std::max<int64_t>(per_cta, int64_t{Shapes::kThreads} * kUnits) : per_cta;
  if (n_chunks <= single || n_chunks > per_cta * kMaxCluster) return false;
  const int cluster = static_cast<int>((n_chunks + per_cta - 1) / per_cta);
  const int part = static_cast<int>((n_chunks + cluster - 1) / cluster);
  const int warps = ((part + kUnits - 1) / kUnits + kWarpSize - 1) / kWarpSize;
  const int threads = std::max(kMinRowThreads, warps * kWarpSize);
  if constexpr (kExperimentTypes<T, W>) {
    if (cta_threads == 128) {
      launch_forward_cluster<T, W, kUnits, kAdd, 128, 4>(a, rows, n, cluster, threads, part, eps, offset, stream);
      return true;
    }
    if (cta_threads == 512) {
      launch_forward_cluster<T, W, kUnits, kAdd, 512, 1>(a, rows, n, cluster, threads, part, eps, offset, stream);
      return true;
    }
    if (cta_threads == 256 && streaming_accesses()) {
      launch_forward_cluster<T, W, kUnits, kAdd, 256, 2, true>(a, rows, n, cluster, threads, part, eps, offset,
                                                               stream);
      return true;
    }
  }
  if (cta_threads != 256) return false;
  launch_forward_cluster<T, W, kUnits, kAdd, 256, 2>(a, rows, n, cluster, threads, part, eps, offset, stream);
  return true;
}

template <typename T, typename W, int kC, bool kAdd>
void launch_forward(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps, double offset,
                    cudaStream_t stream, int device) {
  using Shapes = std::conditional_t<kAdd, AddForwardShapes, ForwardShapes>;
  // The kernel's column loops step a 32-bit index by up to a block's threads: it must not wrap.
  TORCH_CHECK(n <= INT32_MAX - Shapes::kLongThreads * kC,
              "rms_norm: rows of 2^31 - 2^13 elements or more are not supported on CUDA, got ", n);
  if constexpr (kC > 1) {
    if (try_launch_forward_cluster<T, W, Shapes, kAdd>(a, rows, n, eps, offset, stream, device)) return;
  }
  const RowConfig cfg = row_config<T, Shapes, kC>(n);
  const unsigned int blocks = blocks_to_cover(rows, cfg.rows_per_block());
  with_row_shape<T, kC, Shapes>(cfg, [&](auto slots, auto block_per_row, auto max_threads, auto min_blocks) {
    constexpr int kSlots = decltype(slots)::value;
    constexpr bool kBlockPerRow = decltype(block_per_row)::value;
    if constexpr (!kBlockPerRow && kC > 1 && kExperimentTypes<T, W>) {
      const bool prefetch = warp_prefetch_weight();
      auto go = [&](auto min_blocks_c, auto prefetch_c) {
        norm_forward_kernel<T, W, kSlots, kC, false, kAdd, decltype(max_threads)::value,
                            decltype(min_blocks_c)::value, false, decltype(prefetch_c)::value>
            <<<blocks, cfg.threads, 0, stream>>>(a.x, a.x_row_stride, a.residual, a.residual_row_stride, a.h_out,
                                                 a.weight, static_cast<opmath_t<T>>(offset), a.y, a.rstd, rows, n,
                                                 static_cast<opmath_t<T>>(eps));
        TORCHOPS_CUDA_LAUNCH_CHECK();
      };
      using Six = std::integral_constant<int, 6>;
      using One = std::integral_constant<int, 1>;
      if constexpr (kSlots <= 4) {  // 6 blocks: <= 80 registers (8 slots spilled)
        if (warp_min_blocks() == 6) {
          return prefetch ? go(Six{}, std::true_type{}) : go(Six{}, std::false_type{});
        }
      }
      if (prefetch) return go(One{}, std::true_type{});
    }
    if constexpr (kC > 1 && kExperimentTypes<T, W>) {
      if (streaming_accesses()) {
        norm_forward_kernel<T, W, kSlots, kC, kBlockPerRow, kAdd, decltype(max_threads)::value,
                            decltype(min_blocks)::value, false, false, true><<<blocks, cfg.threads, 0, stream>>>(
            a.x, a.x_row_stride, a.residual, a.residual_row_stride, a.h_out, a.weight,
            static_cast<opmath_t<T>>(offset), a.y, a.rstd, rows, n, static_cast<opmath_t<T>>(eps));
        TORCHOPS_CUDA_LAUNCH_CHECK();
        return;
      }
    }
    norm_forward_kernel<T, W, kSlots, kC, kBlockPerRow, kAdd, decltype(max_threads)::value,
                        decltype(min_blocks)::value><<<blocks, cfg.threads, 0, stream>>>(
        a.x, a.x_row_stride, a.residual, a.residual_row_stride, a.h_out, a.weight, static_cast<opmath_t<T>>(offset),
        a.y, a.rstd, rows, n, static_cast<opmath_t<T>>(eps));
    TORCHOPS_CUDA_LAUNCH_CHECK();
  });
}

// add_rms_norm's launch (add_rms_norm.cu), for the dtype pairs of dispatch_norm_types.
template <typename T, typename W>
void launch_add_forward(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps, double offset, bool vectors,
                        cudaStream_t stream, int device);

}  // namespace rms_norm_kernels
}  // namespace torchops
