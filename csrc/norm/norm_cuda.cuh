// The CUDA row engine shared by the normalisations over the last dimension (rms_norm, add_rms_norm; a
// LayerNorm or QK-norm is one more file of row math on top of it). It fixes how rows map to threads:
//   - "row processors": one warp per row while a row fits 32 lanes x kWarpMaxUnits 16-byte units, else one
//     block per row. Block rows come in two shapes (ForwardShapes / BackwardShapes): blocks just large
//     enough to keep the row in registers, a few units per thread (small blocks, so several rows are in
//     flight per SM and one row's reduction overlaps another's loads), and for longer rows the largest
//     block, the rest of the row read a second time (then mostly from L2). The forward adds a third,
//     "stream" blocks keeping nothing, which it uses where they measured faster (rms_norm_forward.cuh), and
//     the backward a "staged" block whose next rows are copied into shared memory while it works on one
//     (RowRing), for longer rows a thread-block cluster of them sharing each row (staged_split,
//     cluster_row_sum);
//   - accesses in "chunks" of kC elements (a 16-byte vector when every row start is aligned, else one
//     element); chunk c of a row covers elements [c * kC, c * kC + kC), and a processor's thread t owns
//     chunks t, t + threads, ...;
//   - row sums: per thread in RowSum<T> (f64 for f32/f64 input, so the error of a long row's sum does not
//     grow with its length; f32 for 16-bit input, whose outputs round far coarser), then warp shuffles
//     (+ shared memory across the block's warps), a fixed tree: every thread gets the same bits;
//   - the backward's deterministic column partials: one partial row per block, summed in block order by
//     norm_column_reduce_kernel.
#pragma once

#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "../core/cuda_utils.cuh"
#include "../core/dispatch.h"

namespace torchops {
namespace norm_cuda {

using namespace torchops::cuda;

constexpr int kWarpMaxUnits = 8;   // 16-byte units per lane at most in warp-per-row mode
constexpr int kMinRowThreads = 64;

// Block-per-row shapes of a kernel family: kUnits 16-byte units per thread kept in registers on at most
// kThreads threads (also the launch bound); longer rows keep kLongUnits on kLongThreads, the rest read twice.
// kMinBlocks: the block kernels' launch-bound residency, which caps their registers (65536 / (threads x
// blocks)). The forward takes up to 128 registers a thread for 8 units: capped at 64 (two 512-thread
// blocks per SM), ptxas spilled 600-1400 bytes a thread for 16-bit inputs, so it stays at one.
struct ForwardShapes {  // one row's worth in registers
  static constexpr int kUnits = 8, kThreads = 512, kLongUnits = 4, kLongThreads = 1024, kMinBlocks = 1;
};
struct BackwardShapes {  // two rows' worth (x and dy): at 1024 threads ptxas spilled the bf16 variant
  static constexpr int kUnits = 4, kThreads = 512, kLongUnits = 4, kLongThreads = 512, kMinBlocks = 1;
};
constexpr int kReduceRows = 16;  // column reduction: partial rows summed in parallel per column

// Per-thread row sums: see above.
template <typename T>
using RowSum = std::conditional_t<is_16bit_float<T>, float, double>;

// Where a thread sits: the warp (kBlockPerRow = false) or the block handles a row.
template <bool kBlockPerRow>
struct Processor {
  __device__ static int tid() { return kBlockPerRow ? threadIdx.x : threadIdx.x % kWarpSize; }
  __device__ static int threads() { return kBlockPerRow ? blockDim.x : kWarpSize; }
  __device__ static int per_block() { return kBlockPerRow ? 1 : blockDim.x / kWarpSize; }
  __device__ static int in_block() { return kBlockPerRow ? 0 : threadIdx.x / kWarpSize; }
};

// Rows staged through shared memory: while a block works on one row, each thread's copies of its chunks of
// the next rows are in flight (cp.async) into a ring of kStages row buffers. A thread reads back only the
// chunks it copied itself, so the ring needs no barrier. A buffer holds the same row of kTensors tensors,
// kUnits chunks a thread (chunk tid + k * threads), laid out [stage][tensor][unit][thread]: a warp's 16-byte
// accesses are consecutive. Every fetch commits one copy group (empty past the block's rows), so wait()
// (at most kStages - 1 groups in flight) always means "the oldest fetched row is here".
template <typename T, int kC, int kTensors, int kUnits, int kStages>
struct RowRing {
  using Chunk = AlignedVector<T, kC>;
  static_assert(sizeof(Chunk) == kVectorBytes, "cp.async copies 16-byte vectors");

