// rms_norm's forward kernel on the CUDA row engine (common/norm_cuda.cuh), shared by rms_norm.cu (plain
// rows) and add_rms_norm.cu (kAdd: the residual added in the same pass), two translation units so that
// the two sets of instantiations compile in parallel. See rms_norm.cu for the kernel's design.
#pragma once

#include <c10/cuda/CUDAFunctions.h>

#include <cstdint>
#include <cstdlib>
#include <type_traits>

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
template <typename T, typename W, int kSlots, int kC, bool kBlockPerRow, bool kAdd, int kMaxThreads, int kMinBlocks>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks)
    norm_forward_kernel(const T* __restrict__ x, int64_t x_row_stride, const T* __restrict__ residual,
                        int64_t residual_row_stride, T* __restrict__ h_out, const W* __restrict__ weight,
                        opmath_t<T> offset, T* __restrict__ y, opmath_t<T>* __restrict__ rstd, int64_t rows,
                        int64_t n, opmath_t<T> eps) {
  using A = opmath_t<T>;
  using S = RowSum<T>;
  using P = Processor<kBlockPerRow>;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  // The loops over the rest of a row longer than the kept chunks (block rows only): unrolled in a warp
  // kernel, where they never run, their loads took registers.
  constexpr int kRestUnroll = kBlockPerRow ? 4 : 1;
  __shared__ S scratch[kWarpSize];
  const int threads = P::threads();
  // exact: the vector path requires n % kC == 0. 32-bit column math (n < 2^31, checked at launch): with
  // 64-bit chunk indices ptxas spent ~2 registers per kept chunk on addresses.
  const int n_chunks = static_cast<int>(n / kC);
  const int tid = P::tid();  // this thread's first chunk of the row: chunks tid, tid + threads, ... below n_chunks
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * P::per_block() + P::in_block();
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * P::per_block();
  for (int64_t row = first_row; row < rows; row += row_step) {  // uniform over the processor
    const T* xr = x + row * x_row_stride;
    const T* rr = kAdd ? residual + row * residual_row_stride : nullptr;
    T* hr = kAdd ? h_out + row * n : nullptr;
    T* yr = y + row * n;
    Chunk cache[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int c = tid + s * threads;
      if (c < n_chunks) cache[s] = load_vector<T, kC>(xr, c);
    }
    if constexpr (kAdd) {
      Chunk other[kSlots];
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int c = tid + s * threads;
        if (c < n_chunks) other[s] = load_vector<T, kC>(rr, c);
      }
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int c = tid + s * threads;
        if (c < n_chunks) {
          cache[s] = add_rounded<A>(cache[s], other[s]);
          store_vector<T, kC>(hr, c, cache[s]);
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
    const A r = inverse_rms(ss, n, eps);
    if (rstd != nullptr && P::tid() == 0) rstd[row] = r;
    if (weight != nullptr) {
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
          if (c < n_chunks) store_vector<T, kC>(yr, c, normalize(cache[g + k], wc[k], r, offset));
        }
      }
    } else {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int c = tid + s * threads;
        if (c < n_chunks) store_vector<T, kC>(yr, c, normalize(cache[s], r));
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

// Staged rows (the engine's RowRing, as the backward's staged kernel): each block, or each cluster of blocks
// sharing a row, walks its chunk of rows with the next row's input (and residual) copied into shared memory
// while it works on one, the weight in registers for the block's life. Sweep 1 reads the row from its
// buffer (kAdd: adds the residual, stores residual_out) and sums its squares; sweep 2 reads it from the
// buffer again (kAdd: adds again, the same bits) and writes the output. Nothing is read from global memory
// twice, and the copies of the next row keep the memory busy through the row's reduction and writes.
template <typename T, typename W, bool kAdd, bool kCluster>
__global__ void __launch_bounds__(kStagedThreads, 1)
    norm_forward_staged_kernel(ForwardArgs<T, W> a, opmath_t<T> offset, opmath_t<T> eps, int64_t rows, int n,
                               int64_t rows_per_group, int part_chunks) {
  using A = opmath_t<T>;
  using S = RowSum<T>;
  constexpr int kC = vector_size<T>();
  constexpr int kU = kStagedUnits;
  constexpr int kTensors = kAdd ? 2 : 1;  // input (, residual)
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  using Ring = RowRing<T, kC, kTensors, kU, kStagedStages>;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  __shared__ S scratch[kWarpSize];
  __shared__ S cluster_sums[2];
  Ring ring(dynamic_smem);
  const int tid = threadIdx.x, threads = blockDim.x;
  const StagedPlace at_ = staged_place<kCluster, kC>(n, part_chunks, rows, rows_per_group);
  const int n_chunks = at_.n_chunks;
  const int64_t col = at_.col, begin = at_.begin, end = at_.end;
  auto fetch = [&](int64_t row, int stage) {
    const bool valid = row < end;
    const int64_t at = valid ? row : begin;  // no out-of-range pointer arithmetic past the rows
    const T* src[kTensors];
    src[0] = a.x + at * a.x_row_stride + col;
    if constexpr (kAdd) src[1] = a.residual + at * a.residual_row_stride + col;
    ring.fetch(stage, src, n_chunks, valid);
  };
#pragma unroll
  for (int s = 0; s < kStagedStages - 1; ++s) fetch(begin + s, s);
  const bool scale = a.weight != nullptr;
  WChunk wc[kU];
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    const int c = tid + k * threads;
    wc[k] = scale && c < n_chunks ? load_vector<W, kC>(a.weight + col, c) : WChunk{};
  }
  // The row's value of chunk k from the buffer: residual_out with kAdd.
  auto value = [&](int stage, int k) {
    if constexpr (kAdd) {
      return add_rounded<A>(ring.at(stage, 0, k), ring.at(stage, 1, k));
    } else {
      return ring.at(stage, 0, k);
    }
  };
  int stage = 0;
  for (int64_t row = begin; row < end; ++row) {
    fetch(row + kStagedStages - 1, stage == 0 ? kStagedStages - 1 : stage - 1);
    Ring::wait();
    T* yr = a.y + row * n + col;
    T* hr = kAdd ? a.h_out + row * n + col : nullptr;
    S ss = 0;
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int c = tid + k * threads;
      if (c < n_chunks) {
        const Chunk v = value(stage, k);
        if constexpr (kAdd) store_vector<T, kC>(hr, c, v);
        ss += chunk_squares<A>(v);
      }
    }
    ss = row_sum<true>(ss, scratch);
    if constexpr (kCluster) ss = cluster_row_sum(ss, cluster_sums, static_cast<int>((row - begin) & 1), at_.cluster);
    const A r = inverse_rms(ss, n, eps);
    if (a.rstd != nullptr && tid == 0 && at_.first == 0) a.rstd[row] = r;
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int c = tid + k * threads;
      if (c < n_chunks) {
        const Chunk v = value(stage, k);
        store_vector<T, kC>(yr, c, scale ? normalize(v, wc[k], r, offset) : normalize(v, r));
      }
    }
    stage = stage + 1 == kStagedStages ? 0 : stage + 1;
  }
  if constexpr (kCluster) cluster_barrier();  // no block exits while a peer may still read its cluster_sums
}

