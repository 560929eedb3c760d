#include "tests/hybrid_spec_properties.h"

#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/drafter.h"
#include "core/executor.h"
#include "core/logits_digest.h"
#include "core/ops/digest.h"
#include "core/serving_loop.h"
#include "core/step_observer.h"
#include "proptest/rc_support.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace ls::hybrid_spec {

namespace {

constexpr int32_t kContextLength = 64;
constexpr int32_t kCheckpointSlots = 6;
constexpr uint64_t kWeightsSeed = 3;

// Proposes each request's reference continuation, a draft right with `acceptance` percent (a
// hash of request, position and draft index decides) and otherwise an id that differs from it:
// so verify rows accept every length from 1 to W.
class ReferenceDrafter final : public Drafter {
 public:
  ReferenceDrafter(std::map<RequestId, std::vector<int32_t>> references, int32_t acceptance)
      : references_(std::move(references)), acceptance_(acceptance) {}

  void draft(const DraftContext& c, std::span<int32_t> drafts) const override {
    const auto it = references_.find(c.request_id);
    for (size_t i = 0; i < drafts.size(); ++i) {
      const int64_t at = int64_t{c.position} + 1 + static_cast<int64_t>(i);
      const bool known = it != references_.end() && at < static_cast<int64_t>(it->second.size());
      const int32_t truth = known ? it->second[static_cast<size_t>(at)] : c.bonus;
      const uint64_t h = digest::fmix64((c.request_id * 1000003ull + static_cast<uint64_t>(at)) *
                                                 31ull + i);
      const bool right = known && static_cast<int32_t>(h % 100) < acceptance_;
      drafts[i] = right ? truth : (truth + 1 + static_cast<int32_t>(h >> 40) % (c.vocab_size - 1)) %
                                      c.vocab_size;
    }
  }
  std::string name() const override { return "reference"; }

 private:
  std::map<RequestId, std::vector<int32_t>> references_;
  int32_t acceptance_;
};

// Digests the logits row that decided each emitted token, by (request, position of the row's
// input): a prefill row's last token, a decode row's rows 0 … a' − 1 (their inputs are the
// committed tokens; later rows read a rejected draft). A position computed twice (a recompute, a
// result discarded) must give the same bits.
class DigestObserver final : public StepObserver {
 public:
  DigestObserver(SpecRun& run, int32_t vocab, int32_t width) : run_(run), vocab_(vocab), width_(width) {}

  void on_step_input(int64_t, const ForwardOp&, const std::vector<CacheOp>&, const StepFaults&) override {}
  void on_step_output(int64_t step, const ForwardOp& op, const StepResult& result,
                      const StateSnapshot& state) override {
    const int32_t ne = op.prefill_rows_count();
    for (int32_t i = 0; i < op.rows_count(); ++i) {
      const OpRow& row = op.rows[static_cast<size_t>(i)];
      if (row.kind == RowKind::kPrefill) {
        note(step, result, row.request_id, row.prefix_length + row.input_length - 1, i);
        continue;
      }
      const int32_t accepted = result.accepted_lengths[static_cast<size_t>(i)];
      const int32_t old = state.valid_cache_length[static_cast<size_t>(i)] - accepted;
      if (accepted < width_) ++run_.partial_rows;
      for (int32_t t = 0; t < accepted; ++t) {
        note(step, result, row.request_id, old + t, ne + (i - ne) * width_ + t);
      }
    }
  }
  void on_scheduler_events(int64_t, const std::vector<SchedulerEvent>& events) override {
    for (const SchedulerEvent& e : events) {
      if (e.kind == SchedulerEvent::Kind::kPrefixHit) run_.prefix_hit_tokens += e.tokens;
      if (e.kind == SchedulerEvent::Kind::kRetract) ++run_.retractions;
    }
  }

 private:
  void note(int64_t step, const StepResult& result, RequestId id, int32_t position,
            int32_t logits_row) {
    const std::span<const float> logits(result.logits.data() + static_cast<size_t>(logits_row) * vocab_,
                                        static_cast<size_t>(vocab_));
    const uint64_t digest = logits_row_digest(logits);
    const auto [it, fresh] = run_.digests.emplace(std::pair{id, position}, digest);
    if (!fresh && it->second != digest && run_.problem.empty()) {
      run_.problem = fmt::format("step {}: request {} position {} computed twice with different "
                                 "logits", step, id, position);
    }
  }