  static size_t bytes(int threads) { return size_t{kStages} * kTensors * kUnits * threads * sizeof(Chunk); }

  __device__ explicit RowRing(void* smem) : mine_(static_cast<Chunk*>(smem) + threadIdx.x) {}

  __device__ const Chunk& at(int stage, int tensor, int unit) const { return *slot(stage, tensor, unit); }

  // Copies this thread's chunks of the rows starting at row[t] into `stage` (none when !valid).
  __device__ void fetch(int stage, const T* const (&row)[kTensors], int n_chunks, bool valid) {
    if (valid) {
#pragma unroll
      for (int k = 0; k < kUnits; ++k) {
        const int c = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
        if (c < n_chunks) {
#pragma unroll
          for (int t = 0; t < kTensors; ++t) {
            copy_async_16(slot(stage, t, k), reinterpret_cast<const Chunk*>(row[t]) + c);
          }
        }
      }
    }
    copy_async_commit();
  }

  __device__ static void wait() { copy_async_wait<kStages - 1>(); }

 private:
  __device__ Chunk* slot(int stage, int tensor, int unit) const {
    return mine_ + ((stage * kTensors + tensor) * kUnits + unit) * static_cast<int>(blockDim.x);
  }

  Chunk* mine_;
};

// The sum of a row split over the CTAs of a cluster, from each CTA's block sum `v` (the same bits in all of
// its threads): published in slots[parity], then added in rank order after a cluster barrier, so every
// thread of the cluster gets the same bits. Every thread of the cluster must call it. Consecutive rows
// alternate `parity`, so one barrier a row is enough: a CTA writes a slot again two rows later, past the
// barrier of the row between, which no peer passes before its reads of the slot are done. (A CTA must not
// exit while a peer may still read its slots: one more cluster_barrier() after the last row.)
template <typename S>
__device__ __forceinline__ S cluster_row_sum(S v, S (&slots)[2], int parity, int cluster) {
  if (threadIdx.x == 0) slots[parity] = v;
  cluster_barrier();
  S total = 0;
  for (int q = 0; q < cluster; ++q) total += *cluster_peer(&slots[parity], q);
  return total;
}

// Hides a kept chunk's value from the optimizer between the sweeps: otherwise it keeps sweep 1's f32
// conversions of 16-bit values live until sweep 2 (twice the registers of the packed values) and spills.
template <typename T, int kC>
__device__ __forceinline__ void keep_packed(AlignedVector<T, kC>& v) {
  if constexpr (sizeof(v) % 4 == 0 && !std::is_same_v<T, double>) {
    auto* words = reinterpret_cast<unsigned int*>(&v);
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(v) / 4); ++i) asm volatile("" : "+r"(words[i]));
  }
}

// The static shared memory of a block-row kernel: row_sum's scratch, one RowSum<T> per warp.
template <typename T>
constexpr size_t kRowSumScratchBytes = kWarpSize * sizeof(RowSum<T>);

// The dynamic shared memory a block-row kernel may opt in to on `device`, next to row_sum's scratch.
template <typename T>
size_t row_kernel_smem_limit(int device) {
  return static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) -
         kRowSumScratchBytes<T>;
}

// Sum over the threads of one row processor. Block mode: every thread of the block must call it (it syncs);
// `scratch` holds one value per warp.
template <bool kBlockPerRow, typename S>
__device__ __forceinline__ S row_sum(S v, S* scratch) {
  v = warp_sum(v);
  if constexpr (kBlockPerRow) {
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < static_cast<int>(blockDim.x / kWarpSize) ? scratch[lane] : S(0);
    v = warp_sum(v);
    __syncthreads();  // scratch is reused by the next row
  }
  return v;
}

// row_sum for a block that walks rows, with one barrier a row instead of two: consecutive rows alternate
// halves of `scratch` (parity: the row count's), so a warp writes a half again two rows on, past the
// barrier of the row between, which no warp passes before its reads of the half are done (as in
// cluster_row_sum). Every thread of the block must call it, once a row; the same bits as row_sum<true>.
// group_row_sum: the same for a block that takes several rows at once, each on `group_warps` whole warps (row
// `group` of the block on warps [group * group_warps, (group + 1) * group_warps)); each thread gets its row's sum.
template <typename S>
__device__ __forceinline__ S group_row_sum(S v, S (&scratch)[2][kWarpSize], int parity, int group, int group_warps) {
  v = warp_sum(v);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (lane == 0) scratch[parity][warp] = v;
  __syncthreads();
  v = lane < group_warps ? scratch[parity][group * group_warps + lane] : S(0);
  return warp_sum(v);
}

