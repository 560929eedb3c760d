// The scheduler's requests, results and accounting; planning lives in scheduler_plan.cpp.
#include "core/scheduler.h"

#include "core/check.h"
#include "core/ops/verify_state.h"
#include "core/scheduler_impl.h"
#include "core/seams.h"

#include <algorithm>

namespace ls {

std::string_view to_string(RequestState state) {
  switch (state) {
    case RequestState::kWaiting: return "waiting";
    case RequestState::kPrefilling: return "prefilling";
    case RequestState::kDecoding: return "decoding";
    case RequestState::kRetracted: return "retracted";
    case RequestState::kFinished: return "finished";
  }
  return "?";
}

namespace {

SchedulerConfig validated(const SchedulerConfig& c) {
  c.validate();  // B, L, P, pages, host pages, W, the token budget
  if (c.recurrent_state) {
    LS_REQUIRE(c.mamba_slots_count >= c.max_batch_rows, "scheduler config: mamba_slots_count {} "
               "is below max_batch_rows B = {}: every live request needs a working state slot",
               c.mamba_slots_count, c.max_batch_rows);
    LS_REQUIRE(!c.prefix_cache || c.mamba_slots_count > c.max_batch_rows,
               "scheduler config: prefix_cache with recurrent state (Mamba layers) needs "
               "checkpoint slots, but mamba_slots_count {} leaves none past the max_batch_rows "
               "B = {} working slots (a hit copies the state checkpointed at its boundary)",
               c.mamba_slots_count, c.max_batch_rows);
    LS_REQUIRE(c.verify_width == 1 || c.host_pages_count == 0,
               "scheduler config: verify_width {} with recurrent state (Mamba layers) and "
               "host_pages_count {} > 0 (retraction by swap): speculative decoding with swapped "
               "recurrent states is not implemented (use host_pages_count 0: retraction by "
               "recompute)", c.verify_width, c.host_pages_count);
  }
  LS_REQUIRE(c.prefill_chunk_tokens >= c.verify_width,
             "scheduler config: prefill_chunk_tokens (the token budget) {} is below the verify "
             "width W = {}: no decode row would ever fit",
             c.prefill_chunk_tokens, c.verify_width);
  return c;
}

}  // namespace

Scheduler::Impl::Impl(const SchedulerConfig& c)
    : config(validated(c)),
      depth(c.overlap ? 1 : 0),
      table_width(c.table_width()),
      pages(c.pages_count, c.page_size) {
  for (int32_t row = 1; row <= c.max_batch_rows; ++row) free_pool_rows.insert(row);
  for (int32_t page = 0; page < c.host_pages_count; ++page) free_host_pages.insert(page);
  if (c.recurrent_state && c.prefix_cache) {
    checkpoints = StateCheckpoints(c.max_batch_rows, c.mamba_slots_count - c.max_batch_rows);
  }
}

Scheduler::Scheduler(const SchedulerConfig& config) : impl_(std::make_unique<Impl>(config)) {}
Scheduler::~Scheduler() = default;
Scheduler::Scheduler(Scheduler&&) noexcept = default;
Scheduler& Scheduler::operator=(Scheduler&&) noexcept = default;

void Scheduler::submit(const RequestSpec& request, int32_t vocab_size) {
  Impl& s = *impl_;
  const SchedulerConfig& c = s.config;
  const RequestId id = request.id;
  const int32_t prompt_length = static_cast<int32_t>(request.prompt.size());
  LS_REQUIRE(!s.requests.contains(id), "request {}: duplicate request id", id);
  LS_REQUIRE(prompt_length >= 1, "request {}: prompt is empty", id);
  LS_REQUIRE(prompt_length < c.context_length,
             "request {}: prompt length {} must be < context_length L = {} (room for one "
             "generated token)",
             id, prompt_length, c.context_length);
  for (size_t t = 0; t < request.prompt.size(); ++t) {
    LS_REQUIRE(request.prompt[t] >= 0 && request.prompt[t] < vocab_size,
               "request {}: prompt[{}] = {} is outside [0, vocab_size = {})", id, t,
               request.prompt[t], vocab_size);
  }
  for (int32_t stop : request.stop_ids) {
    LS_REQUIRE(stop >= 0 && stop < vocab_size,
               "request {}: stop_ids holds {}, outside [0, vocab_size = {})", id, stop, vocab_size);
  }
  LS_REQUIRE(request.max_new_tokens >= 1, "request {}: max_new_tokens must be >= 1, got {}", id,
             request.max_new_tokens);
  request.sampling.validate(fmt::format("request {}", id));
  SchedRequest r{.spec = request, .prompt_length = prompt_length, .tokens = request.prompt};
  r.max_new_tokens = std::min(request.max_new_tokens, c.context_length - prompt_length);
  r.capped = r.max_new_tokens < request.max_new_tokens;
  r.prefill_length = prompt_length;
  r.arrival_plan = s.plans_count;
  // Alone, a request must always fit, or retraction could not make progress.
  const int32_t tokens_max =
      prompt_length + r.max_new_tokens - 1 + (s.depth + 1) * c.verify_width;
  LS_REQUIRE(s.pages_for(tokens_max) <= c.pages_count - 1,
             "request {}: needs up to {} pages of {} tokens but pages_count = {} leaves {}", id,
             s.pages_for(tokens_max), c.page_size, c.pages_count, c.pages_count - 1);
  s.requests.emplace(id, std::move(r));
  ++s.live_count;
  s.pending_events.push_back({.kind = SchedulerEvent::Kind::kArrive, .request_id = id});
}

void Scheduler::abort(RequestId id) {
  const auto it = impl_->requests.find(id);
  LS_REQUIRE(it != impl_->requests.end(), "abort: unknown request id {}", id);
  LS_REQUIRE(!it->second.finished(), "abort: request {} has already finished ({})", id,
             to_string(it->second.finish_reason));
  impl_->pending_aborts.insert(id);
}

void Scheduler::Impl::apply_aborts(std::vector<SchedulerEvent>& events) {
  for (RequestId id : pending_aborts) {
    SchedRequest& r = requests.at(id);
    if (r.finished()) continue;  // finished by a result before the abort took effect
    finish(r, FinishReason::kAbort, events);
    release_if_idle(r);
  }
  pending_aborts.clear();
}

std::vector<SchedulerEvent> Scheduler::apply_result(const ForwardOp& op,
                                                    const StepResult& result) {
  Impl& s = *impl_;
  if (op.rows.empty()) return {};  // IDLE ops are not tracked
  LS_REQUIRE(!s.in_flight.empty(), "apply_result: no step is in flight");
  const InFlightStep& step = s.in_flight.front();
  const int32_t bs = op.rows_count();
  LS_REQUIRE(static_cast<int32_t>(step.ids.size()) == bs,
             "apply_result: op has {} rows but the oldest step in flight has {} (results must be "
             "applied in plan order)",
             bs, step.ids.size());
  for (int32_t i = 0; i < bs; ++i) {
    LS_REQUIRE(op.rows[i].request_id == step.ids[i],
               "apply_result: op row {} is request {} but the oldest step in flight has request "
               "{} there (results must be applied in plan order)",
               i, op.rows[i].request_id, step.ids[i]);
  }
  LS_REQUIRE(static_cast<int32_t>(result.accepted_lengths.size()) == bs &&
                 result.prefill_rows_count == op.prefill_rows_count(),
             "apply_result: result has {} rows ({} prefill) but the op has {} ({} prefill)",
             result.accepted_lengths.size(), result.prefill_rows_count, bs,
             op.prefill_rows_count());
  const InFlightStep applied = std::move(s.in_flight.front());
  s.in_flight.pop_front();
  std::vector<SchedulerEvent> events;
  for (int32_t i = 0; i < bs; ++i) {
    SchedRequest& r = s.requests.at(applied.ids[i]);
    --r.in_flight_count;
    if (r.finished() || r.epoch != applied.epochs[i]) continue;  // lingering or retracted since
    s.apply_row(r, op.rows[i], result, i, events);
  }
  for (RequestId id : applied.ids) s.release_if_idle(s.requests.at(id));
  return events;
}

void Scheduler::Impl::apply_row(SchedRequest& r, const OpRow& row, const StepResult& result,
                                int32_t i, std::vector<SchedulerEvent>& events) {
  const auto flag = [i](const std::vector<uint8_t>& flags) {
    return !flags.empty() && flags.at(static_cast<size_t>(i)) != 0;
  };
  const bool flagged = flag(result.nan_flags) || flag(result.oov_flags);
  if (row.kind == RowKind::kPrefill) {
    const bool last_chunk = row.prefix_length + row.input_length == row.prompt_length;
    if (!last_chunk) {  // a mid-prompt chunk's sample means nothing
      if (flagged) finish(r, FinishReason::kNumericalError, events);
      return;
    }
    take_tokens(r, result.row_tokens(i), flagged, events);
    return;
  }
  const int32_t accepted = result.accepted_lengths[static_cast<size_t>(i)];
  LS_REQUIRE(accepted >= 0 && accepted <= config.verify_width,
             "apply_result: row {} (request {}) accepted {} tokens, outside [0, W = {}]", i,
             r.spec.id, accepted, config.verify_width);
  if (config.verify_width > 1) settle_verified_checkpoint(r, row, accepted);
  r.committed_count += accepted;
  take_tokens(r, result.row_tokens(i), flagged, events);
  if (!r.finished()) rewind(r);
}

// A verified decode row's checkpoint slot (plan_checkpoint_verified) once its accepted length is
// known: the step snapshotted the state at fb = (old div P + 1)·P, the first page boundary past
// its old KV length, iff it reached it (seed spec §4 invariant 6 with a drafter); the slot then
// holds that boundary's state, else nothing and it goes back.
void Scheduler::Impl::settle_verified_checkpoint(SchedRequest& r, const OpRow& row, int32_t accepted) {
  if (row.mamba_checkpoint_dst < 0) return;
  auto& pending = r.pending_checkpoints;
  const auto it = std::find_if(pending.begin(), pending.end(), [&](const auto& entry) {
    return entry.first == row.mamba_checkpoint_dst;
  });
  LS_ASSERT(it != pending.end() && it->second == kBoundaryUnknown,
            "request {}: checkpoint slot {} of a verified row is not pending", r.spec.id,
            row.mamba_checkpoint_dst);
  const int32_t p = config.page_size;
  const int32_t old = r.committed_count;
  const int32_t boundary = ops::next_page_boundary(old, p);
  if (boundary <= old + accepted) {
    it->second = seams::checkpoint_boundary(boundary, p);
  } else {
    checkpoints.give_back(it->first);
    pending.erase(it);
  }
}

void Scheduler::Impl::take_tokens(SchedRequest& r, const std::vector<int32_t>& tokens,
                                  bool flagged, std::vector<SchedulerEvent>& events) {
  for (int32_t token : tokens) {
    r.tokens.push_back(token);
    ++tokens_emitted;
    if (flagged) return finish(r, FinishReason::kNumericalError, events);  // keeps one token
    const auto& stops = r.spec.stop_ids;
    if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
      return finish(r, FinishReason::kStop, events);
    }
    if (r.generated_count() >= r.max_new_tokens) {
      return finish(r, r.capped ? FinishReason::kContext : FinishReason::kLength, events);
    }
  }
}

