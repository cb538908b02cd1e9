// How a normalisation's rows are launched on CUDA: one plan function per direction, from the op, the dtype,
// the row length and count and the device, to a small plan (kernel form, block and row geometry, shared
// memory). The kernels (cuda/norm_forward.cuh, cuda/norm_backward.cuh) take what the plan says; every choice
// below has its reason beside it, and its measurement in docs/design-decisions.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace torchops {
namespace norm_cuda {

constexpr int kPlanWarp = 32;
constexpr int kPlanVectorBytes = 16;

// What a launch normalises: rms_norm, add_rms_norm (a residual added first) or layer_norm.
enum class NormOp { kRms, kAddRms, kLayer };

// The row: `chunks` accesses of kC elements (16-byte vectors when `vectors`, else single elements) of a T of
// `elem_bytes` bytes (`f64`: double), `rows` of them.
struct RowShape {
  NormOp op;
  int elem_bytes;
  bool f64;
  bool vectors;
  int64_t n;
  int64_t rows;
  int64_t chunks() const { return vectors ? n / (kPlanVectorBytes / elem_bytes) : n; }
};

struct DeviceInfo {
  int sms;
  int cc_major;
  size_t smem_optin;  // dynamic shared memory a block may opt in to, next to the kernels' static scratch
};

// ---------------------------------------------------------------------------------------------- forward
// Register rows: a group of row_threads threads a row (a power of two; groups of up to a warp reduce by
// shuffles alone, larger ones take a whole block), `per` vectors a thread, the row read once into registers.
// Stream rows: a block (or a cluster of blocks) a row, two sweeps: the first reads the row and sums it, the
// second reads it again (from L1/L2, from shared memory, or input and residual again) and writes the output.
enum class ForwardForm { kRegisterRows, kStreamRows };
enum class Keep { kReadBack, kShared, kInputsAgain };

struct ForwardPlan {
  ForwardForm form = ForwardForm::kRegisterRows;
  int threads = 0;      // a block
  int row_threads = 0;  // register rows: a row's threads
  int per = 0;          // vectors a thread: register rows 1, 2, 4 or 8; stream rows 0 (a loop over the row) or fixed
  Keep keep = Keep::kReadBack;  // stream rows: where the second sweep finds the row
  int cluster = 1;              // stream rows: the blocks of the cluster a row is split over
  size_t smem = 0;              // dynamic shared memory a block
  int64_t blocks = 0;
};

constexpr int kStreamMaxThreads = 1024;
constexpr int kAddAgainThreads = 512;   // add_rms_norm's read-twice blocks
constexpr int kStreamInFlight = 4;      // a stream sweep's vectors in flight a thread
constexpr int kRegisterRowsPerSm = 32;  // register rows of 512 vectors: only on few rows (below)
constexpr int kMaxRegisterPer = 8;
constexpr int kMaxClusterBlocks = 8;
// Rows in flight on an SM that the stream's second read still finds in L1 (of 256 KiB): three 64 KiB rows did,
// four did not.
constexpr int64_t kStreamL1Bytes = 192 * 1024;

inline int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

inline int round_warps(int64_t threads) {
  return static_cast<int>((threads + kPlanWarp - 1) / kPlanWarp * kPlanWarp);
}

inline int64_t cover(int64_t items, int64_t per_block) {
  return std::max<int64_t>(1, std::min<int64_t>((items + per_block - 1) / per_block, INT32_MAX));
}

// Register rows for `chunks` vectors (or elements): `per` a thread on a power-of-two group of row_threads; groups
// of up to a warp share a 128-thread block with other rows, a larger one has its block to itself. Unless given:
// the fewest vectors a thread (up to 8) that let a warp take the row, element rows 8 a thread.
constexpr int kRegisterRowsMaxChunks = 1024;  // the kernels' launch bound: 1024 / per threads

inline ForwardPlan register_rows(bool vectors, int64_t chunks, int64_t rows, int row_threads = 0, int per = 0) {
  ForwardPlan p;
  p.form = ForwardForm::kRegisterRows;
  if (per == 0) {
    const int64_t warp_per = next_pow2((chunks + kPlanWarp - 1) / kPlanWarp);
    per = vectors ? static_cast<int>(std::min<int64_t>(kMaxRegisterPer, warp_per)) : kMaxRegisterPer;
    row_threads = static_cast<int>(next_pow2((chunks + per - 1) / per));
  }
  p.per = per;
  p.row_threads = row_threads;
  p.threads = row_threads > kPlanWarp ? row_threads : 4 * kPlanWarp;
  p.blocks = cover(rows, p.threads / row_threads);
  return p;
}

// The stream block for rows of `chunks` vectors, or 0 where register rows are used instead. Plain rows: 4
// vectors a thread from 32 to 512 threads, 512 up to 4096 vectors, then 1024 (a second read from L1 needs few
// rows in flight an SM). add_rms_norm: rows of 128-512 vectors in whole warps and of exactly 1024 or 2048 read
// input and residual twice (one vector a thread, or 512 threads with 2 or 4); from 2048 vectors, 1024 threads
// keeping residual_out in shared memory (or a cluster's, or read back from L2).
inline int stream_threads(bool add, int64_t chunks) {
  if (add) {
    if (chunks % kPlanWarp == 0 && chunks >= 4 * kPlanWarp && chunks <= kAddAgainThreads) {
      return static_cast<int>(chunks);
    }
    if (chunks == 2 * kAddAgainThreads || chunks == 4 * kAddAgainThreads) return kAddAgainThreads;
    return chunks >= 4 * kAddAgainThreads ? kStreamMaxThreads : 0;
  }
  if (chunks < 4 * kPlanWarp) return 0;
  if (chunks <= 4 * 512) return round_warps(chunks / 4);
  return chunks <= 4096 ? 512 : kStreamMaxThreads;
}

// How the stream kernel takes rows of `chunks` vectors in `threads`-thread blocks. Plain rows: exactly 8 vectors
// a thread, or 4 in blocks of 128-256 threads, run a straight-line kernel (a fixed count of batches), else the
// loop. add_rms_norm: see stream_threads; residual_out kept in shared memory where it fits (`fits_smem`).
inline ForwardPlan stream_rows(bool add, int64_t chunks, int threads, bool fits_smem, int cluster = 1) {
  ForwardPlan p;
  p.form = ForwardForm::kStreamRows;
  p.threads = threads;
  p.cluster = cluster;
  const int per = chunks % threads == 0 ? static_cast<int>(chunks / threads) : 0;
  if (add) {
    if (cluster > 1) {
      p.per = per;
      p.keep = Keep::kShared;
    } else if (threads <= kAddAgainThreads) {
      p.per = per;  // 1, 2 or 4 (stream_threads)
      p.keep = Keep::kInputsAgain;
    } else if (!fits_smem) {
      p.keep = Keep::kReadBack;
    } else {
      p.per = per == 4 || per == 8 ? per : 0;
      p.keep = Keep::kShared;
    }
  } else {
    p.per = per == 8 || (per == 4 && threads >= 4 * kPlanWarp && threads <= 8 * kPlanWarp) ? per : 0;
  }
  return p;
}

// The forward plan. `residency(plan)` is the number of blocks of the plan's kernel an SM holds at once (a
// cluster plan: clusters the device holds; 0: none fits).
template <typename Residency>
ForwardPlan plan_forward(const RowShape& s, const DeviceInfo& d, Residency&& residency) {
  const bool add = s.op == NormOp::kAddRms;
  const int64_t chunks = s.chunks();
  if (s.vectors) {
    // Rows of 128 or 256 vectors (plain): a warp a row, 4 or 8 vectors a lane, no barrier.
    if (!add && (chunks == 4 * kPlanWarp || chunks == 8 * kPlanWarp)) {
      return register_rows(true, chunks, s.rows, kPlanWarp, static_cast<int>(chunks / kPlanWarp));
    }
    // On few rows a row's latency from loads to stores is the kernel's time: rows of 512 vectors (add_rms_norm's
    // of 256 too) in registers, read once, a 128-thread block a row.
    const bool few_rows = s.rows <= int64_t{kRegisterRowsPerSm} * d.sms;
    if (!s.f64 && few_rows && (chunks == 512 || (add && chunks == 256))) {
      return register_rows(true, chunks, s.rows, 128, static_cast<int>(chunks / 128));
    }
    int threads = stream_threads(add, chunks);
    if (threads > 0) {
      const size_t elem_smem = static_cast<size_t>(kPlanVectorBytes);
      auto smem_for = [&](int64_t part) {
        return static_cast<size_t>((part + threads - 1) / threads) * threads * elem_smem;
      };
      int cluster = 1;
      if (add && smem_for(chunks) > d.smem_optin && d.cc_major >= 9) {
        // residual_out past one block's shared memory: the fewest blocks of a cluster whose parts are exactly 4
        // or 8 vectors a thread of 1024 threads and fit it
        for (int c = 2; c <= kMaxClusterBlocks && cluster == 1; ++c) {
          const int64_t t = int64_t{c} * kStreamMaxThreads;
          const int64_t per = chunks % t == 0 ? chunks / t : 0;
          if ((per == 4 || per == 8) && smem_for(chunks / c) <= d.smem_optin) cluster = c;
        }
      }
      const size_t row_smem = smem_for(chunks / cluster);
      ForwardPlan p = stream_rows(add, chunks / cluster, threads, add && row_smem <= d.smem_optin, cluster);
      p.smem = p.keep == Keep::kShared ? row_smem : 0;
      if (p.cluster > 1 && residency(p) == 0) {
        p = stream_rows(add, chunks, threads, false);  // no such cluster fits: one block a row, read back
      }
      if (!add && threads < kStreamMaxThreads) {
        // the second read finds the row in L1 only while the rows in flight on an SM fit it
        const int64_t row_bytes = s.n * s.elem_bytes;
        if (residency(p) * row_bytes > kStreamL1Bytes) p = stream_rows(false, chunks, kStreamMaxThreads, false);
      }
      p.blocks = std::min<int64_t>(cover(s.rows, 1), INT32_MAX / p.cluster) * p.cluster;
      return p;
    }
  }
  // Everything else in registers (short rows, element accesses), up to the kernels' launch bound; past that a
  // stream block reading the row (add_rms_norm: residual_out) back from L2.
  if (chunks <= kRegisterRowsMaxChunks) return register_rows(s.vectors, chunks, s.rows);
  ForwardPlan p;
  p.form = ForwardForm::kStreamRows;
  p.threads = kStreamMaxThreads;
  p.blocks = cover(s.rows, 1);
  return p;
}

// --------------------------------------------------------------------------------------------- backward
// Kept rows: a warp or a block a row, the row's first vectors kept in registers (a longer row's rest read twice),
// dweight (and dbias) accumulated in shared memory (global memory where a row's worth does not fit), one partial
// row a block. Staged rows: a block (or a cluster, past one block) walks its rows with the next row's tensors in
// flight into a shared-memory ring, dweight accumulated in registers.
enum class BackwardForm { kKeptRows, kStagedRows };

struct BackwardPlan {
  BackwardForm form = BackwardForm::kKeptRows;
  bool block_per_row = false;  // kept rows: a block (else a warp) a row
  int slots = 0;               // kept rows: vectors a thread kept in registers (1, 4 or 8)
  int threads = 0;
  int cluster = 1;      // staged rows
  int part_chunks = 0;  // staged rows: a block's chunks of a row
  bool dw_in_smem = true;
  size_t smem = 0;
  int64_t groups = 0;          // blocks (clusters) walking rows: one partial row each
  int64_t rows_per_group = 0;
};

constexpr int kWarpMaxSlots = 8;
constexpr int kKeptUnits = 4, kKeptThreads = 512;  // block rows: two rows' worth (x and dy) kept
constexpr int kStagedUnits = 4, kStagedThreads = 512, kStagedStages = 2;
constexpr int kStagedPartElements = 8192;
constexpr int kStagedShortChunks = 256;
// Rows of the warp's length that the staged kernel takes instead (plain rows from 256 vectors, add_rms_norm's
// from 64): three rows' worth kept in registers held 3-4 warps an SM.
constexpr int64_t kStagedFromChunks = 256, kStagedFromChunksDres = 64;

// Groups of blocks (or clusters) walking contiguous chunks of rows: as many as fit the device at once (as few
// dweight partial rows as possible, no launch per row); fixed for a device and shape, so deterministic.
inline void resident_groups(BackwardPlan& p, int64_t rows, int64_t rows_at_once, int64_t max_groups) {
  const int64_t wanted = (rows + rows_at_once - 1) / rows_at_once;
  const int64_t groups = std::max<int64_t>(1, std::min(max_groups, wanted));
  p.rows_per_group = (rows + groups - 1) / groups;
  p.groups = (rows + p.rows_per_group - 1) / p.rows_per_group;
}

// The backward plan. `dx`: grad_input wanted; `dres`: add_rms_norm's grad_residual_out given; `stat_bytes`: the
// accumulator's element size; `residency(plan)` as for the forward.
template <typename Residency>
BackwardPlan plan_backward(const RowShape& s, const DeviceInfo& d, bool dx, bool dres, int params,
                           int stat_bytes, Residency&& residency) {
  const int64_t chunks = s.chunks();
  const int64_t units = (s.n + kPlanVectorBytes / s.elem_bytes - 1) / (kPlanVectorBytes / s.elem_bytes);
  const bool warp = units <= int64_t{kPlanWarp} * kWarpMaxSlots;
  if (s.vectors && !s.f64 && dx && (!warp || chunks >= (dres ? kStagedFromChunksDres : kStagedFromChunks))) {
    constexpr int64_t kOneBlock = int64_t{kStagedUnits} * kStagedThreads;
    const int64_t part = kStagedPartElements / (kPlanVectorBytes / s.elem_bytes);
    const int64_t cluster = chunks <= kOneBlock ? 1 : (chunks + part - 1) / part;
    if (cluster == 1 || (cluster <= kMaxClusterBlocks && d.cc_major >= 9)) {
      BackwardPlan p;
      p.form = BackwardForm::kStagedRows;
      p.cluster = static_cast<int>(cluster);
      p.part_chunks = static_cast<int>((chunks + cluster - 1) / cluster);
      const int per_thread = p.part_chunks <= kStagedShortChunks ? 2 : kStagedUnits;
      p.threads = round_warps((p.part_chunks + per_thread - 1) / per_thread);
      const int tensors = dres ? 3 : 2;
      p.smem = size_t{kStagedStages} * tensors * kStagedUnits * p.threads * kPlanVectorBytes;
      if (p.smem <= d.smem_optin) {
        const int64_t fit = residency(p);
        if (fit > 0) {
          resident_groups(p, s.rows, 1, p.cluster > 1 ? fit : fit * d.sms);
          return p;
        }
      }
    }
  }
  BackwardPlan p;
  p.form = BackwardForm::kKeptRows;
  const int64_t per_block_rows = warp ? 4 : 1;
  if (warp) {  // element accesses: the most units only (each shape is one more kernel to compile)
    p.slots = !s.vectors ? kWarpMaxSlots : units <= kPlanWarp ? 1 : units <= 4 * kPlanWarp ? 4 : kWarpMaxSlots;
    p.threads = 4 * kPlanWarp;
  } else {  // a block just large enough to keep the row, or for longer rows the largest, the rest read twice
    p.block_per_row = true;
    p.slots = kKeptUnits;
    const int64_t threads = (units + kKeptUnits - 1) / kKeptUnits;
    p.threads = s.vectors && threads <= kKeptThreads ? std::max(2 * kPlanWarp, round_warps(threads))
                                                     : round_warps(std::min<int64_t>(kKeptThreads, threads));
  }
  const size_t acc = static_cast<size_t>(per_block_rows) * s.n * stat_bytes * params;
  p.dw_in_smem = params == 0 || acc <= d.smem_optin;
  p.smem = params > 0 && p.dw_in_smem ? acc : 0;
  resident_groups(p, s.rows, per_block_rows, int64_t{residency(p)} * d.sms);
  return p;
}

}  // namespace norm_cuda
}  // namespace torchops