template <typename S>
__device__ __forceinline__ S block_row_sum(S v, S (&scratch)[2][kWarpSize], int parity) {
  return group_row_sum(v, scratch, parity, 0, static_cast<int>(blockDim.x / kWarpSize));
}

// dst[col] = sum over p of partial[p, col], in a fixed order: thread (x, y) sums p = y, y + kReduceRows, ...
// in order, then row y == 0 adds the kReduceRows sums in order of y.
template <typename A, typename W>
__global__ void __launch_bounds__(kWarpSize * kReduceRows)
    norm_column_reduce_kernel(const A* __restrict__ partial, int64_t parts, int64_t n, W* __restrict__ dst) {
  __shared__ A sums[kReduceRows][kWarpSize + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarpSize + threadIdx.x;
  A v = 0;
  if (col < n) {
    for (int64_t p = threadIdx.y; p < parts; p += kReduceRows) v += partial[p * n + col];
  }
  sums[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    A total = sums[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < kReduceRows; ++k) total += sums[k][threadIdx.x];
    dst[col] = static_cast<W>(total);
  }
}

template <typename A, typename W>
void launch_column_reduce(const A* partial, int64_t parts, int64_t n, W* dst, cudaStream_t stream) {
  norm_column_reduce_kernel<A, W>
      <<<blocks_to_cover(n, kWarpSize), dim3(kWarpSize, kReduceRows), 0, stream>>>(partial, parts, n, dst);
  TORCHOPS_CUDA_LAUNCH_CHECK();
}

// Chunks of kC elements a thread keeps in registers per 16-byte unit of its share: one vector, or half a
// vector's worth of single elements (element-wise, each value takes a whole register; ptxas spilled
// with a full vector's worth).
template <typename T, int kC>
constexpr int chunks_per_unit() {
  return kC == 1 ? (vector_size<T>() / 2 > 1 ? vector_size<T>() / 2 : 1) : 1;
}

enum class RowShape { kWarp, kBlock, kLongBlock };

// `threads` rounded up to whole warps.
inline int round_to_warps(int64_t threads) {
  return static_cast<int>((threads + kWarpSize - 1) / kWarpSize * kWarpSize);
}

// The geometry of a launch. Row sizes are counted in 16-byte units of T.
struct RowConfig {
  RowShape shape;
  int units;    // warp mode: 16-byte units per lane kept (1, 4 or kWarpMaxUnits)
  int threads;  // per block
  int rows_per_block() const { return shape == RowShape::kWarp ? threads / kWarpSize : 1; }
};

// kC: the chunk width. Element-wise chunks (misaligned rows, rare) take two shapes only, the warp with
// kWarpMaxUnits and the long block: each shape is one more kernel per dtype pair to compile.
template <typename T, typename Shapes, int kC>
RowConfig row_config(int64_t n) {
  constexpr int kUnit = vector_size<T>();
  const int64_t n_units = (n + kUnit - 1) / kUnit;
  if (n_units <= int64_t{kWarpSize} * kWarpMaxUnits) {
    int units = n_units <= kWarpSize ? 1 : n_units <= 4 * kWarpSize ? 4 : kWarpMaxUnits;
    if (kC == 1) units = kWarpMaxUnits;
    return {RowShape::kWarp, units, kWarpBlockThreads};
  }
  if (kC > 1 && n_units <= int64_t{Shapes::kThreads} * Shapes::kUnits) {
    const int64_t threads = (n_units + Shapes::kUnits - 1) / Shapes::kUnits;
    return {RowShape::kBlock, Shapes::kUnits, std::max(kMinRowThreads, round_to_warps(threads))};
  }
  const int64_t threads = (n_units + Shapes::kLongUnits - 1) / Shapes::kLongUnits;
  return {RowShape::kLongBlock, Shapes::kLongUnits, round_to_warps(std::min<int64_t>(Shapes::kLongThreads, threads))};
}

// Calls fn(std::integral_constant<int, kSlots>, std::bool_constant<kBlockPerRow>,
// std::integral_constant<int, kMaxThreads>, std::integral_constant<int, kMinBlocks>) for the config: kSlots
// chunks of kC kept per thread, launch bounds (kMaxThreads, kMinBlocks).
template <typename T, int kC, typename Shapes, typename Fn>
void with_row_shape(const RowConfig& cfg, Fn&& fn) {
  constexpr int kPerUnit = chunks_per_unit<T, kC>();
  using Warp = std::integral_constant<int, kWarpBlockThreads>;
  using One = std::integral_constant<int, 1>;
  using Long = std::integral_constant<int, Shapes::kLongThreads>;
  if (cfg.shape == RowShape::kLongBlock) {
    return fn(std::integral_constant<int, Shapes::kLongUnits * kPerUnit>{}, std::true_type{}, Long{}, One{});
  }
  if constexpr (kC == 1) {  // row_config picks the warp with the most units, or the long block
    return fn(std::integral_constant<int, kWarpMaxUnits * kPerUnit>{}, std::false_type{}, Warp{}, One{});
  } else {
    if (cfg.shape == RowShape::kBlock) {
      return fn(std::integral_constant<int, Shapes::kUnits * kPerUnit>{}, std::true_type{},
                std::integral_constant<int, Shapes::kThreads>{}, std::integral_constant<int, Shapes::kMinBlocks>{});
    }
    switch (cfg.units) {
      case 1: return fn(std::integral_constant<int, 1 * kPerUnit>{}, std::false_type{}, Warp{}, One{});
      case 4: return fn(std::integral_constant<int, 4 * kPerUnit>{}, std::false_type{}, Warp{}, One{});
      default: return fn(std::integral_constant<int, kWarpMaxUnits * kPerUnit>{}, std::false_type{}, Warp{}, One{});
    }
  }
}

// A kernel's residency (blocks per SM, or clusters per device) for (device, block size, dynamic shared
// memory, cluster size), asked of the driver once per key: the occupancy query took host time on every
// call. Direct-mapped, lock-free: each slot packs key and value into one word, so a reader sees either a
// whole entry or a miss.
class OccupancyCache {
 public:
  template <typename Query>
  int get(int device, int threads, size_t smem, Query query, int cluster = 1) {
    if (device < 0 || device >= 64 || threads > 1024 || smem >= (size_t{1} << 24) || cluster < 1 || cluster > 15) {
      return query();
    }
    const uint64_t key = (static_cast<uint64_t>(cluster) << 41) | (static_cast<uint64_t>(device) << 35) |
                         (static_cast<uint64_t>(threads) << 24) | smem;
    std::atomic<uint64_t>& slot = slots_[(key ^ (key >> 9) ^ (key >> 24)) % kSlots];
    const uint64_t entry = slot.load(std::memory_order_relaxed);
    if (entry != 0 && (entry >> 16) == key) return static_cast<int>(entry & 0xffff);
    const int value = query();  // >= 0
    slot.store((key << 16) | static_cast<uint64_t>(std::min(value, 0xffff)), std::memory_order_relaxed);
    return value;
  }

 private:
  static constexpr int kSlots = 64;
  std::atomic<uint64_t> slots_[kSlots] = {};
};

// A grid as large as fits on the device at once, each group (a block, or a cluster of `cluster` blocks)
// looping over its own contiguous chunk of rows: as few dweight partial rows as possible in the backward,
// and no launch per row. Fixed for a device and shape: deterministic. rows_at_once: the rows a group takes
// at a time (a warp each, or the whole block's or cluster's one). No groups when no cluster of the blocks
// fits the device at all.
struct RowGroups {
  int64_t groups;
  int64_t rows_per_group;
};

template <typename... Params>
RowGroups resident_grid(void (*kernel)(Params...), OccupancyCache& occupancy, int device, int threads, size_t smem,
                        int64_t rows, int rows_at_once, int cluster = 1) {
  int64_t max_groups = 0;
  if (cluster == 1) {
    const int per_sm =
        occupancy.get(device, threads, smem, [&] { return resident_blocks_per_sm(kernel, threads, smem); });
    max_groups = static_cast<int64_t>(device_attribute(cudaDevAttrMultiProcessorCount, device)) * per_sm;
  } else {
    max_groups = occupancy.get(
        device, threads, smem, [&] { return resident_clusters(kernel, threads, smem, cluster); }, cluster);
  }
  if (max_groups < 1) return {0, 0};
  const int64_t wanted = (rows + rows_at_once - 1) / rows_at_once;
  const int64_t groups = std::max<int64_t>(1, std::min(max_groups, wanted));
  const int64_t rows_per_group = (rows + groups - 1) / groups;
  return {(rows + rows_per_group - 1) / rows_per_group, rows_per_group};
}

// Staged rows (the backward's staged kernel; history/tuning/rms_norm_kernels.py): each block, or each cluster
// of blocks sharing a row, walks its chunk of rows with the next row's tensors copied into a RowRing of
// kStagedStages buffers while it works on one, kStagedUnits 16-byte chunks a thread on up to kStagedThreads
// threads. A row of up to kStagedUnits x kStagedThreads chunks takes one block (backward, bf16 8192x16384:
// 289 us against 312 split in two); a longer one (sm_90+) a cluster of the fewest blocks of at most
// kStagedPartElements elements each, up to kMaxClusterBlocks (bf16 2048x65536: 342 us against 374 with
// 16384-element parts; f32 4096x32768: 524 against 584 with 4096-element parts).
// Rows of up to kStagedShortChunks chunks take blocks of two chunks a thread (32 to 128 threads): more
// warps on the SM for the same rows. Against four a thread (64-thread blocks), backward alone, us:
// add_rms_norm f32 65536x1024 278.4 / 282.1, bf16 4096x2048 30.0 / 32.3, rms_norm f32 65536x1024 214.1 /
// 217.8; rows of 64 chunks on 32 threads against 64 (one chunk each): add_rms_norm bf16 131072x512 154.4 /
// 190.3, f32 262144x256 287.6 / 314.6.
constexpr int kStagedUnits = 4, kStagedThreads = 512, kStagedStages = 2;
constexpr int kStagedPartElements = 8192;
constexpr int kStagedShortChunks = 256;

struct StagedSplit {
  int cluster;      // 0: the row does not fit a cluster (or the device has none)
  int part_chunks;  // each block's chunks of a row: block q of a cluster takes [q, q + 1) * part_chunks
  int threads;
};

template <typename T>
StagedSplit staged_split(int64_t n_chunks, int device) {
  constexpr int64_t kOneBlock = int64_t{kStagedUnits} * kStagedThreads;
  constexpr int64_t kPartChunks = kStagedPartElements / vector_size<T>();
  const int64_t cluster = n_chunks <= kOneBlock ? 1 : (n_chunks + kPartChunks - 1) / kPartChunks;
  if (cluster > 1 && (cluster > kMaxClusterBlocks || device_attribute(cudaDevAttrComputeCapabilityMajor, device) < 9)) {
    return {0, 0, 0};
  }
  const int part_chunks = static_cast<int>((n_chunks + cluster - 1) / cluster);
  const int per_thread = part_chunks <= kStagedShortChunks ? 2 : kStagedUnits;
  return {static_cast<int>(cluster), part_chunks, round_to_warps((part_chunks + per_thread - 1) / per_thread)};
}

// Where a staged block sits: its chunks [first, first + n_chunks) of every row (columns from col), and its
// group's rows [begin, end).
struct StagedPlace {
  int cluster, first, n_chunks;
  int64_t col, group, begin, end;
};

template <bool kCluster, int kC>
__device__ __forceinline__ StagedPlace staged_place(int n, int part_chunks, int64_t rows, int64_t rows_per_group) {
  StagedPlace p;
  p.cluster = kCluster ? static_cast<int>(cluster_blocks()) : 1;
  p.first = kCluster ? static_cast<int>(cluster_rank()) * part_chunks : 0;
  p.n_chunks = min(part_chunks, n / kC - p.first);
  p.col = static_cast<int64_t>(p.first) * kC;
  p.group = blockIdx.x / p.cluster;
  p.begin = p.group * rows_per_group;
  p.end = p.begin + rows_per_group < rows ? p.begin + rows_per_group : rows;
  return p;
}

// Launches a staged kernel: in clusters when split.cluster > 1.
template <typename... Params, typename... Args>
void launch_staged(void (*kernel)(Params...), const StagedSplit& split, int64_t groups, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  launch_in_clusters(kernel, static_cast<unsigned int>(groups * split.cluster), split.threads, smem, split.cluster,
                     stream, std::forward<Args>(args)...);
}

// Every row start of a T tensor with this row stride (and base) 16-byte aligned for n-element rows.
template <typename T>
bool rows_aligned(const T* base, int64_t row_stride, int64_t n) {
  constexpr int kUnit = vector_size<T>();
  return n % kUnit == 0 && row_stride % kUnit == 0 && is_aligned(base);
}

// The weight aligned for its own kUnit-wide (T's vector width) loads.
template <typename T, typename W>
bool weight_aligned(const W* weight) {
  return weight == nullptr || is_aligned(weight, static_cast<int>(sizeof(W)) * vector_size<T>());
}

}  // namespace norm_cuda
}  // namespace torchops
