#include "tests/mamba_slot_properties.h"

#include "core/check.h"
#include "core/forward_op.h"
#include "core/scheduler.h"
#include "proptest/rc_support.h"
#include "sim/checkers.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <optional>

namespace ls::mamba_props {

namespace {

constexpr int32_t kVocab = 64;
constexpr int32_t kContextLength = 48;
constexpr int64_t kStepsMax = 4000;

// What a model would have returned: one token per prefill row, one accepted per decode row (W 1).
StepResult fake_result(const ForwardOp& op, int64_t step) {
  StepResult r;
  r.mode = op.mode();
  r.prefill_rows_count = op.prefill_rows_count();
  for (const OpRow& row : op.rows) {
    r.tokens.push_back(static_cast<int32_t>((row.request_id * 7 + static_cast<uint64_t>(step)) % kVocab));
    r.accepted_lengths.push_back(1);
  }
  r.nan_flags.assign(op.rows.size(), 0);
  r.oov_flags.assign(op.rows.size(), 0);
  return r;
}

SchedulerConfig config_of(const SlotWorkload& w) {
  SchedulerConfig c;
  c.max_batch_rows = w.max_batch_rows;
  c.context_length = kContextLength;
  c.page_size = w.page_size;
  c.pages_count = w.pages_count;
  c.prefill_chunk_tokens = w.prefill_chunk_tokens;
  c.mamba_slots_count = w.max_batch_rows + w.checkpoint_slots;
  c.host_pages_count = w.host_pages_count;
  c.overlap = w.overlap;
  c.recurrent_state = true;
  c.prefix_cache = w.checkpoint_slots > 0;
  return c;
}

}  // namespace

std::string SlotWorkload::describe() const {
  return fmt::format("B {} P {} pages {} chunk {} overlap {} checkpoints {} host pages {} prompts "
                     "[{}] new [{}]", max_batch_rows, page_size, pages_count, prefill_chunk_tokens,
                     overlap ? "on" : "off", checkpoint_slots, host_pages_count,
                     fmt::join(prompt_lengths, ", "), fmt::join(new_tokens, ", "));
}

void showValue(const SlotWorkload& w, std::ostream& os) { os << w.describe(); }

rc::Gen<SlotWorkload> gen_slot_workload() {
  return rc::gen::resize(rc_support::kGenSize, rc::gen::exec([] {
    SlotWorkload w;
    w.max_batch_rows = *rc::gen::inRange(2, 7);
    w.page_size = 1 << *rc::gen::inRange(1, 4);
    const int32_t pages_per_request = kContextLength / w.page_size + 2;
    // Tight pools retract; roomy ones let every row run at once.
    w.pages_count = *rc::gen::inRange(pages_per_request + 1, w.max_batch_rows * pages_per_request + 2);
    w.prefill_chunk_tokens = *rc::gen::inRange(2, 33);
    w.overlap = *rc::gen::inRange(0, 2) == 1;
    w.checkpoint_slots = *rc::gen::inRange(0, 2) == 1 ? *rc::gen::inRange(1, 6) : 0;
    w.host_pages_count = *rc::gen::inRange(0, 2) == 1 ? 2 * pages_per_request : 0;
    const int32_t requests = *rc::gen::inRange(2, 11);
    for (int32_t i = 0; i < requests; ++i) {
      const int32_t prompt = *rc::gen::inRange(1, kContextLength - 8);
      w.prompt_lengths.push_back(prompt);
      w.new_tokens.push_back(*rc::gen::inRange(1, 9));
    }
    return w;
  }));
}

std::string working_slots_never_shared(const SlotWorkload& w) {
  const SchedulerConfig config = config_of(w);
  Scheduler scheduler(config);
  for (size_t i = 0; i < w.prompt_lengths.size(); ++i) {
    RequestSpec r;
    r.id = static_cast<RequestId>(i + 1);
    // Prompts share their first tokens (ids repeat every 8 requests), so prefix hits happen.
    for (int32_t t = 0; t < w.prompt_lengths[i]; ++t) {
      const uint64_t salt = t < 12 ? 0 : r.id % 8;
      r.prompt.push_back(static_cast<int32_t>((salt * 13 + static_cast<uint64_t>(t) * 5) % kVocab));
    }
    r.max_new_tokens = w.new_tokens[i];
    scheduler.submit(r, kVocab);
  }
  ForwardOpValidator validator(executor_config_for(config), kVocab, /*recurrent_state=*/true);
  sim::MambaSlotOwners owners;  // the cross-step half: the simulator's mamba-slot-owner checker
  std::optional<std::pair<ForwardOp, StepResult>> in_flight;
  for (int64_t step = 0; !scheduler.done(); ++step) {
    if (step >= kStepsMax) return fmt::format("{}: not done after {} steps", w.describe(), step);
    StepPlanOut plan = scheduler.plan();
    if (in_flight) scheduler.apply_result(in_flight->first, in_flight->second);
    in_flight.reset();
    try {
      validator.validate(plan.op);  // ranges, and no slot written by two rows of the op
    } catch (const Error& e) {
      return fmt::format("{}: step {}: {}", w.describe(), step, e.what());
    }
    std::vector<sim::CheckFailure> shared;
    sim::check_mamba_slot_owners(step, plan.op, scheduler, owners, shared);
    if (!shared.empty()) {
      return fmt::format("{}: step {}: {}: {}", w.describe(), step, shared[0].checker,
                         shared[0].detail);
    }
    if (plan.op.rows.empty()) continue;
    StepResult result = fake_result(plan.op, step);
    if (config.overlap) {
      in_flight.emplace(std::move(plan.op), std::move(result));
    } else {
      scheduler.apply_result(plan.op, result);
    }
    const std::string accounting = scheduler.check_accounting();
    if (!accounting.empty()) return fmt::format("{}: step {}: {}", w.describe(), step, accounting);
  }
  return "";
}

std::optional<std::string> counterexample(int cases) {
  return rc_support::run_property("mamba/working_slots_never_shared", cases,
                                  [] { return working_slots_never_shared(*gen_slot_workload()); });
}

}  // namespace ls::mamba_props
