// The Mamba2 mixer's scans on the CUDA backend: the sequential scan (a decode step's update, and
// the fringes of a prefill row) and the chunked scan of prefill (SSD, Mamba2's state-space
// duality). kernels/mamba_ops.h's launch_mamba_mixer runs the sequential scan over every token;
// launch_mamba_mixer_chunked runs the chunked one, for prefill and mixed steps.
//
// The chunked scan cuts each row's tokens on a grid of kMambaScanChunk ABSOLUTE positions (the
// row's first token's position, the state's length, decides where the grid falls): the tokens up
// to the first grid point (the head) and after the last complete block (the tail) go through the
// sequential scan, each complete block [kQ, (k + 1)Q) through SSD — within the block the outputs
// are a masked matrix product (C·Bᵀ ∘ decay) · x plus C · (decayed state at the block's start),
// the block's state contribution a product Bᵀ · (decayed x), and the states pass from block to
// block in ascending order. Every reduction has one order fixed by the shape, so:
//  * the same bits run to run, whatever the batch, the row's place in it and its slot;
//  * a prompt gives the same bits however it is cut into prefill chunks, as long as every cut
//    lands on the grid (position % kMambaScanChunk == 0; page-aligned chunks do when the page
//    size is a multiple of it); a cut off the grid makes its block go sequential in two pieces,
//    which rounds differently (the same function to fp32 rounding, not the same bits);
//  * a row with no complete block (a decode row, a short chunk) gets exactly the sequential
//    scan's bits, so decode rows in a mixed step equal decode rows in a decode step; but a
//    prompt prefilled and the same tokens decoded one by one are not bit-identical.
// The SSD arithmetic is fp32 on the CUDA cores (both precisions: the state and the scan stay
// fp32), with fused multiply-adds; it is the sequential recurrence reassociated, so it agrees with
// the CPU reference to fp32 rounding (tests/gpu/mamba_scan_gpu_test.cpp states the bound).
#pragma once

#include "kernels/mamba_ops.h"

namespace ls::kernels {

// Tokens of an SSD block: the grid of absolute positions the chunked scan cuts rows on.
constexpr int32_t kMambaScanChunk = 64;

// Floats of workspace launch_mamba_mixer_chunked needs for `tokens_count` tokens: the sequential
// launch's (mamba_workspace_floats) plus, for each of the at most tokens_count / kMambaScanChunk
// complete blocks, its state [heads, head_dim, state_size], its step sizes, log decays and their
// sums [heads, kMambaScanChunk] each, and its C·Bᵀ [groups, kMambaScanChunk, kMambaScanChunk].
size_t mamba_chunked_workspace_floats(const MambaShape& shape, int32_t tokens_count);

// launch_mamba_mixer's contract (kernels/mamba_ops.h), plus positions [tokens_count] int32 in
// device memory: each token's absolute position; only a row's first token's is read, and only to
// place the block grid (any value gives a correct result; the values decide which bits). Needs
// workspace_floats >= mamba_chunked_workspace_floats(shape, tokens_count).
template <typename T>
cudaError_t launch_mamba_mixer_chunked(const MambaShape& shape, const MambaLayerParams& params,
                                       const MambaStateView& state, const MambaRows& rows,
                                       const int32_t* positions, const float* proj,
                                       int32_t tokens_count, float* workspace,
                                       size_t workspace_floats, T* out, LaunchStream stream);

// ---- The stages the two launchers share (arguments validated by the launchers) ------------

// launch_mamba_mixer's argument rules with `needed_floats` of workspace: cudaErrorInvalidValue, or
// cudaSuccess (the launch then returns at once when tokens_count is 0). mamba_ops.cu.
cudaError_t check_mamba_mixer(const MambaShape& shape, const MambaLayerParams& params,
                              const MambaStateView& state, const MambaRows& rows,
                              const float* proj, int32_t tokens_count, const float* workspace,
                              size_t workspace_floats, size_t needed_floats, const void* out);

// Which of a row's tokens a sequential scan launch walks: all of them, or the chunked scan's
// head (up to the first complete block; the whole row when it has none) or tail.
enum class MambaScanSpan : int32_t { kWhole, kHead, kTail };

// The sequential scan of the rows' `span` tokens (positions: read unless span is kWhole), from
// conv_out [tokens, conv_dim] into y [tokens, inner]; a padded row's tokens get y = 0 (in the
// kWhole and kHead launches). mamba_scan.cu.
cudaError_t launch_mamba_scan_rows(const MambaShape& shape, const MambaLayerParams& params,
                                   const MambaStateView& state, const MambaRows& rows,
                                   const int32_t* positions, MambaScanSpan span, const float* proj,
                                   const float* conv_out, float* y, LaunchStream stream);

// out [tokens, inner] = RMSNorm(y · silu(gate)) per token (y is overwritten with the gated
// value). mamba_ops.cu.
template <typename T>
cudaError_t launch_mamba_gated_norm(const MambaShape& shape, const float* norm_weight,
                                    const float* proj, float* y, int32_t tokens_count, T* out,
                                    LaunchStream stream);

// The SSD stages over the rows' complete blocks (mamba_ssd.cu), in this order after the head's
// sequential scan: the blocks' step sizes and decay sums and C·Bᵀ, each block's own state
// contribution, the pass of the states through the blocks (the slot ends at the last block's
// end state), and the blocks' outputs into y.
struct MambaSsdWorkspace {
  float* states = nullptr;  // [blocks, heads, head_dim, state_size]
  float* steps = nullptr;   // [blocks, heads, kMambaScanChunk] step sizes Δ_t
  float* rates = nullptr;   // [blocks, heads, kMambaScanChunk] Δ_t · A (the log of the decay)
  float* sums = nullptr;    // [blocks, heads, kMambaScanChunk] their inclusive sums from t = 0
  float* cb = nullptr;      // [blocks, groups, kMambaScanChunk, kMambaScanChunk]
  int32_t blocks = 0;       // tokens_count / kMambaScanChunk
};
cudaError_t launch_mamba_ssd(const MambaShape& shape, const MambaLayerParams& params,
                             const MambaStateView& state, const MambaRows& rows,
                             const int32_t* positions, const float* proj, const float* conv_out,
                             const MambaSsdWorkspace& ssd, float* y, LaunchStream stream);

}  // namespace ls::kernels
