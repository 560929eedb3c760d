// The prefill kernel of the tensor-core attention (bf16 KV, head_dim 64 or 128): tiles of
// consecutive tokens of one sequence, so a split's K/V is read once per tile rather than once per
// token. Included by attention.cu only, after attention_mma.cuh (whose MMA, fragment and pitch
// helpers it uses; the decode kernel there is untouched by it).
//
// Only the default mode runs it (AttentionPrefill::kTiles): its per-(row, split) arithmetic (the
// softmax on the MMA's C layout, every split merged in registers) is not the decode kernel's, so a
// token computed here does not have the bits it has at decode. It has the same bits in any tile,
// launch and batch, though: each MMA output element depends only on its own row of A and column of
// B, a row masks the keys past its own position, and its splits are merged in ascending order
// whatever the tile holds; which block takes a tile is timing (an atomic counter), how the tile is
// computed is not.
//
// Tiles: the tokens cut at every multiple of tile_tokens (kTileRows / group: 32 for llama's group
// of 4) and wherever the pool row changes (a run of one sequence: the same page table, so the same
// keys). attention_tile_list_kernel writes the tiles' first tokens into the workspace; then a grid
// of at most the resident blocks takes the work items (tile, KV head) from an atomic counter, the
// launch's last tiles first (a chunk's later tokens have the most keys). A tile's rows are its
// tokens × the KV head's query heads, 16 a warp (one m16 tile, the flash-attention layout: a warp
// holds its rows' scores, probabilities and outputs in registers); the eight warps share each
// split's K and V (kTileSplitKeys below, not the decode kernel's kAttentionSplitKeys), which a
// two-stage cp.async ring brings into shared memory while the previous split is computed. The
// block takes every split of its tile in order and merges them in registers, so it writes no
// partials and needs no combine.
#pragma once

namespace ls::kernels {
namespace {

// Keys of a tile split, and tile blocks an SM. At head_dim 64 a split of 64 keys keeps a thread's
// scores, probabilities and outputs within 128 registers, so two blocks (16 warps) share an SM and
// one block's loads and barriers overlap the other's MMAs; at 128 a split of 128 keys and one
// block an SM (its registers, up to 255 a thread, fill the SM's). A launch with fewer work items
// than SMs pays for the smaller split (more barriers and merges a block); the README's "Prefill
// tile attention at head_dim 64" gives both figures. The split size is fixed by head_dim alone,
// never by the launch, so a token's bits do not depend on what else the launch holds.
template <int32_t D>
constexpr int32_t kTileSplitKeys = D == 64 ? 64 : 128;
template <int32_t D>
constexpr int32_t kTileBlocksPerSm = D == 64 ? 2 : 1;
template <int32_t D>
constexpr int32_t kKeyTiles = kTileSplitKeys<D> / 8;  // n8 tiles of a split's scores
template <int32_t D>
constexpr int32_t kKeySteps = kTileSplitKeys<D> / 16;  // k16 steps of P·V

// A fragments of Q for k-steps 2s and 2s + 1 from the 16-byte pieces of rows g and g + 8 at dims
// 32s + 8c: head_dim visited in a permuted order, the same for Q and K (so each dot product is
// unchanged), in which one 16-byte load of a key row serves two k-steps.
__device__ __forceinline__ void query_fragments(const uint4& row_g, const uint4& row_g8,
                                                uint32_t (&even)[4], uint32_t (&odd)[4]) {
  even[0] = row_g.x, even[1] = row_g8.x, even[2] = row_g.y, even[3] = row_g8.y;
  odd[0] = row_g.z, odd[1] = row_g8.z, odd[2] = row_g.w, odd[3] = row_g8.w;
}

// k-steps 2s, 2s + 1 of an 8-key score tile, from key g's 16-byte piece at dims 32s + 8c.
__device__ __forceinline__ void score_step_pair(float (&acc)[4], const uint32_t (&even)[4],
                                                const uint32_t (&odd)[4], const uint4& key) {
  mma_bf16_16816(acc, even, key.x, key.y);
  mma_bf16_16816(acc, odd, key.z, key.w);
}

// The split's softmax of row g + 8h (h = 0, 1: columns 2h, 2h + 1 of the C layout of the split's
// score tiles, s[t][2h + j]: key 8t + 2c + j): scores scaled, keys >= count masked
// (probability 0; count <= 0: m = −inf, l = 0), m and l the same in the quad's four threads.
// Every operation is spelled out (no contraction left to the compiler: the bits must not depend
// on how it schedules them).
template <int32_t kTiles>
__device__ __forceinline__ void split_softmax(float (&s)[kTiles][4], int32_t h, int32_t count,
                                              float scale, int32_t c, float& m, float& l) {
  float row_max = -INFINITY;
#pragma unroll
  for (int32_t t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int32_t j = 0; j < 2; ++j) {
      const float x = __fmul_rn(s[t][2 * h + j], scale);
      s[t][2 * h + j] = x;
      if (8 * t + 2 * c + j < count) row_max = fmaxf(row_max, x);
    }
  }
  row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
  row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
  float sum = 0.0f;
#pragma unroll
  for (int32_t t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int32_t j = 0; j < 2; ++j) {
      const bool live = 8 * t + 2 * c + j < count;
      const float e = live ? expf(__fsub_rn(s[t][2 * h + j], row_max)) : 0.0f;
      s[t][2 * h + j] = e;
      sum = __fadd_rn(sum, e);
    }
  }
  sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
  sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
  m = row_max;
  l = sum;
}

