// Planning one step (seed spec §8): candidates by (priority, id), rows under the token budget and
// the row cap, chunked prefill with prefix-cache hits, decode page reservation, and retraction when
// nothing fits.
#include "core/check.h"
#include "core/scheduler_impl.h"
#include "core/seams.h"

#include <algorithm>

namespace ls {

namespace {

// Seed §8 priorities: lower runs first; ties go to the lower request id.
int32_t priority_of(RequestState state, bool mixed_batches) {
  switch (state) {
    case RequestState::kDecoding: return mixed_batches ? 0 : 3;
    case RequestState::kPrefilling: return 1;
    case RequestState::kWaiting: return 2;
    case RequestState::kRetracted: return 4;
    case RequestState::kFinished: break;
  }
  LS_ASSERT(false, "a finished request is no candidate");
  return 5;
}

}  // namespace

bool Draft::holds(RequestId id) const {
  const auto is_id = [id](const OpRow& row) { return row.request_id == id; };
  return std::any_of(prefill_rows.begin(), prefill_rows.end(), is_id) ||
         std::any_of(decode_rows.begin(), decode_rows.end(), is_id);
}

ForwardOp Draft::take_op() {
  ForwardOp op;
  op.rows = std::move(prefill_rows);
  op.rows.insert(op.rows.end(), decode_rows.begin(), decode_rows.end());
  op.prefill_token_ids = std::move(prefill_token_ids);
  return op;
}

StepPlanOut Scheduler::plan() {
  Impl& s = *impl_;
  LS_REQUIRE(static_cast<int32_t>(s.in_flight.size()) <= s.depth,
             "scheduler plan: {} steps are in flight but overlap allows {}; apply_result first",
             s.in_flight.size(), s.depth);
  ++s.plans_count;
  StepPlanOut out;
  out.events = std::move(s.pending_events);
  s.pending_events.clear();
  s.apply_aborts(out.events);
  s.head = s.find_head();
  std::set<RequestId> retracted_now;
  Draft draft = s.schedule(out, retracted_now);
  while (draft.empty() && s.should_retract()) {
    SchedRequest* victim = s.pick_victim();
    LS_ASSERT(victim != nullptr, "retraction without a victim");
    retracted_now.insert(victim->spec.id);
    s.retract(*victim, out);
    draft = s.schedule(out, retracted_now);
  }
  LS_ASSERT(!draft.empty() || !s.in_flight.empty() ||
                std::all_of(s.requests.begin(), s.requests.end(),
                            [](const auto& kv) { return kv.second.finished(); }),
            "scheduler: nothing schedulable, nothing in flight, and requests remain");
  s.plan_checkpoints(draft);
  out.op = draft.take_op();
  s.track(out.op);
  return out;
}

std::vector<RequestId> Scheduler::Impl::candidates(const std::set<RequestId>& retracted_now) const {
  std::vector<std::pair<int32_t, RequestId>> order;
  for (const auto& [id, r] : requests) {
    if (r.finished() || retracted_now.contains(id)) continue;
    order.emplace_back(priority_of(r.state, config.mixed_batches), id);
  }
  std::sort(order.begin(), order.end());
  std::vector<RequestId> ids;
  for (const auto& [priority, id] : order) ids.push_back(id);
  return ids;
}

Draft Scheduler::Impl::schedule(StepPlanOut& out, const std::set<RequestId>& retracted_now) {
  Draft d{.budget = config.prefill_chunk_tokens};
  for (RequestId id : candidates(retracted_now)) {
    if (d.budget <= 0 || d.rows_count() >= config.max_batch_rows) break;
    SchedRequest& r = requests.at(id);
    switch (r.state) {
      case RequestState::kDecoding: schedule_decode(r, d); break;
      case RequestState::kPrefilling: schedule_chunk(r, d); break;
      case RequestState::kWaiting:
      case RequestState::kRetracted:
        if (!head_allows_start(r, d)) break;
        if (r.state == RequestState::kRetracted && r.retract_path == RetractPath::kSwap) {
          recover_by_swap(r, d, out);
        } else {
          admit(r, d, out);
        }
        break;
      case RequestState::kFinished: LS_ASSERT(false, "finished candidate {}", id);
    }
  }
  return d;
}

// Without mixed batches a step carries prefill rows or decode rows, never both.
bool Scheduler::Impl::may_add(const Draft& d, RowKind kind) const {
  if (config.mixed_batches) return true;
  return kind == RowKind::kPrefill ? d.decode_rows.empty() : d.prefill_rows.empty();
}

int32_t Scheduler::Impl::pages_for(int32_t tokens) const {
  const int32_t p = config.page_size;
  return std::min((tokens + p - 1) / p, table_width);
}

// Pages from the allocator; the checkpoints of the cached pages it evicted go with them.
std::vector<int32_t> Scheduler::Impl::allocate_pages(int32_t count) {
  std::vector<int32_t> fresh = pages.allocate(count);
  for (const int32_t page : pages.take_evicted()) checkpoints.drop_page(page);
  return fresh;
}

// Extends the request's pages to cover `tokens` KV tokens; false (and nothing changes) when the
// pool cannot supply them even by evicting the cache.
bool Scheduler::Impl::grow_pages(SchedRequest& r, int32_t tokens) {
  const int32_t extra = pages_for(tokens) - static_cast<int32_t>(r.pages.size());
  if (extra <= 0) return true;
  if (extra > pages.available_count()) return false;
  const std::vector<int32_t> fresh = allocate_pages(extra);
  r.pages.insert(r.pages.end(), fresh.begin(), fresh.end());
  return true;
}

// A row with the table columns the device row lacks and, on a new pool row, the sampling
// parameters.
OpRow Scheduler::Impl::start_row(SchedRequest& r, RowKind kind) {
  OpRow row{.kind = kind, .request_id = r.spec.id, .pool_row = r.pool_row};
  if (config.recurrent_state) row.mamba_working = seams::mamba_working_slot(r);
  const int32_t held = static_cast<int32_t>(r.pages.size());
  if (r.table_synced_count < held) {
    row.refresh.begin = r.table_synced_count;
    row.refresh.pages.assign(r.pages.begin() + r.table_synced_count, r.pages.end());
    r.table_synced_count = held;
  }
  if (!r.sampling_sent) row.sampling = r.spec.sampling;
  r.sampling_sent = true;
  r.starved = false;
  return row;
}

// PR #583: with C committed tokens and D steps possibly in flight, reserve through C + (D+1)·W.
void Scheduler::Impl::schedule_decode(SchedRequest& r, Draft& d) {
  if (!may_add(d, RowKind::kDecode)) return;
  const int32_t w = config.verify_width;
  if (d.budget < w) return;  // a decode row costs W tokens: never overshoot the step's budget
  if (!grow_pages(r, r.committed_count + (depth + 1) * w)) {
    r.starved = true;
    return;
  }
  OpRow row = start_row(r, RowKind::kDecode);
  row.input_length = w;
  d.decode_rows.push_back(std::move(row));
  r.kv_planned += w;
  d.decode_kv_ends.push_back(r.kv_planned);
  d.budget -= w;
}

void Scheduler::Impl::schedule_chunk(SchedRequest& r, Draft& d) {
  if (!may_add(d, RowKind::kPrefill)) return;
  const int32_t chunk = aligned_chunk(r.scheduled_count,
                                      std::min(d.budget, r.prefill_length - r.scheduled_count),
                                      r.prefill_length);
  if (!grow_pages(r, r.scheduled_count + chunk + config.verify_width)) {
    r.starved = true;
    return;
  }
  push_chunk(r, chunk, d);
}

// Recurrent state with the prefix cache: a chunk that does not finish the prefill ends at the last
// page boundary it reaches, so that the state at its end is a page's checkpoint (seed spec §4
// invariant 6: chunks aligned to the page size, or the snapshots never land and the cache stops
// hitting); one that reaches no boundary keeps its length.
int32_t Scheduler::Impl::aligned_chunk(int32_t start, int32_t chunk, int32_t total) const {
  if (!config.recurrent_state || !config.prefix_cache || start + chunk >= total) return chunk;
  const int32_t end = (start + chunk) / config.page_size * config.page_size;
  return end > start ? end - start : chunk;
}

// Recurrent state: a hit must resume the state too, so it stops at the deepest matched page with a
// checkpoint attached. Returns that checkpoint's slot, or −1 (no hit).
int32_t Scheduler::Impl::keep_checkpointed_prefix(std::vector<int32_t>& matched) const {
  size_t kept = matched.size();
  while (kept > 0 && checkpoints.slot_of(matched[kept - 1]) < 0) --kept;
  matched.resize(kept);
  return kept == 0 ? -1 : checkpoints.slot_of(matched.back());
}

// The checkpoint rows of the finished draft: each row whose KV ends a page snapshots its state
// into a slot of its own — prefill rows, and decode rows when the step has no prefill rows (the
// seed snapshots no decode row of a MIXED step).
void Scheduler::Impl::plan_checkpoints(Draft& d) {
  if (!config.recurrent_state || !config.prefix_cache) return;
  LS_ASSERT(d.decode_kv_ends.size() == d.decode_rows.size(), "{} KV ends for {} decode rows",
            d.decode_kv_ends.size(), d.decode_rows.size());
  for (OpRow& row : d.prefill_rows) plan_checkpoint(row, row.prefix_length + row.input_length);
  if (!d.prefill_rows.empty()) return;
  for (size_t i = 0; i < d.decode_rows.size(); ++i) {
    if (config.verify_width > 1) {
      plan_checkpoint_verified(d.decode_rows[i], d.decode_kv_ends[i]);
    } else {
      plan_checkpoint(d.decode_rows[i], d.decode_kv_ends[i]);
    }
  }
}

void Scheduler::Impl::plan_checkpoint(OpRow& row, int32_t kv_end) {
  const int32_t p = config.page_size;
  if (kv_end < p || kv_end % p != 0) return;
  const int32_t slot = checkpoints.take();
  if (slot < 0) return;  // every slot pending: this boundary goes without
  row.mamba_checkpoint_dst = slot;
  requests.at(row.request_id)
      .pending_checkpoints.push_back({slot, seams::checkpoint_boundary(kv_end, p)});
}

// A verified decode row (W > 1) ends its step anywhere in (old, old + W]: it gets a slot whenever a
// page boundary may fall in that span — some multiple of P in (C, kv_end], C the KV committed as
// of applied results (a step in flight may have moved old past C) — and its result settles
// whether the step reached one (settle_verified_checkpoint).
void Scheduler::Impl::plan_checkpoint_verified(OpRow& row, int32_t kv_end) {
  const int32_t p = config.page_size;
  SchedRequest& r = requests.at(row.request_id);
  if (kv_end / p <= r.committed_count / p) return;
  const int32_t slot = checkpoints.take();
  if (slot < 0) return;  // every slot pending: this boundary goes without
  row.mamba_checkpoint_dst = slot;
  r.pending_checkpoints.push_back({slot, kBoundaryUnknown});
}

// Appends the next `chunk` tokens of the request's prefill; the last chunk makes it Decoding (its
// sampled token is the next token, in flight in the device's future_input_map). `cow_src`: the
// checkpoint a prefix hit resumes the recurrent state from (the first chunk after the hit).
void Scheduler::Impl::push_chunk(SchedRequest& r, int32_t chunk, Draft& d, int32_t cow_src) {
  LS_ASSERT(chunk >= 1 && r.scheduled_count + chunk <= r.prefill_length, "chunk {} at {} of {}",
            chunk, r.scheduled_count, r.prefill_length);
  OpRow row = start_row(r, RowKind::kPrefill);
  row.input_length = chunk;
  row.prefix_length = r.scheduled_count;
  row.prompt_length = r.prefill_length;
  if (cow_src >= 0) row.mamba_cow_src = cow_src, row.mamba_branching_seqlen = r.scheduled_count;
  const auto begin = r.tokens.begin() + r.scheduled_count;
  d.prefill_token_ids.insert(d.prefill_token_ids.end(), begin, begin + chunk);
  d.prefill_rows.push_back(std::move(row));
  d.budget -= chunk;
  r.scheduled_count += chunk;
  r.kv_planned = r.scheduled_count;
  if (r.scheduled_count == r.prefill_length) {
    r.state = RequestState::kDecoding;
    r.committed_count = r.prefill_length;
  } else {
    r.state = RequestState::kPrefilling;
  }
}

// First chunk of a new request, or of a retracted request's re-prefill (prompt + generated):
// a pool row, a prefix match over full pages excluding the last token, pages for the chunk + W.
void Scheduler::Impl::admit(SchedRequest& r, Draft& d, StepPlanOut& out) {
  if (!may_add(d, RowKind::kPrefill) || free_pool_rows.empty()) return;
  const int32_t p = config.page_size;
  std::vector<int32_t> matched;
  int32_t cow_src = -1;
  if (config.prefix_cache) {
    const std::span<const int32_t> tokens(r.tokens.data(), static_cast<size_t>(r.prefill_length));
    matched = pages.match(tokens, (r.prefill_length - 1) / p);
    if (config.recurrent_state) cow_src = keep_checkpointed_prefix(matched);
  }
  for (int32_t page : matched) pages.retain(page);
  const int32_t matched_tokens = static_cast<int32_t>(matched.size()) * p;
  const int32_t chunk = aligned_chunk(matched_tokens, std::min(d.budget, r.prefill_length - matched_tokens),
                                      r.prefill_length);
  const int32_t extra = pages_for(matched_tokens + chunk + config.verify_width) -
                        static_cast<int32_t>(matched.size());
  if (extra > pages.available_count()) {
    for (int32_t page : matched) pages.release(page);  // untouched: the LRU order is unchanged
    return;
  }
  pages.touch(matched);
  if (cow_src >= 0) checkpoints.touch(matched.back());
  const bool recovering = r.state == RequestState::kRetracted;
  r.pages = std::move(matched);
  const std::vector<int32_t> fresh = allocate_pages(extra);
  r.pages.insert(r.pages.end(), fresh.begin(), fresh.end());
  r.pool_row = *free_pool_rows.begin();
  free_pool_rows.erase(free_pool_rows.begin());
  r.table_synced_count = 0;
  r.sampling_sent = false;
  r.scheduled_count = matched_tokens;
  if (recovering) {
    out.events.push_back({.kind = SchedulerEvent::Kind::kRecover, .request_id = r.spec.id,
                          .retract_path = RetractPath::kRecompute});
  }
  if (matched_tokens > 0) {
    out.events.push_back(
        {.kind = SchedulerEvent::Kind::kPrefixHit, .request_id = r.spec.id, .tokens = matched_tokens});
  }
  push_chunk(r, chunk, d, cow_src);
}

// Swap recovery (seed invariant 2): fresh device pages, a swap-in of the saved KV (and recurrent
// state, into the new working slot), and a decode row that resumes at hist = TokenSize − 1 with the
// last token as its input, on a new pool row. Not while a row of it is in flight (a model with
// recurrent state keeps that row's token, see retract).
void Scheduler::Impl::recover_by_swap(SchedRequest& r, Draft& d, StepPlanOut& out) {
  if (!may_add(d, RowKind::kDecode) || free_pool_rows.empty() || r.in_flight_count > 0) return;
  if (d.budget < config.verify_width) return;  // the recovered decode row costs W tokens
  const int32_t hist = r.token_size() - 1;
  const int32_t needed = pages_for(hist + (depth + 1) * config.verify_width);
  LS_ASSERT(needed >= static_cast<int32_t>(r.host_pages.size()), "{} pages for {} host pages",
            needed, r.host_pages.size());
  if (needed > pages.available_count()) return;
  r.pages = allocate_pages(needed);
  r.pool_row = *free_pool_rows.begin();
  free_pool_rows.erase(free_pool_rows.begin());
  if (!r.host_pages.empty()) {
    CacheOp swap_in{.kind = CacheOpKind::kSwapIn,
                    .device_pages = {r.pages.begin(), r.pages.begin() + static_cast<std::ptrdiff_t>(r.host_pages.size())},
                    .host_pages = r.host_pages,
                    .state_slot = config.recurrent_state ? seams::mamba_working_slot(r) : -1};
    out.cache_ops.push_back(std::move(swap_in));
    free_host_pages.insert(r.host_pages.begin(), r.host_pages.end());
    r.host_pages.clear();
  }
  r.table_synced_count = 0;
  r.sampling_sent = false;
  r.committed_count = hist;
  r.state = RequestState::kDecoding;
  OpRow row = start_row(r, RowKind::kDecode);
  row.input_length = config.verify_width;
  row.decode_override = r.tokens.back();
  row.hist_token_length = hist;
  d.decode_rows.push_back(std::move(row));
  r.kv_planned = hist + config.verify_width;
  d.decode_kv_ends.push_back(r.kv_planned);
  d.budget -= config.verify_width;
  out.events.push_back({.kind = SchedulerEvent::Kind::kRecover, .request_id = r.spec.id,
                        .retract_path = RetractPath::kSwap, .hist_token_length = hist});
}

// Forward progress. Seed §8 (A) retracts the largest Decoding request and lets any request start
// in the budget a step leaves over. Under page pressure with recompute recovery that livelocks:
// with 15 pages, three requests that each re-prefill into 11 took turns admitting themselves
// into a step's leftover budget, taking the pages the request that had just finished its
// re-prefill needed for its next decode, which the victim rule then retracted, throwing the
// re-prefill away (Properties.SchedulerModel, SchedulerTest.RecomputeThrashUnderPagePressure-
// StillDrains). So, like the seed's HEAD scheduler (a recovery front and a barrier; an incomplete
// prefill stays at the head of the line), there is a head of the line: the live request that
// arrived first (earliest plan, then lowest id, so the order of one turn's submits is irrelevant).
//   1. The head is never a retraction victim (pick_victim).
//   2. No other request starts (admission, re-prefill, swap-in) while the head waits to start or
//      is starved for pages, unless the head has already joined this step (head_allows_start).
// While the head waits, the other running requests can only finish or be retracted, and none can
// come back, so within a bounded number of steps the head gets its pages: alone it always fits
// (submit rejects a request that cannot, so no request is retried forever). The head never loses
// progress, so it finishes and the next request becomes the head: every request finishes.
SchedRequest* Scheduler::Impl::find_head() {
  SchedRequest* best = nullptr;
  for (auto& [id, r] : requests) {  // ascending id: a tie keeps the lower id
    if (!r.finished() && (best == nullptr || r.arrival_plan < best->arrival_plan)) best = &r;
  }
  return best;
}

bool Scheduler::Impl::head_allows_start(const SchedRequest& r, const Draft& d) const {
  if (head == nullptr || &r == head || d.holds(head->spec.id)) return true;
  const bool head_running =
      head->state == RequestState::kDecoding || head->state == RequestState::kPrefilling;
  return head_running && !head->starved;
}

// Retract only when some running request other than the head is blocked, and not while a
// finished request still holds pages that the result in flight will free.
bool Scheduler::Impl::should_retract() const {
  bool running = false;
  for (const auto& [id, r] : requests) {
    if (r.finished() && (r.pool_row != 0 || !r.pages.empty())) return false;
    running = running || (&r != head && (r.state == RequestState::kDecoding ||
                                         r.state == RequestState::kPrefilling));
  }
  return running;
}

// The Decoding request with the most tokens (ties: the higher id, the youngest); with none, the
// Prefilling request furthest along. Never the head of the line.
SchedRequest* Scheduler::Impl::pick_victim() {
  SchedRequest* best = nullptr;
  for (RequestState state : {RequestState::kDecoding, RequestState::kPrefilling}) {
    for (auto& [id, r] : requests) {
      if (r.state != state || &r == head) continue;
      const int32_t size = state == RequestState::kDecoding ? r.token_size() : r.scheduled_count;
      const int32_t best_size = best == nullptr ? -1
                                : state == RequestState::kDecoding ? best->token_size()
                                                                   : best->scheduled_count;
      if (size >= best_size) best = &r;
    }
    if (best != nullptr) return best;
  }
  return nullptr;
}

void Scheduler::Impl::retract(SchedRequest& r, StepPlanOut& out) {
  LS_ASSERT(&r != head, "retracting request {}, the head of the line", r.spec.id);
  const bool decoding = r.state == RequestState::kDecoding;
  // A model with recurrent state: the row in flight (overlap) advances the working state past
  // TokenSize − 1 and cannot be taken back, so a swap keeps that row — its KV is swapped out with
  // the rest and its result is still applied, after which vcl = TokenSize − 1 holds again.
  const bool keeps_row = config.recurrent_state && decoding && r.in_flight_count > 0;
  const int32_t p = config.page_size;
  const int32_t swap_tokens = r.token_size() - (keeps_row ? 0 : 1);
  const bool swap = decoding && config.host_pages_count > 0 &&
                    (swap_tokens + p - 1) / p <= static_cast<int32_t>(free_host_pages.size());
  // Tokens whose KV is surely on the device: TokenSize − 1 while decoding (the last token's KV is
  // written by the next step) or TokenSize for a kept row, the scheduled chunks while prefilling.
  const int32_t kv_tokens = !decoding ? r.scheduled_count : swap ? swap_tokens : r.token_size() - 1;
  cache_kv_pages(r, kv_tokens);
  const int32_t kv_pages = (kv_tokens + p - 1) / p;
  if (swap && kv_pages > 0) {
    for (int32_t i = 0; i < kv_pages; ++i) {
      r.host_pages.push_back(*free_host_pages.begin());
      free_host_pages.erase(free_host_pages.begin());
    }
    out.cache_ops.push_back({.kind = CacheOpKind::kSwapOut,
                             .device_pages = {r.pages.begin(), r.pages.begin() + kv_pages},
                             .host_pages = r.host_pages,
                             .state_slot = config.recurrent_state ? seams::mamba_working_slot(r) : -1});
  }
  LS_ASSERT(!(swap && config.recurrent_state) || kv_pages > 0, "request {}: a state swap without pages",
            r.spec.id);
  drop_device_pages(r);
  r.state = RequestState::kRetracted;
  r.retract_path = swap ? RetractPath::kSwap : RetractPath::kRecompute;
  if (!(swap && keeps_row)) ++r.epoch;  // the row of this request in the step in flight is stale now
  r.prefill_length = r.token_size();
  r.scheduled_count = 0;
  r.committed_count = 0;
  r.starved = false;
  out.events.push_back(
      {.kind = SchedulerEvent::Kind::kRetract, .request_id = r.spec.id, .retract_path = r.retract_path});
}

void Scheduler::Impl::track(const ForwardOp& op) {
  if (op.rows.empty()) return;  // an IDLE op has no result to wait for
  InFlightStep step;
  for (const OpRow& row : op.rows) {
    SchedRequest& r = requests.at(row.request_id);
    step.ids.push_back(row.request_id);
    step.epochs.push_back(r.epoch);
    ++r.in_flight_count;
  }
  in_flight.push_back(std::move(step));
}

}  // namespace ls
