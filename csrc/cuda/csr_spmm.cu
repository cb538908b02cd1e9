// The sparse x dense engine on CUDA: out[i, h, :] = reduce over row i's nonzeros p of w(p, h) * dense[col[p], h, :]
// (csr_spmm, spmm_reduce, _spmm_reduce_forward, _csr_spmm_with_transpose), the gradients of a max/min
// (_spmm_reduce_backward), and the registration of every sparse op's CUDA kernel.
//
// Work split: merge path over rows + nonzeros (csr/csr_cuda.cuh), one warp per unit of D items, so
// power-law rows (a few with 10^4..10^5 nonzeros, most with a handful) spread evenly over the GPU.
// Inside a unit:
//   - the unit's nonzeros stream through a 32-entry window: lane l loads (col, weight) of nonzero w + l
//     (coalesced), and shuffles hand them to the lanes that gather the dense rows;
//   - the columns: a group of G lanes owns one vector of V columns per lane (V up to 16 bytes: float4 for
//     f32, 8 x bf16). Narrow D uses small groups, so the warp takes 32 / G nonzeros at once (D = 32 f32: 8
//     lanes of float4, 4 nonzeros at once); wide D uses whole warps over column tiles of 32 V columns
//     (grid.y: D = 512 f32 is 4 tiles of 128 columns), or narrower groups and tiles for long rows over a
//     `dense` larger than the L2 (launch_spmm); each head is its own set of column tiles (grid.y again), its
//     weights values[p, h];
//   - kBatch nonzeros per group are gathered before they are accumulated, so several dense rows are in
//     flight; row ends come 32 rows at a time through a second window (no load of its own per row);
//   - rows that end inside the unit are stored; the unit's last row, which continues in the next unit(s),
//     is left in a carry buffer, and merge_carry_kernel combines each row's carries in unit order.
// The reductions (Accumulate): sums (mean divides where the row is stored); max / min as the max of
// sign * product with the position of the first nonzero reaching it (NaN above every number, ties to the
// lower position: the same choice whatever the partition, since that combine is exact and order-free);
// and the max/min backward's masked sum over A^T, where a nonzero counts only in the output columns that
// selected it.
// Accumulation is f32 for f16/bf16/f32 and f64 for f64. The result is deterministic: every partial sum is
// taken in a fixed order that depends only on the shapes and the GPU (SM count, L2 size, the kernel's
// occupancy), never on scheduling.
// For f16/bf16 (and every max / min) a row split across units is completed from the parts in opmath: the
// unit that ends it leaves its part in the `head` buffer and the carry kernel stores the combination.
// (Storing that part and adding the carries to it would round twice, which cancellation between the parts
// can turn into a large error.)
// Indices are never validated here (no host sync): see csr_cuda.cuh for how malformed ones stay in bounds.
#include <ATen/core/Tensor.h>
#include <ATen/ops/index_select.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>

#include "../core/cuda_utils.cuh"
#include "../core/dispatch.h"
#include "../core/empty.h"
#include "../csr/csr.h"
#include "../csr/csr_cuda.cuh"

