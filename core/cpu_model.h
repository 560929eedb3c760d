// The CPU reference forward pass: fp32, single-threaded, batch-invariant by construction.
//
// Every token's arithmetic depends only on its own id, its position and the KV of the positions
// before it: linear layers are per-token dot products with one fixed summation order, attention
// walks keys in ascending position with a fixed-order softmax. So a request's logits are
// bit-identical whatever else is in the batch, however its prompt was chunked, and whichever pool
// row it sits in — the property every CUDA kernel is checked against.
//
// Tensor parallelism is simulated in the one process (core/tensor_parallel.h): each rank computes
// its shard of every layer and the row-parallel partials meet in a fixed-order all-reduce.
#pragma once

#include "core/activations.h"
#include "core/cache_op.h"
#include "core/config.h"
#include "core/host_memory.h"
#include "core/mamba_mixer.h"
#include "core/model/rope.h"
#include "core/model/weights.h"
#include "core/tensor_parallel.h"

#include <cstdint>
#include <span>
#include <vector>

namespace ls {

// What the forward reads for each token of the step.
struct ForwardTokens {
  std::span<const int32_t> input_ids;  // [T], already clamped to [0, V)
  std::span<const int32_t> positions;  // [T]
  std::span<const int64_t> slots;      // [T] KV slot each token writes
  std::span<const int32_t> pool_rows;  // [T] pool row of each token's request
  std::span<const int32_t> logits_token_index;  // [rows] tokens whose logits are wanted
  std::span<const int32_t> mamba_slots;  // [T] working state slot of each token's request, or
                                         // empty when the model has no Mamba layers
  // [T] with speculative decoding on such a model (else empty): −1 where the token updates its
  // working slot in place; for token j of a verified decode row, its verify-state slot
  // (Limits::mamba_verify_slot(row, j)), which takes the state after the token — read from the
  // working slot (j = 0) or the previous token's verify-state slot, the working slot left as is.
  std::span<const int32_t> mamba_verify_slots;
};

class CpuModel {
 public:
  // `tp_degree`: the ranks simulated; ls::Error naming the field when the model cannot shard.
  CpuModel(const ModelWeights& weights, const ExecutorConfig& config, int32_t tp_degree = 1);

  // The collectives a TP group issues per layer: the all-reduces after o and after down.
  static constexpr int32_t kCollectivesPerLayer = 2;

  // Runs every layer over the step's tokens, writing K/V at their slots, and fills
  // `logits` [rows, V]. `table` is the [pool rows, Wp] block table used to find earlier keys.
  void forward(const ForwardTokens& tokens, std::span<const int32_t> table,
               std::span<float> logits);

  // Per-layer activations (core/activations.h): while `sink` is set, every forward replaces its
  // contents with the step's tensors; null (the default) captures nothing. ls::Error naming the
  // reason for a model or a degree the capture does not cover (Mamba layers, TP > 1).
  void capture_activations(StepActivations* sink);

  int64_t kv_slots_count() const { return kv_slots_count_; }
  bool has_recurrent_state() const { return model_.has_recurrent_state(); }
  // The recurrent-state pool (core/limits.h mamba_slots_count slots, then the
  // mamba_verify_slots_count verify-state slots): each slot holds, for every Mamba layer, the
  // conv window then the SSM state.
  void zero_mamba_state(int32_t slot);
  void copy_mamba_state(int32_t src, int32_t dst);
  // One slot's state, every Mamba layer's conv window and SSM state in layer order (tests).
  std::vector<float> read_mamba_state(int32_t slot) const;
  // mamba_state_digest (core/logits_digest.h) of one slot: its floats are stored in that order.
  uint64_t mamba_state_digest(int32_t slot) const;
  // Copies whole pages between the device KV pool and the host pool.
  // KV pages, and with op.state_slot >= 0 the recurrent state of that slot.
  void copy_pages(const CacheOp& op);
  int32_t tp_degree() const { return tp_.degree(); }
  // The collectives the last forward issued, in order (tests: an IDLE forward issues the same).
  const std::vector<CollectiveCall>& collectives() const { return group_.calls(); }