// P's A fragment for keys 16k .. 16k + 15 from the probabilities in C layout.
template <int32_t kTiles>
__device__ __forceinline__ void probability_fragment(uint32_t (&p)[4], const float (&s)[kTiles][4],
                                                     int32_t k) {
  p[0] = pack_bf16x2(s[2 * k][0], s[2 * k][1]);
  p[1] = pack_bf16x2(s[2 * k][2], s[2 * k][3]);
  p[2] = pack_bf16x2(s[2 * k + 1][0], s[2 * k + 1][1]);
  p[3] = pack_bf16x2(s[2 * k + 1][2], s[2 * k + 1][3]);
}

// Two 8-dim tiles of P·V (dims dim0 .. dim0 + 15) for one 16-key step: V's B fragments by
// ldmatrix.trans from the value rows, lanes 8i .. 8i + 7 addressing matrix i = (keys
// 16k + 8·(i % 2) .., dims dim0 + 8·(i / 2)).
template <int32_t D>
__device__ __forceinline__ void weigh_step(float (&lo)[4], float (&hi)[4], const uint32_t (&p)[4],
                                           const bf16* value_rows, int32_t k, int32_t dim0,
                                           int32_t lane) {
  const int32_t key = 16 * k + 8 * ((lane / 8) % 2) + lane % 8;
  uint32_t b[4];
  ldmatrix_x4_trans(b, value_rows + key * kValuePitch<D> + dim0 + 8 * (lane / 16));
  mma_bf16_16816(lo, p, b[0], b[1]);
  mma_bf16_16816(hi, p, b[2], b[3]);
}

// A row's output so far (over its splits merged in order) with a split's (m, l, o) merged in:
// w = merge_weights(m, split_m); l = merged(l, split_l, w); o = merged(o, split_o, w); m = w.m.
// The first split (m = −inf, l = o = 0) comes out exactly as computed.
struct MergeWeights {
  float m, old_weight, split_weight;
};
__device__ __forceinline__ MergeWeights merge_weights(float m, float split_m) {
  const float merged_m = fmaxf(m, split_m);
  return {merged_m, expf(__fsub_rn(m, merged_m)), expf(__fsub_rn(split_m, merged_m))};
}
__device__ __forceinline__ float merged(float x, float split_x, const MergeWeights& w) {
  return __fadd_rn(__fmul_rn(x, w.old_weight), __fmul_rn(split_x, w.split_weight));
}

constexpr int32_t kTileWarps = 8;
constexpr int32_t kTileThreads = 32 * kTileWarps;
constexpr int32_t kTileRows = kMmaRows * kTileWarps;  // rows of a tile: tokens × group
constexpr int32_t kTileStages = 2;