namespace torchops {
namespace {

using namespace torchops::cuda;

enum class Accumulate {
  kSum,        // acc += w * x
  kSelect,     // max of w * x (w carries the sign: min is the max of the negated products), and where
  kMaskedSum,  // acc += w * x where the gathered row's selection `sel` equals the nonzero's `tag`
};

template <typename T, typename Index>
struct SpmmArgs : MergePathArgs<Index>, SpmmInputs<T> {  // N: the columns of one head (D)
  const Index* tag;  // kMaskedSum: each nonzero's tag
  const Index* sel;  // kMaskedSum: the gathered rows' selections, rows of H * D (row stride sel_ld)
  int64_t sel_ld;
  T* out;      // M x H x D, dense
  Index* arg;  // kSelect: the selected positions, M x H x D, or null
  int64_t column_tiles;  // per head
  bool mean;
  opmath_t<T> sign;        // kSelect: 1 (max) or -1 (min)
  opmath_t<T>* carry;      // units x (H * D)
  int64_t* carry_arg;      // kSelect: units x (H * D)
  int64_t* carry_row;      // units: the row a unit's carry belongs to, or -1
  opmath_t<T>* head;       // units x (H * D) (16-bit T, every kSelect; else null): the part of row start.row a
  int64_t* head_arg;       // unit u > 0 ends
};

// x replaces best in a max: larger, or a NaN over a number.
template <typename Acc>
__device__ __forceinline__ bool beats(Acc x, Acc best) {
  return x > best || (x != x && best == best);
}

// (v2, a2) replaces (v1, a1) in a max that keeps the lowest position among equals (a < 0: nothing yet).
template <typename Acc>
__device__ __forceinline__ bool replaces(Acc v2, int64_t a2, Acc v1, int64_t a1) {
  return a2 >= 0 && (a1 < 0 || beats(v2, v1) || (!beats(v1, v2) && a2 < a1));
}

// Adds the partial sums of the warp's 32 / G lane groups (butterfly: every group ends with the same,
// order-independent bits, as IEEE addition is commutative).
template <int G, int V, typename Acc>
__device__ __forceinline__ void sum_over_groups(Acc (&acc)[V]) {
#pragma unroll
  for (int offset = G; offset < kWarpSize; offset <<= 1)
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] += __shfl_xor_sync(kFullWarpMask, acc[e], offset);
}

// The same for max with positions: an exact, order-free combine.
template <int G, int V, typename Acc>
__device__ __forceinline__ void select_over_groups(Acc (&acc)[V], int64_t (&at)[V]) {
#pragma unroll
  for (int offset = G; offset < kWarpSize; offset <<= 1) {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const Acc v = __shfl_xor_sync(kFullWarpMask, acc[e], offset);
      const int64_t p = __shfl_xor_sync(kFullWarpMask, at[e], offset);
      if (replaces(v, p, acc[e], at[e])) {
        acc[e] = v;
        at[e] = p;
      }
    }
  }
}

