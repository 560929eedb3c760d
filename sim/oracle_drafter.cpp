#include "sim/oracle_drafter.h"

#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/sampling.h"
#include "core/serving_loop.h"
#include "sim/workload.h"
#include "sim/world.h"

#include <fmt/format.h>

namespace ls::sim {

OracleMixDrafter::OracleMixDrafter(References references, double acceptance, uint64_t seed)
    : references_(std::move(references)), acceptance_(acceptance), seed_(seed) {
  LS_REQUIRE(acceptance >= 0.0 && acceptance <= 1.0, "oracle-mix acceptance {} is outside [0, 1]",
             acceptance);
}

std::string OracleMixDrafter::name() const {
  return fmt::format("oracle-mix(p={:.2f})", acceptance_);
}

void OracleMixDrafter::draft(const DraftContext& context, std::span<int32_t> drafts) const {
  const auto it = references_.find(context.request_id);
  const uint64_t key = seed_ ^ (context.request_id * 0x9e3779b97f4a7c15ull);
  const uint32_t vocab = static_cast<uint32_t>(context.vocab_size);
  for (size_t i = 0; i < drafts.size(); ++i) {
    const int64_t position = int64_t{context.position} + 1 + static_cast<int64_t>(i);
    const auto words = philox4x32_10(key, static_cast<uint64_t>(position), static_cast<uint32_t>(i));
    const bool known = it != references_.end() && position < static_cast<int64_t>(it->second.size());
    if (!known) {
      drafts[i] = static_cast<int32_t>(words[1] % vocab);
      continue;
    }
    const int32_t truth = it->second[static_cast<size_t>(position)];
    const bool propose_truth = static_cast<double>(uniform_from_bits(words[0])) < acceptance_;
    // Junk is never the true token, so p alone sets the acceptance of greedy rows.
    drafts[i] = propose_truth ? truth
                              : static_cast<int32_t>((static_cast<uint32_t>(truth) + 1 +
                                                      words[1] % (vocab - 1)) % vocab);
  }
}

References reference_continuations(const SimParams& params, const ModelWeights& weights,
                                   bool stub_model) {
  SimParams plain = params;
  plain.verify_width = 1;
  plain.drafter = SimDrafter::kNone;
  plain.overlap = false;
  plain.host_pages_count = 0;
  // Room for every row to hold a full context: no retraction needed (it would not change tokens).
  plain.pages_count = params.max_batch_rows * ((params.context_length + 2) / params.page_size + 2) + 1;
  const SchedulerConfig sc = scheduler_config_for(plain);
  const ExecutorConfig ec = ls::executor_config_for(sc);
  // At the world's TP degree: the references are the tokens the world's greedy rows compute.
  CpuBackend backend(weights, ec, nullptr, stub_model, nullptr, params.tp_degree);
  Executor executor(ec, weights.config.vocab_size, backend);
  Scheduler scheduler(sc);
  // Only greedy requests have one true continuation; a sampled request's drafts are all junk.
  std::vector<SimRequest> greedy;
  for (const SimRequest& q : generate_workload(params, weights.config.vocab_size)) {
    if (q.spec.sampling.is_greedy()) greedy.push_back(q);
  }
  References references;
  if (greedy.empty()) return references;
  for (const SimRequest& q : greedy) scheduler.submit(q.spec, weights.config.vocab_size);
  run_serving_loop(scheduler, executor);
  for (const SimRequest& q : greedy) {
    std::vector<int32_t> tokens = q.spec.prompt;
    const std::vector<int32_t>& generated = scheduler.outcomes().at(q.spec.id).tokens;
    tokens.insert(tokens.end(), generated.begin(), generated.end());
    references.emplace(q.spec.id, std::move(tokens));
  }
  return references;
}

std::unique_ptr<Drafter> make_sim_drafter(const SimParams& params, const ModelWeights& weights,
                                          bool stub_model) {
  if (params.verify_width == 1) return nullptr;
  switch (params.drafter) {
    case SimDrafter::kNone: return nullptr;
    case SimDrafter::kNgram: return std::make_unique<NgramDrafter>();
    case SimDrafter::kOracleMix:
      return std::make_unique<OracleMixDrafter>(reference_continuations(params, weights, stub_model),
                                                params.oracle_acceptance, params.seed);
  }
  return nullptr;
}

}  // namespace ls::sim
