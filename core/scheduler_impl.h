// The scheduler's private state, shared by scheduler.cpp (requests, results, accounting) and
// scheduler_plan.cpp (planning, admission, retraction). Not part of the public API.
#pragma once

#include "core/page_allocator.h"
#include "core/scheduler.h"
#include "core/state_checkpoints.h"

#include <deque>
#include <set>

namespace ls {

// A pending checkpoint's boundary before its verified row's result (settle gives such a slot back).
inline constexpr int32_t kBoundaryUnknown = -1;

struct SchedRequest {
  RequestSpec spec;
  int32_t max_new_tokens = 0;  // spec.max_new_tokens capped at L − prompt length
  bool capped = false;         // the cap cut spec.max_new_tokens: reaching it reports kContext
  int32_t prompt_length = 0;
  RequestState state = RequestState::kWaiting;
  std::vector<int32_t> tokens;  // prompt + generated, as far as applied results tell

  int32_t pool_row = 0;             // 0 = none
  std::vector<int32_t> pages;       // device pages in table order
  int32_t table_synced_count = 0;   // leading pages the device table row already holds
  bool sampling_sent = false;       // the current pool row has seen the sampling parameters
  int32_t prefill_length = 0;       // tokens the current (re)prefill covers
  int32_t scheduled_count = 0;      // of those, already put in a planned chunk
  int32_t committed_count = 0;      // KV tokens as of applied results (C)
  int32_t kv_planned = 0;           // KV tokens once every planned step ran (W = 1 models)
  // Recurrent state with the prefix cache: checkpoint slots a planned row snapshots into, with the
  // KV length they hold the state of; attached to cached pages or given back when it ends.
  // A verified decode row's (W > 1) boundary is kBoundaryUnknown until its result says whether
  // the step reached one.
  std::vector<std::pair<int32_t, int32_t>> pending_checkpoints;  // (slot, boundary)
  std::vector<int32_t> host_pages;  // swap path: the KV of tokens[0, TokenSize − 1)
  RetractPath retract_path = RetractPath::kSwap;
  uint32_t epoch = 0;           // bumped on retraction: older in-flight rows are stale
  int32_t in_flight_count = 0;  // planned steps with a row of this request, result not applied
  FinishReason finish_reason = FinishReason::kLength;
  uint64_t arrival_plan = 0;  // plans made before it was submitted: its place in the line
  bool starved = false;       // running, and its last try to join a step found too few pages

  int32_t token_size() const { return static_cast<int32_t>(tokens.size()); }
  int32_t generated_count() const { return token_size() - prompt_length; }
  bool finished() const { return state == RequestState::kFinished; }
};

struct InFlightStep {
  std::vector<RequestId> ids;   // [rows] in op order
  std::vector<uint32_t> epochs;  // [rows] each request's epoch when planned
};

// The rows of the op being planned, prefill and decode kept apart so prefill rows come first.
struct Draft {
  int32_t budget = 0;
  std::vector<OpRow> prefill_rows;
  std::vector<OpRow> decode_rows;
  std::vector<int32_t> decode_kv_ends;  // [decode rows] each row's KV length after its step
  std::vector<int32_t> prefill_token_ids;

  int32_t rows_count() const {
    return static_cast<int32_t>(prefill_rows.size() + decode_rows.size());
  }
  bool empty() const { return rows_count() == 0; }
  bool holds(RequestId id) const;
  ForwardOp take_op();
};

struct Scheduler::Impl {
  explicit Impl(const SchedulerConfig& c);

  // scheduler_plan.cpp
  Draft schedule(StepPlanOut& out, const std::set<RequestId>& retracted_now);
  std::vector<RequestId> candidates(const std::set<RequestId>& retracted_now) const;
  void schedule_decode(SchedRequest& r, Draft& d);
  void schedule_chunk(SchedRequest& r, Draft& d);
  void admit(SchedRequest& r, Draft& d, StepPlanOut& out);
  void recover_by_swap(SchedRequest& r, Draft& d, StepPlanOut& out);
  void push_chunk(SchedRequest& r, int32_t chunk, Draft& d, int32_t cow_src = -1);
  int32_t aligned_chunk(int32_t start, int32_t chunk, int32_t total) const;
  int32_t keep_checkpointed_prefix(std::vector<int32_t>& matched) const;
  void plan_checkpoints(Draft& d);
  void plan_checkpoint(OpRow& row, int32_t kv_end);
  void plan_checkpoint_verified(OpRow& row, int32_t kv_end);
  void settle_verified_checkpoint(SchedRequest& r, const OpRow& row, int32_t accepted);
  std::vector<int32_t> allocate_pages(int32_t count);
  OpRow start_row(SchedRequest& r, RowKind kind);
  bool grow_pages(SchedRequest& r, int32_t tokens);
  int32_t pages_for(int32_t tokens) const;
  bool may_add(const Draft& d, RowKind kind) const;
  SchedRequest* find_head();
  bool head_allows_start(const SchedRequest& r, const Draft& d) const;
  bool should_retract() const;
  SchedRequest* pick_victim();
  void retract(SchedRequest& r, StepPlanOut& out);
  void track(const ForwardOp& op);

  // scheduler.cpp
  void apply_aborts(std::vector<SchedulerEvent>& events);
  void apply_row(SchedRequest& r, const OpRow& row, const StepResult& result, int32_t i,
                 std::vector<SchedulerEvent>& events);
  void take_tokens(SchedRequest& r, const std::vector<int32_t>& tokens, bool flagged,
                   std::vector<SchedulerEvent>& events);
  void rewind(SchedRequest& r);
  void finish(SchedRequest& r, FinishReason reason, std::vector<SchedulerEvent>& events);
  void release_if_idle(SchedRequest& r);
  void cache_kv_pages(SchedRequest& r, int32_t kv_tokens);
  void settle_checkpoints(SchedRequest& r, int32_t cached_pages);
  std::string check_checkpoints() const;
  void drop_device_pages(SchedRequest& r);
  std::string check_rows_and_hosts() const;

  SchedulerConfig config;
  int32_t depth = 0;        // D: 1 with overlap, else 0
  int32_t table_width = 0;  // Wp of the matching executor
  PageAllocator pages;
  StateCheckpoints checkpoints{0, 0};  // recurrent state with the prefix cache only
  std::set<int32_t> free_pool_rows;
  std::set<int32_t> free_host_pages;
  std::map<RequestId, SchedRequest> requests;
  std::map<RequestId, RequestOutcome> outcomes;
  std::set<RequestId> pending_aborts;
  std::vector<SchedulerEvent> pending_events;  // arrivals, reported by the next plan
  std::deque<InFlightStep> in_flight;
  uint64_t plans_count = 0;
  int32_t live_count = 0;  // submitted and not finished (stats: the queue length)
  int64_t tokens_emitted = 0;  // taken into the requests' outputs (take_tokens)
  // The head of the line, set by each plan: the live request that arrived first (earliest plan,
  // then lowest id). Borrowed from `requests`; null when every request has finished.
  SchedRequest* head = nullptr;
};

}  // namespace ls
