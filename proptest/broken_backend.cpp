#include "proptest/broken_backend.h"

#include <algorithm>

namespace ls::proptest {

std::string_view to_string(BackendBug bug) {
  switch (bug) {
    case BackendBug::kNone: return "none";
    case BackendBug::kSkipChunkReset: return "vcl reset skipped on a later prefill chunk";
    case BackendBug::kSkipRecoveryReset: return "vcl reset skipped on retraction recovery";
    case BackendBug::kShiftedChunkSlots: return "off-by-one slot for later prefill chunks";
    case BackendBug::kPaddedRowLivePage: return "padded row points at live page 1";
    case BackendBug::kNoContextClamp: return "context clamp missing";
    case BackendBug::kNanGuardMissesDecode: return "NaN guard misses decode rows";
    case BackendBug::kRngByPoolRow: return "RNG keyed by pool row";
    case BackendBug::kRngByBatchRow: return "RNG keyed by batch row";
  }
  return "?";
}

void BrokenBackend::apply_table_writes(const StepPlan& plan) {
  ++calls_;
  if (bug_ != BackendBug::kPaddedRowLivePage) return inner_->apply_table_writes(plan);
  // The padding sentinel's table row is made to hold page 1, which a live request owns.
  StepPlan p = plan;
  p.table_writes.push_back({config_.sentinel_pool_row(), 0, static_cast<int32_t>(p.table_pages.size()), 1});
  p.table_pages.push_back(1);
  inner_->apply_table_writes(p);
}

void BrokenBackend::reset_lengths(const StepPlan& plan) {
  ++calls_;
  if (bug_ != BackendBug::kSkipChunkReset && bug_ != BackendBug::kSkipRecoveryReset) {
    return inner_->reset_lengths(plan);
  }
  StepPlan p = plan;
  p.length_resets.clear();
  for (size_t i = 0; i < plan.length_resets.size(); ++i) {
    const LengthReset& r = plan.length_resets[i];
    const bool prefill = i < static_cast<size_t>(plan.prefill_rows_count);
    if (bug_ == BackendBug::kSkipChunkReset && prefill && r.length > 0) continue;
    if (bug_ == BackendBug::kSkipRecoveryReset && !prefill) continue;
    p.length_resets.push_back(r);
  }
  inner_->reset_lengths(p);
}

void BrokenBackend::fill_inputs(const StepPlan& plan) {
  ++calls_;
  if (bug_ == BackendBug::kShiftedChunkSlots) {
    StepPlan p = plan;
    for (int32_t& prefix : p.prefill_prefix) prefix += prefix > 0 ? 1 : 0;
    return inner_->fill_inputs(p);
  }
  if (bug_ == BackendBug::kPaddedRowLivePage && plan.rows_count < config_.max_batch_rows &&
      plan.rows_count > 0) {
    // One padded decode row on the sentinel, as a graph-padded batch would carry.
    StepPlan p = plan;
    p.pool_rows.push_back(config_.sentinel_pool_row());
    p.input_lengths.push_back(p.verify_width);
    p.token_offsets.push_back(p.tokens_count);
    p.decode_overrides.push_back(1);
    p.force_single.push_back(0);
    p.rows_count += 1;
    p.tokens_count += p.verify_width;
    return inner_->fill_inputs(p);
  }
  inner_->fill_inputs(plan);
}

void BrokenBackend::finish_step(const StepPlan& plan, StepResult& result) {
  ++calls_;
  StepPlan p = plan;
  for (size_t i = 0; i < p.sampling.size(); ++i) {
    if (bug_ == BackendBug::kRngByPoolRow) p.sampling[i].seed ^= uint64_t{0x9E3779B9u} * static_cast<uint64_t>(p.pool_rows[i]);
    if (bug_ == BackendBug::kRngByBatchRow) p.sampling[i].seed += i;
  }
  inner_->finish_step(p, result);
  const int32_t ne = plan.prefill_rows_count;
  for (int32_t row = ne; row < plan.rows_count; ++row) {
    if (bug_ == BackendBug::kNoContextClamp) {
      result.accepted_lengths[row] = std::max(result.accepted_lengths[row], 1);
    }
    if (bug_ == BackendBug::kNanGuardMissesDecode) result.nan_flags[row] = 0;
  }
}

void RunAheadBackend::enqueue_finish(const StepPlan& plan) {
  ++enqueued_;
  StepResult result;
  inner_->finish_step(plan, result);
  if (single_result_slot_ && !pending_.empty()) {
    for (StepResult& older : pending_) older = result;  // one buffer: the newest copy wins
  }
  pending_.push_back(std::move(result));
  max_in_flight_ = std::max(max_in_flight_, static_cast<int32_t>(pending_.size()));
}

void RunAheadBackend::collect_finish(const StepPlan& /*plan*/, StepResult& result) {
  LS_ASSERT(!pending_.empty(), "collect_finish with no step in flight");
  result = std::move(pending_.front());
  pending_.pop_front();
}

}  // namespace ls::proptest
