// Paged attention on the tensor cores, for bf16 KV with head_dim 64 or 128 (the production
// models: llama-1b, llama-8b), decode and prefill alike. Included by attention.cu only.
//
// Same contract and split rule as the CUDA-core kernel in attention.cu: fixed 128-key splits by
// absolute position, each split's partial softmax computed on its own, partials combined in split
// order (combined_outputs). What this kernel adds:
//
//  * Tiles. A block's MMA rows are (tokens of one sequence) × (the group's query heads): up to
//    kTileRows rows, e.g. 8 consecutive tokens × 4 heads for llama's group of 4, so one load of a
//    split's K/V serves every token of a prefill chunk's tile. The launch cuts the chunk's tokens
//    into groups of tile_tokens consecutive tokens; inside a group, each run of consecutive tokens
//    with the same pool row (the same page table, so the same keys) is one tile, so a decode step
//    (every token its own sequence) gets one-token tiles. A token masks the keys past its own
//    position exactly as at decode: a row's softmax covers the split's keys below its own count.
//  * A persistent, pipelined walk. The grid is at most the resident blocks; block b takes items b,
//    b + grid, ... (item = split lane × KV head × token group) and walks their (tile, split) steps
//    in order through a two-stage cp.async ring: K, V and Q of step i + 1 are in flight while step
//    i is computed, across tile and item boundaries, and the slots of a later step are read from
//    the block table meanwhile.
//  * The combine in the block. With one split lane (every split of a tile in one block), the
//    block merges its tiles' partials itself after their last split; with several lanes the
//    combine kernel does. Both run combined_outputs, so the bits do not depend on which.
//
// A row's arithmetic depends only on its own token: each MMA output element comes from its own
// row of A (the rows of a tile never mix), the k-steps run in a fixed order (scores over
// head_dim ascending, P·V over all eight 16-key steps of the split, keys past a row's count having
// probability 0 and value rows past the tile's keys zeroed), and a row's softmax is one warp's
// with the same lane order whichever warp takes it. So a token computed in a prefill tile has the
// bits of the same token computed alone at decode, whatever the batch, the tile or the lanes.
#pragma once

namespace ls::kernels {
namespace {

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);  // .x = lo (low half)
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// D = A·B + D for one m16n8k16 tile (A row-major 16×16, B column-major 16×8, fp32 accumulate).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8×8 bf16 matrices from shared memory; lanes 8i .. 8i + 7 give matrix i's row addresses.
// Thread (g, c) receives row g, columns 2c, 2c + 1 of each (transposed: rows 2c, 2c + 1 of
// column g).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ void copy_async_wait_newest_pending() {
  asm volatile("cp.async.wait_group 1;\n" ::);
}

constexpr int32_t kTileRows = 32;              // MMA rows of a block: tile tokens × group
constexpr int32_t kMTiles = kTileRows / 16;    // m16 tiles
constexpr int32_t kStages = 2;                 // steps in the cp.async ring
constexpr int32_t kStepRing = 4;               // step records: computed, in flight, slots, next
constexpr int32_t kScorePitch = kAttentionSplitKeys + 8;  // floats; 8 more: no bank conflicts
template <int32_t D>
constexpr int32_t kRowPitch = D + 8;  // bf16 K/V rows: the eight rows of an ldmatrix in 8 banks
template <int32_t D>
constexpr int32_t kQueryPitch = D + 8;  // fp32 Q rows: a half-warp's float2 loads in 16 banks

// One step's inputs: the split's key and value rows and the tile's queries (fp32, as computed).
template <int32_t D>
struct TileStage {
  bf16 k[kAttentionSplitKeys * kRowPitch<D>];
  bf16 v[kAttentionSplitKeys * kRowPitch<D>];
  float q[kTileRows * kQueryPitch<D>];
};

// One step of a block's walk, as every thread reads it from shared memory.
struct TileStep {
  int32_t valid;      // 0: past the block's last step
  int32_t first;      // the tile's first token, within the launch's chunk
  int32_t tokens;     // the tile's tokens (consecutive, one pool row)
  int32_t kv_head;
  int32_t split;
  int32_t count_max;  // keys of the split loaded: the largest of the tokens' counts
  int32_t last;       // the tile's last split: with one lane, the block combines the tile after
  int32_t keys[kTileRows];  // each token's keys: positions 0 .. keys − 1
};