 private:
  void init_mamba_pool(const ExecutorConfig& config, int32_t tp_degree);
  void attention_layer_qkv(int32_t layer, const ForwardTokens& tokens);
  void attention_layer_out(int32_t layer, const ForwardTokens& tokens,
                           std::span<const int32_t> table);
  void rank_qkv_heads(const LayerWeights& w, ShardRange q_heads, ShardRange kv_heads,
                      int32_t position, float* q, float* k, float* v);
  void ffn_layer(int32_t layer, int32_t tokens_count);
  void mamba_layer(int32_t layer, const ForwardTokens& tokens);
  void mamba_token(const LayerWeights& w, float* state, const float* normed, float* out);
  float* mamba_state_at(int32_t slot, int32_t layer);
  float* verified_token_state(int32_t working, int32_t verify_slot, int32_t layer);
  void copy_host_state(const CacheOp& op);
  void lm_head(std::span<const int32_t> logits_token_index, std::span<float> logits);
  void reduce_into_residual(int32_t tokens_count);
  float* partial_at(int32_t rank, int32_t token, int32_t tokens_count);
  void attend_tile(int32_t layer, const ForwardTokens& tokens, std::span<const int32_t> table,
                   int32_t first, int32_t n, ShardRange heads);
  int32_t rope_position(int32_t position) const;
  int32_t keys_at(int32_t position) const;
  void attend_head(int32_t layer, int32_t token, int32_t position,
                   std::span<const int32_t> table_row, int32_t head, float* scores, float* out);
  float* kv_at(int64_t slot, int32_t layer, int32_t which);
  void capture_qkv(int32_t layer, const ForwardTokens& tokens);
  void capture_rows(int32_t layer, ActivationKind kind, const float* rows, int32_t count,
                    int32_t width);

  const ModelWeights& weights_;
  ModelConfig model_;
  ExecutorConfig limits_;
  RopeTable rope_;
  TpLayout tp_;
  CpuTpGroup group_;
  int64_t kv_slots_count_ = 0;

  ZeroedFloats kv_;         // [slots, layers, 2, kv_size] K then V per layer
  ZeroedFloats host_kv_;    // [host pages · P, layers, 2, kv_size]
  std::vector<float> residual_;   // [step_tokens_max, hidden]
  std::vector<float> normed_;     // [step_tokens_max, hidden]
  std::vector<float> partials_;   // [tp degree, step_tokens, hidden] row-parallel partial sums
  std::vector<float> reduced_;    // [step_tokens_max, hidden] their all-reduce
  std::vector<float> q_;          // [step_tokens_max, q_size]
  int32_t token_tile_ = 1;        // tokens a product takes at once (cpu_model.cpp kTokenTile)
  std::vector<float> attn_out_;   // [token tile, q_size]
  std::vector<float> gate_;       // [token tile, ffn]
  std::vector<float> up_;         // [token tile, ffn]
  std::vector<float> scores_;     // [cores, positions]: each attend_tile thread's scores
  StepActivations* capture_ = nullptr;  // borrowed; null: no capture
  ActivationTensor* attn_capture_ = nullptr;  // the layer's attn_out while it is computed

  // Recurrent state: per slot, per Mamba layer, [conv_dim · conv_kernel] then
  // [heads · head_dim · state_size].
  std::vector<int32_t> mamba_index_;  // [layers] the layer's index among the Mamba layers, or −1
  int64_t mamba_layer_floats_ = 0;    // one slot's state in one Mamba layer
  int64_t mamba_slot_floats_ = 0;     // one slot's state, all Mamba layers
  int32_t mamba_pool_slots_ = 0;      // mamba_slots_count + mamba_verify_slots_count
  ZeroedFloats mamba_states_;   // [mamba_pool_slots_, mamba layers, mamba_layer_floats_]
  ZeroedFloats host_mamba_states_;  // [host_pages_count, ...]: swapped-out states
  std::vector<float> proj_;           // [in_proj_size] one token's in_proj output
  MambaScratch mamba_scratch_;        // one token's conv output and step sizes
  std::vector<float> mamba_y_;        // [inner]
};

}  // namespace ls