// Stream rows: a block per row keeping nothing in registers, for rows of 16-byte vectors (kC = T's vector
// width) from stream_threads' sizes up. Sweep 1 reads the row (kInFlight vectors a thread in flight) and sums
// its squares; sweep 2 reads it again and writes the output. Sweep 1's reads ask L2 to keep the lines and
// allocate in L1, so sweep 2 finds the row in L1 when the rows in flight on an SM fit it (stream_threads
// sizes the blocks for that), else in L2; sweep 2's reads and the stores ask L2 to drop their lines first.
// kAdd: sweep 1 reads input and residual once (drop) and writes residual_out (keep); sweep 2 reads
// residual_out back (stores do not fill L1: from L2). Blocks of any size up to kStreamMaxThreads. kWeight:
// whether weight is given (a runtime test per chunk cost 10-30 registers, and spills for 16-bit inputs).
// Against the kept-in-registers blocks (benchmarks/history/tuning/norm_rows_variants.cu, rms_norm forward,
// bf16 / f32): 2048x65536 140 / 318 us against 190 / 357 (a thread-block cluster per row, the long block),
// 4096x32768 134 / 266 against 153 / 297, 2-6% faster at N = 4096...16384; add_rms_norm 15-27% faster
// at rows longer than its kept units, slower at shorter ones (where it keeps the kept blocks).
constexpr int kStreamMaxThreads = 1024;
constexpr int kStreamInFlight = 4;