template <int32_t D>
struct TileShared {
  TileStage<D> stages[kStages];
  float scores[kTileRows * kScorePitch];  // scores, then probabilities (zero past a row's keys)
  int64_t slots[kStages][kAttentionSplitKeys];
  TileStep steps[kStepRing];  // step i in steps[i % 4]: i is computed while i + 3 is described
  float m[kTileRows];
  float l[kTileRows];
};

// How a launch cuts its tokens: groups of tile_tokens consecutive tokens, `lanes` split lanes per
// (group, KV head); items = lanes · kv_heads · groups.
struct TilePlan {
  int32_t tokens;
  int32_t tile_tokens;
  int32_t lanes;
  int32_t items;
  int32_t fused_combine;  // lanes == 1
};

struct TileArgs {
  AttentionArgs<bf16> a;
  TilePlan plan;
};

__device__ __forceinline__ int32_t keys_of(const AttentionArgs<bf16>& a, int32_t local_token) {
  return min(a.positions[a.token_begin + local_token], a.shape.positions_count - 1) + 1;
}
__device__ __forceinline__ int32_t pool_row_of(const AttentionArgs<bf16>& a, int32_t local_token) {
  return a.token_pool_rows[a.token_begin + local_token];
}

// Where a block's walk is: its item, the tile in it (first = −1: the item's first) and the split.
// Every thread keeps the same cursor (uniform values, broadcast loads), but lane_keys: lane r's is
// the count of token group_first + r of the item's token group.
struct TileCursor {
  int32_t item, first, tokens, splits, split, kv_head, pool_row, keys_max, group_first, lane_keys;
};

// Moves the cursor to the first step at or after it: the tile at `first` of its item (or the
// next tile, or the next item's first) of which its lane has a split. A warp reads a token group's
// pool rows and counts at once (one token a lane: tile_tokens <= 32), then finds the run of
// tokens with the tile's pool row by a ballot.
__device__ __forceinline__ void settle(TileCursor& c, const TileArgs& t) {
  static_assert(kTileRows <= 32, "a token group fits a warp");
  const TilePlan& p = t.plan;
  const int32_t lane = static_cast<int32_t>(threadIdx.x % 32);
  while (c.item < p.items) {
    const int32_t item_lane = c.item % p.lanes;
    const int32_t rest = c.item / p.lanes;
    c.kv_head = rest % t.a.shape.kv_heads;
    const int32_t group_first = rest / t.a.shape.kv_heads * p.tile_tokens;
    const int32_t group_end = min(group_first + p.tile_tokens, p.tokens);
    if (c.first < 0) c.first = group_first;
    const bool in_group = group_first + lane < group_end;
    const int32_t row = in_group ? pool_row_of(t.a, group_first + lane) : -1;
    const int32_t keys = in_group ? keys_of(t.a, group_first + lane) : 0;
    c.group_first = group_first;
    c.lane_keys = keys;
    while (c.first < group_end) {
      const int32_t f = c.first - group_first;
      c.pool_row = __shfl_sync(0xffffffffu, row, f);
      // Bit j: token f + j has the tile's pool row (bit 0 always; lanes past the group never).
      const uint32_t same = __ballot_sync(0xffffffffu, in_group && row == c.pool_row) >> f;
      c.tokens = same == 0xffffffffu ? 32 : __ffs(static_cast<int>(~same)) - 1;
      const bool in_tile = lane >= f && lane < f + c.tokens;
      c.keys_max = __reduce_max_sync(0xffffffffu, in_tile ? keys : 0);
      c.splits = (c.keys_max + kAttentionSplitKeys - 1) / kAttentionSplitKeys;
      if (item_lane < c.splits) {
        c.split = item_lane;
        return;
      }
      c.first += c.tokens;
    }
    c.item += gridDim.x;
    c.first = -1;
  }
}

__device__ __forceinline__ void advance(TileCursor& c, const TileArgs& t) {
  if (c.item >= t.plan.items) return;
  c.split += t.plan.lanes;
  if (c.split < c.splits) return;
  c.first += c.tokens;
  settle(c, t);
}