// PR #583: once a result accepted through A, keep pages through A + D·W (the step in flight, if
// any, writes no further); pages past that were reserved for tokens that were not accepted.
void Scheduler::Impl::rewind(SchedRequest& r) {
  const size_t keep = static_cast<size_t>(
      std::max(pages_for(r.committed_count + depth * config.verify_width), 1));
  while (r.pages.size() > keep) {
    const int32_t page = r.pages.back();
    LS_ASSERT(pages.references_of(page) == 1 && !pages.is_cached(page),
              "rewinding shared page {} of request {}", page, r.spec.id);
    pages.release(page);
    r.pages.pop_back();
  }
  r.table_synced_count = std::min(r.table_synced_count, static_cast<int32_t>(r.pages.size()));
}

void Scheduler::Impl::finish(SchedRequest& r, FinishReason reason,
                             std::vector<SchedulerEvent>& events) {
  const bool keep_kv = reason != FinishReason::kAbort && reason != FinishReason::kNumericalError;
  cache_kv_pages(r, keep_kv && !r.pages.empty() ? r.token_size() - 1 : 0);
  free_host_pages.insert(r.host_pages.begin(), r.host_pages.end());
  r.host_pages.clear();
  if (!r.finished()) --live_count;
  r.state = RequestState::kFinished;
  r.finish_reason = reason;
  outcomes[r.spec.id] = RequestOutcome{
      .id = r.spec.id, .tokens = {r.tokens.begin() + r.prompt_length, r.tokens.end()},
      .reason = reason};
  const auto kind =
      reason == FinishReason::kAbort ? SchedulerEvent::Kind::kAbort : SchedulerEvent::Kind::kFinish;
  events.push_back({.kind = kind, .request_id = r.spec.id, .finish_reason = reason});
}