template <typename T, typename W, int kC, bool kAdd, bool kWeight>
__global__ void __launch_bounds__(kStreamMaxThreads)
    norm_forward_stream_kernel(const T* __restrict__ x, int64_t x_row_stride, const T* __restrict__ residual,
                               int64_t residual_row_stride, T* __restrict__ h_out, const W* __restrict__ weight,
                               opmath_t<T> offset, T* __restrict__ y, opmath_t<T>* __restrict__ rstd, int64_t rows,
                               int64_t n, opmath_t<T> eps, bool h_in_smem) {
  using A = opmath_t<T>;
  using S = RowSum<T>;
  using Chunk = AlignedVector<T, kC>;
  using WChunk = AlignedVector<W, kC>;
  constexpr int kIn = kStreamInFlight;
  __shared__ S scratch[kWarpSize];
  extern __shared__ __align__(16) unsigned char stream_smem[];
  // h_in_smem (kAdd): sweep 1 also keeps residual_out in shared memory, each thread its own chunks (its j-th
  // chunk at kept[j * threads]: no barrier), and sweep 2 reads it from there instead of from L2.
  Chunk* kept = reinterpret_cast<Chunk*>(stream_smem) + threadIdx.x;
  const int n_chunks = static_cast<int>(n / kC);  // exact: n % kC == 0; 32-bit (n < 2^31, checked at launch)
  const int threads = blockDim.x;
  const uint64_t keep = l2_policy<L2Evict::kLast>(), drop = l2_policy<L2Evict::kFirst>();
  const uint64_t first_read = kAdd ? drop : keep;  // input and residual are read once with kAdd
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * x_row_stride;
    const T* rr = kAdd ? residual + row * residual_row_stride : nullptr;
    T* hr = kAdd ? h_out + row * n : nullptr;
    T* yr = y + row * n;
    auto read = [&](int c) {  // sweep 1's value of chunk c (residual_out with kAdd, which it also stores)
      Chunk v = load_vector_l2<T, kC>(xr, c, first_read);
      if constexpr (kAdd) {
        v = add_rounded<A>(v, load_vector_l2<T, kC>(rr, c, drop));
        store_vector_l2(hr, c, v, keep);
      }
      return v;
    };
    // Each sweep takes a thread's chunks c, c + threads, ... in batches of kIn, all of a batch's loads
    // issued before any is used, then the chunks left one at a time.
    S ss = 0;
    int c = threadIdx.x, j = 0;
    for (; c + (kIn - 1) * threads < n_chunks; c += kIn * threads, j += kIn) {
      Chunk v[kIn];
      if constexpr (kAdd) {
        Chunk o[kIn];
#pragma unroll
        for (int k = 0; k < kIn; ++k) v[k] = load_vector_l2<T, kC>(xr, c + k * threads, drop);
#pragma unroll
        for (int k = 0; k < kIn; ++k) o[k] = load_vector_l2<T, kC>(rr, c + k * threads, drop);
#pragma unroll
        for (int k = 0; k < kIn; ++k) {
          v[k] = add_rounded<A>(v[k], o[k]);
          store_vector_l2(hr, c + k * threads, v[k], h_in_smem ? drop : keep);
          if (h_in_smem) kept[(j + k) * threads] = v[k];
        }
      } else {
#pragma unroll
        for (int k = 0; k < kIn; ++k) v[k] = load_vector_l2<T, kC>(xr, c + k * threads, keep);
      }
#pragma unroll
      for (int k = 0; k < kIn; ++k) ss += chunk_squares<A>(v[k]);
    }
    for (; c < n_chunks; c += threads, ++j) {
      const Chunk v = read(c);
      if (kAdd && h_in_smem) kept[j * threads] = v;
      ss += chunk_squares<A>(v);
    }
    ss = row_sum<true>(ss, scratch);
    const A r = inverse_rms(ss, n, eps);
    if (rstd != nullptr && threadIdx.x == 0) rstd[row] = r;
    const T* again = kAdd ? hr : xr;
    auto write = [&](int c, const Chunk& v, const WChunk& w) {
      store_vector_l2(yr, c, kWeight ? normalize(v, w, r, offset) : normalize(v, r), drop);
    };
    c = threadIdx.x;
    j = 0;
    for (; c + (kIn - 1) * threads < n_chunks; c += kIn * threads, j += kIn) {
      Chunk v[kIn];
      WChunk w[kIn];
#pragma unroll
      for (int k = 0; k < kIn; ++k) {
        v[k] = kAdd && h_in_smem ? kept[(j + k) * threads] : load_vector_l2<T, kC, false>(again, c + k * threads, drop);
        if constexpr (kWeight) w[k] = load_vector<W, kC>(weight, c + k * threads);
      }
#pragma unroll
      for (int k = 0; k < kIn; ++k) write(c + k * threads, v[k], w[k]);
    }
    for (; c < n_chunks; c += threads, ++j) {
      const Chunk v = kAdd && h_in_smem ? kept[j * threads] : load_vector_l2<T, kC, false>(again, c, drop);
      write(c, v, kWeight ? load_vector<W, kC>(weight, c) : WChunk{});
    }
  }
}