// Writes the step the cursor is at (thread 0 its fields, warp 0's lane r token r's count, from
// the cursor: no memory read); each thread returns the slot of its key of it, a block-table read
// that the caller consumes only an iteration later.
__device__ __forceinline__ int64_t describe(TileStep& step, const TileCursor& c, const TileArgs& t) {
  const bool valid = c.item < t.plan.items;
  const int32_t lane = static_cast<int32_t>(threadIdx.x % 32);
  const int32_t token_keys =
      __shfl_sync(0xffffffffu, c.lane_keys, min(c.first - c.group_first + lane, 31));
  if (threadIdx.x == 0) {
    step.valid = valid;
    if (valid) {
      step.first = c.first, step.tokens = c.tokens, step.kv_head = c.kv_head;
      step.split = c.split;
      step.count_max = min(kAttentionSplitKeys, c.keys_max - c.split * kAttentionSplitKeys);
      step.last = c.split + t.plan.lanes >= c.splits;
    }
  }
  if (valid && static_cast<int32_t>(threadIdx.x) < c.tokens) step.keys[threadIdx.x] = token_keys;
  const int32_t p = (valid ? c.split : 0) * kAttentionSplitKeys + static_cast<int32_t>(threadIdx.x);
  if (!valid || p >= c.keys_max) return 0;
  const AttentionShape& s = t.a.shape;
  return ops::slot_in_table(t.a.table + int64_t{c.pool_row} * s.table_width, s.page_size, p);
}

// Issues the copies of a step into its stage: the split's K and V rows below count_max, zeros
// for the value rows past them (probability 0 times a stale row could be NaN), the tile's Q rows.
template <int32_t D>
__device__ __forceinline__ void issue_step(TileStage<D>& stage, const TileStep& step, const int64_t* slots,
                           const AttentionArgs<bf16>& a) {
  if (!step.valid) return;
  const AttentionShape& s = a.shape;
  constexpr int32_t kPieces = D / 8;  // 16-byte pieces of a bf16 row
  const int32_t kv_size = s.kv_heads * D;
  const int64_t head_offset = int64_t{step.kv_head} * D;
  for (int32_t idx = threadIdx.x; idx < step.count_max * kPieces; idx += kThreads) {
    const int32_t x = idx / kPieces;
    const int32_t j = idx - x * kPieces;
    const int64_t at = slots[x] * kv_size + head_offset + 8 * j;
    copy_async_16(stage.k + x * kRowPitch<D> + 8 * j, a.k_cache + at);
    copy_async_16(stage.v + x * kRowPitch<D> + 8 * j, a.v_cache + at);
  }
  for (int32_t idx = step.count_max * kPieces + threadIdx.x; idx < kAttentionSplitKeys * kPieces;
       idx += kThreads) {
    const int32_t x = idx / kPieces;
    const int32_t j = idx - x * kPieces;
    *reinterpret_cast<uint4*>(stage.v + x * kRowPitch<D> + 8 * j) = make_uint4(0, 0, 0, 0);
  }
  constexpr int32_t kQuarters = D / 4;  // 16-byte pieces of an fp32 row
  const int32_t group = s.query_heads / s.kv_heads;
  const int32_t q_size = s.query_heads * D;
  for (int32_t idx = threadIdx.x; idx < step.tokens * group * kQuarters; idx += kThreads) {
    const int32_t row = idx / kQuarters;
    const int32_t j = idx - row * kQuarters;
    const int32_t token = a.token_begin + step.first + row / group;
    const int32_t head = step.kv_head * group + row % group;
    copy_async_16(stage.q + row * kQueryPitch<D> + 4 * j,
                  a.q + int64_t{token} * q_size + int64_t{head} * D + 4 * j);
  }
}

// Q's A fragment for rows 16·mt .., dims k0 .. k0 + 15 (fp32 → bf16).
template <int32_t D>
__device__ __forceinline__ void query_fragment(uint32_t (&f)[4], const float* q, int32_t mt,
                                               int32_t k0, int32_t g, int32_t c) {
#pragma unroll
  for (int32_t half = 0; half < 2; ++half) {
    const float* row = q + (16 * mt + g + 8 * half) * kQueryPitch<D> + k0 + 2 * c;
    const float2 lo = *reinterpret_cast<const float2*>(row);
    const float2 hi = *reinterpret_cast<const float2*>(row + 8);
    f[half] = pack_bf16x2(lo.x, lo.y);
    f[2 + half] = pack_bf16x2(hi.x, hi.y);
  }
}

