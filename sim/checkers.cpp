#include "sim/checkers.h"

#include "core/invariants.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace ls::sim {

namespace {

void fail(std::vector<CheckFailure>& failures, int64_t step, std::string checker, std::string detail) {
  failures.push_back({step, std::move(checker), std::move(detail)});
}

void fail(std::vector<CheckFailure>& failures, int64_t step,
          const std::optional<InvariantViolation>& v) {
  if (v) fail(failures, step, v->invariant, fmt::format("{}: {}", v->field, v->detail));
}

InvariantLimits limits_of(const StepObservation& o) {
  return InvariantLimits::of(*o.config, o.vocab_size);
}

// output_shape, tokens, accepted_length, nan_flag: false when the shape is off and nothing else can be read.
bool check_result_shape(const StepObservation& o, std::vector<CheckFailure>& failures) {
  const InvariantLimits limits = limits_of(o);
  const StepShape step_shape = StepShape::of(*o.op);
  const std::optional<InvariantViolation> shape = check_output_shape(step_shape, *o.result, limits);
  fail(failures, o.step, shape);
  if (shape) return false;
  fail(failures, o.step, check_output_tokens(step_shape, *o.result, limits));
  for (int32_t row = 0; row < o.op->rows_count(); ++row) {
    fail(failures, o.step, check_accepted_length(step_shape, *o.result, row, limits));
    fail(failures, o.step, check_nan_flag(*o.result, row, *o.faults));
  }
  return true;
}

// context_clamp and valid_cache_length on every row, from the vcl the row had before the step.
void check_vcl(const StepObservation& o, std::vector<CheckFailure>& failures) {
  const InvariantLimits limits = limits_of(o);
  for (int32_t row = 0; row < o.op->rows_count(); ++row) {
    const std::optional<int32_t> start =
        commit_start(*o.op, row, o.before->valid_cache_length[row]);
    fail(failures, o.step, check_context_clamp(*o.op, *o.result, row, start, limits));
    fail(failures, o.step,
         check_valid_cache_length(*o.op, *o.result, row, start, o.after->valid_cache_length[row],
                                  limits));
  }
}

// kv_slot on every token the step wrote, over the pages its request holds (the scheduler's).
void check_slots(const StepObservation& o, const Scheduler& scheduler,
                 std::vector<CheckFailure>& failures) {
  const InvariantLimits limits = limits_of(o);
  int32_t offset = 0;
  for (int32_t row = 0; row < o.op->rows_count(); ++row) {
    const OpRow& x = o.op->rows[row];
    const std::vector<int32_t> pages = scheduler.pages_of(x.request_id);
    for (int32_t index = offset; index < offset + x.input_length; ++index) {
      const std::optional<InvariantViolation> v = check_kv_slot(
          row, index, o.inputs->positions[index], o.inputs->slots[index], pages, limits);
      if (v) return fail(failures, o.step, v);
    }
    offset += x.input_length;
  }
}

}  // namespace

void check_step(const StepObservation& o, const Scheduler& scheduler,
                std::vector<CheckFailure>& failures) {
  if (!check_result_shape(o, failures)) return;
  if (!failures.empty()) return;
  check_vcl(o, failures);
  check_slots(o, scheduler, failures);
}

namespace {

}  // namespace

void check_mamba_slot_owners(int64_t step, const ForwardOp& op, const Scheduler& scheduler,
                             MambaSlotOwners& owners, std::vector<CheckFailure>& failures) {
  // Requests that moved (recovered on another pool row) free their old slot first.
  for (const OpRow& row : op.rows) {
    const auto moved = owners.of_request.find(row.request_id);
    if (moved != owners.of_request.end() && moved->second != row.mamba_working) {
      const auto held = owners.of_slot.find(moved->second);
      if (held != owners.of_slot.end() && held->second == row.request_id) owners.of_slot.erase(held);
    }
    owners.of_request[row.request_id] = row.mamba_working;
  }
  for (const OpRow& row : op.rows) {
    const auto it = owners.of_slot.find(row.mamba_working);
    if (it != owners.of_slot.end() && it->second != row.request_id &&
        owners.of_request[it->second] == row.mamba_working) {
      const std::optional<RequestState> holder = scheduler.state_of(it->second);
      if (holder == RequestState::kPrefilling || holder == RequestState::kDecoding) {
        return fail(failures, step, "mamba-slot-owner",
                    fmt::format("working slot {} given to request {} while request {} that holds "
                                "it is {}", row.mamba_working, row.request_id, it->second,
                                to_string(*holder)));
      }
    }
    owners.of_slot[row.mamba_working] = row.request_id;
  }
}

