#include "trace/checks.h"

#include "core/activations.h"
#include "core/check.h"
#include "core/invariants.h"
#include "core/tensor_parallel.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>

namespace ls::trace {

namespace {

// A record that breaks an executor invariant is not a trace of lockstep's executor: refused
// naming the field, as every other record check.
void require(const std::optional<InvariantViolation>& violation) {
  LS_REQUIRE(!violation, "{} ({}): {}", violation->field, violation->invariant, violation->detail);
}

}  // namespace

void check_header(const TraceHeader& h) {
  LS_REQUIRE(h.format_version >= kOldestReadableFormatVersion && h.format_version <= kFormatVersion,
             "header: format_version {} is not supported (this build reads versions {} to {} and "
             "writes {})", h.format_version, kOldestReadableFormatVersion, kFormatVersion,
             kFormatVersion);
  h.model.validate();
  h.executor.validate();
  LS_REQUIRE(h.model.vocab_size > 1, "header: model.vocab_size must be > 1, got {}",
             h.model.vocab_size);
  LS_REQUIRE(h.top_logits_count >= 0 && h.top_logits_count <= kTopLogitsCountMax,
             "header: top_logits_count {} is outside [0, {}]", h.top_logits_count,
             kTopLogitsCountMax);
  LS_REQUIRE(h.index_stride >= 1 && h.index_stride <= (1 << 20),
             "header: index_stride {} is outside [1, {}]", h.index_stride, 1 << 20);
  LS_REQUIRE(h.weights.kind == WeightSource::Kind::kSeed ||
                 h.weights.kind == WeightSource::Kind::kDirectory,
             "header: weights.kind {} is unknown", static_cast<int>(h.weights.kind));
  try {
    make_tp_layout(h.model, h.tp_degree);  // the recorded degree must shard the recorded model
  } catch (const Error& e) {
    throw Error(fmt::format("header: tp_degree: {}", e.what()));
  }
  LS_REQUIRE(h.determinism_mode.empty() || h.determinism_mode == "batch-invariant" ||
                 h.determinism_mode == "default" || h.determinism_mode == "foreign",
             "header: determinism_mode '{}' is not one of batch-invariant, default, foreign",
             h.determinism_mode);
  LS_REQUIRE(!h.activation_digests || !h.model.has_recurrent_state(),
             "header: activation_digests is set but model '{}' has Mamba layers, which the "
             "capture does not cover", h.model.name);
  LS_REQUIRE(!h.activation_digests || h.tp_degree == 1,
             "header: activation_digests is set at tp_degree {} (TP 1 only)", h.tp_degree);
  LS_REQUIRE(!h.mamba_state_digests || h.model.has_recurrent_state(),
             "header: mamba_state_digests is set but model '{}' has no Mamba layers",
             h.model.name);
  // The collectives' library: all three fields or none, and only where ranks communicated.
  const bool nccl = h.nccl_version != 0 || !h.nccl_algo.empty() || !h.nccl_proto.empty();
  if (nccl) {
    LS_REQUIRE(h.nccl_version > 0 && !h.nccl_algo.empty() && !h.nccl_proto.empty(),
               "header: nccl_version {}, nccl_algo '{}', nccl_proto '{}': all three are set or "
               "none", h.nccl_version, h.nccl_algo, h.nccl_proto);
    LS_REQUIRE(h.tp_degree > 1, "header: nccl_version {} is set at tp_degree 1 (no collectives)",
               h.nccl_version);
  }
}

namespace {

void check_row_indices(const OpRow& row, int32_t i, const TraceHeader& h) {
  const ExecutorConfig& c = h.executor;
  LS_REQUIRE_FIELD(row.pool_row >= 1 && row.pool_row <= c.max_batch_rows,
                   OpFieldAt(OpField::kPoolRow, i),
                   "rows[{}].pool_row = {} is outside 1..max_batch_rows = {}", i, row.pool_row,
                   c.max_batch_rows);
  LS_REQUIRE_FIELD(
      row.input_length >= 1 && row.input_length <= std::max(c.prefill_chunk_tokens, c.verify_width),
      OpFieldAt(OpField::kInputLength, i), "rows[{}].input_length = {} is outside [1, {}]", i,
      row.input_length, std::max(c.prefill_chunk_tokens, c.verify_width));
  LS_REQUIRE_FIELD(row.prefix_length >= 0 && row.prefix_length <= c.context_length,
                   OpFieldAt(OpField::kPrefixLength, i),
                   "rows[{}].prefix_length = {} is outside [0, context_length = {}]", i,
                   row.prefix_length, c.context_length);
  LS_REQUIRE_FIELD(row.prompt_length >= 0 && row.prompt_length <= c.context_length,
                   OpFieldAt(OpField::kPromptLength, i),
                   "rows[{}].prompt_length = {} is outside [0, context_length = {}]", i,
                   row.prompt_length, c.context_length);
  LS_REQUIRE_FIELD(row.decode_override >= -1 && row.decode_override < h.model.vocab_size,
                   OpFieldAt(OpField::kDecodeOverride, i),
                   "rows[{}].decode_override = {} is outside [-1, vocab_size = {})", i,
                   row.decode_override, h.model.vocab_size);
  LS_REQUIRE_FIELD(row.hist_token_length >= -1 && row.hist_token_length <= c.context_length,
                   OpFieldAt(OpField::kHistTokenLength, i),
                   "rows[{}].hist_token_length = {} is outside [-1, context_length = {}]", i,
                   row.hist_token_length, c.context_length);
  LS_REQUIRE_FIELD(row.refresh.begin >= 0, OpFieldAt(OpField::kRefreshBegin, i),
                   "rows[{}].refresh.begin = {} is negative", i, row.refresh.begin);
  const auto check_slot = [&](int32_t slot, OpField field, const char* name) {
    LS_REQUIRE_FIELD(slot >= -1 && slot < c.mamba_slots_count, OpFieldAt(field, i),
                     "rows[{}].{} = {} is outside [-1, mamba_slots_count = {})", i, name, slot,
                     c.mamba_slots_count);
  };
  check_slot(row.mamba_working, OpField::kMambaWorking, "mamba_working");
  check_slot(row.mamba_checkpoint_dst, OpField::kMambaCheckpointDst, "mamba_checkpoint_dst");
  check_slot(row.mamba_cow_src, OpField::kMambaCowSrc, "mamba_cow_src");
  LS_REQUIRE_FIELD(
      row.mamba_branching_seqlen >= -1 && row.mamba_branching_seqlen <= c.context_length,
      OpFieldAt(OpField::kMambaBranchingSeqlen, i),
      "rows[{}].mamba_branching_seqlen = {} is outside [-1, context_length = {}]", i,
      row.mamba_branching_seqlen, c.context_length);
  for (size_t j = 0; j < row.refresh.pages.size(); ++j) {
    const int32_t page = row.refresh.pages[j];
    LS_REQUIRE_FIELD(page >= 1 && page < c.pages_count,
                     OpFieldAt(OpField::kRefreshPages, i, static_cast<int64_t>(j)),
                     "rows[{}].refresh.pages[{}] = {} is outside [1, pages_count = {})", i, j, page,
                     c.pages_count);
  }
}

void check_cache_op(const CacheOp& c, size_t k, const TraceHeader& h) {
  LS_REQUIRE(c.device_pages.size() == c.host_pages.size(),
             "cache_ops[{}]: {} device pages but {} host pages", k, c.device_pages.size(),
             c.host_pages.size());
  for (size_t i = 0; i < c.device_pages.size(); ++i) {
    LS_REQUIRE(c.device_pages[i] >= 1 && c.device_pages[i] < h.executor.pages_count,
               "cache_ops[{}].device_pages[{}] = {} is outside [1, pages_count = {})", k, i,
               c.device_pages[i], h.executor.pages_count);
    LS_REQUIRE(c.host_pages[i] >= 0 && c.host_pages[i] < h.executor.host_pages_count,
               "cache_ops[{}].host_pages[{}] = {} is outside [0, host_pages_count = {})", k, i,
               c.host_pages[i], h.executor.host_pages_count);
  }
  LS_REQUIRE(c.state_slot >= -1 && c.state_slot < h.executor.mamba_slots_count,
             "cache_ops[{}].state_slot = {} is outside [-1, mamba_slots_count = {})", k,
             c.state_slot, h.executor.mamba_slots_count);
  LS_REQUIRE(c.state_slot == -1 || !c.host_pages.empty(),
             "cache_ops[{}].state_slot = {} with no pages: the state travels with the first host "
             "page", k, c.state_slot);
}

}  // namespace

void check_step_input(const StepInputRecord& record, const TraceHeader& h, bool full) {
  const ForwardOp& op = record.op;
  LS_REQUIRE(record.step >= 0, "step = {} is negative", record.step);
  LS_REQUIRE_FIELD(op.rows.size() <= static_cast<size_t>(h.executor.max_batch_rows),
                   OpFieldAt(OpField::kRows), "rows: {} rows exceed max_batch_rows = {}",
                   op.rows.size(), h.executor.max_batch_rows);
  int64_t prefill_tokens = 0;
  for (size_t i = 0; i < op.rows.size(); ++i) {
    check_row_indices(op.rows[i], static_cast<int32_t>(i), h);
    if (op.rows[i].kind == RowKind::kPrefill) prefill_tokens += op.rows[i].input_length;
  }
  LS_REQUIRE_FIELD(static_cast<int64_t>(op.prefill_token_ids.size()) == prefill_tokens,
                   OpFieldAt(OpField::kPrefillTokenIds),
                   "prefill_token_ids holds {} ids but the prefill rows' input_length sum to {}",
                   op.prefill_token_ids.size(), prefill_tokens);
  // The ids row by row (their count is the prefill rows' input_length summed).
  size_t t = 0;
  for (size_t i = 0; i < op.rows.size(); ++i) {
    if (op.rows[i].kind != RowKind::kPrefill) continue;
    for (int32_t k = 0; k < op.rows[i].input_length; ++k, ++t) {
      const int32_t id = op.prefill_token_ids[t];
      LS_REQUIRE_FIELD(id >= 0 && id < h.model.vocab_size,
                       OpFieldAt(OpField::kPrefillTokenIds, static_cast<int32_t>(i),
                                 static_cast<int64_t>(t)),
                       "prefill_token_ids[{}] = {} is outside [0, vocab_size = {})", t, id,
                       h.model.vocab_size);
    }
  }
  for (size_t k = 0; k < record.cache_ops.size(); ++k) check_cache_op(record.cache_ops[k], k, h);
  for (int32_t row : record.faults.poisoned_rows) {
    LS_REQUIRE(row >= 0 && static_cast<size_t>(row) < op.rows.size(),
               "faults.poisoned_rows holds row {} of a {}-row op", row, op.rows.size());
  }
  for (const auto& [row, id] : record.faults.forced_outputs) {
    LS_REQUIRE(row >= 0 && static_cast<size_t>(row) < op.rows.size(),
               "faults.forced_rows holds row {} of a {}-row op", row, op.rows.size());
  }
  if (full) validate_forward_op(op, h.executor, h.model.vocab_size, h.model.has_recurrent_state());
}

void check_step_output(const StepOutputRecord& record, const OpenStep& open,
                       const TraceHeader& h) {
  const StepResult& r = record.result;
  const int32_t bs = open.rows_count;
  const int32_t ne = open.prefill_rows_count;
  const int32_t width = h.executor.verify_width;
  const size_t outputs = static_cast<size_t>(ne) + static_cast<size_t>(bs - ne) * width;
  const int32_t vocab = h.model.vocab_size;
  LS_REQUIRE(r.mode == forward_mode_of(ne, bs), "mode = {} but the step's op is {}",
             to_string(r.mode), to_string(forward_mode_of(ne, bs)));
  LS_REQUIRE(r.prefill_rows_count == ne, "prefill_rows_count = {} but the op has {} prefill rows",
             r.prefill_rows_count, ne);
  LS_REQUIRE(r.verify_width == width, "verify_width = {} but the header's is {}", r.verify_width,
             width);
  const StepShape shape{bs, ne};
  const InvariantLimits limits = InvariantLimits::of(h.executor, vocab);
  require(check_output_shape(shape, r, limits));
  LS_REQUIRE(r.logprobs.empty() || r.logprobs.size() == outputs,
             "logprobs holds {} values, expected 0 or {}", r.logprobs.size(), outputs);
  LS_REQUIRE(r.nan_flags.size() == static_cast<size_t>(bs), "nan_flags holds {} for {} rows",
             r.nan_flags.size(), bs);
  LS_REQUIRE(r.oov_flags.size() == static_cast<size_t>(bs), "oov_flags holds {} for {} rows",
             r.oov_flags.size(), bs);
  LS_REQUIRE(r.logits.empty(), "logits must not be stored in a trace");
  require(check_output_tokens(shape, r, limits));
  for (int32_t i = 0; i < bs; ++i) {
    require(check_accepted_length(shape, r, i, limits));
    LS_REQUIRE(r.nan_flags[i] <= 1, "nan_flags[{}] = {} is not 0 or 1", i, r.nan_flags[i]);
    LS_REQUIRE(r.oov_flags[i] <= 1, "oov_flags[{}] = {} is not 0 or 1", i, r.oov_flags[i]);
  }
  // The header says whether the steps recorded their logits' digests and top-k: then every
  // output carries them for every logits row, else none does.
  const bool digests = header_records_logits(h);
  LS_REQUIRE(record.logits_digests.size() == (digests ? outputs : 0),
             "logits_digests holds {} digests, expected {} (the header {} them)",
             record.logits_digests.size(), digests ? outputs : 0,
             digests ? "records" : "does not record");
  // A foreign executor (header.foreign_executor) records its vcl but may have no state digests.
  LS_REQUIRE(record.valid_cache_lengths.size() == record.future_input_digests.size() ||
                 (h.is_foreign() && record.future_input_digests.empty()),
             "valid_cache_lengths ({}) and future_input_digests ({}) differ in length",
             record.valid_cache_lengths.size(), record.future_input_digests.size());
  LS_REQUIRE(record.valid_cache_lengths.empty() ||
                 record.valid_cache_lengths.size() == static_cast<size_t>(bs),
             "valid_cache_lengths holds {} values for {} rows", record.valid_cache_lengths.size(),
             bs);
  for (size_t i = 0; i < record.valid_cache_lengths.size(); ++i) {
    require(check_vcl_bound(static_cast<int32_t>(i), record.valid_cache_lengths[i], limits));
  }
  LS_REQUIRE(record.drafts.empty() ||
                 record.drafts.size() == static_cast<size_t>(bs) * static_cast<size_t>(width),
             "drafts holds {} ids, expected 0 or rows × W = {}", record.drafts.size(),
             static_cast<size_t>(bs) * static_cast<size_t>(width));
  for (size_t i = 0; i < record.drafts.size(); ++i) {
    LS_REQUIRE(record.drafts[i] >= 0 && record.drafts[i] < vocab,
               "drafts[{}] = {} is outside [0, vocab_size = {})", i, record.drafts[i], vocab);
  }
  // The header says whether the steps digest their rows' working state slots: then one per row.
  LS_REQUIRE(record.mamba_state_digests.size() ==
                 (h.mamba_state_digests ? static_cast<size_t>(bs) : 0),
             "mamba_state_digests holds {} digests, expected {} (the header {} them)",
             record.mamba_state_digests.size(), h.mamba_state_digests ? bs : 0,
             h.mamba_state_digests ? "records" : "does not record");
  // ACTIVATIONS: layers·6·T + 2·R digests exactly when the header records them.
  const int64_t activations =
      h.activation_digests ? activation_digests_count(h.model.layers_count, open.tokens_count,
                                                      static_cast<int32_t>(outputs))
                           : 0;
  LS_REQUIRE(record.activation_digests.size() == static_cast<size_t>(activations),
             "activation_digests holds {} digests, expected {} (the header {} them)",
             record.activation_digests.size(), activations,
             h.activation_digests ? "records" : "does not record");
  const int32_t k = digests ? std::min(h.top_logits_count, vocab) : 0;
  LS_REQUIRE(record.top_logits_count == (record.top_logits.empty() ? 0 : k),
             "top_logits_count = {} but the header records {}", record.top_logits_count, k);
  LS_REQUIRE(record.top_logits.size() == outputs * static_cast<size_t>(k),
             "top_logits holds {} pairs, expected {} logits rows × {}", record.top_logits.size(),
             outputs, k);
  check_top_logits(record.top_logits, k, vocab);
}

bool header_records_logits(const TraceHeader& h) {
  return h.executor_options.record || h.executor_options.capture_logits;
}

// Each row's pairs: ids in [0, V) and distinct, logits finite (the guard sanitised them) and in
// the recorded order (descending, lower id first on ties).
void check_top_logits(std::span<const TopLogit> top, int32_t k, int32_t vocab) {
  for (size_t i = 0; i < top.size(); ++i) {
    const TopLogit& t = top[i];
    LS_REQUIRE(t.id >= 0 && t.id < vocab, "top_logits[{}].id = {} is outside [0, vocab_size = {})",
               i, t.id, vocab);
    LS_REQUIRE(std::isfinite(t.logit), "top_logits[{}].logit = {} is not finite (logits are "
               "sanitised before they are ranked)", i, t.logit);
    const size_t j = i % static_cast<size_t>(k);
    if (j == 0) continue;
    const TopLogit& prev = top[i - 1];
    LS_REQUIRE(prev.logit > t.logit || (prev.logit == t.logit && prev.id < t.id),
               "top_logits[{}] = (id {}, {}) does not rank after top_logits[{}] = (id {}, {})", i,
               t.id, t.logit, i - 1, prev.id, prev.logit);
  }
}

void check_event(const TraceEvent& event, const TraceHeader& h) {
  LS_REQUIRE(event.step >= 0, "event step = {} is negative", event.step);
  LS_REQUIRE(static_cast<uint8_t>(event.kind) <= static_cast<uint8_t>(EventKind::kStepRejected),
             "event kind = {} is unknown", static_cast<int>(event.kind));
  if (event.hist_token_length) {
    LS_REQUIRE(*event.hist_token_length >= 0 && *event.hist_token_length <= h.executor.context_length,
               "hist_token_length = {} is outside [0, context_length = {}]",
               *event.hist_token_length, h.executor.context_length);
  }
}

void check_step_stats(const StepStatsRecord& s, const TraceHeader& h) {
  LS_REQUIRE(!h.step_clock.empty() && !h.device_timer.empty(),
             "step stats of step {} in a trace whose header names no step_clock or device_timer", s.step);
  LS_REQUIRE(s.done_ns >= s.submit_ns, "step stats {}: done_ns = {} is before submit_ns = {}", s.step,
             s.done_ns, s.submit_ns);
  LS_REQUIRE(s.wait_ns >= 0 && s.device_busy_ns >= 0, "step stats {}: wait_ns = {} or device_busy_ns = {} is negative",
             s.step, s.wait_ns, s.device_busy_ns);
  LS_REQUIRE(s.device_idle_before_ns >= -1, "step stats {}: device_idle_before_ns = {} is below -1 (unknown)",
             s.step, s.device_idle_before_ns);
  LS_REQUIRE(s.pages_used >= 0 && s.pages_free >= 0 &&
                 int64_t{s.pages_used} + s.pages_free <= int64_t{h.executor.pages_count} - 1,
             "step stats {}: pages_used = {} + pages_free = {} exceed the pages_count - 1 = {} usable pages",
             s.step, s.pages_used, s.pages_free, h.executor.pages_count - 1);
  LS_REQUIRE(s.prefix_hit_tokens >= 0 && s.queue_length >= 0,
             "step stats {}: prefix_hit_tokens = {} or queue_length = {} is negative", s.step,
             s.prefix_hit_tokens, s.queue_length);
  LS_REQUIRE(s.running_count >= 0 && s.running_count <= h.executor.max_batch_rows,
             "step stats {}: running_count = {} is outside [0, max_batch_rows = {}]", s.step, s.running_count,
             h.executor.max_batch_rows);
}

void OffsetsDigest::add(uint64_t offset) {
  ++count;
  hash = XXH3_64bits_withSeed(&offset, sizeof offset, hash);
}

void TraceSequence::pop_open() {
  open_first_ = (open_first_ + 1) % kOpenStepsMax;
  --open_count_;
}

void TraceSequence::on_input(const StepInputRecord& record, bool full_op_check) {
  LS_REQUIRE(!footer_seen_, "a step input follows the footer");
  LS_REQUIRE(record.step > last_input_step_,
             "step = {} does not follow the previous step input {} (steps must increase)",
             record.step, last_input_step_);
  LS_REQUIRE(record.step >= last_event_step_,
             "step = {} comes after an event of step {} (steps never go back)", record.step,
             last_event_step_);
  LS_REQUIRE(open_count_ < kOpenStepsMax,
             "step {} opens while {} earlier steps have no output (at most {} may be open)",
             record.step, open_count_, kOpenStepsMax);
  check_step_input(record, *header_, full_op_check);
  open_[static_cast<size_t>((open_first_ + open_count_) % kOpenStepsMax)] =
      OpenStep{record.step, record.op.rows_count(), record.op.prefill_rows_count(),
               static_cast<int32_t>(record.op.prefill_token_ids.size()) +
                   record.op.decode_rows_count() * header_->executor.verify_width};
  ++open_count_;
  last_input_step_ = record.step;
  ++inputs_count_;
  std::erase_if(recently_ended_, [&](const auto& e) { return e.second + kOpenStepsMax < record.step; });
  last_input_requests_.clear();
  for (const OpRow& row : record.op.rows) {
    last_input_requests_.push_back(row.request_id);
    const bool ended = std::any_of(recently_ended_.begin(), recently_ended_.end(),
                                   [&](const auto& e) { return e.first == row.request_id; });
    if (!ended) live_.insert(row.request_id);
  }
}

void TraceSequence::on_output(const StepOutputRecord& record) {
  LS_REQUIRE(!footer_seen_, "a step output follows the footer");
  LS_REQUIRE(open_count_ > 0, "step output {} has no open step input", record.step);
  LS_REQUIRE(record.step == oldest_open().step,
             "step output {} does not match the oldest open step input {}", record.step,
             oldest_open().step);
  check_step_output(record, oldest_open(), *header_);
  pop_open();
  last_output_step_ = record.step;
  ++outputs_count_;
  ++complete_steps_;
}

// Events carry the step at which they happened: never before the last step input (a step's
// events are recorded after its input) and never before an earlier event's.
void TraceSequence::check_event_order(const TraceEvent& event) const {
  LS_REQUIRE(event.step >= last_event_step_,
             "event step = {} goes back before an earlier event's step {}", event.step,
             last_event_step_);
  LS_REQUIRE(event.step >= last_input_step_,
             "event step = {} goes back before the last step input {}", event.step,
             last_input_step_);
}

// The request an event names must be one the trace knows of.
void TraceSequence::check_event_request(const TraceEvent& event) const {
  const RequestId id = event.request_id;
  switch (event.kind) {
    case EventKind::kArrive:
      LS_REQUIRE(!live_.contains(id), "request_id = {}: an arrive event for a request already "
                 "in flight", id);
      return;
    case EventKind::kStepRejected:
      LS_REQUIRE(id == 0, "request_id = {}: a stepRejected event names no request", id);
      return;
    case EventKind::kFaultFired: {
      const bool in_last_step = std::find(last_input_requests_.begin(), last_input_requests_.end(),
                                          id) != last_input_requests_.end();
      LS_REQUIRE(id == 0 || live_.contains(id) || in_last_step,
                 "request_id = {}: a faultFired event names a request the trace does not know "
                 "(not arrived, not in a step)", id);
      return;
    }
    case EventKind::kFinish:
    case EventKind::kAbort:
    case EventKind::kRetract:
    case EventKind::kRecover:
      LS_REQUIRE(live_.contains(id), "request_id = {}: a {} event names a request the trace does "
                 "not know (not arrived, not in a step, or already ended)", id, to_string(event.kind));
      return;
  }
}

void TraceSequence::track_requests(const TraceEvent& event) {
  if (event.kind == EventKind::kArrive) live_.insert(event.request_id);
  if (event.kind == EventKind::kFinish || event.kind == EventKind::kAbort) {
    live_.erase(event.request_id);
    recently_ended_.push_back({event.request_id, event.step});
  }
}

void TraceSequence::on_event(const TraceEvent& event) {
  LS_REQUIRE(!footer_seen_, "an event follows the footer");
  check_event(event, *header_);
  check_event_order(event);
  check_event_request(event);
  track_requests(event);
  last_event_step_ = event.step;
  if (event.kind == EventKind::kStepRejected && open_count_ > 0 && oldest_open().step == event.step) {
    pop_open();
    ++complete_steps_;
  }
  ++events_count_;
}

void TraceSequence::on_stats(const StepStatsRecord& stats) {
  LS_REQUIRE(!footer_seen_, "step stats follow the footer");
  LS_REQUIRE(stats.step == last_output_step_ && stats.step > last_stats_step_,
             "step stats {} do not follow that step's output (the last output is step {}; the "
             "last stats step {})",
             stats.step, last_output_step_, last_stats_step_);
  check_step_stats(stats, *header_);
  last_stats_step_ = stats.step;
}

void TraceSequence::on_footer(const TraceFooter& footer, const OffsetsDigest& seen) {
  LS_REQUIRE(!footer_seen_, "a second footer");
  LS_REQUIRE(footer.index_stride == header_->index_stride,
             "footer index_stride = {} but the header's is {}", footer.index_stride,
             header_->index_stride);
  LS_REQUIRE(footer.steps_count == inputs_count_, "footer steps_count = {} but {} were read",
             footer.steps_count, inputs_count_);
  LS_REQUIRE(footer.outputs_count == outputs_count_, "footer outputs_count = {} but {} were read",
             footer.outputs_count, outputs_count_);
  LS_REQUIRE(footer.events_count == events_count_, "footer events_count = {} but {} were read",
             footer.events_count, events_count_);
  OffsetsDigest recorded;
  for (uint64_t offset : footer.step_offsets) recorded.add(offset);
  LS_REQUIRE(recorded == seen,
             "footer step_offsets ({} entries) do not match the offsets of the step inputs read "
             "({} entries)",
             recorded.count, seen.count);
  footer_seen_ = true;
}

}  // namespace ls::trace