// Scores of the step's split: warp w takes keys 32w .. 32w + 31 (four 8-key tiles) for every
// used m-tile; k-steps over head_dim ascending. Stored scaled, for every key (the softmax reads
// only a row's own).
template <int32_t D>
__device__ __forceinline__ void score_split(const TileStage<D>& stage, float* scores, int32_t m_tiles,
                            int32_t warp, int32_t lane) {
  const int32_t g = lane / 4, c = lane % 4;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  float acc[kMTiles][4][4] = {};
#pragma unroll
  for (int32_t s = 0; s < D / 32; ++s) {
    uint32_t a[kMTiles][2][4];
#pragma unroll
    for (int32_t mt = 0; mt < kMTiles; ++mt) {
      if (mt < m_tiles) {
        query_fragment<D>(a[mt][0], stage.q, mt, 32 * s, g, c);
        query_fragment<D>(a[mt][1], stage.q, mt, 32 * s + 16, g, c);
      }
    }
#pragma unroll
    for (int32_t t = 0; t < 4; ++t) {
      // Matrix i: keys of the tile, dims 32s + 8i ..: b[0], b[1] are B of k-step 2s, b[2], b[3]
      // of k-step 2s + 1.
      uint32_t b[4];
      ldmatrix_x4(b, stage.k + (32 * warp + 8 * t + lane % 8) * kRowPitch<D> + 32 * s +
                         8 * (lane / 8));
#pragma unroll
      for (int32_t mt = 0; mt < kMTiles; ++mt) {
        if (mt < m_tiles) {
          mma_bf16_16816(acc[mt][t], a[mt][0], b[0], b[1]);
          mma_bf16_16816(acc[mt][t], a[mt][1], b[2], b[3]);
        }
      }
    }
  }
  // C: (row g, keys 2c, 2c + 1) and (row g + 8, the same keys).
#pragma unroll
  for (int32_t mt = 0; mt < kMTiles; ++mt) {
    if (mt >= m_tiles) continue;
#pragma unroll
    for (int32_t t = 0; t < 4; ++t) {
#pragma unroll
      for (int32_t half = 0; half < 2; ++half) {
        const int32_t row = 16 * mt + g + 8 * half;
        *reinterpret_cast<float2*>(scores + row * kScorePitch + 32 * warp + 8 * t + 2 * c) =
            make_float2(acc[mt][t][2 * half] * scale, acc[mt][t][2 * half + 1] * scale);
      }
    }
  }
}

// O = P·V over all eight 16-key steps of the split; warp w owns dims [w·D/4, (w + 1)·D/4).
// out[mt][p][t]: C of m-tile mt, dims w·D/4 + 16p + 8t ...
template <int32_t D>
__device__ __forceinline__ void weigh_values(const TileStage<D>& stage, const float* scores, int32_t m_tiles,
                             int32_t warp, int32_t lane, float (&out)[kMTiles][D / 64][2][4]) {
  constexpr int32_t kWarpDims = D / kWarps;
  constexpr int32_t kDimPairs = kWarpDims / 16;
  const int32_t g = lane / 4, c = lane % 4;
#pragma unroll
  for (int32_t k0 = 0; k0 < kAttentionSplitKeys; k0 += 16) {
    uint32_t p_frag[kMTiles][4];
#pragma unroll
    for (int32_t mt = 0; mt < kMTiles; ++mt) {
      if (mt >= m_tiles) continue;
#pragma unroll
      for (int32_t half = 0; half < 2; ++half) {
        const float* row = scores + (16 * mt + g + 8 * half) * kScorePitch + k0 + 2 * c;
        const float2 lo = *reinterpret_cast<const float2*>(row);
        const float2 hi = *reinterpret_cast<const float2*>(row + 8);
        p_frag[mt][half] = pack_bf16x2(lo.x, lo.y);
        p_frag[mt][2 + half] = pack_bf16x2(hi.x, hi.y);
      }
    }
    // ldmatrix rows: lanes 8i .. 8i + 7 address matrix i = (keys k0 + 8·(i % 2) .., dims
    // +8·(i / 2)); b[0], b[1] are B for the first 8 dims, b[2], b[3] for the next 8.
    const int32_t key = k0 + 8 * ((lane / 8) % 2) + lane % 8;
#pragma unroll
    for (int32_t p = 0; p < kDimPairs; ++p) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, stage.v + key * kRowPitch<D> + warp * kWarpDims + 16 * p +
                               8 * (lane / 16));
#pragma unroll
      for (int32_t mt = 0; mt < kMTiles; ++mt) {
        if (mt < m_tiles) {
          mma_bf16_16816(out[mt][p][0], p_frag[mt], b[0], b[1]);
          mma_bf16_16816(out[mt][p][1], p_frag[mt], b[2], b[3]);
        }
      }
    }
  }
}

