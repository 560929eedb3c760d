#include "core/cpu_backend.h"

#include "core/check.h"
#include "core/logits_digest.h"
#include "core/ops/verify_state.h"
#include "core/seams.h"

#include <algorithm>
#include <cmath>

namespace ls {

namespace {
constexpr int32_t kPadInputId = 1;  // what padded tokens read (seed spec invariant 9)
}  // namespace

CpuBackend::CpuBackend(const ModelWeights& weights, const ExecutorConfig& config,
                       std::unique_ptr<Verifier> verifier, bool stub_model,
                       std::unique_ptr<Drafter> drafter, int32_t tp_degree)
    : config_(config),
      vocab_size_(weights.config.vocab_size),
      table_width_(config.table_width()),
      model_(weights, config, tp_degree),
      verifier_(verifier ? std::move(verifier) : std::make_unique<StandardVerifier>()),
      stub_model_(stub_model),
      drafter_(std::move(drafter)),
      history_capacity_(config.context_length + config.verify_width) {
  // The stub computes no layers, so it has nothing to shard: a TP claim over it would be empty.
  LS_REQUIRE(!stub_model || tp_degree == 1,
             "--tp {}: the stub model (control plane only) has no layers to shard", tp_degree);
  const size_t rows = static_cast<size_t>(config.pool_rows_count());
  const size_t tokens = static_cast<size_t>(config.step_tokens_max());
  table_.assign(rows * table_width_, 0);
  vcl_.assign(rows, 0);
  future_inputs_.assign(rows * config.verify_width, 0);
  input_ids_.assign(tokens, kPadInputId);
  positions_.assign(tokens, 0);
  slots_.assign(tokens, 0);
  token_pool_rows_.assign(tokens, 0);
  token_mamba_slots_.assign(tokens, -1);
  token_verify_slots_.assign(tokens, -1);
  logits_.assign(static_cast<size_t>(config.logits_rows_max()) * vocab_size_, 0.0f);
  vcl_before_.assign(static_cast<size_t>(config.max_batch_rows), 0);
  history_.assign(rows * static_cast<size_t>(history_capacity_), 0);
  history_begin_.assign(rows, 0);
  new_owner_.assign(rows, 0);
}

std::string CpuBackend::drafter_name() const {
  return drafter_ ? drafter_->name() : std::string(kNoDrafterName);
}

void CpuBackend::apply_table_writes(const StepPlan& plan) {
  for (const TableWrite& w : plan.table_writes) {
    LS_ASSERT(w.begin + w.pages_count <= table_width_, "unclamped table write");
    // A refresh from column 0 is a new owner of the row (a fresh prefill, or a recovery).
    if (w.begin == 0) new_owner_[w.pool_row] = 1;
    const std::span<const int32_t> pages = plan.pages_of(w);
    std::copy(pages.begin(), pages.end(),
              table_.begin() + static_cast<size_t>(w.pool_row) * table_width_ + w.begin);
  }
}

void CpuBackend::reset_lengths(const StepPlan& plan) {
  for (const LengthReset& r : plan.length_resets) {
    vcl_[r.pool_row] = r.length;
    // A new owner's ids before its reset length (a prefix-cache hit, a swap-in) never passed
    // through this row: its history starts there.
    if (new_owner_[r.pool_row]) history_begin_[r.pool_row] = r.length;
  }
  std::fill(new_owner_.begin(), new_owner_.end(), 0);
}

void CpuBackend::fill_inputs(const StepPlan& plan) {
  const int32_t w = plan.verify_width;
  const int32_t ne = plan.prefill_rows_count;
  for (int32_t row = 0; row < plan.rows_count; ++row) {
    const int32_t rpi = plan.pool_rows[row];
    const int32_t offset = plan.token_offsets[row];
    const std::span<const int32_t> table_row(table_.data() + static_cast<size_t>(rpi) * table_width_,
                                             table_width_);
    vcl_before_[row] = vcl_[rpi];
    int32_t start = 0;
    if (row < ne) {
      start = plan.prefill_prefix[row];
      const int32_t source = offset;  // prefill tokens lead the token buffer, row by row
      std::copy_n(plan.prefill_token_ids.begin() + source, plan.input_lengths[row],
                  input_ids_.begin() + offset);
    } else {
      start = vcl_[rpi];
      int32_t* fim = future_inputs_.data() + static_cast<size_t>(rpi) * w;
      const int32_t override_id = plan.decode_overrides[row - ne];
      if (override_id != -1) {
        fim[0] = override_id;
        // Recovered rows have no real drafts: the extra columns are dummies (seed spec §3.2 c).
        if (plan.force_single[row - ne]) std::fill(fim + 1, fim + w, override_id);
      }
      std::copy(fim, fim + w, input_ids_.begin() + offset);
    }
    for (int32_t t = 0; t < plan.input_lengths[row]; ++t) {
      positions_[offset + t] = start + t;
      slots_[offset + t] = slot_for(table_row, config_.page_size, start + t);
      token_pool_rows_[offset + t] = rpi;
      token_mamba_slots_[offset + t] = plan.mamba_working[row];
      const int32_t verify_base = plan.mamba_verify_base[row];
      token_verify_slots_[offset + t] = verify_base < 0 ? -1 : verify_base + t;
    }
  }
  for (int32_t t = 0; t < plan.tokens_count; ++t) {
    input_ids_[t] = std::clamp(input_ids_[t], 0, vocab_size_ - 1);
  }
  // Scrub the tail: a larger earlier step left real ids and slots behind.
  std::fill(input_ids_.begin() + plan.tokens_count, input_ids_.end(), kPadInputId);
  std::fill(positions_.begin() + plan.tokens_count, positions_.end(), 0);
  std::fill(slots_.begin() + plan.tokens_count, slots_.end(), 0);
  std::fill(token_pool_rows_.begin() + plan.tokens_count, token_pool_rows_.end(), 0);
  std::fill(token_mamba_slots_.begin() + plan.tokens_count, token_mamba_slots_.end(),
            seams::mamba_padding_slot());
  std::fill(token_verify_slots_.begin() + plan.tokens_count, token_verify_slots_.end(), -1);
  record_input_history(plan);
}

// Copy-on-write first (a prefix hit's checkpoint becomes the working state), then zeroing (a
// request's first chunk starts from no state); the host planned which (Executor::plan_mamba_row).
void CpuBackend::apply_state_rules(const StepPlan& plan) {
  for (const MambaCopy& copy : plan.mamba_copies) model_.copy_mamba_state(copy.src, copy.dst);
  for (const int32_t slot : plan.mamba_zeroes) model_.zero_mamba_state(slot);
}

// A verified decode row's commit of its recurrent state (seed spec §5 "Commit", for the state):
// the working slot takes the state after the last accepted token, a' − 1; with a' = 0 (the
// context clamp) nothing was committed and the working slot keeps the state before the step.
void CpuBackend::commit_verified_state(const StepPlan& plan, int32_t row, int32_t accepted) {
  const int32_t base = plan.mamba_verify_base[static_cast<size_t>(row)];
  if (base < 0 || accepted < 1) return;
  model_.copy_mamba_state(base + seams::mamba_verify_state_token(accepted, plan.verify_width),
                          plan.mamba_working[static_cast<size_t>(row)]);
}

// A DECODE step's checkpoints: working → checkpoint where the row's new vcl ends a page; a
// verified row by the rule with a drafter.
void CpuBackend::snapshot_mamba_checkpoints(const StepPlan& plan) {
  for (const MambaSnapshot& s : plan.mamba_snapshots) {
    if (plan.mamba_verify_base[static_cast<size_t>(s.row)] >= 0) {
      snapshot_verified_row(plan, s);
    } else if (vcl_[plan.pool_rows[s.row]] % config_.page_size == 0) {
      model_.copy_mamba_state(s.src, s.dst);
    }
  }
}

// Seed spec §4 invariant 6 with a drafter: old = vcl_old, new = old + a', fb = (old div P + 1)·P,
// the first page boundary past old. The step reached it iff fb ≤ new, and then the state there is
// the one after fb − old of the row's tokens (step = fb − old − 1, which fb ≤ new ≤ old + W keeps
// in [0, W − 1]: the seed's clamp never bites).
void CpuBackend::snapshot_verified_row(const StepPlan& plan, const MambaSnapshot& s) {
  const int32_t old = vcl_before_[static_cast<size_t>(s.row)];
  const int32_t now = vcl_[plan.pool_rows[s.row]];
  const int32_t boundary = ops::next_page_boundary(old, config_.page_size);
  if (boundary > now) return;
  const int32_t token = seams::mamba_verify_state_token(boundary - old, plan.verify_width);
  model_.copy_mamba_state(plan.mamba_verify_base[static_cast<size_t>(s.row)] + token, s.dst);
}

// Every (clamped) input id enters its row's history at its position: prefill tokens and the
// decode inputs (drafts past the accepted ones are overwritten once tokens are emitted there).
void CpuBackend::record_input_history(const StepPlan& plan) {
  for (int32_t row = 0; row < plan.rows_count; ++row) {
    const int32_t offset = plan.token_offsets[row];
    for (int32_t t = 0; t < plan.input_lengths[row]; ++t) {
      write_history(plan.pool_rows[row], positions_[offset + t], input_ids_[offset + t]);
    }
  }
}

// Positions past L + W − 1 only occur when vcl has run past L (a bug the checkers report); they are
// dropped like past-table KV writes, never written out of bounds.
void CpuBackend::write_history(int32_t rpi, int32_t position, int32_t token) {
  if (position < 0 || position >= history_capacity_) return;
  history_[static_cast<size_t>(rpi) * history_capacity_ + position] =
      std::clamp(token, 0, vocab_size_ - 1);
}

void CpuBackend::forward(const StepPlan& plan) {
  if (stub_model_) return stub_forward(plan);
  // An IDLE step (no rows) still runs the model with no tokens: the seed's execute_idle_forward,
  // which keeps a data-parallel rank's collectives in step with its TP group's busy ranks.
  const size_t t = static_cast<size_t>(plan.tokens_count);
  const ForwardTokens tokens{
      .input_ids = std::span<const int32_t>(input_ids_.data(), t),
      .positions = std::span<const int32_t>(positions_.data(), t),
      .slots = std::span<const int64_t>(slots_.data(), t),
      .pool_rows = std::span<const int32_t>(token_pool_rows_.data(), t),
      .logits_token_index = plan.logits_token_index,
      .mamba_slots = model_.has_recurrent_state()
                         ? std::span<const int32_t>(token_mamba_slots_.data(), t)
                         : std::span<const int32_t>(),
      .mamba_verify_slots = model_.has_recurrent_state() && plan.verify_width > 1
                                ? std::span<const int32_t>(token_verify_slots_.data(), t)
                                : std::span<const int32_t>(),
  };
  model_.forward(tokens, table_, logits_);
}

void CpuBackend::capture_activations(ActivationCapture mode) {
  const bool on = mode != ActivationCapture::kOff;
  LS_REQUIRE(!on || !stub_model_, "per-layer activations: the stub model computes no layers");
  model_.capture_activations(on ? &captured_ : nullptr);
  capture_ = mode;
}

// The model captures values; a recording keeps only their digests.
StepActivations CpuBackend::take_activations() {
  if (capture_ == ActivationCapture::kDigests) captured_.keep_digests_only();
  return std::exchange(captured_, {});
}

void CpuBackend::stub_forward(const StepPlan& plan) {
  for (int32_t r = 0; r < plan.logits_rows_count(); ++r) {
    const int32_t t = plan.logits_token_index[r];
    const uint32_t key = static_cast<uint32_t>(input_ids_[t]) * 2654435761u ^
                         static_cast<uint32_t>(positions_[t]) * 40503u;
    std::span<float> row = logits_row(r);
    for (int32_t v = 0; v < vocab_size_; ++v) {
      const uint32_t h = (key ^ static_cast<uint32_t>(v) * 2246822519u) * 3266489917u;
      row[v] = static_cast<float>(h >> 20) * (1.0f / 256.0f);
    }
  }
}

std::span<float> CpuBackend::logits_row(int32_t r) {
  return std::span<float>(logits_.data() + static_cast<size_t>(r) * vocab_size_, vocab_size_);
}

void CpuBackend::poison_logits(std::span<const int32_t> logits_rows, float value) {
  for (int32_t r : logits_rows) {
    LS_ASSERT(r >= 0 && r < config_.logits_rows_max(), "logits row {}", r);
    std::span<float> row = logits_row(r);
    std::fill(row.begin(), row.end(), value);
  }
}

void CpuBackend::finish_step(const StepPlan& plan, StepResult& result) {
  const int32_t bs = plan.rows_count;
  const int32_t ne = plan.prefill_rows_count;
  clear_optional_fields(result);
  result.mode = plan.mode;
  result.prefill_rows_count = ne;
  result.verify_width = plan.verify_width;
  result.tokens.assign(static_cast<size_t>(ne + (bs - ne) * plan.verify_width), 0);
  result.accepted_lengths.assign(static_cast<size_t>(bs), 0);
  result.nan_flags.assign(static_cast<size_t>(bs), 0);
  result.oov_flags.assign(static_cast<size_t>(bs), 0);
  if (bs == 0) return;
  guard_logits(plan, result);
  sample_prefill_rows(plan, result);
  verify_decode_rows(plan, result);
  snapshot_mamba_checkpoints(plan);
  flag_and_clamp_outputs(plan, result);
  if (plan.want_logprobs) fill_logprobs(plan, result);
  if (plan.capture_logits) {
    result.logits.assign(logits_.begin(),
                         logits_.begin() + static_cast<size_t>(plan.logits_rows_count()) * vocab_size_);
  }
  if (plan.record) fill_record(plan, result);
}

// What a step fills only when asked: emptied, their capacity kept for the next step that asks.
void CpuBackend::clear_optional_fields(StepResult& result) {
  result.logprobs.clear();
  result.logits.clear();
  result.logits_digests.clear();
  result.top_logits_count = 0;
  result.top_logits.clear();
  result.state.pool_rows.clear();
  result.state.valid_cache_length.clear();
  result.state.future_inputs.clear();
  result.state.table.clear();
  result.mamba_state_digests.clear();
}

// The trace's view of the step's state after the commit (the logits' digests and top-k come from
// the guard's pass): what the CUDA backend snapshots on the device.
void CpuBackend::fill_record(const StepPlan& plan, StepResult& result) const {
  snapshot_rows(plan.pool_rows, result.state);
  if (!model_.has_recurrent_state()) return;
  result.mamba_state_digests.reserve(plan.mamba_working.size());
  for (const int32_t slot : plan.mamba_working) {  // required on such a model: every row has one
    result.mamba_state_digests.push_back(model_.mamba_state_digest(slot));
  }
}

// Rule 5: a row is flagged when any of its logits rows holds a NaN; every logits row is then
// sanitised (NaN → −1e30, ±inf → ±1e30) so sampling never sees a non-finite value. A recorded
// step's digests and top-k (core/logits_digest.h) are of the rows as sanitised — what the sampler
// reads — and come from the same pass: nothing later in the step writes the logits.
void CpuBackend::guard_logits(const StepPlan& plan, StepResult& result) {
  const int32_t ne = plan.prefill_rows_count;
  const size_t rows = static_cast<size_t>(plan.logits_rows_count());
  if (plan.record) {
    result.top_logits_count = plan.top_logits_count;
    result.logits_digests.resize(rows);
    // At most one allocation, none once the caller's reused result has the capacity.
    result.top_logits.reserve(rows * static_cast<size_t>(plan.top_logits_count));
  }
  for (int32_t r = 0; r < plan.logits_rows_count(); ++r) {
    const int32_t row = r < ne ? r : ne + (r - ne) / plan.verify_width;
    const bool nan = plan.record ? sanitise_and_record_row(logits_row(r), plan.top_logits_count,
                                                           result.logits_digests[static_cast<size_t>(r)],
                                                           result.top_logits)
                                 : sanitise_logits_row(logits_row(r));
    if (nan) result.nan_flags[row] = 1;
  }
}

// The top logits guard_logits recorded for logits rows [first, first + count), or none when the
// step does not record: a greedy row's token is their first (argmax's order), read instead of
// scanning the row a second time.
std::span<const TopLogit> CpuBackend::recorded_top(const StepResult& result, int32_t first,
                                                   int32_t count) {
  const size_t per_row = static_cast<size_t>(result.top_logits_count);
  if (per_row == 0) return {};
  return std::span<const TopLogit>(result.top_logits)
      .subspan(static_cast<size_t>(first) * per_row, static_cast<size_t>(count) * per_row);
}

// Rules 6 and 8 for prefill rows: sample the last token's logits, commit vcl += input length.
void CpuBackend::sample_prefill_rows(const StepPlan& plan, StepResult& result) {
  for (int32_t row = 0; row < plan.prefill_rows_count; ++row) {
    const int32_t rpi = plan.pool_rows[row];
    const int64_t position = int64_t{plan.prefill_prefix[row]} + plan.input_lengths[row];
    const SampleOutcome outcome = sample_token(logits_row(row), plan.sampling[row], position,
                                               scratch_, recorded_top(result, row, 1));
    result.tokens[row] = outcome.token;
    result.accepted_lengths[row] = 1;
    vcl_[rpi] += plan.input_lengths[row];
    // The sampled token follows the chunk; a mid-prompt chunk's is overwritten by the next chunk.
    const int32_t bonus = std::clamp(outcome.token, 0, vocab_size_ - 1);
    const int32_t bonus_position = static_cast<int32_t>(position);
    write_history(rpi, bonus_position, bonus);
    if (drafter_) {
      write_next_inputs(rpi, plan.request_ids[row], bonus, bonus_position, /*draft=*/true);
    } else {
      // Without a drafter a prefill row sets column 0 only, as the CUDA backend does.
      future_inputs_[static_cast<size_t>(rpi) * plan.verify_width] = bonus;
    }
  }
}

// Rules 6–8 for decode rows: verify, then the context clamp a' = min(a, max(0, L − vcl_old)) at
// its two sites (seed spec §4 invariant 1), both from the same vcl_old so applying both is
// idempotent:
//   1. inside the step (the seed's _cap_accept_to_context_len): the device commit — the emitted
//      tokens enter the row's history, vcl advances by a', and the drafter's next block starts at
//      vcl_old + a', so it never starts past L (nor its block past the table);
//   2. the step result (the seed's _clamp_committed_to_context_len, a fresh value): the accepted
//      lengths and emitted tokens the host reads, which drive the scheduler's page reservation.
// Were one site to miss the clamp, the device and the host would disagree about what was
// committed (tests/spec_clamp_properties.h plants exactly that).
void CpuBackend::verify_decode_rows(const StepPlan& plan, StepResult& result) {
  const int32_t ne = plan.prefill_rows_count;
  const int32_t w = plan.verify_width;
  for (int32_t row = ne; row < plan.rows_count; ++row) {
    const int32_t first_logits = ne + (row - ne) * w;
    const int32_t vcl_old = vcl_before_[row];
    const VerifyRow verify_row{
        .logits = std::span<const float>(logits_.data() + static_cast<size_t>(first_logits) * vocab_size_,
                                         static_cast<size_t>(w) * vocab_size_),
        .inputs = std::span<const int32_t>(input_ids_.data() + plan.token_offsets[row], w),
        .vocab_size = vocab_size_,
        .sampling = plan.sampling[row],
        .first_position = int64_t{vcl_old} + 1,
        .force_single = plan.force_single[row - ne] != 0,
        .top = recorded_top(result, first_logits, w),
        .top_count = result.top_logits_count,
    };
    std::span<int32_t> out(result.tokens.data() + first_logits, w);
    const int32_t accepted = verifier_->verify(verify_row, out, scratch_);
    LS_ASSERT(accepted >= 1 && accepted <= w, "verifier accepted {} of W = {}", accepted, w);
    const int32_t in_step =
        seams::accepted_committed_in_step(accepted, vcl_old, config_.context_length);
    commit_decode_row(plan, row, out, in_step);
    commit_verified_state(plan, row, in_step);
    const int32_t reported = clamp_accepted_to_context(accepted, vcl_old, config_.context_length);
    std::fill(out.begin() + reported, out.end(), 0);
    result.accepted_lengths[row] = reported;
  }
}

// Site 1's commit for one decode row: the emitted tokens enter the history at vcl_old + 1 …, the
// next round's inputs start from the last of them (with a' = 0 the seed's dummy index 1:
// clamp(a, 1, N)), and vcl advances by a'.
void CpuBackend::commit_decode_row(const StepPlan& plan, int32_t row, std::span<const int32_t> out,
                                   int32_t accepted) {
  const int32_t rpi = plan.pool_rows[row];
  const int32_t vcl_old = vcl_before_[row];
  for (int32_t i = 0; i < accepted; ++i) write_history(rpi, vcl_old + 1 + i, out[i]);
  const int32_t bonus = std::clamp(out[std::max(accepted, 1) - 1], 0, vocab_size_ - 1);
  write_next_inputs(rpi, plan.request_ids[row], bonus, vcl_old + accepted, /*draft=*/accepted > 0);
  vcl_[rpi] += accepted;
}

// future_input_map[rpi] ← [bonus, d1 … d_{W−1}]: the drafter's proposals from the row's history
// (ending with the bonus at `position`), or the bonus repeated without a drafter — and whenever the
// history cannot end with the bonus (a' = 0, or a position past the history).
void CpuBackend::write_next_inputs(int32_t rpi, RequestId request_id, int32_t bonus,
                                   int32_t position, bool draft) {
  const int32_t w = config_.verify_width;
  int32_t* next = future_inputs_.data() + static_cast<size_t>(rpi) * w;
  next[0] = bonus;
  std::fill(next + 1, next + w, bonus);
  const int32_t begin = history_begin_[rpi];
  if (w == 1 || !drafter_ || !draft || position >= history_capacity_ || position < begin) return;
  const int32_t* history = history_.data() + static_cast<size_t>(rpi) * history_capacity_;
  LS_ASSERT(history[position] == bonus, "history[{}] = {} but the bonus is {}", position,
            history[position], bonus);
  const DraftContext context{
      .request_id = request_id,
      .history = std::span<const int32_t>(history + begin, static_cast<size_t>(position - begin + 1)),
      .history_begin = begin,
      .bonus = bonus,
      .position = position,
      .verify_width = w,
      .vocab_size = vocab_size_,
  };
  const std::span<int32_t> drafts(next + 1, static_cast<size_t>(w - 1));
  drafter_->draft(context, drafts);
  for (int32_t& d : drafts) d = std::clamp(d, 0, vocab_size_ - 1);
}

// Rules 9 and the OOV flag: any emitted id outside [0, V) flags its row; all ids are clamped.
void CpuBackend::flag_and_clamp_outputs(const StepPlan& plan, StepResult& result) {
  const int32_t ne = plan.prefill_rows_count;
  for (const auto& [index, id] : plan.forced_outputs) result.tokens[index] = id;
  for (size_t i = 0; i < result.tokens.size(); ++i) {
    int32_t& token = result.tokens[i];
    if (token >= 0 && token < vocab_size_) continue;
    const int32_t index = static_cast<int32_t>(i);
    const int32_t row = index < ne ? index : ne + (index - ne) / plan.verify_width;
    result.oov_flags[row] = 1;
    token = std::clamp(token, 0, vocab_size_ - 1);
  }
}

// Logprob of each emitted token under softmax of its (sanitised) logits row at temperature 1.
void CpuBackend::fill_logprobs(const StepPlan& plan, StepResult& result) {
  result.logprobs.assign(result.tokens.size(), 0.0f);
  for (int32_t r = 0; r < plan.logits_rows_count(); ++r) {
    const std::span<float> row = logits_row(r);
    const float max_logit = *std::max_element(row.begin(), row.end());
    float sum = 0.0f;
    for (float x : row) sum += std::exp(x - max_logit);
    result.logprobs[r] = row[result.tokens[r]] - max_logit - std::log(sum);
  }
}

StateSnapshot CpuBackend::read_state(std::span<const int32_t> pool_rows) const {
  StateSnapshot s;
  snapshot_rows(pool_rows, s);
  return s;
}

void CpuBackend::snapshot_rows(std::span<const int32_t> pool_rows, StateSnapshot& s) const {
  s.pool_rows.clear();
  s.valid_cache_length.clear();
  s.future_inputs.clear();
  s.table.clear();
  const int32_t w = config_.verify_width;
  s.pool_rows.reserve(pool_rows.size());
  s.valid_cache_length.reserve(pool_rows.size());
  s.future_inputs.reserve(pool_rows.size() * static_cast<size_t>(w));
  s.table.reserve(pool_rows.size() * static_cast<size_t>(table_width_));
  for (int32_t rpi : pool_rows) {
    LS_ASSERT(rpi >= 0 && rpi < config_.pool_rows_count(), "pool row {}", rpi);
    s.pool_rows.push_back(rpi);
    s.valid_cache_length.push_back(vcl_[rpi]);
    s.future_inputs.insert(s.future_inputs.end(), future_inputs_.begin() + static_cast<size_t>(rpi) * w,
                           future_inputs_.begin() + static_cast<size_t>(rpi + 1) * w);
    s.table.insert(s.table.end(), table_.begin() + static_cast<size_t>(rpi) * table_width_,
                   table_.begin() + static_cast<size_t>(rpi + 1) * table_width_);
  }
}

InputSnapshot CpuBackend::read_inputs() const {
  InputSnapshot s{input_ids_, positions_, slots_, {}};
  if (model_.has_recurrent_state()) s.mamba_slots = token_mamba_slots_;
  return s;
}

std::vector<uint64_t> CpuBackend::read_mamba_digests(std::span<const int32_t> slots) const {
  std::vector<uint64_t> digests;
  digests.reserve(slots.size());
  for (const int32_t slot : slots) {
    LS_ASSERT(slot >= 0 && slot < config_.mamba_slots_count, "mamba slot {}", slot);
    digests.push_back(model_.mamba_state_digest(slot));
  }
  return digests;
}

}  // namespace ls
