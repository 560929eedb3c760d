// The Mamba2 mixer of the CUDA backend, between its in_proj and out_proj GEMMs, and the ops on the
// recurrent-state pool. Launchers take raw device pointers, sizes and a stream, validate their
// arguments, and return the launch status (STYLE.md §2–3). The CPU reference is
// core/mamba_mixer.h's mamba_mixer_token, run for each token of a row in order, and CpuModel's
// copy_mamba_state / zero_mamba_state and CpuBackend::snapshot_mamba_checkpoints;
// tests/gpu/mamba_ops_gpu_test.cpp compares them.
//
// launch_mamba_mixer runs the sequential scan: every row is a run of consecutive tokens (one at
// decode, a chunk at prefill) updating its own working slot, and each (head, state row) of a row
// walks the row's tokens in ascending order with the state in registers, the CPU reference's
// order. So a token's result depends only on its row's earlier tokens and state: the same bits
// whatever else is in the batch, and a prompt prefilled whole, in chunks or token by token
// (decode) gives the same bits. Every reduction has one fixed order for a given shape. Prefill
// and mixed steps use kernels/mamba_scan.h's chunked scan instead (SSD blocks on a grid of
// absolute positions; what it keeps bit-identical is listed there); a row with no complete block
// — a verified row among them — gets the same bits from both.
#pragma once

#include "core/ops/host_device.h"
#include "kernels/launch.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ls::kernels {

// Limits of the register-resident windows and states (Mamba2 checkpoints: kernel 4, state ≤ 256).
constexpr int32_t kMambaConvKernelMax = 8;
constexpr int32_t kMambaStateSizeMax = 256;
// Entries of one pool-op launch (held in shared memory: 8 bytes each).
constexpr int32_t kMambaPoolOpsMax = 4096;

// The mixer's shape (core/config.h MambaConfig, plus the norm's eps), as plain data for nvcc.
struct MambaShape {
  int32_t heads_count = 0;
  int32_t head_dim = 0;
  int32_t groups_count = 0;
  int32_t state_size = 0;
  int32_t conv_kernel = 0;
  float dt_min = 0.0f;   // time_step_limit[0]
  float dt_max = 0.0f;   // time_step_limit[1]
  float rms_eps = 0.0f;  // the gated RMSNorm's eps (the model's rms_eps)

  LS_HOST_DEVICE int32_t inner_size() const { return heads_count * head_dim; }
  LS_HOST_DEVICE int32_t conv_dim() const { return inner_size() + 2 * groups_count * state_size; }
  LS_HOST_DEVICE int32_t in_proj_size() const { return inner_size() + conv_dim() + heads_count; }
  LS_HOST_DEVICE int64_t conv_state_floats() const { return int64_t{conv_dim()} * conv_kernel; }
  LS_HOST_DEVICE int64_t ssm_state_floats() const {
    return int64_t{heads_count} * head_dim * state_size;
  }
};

// One layer's mixer parameters, fp32 in both precisions (they are small).
struct MambaLayerParams {
  const float* conv_weight = nullptr;  // [conv_dim, conv_kernel]
  const float* conv_bias = nullptr;    // [conv_dim], or null when the model has none
  const float* dt_bias = nullptr;      // [heads]
  const float* a_log = nullptr;        // [heads] A = −exp(a_log)
  const float* d_skip = nullptr;       // [heads] D
  const float* norm_weight = nullptr;  // [inner] the gated RMSNorm's weight
};

// One layer's state in the slot pool, fp32: slot s's conv window [conv_dim, conv_kernel] (oldest
// input first) at conv + s · slot_stride_floats, its SSM state [heads, head_dim, state_size] at
// ssm + s · slot_stride_floats. With the CPU's pool layout [slots, mamba layers, conv then SSM],
// conv = pool + layer_index · (conv + SSM floats), ssm = conv + conv_state_floats and the stride
// is one slot's floats.
struct MambaStateView {
  float* conv = nullptr;
  float* ssm = nullptr;
  int64_t slot_stride_floats = 0;
};

// The rows of a launch, in device memory (a captured graph reads each step's values): row r owns
// tokens [token_offsets[r], token_offsets[r] + token_counts[r]) and updates slot slots[r]. A
// padded row has slot −1 (slot 0 is a real slot): it reads and writes no state and its tokens'
// outputs are zeros. The launch runs rows [0, rows_grid).
// `verify_base` (speculative decoding; null: none) [rows_grid]: −1, or a verified decode row's
// first verify-state slot (core/limits.h mamba_verify_slot): its token j then leaves the state
// after it in slot verify_base[r] + j, and its working slot is read, never written — the commit
// (launch_mamba_verify_commit_pairs) copies the accepted one back. The same updates in the same
// order either way: only where the states land differs.
struct MambaRows {
  const int32_t* token_offsets = nullptr;  // [rows_grid]
  const int32_t* token_counts = nullptr;   // [rows_grid]
  const int32_t* slots = nullptr;          // [rows_grid]
  int32_t rows_grid = 0;
  const int32_t* verify_base = nullptr;    // [rows_grid], or null
};

// Floats of workspace a launch over `tokens_count` tokens needs: the conv output
// [tokens, conv_dim] and the scan output [tokens, inner], fp32.
size_t mamba_workspace_floats(const MambaShape& shape, int32_t tokens_count);

