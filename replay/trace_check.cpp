#include "replay/trace_check.h"

#include "core/invariants.h"

#include "core/check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <set>

namespace ls::replay {

std::string TraceViolation::describe() const {
  const std::string where =
      row >= 0 ? fmt::format("step {} row {} (request {})", step, row, request_id) : fmt::format("step {}", step);
  return fmt::format("{}: {} ({}): {}", where, invariant, field, detail);
}

namespace {

struct PoolRowState {
  bool owned = false;
  RequestId owner = 0;
  bool greedy = false;  // the owner's sampling
  std::optional<int32_t> vcl;  // as of the last output record that showed this row
};

struct OpenInput {
  trace::StepInputRecord input;
  std::vector<std::optional<int32_t>> vcl_before;  // [bs] the model's vcl of each row's pool row
  std::vector<uint8_t> greedy;                     // [bs] 1: the row samples greedily
};

class Checker {
 public:
  explicit Checker(trace::TraceReader reader) : reader_(std::move(reader)), h_(reader_.header()) {
    report_.header = h_;
    rows_.resize(static_cast<size_t>(h_.executor.pool_rows_count()));
  }

  CheckReport run() {
    trace::TraceRecord record;
    while (!report_.violation) {
      try {
        if (!reader_.next(record)) break;
      } catch (const trace::TraceCorruption&) {
        throw;  // the file is damaged: not a finding about the executor (exit 2, not 1)
      } catch (const Error& e) {
        // A record the reader refuses is unusable input too, not a broken invariant.
        throw Error(fmt::format("the record after step {} is unusable: {}", last_step_, e.what()));
      }
      if (auto* in = std::get_if<trace::StepInputRecord>(&record)) {
        // A run-ahead recording writes input k+1 before output k; the model of device state
        // takes step k's output first, as the device did.
        if (!open_.empty()) {
          deferred_ = std::move(*in);
          continue;
        }
        on_input(std::move(*in));
      } else if (auto* out = std::get_if<trace::StepOutputRecord>(&record)) {
        on_output(*out);
        take_deferred();
      } else if (auto* ev = std::get_if<trace::TraceEvent>(&record)) {
        on_event(*ev);
        if (ev->kind == trace::EventKind::kStepRejected) take_deferred();
      }
    }
    report_.truncation = reader_.truncation();
    return std::move(report_);
  }

 private:
  void violate(int64_t step, int32_t row, RequestId id, const std::string& invariant,
               const std::string& field, const std::string& detail) {
    if (report_.violation) return;
    report_.violation = TraceViolation{step, row, id, invariant, field, detail};
  }

  void take_deferred() {
    if (!deferred_ || report_.violation) return;
    trace::StepInputRecord in = std::move(*deferred_);
    deferred_.reset();
    on_input(std::move(in));
  }