// G lanes per nonzero: a group of G lanes spans one column tile of G vectors of V columns, and the warp's
// 32 / G groups take 32 / G consecutive nonzeros at once (G < 32: narrow D, where one nonzero per warp
// would leave most lanes idle and pay every shuffle and index computation per 32 V columns).
// (Gathering a whole chunk of nonzeros across row boundaries before accumulating nearly doubles the
// registers, and the occupancy lost costs more than the gathering saves.)
// kPlain: a sum with one head and given weights (csr_spmm's product): heads, default weights and means
// compiled out, which keeps the registers, and so the resident warps, of the plain product.
template <typename T, typename Index, int V, int G, Accumulate kAcc, bool kPlain>
__global__ void __launch_bounds__(kWarpBlockThreads) csr_spmm_kernel(const SpmmArgs<T, Index> a) {
  using acc_t = opmath_t<T>;
  using Vec = AlignedVector<T, V>;
  using Sel = AlignedVector<Index, V>;
  constexpr bool kSelect = kAcc == Accumulate::kSelect;
  constexpr bool kMasked = kAcc == Accumulate::kMaskedSum;
  constexpr int kGroups = kWarpSize / G;
  constexpr int kBatch = kGroups > 1 ? 2 : 4;  // nonzeros per group gathered before accumulating
  constexpr int kStep = kGroups * kBatch;      // nonzeros the warp consumes per step
  static_assert(kStep <= kWarpSize, "a step must fit the 32-entry window");
  static_assert(!kPlain || kAcc == Accumulate::kSum, "the plain product is a sum");
  const int lane = threadIdx.x % kWarpSize;
  const int group = lane / G;
  int64_t unit;
  MergeCoord start, end;
  if (!warp_merge_unit(a, unit, start, end)) return;  // whole warps only: every later shuffle has all 32 lanes
  const bool has_carry = end.row < a.M && end.row >= start.row;
  if (blockIdx.y == 0 && lane == 0) a.carry_row[unit] = has_carry ? end.row : -1;
  const int64_t row_width = a.H * a.N;  // out's (and the carries') columns

  for (int64_t tile = blockIdx.y; tile < a.column_tiles * a.H; tile += gridDim.y) {
    const int64_t h = kPlain ? 0 : tile / a.column_tiles;
    const int64_t cj = ((tile - h * a.column_tiles) * G + lane % G) * V;  // this lane's first column in head h
    const bool cok = cj < a.N;                                            // N % V == 0 whenever V > 1
    const int64_t oc = h * a.N + cj;                                      // ... in a row of out
    const T* dense_h = a.dense + h * a.dhs + cj;
    acc_t acc[V];
    int64_t at[V];  // kSelect: position of acc[e], -1 for none yet
#pragma unroll
    for (int e = 0; e < V; ++e) {
      acc[e] = acc_t(0);
      at[e] = -1;
    }

    int64_t j = start.nz;               // next nonzero to consume
    int64_t wbase = j - kWarpSize;      // nonzero window [wbase, wbase + 32): empty so far
    Index wcol = -1;                    // this lane's window entry
    acc_t wval = acc_t(0);
    Index wtag = -1;
    int64_t rbase = start.row - kWarpSize;  // row-end window: lane l holds crow[rbase + 1 + l]
    Index wrow_end = 0;
    for (int64_t r = start.row; r <= end.row && r < a.M; ++r) {
      int64_t re = end.nz;  // the unit's last row stops at the unit's end
      if (r < end.row) {            // earlier rows end at crow[r + 1] (read 32 rows at a time, not one load per row)
        if (r >= rbase + kWarpSize) {
          rbase = r;
          wrow_end = r + 1 + lane <= a.M ? a.crow[r + 1 + lane] : Index(0);
        }
        re = row_end_in_unit(__shfl_sync(kFullWarpMask, wrow_end, static_cast<int>(r - rbase)), j, end, a.nnz);
      }
      while (j < re) {
        if (j >= wbase + kWarpSize) {
          wbase = j;
          const int64_t p = j + lane;
          const bool in = p < end.nz;
          wcol = in ? a.col[p] : Index(-1);
          if constexpr (kPlain) {
            wval = in ? static_cast<acc_t>(a.val[p]) : acc_t(0);
          } else {
            wval = !in ? acc_t(0) : a.val == nullptr ? acc_t(1) : static_cast<acc_t>(a.val[p * a.vs + h * a.vhs]);
          }
          if constexpr (kSelect) wval *= a.sign;
          if constexpr (kMasked) wtag = in ? a.tag[p] : Index(-1);
        }
        const int kb = static_cast<int>(j - wbase);
        const int ke = static_cast<int>(::min(re - wbase, int64_t{kWarpSize}));
        for (int k = kb; k < ke; k += kStep) {
          acc_t w[kBatch];
          Vec x[kBatch];
          Sel s[kBatch];
          Index tg[kBatch];
          bool ok[kBatch];
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            const int kk = k + u * kGroups + group;
            const Index c = __shfl_sync(kFullWarpMask, wcol, kk & (kWarpSize - 1));
            const acc_t v = __shfl_sync(kFullWarpMask, wval, kk & (kWarpSize - 1));
            ok[u] = kk < ke && c >= 0 && static_cast<int64_t>(c) < a.K;  // the same across a group
            w[u] = ok[u] ? v : acc_t(0);
            const int64_t row = ok[u] ? static_cast<int64_t>(c) : 0;
            x[u] = ok[u] && cok ? load_vector<T, V>(dense_h + row * a.ld, 0) : zero_vector<T, V>();
            if constexpr (kMasked) {
              tg[u] = __shfl_sync(kFullWarpMask, wtag, kk & (kWarpSize - 1));
              if (ok[u] && cok) {
                s[u] = load_vector<Index, V>(a.sel + row * a.sel_ld + oc, 0);
              } else {
#pragma unroll
                for (int e = 0; e < V; ++e) s[u].val[e] = Index(-1);
              }
            }
          }
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
#pragma unroll
            for (int e = 0; e < V; ++e) {
              const acc_t y = w[u] * static_cast<acc_t>(x[u].val[e]);
              if constexpr (kSelect) {
                const int64_t pos = wbase + k + u * kGroups + group;
                if (ok[u] && (at[e] < 0 || beats(y, acc[e]))) {
                  acc[e] = y;
                  at[e] = pos;
                }
              } else if constexpr (kMasked) {
                acc[e] += s[u].val[e] == tg[u] ? y : acc_t(0);
              } else {
                acc[e] += y;
              }
            }
          }
        }
        j = wbase + ke;
      }
      if (r < end.row) {
        if constexpr (kSelect) {
          select_over_groups<G>(acc, at);
        } else {
          sum_over_groups<G>(acc);
        }
        const bool writer = group == 0 && cok;
        const bool carried_in = r == start.row && unit > 0;  // the row began in an earlier unit, which carries it
        if (a.head != nullptr && carried_in) {
          // The carry kernel combines the parts and stores the row.
#pragma unroll
          for (int e = 0; e < V; ++e) {
            if (writer) {
              a.head[unit * row_width + oc + e] = acc[e];
              if constexpr (kSelect) a.head_arg[unit * row_width + oc + e] = at[e];
            }
            acc[e] = acc_t(0);
            at[e] = -1;
          }
        } else {  // row r ends in this unit (f32/f64 sums that were carried in: their last part, completed later)
          acc_t count = acc_t(1);  // a mean's divisor: the row's length (it lies wholly in this unit)
          if (!kPlain && a.mean && !carried_in) {
            count = acc_t(::max(re - clamped_offset(a.crow, r, a.nnz), int64_t{1}));
          }
          Vec o;
#pragma unroll
          for (int e = 0; e < V; ++e) {
            if constexpr (kSelect) {
              o.val[e] = static_cast<T>(at[e] < 0 ? acc_t(0) : a.sign * acc[e]);
              if (writer && a.arg != nullptr) a.arg[r * row_width + oc + e] = static_cast<Index>(at[e]);
            } else {
              o.val[e] = static_cast<T>(count != acc_t(1) ? acc[e] / count : acc[e]);
            }
            acc[e] = acc_t(0);
            at[e] = -1;
          }
          if (writer) store_vector<T, V>(a.out + r * row_width + oc, 0, o);
        }
      }
    }
    if (has_carry) {
      if constexpr (kSelect) {
        select_over_groups<G>(acc, at);
      } else {
        sum_over_groups<G>(acc);
      }
      if (group == 0 && cok) {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          a.carry[unit * row_width + oc + e] = acc[e];
          if constexpr (kSelect) a.carry_arg[unit * row_width + oc + e] = at[e];
        }
      }
    }
  }
}