// add_rms_norm keeps two rows' worth in sweep 1 (input and residual): at 8 units a thread ptxas spilled
// ~400 bytes a thread, and its forward ran at ~60% of copy bandwidth.
struct AddForwardShapes {
  static constexpr int kUnits = 4, kThreads = 512, kLongUnits = 4, kLongThreads = 512, kMinBlocks = 1;
};

// The stream block for rows of `chunks` 16-byte vectors, or 0 where the kept-in-registers blocks were
// measured faster (short rows; add_rms_norm's rows up to its kept units). Plain rows: 4 vectors a thread
// (one sweep-1 batch) from 128 to 512 threads, 512 up to 4096 vectors, then 1024. Sweep 2 reads a row
// again from L1 only while the rows in flight on an SM fit it: at 1024 threads one or two long rows do; at
// 512 threads those rows fell out of L1 and ran 13-27% slower. 512 threads for 2048-4096 vectors, unless
// the blocks an SM holds at once then bring more rows than kStreamL1Bytes (stream_fits_l1): bf16 with a
// weight takes 32 registers, four 512-thread blocks an SM, and its 64 KiB rows at 4096x32768 ran 143 us
// at 512 threads against 132 at 1024 (768: 155; history/tuning/rms_norm_kernels.py); f32 (46 registers,
// two blocks) keeps 512. 672-thread blocks ran f32 8192x16384 at 389 us against 255 (a thread's 6-7
// vectors need more dependent rounds than 2 full batches).
// add_rms_norm reads residual_out back from L2 whatever the block, and ran fastest at 1024.
template <bool kAdd>
int stream_threads(int64_t chunks) {
  if constexpr (kAdd) {
    return chunks > int64_t{AddForwardShapes::kThreads} * AddForwardShapes::kUnits ? kStreamMaxThreads : 0;
  } else {
    if (chunks < 4 * 128) return 0;
    if (chunks <= 4 * 512) return round_to_warps(chunks / 4);
    return chunks <= 4096 ? 512 : kStreamMaxThreads;
  }
}

// The bytes of rows in flight on an SM that sweep 2 still finds in L1 (of its 256 KiB with no shared memory
// in use): three 64 KiB rows did, four did not.
constexpr int64_t kStreamL1Bytes = 192 * 1024;

// Whether `threads`-thread blocks of `kernel`, as many as an SM holds at once, keep their rows in L1.
template <typename Kernel>
bool stream_fits_l1(Kernel kernel, OccupancyCache& occupancy, int threads, int64_t row_bytes) {
  const int device = c10::cuda::current_device();
  const int resident = occupancy.get(device, threads, 0, [&] { return resident_blocks_per_sm(kernel, threads); });
  return resident * row_bytes <= kStreamL1Bytes;
}

// The staged kernel's launch where it takes the rows (see below), false elsewhere.
template <typename T, typename W, bool kAdd>
bool launch_forward_staged(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps, double offset,
                           cudaStream_t stream) {
  if constexpr (std::is_same_v<T, double>) {
    return false;
  } else {
    using A = opmath_t<T>;
    constexpr int kC = vector_size<T>();
    const int64_t n_chunks = n / kC;
    const int64_t min_chunks = kAdd ? tune_env("TORCHOPS_TUNE_FWD_ADD_MIN", 2048) : tune_env("TORCHOPS_TUNE_FWD_PLAIN_MIN", 1 << 30);
    if (n_chunks <= min_chunks) return false;
    const int device = c10::cuda::current_device();
    const StagedSplit split = staged_split(n_chunks, tune_env("TORCHOPS_TUNE_FWD_CTA_CHUNKS", 8192 / kC), device);
    if (split.cluster == 0) return false;
    const size_t smem = RowRing<T, kC, kAdd ? 2 : 1, kStagedUnits, kStagedStages>::bytes(split.threads);
    constexpr size_t kClusterSumBytes = 2 * sizeof(RowSum<T>);  // the kernel's cluster_sums
    if (smem + kClusterSumBytes > row_kernel_smem_limit<T>(device)) return false;
    const auto kernel = split.cluster > 1 ? norm_forward_staged_kernel<T, W, kAdd, true>
                                          : norm_forward_staged_kernel<T, W, kAdd, false>;
    static OccupancyCache occupancy[2];  // one per kernel
    allow_shared_memory(kernel, smem, kRowSumScratchBytes<T> + kClusterSumBytes);
    const RowGroups grid =
        resident_grid(kernel, occupancy[split.cluster > 1], device, split.threads, smem, rows, 1, split.cluster);
    launch_staged(kernel, split, grid.groups, smem, stream, a, static_cast<A>(offset), static_cast<A>(eps), rows,
                  static_cast<int>(n), grid.rows_per_group, split.part_chunks);
    return true;
  }
}