// A finished request keeps its pages and pool row until no planned step references them.
void Scheduler::Impl::release_if_idle(SchedRequest& r) {
  if (!r.finished() || r.in_flight_count > 0) return;
  drop_device_pages(r);
}

// Inserts the request's full pages of KV tokens[0, kv_tokens) into the prefix cache, and settles
// its pending checkpoints against them.
void Scheduler::Impl::cache_kv_pages(SchedRequest& r, int32_t kv_tokens) {
  if (!config.prefix_cache) return;
  const int32_t full = std::min(kv_tokens / config.page_size, static_cast<int32_t>(r.pages.size()));
  pages.insert(r.tokens, r.pages, full);
  if (config.recurrent_state) settle_checkpoints(r, full);
}

// Each pending checkpoint whose boundary ends one of the first `cached_pages` pages is attached to
// the cached page holding that chain position (the request's own, or an equal one cached before);
// the others are given back. The steps that wrote them ran, or run before any later step reads
// them: steps run in plan order.
void Scheduler::Impl::settle_checkpoints(SchedRequest& r, int32_t cached_pages) {
  const int32_t p = config.page_size;
  for (const auto& [slot, boundary] : r.pending_checkpoints) {
    const int32_t chain_pages = boundary / p;
    int32_t page = -1;
    if (boundary % p == 0 && chain_pages >= 1 && chain_pages <= cached_pages) {
      const std::vector<int32_t> chain =
          pages.match(std::span<const int32_t>(r.tokens.data(), static_cast<size_t>(boundary)), chain_pages);
      if (static_cast<int32_t>(chain.size()) == chain_pages && checkpoints.slot_of(chain.back()) < 0) {
        page = chain.back();
      }
    }
    if (page >= 0) {
      checkpoints.attach(slot, page);
    } else {
      checkpoints.give_back(slot);
    }
  }
  r.pending_checkpoints.clear();
}