  void on_input(trace::StepInputRecord&& in) {
    last_step_ = in.step;
    const ForwardOp& op = in.op;
    try {
      validate_forward_op(op, h_.executor, h_.model.vocab_size, h_.model.has_recurrent_state());
    } catch (const Error& e) {
      return violate(in.step, -1, 0, "forward_op", "op", e.what());
    }
    OpenInput open{.input = std::move(in)};
    const ForwardOp& o = open.input.op;
    if (!check_mamba_slots(open.input)) return;
    for (int32_t i = 0; i < o.rows_count(); ++i) {
      const OpRow& row = o.rows[i];
      PoolRowState& pr = rows_[row.pool_row];
      const bool fresh = !pr.owned || pr.owner != row.request_id;
      if (fresh && !row.sampling) {
        return violate(open.input.step, i, row.request_id, "sampling", fmt::format("rows[{}].sampling", i),
                       fmt::format("the request is new to pool row {} but carries no sampling parameters", row.pool_row));
      }
      const auto seat = seat_.find(row.request_id);
      if (seat != seat_.end() && seat->second != row.pool_row) {
        const PoolRowState& old = rows_[seat->second];
        if (old.owned && old.owner == row.request_id) {
          return violate(open.input.step, i, row.request_id, "pool_row", fmt::format("rows[{}].pool_row", i),
                         fmt::format("the request moves to pool row {} while pool row {} still holds it "
                                     "(no retract, finish or abort in between)", row.pool_row, seat->second));
        }
      }
      if (row.kind == RowKind::kDecode && fresh && row.hist_token_length == -1) {
        return violate(open.input.step, i, row.request_id, "decode_without_kv",
                       fmt::format("rows[{}].hist_token_length", i),
                       fmt::format("a decode row on pool row {}, which holds no KV of this request, is not "
                                   "a recovery (hist_token_length = -1)", row.pool_row));
      }
      if (row.kind == RowKind::kDecode && fresh && row.hist_token_length != -1) {
        pr.vcl = std::nullopt;  // resumes from hist
      }
      // The vcl this row starts from, as the model of device state says.
      open.vcl_before.push_back(fresh ? std::nullopt : pr.vcl);
      if (fresh) {
        // A previous owner loses the row; it is seated elsewhere or gone.
        if (pr.owned) seat_.erase(pr.owner);
        pr.vcl = std::nullopt;
      }
      pr.owned = true;
      pr.owner = row.request_id;
      if (row.sampling) pr.greedy = row.sampling->is_greedy();
      open.greedy.push_back(pr.greedy ? 1 : 0);
      seat_[row.request_id] = row.pool_row;
    }
    open_.push_back(std::move(open));
  }

  // A working state slot changes hands only once the request holding it retracted, finished or
  // aborted (its event releases the slot); a request that moves to another slot frees its old
  // one. A step planned before a finish was known (overlap) may still carry the request: an ended
  // request claims no slot again.
  bool check_mamba_slots(const trace::StepInputRecord& in) {
    const ForwardOp& op = in.op;
    for (int32_t i = 0; i < op.rows_count(); ++i) {
      const OpRow& row = op.rows[i];
      if (row.mamba_working < 0 || ended_.count(row.request_id)) continue;
      const auto held = holder_of_slot_.find(row.mamba_working);
      if (held != holder_of_slot_.end() && held->second != row.request_id) {
        violate(in.step, i, row.request_id, "mamba_slot", fmt::format("rows[{}].mamba_working", i),
                fmt::format("working slot {} is given to this request while request {} holds it "
                            "(no retract, finish or abort in between)", row.mamba_working,
                            held->second));
        return false;
      }
    }
    for (const OpRow& row : op.rows) {
      if (row.mamba_working < 0 || ended_.count(row.request_id)) continue;
      release_slot(row.request_id);  // moved to another slot, or the same one again
      slot_of_[row.request_id] = row.mamba_working;
      holder_of_slot_[row.mamba_working] = row.request_id;
    }
    return true;
  }

  void release_slot(RequestId id) {
    const auto held = slot_of_.find(id);
    if (held == slot_of_.end()) return;
    const auto holder = holder_of_slot_.find(held->second);
    if (holder != holder_of_slot_.end() && holder->second == id) holder_of_slot_.erase(holder);
    slot_of_.erase(held);
  }

  void on_output(const trace::StepOutputRecord& out) {
    if (open_.empty() || open_.front().input.step != out.step) {
      throw Error(fmt::format("step {}: an output record with no matching open input", out.step));
    }
    const OpenInput open = std::move(open_.front());
    open_.pop_front();
    const ForwardOp& op = open.input.op;
    const StepResult& r = out.result;
    const int32_t bs = op.rows_count();
    const InvariantLimits limits = InvariantLimits::of(h_.executor, h_.model.vocab_size);
    const auto broken = [&](const std::optional<InvariantViolation>& v) {
      if (!v) return false;
      violate(out.step, v->row, v->row >= 0 ? op.rows[v->row].request_id : 0, v->invariant, v->field,
              v->detail);
      return true;
    };
    const StepShape shape = StepShape::of(op);
    if (broken(check_output_shape(shape, r, limits)) || broken(check_output_tokens(shape, r, limits))) return;
    if (!check_greedy_tokens(out, open)) return;
    for (int32_t i = 0; i < bs; ++i) {
      const OpRow& row = op.rows[i];
      const std::optional<int32_t> base = commit_start(op, i, open.vcl_before[i]);
      if (broken(check_accepted_length(shape, r, i, limits)) ||
          broken(check_context_clamp(op, r, i, base, limits))) {
        return;
      }
      // A foreign executor's flags are its own findings, not faults planted by lockstep.
      if (!h_.is_foreign() && broken(check_nan_flag(r, i, open.input.faults))) return;
      PoolRowState& pr = rows_[row.pool_row];
      if (out.valid_cache_lengths.empty()) {
        pr.vcl = std::nullopt;
        continue;
      }
      const int32_t vcl = out.valid_cache_lengths[i];
      if (broken(check_valid_cache_length(op, r, i, base, vcl, limits))) return;
      pr.vcl = vcl;
      ++report_.rows_checked;
    }
    ++report_.steps_checked;
  }