template <typename T, typename W, int kC, bool kAdd>
void launch_forward(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps, double offset,
                    cudaStream_t stream) {
  using Shapes = std::conditional_t<kAdd, AddForwardShapes, ForwardShapes>;
  using A = opmath_t<T>;
  // The kernels' column loops step a 32-bit index by up to kStreamInFlight blocks of threads: it must not wrap.
  constexpr int64_t kMaxStep = int64_t{1} << 16;
  static_assert(int64_t{kStreamMaxThreads} * kStreamInFlight * kC <= kMaxStep, "a step of the column loops");
  TORCH_CHECK(n < (int64_t{1} << 31) - kMaxStep,
              "rms_norm: rows of 2^31 - 2^16 elements or more are not supported on CUDA, got ", n);
  if constexpr (kC > 1) {
    if (launch_forward_staged<T, W, kAdd>(a, rows, n, eps, offset, stream)) return;
    int threads = stream_threads<kAdd>(n / kC);
    if (threads > 0) {
      const bool weighted = a.weight != nullptr;
      const auto kernel = weighted ? norm_forward_stream_kernel<T, W, kC, kAdd, true>
                                   : norm_forward_stream_kernel<T, W, kC, kAdd, false>;
      static OccupancyCache occupancy[2];  // one per kernel
      if (threads < kStreamMaxThreads &&
          !stream_fits_l1(kernel, occupancy[weighted], threads, n * static_cast<int64_t>(sizeof(T)))) {
        threads = kStreamMaxThreads;
      }
      const int64_t slots = (n / kC + threads - 1) / threads;
      const size_t smem = static_cast<size_t>(slots) * threads * kVectorBytes;
      const char* env = std::getenv("TORCHOPS_TUNE_ADD_SMEM");  // temporary tuning switch
      const bool h_in_smem = kAdd && env != nullptr && *env == '1' &&
                             smem + kRowSumScratchBytes<T> <= static_cast<size_t>(device_attribute(
                                 cudaDevAttrMaxSharedMemoryPerBlockOptin, c10::cuda::current_device()));
      if (h_in_smem) allow_shared_memory(kernel, smem, kRowSumScratchBytes<T>);
      kernel<<<blocks_to_cover(rows, 1), threads, h_in_smem ? smem : 0, stream>>>(
          a.x, a.x_row_stride, a.residual, a.residual_row_stride, a.h_out, a.weight, static_cast<A>(offset), a.y,
          a.rstd, rows, n, static_cast<A>(eps), h_in_smem);
      TORCHOPS_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  const RowConfig cfg = row_config<T, Shapes, kC>(n);
  const unsigned int blocks = blocks_to_cover(rows, cfg.rows_per_block());
  with_row_shape<T, kC, Shapes>(cfg, [&](auto slots, auto block_per_row, auto max_threads, auto min_blocks) {
    norm_forward_kernel<T, W, decltype(slots)::value, kC, decltype(block_per_row)::value, kAdd,
                        decltype(max_threads)::value, decltype(min_blocks)::value><<<blocks, cfg.threads, 0, stream>>>(
        a.x, a.x_row_stride, a.residual, a.residual_row_stride, a.h_out, a.weight, static_cast<A>(offset), a.y,
        a.rstd, rows, n, static_cast<A>(eps));
    TORCHOPS_CUDA_LAUNCH_CHECK();
  });
}

// add_rms_norm's launch (add_rms_norm.cu), for the dtype pairs of dispatch_norm_types.
template <typename T, typename W>
void launch_add_forward(const ForwardArgs<T, W>& a, int64_t rows, int64_t n, double eps, double offset, bool vectors,
                        cudaStream_t stream);

}  // namespace rms_norm_kernels
}  // namespace torchops
