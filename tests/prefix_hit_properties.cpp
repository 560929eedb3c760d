#include "tests/prefix_hit_properties.h"

#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/logits_digest.h"
#include "core/serving_loop.h"
#include "core/step_observer.h"
#include "proptest/rc_support.h"
#include "tests/hybrid_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace ls::prefix_props {

namespace {

constexpr int32_t kContextLength = 96;

// Digests every logits row of every step by (request, position): a prefill row's last token, a
// decode row's input (vcl after the step − 1: W = 1, one token accepted). A position computed
// twice (a retraction's recompute, a step whose result was discarded) must give the same bits.
class DigestObserver final : public StepObserver {
 public:
  explicit DigestObserver(ServedRun& run) : run_(run) {}

  void on_step_input(int64_t, const ForwardOp&, const std::vector<CacheOp>&, const StepFaults&) override {}
  void on_step_output(int64_t step, const ForwardOp& op, const StepResult& result,
                      const StateSnapshot& state) override {
    for (int32_t i = 0; i < op.rows_count(); ++i) {
      const OpRow& row = op.rows[i];
      const int32_t position = row.kind == RowKind::kPrefill
                                   ? row.prefix_length + row.input_length - 1
                                   : state.valid_cache_length[static_cast<size_t>(i)] - 1;
      const std::span<const float> logits(result.logits.data() + static_cast<size_t>(i) * kVocab,
                                          kVocab);
      const uint64_t digest = logits_row_digest(logits);
      const auto [it, fresh] = run_.digests.emplace(std::pair{row.request_id, position}, digest);
      if (!fresh && it->second != digest && run_.problem.empty()) {
        run_.problem = fmt::format("step {}: request {} position {} computed twice with different "
                                   "logits", step, row.request_id, position);
      }
    }
  }
  void on_scheduler_events(int64_t, const std::vector<SchedulerEvent>& events) override {
    for (const SchedulerEvent& e : events) {
      if (e.kind == SchedulerEvent::Kind::kPrefixHit) run_.prefix_hit_tokens += e.tokens;
      if (e.kind == SchedulerEvent::Kind::kRetract) {
        ++(e.retract_path == RetractPath::kSwap ? run_.swaps : run_.recomputes);
      }
    }
  }

 private:
  ServedRun& run_;
};

SchedulerConfig config_of(const HybridWorld& w) {
  Limits limits;
  limits.max_batch_rows = w.max_batch_rows;
  limits.context_length = kContextLength;
  limits.page_size = w.page_size;
  limits.pages_count = w.pages_count;
  limits.prefill_chunk_tokens = w.prefill_chunk_tokens;
  limits.host_pages_count = w.host_pages_count;
  limits.mamba_slots_count = w.max_batch_rows + w.checkpoint_slots;
  SchedulerConfig c = scheduler_config_for_model(limits, hybrid_weights().config);
  c.prefix_cache = w.prefix_cache;
  c.overlap = w.overlap;
  return c;
}

}  // namespace

const ModelWeights& hybrid_weights() { return testing::hybrid_checkpoint_weights(); }

std::string HybridWorld::describe() const {
  return fmt::format("B {} P {} pages {} chunk {} checkpoints {} host pages {} prefix cache {} "
                     "overlap {}", max_batch_rows, page_size, pages_count, prefill_chunk_tokens,
                     checkpoint_slots, host_pages_count, prefix_cache ? "on" : "off",
                     overlap ? "on" : "off");
}

ServedRun serve(const HybridWorld& world, const std::vector<RequestSpec>& requests) {
  const SchedulerConfig config = config_of(world);
  Scheduler scheduler(config);
  for (const RequestSpec& r : requests) scheduler.submit(r, kVocab);
  CpuBackend backend(hybrid_weights(), executor_config_for(config));
  Executor executor(executor_config_for(config), kVocab, backend,
                    ExecutorOptions{.capture_logits = true});
  ServedRun run;
  DigestObserver observer(run);
  run_serving_loop(scheduler, executor, ServingLoopOptions{.observer = &observer});
  for (const RequestSpec& r : requests) run.tokens[r.id] = scheduler.outcomes().at(r.id).tokens;
  const std::string accounting = scheduler.check_accounting();
  if (run.problem.empty() && !accounting.empty()) run.problem = "accounting: " + accounting;
  return run;
}