// merge_carry_kernel's policy for sums: the run's carries in unit order, then the ending unit's part (from
// `head` for 16-bit, else from out, where it was stored), divided by the row's length for a mean.
template <typename T, typename Index>
struct SumCarry {
  using Acc = opmath_t<T>;
  const Acc* carry;
  const Acc* head;
  T* out;
  const Index* crow;
  int64_t nnz, units, columns;
  bool mean;

  __device__ static Acc identity() { return Acc(0); }
  __device__ static Acc combine(Acc earlier, Acc later) { return earlier + later; }
  __device__ Acc carry_of(int64_t unit, int64_t col) const { return carry[unit * columns + col]; }
  __device__ void finish(int64_t r, int64_t ending, int64_t col, Acc run) const {
    const Acc tail = head != nullptr ? (ending < units ? head[ending * columns + col] : Acc(0))
                                     : static_cast<Acc>(out[r * columns + col]);
    Acc total = tail + run;
    if (mean) {
      const int64_t n = clamped_offset(crow, r + 1, nnz) - clamped_offset(crow, r, nnz);
      total /= Acc(::max(n, int64_t{1}));
    }
    out[r * columns + col] = static_cast<T>(total);
  }
};

// ... and for max / min: (value, position) pairs, the combine exact; the ending unit's part from `head`.
template <typename T, typename Index>
struct SelectCarry {
  struct Acc {
    opmath_t<T> value;
    int64_t at;
  };
  const opmath_t<T>* carry;
  const int64_t* carry_arg;
  const opmath_t<T>* head;
  const int64_t* head_arg;
  T* out;
  Index* arg;
  opmath_t<T> sign;
  int64_t units, columns;

  __device__ static Acc identity() { return {opmath_t<T>(0), -1}; }
  __device__ static Acc combine(Acc earlier, Acc later) {
    return replaces(later.value, later.at, earlier.value, earlier.at) ? later : earlier;
  }
  __device__ Acc carry_of(int64_t unit, int64_t col) const {
    return {carry[unit * columns + col], carry_arg[unit * columns + col]};
  }
  __device__ void finish(int64_t r, int64_t ending, int64_t col, Acc run) const {
    Acc total = run;
    if (ending < units) total = combine(total, {head[ending * columns + col], head_arg[ending * columns + col]});
    out[r * columns + col] = static_cast<T>(total.at < 0 ? opmath_t<T>(0) : sign * total.value);
    if (arg != nullptr) arg[r * columns + col] = static_cast<Index>(total.at);
  }
};