void Scheduler::Impl::drop_device_pages(SchedRequest& r) {
  for (int32_t page : seams::pages_released_at_end(r)) pages.release(page);
  r.pages.clear();
  r.table_synced_count = 0;
  if (r.pool_row != 0) free_pool_rows.insert(r.pool_row);
  r.pool_row = 0;
}

bool Scheduler::done() const {
  if (!impl_->in_flight.empty()) return false;
  return std::all_of(impl_->requests.begin(), impl_->requests.end(),
                     [](const auto& kv) { return kv.second.finished(); });
}

const std::map<RequestId, RequestOutcome>& Scheduler::outcomes() const { return impl_->outcomes; }
int32_t Scheduler::free_pages_count() const { return impl_->pages.free_count(); }
int32_t Scheduler::free_host_pages_count() const {
  return static_cast<int32_t>(impl_->free_host_pages.size());
}
int32_t Scheduler::cached_pages_count() const { return impl_->pages.cached_count(); }
int32_t Scheduler::held_pages_count() const { return impl_->pages.held_count(); }
int32_t Scheduler::free_pool_rows_count() const {
  return static_cast<int32_t>(impl_->free_pool_rows.size());
}
int32_t Scheduler::live_requests_count() const { return impl_->live_count; }
int64_t Scheduler::tokens_emitted_count() const { return impl_->tokens_emitted; }
int32_t Scheduler::steps_in_flight_count() const {
  return static_cast<int32_t>(impl_->in_flight.size());
}
const SchedulerConfig& Scheduler::config() const { return impl_->config; }

