#include "sim/faults.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace ls::sim {

namespace {

constexpr uint32_t kFaultStream = 3;

}  // namespace

FaultInjector::FaultInjector(const SimParams& params, Executor& executor,
                             const Scheduler& scheduler, Clients& clients, FaultFired fired)
    : params_(params),
      executor_(executor),
      scheduler_(scheduler),
      clients_(clients),
      fired_(std::move(fired)),
      random_(params.seed, kFaultStream) {}

bool FaultInjector::enabled(FaultSite site) const {
  return std::find(params_.faults.begin(), params_.faults.end(), site) != params_.faults.end();
}

void FaultInjector::before_plan() {
  if (!fires(FaultSite::kAbortMidPrefill)) return;
  for (RequestId id : clients_.live()) {
    if (clients_.abortable(id) && scheduler_.state_of(id) == RequestState::kPrefilling) {
      clients_.abort(id);
      fired_(FaultSite::kAbortMidPrefill, id, "client abort while prefilling");
      return;
    }
  }
}

void FaultInjector::before_step(const ForwardOp& op) {
  if (op.rows.empty()) return;
  const int32_t last_row = op.rows_count() - 1;
  if (fires(FaultSite::kNanLogits)) {
    const int32_t row = static_cast<int32_t>(random_.range(0, last_row));
    executor_.poison_next_step({row});
    fired_(FaultSite::kNanLogits, op.rows[row].request_id, fmt::format("NaN logits in op row {}", row));
  }
  if (fires(FaultSite::kOovSample)) {
    const int32_t row = static_cast<int32_t>(random_.range(0, last_row));
    const int32_t id = executor_.vocab_size() + static_cast<int32_t>(random_.range(0, 99));
    executor_.force_next_output(row, id);
    fired_(FaultSite::kOovSample, op.rows[row].request_id, fmt::format("id {} in op row {}", id, row));
  }
}

void FaultInjector::after_step(const ForwardOp& op) {
  // Without overlap the result is applied before this: nothing is late.
  if (!params_.overlap || !fires(FaultSite::kLateResult)) return;
  for (const OpRow& row : op.rows) {
    if (clients_.abortable(row.request_id) &&
        scheduler_.state_of(row.request_id) == RequestState::kDecoding) {
      clients_.abort(row.request_id);
      fired_(FaultSite::kLateResult, row.request_id, "abort with a step in flight");
      return;
    }
  }
}

}  // namespace ls::sim