template <typename T, typename Index, int V, int G, Accumulate kAcc, bool kPlain>
void launch_config(SpmmArgs<T, Index> a, const at::Tensor& like, cudaStream_t stream) {
  constexpr auto kKernel = csr_spmm_kernel<T, Index, V, G, kAcc, kPlain>;
  constexpr bool kSelect = kAcc == Accumulate::kSelect;
  const auto part = merge_partition(a.M, a.nnz, a.column_tiles * a.H,
                                    resident_warps<kKernel, kWarpBlockThreads>(like.get_device()));
  a.per_unit = part.per_unit;
  a.units = part.units;
  const int64_t width = a.H * a.N;
  constexpr auto kAccType = c10::CppTypeToScalarType<opmath_t<T>>::value;
  const auto buffer = [&](at::ScalarType dtype) { return empty_dense_cuda({a.units * width}, dtype, like.device()); };
  at::Tensor carry = buffer(kAccType), carry_row = empty_dense_cuda({a.units}, at::kLong, like.device());
  at::Tensor head, carry_arg, head_arg;
  a.carry = carry.mutable_data_ptr<opmath_t<T>>();
  a.carry_row = carry_row.mutable_data_ptr<int64_t>();
  a.head = nullptr;
  a.carry_arg = a.head_arg = nullptr;
  if (kSelect || !std::is_same_v<T, opmath_t<T>>) {
    head = buffer(kAccType);
    a.head = head.mutable_data_ptr<opmath_t<T>>();
  }
  if constexpr (kSelect) {
    carry_arg = buffer(at::kLong);
    head_arg = buffer(at::kLong);
    a.carry_arg = carry_arg.mutable_data_ptr<int64_t>();
    a.head_arg = head_arg.mutable_data_ptr<int64_t>();
  }
  const dim3 grid(blocks_to_cover(a.units, kWarpsPerBlock),
                  static_cast<unsigned int>(std::min<int64_t>(a.column_tiles * a.H, kMaxGridYZ)));
  kKernel<<<grid, kWarpBlockThreads, 0, stream>>>(a);
  TORCHOPS_CUDA_LAUNCH_CHECK();
  if constexpr (kSelect) {
    SelectCarry<T, Index> policy{a.carry, a.carry_arg, a.head, a.head_arg, a.out, a.arg, a.sign, a.units, width};
    launch_merge_carry(a, a.carry_row, policy, stream);
  } else {
    SumCarry<T, Index> policy{a.carry, a.head, a.out, a.crow, a.nnz, a.units, width, a.mean};
    launch_merge_carry(a, a.carry_row, policy, stream);
  }
}

// The instantiated (V, G): V elements per access (16 bytes when D, the strides and the base pointer allow it);
// with 16-byte vectors the smallest group of G >= 4 lanes that spans D, at most a warp; narrower vectors
// (odd D, misaligned views) take whole warps (every width for the plain product; the other configurations
// single elements there, half as many kernels to build). Wider D runs more column tiles (grid.y) rather than several vectors per lane: fewer registers (more
// warps in flight), and each tile's units gather only the tile's slice of `dense`, more of which stays in L2
// while they run. Long rows (kLongRows nonzeros on average) take narrower tiles while a tile's slice (K rows
// of G 16-byte vectors) is over kL2Share of the L2: each tile then re-reads the indices and pays the per-row
// work again, which rows that long amortize (shorter rows, as in a uniform graph, lose more than they gain).
constexpr int64_t kLongRows = 128;
constexpr double kL2Share = 0.7;