// Shared-memory row pitch of key and query rows, in elements: 32 more than head_dim (64 bytes),
// so the two rows of a quarter-warp's 16-byte fragment loads fall in opposite halves of the banks.
template <int32_t D>
constexpr int32_t kKeyPitch = D + 32;

template <int32_t D>
struct TileShared {
  bf16 k[kTileStages][kTileSplitKeys<D> * kKeyPitch<D>];
  bf16 v[kTileStages][kTileSplitKeys<D> * kValuePitch<D>];
  bf16 q[kTileRows * kKeyPitch<D>];  // the tile's rows' queries, bf16 (the MMA's A)
  int32_t keys[kTileRows];           // each token's keys: positions 0 .. keys − 1
  int32_t keys_max;                  // the largest of the tile's
  int32_t item;                      // the block's work item
};

// Dynamic shared memory of a tile block (opted in above 48 KB): 189 KB for head_dim 128, 67 KB
// for 64 (two blocks an SM; kernels/launch.h).
template <int32_t D>
constexpr size_t tile_shared_bytes() {
  static_assert(blocks_sharing_an_sm(sizeof(TileShared<D>)) >= 1, "a block's shared-memory limit");
  static_assert(blocks_sharing_an_sm(sizeof(TileShared<D>)) >= kTileBlocksPerSm<D>,
                "kTileBlocksPerSm blocks fit an SM");
  return sizeof(TileShared<D>);
}

struct TileArgs {
  AttentionArgs<bf16> a;
  int32_t tokens;       // of the launch's chunk
  int32_t tile_tokens;  // the most a tile takes
  int32_t* list;  // in the workspace: [0] tiles, [1] the next work item, [2 + i] tile i's first
};
constexpr int32_t kTileListHeader = 2;

__device__ __forceinline__ int32_t keys_of(const AttentionArgs<bf16>& a, int32_t local_token) {
  return min(a.positions[a.token_begin + local_token], a.shape.positions_count - 1) + 1;
}
__device__ __forceinline__ int32_t pool_row_of(const AttentionArgs<bf16>& a, int32_t local_token) {
  return a.token_pool_rows[a.token_begin + local_token];
}

// One block: the tiles' first tokens in order (a tile starts at a multiple of tile_tokens and
// where the pool row changes), their count, and the work counter reset to 0.
constexpr int32_t kTileListThreads = 1024;

__global__ void __launch_bounds__(kTileListThreads) attention_tile_list_kernel(TileArgs t) {
  __shared__ int32_t warp_starts[kTileListThreads / 32];
  __shared__ int32_t listed;
  allow_successor();
  wait_for_predecessor();  // the previous launch's kernels are done with the workspace
  const int32_t tid = static_cast<int32_t>(threadIdx.x);
  const int32_t warp = tid / 32, lane = tid % 32;
  if (tid == 0) listed = 0;
  for (int32_t begin = 0; begin < t.tokens; begin += kTileListThreads) {
    const int32_t token = begin + tid;
    const bool start = token < t.tokens && (token % t.tile_tokens == 0 ||
                                            pool_row_of(t.a, token) != pool_row_of(t.a, token - 1));
    const uint32_t starts = __ballot_sync(0xffffffffu, start);
    if (lane == 0) warp_starts[warp] = __popc(starts);
    __syncthreads();  // the warps' counts, and `listed` of the previous round
    int32_t index = listed + __popc(starts & ((1u << lane) - 1u));
    for (int32_t w = 0; w < warp; ++w) index += warp_starts[w];
    if (start) t.list[kTileListHeader + index] = token;
    __syncthreads();  // every thread has read `listed` and the counts
    if (tid == kTileListThreads - 1) listed = index + (start ? 1 : 0);
  }
  __syncthreads();
  if (tid == 0) t.list[0] = listed, t.list[1] = 0;
}

