#include "tests/spec_clamp_properties.h"

#include "core/cpu_backend.h"
#include "core/drafter.h"
#include "core/executor.h"
#include "core/invariants.h"
#include "core/model/weights.h"
#include "core/sampling.h"
#include "proptest/rc_support.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <rapidcheck.h>

#include <algorithm>
#include <functional>
#include <memory>

namespace ls::spec_props {

namespace {

const ModelWeights& weights() {
  static const ModelWeights w = weights_from_seed(model_config_named("tiny"), 7);
  return w;
}

// Greedy-looking outputs (argmax of each logits row) with a seeded accepted length: a = W half the
// time, else uniform in [1, W] — so rows often accept more than the room left before L.
class SeededVerifier final : public Verifier {
 public:
  explicit SeededVerifier(uint64_t seed) : seed_(seed) {}
  int32_t verify(const VerifyRow& row, std::span<int32_t> out, SamplingScratch&) const override {
    const int32_t w = static_cast<int32_t>(row.inputs.size());
    const size_t v = static_cast<size_t>(row.vocab_size);
    for (int32_t i = 0; i < w; ++i) {
      out[i] = argmax_token(row.logits.subspan(static_cast<size_t>(i) * v, v));
    }
    if (row.force_single) return 1;
    const auto words = philox4x32_10(seed_, static_cast<uint64_t>(row.first_position),
                                     static_cast<uint32_t>(row.inputs[0]));
    return (words[0] & 1) ? w : 1 + static_cast<int32_t>(words[1] % static_cast<uint32_t>(w));
  }

 private:
  uint64_t seed_;
};

// What one step showed, for the property checks.
struct StepView {
  int64_t step = 0;
  const ForwardOp* op = nullptr;
  const StepResult* result = nullptr;
  const StateSnapshot* before = nullptr;  // the op's pool rows before the step
  const StateSnapshot* after = nullptr;
  const InputSnapshot* inputs = nullptr;
  const std::vector<std::vector<int32_t>>* held = nullptr;  // [rows] pages reserved per op row
  InvariantLimits limits;
};
using Check = std::function<std::string(const StepView&)>;

// The host side: a plain model of the scheduler's reservation rule (pages through C + (D+1)·W with
// D = 1, C the committed length the step results report) over a shared page pool.
struct HostRequest {
  RequestId id = 0;
  int32_t pool_row = 0;
  std::vector<int32_t> pages;
  int32_t synced = 0;        // leading pages the device table row holds
  int32_t committed = 0;     // C, from the results
  int32_t last_token = 0;
  int32_t lingered = 0;      // decode steps run with C = L
  int32_t decode_steps = 0;
  bool sampling_sent = false;
  bool recovering = false;   // the next row resumes at hist = C with the last token, on a new row
  bool done = false;
};

class Driver {
 public:
  explicit Driver(const ClampWorkload& w) : w_(w) {
    config_.max_batch_rows = static_cast<int32_t>(w.prompt_lengths.size()) + 1;  // a spare row
    config_.context_length = w.context_length;
    config_.page_size = w.page_size;
    config_.verify_width = w.verify_width;
    config_.prefill_chunk_tokens = config_.max_batch_rows * w.context_length;
    config_.pages_count = config_.max_batch_rows * (config_.table_width() + 1) + 1;
    for (int32_t page = config_.pages_count - 1; page >= 1; --page) free_pages_.push_back(page);
    backend_ = std::make_unique<CpuBackend>(
        weights(), config_, std::make_unique<SeededVerifier>(w.seed), /*stub_model=*/true,
        w.ngram_drafter ? std::make_unique<NgramDrafter>() : nullptr);
    executor_ = std::make_unique<Executor>(config_, weights().config.vocab_size, *backend_);
    for (size_t i = 0; i < w.prompt_lengths.size(); ++i) {
      requests_.push_back({.id = 100 + i, .pool_row = static_cast<int32_t>(i) + 1});
    }
  }

  std::string run(const Check& check) {
    std::string failure = step(prefill_op(), check);
    for (int64_t guard = 0; failure.empty() && guard < 4 * w_.context_length; ++guard) {
      ForwardOp op = decode_op();
      if (op.rows.empty()) break;
      failure = step(std::move(op), check);
    }
    return failure;
  }

 private:
  int32_t pages_for(int32_t tokens) const {
    return std::min((tokens + w_.page_size - 1) / w_.page_size, config_.table_width());
  }