template <Accumulate kAcc, bool kPlain, typename T, typename Index>
void launch_spmm(SpmmArgs<T, Index> a, int v, const at::Tensor& like, cudaStream_t stream) {
  constexpr int kMaxV = vector_size<T>();
  constexpr VectorWidths kWidths = kPlain ? VectorWidths::kAll : VectorWidths::kFullOrScalar;
  if (kWidths == VectorWidths::kFullOrScalar && v != kMaxV) v = 1;
  int g = kWarpSize;
  if (v == kMaxV) {
    const int64_t vectors = (a.N + v - 1) / v;  // per row of a head
    g = 4;
    while (g < kWarpSize && g < vectors) g *= 2;
    if (a.nnz >= kLongRows * a.M) {
      const double l2 = device_attribute(cudaDevAttrL2CacheSize, like.get_device());
      while (g > 4 && static_cast<double>(a.K) * g * kVectorBytes > kL2Share * l2) g /= 2;
    }
  }
  a.column_tiles = (a.N + int64_t{g} * v - 1) / (int64_t{g} * v);
  with_vector_size<T, kWidths>(v, [&](auto vector) {
    constexpr int V = decltype(vector)::value;
    if constexpr (V == kMaxV) {
      if (g == 4) {
        launch_config<T, Index, V, 4, kAcc, kPlain>(a, like, stream);
      } else if (g == 8) {
        launch_config<T, Index, V, 8, kAcc, kPlain>(a, like, stream);
      } else if (g == 16) {
        launch_config<T, Index, V, 16, kAcc, kPlain>(a, like, stream);
      } else {
        launch_config<T, Index, V, kWarpSize, kAcc, kPlain>(a, like, stream);
      }
    } else {
      launch_config<T, Index, V, kWarpSize, kAcc, kPlain>(a, like, stream);
    }
  });
}

// The widest vector every row and head of `dense` (and out's rows of H * D) can be accessed with.
template <typename T>
int spmm_vector_size(int64_t D, int64_t ld, int64_t dhs, const void* base) {
  int v = widest_vector_size<T>(D, ld, base);
  while (v > 1 && dhs % v != 0) v /= 2;
  return v;
}

template <typename T, typename Index>
SpmmArgs<T, Index> spmm_args(const SpmmOperands& s) {
  SpmmArgs<T, Index> a{};
  a.set_matrix(s.crow, s.col, s.K, s.D);
  a.set_inputs(s);
  a.sign = 1;
  return a;
}

}  // namespace

template <>
at::Tensor CudaCsrBackend::empty(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Tensor& device_of) {
  return empty_dense_cuda(sizes, dtype, device_of.device());
}

template <>
at::Tensor CudaCsrBackend::spmm(const char* /*op*/, const SpmmOperands& s, Reduce reduce, at::Tensor* arg) {
  const c10::cuda::CUDAGuard device_guard(s.dense.device());
  const auto dtype = s.dense.scalar_type();
  at::Tensor out = empty_dense_cuda(s.out_sizes, dtype, s.dense.device());
  if (arg != nullptr) *arg = empty_dense_cuda(s.out_sizes, s.crow.scalar_type(), s.dense.device());
  if (out.numel() == 0) return out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCHOPS_DISPATCH_INDEX_TYPES(s.crow.scalar_type(), "spmm_reduce_cuda", [&] {
    TORCHOPS_DISPATCH_FLOAT_TYPES(dtype, "spmm_reduce_cuda", [&] {
      SpmmArgs<scalar_t, index_t> a = spmm_args<scalar_t, index_t>(s);
      a.out = out.mutable_data_ptr<scalar_t>();
      a.arg = arg != nullptr ? arg->mutable_data_ptr<index_t>() : nullptr;
      a.mean = reduce == Reduce::kMean;
      a.sign = reduce == Reduce::kMin ? -1 : 1;
      const int v = spmm_vector_size<scalar_t>(s.D, a.ld, a.dhs, a.dense);
      if (selects(reduce)) {
        launch_spmm<Accumulate::kSelect, false>(a, v, out, stream);
      } else if (s.H == 1 && a.val != nullptr && !a.mean) {
        launch_spmm<Accumulate::kSum, true>(a, v, out, stream);
      } else {
        launch_spmm<Accumulate::kSum, false>(a, v, out, stream);
      }
    });
  });
  return out;
}