// Stores the tile's tokens' keys (and their maximum) and loads its rows' queries (bf16) for the
// KV head. Syncs the block.
template <int32_t D>
__device__ void load_tile(TileShared<D>& sh, const AttentionArgs<bf16>& a, int32_t first,
                          int32_t tokens, int32_t kv_head) {
  const int32_t tid = static_cast<int32_t>(threadIdx.x);
  if (tid == 0) sh.keys_max = 0;
  __syncthreads();
  if (tid < tokens) {
    const int32_t keys = keys_of(a, first + tid);
    sh.keys[tid] = keys;
    atomicMax(&sh.keys_max, keys);
  }
  const AttentionShape& s = a.shape;
  const int32_t group = s.query_heads / s.kv_heads;
  constexpr int32_t kPieces = D / 8;
  for (int32_t idx = tid; idx < tokens * group * kPieces; idx += kTileThreads) {
    const int32_t r = idx / kPieces;
    const int32_t j = idx - r * kPieces;
    const float* q = a.q + int64_t{a.token_begin + first + r / group} * s.query_heads * D +
                     int64_t{kv_head * group + r % group} * D + 8 * j;
    const float4 lo = *reinterpret_cast<const float4*>(q);
    const float4 hi = *reinterpret_cast<const float4*>(q + 4);
    *reinterpret_cast<uint4*>(sh.q + r * kKeyPitch<D> + 8 * j) =
        make_uint4(pack_bf16x2(lo.x, lo.y), pack_bf16x2(lo.z, lo.w), pack_bf16x2(hi.x, hi.y),
                   pack_bf16x2(hi.z, hi.w));
  }
  __syncthreads();
}

// Issues the copies of a split's K and V rows below the tile's keys into a stage, and zeroes the
// value rows past them (probability 0 times a stale row could be NaN).
template <int32_t D>
__device__ __forceinline__ void issue_split(TileShared<D>& sh, int32_t stage, int32_t split,
                                            int32_t keys_max, const int32_t* table_row,
                                            int32_t kv_head, const AttentionArgs<bf16>& a) {
  constexpr int32_t kPieces = D / 8;
  const AttentionShape& s = a.shape;
  const int32_t first_key = split * kTileSplitKeys<D>;
  const int32_t count = min(kTileSplitKeys<D>, keys_max - first_key);
  const int64_t kv_size = int64_t{s.kv_heads} * D;
  const int64_t head_offset = int64_t{kv_head} * D;
  for (int32_t idx = threadIdx.x; idx < count * kPieces; idx += kTileThreads) {
    const int32_t x = idx / kPieces;
    const int32_t j = idx - x * kPieces;
    const int64_t at =
        ops::slot_in_table(table_row, s.page_size, first_key + x) * kv_size + head_offset + 8 * j;
    copy_async_16(sh.k[stage] + x * kKeyPitch<D> + 8 * j, a.k_cache + at);
    copy_async_16(sh.v[stage] + x * kValuePitch<D> + 8 * j, a.v_cache + at);
  }
  for (int32_t idx = count * kPieces + threadIdx.x; idx < kTileSplitKeys<D> * kPieces;
       idx += kTileThreads) {
    const int32_t x = idx / kPieces;
    const int32_t j = idx - x * kPieces;
    *reinterpret_cast<uint4*>(sh.v[stage] + x * kValuePitch<D> + 8 * j) = make_uint4(0, 0, 0, 0);
  }
}