  // A greedy row emits the top-1 of each logits row it emitted from (the recorded top-k's first
  // pair: the same order, lower id first on ties), unless a fault forced its output.
  bool check_greedy_tokens(const trace::StepOutputRecord& out, const OpenInput& open) {
    const trace::StepInputRecord& in = open.input;
    const size_t k = static_cast<size_t>(out.top_logits_count);
    if (k == 0) return true;
    const ForwardOp& op = in.op;
    const int32_t ne = op.prefill_rows_count();
    const int32_t w = h_.executor.verify_width;
    for (int32_t i = 0; i < op.rows_count(); ++i) {
      const bool forced = std::any_of(in.faults.forced_outputs.begin(), in.faults.forced_outputs.end(),
                                      [&](const auto& f) { return f.first == i; });
      if (open.greedy[static_cast<size_t>(i)] == 0 || forced || out.result.oov_flags[i] != 0) continue;
      const int32_t first = i < ne ? i : ne + (i - ne) * w;
      for (int32_t j = 0; j < out.result.accepted_lengths[i]; ++j) {
        const size_t r = static_cast<size_t>(first + j);
        const trace::TopLogit& best = out.top_logits[r * k];
        if (out.result.tokens[r] == best.id) continue;
        violate(out.step, i, op.rows[i].request_id, "greedy_token", fmt::format("tokens[{}]", r),
                fmt::format("a greedy row emitted {} but the recorded top logit of logits row {} "
                            "is id {} ({})", out.result.tokens[r], r, best.id, best.logit));
        return false;
      }
    }
    return true;
  }

  void on_event(const trace::TraceEvent& e) {
    using trace::EventKind;
    if (e.kind == EventKind::kStepRejected) {
      if (!open_.empty()) open_.pop_front();
      return;
    }
    // A retracted or ended request leaves its seat; its pool row keeps the executor's ownership
    // (with overlap, a step planned before the finish was known may still carry it).
    if (e.kind == EventKind::kRetract || e.kind == EventKind::kFinish || e.kind == EventKind::kAbort) {
      seat_.erase(e.request_id);
      release_slot(e.request_id);
    }
    if (e.kind == EventKind::kFinish || e.kind == EventKind::kAbort) ended_.insert(e.request_id);
  }

  trace::TraceReader reader_;
  const trace::TraceHeader& h_;
  CheckReport report_;
  std::vector<PoolRowState> rows_;          // [pool rows]
  std::map<RequestId, int32_t> seat_;       // request → its pool row while seated
  std::map<int32_t, RequestId> holder_of_slot_;  // working state slot → the last request on it
  std::map<RequestId, int32_t> slot_of_;         // request → its working slot
  std::set<RequestId> ended_;                    // finished or aborted: claims no slot again
  std::deque<OpenInput> open_;
  std::optional<trace::StepInputRecord> deferred_;  // read while the step before it was open
  int64_t last_step_ = 0;
};

}  // namespace

CheckReport check_trace(const std::filesystem::path& path) {
  return check_trace(trace::TraceReader::open(path, trace::TraceReaderOptions{.validate_ops = false}));
}

CheckReport check_trace(trace::TraceReader reader) {
  Checker checker(std::move(reader));
  return checker.run();
}

}  // namespace ls::replay