  SpecRun& run_;
  int32_t vocab_;
  int32_t width_;
};

int32_t pages_per_request(const SpecWorld& w) {
  return (kContextLength + 2 * w.verify_width) / w.page_size + 2;
}

SchedulerConfig config_of(const ModelWeights& weights, const SpecWorld& w, int32_t width) {
  Limits limits;
  limits.max_batch_rows = w.max_batch_rows;
  limits.context_length = kContextLength;
  limits.page_size = w.page_size;
  limits.pages_count = (w.tight_pool ? 1 : w.max_batch_rows) * pages_per_request(w) + 1;
  limits.prefill_chunk_tokens = std::max(w.chunk, width);
  limits.verify_width = width;
  limits.mamba_slots_count = w.max_batch_rows + (w.prefix_cache ? kCheckpointSlots : 0);
  SchedulerConfig c = scheduler_config_for_model(limits, weights.config);
  c.prefix_cache = w.prefix_cache;
  c.overlap = w.overlap;
  return c;
}

}  // namespace

const ModelWeights& tiny_hybrid_weights() {
  static const ModelWeights w = weights_from_seed(model_config_named("tiny-hybrid"), kWeightsSeed);
  return w;
}

std::string SpecWorld::describe() const {
  return fmt::format("B {} P {} chunk {} W {} acceptance {}% prefix cache {} pool {} overlap {}",
                     max_batch_rows, page_size, chunk, verify_width, acceptance,
                     prefix_cache ? "on" : "off", tight_pool ? "tight" : "roomy",
                     overlap ? "on" : "off");
}

SpecRun serve(const ModelWeights& weights, const SpecWorld& world,
              const std::vector<RequestSpec>& requests, bool drafted,
              const std::map<RequestId, std::vector<int32_t>>& references) {
  const int32_t width = drafted ? world.verify_width : 1;
  const SchedulerConfig config = config_of(weights, world, width);
  Scheduler scheduler(config);
  for (RequestSpec r : requests) {
    r.sampling = SamplingParams{};  // greedy
    scheduler.submit(r, weights.config.vocab_size);
  }
  std::unique_ptr<Drafter> drafter;
  if (drafted) drafter = std::make_unique<ReferenceDrafter>(references, world.acceptance);
  const ExecutorConfig limits = executor_config_for(config);
  CpuBackend backend(weights, limits, nullptr, false, std::move(drafter));
  Executor executor(limits, weights.config.vocab_size, backend, ExecutorOptions{.capture_logits = true});
  SpecRun run;
  DigestObserver observer(run, weights.config.vocab_size, width);
  try {
    run_serving_loop(scheduler, executor, ServingLoopOptions{.observer = &observer});
  } catch (const Error& e) {
    run.problem = fmt::format("W {}: {}", width, e.what());
    return run;
  }
  for (const RequestSpec& r : requests) run.tokens[r.id] = scheduler.outcomes().at(r.id).tokens;
  const std::string accounting = scheduler.check_accounting();
  if (run.problem.empty() && !accounting.empty()) run.problem = "accounting: " + accounting;
  return run;
}

std::string same_with_and_without_drafter(const ModelWeights& weights, const SpecWorld& world,
                                          const std::vector<RequestSpec>& requests,
                                          SpecRun* drafted_out) {
  const SpecRun plain = serve(weights, world, requests, /*drafted=*/false);
  if (!plain.problem.empty()) return fmt::format("{}: W 1: {}", world.describe(), plain.problem);
  std::map<RequestId, std::vector<int32_t>> references;
  for (const RequestSpec& r : requests) {
    std::vector<int32_t> all = r.prompt;
    all.insert(all.end(), plain.tokens.at(r.id).begin(), plain.tokens.at(r.id).end());
    references[r.id] = std::move(all);
  }
  const SpecRun drafted = serve(weights, world, requests, /*drafted=*/true, references);
  if (drafted_out) *drafted_out = drafted;
  if (!drafted.problem.empty()) return fmt::format("{}: {}", world.describe(), drafted.problem);
  for (const RequestSpec& r : requests) {
    if (plain.tokens.at(r.id) == drafted.tokens.at(r.id)) continue;
    return fmt::format("{}: request {}: W 1 gives [{}], W {} with the drafter gives [{}]",
                       world.describe(), r.id, fmt::join(plain.tokens.at(r.id), ", "),
                       world.verify_width, fmt::join(drafted.tokens.at(r.id), ", "));
  }
  // Every emitted token's position has its logits in both runs; every position both computed
  // (rows past a request's last token included) has the same bits.
  for (const RequestSpec& r : requests) {
    const int32_t first = static_cast<int32_t>(r.prompt.size()) - 1;
    for (int32_t pos = first; pos < first + static_cast<int32_t>(plain.tokens.at(r.id).size()); ++pos) {
      if (!plain.digests.contains({r.id, pos}) || !drafted.digests.contains({r.id, pos})) {
        return fmt::format("{}: request {} position {}, which emitted a token, has no digest",
                           world.describe(), r.id, pos);
      }
    }
  }
  for (const auto& [key, digest] : drafted.digests) {
    const auto it = plain.digests.find(key);
    if (it != plain.digests.end() && it->second != digest) {
      return fmt::format("{}: request {} position {}: logits digests {:016x} (W 1) and {:016x} "
                         "(W {})", world.describe(), key.first, key.second, it->second, digest,
                         world.verify_width);
    }
  }
  return "";
}