// The gradients of out[i, h, d] = w(p, h) * dense[col[p], h, d], p = arg[i, h, d]:
//   values: a masked SDDMM of grad_out with dense (summed over the heads for one value per nonzero);
//   dense:  a masked sum over A^T: row k of the gradient gathers grad_out's rows i of A's column k, each
//           nonzero (i, k) at position p weighted w(p, h) where arg[i, h, d] == p.
template <>
std::tuple<at::Tensor, at::Tensor> CudaCsrBackend::select_backward(const char* /*op*/, const at::Tensor& grad_out,
                                                                   const SpmmOperands& s, const at::Tensor& arg_in,
                                                                   const OptTensor& t_crow_in,
                                                                   const OptTensor& t_col_in,
                                                                   const OptTensor& t_perm_in, bool values_grad,
                                                                   bool dense_grad) {
  const c10::cuda::CUDAGuard device_guard(s.dense.device());
  const at::Tensor arg = arg_in.contiguous();
  // grad_out as rows of H x D with a dense last dimension (and dense heads, as sel's are).
  const at::Tensor g = grad_out.dim() == 3 ? (grad_out.stride(2) == 1 && (s.H <= 1 || grad_out.stride(1) == s.D)
                                                  ? grad_out
                                                  : grad_out.contiguous())
                                            : with_unit_column_stride(grad_out);
  at::Tensor grad_values, grad_dense;
  if (values_grad) {
    SddmmOperands m;
    static_cast<CsrProduct&>(m) = s;  // the same matrix, heads and features
    m.a = g;
    m.a_row_stride = s.M <= 1 ? s.H * s.D : g.stride(0);
    m.a_head_stride = s.D;
    m.b = s.dense;
    m.b_row_stride = s.dense_row_stride;
    m.b_head_stride = s.dense_head_stride;
    // (nnz, H) in opmath: the heads of 1-D values are summed before the one rounding to the dtype (a
    // rounding per head, then the sum's, can miss a 16-bit result by several ulps where the heads cancel).
    at::Tensor per_head = masked_sddmm_cuda(m, arg);
    grad_values = (s.values.dim() == 2 ? per_head : per_head.sum(-1)).to(grad_out.scalar_type());
  }
  if (dense_grad) {
    at::Tensor t_crow, t_col, t_perm;
    const bool given = t_crow_in.has_value() && t_crow_in->defined();
    if (given) {
      t_crow = t_crow_in->contiguous();
      t_col = t_col_in->contiguous();
      t_perm = t_perm_in->contiguous();
    } else {
      std::tie(t_crow, t_col, t_perm) = transpose("_spmm_reduce_backward", s.crow, s.col, s.K);
    }
    grad_dense = empty_dense_cuda(s.dense.sizes(), grad_out.scalar_type(), grad_out.device());
    if (grad_dense.numel() > 0) {
      // Each nonzero's weight in A^T's order; its tag, the position it has in A, is t_perm.
      const at::Tensor weights = !s.values.defined() ? at::Tensor()
                                 : given             ? permuted_values(s.values, t_perm)
                                                     : s.values.index_select(0, t_perm);
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
      TORCHOPS_DISPATCH_INDEX_TYPES(s.crow.scalar_type(), "spmm_reduce_backward_cuda", [&] {
        TORCHOPS_DISPATCH_FLOAT_TYPES(grad_out.scalar_type(), "spmm_reduce_backward_cuda", [&] {
          SpmmArgs<scalar_t, index_t> a{};
          a.set_matrix(t_crow, t_col, s.M, s.D);
          a.val = weights.defined() ? weights.const_data_ptr<scalar_t>() : nullptr;
          a.vs = s.value_stride;
          a.vhs = s.value_head_stride;
          a.dense = g.const_data_ptr<scalar_t>();
          a.ld = s.M <= 1 ? s.H * s.D : g.stride(0);
          a.dhs = s.D;
          a.tag = t_perm.const_data_ptr<index_t>();
          a.sel = arg.const_data_ptr<index_t>();
          a.sel_ld = s.H * s.D;
          a.out = grad_dense.mutable_data_ptr<scalar_t>();
          a.H = s.H;
          a.sign = 1;
          int v = spmm_vector_size<scalar_t>(s.D, a.ld, a.dhs, a.dense);
          // arg is read in vectors of v indices too: a contiguous view at an odd offset allows narrower ones only
          while (v > 1 && !is_aligned(a.sel, v * static_cast<int>(sizeof(index_t)))) v /= 2;
          launch_spmm<Accumulate::kMaskedSum, false>(a, v, grad_dense, stream);
        });
      });
    }
  }
  return {grad_values, grad_dense};
}

TORCH_LIBRARY_IMPL(myns, CUDA, m) {
  CsrKernels<CudaCsrBackend>::register_kernels(m);
}

}  // namespace torchops