// A warp's rows 16w .. 16w + 15 through one split of a stage: scores (k-steps in the permuted
// order, Q and K fragments as 16-byte shared-memory loads), split_softmax, P·V over the eight
// 16-key steps, then the split merged into the rows' running (m, l, o) where it has keys.
template <int32_t D>
__device__ __forceinline__ void compute_split(const TileShared<D>& sh, int32_t stage,
                                              int32_t first_key, const int32_t (&row_keys)[2],
                                              float (&run_m)[2], float (&run_l)[2],
                                              float (&run)[D / 8][4]) {
  const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t g = lane / 4, c = lane % 4;
  const bf16* q = sh.q + (kMmaRows * warp + g) * kKeyPitch<D> + 8 * c;
  const bf16* k = sh.k[stage] + g * kKeyPitch<D> + 8 * c;
  float sc[kKeyTiles<D>][4] = {};
#pragma unroll
  for (int32_t step = 0; step < D / 32; ++step) {
    uint32_t even[4], odd[4];
    query_fragments(*reinterpret_cast<const uint4*>(q + 32 * step),
                    *reinterpret_cast<const uint4*>(q + 8 * kKeyPitch<D> + 32 * step), even, odd);
#pragma unroll
    for (int32_t t = 0; t < kKeyTiles<D>; ++t) {
      score_step_pair(sc[t], even, odd,
                      *reinterpret_cast<const uint4*>(k + 8 * t * kKeyPitch<D> + 32 * step));
    }
  }
  const int32_t count[2] = {row_keys[0] - first_key, row_keys[1] - first_key};
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  float m[2], l[2];
  split_softmax(sc, 0, count[0], scale, c, m[0], l[0]);
  split_softmax(sc, 1, count[1], scale, c, m[1], l[1]);
  uint32_t p[kKeySteps<D>][4];  // bf16 probabilities: the fp32 scores' registers are free for P·V
#pragma unroll
  for (int32_t step = 0; step < kKeySteps<D>; ++step) probability_fragment(p[step], sc, step);
  float out[D / 8][4] = {};
#pragma unroll
  for (int32_t step = 0; step < kKeySteps<D>; ++step) {
#pragma unroll
    for (int32_t pair = 0; pair < D / 16; ++pair) {
      weigh_step<D>(out[2 * pair], out[2 * pair + 1], p[step], sh.v[stage], step, 16 * pair, lane);
    }
  }
#pragma unroll
  for (int32_t h = 0; h < 2; ++h) {
    if (count[h] <= 0) continue;  // the split is past the row's keys
    const MergeWeights w = merge_weights(run_m[h], m[h]);
    run_l[h] = merged(run_l[h], l[h], w);
    run_m[h] = w.m;
#pragma unroll
    for (int32_t n = 0; n < D / 8; ++n) {
#pragma unroll
      for (int32_t j = 0; j < 2; ++j) {
        run[n][2 * h + j] = merged(run[n][2 * h + j], out[n][2 * h + j], w);
      }
    }
  }
}

// The tile's outputs from the rows' merged (l, o): rows g and g + 8 of the warp, o / l in bf16.
template <int32_t D>
__device__ __forceinline__ void store_tile(const AttentionArgs<bf16>& a, int32_t first,
                                           int32_t rows, int32_t kv_head, const float (&run_l)[2],
                                           const float (&run)[D / 8][4]) {
  const AttentionShape& s = a.shape;
  const int32_t group = s.query_heads / s.kv_heads;
  const int32_t lane = threadIdx.x % 32;
  const int32_t row0 = kMmaRows * (threadIdx.x / 32) + lane / 4;
#pragma unroll
  for (int32_t h = 0; h < 2; ++h) {
    const int32_t r = row0 + 8 * h;
    if (r >= rows) continue;
    bf16* o = a.out + int64_t{a.token_begin + first + r / group} * s.query_heads * D +
              int64_t{kv_head * group + r % group} * D + 2 * (lane % 4);
#pragma unroll
    for (int32_t n = 0; n < D / 8; ++n) {
      *reinterpret_cast<__nv_bfloat162*>(o + 8 * n) = __floats2bfloat162_rn(
          __fdiv_rn(run[n][2 * h], run_l[h]), __fdiv_rn(run[n][2 * h + 1], run_l[h]));
    }
  }
}