namespace {

void check_padding_slots(const StepObservation& o, std::vector<CheckFailure>& failures) {
  const std::vector<int32_t>& slots = o.inputs->mamba_slots;
  int32_t token = 0;
  for (int32_t row = 0; row < o.op->rows_count(); ++row) {
    const OpRow& x = o.op->rows[row];
    for (int32_t t = 0; t < x.input_length; ++t, ++token) {
      if (static_cast<size_t>(token) < slots.size() && slots[token] == x.mamba_working) continue;
      return fail(failures, o.step, "mamba-padding",
                  fmt::format("token {} of op row {} (request {}) carries state slot {}, its "
                              "row's working slot is {}", token, row, x.request_id,
                              static_cast<size_t>(token) < slots.size() ? slots[token] : -2,
                              x.mamba_working));
    }
  }
  for (size_t t = static_cast<size_t>(token); t < slots.size(); ++t) {
    if (slots[t] == -1) continue;
    return fail(failures, o.step, "mamba-padding",
                fmt::format("padded token {} (the step has {} tokens) carries state slot {}; "
                            "padding must carry -1", t, token, slots[t]));
  }
}

void check_state_owners(const StepObservation& o, std::vector<CheckFailure>& failures) {
  std::set<int32_t> owned;
  for (const OpRow& row : o.op->rows) {
    owned.insert(row.mamba_working);
    if (row.mamba_checkpoint_dst >= 0) owned.insert(row.mamba_checkpoint_dst);
  }
  const std::vector<uint64_t>& before = *o.mamba_before;
  const std::vector<uint64_t>& after = *o.mamba_after;
  for (size_t slot = 0; slot < before.size() && slot < after.size(); ++slot) {
    if (before[slot] == after[slot] || owned.count(static_cast<int32_t>(slot))) continue;
    return fail(failures, o.step, "mamba-state-owner",
                fmt::format("state slot {} changed (digest {:016x} -> {:016x}) but no row of the "
                            "step owns it (owned: {})", slot, before[slot], after[slot],
                            fmt::join(owned, ", ")));
  }
}

void check_first_chunks(const StepObservation& o, std::vector<CheckFailure>& failures) {
  const StepPlan& plan = *o.plan;
  for (int32_t row = 0; row < o.op->prefill_rows_count(); ++row) {
    const OpRow& x = o.op->rows[row];
    if (x.prefix_length != 0 && x.mamba_cow_src < 0) continue;  // a later chunk: carries on
    const bool zeroed = std::find(plan.mamba_zeroes.begin(), plan.mamba_zeroes.end(),
                                  x.mamba_working) != plan.mamba_zeroes.end();
    const bool copied = std::any_of(plan.mamba_copies.begin(), plan.mamba_copies.end(),
                                    [&](const MambaCopy& c) {
                                      return c.src == x.mamba_cow_src && c.dst == x.mamba_working;
                                    });
    if (x.mamba_cow_src >= 0 ? copied : zeroed) continue;
    return fail(failures, o.step, "mamba-first-chunk",
                fmt::format("op row {} (request {}) starts its request at prefix {} but its "
                            "working slot {} is not {} before the forward", row, x.request_id,
                            x.prefix_length, x.mamba_working,
                            x.mamba_cow_src >= 0 ? fmt::format("copied from slot {}", x.mamba_cow_src)
                                                 : std::string("zeroed")));
  }
}

}  // namespace

void check_mamba_step(const StepObservation& o, const Scheduler& scheduler, MambaSlotOwners& owners,
                      std::vector<CheckFailure>& failures) {
  check_mamba_slot_owners(o.step, *o.op, scheduler, owners, failures);
  check_padding_slots(o, failures);
  if (o.mamba_before && o.mamba_after) check_state_owners(o, failures);
  if (o.plan) check_first_chunks(o, failures);
}

void check_pages(int64_t step, const Scheduler& scheduler, const std::vector<RequestId>& submitted,
                 std::vector<CheckFailure>& failures) {
  const std::string own = scheduler.check_accounting();
  if (!own.empty()) fail(failures, step, "scheduler-accounting", own);
  std::set<int32_t> held;
  for (RequestId id : submitted) {
    for (int32_t page : scheduler.pages_of(id)) {
      if (page <= 0 || page >= scheduler.config().pages_count) {
        fail(failures, step, "page-range", fmt::format("request {} holds page {}", id, page));
      }
      held.insert(page);
    }
  }
  const int64_t total = int64_t{scheduler.free_pages_count()} + static_cast<int64_t>(held.size()) +
                        scheduler.cached_pages_count();
  if (total != scheduler.config().pages_count - 1) {
    fail(failures, step, "page-accounting",
         fmt::format("free {} + held by requests {} + cached only {} = {}, expected {}",
                     scheduler.free_pages_count(), held.size(), scheduler.cached_pages_count(),
                     total, scheduler.config().pages_count - 1));
  }
}

void check_end(const EndState& end, const Scheduler& scheduler, std::vector<CheckFailure>& failures) {
  const auto& outcomes = scheduler.outcomes();
  for (RequestId id : *end.submitted) {
    if (!outcomes.count(id)) {
      fail(failures, -1, "every-request-ends", fmt::format("request {} never finished", id));
      continue;
    }
    const int64_t waited = end.finish_step->at(id) - end.arrival_step->at(id);
    if (waited > end.starvation_bound_steps) {
      fail(failures, -1, "no-starvation",
           fmt::format("request {} took {} steps from arrival to finish, bound {}", id, waited,
                       end.starvation_bound_steps));
    }
  }
  const SchedulerConfig& c = scheduler.config();
  if (scheduler.free_pages_count() + scheduler.cached_pages_count() != c.pages_count - 1) {
    fail(failures, -1, "no-page-leak",
         fmt::format("{} free + {} cached of {} pages at the end", scheduler.free_pages_count(),
                     scheduler.cached_pages_count(), c.pages_count - 1));
  }
  if (scheduler.free_pool_rows_count() != c.max_batch_rows) {
    fail(failures, -1, "no-pool-row-leak",
         fmt::format("{} of {} pool rows free at the end", scheduler.free_pool_rows_count(),
                     c.max_batch_rows));
  }
  if (scheduler.free_host_pages_count() != c.host_pages_count) {
    fail(failures, -1, "no-host-page-leak",
         fmt::format("{} of {} host pages free at the end", scheduler.free_host_pages_count(),
                     c.host_pages_count));
  }
}

}  // namespace ls::sim