std::optional<RequestState> Scheduler::state_of(RequestId id) const {
  const auto it = impl_->requests.find(id);
  if (it == impl_->requests.end()) return std::nullopt;
  return it->second.state;
}

std::vector<int32_t> Scheduler::pages_of(RequestId id) const {
  const auto it = impl_->requests.find(id);
  return it == impl_->requests.end() ? std::vector<int32_t>{} : it->second.pages;
}

std::vector<int32_t> Scheduler::generated_of(RequestId id) const {
  const auto it = impl_->requests.find(id);
  if (it == impl_->requests.end()) return {};
  const SchedRequest& r = it->second;
  return {r.tokens.begin() + r.prompt_length, r.tokens.end()};
}

std::string Scheduler::check_accounting() const {
  const Impl& s = *impl_;
  std::string problem = s.pages.check();
  if (!problem.empty()) return problem;
  std::map<int32_t, int32_t> references;
  for (const auto& [id, r] : s.requests) {
    std::set<int32_t> own(r.pages.begin(), r.pages.end());
    if (own.size() != r.pages.size()) return fmt::format("request {} holds a page twice", id);
    if (own.contains(0)) return fmt::format("request {} holds the dummy page 0", id);
    for (int32_t page : r.pages) ++references[page];
  }
  for (int32_t page = 1; page < s.config.pages_count; ++page) {
    const int32_t expected = references.contains(page) ? references[page] : 0;
    if (s.pages.references_of(page) != expected) {
      return fmt::format("page {} has {} references but {} requests hold it", page,
                         s.pages.references_of(page), expected);
    }
  }
  problem = s.check_rows_and_hosts();
  return problem.empty() ? s.check_checkpoints() : problem;
}

std::string Scheduler::Impl::check_checkpoints() const {
  std::set<int32_t> pending;
  for (const auto& [id, r] : requests) {
    for (const auto& [slot, boundary] : r.pending_checkpoints) {
      if (r.finished()) {
        return fmt::format("request {} has finished but holds checkpoint slot {}", id, slot);
      }
      if (!pending.insert(slot).second) return fmt::format("checkpoint slot {} pending twice", slot);
    }
  }
  std::string problem = checkpoints.check(pending);
  if (!problem.empty()) return problem;
  for (const int32_t page : checkpoints.attached_pages()) {
    if (!pages.is_cached(page)) return fmt::format("page {} holds a checkpoint but is not cached", page);
  }
  return {};
}

std::string Scheduler::Impl::check_rows_and_hosts() const {
  std::set<int32_t> rows(free_pool_rows), hosts(free_host_pages);
  size_t rows_expected = rows.size(), hosts_expected = hosts.size();
  for (const auto& [id, r] : requests) {
    if (r.pool_row != 0) {
      ++rows_expected;
      rows.insert(r.pool_row);
    }
    hosts_expected += r.host_pages.size();
    hosts.insert(r.host_pages.begin(), r.host_pages.end());
  }
  if (rows.size() != rows_expected || rows.size() != static_cast<size_t>(config.max_batch_rows)) {
    return fmt::format("pool rows: {} distinct of {} owned or free, B = {}", rows.size(),
                       rows_expected, config.max_batch_rows);
  }
  if (hosts.size() != hosts_expected ||
      hosts.size() != static_cast<size_t>(config.host_pages_count)) {
    return fmt::format("host pages: {} distinct of {} owned or free, host_pages_count = {}",
                       hosts.size(), hosts_expected, config.host_pages_count);
  }
  return {};
}

}  // namespace ls
