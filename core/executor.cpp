#include "core/executor.h"

#include "core/check.h"
#include "core/seams.h"

#include <algorithm>
#include <utility>

namespace ls {

namespace {

const ExecutorConfig& validated(const ExecutorConfig& config) {
  config.validate();
  return config;
}

}  // namespace

Executor::Executor(const ExecutorConfig& config, int32_t vocab_size, Backend& backend,
                   ExecutorOptions options)
    : config_(validated(config)),
      vocab_size_(vocab_size),
      backend_(backend),
      options_(options),
      validator_(config_, vocab_size, backend.has_recurrent_state()) {
  LS_REQUIRE(vocab_size > 1, "executor: vocab_size must be > 1, got {}", vocab_size);
  LS_REQUIRE(options.top_logits_count >= 0 && options.top_logits_count <= kTopLogitsCountMax,
             "executor: top_logits_count {} is outside [0, {}]", options.top_logits_count,
             kTopLogitsCountMax);
  if (options.activations != ActivationCapture::kOff) backend.capture_activations(options.activations);
  const size_t rows = static_cast<size_t>(config.pool_rows_count());
  owner_.assign(rows, 0);
  owned_.assign(rows, 0);
  sampling_.assign(rows, ResolvedSampling{});
}

void Executor::submit(const ForwardOp& op) {
  LS_REQUIRE(in_flight_count() < kInFlightMax,
             "executor: {} steps are in flight (at most {}); collect one before submitting another",
             in_flight_count(), kInFlightMax);
  const StepFaults faults = std::exchange(faults_, StepFaults{});  // this step's, even if rejected
  // The slot of step k − 2, collected already (or never used): planning into it touches no
  // step in flight, even when the op is rejected.
  InFlight& slot = in_flight_[static_cast<size_t>(submitted_count_ % kInFlightMax)];
  StepPlan& plan = slot.plan;
  validator_.validate(op);
  // May still reject (missing sampling parameters, fault rows out of range) before anything
  // changes.
  const int32_t slices_clamped = plan_step(op, plan);
  plan_poisoned_rows(faults, plan);
  plan.logits_poisoned = !poisoned_logits_rows_.empty();
  plan_forced_outputs(faults, plan);
  stats_.table_slices_clamped += slices_clamped;
  commit_sampling(op, plan);
  backend_.apply_table_writes(plan);  // rule 1
  backend_.reset_lengths(plan);       // rule 2
  backend_.fill_inputs(plan);         // rule 3
  if (backend_.has_recurrent_state()) backend_.apply_state_rules(plan);
  backend_.forward(plan);             // rule 4
  if (options_.activations != ActivationCapture::kOff) slot.activations = backend_.take_activations();
  if (!poisoned_logits_rows_.empty()) {
    backend_.poison_logits(poisoned_logits_rows_, faults.poison_value);
  }
  slot.deferred = backend_.can_run_ahead();
  if (slot.deferred) {
    backend_.enqueue_finish(plan);  // rules 5–9 launched
  } else {
    backend_.finish_step(plan, slot.result);  // rules 5–9 done, into the slot's reused result
  }
  ++submitted_count_;
  ++stats_.steps_count;
}

void Executor::collect(StepResult& result) {
  LS_REQUIRE(in_flight_count() > 0, "executor: collect() with no step in flight");
  InFlight& slot = in_flight_[static_cast<size_t>(collected_count_ % kInFlightMax)];
  if (slot.deferred) {
    backend_.collect_finish(slot.plan, result);
  } else {
    std::swap(result, slot.result);  // the caller's old vectors serve the slot's next step
  }
  result.activations = std::exchange(slot.activations, {});
  ++collected_count_;
}

StepResult Executor::collect() {
  StepResult result;
  collect(result);
  return result;
}

StepResult Executor::step(const ForwardOp& op) {
  StepResult result;
  step(op, result);
  return result;
}

void Executor::step(const ForwardOp& op, StepResult& result) {
  LS_REQUIRE(in_flight_count() == 0, "executor: step() with {} steps in flight; collect them first",
             in_flight_count());
  submit(op);
  collect(result);
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
  validate_state_copy(op);
  backend_.copy_pages(op);
}

// A cache op's recurrent state (models with Mamba layers): a slot of the state pool, travelling
// with the op's first host page.
void Executor::validate_state_copy(const CacheOp& op) const {
  if (op.state_slot == -1) return;
  LS_REQUIRE(backend_.has_recurrent_state(), "cache op {}: state_slot {} but the model has no "
             "Mamba layers (use -1)", to_string(op.kind), op.state_slot);
  LS_REQUIRE(op.state_slot >= 0 && op.state_slot < config_.mamba_slots_count,
             "cache op {}: state_slot {} is outside [0, mamba_slots_count = {}) and is not -1",
             to_string(op.kind), op.state_slot, config_.mamba_slots_count);
  LS_REQUIRE(!op.host_pages.empty(), "cache op {}: state_slot {} with no pages: the state "
             "travels with the first host page", to_string(op.kind), op.state_slot);
}

// Returns the number of refresh slices cut at the table width (counted once the op is accepted).
int32_t Executor::plan_step(const ForwardOp& op, StepPlan& plan) const {
  plan.mode = op.mode();
  plan.rows_count = op.rows_count();
  plan.prefill_rows_count = op.prefill_rows_count();
  plan.verify_width = config_.verify_width;
  plan.capture_logits = options_.capture_logits;
  plan.want_logprobs = options_.want_logprobs;
  plan.record = options_.record;
  plan.top_logits_count = options_.record ? std::min(options_.top_logits_count, vocab_size_) : 0;
  plan.prefill_token_ids = op.prefill_token_ids;  // keeps the plan's capacity
  const int32_t slices_clamped = plan_rows(op, plan);
  plan_sampling(op, plan);
  return slices_clamped;
}

int32_t Executor::plan_rows(const ForwardOp& op, StepPlan& p) const {
  const int32_t w = config_.verify_width;
  const int32_t width = config_.table_width();
  p.pool_rows.clear(), p.request_ids.clear(), p.input_lengths.clear(), p.token_offsets.clear();
  p.prefill_prefix.clear(), p.decode_overrides.clear(), p.force_single.clear();
  p.table_writes.clear(), p.table_pages.clear(), p.length_resets.clear();
  p.logits_token_index.clear();
  p.mamba_working.clear(), p.mamba_verify_base.clear(), p.mamba_copies.clear();
  p.mamba_zeroes.clear();
  p.mamba_snapshots.clear();
  int32_t offset = 0;
  int32_t slices_clamped = 0;
  for (const OpRow& row : op.rows) {
    p.pool_rows.push_back(row.pool_row);
    p.request_ids.push_back(row.request_id);
    p.input_lengths.push_back(row.input_length);
    p.token_offsets.push_back(offset);
    // Rule 1: size := min(size, max(0, Wp − begin)); only past-context rows are ever cut.
    const int32_t size = static_cast<int32_t>(row.refresh.pages.size());
    const int32_t kept = std::min(size, std::max(0, width - row.refresh.begin));
    slices_clamped += kept < size ? 1 : 0;
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
    const int32_t row_index = static_cast<int32_t>(p.pool_rows.size()) - 1;
    const bool verified = row.kind == RowKind::kDecode && w > 1 && row.mamba_working >= 0;
    plan_mamba_row(row, row_index, op.mode(),
                   verified ? config_.mamba_verify_slot(row_index, 0) : -1, p);
    offset += row.input_length;
  }
  p.tokens_count = offset;
  return slices_clamped;
}

// Seed spec §4 invariant 6, the host half: copy-on-write from cow_src when given (prefill rows and
// recovered decode rows), zero the working state of a prefill row that starts from nothing
// (cow_src −1, prefix 0: a request's first chunk), and the checkpoint candidates: decode rows of
// DECODE steps (the seed's rule), and prefill rows, whose chunk the validator holds to end a page
// (lockstep's: the prefix cache's checkpoints at the page-aligned chunk ends of a prompt).
// `verify_base`: a verified decode row's verify-state slots (StepPlan::mamba_verify_base), or −1.
void Executor::plan_mamba_row(const OpRow& row, int32_t row_index, ForwardMode mode,
                              int32_t verify_base, StepPlan& p) {
  p.mamba_working.push_back(row.mamba_working);
  p.mamba_verify_base.push_back(verify_base);
  if (row.mamba_working < 0) return;
  if (row.mamba_cow_src >= 0) p.mamba_copies.push_back({row.mamba_cow_src, row.mamba_working});
  if (seams::mamba_zeroes_working_slot(row)) {
    p.mamba_zeroes.push_back(row.mamba_working);
  }
  const bool snapshots = mode == ForwardMode::kDecode || row.kind == RowKind::kPrefill;
  if (snapshots && row.mamba_checkpoint_dst >= 0 &&
      row.mamba_checkpoint_dst != row.mamba_working) {
    p.mamba_snapshots.push_back({row_index, row.mamba_working, row.mamba_checkpoint_dst});
  }
}

void Executor::plan_sampling(const ForwardOp& op, StepPlan& plan) const {
  plan.sampling.clear();
  for (int32_t i = 0; i < op.rows_count(); ++i) {
    const OpRow& row = op.rows[i];
    const bool fresh = !owned_[row.pool_row] || owner_[row.pool_row] != row.request_id;
    LS_REQUIRE_FIELD(!fresh || row.sampling.has_value(), OpFieldAt(OpField::kSampling, i),
                     "forward op row {} (request {}, {}): the request is new to pool row {} but "
                     "the row carries no sampling parameters",
                     i, row.request_id, to_string(row.kind), row.pool_row);
    plan.sampling.push_back(row.sampling ? resolve_sampling(*row.sampling, row.request_id)
                                         : sampling_[row.pool_row]);
  }
}

void Executor::commit_sampling(const ForwardOp& op, const StepPlan& plan) {
  for (int32_t i = 0; i < op.rows_count(); ++i) {
    const int32_t rpi = op.rows[i].pool_row;
    owner_[rpi] = op.rows[i].request_id;
    owned_[rpi] = 1;
    sampling_[rpi] = plan.sampling[i];
  }
}

void Executor::plan_forced_outputs(const StepFaults& faults, StepPlan& plan) {
  plan.forced_outputs.clear();
  const int32_t ne = plan.prefill_rows_count;
  for (const auto& [row, id] : faults.forced_outputs) {
    LS_REQUIRE(row >= 0 && row < plan.rows_count, "forced output row {} is outside the step's {} rows",
               row, plan.rows_count);
    plan.forced_outputs.push_back({row < ne ? row : ne + (row - ne) * plan.verify_width, id});
  }
}

void Executor::plan_poisoned_rows(const StepFaults& faults, const StepPlan& plan) {
  std::vector<int32_t>& logits_rows = poisoned_logits_rows_;
  logits_rows.clear();
  const int32_t ne = plan.prefill_rows_count;
  for (int32_t row : faults.poisoned_rows) {
    LS_REQUIRE(row >= 0 && row < plan.rows_count, "poisoned row {} is outside the step's {} rows",
               row, plan.rows_count);
    if (row < ne) {
      logits_rows.push_back(row);
    } else {
      for (int32_t t = 0; t < plan.verify_width; ++t) {
        logits_rows.push_back(ne + (row - ne) * plan.verify_width + t);
      }
    }
  }
}

}  // namespace ls