// Each used row's result for the split: the token's output when it has one split, else its
// partial (m, l, unnormalised sums).
template <int32_t D>
__device__ __forceinline__ void store_split(const TileStep& step, const AttentionArgs<bf16>& a, const float* m_s,
                            const float* l_s, int32_t m_tiles, int32_t warp, int32_t lane,
                            const float (&out)[kMTiles][D / 64][2][4]) {
  constexpr int32_t kWarpDims = D / kWarps;
  const AttentionShape& s = a.shape;
  const int32_t group = s.query_heads / s.kv_heads;
  const int32_t rows = step.tokens * group;
  const int32_t total_splits = splits_max(s);
  const int32_t g = lane / 4, c = lane % 4;
#pragma unroll
  for (int32_t mt = 0; mt < kMTiles; ++mt) {
    if (mt >= m_tiles) continue;
#pragma unroll
    for (int32_t half = 0; half < 2; ++half) {
      const int32_t row = 16 * mt + g + 8 * half;
      if (row >= rows) continue;
      const int32_t keys = step.keys[row / group];
      if (keys <= step.split * kAttentionSplitKeys) continue;  // no key of this split
      const int32_t local_token = step.first + row / group;
      const int32_t head = step.kv_head * group + row % group;
      float* part = keys <= kAttentionSplitKeys
                        ? nullptr
                        : partial_at(a.workspace, local_token, head, step.split, s.query_heads,
                                     total_splits, D);
      if (part != nullptr && warp == 0 && c == 0) part[0] = m_s[row], part[1] = l_s[row];
#pragma unroll
      for (int32_t p = 0; p < D / 64; ++p) {
#pragma unroll
        for (int32_t t = 0; t < 2; ++t) {
          const int32_t dim = warp * kWarpDims + 16 * p + 8 * t + 2 * c;
          const float v0 = out[mt][p][t][2 * half], v1 = out[mt][p][t][2 * half + 1];
          if (part == nullptr) {
            bf16* o = a.out + int64_t{a.token_begin + local_token} * s.query_heads * D +
                      int64_t{head} * D + dim;
            *reinterpret_cast<__nv_bfloat162*>(o) =
                __floats2bfloat162_rn(v0 / l_s[row], v1 / l_s[row]);
          } else {
            part[2 + dim] = v0;
            part[2 + dim + 1] = v1;
          }
        }
      }
    }
  }
}

// After a tile's last split (one lane: every partial written by this block, visible after the
// barrier before): each multi-split token's output from its partials, kCombineDims elements a
// thread.
template <int32_t D>
__device__ __forceinline__ void combine_tile(const TileStep& step, const AttentionArgs<bf16>& a) {
  const AttentionShape& s = a.shape;
  const int32_t group = s.query_heads / s.kv_heads;
  const int32_t total_splits = splits_max(s);
  constexpr int32_t kPieces = D / kCombineDims;
  for (int32_t idx = threadIdx.x; idx < step.tokens * group * kPieces; idx += kThreads) {
    const int32_t row = idx / kPieces;
    const int32_t i = (idx - row * kPieces) * kCombineDims;
    const int32_t keys = step.keys[row / group];
    if (keys <= kAttentionSplitKeys) continue;  // written directly
    const int32_t local_token = step.first + row / group;
    const int32_t head = step.kv_head * group + row % group;
    const float* part0 =
        partial_at(a.workspace, local_token, head, 0, s.query_heads, total_splits, D);
    float out[kCombineDims];
    combined_outputs(part0, (keys + kAttentionSplitKeys - 1) / kAttentionSplitKeys, D + 2, i, out);
    bf16* o = a.out + int64_t{a.token_begin + local_token} * s.query_heads * D +
              int64_t{head} * D + i;
#pragma unroll
    for (int32_t j = 0; j < kCombineDims; j += 2) {
      *reinterpret_cast<__nv_bfloat162*>(o + j) = __floats2bfloat162_rn(out[j], out[j + 1]);
    }
  }
}

