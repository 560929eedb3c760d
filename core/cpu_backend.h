// The CPU reference backend: device state in host vectors, the model in fp32 (CpuModel), and the
// state rules as plain loops — the oracle each CUDA kernel and state op is compared against.
#pragma once

#include "core/backend.h"
#include "core/cpu_model.h"
#include "core/drafter.h"
#include "core/sampling.h"

#include <memory>
#include <utility>

namespace ls {

class CpuBackend final : public Backend {
 public:
  // `verifier` decides decode rows (tests pass a stub); null means StandardVerifier.
  // `stub_model` replaces the model arithmetic with cheap deterministic logits (a hash of the
  // token's id and position) while every state rule still runs: the control plane alone.
  // `drafter` proposes the next round's drafts inside each step; null (or W = 1) means none: the
  // next round's columns all repeat the last emitted token.
  // `tp_degree`: the tensor-parallel ranks the model simulates (core/tensor_parallel.h); ls::Error
  // naming the field when the model cannot shard that way, or when the stub model is asked to.
  CpuBackend(const ModelWeights& weights, const ExecutorConfig& config,
             std::unique_ptr<Verifier> verifier = nullptr, bool stub_model = false,
             std::unique_ptr<Drafter> drafter = nullptr, int32_t tp_degree = 1);

  std::string name() const override { return "cpu"; }
  // What a trace header records: the drafter's name, or "none".
  std::string drafter_name() const;
  int32_t tp_degree() const { return model_.tp_degree(); }
  // The collectives the last forward issued (an IDLE step issues the same ones, with no rows).
  const std::vector<CollectiveCall>& collectives() const { return model_.collectives(); }
  bool has_recurrent_state() const override { return model_.has_recurrent_state(); }
  void apply_state_rules(const StepPlan& plan) override;
  // The recurrent state of one slot (tests): every Mamba layer's conv window and SSM state.
  std::vector<float> read_mamba_state(int32_t slot) const { return model_.read_mamba_state(slot); }
  void apply_table_writes(const StepPlan& plan) override;
  void reset_lengths(const StepPlan& plan) override;
  void fill_inputs(const StepPlan& plan) override;
  void forward(const StepPlan& plan) override;
  void poison_logits(std::span<const int32_t> logits_rows, float value) override;
  void finish_step(const StepPlan& plan, StepResult& result) override;
  void copy_pages(const CacheOp& op) override { model_.copy_pages(op); }
  StateSnapshot read_state(std::span<const int32_t> pool_rows) const override;
  InputSnapshot read_inputs() const override;
  std::vector<uint64_t> read_mamba_digests(std::span<const int32_t> slots) const override;
  void capture_activations(ActivationCapture mode) override;
  StepActivations take_activations() override;

 private:
  void guard_logits(const StepPlan& plan, StepResult& result);
  void sample_prefill_rows(const StepPlan& plan, StepResult& result);
  static std::span<const TopLogit> recorded_top(const StepResult& result, int32_t first,
                                                int32_t count);
  void verify_decode_rows(const StepPlan& plan, StepResult& result);
  void commit_decode_row(const StepPlan& plan, int32_t row, std::span<const int32_t> out,
                         int32_t accepted);
  void write_next_inputs(int32_t rpi, RequestId request_id, int32_t bonus, int32_t position,
                         bool draft);
  void record_input_history(const StepPlan& plan);
  void write_history(int32_t rpi, int32_t position, int32_t token);
  void flag_and_clamp_outputs(const StepPlan& plan, StepResult& result);
  void commit_verified_state(const StepPlan& plan, int32_t row, int32_t accepted);
  void snapshot_mamba_checkpoints(const StepPlan& plan);
  void snapshot_verified_row(const StepPlan& plan, const MambaSnapshot& s);
  static void clear_optional_fields(StepResult& result);
  void fill_logprobs(const StepPlan& plan, StepResult& result);
  void fill_record(const StepPlan& plan, StepResult& result) const;
  void snapshot_rows(std::span<const int32_t> pool_rows, StateSnapshot& out) const;
  std::span<float> logits_row(int32_t r);
  void stub_forward(const StepPlan& plan);

  ExecutorConfig config_;
  int32_t vocab_size_;
  int32_t table_width_;
  CpuModel model_;
  std::unique_ptr<Verifier> verifier_;
  bool stub_model_;
  std::unique_ptr<Drafter> drafter_;
  SamplingScratch scratch_;

  std::vector<int32_t> table_;           // [pool rows, Wp] req_to_page
  std::vector<int32_t> vcl_;             // [pool rows] valid_cache_lengths
  std::vector<int32_t> future_inputs_;   // [pool rows, W] future_input_map
  std::vector<int32_t> input_ids_;       // [step_tokens_max]
  std::vector<int32_t> positions_;       // [step_tokens_max]
  std::vector<int64_t> slots_;           // [step_tokens_max]
  std::vector<int32_t> token_pool_rows_; // [step_tokens_max]
  std::vector<int32_t> token_mamba_slots_; // [step_tokens_max] working slot, −1 for none
  std::vector<int32_t> token_verify_slots_; // [step_tokens_max] verify-state slot, −1 for none
  std::vector<float> logits_;            // [logits_rows_max, V]
  StepActivations captured_;             // the last forward's, while capturing
  ActivationCapture capture_ = ActivationCapture::kOff;
  std::vector<int32_t> vcl_before_;      // [max_batch_rows] vcl of each row before commit
  // The ids each pool row's owner holds, by position: every input id at its position, then the
  // emitted tokens; what a drafter reads. Positions reach L + W − 1 (a decode row at vcl = L).
  int32_t history_capacity_;             // L + W
  std::vector<int32_t> history_;         // [pool rows, L + W] int32
  std::vector<int32_t> history_begin_;   // [pool rows] first position the row's owner wrote
  std::vector<uint8_t> new_owner_;       // [pool rows] 1: this step refreshed the table from 0
};

}  // namespace ls
