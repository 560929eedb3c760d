#include "sim/checkers.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace ls::sim {

namespace {

void fail(std::vector<CheckFailure>& failures, int64_t step, const char* checker, std::string detail) {
  failures.push_back({step, checker, std::move(detail)});
}

void check_result_shape(const StepObservation& o, std::vector<CheckFailure>& failures) {
  const ForwardOp& op = *o.op;
  const StepResult& r = *o.result;
  const int32_t ne = op.prefill_rows_count();
  const int32_t w = o.config->verify_width;
  const size_t expected = static_cast<size_t>(ne + (op.rows_count() - ne) * w);
  if (r.tokens.size() != expected || r.accepted_lengths.size() != op.rows.size()) {
    fail(failures, o.step, "result-shape",
         fmt::format("{} tokens and {} accepted lengths for {} rows", r.tokens.size(),
                     r.accepted_lengths.size(), op.rows.size()));
    return;
  }
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    if (r.tokens[i] < 0 || r.tokens[i] >= o.vocab_size) {
      fail(failures, o.step, "output-ids-in-vocab", fmt::format("tokens[{}] = {}", i, r.tokens[i]));
    }
  }
  for (int32_t row = 0; row < op.rows_count(); ++row) {
    const int32_t a = r.accepted_lengths[row];
    const bool ok = row < ne ? a == 1 : (a >= 0 && a <= w);
    if (!ok) {
      fail(failures, o.step, "accepted-length-range",
           fmt::format("row {} (request {}) accepted {}", row, op.rows[row].request_id, a));
    }
  }
}

// vcl ≤ L, and vcl grows by exactly what the row committed: prefill rows to prefix + input,
// decode rows by a' from their (possibly recovered) start.
void check_vcl(const StepObservation& o, std::vector<CheckFailure>& failures) {
  const ForwardOp& op = *o.op;
  for (int32_t row = 0; row < op.rows_count(); ++row) {
    const OpRow& x = op.rows[row];
    const int32_t after = o.after->valid_cache_length[row];
    if (after > o.config->context_length) {
      fail(failures, o.step, "vcl-within-context",
           fmt::format("request {}: vcl {} > L = {}", x.request_id, after, o.config->context_length));
    }
    const int32_t expected =
        x.kind == RowKind::kPrefill
            ? x.prefix_length + x.input_length
            : (x.hist_token_length != -1 ? x.hist_token_length : o.before->valid_cache_length[row]) +
                  o.result->accepted_lengths[row];
    if (after != expected) {
      fail(failures, o.step, "vcl-commit",
           fmt::format("request {} ({}): vcl {} after the step, expected {}", x.request_id,
                       to_string(x.kind), after, expected));
    }
  }
}

// Every KV slot the step wrote is the dummy slot 0 or inside a page the request holds.
void check_slots(const StepObservation& o, const Scheduler& scheduler,
                 std::vector<CheckFailure>& failures) {
  const ForwardOp& op = *o.op;
  int32_t offset = 0;
  for (const OpRow& row : op.rows) {
    const std::vector<int32_t> pages = scheduler.pages_of(row.request_id);
    for (int32_t t = 0; t < row.input_length; ++t) {
      const int64_t slot = o.inputs->slots[offset + t];
      const int32_t page = static_cast<int32_t>(slot / o.config->page_size);
      if (slot != 0 && std::find(pages.begin(), pages.end(), page) == pages.end()) {
        fail(failures, o.step, "kv-slot-in-own-pages",
             fmt::format("request {} wrote slot {} (page {}) but holds pages [{}]", row.request_id,
                         slot, page, fmt::join(pages, ", ")));
        return;
      }
    }
    offset += row.input_length;
  }
}

}  // namespace

void check_step(const StepObservation& o, const Scheduler& scheduler,
                std::vector<CheckFailure>& failures) {
  check_result_shape(o, failures);
  if (!failures.empty()) return;
  check_vcl(o, failures);
  check_slots(o, scheduler, failures);
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