template <int32_t D>
__device__ __forceinline__ void compute_step(TileShared<D>& sh, const TileStage<D>& stage, const TileStep& step,
                             const TileArgs& t) {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const AttentionShape& s = t.a.shape;
  const int32_t group = s.query_heads / s.kv_heads;
  const int32_t rows = step.tokens * group;
  const int32_t m_tiles = (rows + 15) / 16;
  score_split<D>(stage, sh.scores, m_tiles, warp, lane);
  __syncthreads();  // scores visible
  const int32_t first_key = step.split * kAttentionSplitKeys;
  for (int32_t row = warp; row < rows; row += kWarps) {
    const int32_t count = min(max(step.keys[row / group] - first_key, 0), kAttentionSplitKeys);
    softmax_row(sh.scores + row * kScorePitch, count, kAttentionSplitKeys, lane, sh.m + row,
                sh.l + row);
  }
  __syncthreads();  // probabilities, m and l visible
  float out[kMTiles][D / 64][2][4] = {};
  weigh_values<D>(stage, sh.scores, m_tiles, warp, lane, out);
  store_split<D>(step, t.a, sh.m, sh.l, m_tiles, warp, lane, out);
  if (t.plan.fused_combine && step.last) {
    __syncthreads();  // every partial of the tile written
    combine_tile<D>(step, t.a);
  }
}

// The walk: step i is computed while step i + 1's copies are in flight, step i + 2's slots are
// stored (read from the table an iteration earlier, so the read's latency never stalls a thread)
// and step i + 3 is described. Rings: stages and slots by i % 2, step records by i % 4.
template <int32_t D>
__global__ void __launch_bounds__(kThreads, 1) attention_tile_kernel(TileArgs t) {
  extern __shared__ __align__(16) unsigned char tile_shared[];
  TileShared<D>& sh = *reinterpret_cast<TileShared<D>*>(tile_shared);
  allow_successor();
  wait_for_predecessor();
  TileCursor cursor{static_cast<int32_t>(blockIdx.x), -1, 0, 0, 0, 0, 0, 0, 0, 0};
  settle(cursor, t);
  sh.slots[0][threadIdx.x] = describe(sh.steps[0], cursor, t);
  advance(cursor, t);
  sh.slots[1][threadIdx.x] = describe(sh.steps[1], cursor, t);
  advance(cursor, t);
  int64_t pending_slot = describe(sh.steps[2], cursor, t);
  __syncthreads();
  issue_step<D>(sh.stages[0], sh.steps[0], sh.slots[0], t.a);
  copy_async_commit();
  for (int32_t i = 0;; ++i) {
    __syncthreads();  // step i − 1 computed: its stage and step record are free
    issue_step<D>(sh.stages[(i + 1) % kStages], sh.steps[(i + 1) % kStepRing],
                  sh.slots[(i + 1) % kStages], t.a);
    copy_async_commit();
    // Step i + 2's slots go where step i's were (read by step i's copies before the barrier).
    sh.slots[i % kStages][threadIdx.x] = pending_slot;
    advance(cursor, t);
    pending_slot = describe(sh.steps[(i + 3) % kStepRing], cursor, t);
    copy_async_wait_newest_pending();  // this thread's copies of step i landed
    __syncthreads();                   // everyone's, and step i + 2's slots
    const TileStep& step = sh.steps[i % kStepRing];
    if (!step.valid) break;
    compute_step<D>(sh, sh.stages[i % kStages], step, t);
  }
  copy_async_wait_all();
}

// Dynamic shared memory of a tile block (opted in above 48 KB by resident_blocks): 190 KB for
// head_dim 128 (one block an SM), 110 KB for 64 (two: 2 · (110 + 1 reserved) KB of the 228).
template <int32_t D>
constexpr size_t tile_shared_bytes() {
  static_assert(sizeof(TileShared<128>) <= 227 * 1024, "a block's shared-memory limit");
  static_assert(2 * (sizeof(TileShared<64>) + 1024) <= 228 * 1024, "two head_dim-64 blocks an SM");
  return sizeof(TileShared<D>);
}

}  // namespace
}  // namespace ls::kernels
