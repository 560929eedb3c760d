#include "core/executor.h"

#include "core/check.h"

#include <algorithm>
#include <utility>

namespace ls {

Executor::Executor(const ExecutorConfig& config, int32_t vocab_size, Backend& backend,
                   ExecutorOptions options)
    : config_(config), vocab_size_(vocab_size), backend_(backend), options_(options) {
  config_.validate();
  LS_REQUIRE(vocab_size > 1, "executor: vocab_size must be > 1, got {}", vocab_size);
  const size_t rows = static_cast<size_t>(config.pool_rows_count());
  owner_.assign(rows, 0);
  owned_.assign(rows, 0);
  sampling_.assign(rows, ResolvedSampling{});
}

StepResult Executor::step(const ForwardOp& op) {
  const StepFaults faults = std::exchange(faults_, StepFaults{});  // this step's, even if rejected
  validate_forward_op(op, config_, vocab_size_);
  plan_step(op);  // may still reject (missing sampling parameters) before anything changes
  const std::vector<int32_t> poisoned = poisoned_logits_rows(faults);
  plan_forced_outputs(faults);
  commit_sampling(op);
  backend_.apply_table_writes(plan_);  // rule 1
  backend_.reset_lengths(plan_);       // rule 2
  backend_.fill_inputs(plan_);         // rule 3
  backend_.forward(plan_);             // rule 4
  if (!poisoned.empty()) backend_.poison_logits(poisoned, faults.poison_value);
  StepResult result = backend_.finish_step(plan_);  // rules 5–9
  ++stats_.steps_count;
  return result;
}

void Executor::copy_pages(const CacheOp& op) {
  LS_REQUIRE(op.device_pages.size() == op.host_pages.size(),
             "cache op {}: {} device pages but {} host pages", to_string(op.kind),
             op.device_pages.size(), op.host_pages.size());
  for (size_t i = 0; i < op.device_pages.size(); ++i) {
    LS_REQUIRE(op.device_pages[i] >= 1 && op.device_pages[i] < config_.pages_count,
               "cache op {}: device_pages[{}] = {} is outside [1, pages_count = {})",
               to_string(op.kind), i, op.device_pages[i], config_.pages_count);
    LS_REQUIRE(op.host_pages[i] >= 0 && op.host_pages[i] < config_.host_pages_count,
               "cache op {}: host_pages[{}] = {} is outside [0, host_pages_count = {})",
               to_string(op.kind), i, op.host_pages[i], config_.host_pages_count);
  }
  backend_.copy_pages(op);
}

void Executor::plan_step(const ForwardOp& op) {
  plan_.mode = op.mode();
  plan_.rows_count = op.rows_count();
  plan_.prefill_rows_count = op.prefill_rows_count();
  plan_.verify_width = config_.verify_width;
  plan_.capture_logits = options_.capture_logits;
  plan_.want_logprobs = options_.want_logprobs;
  plan_.prefill_token_ids = op.prefill_token_ids;
  plan_rows(op);
  plan_sampling(op);
}

void Executor::plan_rows(const ForwardOp& op) {
  const int32_t w = config_.verify_width;
  const int32_t width = config_.table_width();
  StepPlan& p = plan_;
  p.pool_rows.clear(), p.request_ids.clear(), p.input_lengths.clear(), p.token_offsets.clear();
  p.prefill_prefix.clear(), p.decode_overrides.clear(), p.force_single.clear();
  p.table_writes.clear(), p.table_pages.clear(), p.length_resets.clear();
  p.logits_token_index.clear();
  int32_t offset = 0;
  for (const OpRow& row : op.rows) {
    p.pool_rows.push_back(row.pool_row);
    p.request_ids.push_back(row.request_id);
    p.input_lengths.push_back(row.input_length);
    p.token_offsets.push_back(offset);
    // Rule 1: size := min(size, max(0, Wp − begin)); only past-context rows are ever cut.
    const int32_t size = static_cast<int32_t>(row.refresh.pages.size());
    const int32_t kept = std::min(size, std::max(0, width - row.refresh.begin));
    stats_.table_slices_clamped += kept < size ? 1 : 0;
    if (kept > 0) {
      p.table_writes.push_back({row.pool_row, row.refresh.begin,
                                static_cast<int32_t>(p.table_pages.size()), kept});
      p.table_pages.insert(p.table_pages.end(), row.refresh.pages.begin(),
                           row.refresh.pages.begin() + kept);
    }
    if (row.kind == RowKind::kPrefill) {
      // Rule 2: every chunk resets vcl to its prefix, which makes the reset idempotent.
      p.prefill_prefix.push_back(row.prefix_length);
      p.length_resets.push_back({row.pool_row, row.prefix_length});
      p.logits_token_index.push_back(offset + row.input_length - 1);
    } else {
      if (row.hist_token_length != -1) p.length_resets.push_back({row.pool_row, row.hist_token_length});
      p.decode_overrides.push_back(row.decode_override);
      // A row with an explicit input and no real drafts accepts exactly one token.
      p.force_single.push_back(row.decode_override != -1 && w > 1 ? 1 : 0);
      for (int32_t t = 0; t < w; ++t) p.logits_token_index.push_back(offset + t);
    }
    offset += row.input_length;
  }
  p.tokens_count = offset;
}

void Executor::plan_sampling(const ForwardOp& op) {
  plan_.sampling.clear();
  for (int32_t i = 0; i < op.rows_count(); ++i) {
    const OpRow& row = op.rows[i];
    const bool fresh = !owned_[row.pool_row] || owner_[row.pool_row] != row.request_id;
    LS_REQUIRE(!fresh || row.sampling.has_value(),
               "forward op row {} (request {}, {}): the request is new to pool row {} but the row "
               "carries no sampling parameters",
               i, row.request_id, to_string(row.kind), row.pool_row);
    plan_.sampling.push_back(row.sampling ? resolve_sampling(*row.sampling, row.request_id)
                                          : sampling_[row.pool_row]);
  }
}

void Executor::commit_sampling(const ForwardOp& op) {
  for (int32_t i = 0; i < op.rows_count(); ++i) {
    const int32_t rpi = op.rows[i].pool_row;
    owner_[rpi] = op.rows[i].request_id;
    owned_[rpi] = 1;
    sampling_[rpi] = plan_.sampling[i];
  }
}

void Executor::plan_forced_outputs(const StepFaults& faults) {
  plan_.forced_outputs.clear();
  const int32_t ne = plan_.prefill_rows_count;
  for (const auto& [row, id] : faults.forced_outputs) {
    LS_REQUIRE(row >= 0 && row < plan_.rows_count, "forced output row {} is outside the step's {} rows",
               row, plan_.rows_count);
    plan_.forced_outputs.push_back({row < ne ? row : ne + (row - ne) * plan_.verify_width, id});
  }
}

std::vector<int32_t> Executor::poisoned_logits_rows(const StepFaults& faults) const {
  std::vector<int32_t> logits_rows;
  const int32_t ne = plan_.prefill_rows_count;
  for (int32_t row : faults.poisoned_rows) {
    LS_REQUIRE(row >= 0 && row < plan_.rows_count, "poisoned row {} is outside the step's {} rows",
               row, plan_.rows_count);
    if (row < ne) {
      logits_rows.push_back(row);
    } else {
      for (int32_t t = 0; t < plan_.verify_width; ++t) {
        logits_rows.push_back(ne + (row - ne) * plan_.verify_width + t);
      }
    }
  }
  return logits_rows;
}

}  // namespace ls