template <int32_t D>
__global__ void __launch_bounds__(kTileThreads, kTileBlocksPerSm<D>)
    attention_tile_kernel(TileArgs t) {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  extern __shared__ __align__(16) unsigned char tile_shared[];
  TileShared<D>& sh = *reinterpret_cast<TileShared<D>*>(tile_shared);
  allow_successor();
  wait_for_predecessor();
  const AttentionArgs<bf16>& a = t.a;
  const AttentionShape& s = a.shape;
  const int32_t group = s.query_heads / s.kv_heads;
  const int32_t row0 = kMmaRows * static_cast<int32_t>(threadIdx.x / 32) +
                       static_cast<int32_t>(threadIdx.x % 32) / 4;
  const int32_t tiles = t.list[0];
  for (;;) {
    if (threadIdx.x == 0) sh.item = atomicAdd(t.list + 1, 1);
    __syncthreads();
    const int32_t item = sh.item;  // rewritten only after this item's barriers
    if (item >= tiles * s.kv_heads) break;
    const int32_t tile = tiles - 1 - item / s.kv_heads;  // a chunk's later tokens have more keys
    const int32_t kv_head = item % s.kv_heads;
    const int32_t first = t.list[kTileListHeader + tile];
    const int32_t tokens =
        (tile + 1 < tiles ? t.list[kTileListHeader + tile + 1] : t.tokens) - first;
    load_tile<D>(sh, a, first, tokens, kv_head);
    const int32_t rows = tokens * group;
    const int32_t keys_max = sh.keys_max;
    const int32_t splits = (keys_max + kTileSplitKeys<D> - 1) / kTileSplitKeys<D>;
    const int32_t* table_row = a.table + int64_t{pool_row_of(a, first)} * s.table_width;
    const int32_t row_keys[2] = {row0 < rows ? sh.keys[row0 / group] : 0,
                                 row0 + 8 < rows ? sh.keys[(row0 + 8) / group] : 0};
    const bool has_rows = kMmaRows * static_cast<int32_t>(threadIdx.x / 32) < rows;  // warp-uniform
    float run_m[2] = {-INFINITY, -INFINITY}, run_l[2] = {0.0f, 0.0f};
    float run[D / 8][4] = {};
    issue_split<D>(sh, 0, 0, keys_max, table_row, kv_head, a);
    copy_async_commit();
    for (int32_t split = 0; split < splits; ++split) {
      if (split + 1 < splits) {
        issue_split<D>(sh, (split + 1) % kTileStages, split + 1, keys_max, table_row, kv_head, a);
        copy_async_commit();
        copy_async_wait_older();  // this thread's copies of `split` landed
      } else {
        copy_async_wait_all();
      }
      __syncthreads();  // everyone's, and the zeroed value rows
      if (has_rows) {
        compute_split<D>(sh, split % kTileStages, split * kTileSplitKeys<D>, row_keys, run_m,
                         run_l, run);
      }
      __syncthreads();  // the stage is free for split + 2's copies
    }
    if (has_rows) store_tile<D>(a, first, rows, kv_head, run_l, run);
  }
}


// Launches the tile list and the tile kernel over the first `tokens` tokens of `a`, in
// launches whose tile list fits the workspace (one int a token: a workspace that holds one
// token's decode partials lists thousands of tokens, so more than one launch is rare). Tiles start
// at each launch's first token; a token's bits do not depend on its tile. `resident`: the tile
// kernel's blocks that fit the GPU at once (the grid never exceeds one wave: the blocks take
// work items until none is left, so a wave is enough and more would only wait).
template <int32_t D>
cudaError_t launch_tile_range(const AttentionArgs<bf16>& a, int32_t tokens, size_t workspace_floats,
                              int32_t resident, LaunchStream stream) {
  const AttentionShape& s = a.shape;
  const int32_t tile_tokens = kTileRows / (s.query_heads / s.kv_heads);
  const int32_t per_launch = static_cast<int32_t>(
      std::min<size_t>(workspace_floats - kTileListHeader, static_cast<size_t>(tokens)));
  for (int32_t begin = 0; begin < tokens; begin += per_launch) {
    AttentionArgs<bf16> args = a;
    args.token_begin = begin;
    const int32_t n = std::min(per_launch, tokens - begin);
    const TileArgs tiles{args, n, tile_tokens, reinterpret_cast<int32_t*>(a.workspace)};
    cudaError_t status =
        launch_kernel(attention_tile_list_kernel, dim3(1), kTileListThreads, 0, stream, tiles);
    if (status != cudaSuccess) return status;
    // No more blocks than the fewest work items the launch can have (a tile has at most
    // tile_tokens tokens): with two blocks an SM, idle blocks would otherwise crowd the busy ones
    // onto fewer SMs.
    const int64_t items_min = int64_t{(n + tile_tokens - 1) / tile_tokens} * s.kv_heads;
    const auto grid = static_cast<uint32_t>(std::min<int64_t>(resident, items_min));
    status = launch_kernel(attention_tile_kernel<D>, dim3(grid), kTileThreads,
                           tile_shared_bytes<D>(), stream, tiles);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace ls::kernels