std::vector<RequestSpec> SpecWorkload::requests(int32_t vocab_size,
                                               const std::vector<int32_t>& first_generated) const {
  std::vector<RequestSpec> out;
  for (size_t i = 0; i < prompt_lengths.size(); ++i) {
    RequestSpec r;
    r.id = static_cast<RequestId>(i + 1);
    // A follow-up's prompt stays within the ordinary prompts' bound (L − 24).
    const int64_t room = int64_t{kContextLength} - 24 - static_cast<int64_t>(prompt_lengths[0]) - 1;
    const int64_t follow =
        i == 0 || follow_up.empty()
            ? 0
            : std::min({int64_t{follow_up[i]}, static_cast<int64_t>(first_generated.size()), room});
    if (follow > 0) {
      r.prompt = out[0].prompt;
      r.prompt.insert(r.prompt.end(), first_generated.begin(),
                      first_generated.begin() + static_cast<ptrdiff_t>(follow));
    }
    const int32_t own = follow > 0 ? std::max<int32_t>(1, std::min<int32_t>(
                                                              prompt_lengths[i],
                                                              kContextLength - 24 -
                                                                  static_cast<int32_t>(r.prompt.size())))
                                   : prompt_lengths[i];
    for (int32_t t = 0; t < own; ++t) {
      const uint64_t owner = t < shared_prefix[i] ? 1 : r.id;  // the shared prefix is request 1's
      r.prompt.push_back(static_cast<int32_t>((owner * 131 + static_cast<uint64_t>(t) * 29 + 7) %
                                              static_cast<uint64_t>(vocab_size)));
    }
    r.max_new_tokens = new_tokens[i];
    out.push_back(std::move(r));
  }
  return out;
}

std::string SpecWorkload::describe() const {
  return fmt::format("{} prompts [{}] shared [{}] new [{}] follow-ups [{}]", world.describe(),
                     fmt::join(prompt_lengths, ", "), fmt::join(shared_prefix, ", "),
                     fmt::join(new_tokens, ", "), fmt::join(follow_up, ", "));
}

void showValue(const SpecWorkload& w, std::ostream& os) { os << w.describe(); }

rc::Gen<SpecWorkload> gen_spec_workload() {
  return rc::gen::resize(rc_support::kGenSize, rc::gen::exec([] {
    SpecWorkload w;
    w.world.max_batch_rows = *rc::gen::inRange(1, 5);
    w.world.page_size = 1 << *rc::gen::inRange(1, 4);  // 2, 4 or 8
    w.world.chunk = *rc::gen::inRange(1, 33);
    w.world.verify_width = *rc::gen::inRange(2, 7);
    w.world.acceptance = *rc::gen::element(0, 30, 60, 90, 100);
    w.world.prefix_cache = *rc::gen::inRange(0, 2) == 1;
    w.world.tight_pool = *rc::gen::inRange(0, 4) == 0;
    w.world.overlap = *rc::gen::inRange(0, 2) == 1;
    const int32_t requests = *rc::gen::inRange(1, 6);
    for (int32_t i = 0; i < requests; ++i) {
      const int32_t length = *rc::gen::inRange(1, kContextLength - 24);
      w.prompt_lengths.push_back(length);
      w.shared_prefix.push_back(*rc::gen::inRange(0, length + 1));
      w.new_tokens.push_back(*rc::gen::inRange(1, 17));
      w.follow_up.push_back(i > 0 && *rc::gen::inRange(0, 2) == 1 ? *rc::gen::inRange(1, 17) : 0);
    }
    return w;
  }));
}

std::string tokens_same_with_and_without_drafter(const SpecWorkload& w) {
  const ModelWeights& weights = tiny_hybrid_weights();
  const int32_t vocab = weights.config.vocab_size;
  std::vector<int32_t> first_generated;
  if (std::any_of(w.follow_up.begin(), w.follow_up.end(), [](int32_t f) { return f > 0; })) {
    const SpecRun first = serve(weights, w.world, {w.requests(vocab).front()}, /*drafted=*/false);
    if (!first.problem.empty()) return fmt::format("{}: request 1 alone: {}", w.describe(), first.problem);
    first_generated = first.tokens.at(1);
  }
  const std::string failure =
      same_with_and_without_drafter(weights, w.world, w.requests(vocab, first_generated));
  return failure.empty() ? "" : fmt::format("{}: {}", w.describe(), failure);
}

std::optional<std::string> counterexample(int cases) {
  return rc_support::run_property("hybrid/spec", cases, [] {
    return tokens_same_with_and_without_drafter(*gen_spec_workload());
  });
}

}  // namespace ls::hybrid_spec