std::string compare_runs(const ServedRun& a, const ServedRun& b,
                         const std::vector<RequestSpec>& requests) {
  if (!a.problem.empty()) return a.problem;
  if (!b.problem.empty()) return b.problem;
  for (const RequestSpec& r : requests) {
    if (a.tokens.at(r.id) != b.tokens.at(r.id)) {
      return fmt::format("request {}: tokens [{}] and [{}]", r.id, fmt::join(a.tokens.at(r.id), ", "),
                         fmt::join(b.tokens.at(r.id), ", "));
    }
    const int32_t first = static_cast<int32_t>(r.prompt.size()) - 1;
    for (int32_t pos = first; pos < first + static_cast<int32_t>(a.tokens.at(r.id).size()); ++pos) {
      if (!a.digests.contains({r.id, pos}) || !b.digests.contains({r.id, pos})) {
        return fmt::format("request {}: position {}, which emitted a token, has no digest", r.id, pos);
      }
    }
  }
  for (const auto& [key, digest] : a.digests) {
    const auto it = b.digests.find(key);
    if (it != b.digests.end() && it->second != digest) {
      return fmt::format("request {} position {}: logits digests {:016x} and {:016x}", key.first,
                         key.second, digest, it->second);
    }
  }
  return "";
}

std::vector<RequestSpec> PrefixWorkload::requests() const {
  std::vector<RequestSpec> out;
  for (size_t i = 0; i < suffixes.size(); ++i) {
    RequestSpec r{.id = static_cast<RequestId>(i + 1), .prompt = shared, .max_new_tokens = new_tokens[i]};
    r.prompt.insert(r.prompt.end(), suffixes[i].begin(), suffixes[i].end());
    out.push_back(std::move(r));
  }
  return out;
}

std::string PrefixWorkload::describe() const {
  std::vector<size_t> suffix_lengths;
  for (const auto& s : suffixes) suffix_lengths.push_back(s.size());
  return fmt::format("{}; shared prefix {} tokens, suffixes [{}], new [{}]", world.describe(),
                     shared.size(), fmt::join(suffix_lengths, ", "), fmt::join(new_tokens, ", "));
}

void showValue(const PrefixWorkload& w, std::ostream& os) { os << w.describe(); }

rc::Gen<PrefixWorkload> gen_prefix_workload() {
  return rc::gen::resize(rc_support::kGenSize, rc::gen::exec([] {
    PrefixWorkload w;
    HybridWorld& world = w.world;
    world.max_batch_rows = *rc::gen::inRange(1, 4);
    world.page_size = 1 << *rc::gen::inRange(1, 4);  // 2, 4, 8
    world.prefill_chunk_tokens = *rc::gen::inRange(world.page_size, 4 * world.page_size + 8);
    world.checkpoint_slots = *rc::gen::inRange(1, 9);
    world.overlap = *rc::gen::inRange(0, 2) == 1;
    const int32_t requests = *rc::gen::inRange(2, 6);
    w.shared = *rc::gen::container<std::vector<int32_t>>(
        static_cast<size_t>(*rc::gen::inRange(world.page_size, 40)), rc::gen::inRange(3, kVocab));
    int32_t longest = 0;
    for (int32_t i = 0; i < requests; ++i) {
      // A suffix may be empty (the whole prompt shared) or a repeat of another's start.
      w.suffixes.push_back(*rc::gen::container<std::vector<int32_t>>(
          static_cast<size_t>(*rc::gen::inRange(0, 20)), rc::gen::inRange(3, kVocab)));
      w.new_tokens.push_back(*rc::gen::inRange(1, 10));
      longest = std::max(longest, static_cast<int32_t>(w.shared.size() + w.suffixes.back().size()) +
                                      w.new_tokens.back());
    }
    // A roomy pool, or one tight enough to retract (a request alone must still fit).
    const int32_t alone = (longest + 2) / world.page_size + 2;
    world.pages_count = *rc::gen::inRange(alone + 1, world.max_batch_rows * alone + 3);
    world.host_pages_count = *rc::gen::inRange(0, 2) == 1 ? 2 * alone : 0;
    return w;
  }));
}

namespace {

// The property on one workload: "" or what broke; `hit` says whether the cached run hit at all.
std::string check_workload(const PrefixWorkload& w, bool& hit) {
  const std::vector<RequestSpec> requests = w.requests();
  HybridWorld plain = w.world;
  plain.prefix_cache = false;
  const ServedRun cached = serve(w.world, requests);
  hit = cached.prefix_hit_tokens > 0;
  const std::string difference = compare_runs(cached, serve(plain, requests), requests);
  return difference.empty() ? "" : w.describe() + ": " + difference;
}

}  // namespace

std::string tokens_same_with_and_without_hits(const PrefixWorkload& w) {
  bool hit = false;
  return check_workload(w, hit);
}

std::optional<std::string> counterexample(int cases, int* hits) {
  int hit_cases = 0;
  std::optional<std::string> failure =
      rc_support::run_property("hybrid/tokens_same_with_and_without_prefix_hits", cases, [&] {
        bool hit = false;
        const std::string broke = check_workload(*gen_prefix_workload(), hit);
        hit_cases += hit ? 1 : 0;
        return broke;
      });
  if (hits != nullptr) *hits = hit_cases;
  return failure;
}

}  // namespace ls::prefix_props