// proj [tokens_count, in_proj_size] fp32: the in_proj GEMM's output (gate, xBC, dt per token).
// Every token in [0, tokens_count) belongs to exactly one row, and no two real rows share a slot
// (the executor's rules; the kernels trust them). Updates each real row's state and writes
// out [tokens_count, inner] T = RMSNorm(y · silu(gate)), the out_proj GEMM's input; a padded row's
// tokens get y = 0, so their outputs are zeros when their gate is finite (the backend's scrubbed
// inputs give finite gates). Needs 1 <= conv_kernel <= kMambaConvKernelMax,
// 1 <= state_size <= kMambaStateSizeMax and heads_count % groups_count == 0.
template <typename T>
cudaError_t launch_mamba_mixer(const MambaShape& shape, const MambaLayerParams& params,
                               const MambaStateView& state, const MambaRows& rows,
                               const float* proj, int32_t tokens_count, float* workspace,
                               size_t workspace_floats, T* out, LaunchStream stream);

// The state-pool ops, whole slots of `slot_floats` floats at pool + s · slot_floats, with their
// indices read from device memory (graph-capturable: a graph passes its padded grid).
// Copies pool[dst] = pool[src] for the pairs [pairs_grid, 2] int32 (src, dst), in list order
// (a chain a→b, b→c leaves a's state in c); a pair with a −1 is skipped (padding). The
// indices must be slots of the pool (the forward op's validation); pairs_grid <=
// kMambaPoolOpsMax.
cudaError_t launch_mamba_copy_slots(float* pool, int64_t slot_floats, const int32_t* pairs,
                                    int32_t pairs_grid, LaunchStream stream);

// The DECODE step's checkpoint rule, after the commit (CpuBackend::snapshot_mamba_checkpoints):
// for each snapshot (row, src, dst) of snapshots [snapshots_grid, 3] int32, pairs[i] = (src, dst)
// when the row's new vcl ends a page, vcl[pool_rows[row]] % page_size == 0, else (−1, −1); a
// snapshot with row −1 is padding. pairs [snapshots_grid, 2] then feeds launch_mamba_copy_slots.
// With `verify_base` and `vcl_before` ([rows] device memory; both null: no verified rows), a
// snapshot of a row with verify_base[row] >= 0 follows the rule with a drafter (seed spec §4
// invariant 6; CpuBackend::snapshot_verified_row): old = vcl_before[row], new =
// vcl[pool_rows[row]], fb = (old div P + 1)·P; pairs[i] = (verify_base[row] + fb − old − 1, dst)
// iff fb <= new, else (−1, −1).
cudaError_t launch_mamba_snapshot_pairs(const int32_t* snapshots, int32_t snapshots_grid,
                                        const int32_t* pool_rows, const int32_t* vcl,
                                        int32_t page_size, int32_t* pairs, LaunchStream stream,
                                        const int32_t* verify_base = nullptr,
                                        const int32_t* vcl_before = nullptr);

// The commit of verified rows' recurrent state (CpuBackend::commit_verified_state), after the
// token commit: for each row r of [rows_grid] with verify_base[r] >= 0 and a' = vcl[pool_rows[r]]
// − vcl_before[r] >= 1, pairs[r] = (verify_base[r] + a' − 1, slots[r]) — the state after the last
// accepted token into the working slot — else (−1, −1); pairs [rows_grid, 2] then feeds
// launch_mamba_copy_slots. rows_grid <= kMambaPoolOpsMax.
cudaError_t launch_mamba_verify_commit_pairs(const int32_t* slots, const int32_t* verify_base,
                                             int32_t rows_grid, const int32_t* pool_rows,
                                             const int32_t* vcl, const int32_t* vcl_before,
                                             int32_t* pairs, LaunchStream stream);

// Zeroes pool[s] for s in slots [slots_grid] int32 (<= kMambaPoolOpsMax); −1 entries are skipped.
cudaError_t launch_mamba_zero_slots(float* pool, int64_t slot_floats, const int32_t* slots,
                                    int32_t slots_grid, LaunchStream stream);

// The record's state digests (core/logits_digest.h mamba_state_digest: the logits digest over a
// slot's slot_floats fp32 values, with V = slot_floats): digests[r] for each r in [0, rows_grid)
// whose slots[r] >= 0 (device memory: a graph reads each step's list); a −1 entry (padding) is
// skipped and its digest left as it was. Two launches: a grid over (chunk of the slot, row)
// writes each chunk's integer lane sums into workspace, then one block per row adds its chunks
// (integer sums: the same bits in any order) and finishes. rows_grid <= kMambaPoolOpsMax,
// slot_floats < 2^32 (the digest's index is 32-bit), workspace of
// mamba_digest_workspace_words(slot_floats, rows_grid) words.
size_t mamba_digest_workspace_words(int64_t slot_floats, int32_t rows_grid);
cudaError_t launch_mamba_state_digests(const float* pool, int64_t slot_floats,
                                       const int32_t* slots, int32_t rows_grid,
                                       uint32_t* workspace, size_t workspace_words,
                                       uint64_t* digests, LaunchStream stream);

}  // namespace ls::kernels