  OpRow start_row(HostRequest& r, RowKind kind, int32_t reserve_tokens) {
    const int32_t needed = pages_for(reserve_tokens);
    while (static_cast<int32_t>(r.pages.size()) < needed) {
      r.pages.push_back(free_pages_.back());
      free_pages_.pop_back();
    }
    OpRow row{.kind = kind, .request_id = r.id, .pool_row = r.pool_row};
    row.refresh.begin = r.synced;
    row.refresh.pages.assign(r.pages.begin() + r.synced, r.pages.end());
    r.synced = static_cast<int32_t>(r.pages.size());
    if (!r.sampling_sent) row.sampling = SamplingParams{};
    r.sampling_sent = true;
    return row;
  }

  ForwardOp prefill_op() {
    ForwardOp op;
    for (size_t i = 0; i < requests_.size(); ++i) {
      HostRequest& r = requests_[i];
      const int32_t length = w_.prompt_lengths[i];
      OpRow row = start_row(r, RowKind::kPrefill, length + w_.verify_width);
      row.input_length = length;
      row.prompt_length = length;
      op.rows.push_back(std::move(row));
      for (int32_t t = 0; t < length; ++t) {
        op.prefill_token_ids.push_back(static_cast<int32_t>((r.id * 131 + static_cast<uint64_t>(t % 7) * 17) % 512));
      }
    }
    return op;
  }

  ForwardOp decode_op() {
    ForwardOp op;
    const int32_t spare_row = config_.max_batch_rows;
    for (HostRequest& r : requests_) {
      if (r.done) continue;
      if (w_.recover_midway && &r == &requests_[0] && r.decode_steps == 2 &&
          r.committed < w_.context_length) {
        // Retracted (its KV kept in its pages) and recovered on the spare pool row.
        r.pool_row = spare_row, r.synced = 0, r.sampling_sent = false, r.recovering = true;
      }
      OpRow row = start_row(r, RowKind::kDecode, r.committed + 2 * w_.verify_width);
      row.input_length = w_.verify_width;
      if (r.recovering) {
        row.hist_token_length = r.committed;
        row.decode_override = r.last_token;
        r.recovering = false;
      }
      op.rows.push_back(std::move(row));
    }
    return op;
  }

  std::string step(ForwardOp op, const Check& check) {
    std::vector<int32_t> rows;
    std::vector<std::vector<int32_t>> held;
    for (const OpRow& row : op.rows) {
      rows.push_back(row.pool_row);
      held.push_back(request(row.request_id).pages);
    }
    const StateSnapshot before = backend_->read_state(rows);
    const StepResult result = executor_->step(op);
    const StateSnapshot after = backend_->read_state(rows);
    const InputSnapshot inputs = backend_->read_inputs();
    const StepView view{steps_, &op, &result, &before, &after, &inputs, &held,
                        InvariantLimits::of(config_, executor_->vocab_size())};
    std::string failure = check(view);
    if (!failure.empty()) return fmt::format("{}\n  workload: {}", failure, w_.describe());
    apply(op, result);
    ++steps_;
    return {};
  }

  void apply(const ForwardOp& op, const StepResult& result) {
    for (int32_t i = 0; i < op.rows_count(); ++i) {
      HostRequest& r = request(op.rows[i].request_id);
      const std::vector<int32_t> tokens = result.row_tokens(i);
      if (!tokens.empty()) r.last_token = tokens.back();
      if (op.rows[i].kind == RowKind::kPrefill) {
        r.committed = op.rows[i].input_length;
        continue;
      }
      if (r.committed >= w_.context_length) ++r.lingered;
      r.committed += result.accepted_lengths[i];
      ++r.decode_steps;
      r.done = r.committed >= w_.context_length && r.lingered >= w_.lingering_steps;
    }
  }

  HostRequest& request(RequestId id) {
    return *std::find_if(requests_.begin(), requests_.end(),
                         [id](const HostRequest& r) { return r.id == id; });
  }

  ClampWorkload w_;
  ExecutorConfig config_;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<Executor> executor_;
  std::vector<HostRequest> requests_;
  std::vector<int32_t> free_pages_;
  int64_t steps_ = 0;
};

std::string where(const StepView& v, int32_t row) {
  return fmt::format("step {} row {} (request {}, {})", v.step, row, v.op->rows[row].request_id,
                     to_string(v.op->rows[row].kind));
}

}  // namespace

std::string ClampWorkload::describe() const {
  return fmt::format(
      "seed {}: W {}, P {}, L {}, prompts [{}], lingering steps {}, drafter {}, recovery {}", seed,
      verify_width, page_size, context_length, fmt::join(prompt_lengths, ", "), lingering_steps,
      ngram_drafter ? "ngram" : "none", recover_midway ? "yes" : "no");
}

void showValue(const ClampWorkload& w, std::ostream& os) { os << w.describe(); }

rc::Gen<ClampWorkload> gen_clamp_workload() {
  // At RapidCheck's nominal size every range below is drawn in full from the first case on.
  return rc::gen::resize(rc_support::kGenSize, rc::gen::exec([] {
    ClampWorkload w;
    w.seed = *rc::gen::inRange<uint64_t>(1, uint64_t{1} << 32);
    w.verify_width = *rc::gen::inRange(2, 9);
    w.page_size = 1 << *rc::gen::inRange(1, 5);
    w.context_length = *rc::gen::inRange(w.verify_width + 8, 65);
    const int32_t requests = *rc::gen::inRange(1, 5);
    for (int32_t i = 0; i < requests; ++i) {
      // Most prompts end within 2W of L, so verify steps accept past the room left.
      const bool near_limit = *rc::gen::inRange(0, 100) < 70;
      w.prompt_lengths.push_back(
          near_limit ? std::max(1, w.context_length - *rc::gen::inRange(1, 2 * w.verify_width + 1))
                     : *rc::gen::inRange(1, w.context_length / 2 + 1));
    }
    w.lingering_steps = *rc::gen::inRange(1, 4);
    w.ngram_drafter = *rc::gen::inRange(0, 2) == 1;
    w.recover_midway = *rc::gen::inRange(0, 100) < 30;
    return w;
  }));
}

std::optional<std::string> counterexample(const std::string& id, const ClampProperty& property,
                                          int cases) {
  // The property's failure names the workload.
  return rc_support::run_property(id, cases, [&] { return property(*gen_clamp_workload()); });
}

std::string vcl_within_context(const ClampWorkload& w) {
  return Driver(w).run([](const StepView& v) -> std::string {
    for (int32_t row = 0; row < v.op->rows_count(); ++row) {
      const int32_t vcl = v.after->valid_cache_length[row];
      if (vcl > v.limits.context_length) {
        return fmt::format("{}: vcl {} > L = {}", where(v, row), vcl, v.limits.context_length);
      }
    }
    return {};
  });
}

std::string kv_slots_within_own_pages(const ClampWorkload& w) {
  return Driver(w).run([](const StepView& v) -> std::string {
    int32_t offset = 0;
    for (int32_t row = 0; row < v.op->rows_count(); ++row) {
      const std::vector<int32_t>& pages = (*v.held)[row];
      for (int32_t t = 0; t < v.op->rows[row].input_length; ++t) {
        const int32_t position = v.inputs->positions[offset + t];
        const int64_t slot = v.inputs->slots[offset + t];
        // Stricter than kv_slot, which gives the dummy slot past the pages: with the clamp no
        // row writes there at all.
        if (position / v.limits.page_size >= std::ssize(pages)) {
          return fmt::format("{}: writes KV at position {} (slot {}), past its {} pages of {} tokens",
                             where(v, row), position, slot, pages.size(), v.limits.page_size);
        }
        if (auto bad = check_kv_slot(row, offset + t, position, slot, pages, v.limits)) {
          return fmt::format("{}: {}: {}", where(v, row), bad->field, bad->detail);
        }
      }
      offset += v.op->rows[row].input_length;
    }
    return {};
  });
}

std::string accepted_lengths_equal_vcl_growth(const ClampWorkload& w) {
  return Driver(w).run([](const StepView& v) -> std::string {
    const int32_t width = v.limits.verify_width;
    for (int32_t row = v.op->prefill_rows_count(); row < v.op->rows_count(); ++row) {
      const OpRow& x = v.op->rows[row];
      const int32_t start = x.hist_token_length != -1 ? x.hist_token_length : v.before->valid_cache_length[row];
      const int32_t growth = v.after->valid_cache_length[row] - start;
      const int32_t accepted = v.result->accepted_lengths[row];
      if (growth != accepted) {
        return fmt::format("{}: the result accepted {} but vcl grew by {} (from {})", where(v, row),
                           accepted, growth, start);
      }
      const std::vector<int32_t> tokens = v.result->row_tokens(row);
      const int32_t next = v.after->future_inputs[static_cast<size_t>(row) * width];
      if (!tokens.empty() && next != tokens.back()) {
        return fmt::format("{}: the next round starts from {} but the result's last token is {}",
                           where(v, row), next, tokens.back());
      }
    }
    return {};
  });
}

}  // namespace ls::spec_props
