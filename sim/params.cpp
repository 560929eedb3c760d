#include "sim/params.h"

#include "core/check.h"
#include "core/config.h"
#include "sim/random.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace ls::sim {

namespace {
constexpr uint32_t kParamsStream = 1;
constexpr uint32_t kSpecStream = 4;  // its own stream: seeds without --spec derive what they did
constexpr double kOracleAcceptances[] = {0.0, 0.5, 0.8, 1.0};

// W, the drafter and its acceptance; extra pages per row for the reservation of C + (D+1)·W.
// The acceptance is drawn for every seed (after W and the drafter, so an n-gram seed's draws are
// unchanged) so that an overriding drafter keeps the seed's W and acceptance.
int32_t derive_speculative(uint64_t seed, std::optional<SimDrafter> drafter, SimParams& p) {
  SimRandom r(seed, kSpecStream);
  p.verify_width = static_cast<int32_t>(r.range(2, 8));
  p.drafter = r.chance(0.5) ? SimDrafter::kNgram : SimDrafter::kOracleMix;
  const double acceptance = kOracleAcceptances[r.range(0, 3)];
  if (drafter) p.drafter = *drafter;
  if (p.drafter == SimDrafter::kOracleMix) p.oracle_acceptance = acceptance;
  return 2 * p.verify_width;
}
constexpr FaultSite kAllSites[kFaultSitesCount] = {
    FaultSite::kNanLogits,       FaultSite::kOovSample,    FaultSite::kPagePressure,
    FaultSite::kAbortMidPrefill, FaultSite::kContextLimit, FaultSite::kLateResult};
}  // namespace

std::string_view to_string(FaultSite site) {
  switch (site) {
    case FaultSite::kNanLogits: return "nan-logits";
    case FaultSite::kOovSample: return "oov-sample";
    case FaultSite::kPagePressure: return "page-pressure";
    case FaultSite::kAbortMidPrefill: return "abort-mid-prefill";
    case FaultSite::kContextLimit: return "context-limit";
    case FaultSite::kLateResult: return "late-result";
  }
  return "?";
}

std::optional<FaultSite> fault_site_named(std::string_view name) {
  for (FaultSite site : kAllSites) {
    if (to_string(site) == name) return site;
  }
  return std::nullopt;
}

std::vector<std::string> sim_model_names() { return {"tiny", "tiny-hybrid"}; }

namespace {

// A hybrid world (issue 19): a working slot per batch row, checkpoint slots for the prefix cache
// when the seed draws it; host pages as the seed draws them (a swap carries the working state
// with the pages, CacheOp::state_slot), except with speculative decoding (verify-state slots,
// core/limits.h), which the scheduler does not combine with swap on a hybrid: host pages 0 then
// (describe() says so). TP is refused by name.
void apply_hybrid_limits(const SimOverrides& overrides, SimParams& p) {
  const std::vector<std::string> names = sim_model_names();
  LS_REQUIRE(std::find(names.begin(), names.end(), overrides.model) != names.end(),
             "--model '{}': the simulator runs {}", overrides.model, fmt::join(names, ", "));
  p.model = overrides.model;
  if (!model_config_named(p.model).has_recurrent_state()) return;
  LS_REQUIRE(overrides.tp_degree == 1, "--tp {}: model '{}' has Mamba2 layers; tensor "
             "parallelism is not implemented for them", overrides.tp_degree, p.model);
  p.recurrent_state = true;
  if (p.verify_width > 1) p.host_pages_count = 0;  // no swap with verify-state slots (yet)
  // With the prefix cache, checkpoint slots past the B working ones (core/state_checkpoints.h):
  // fewer than the cached page ends a run makes, so the pool runs dry and takes back the least
  // recently used.
  p.mamba_slots_count = p.prefix_cache ? 2 * p.max_batch_rows + 2 : p.max_batch_rows;
}

}  // namespace

SimParams derive_params(uint64_t seed, const SimOverrides& overrides) {
  SimRandom r(seed, kParamsStream);
  SimParams p;
  p.seed = seed;
  const int32_t spec_tokens =
      overrides.speculative ? derive_speculative(seed, overrides.drafter, p) : 0;
  p.requests_count = overrides.requests_count.value_or(static_cast<int32_t>(r.range(8, 40)));
  p.max_batch_rows = static_cast<int32_t>(r.range(2, 12));
  p.page_size = static_cast<int32_t>(std::int64_t{1} << r.range(2, 4));  // 4, 8 or 16
  p.context_length = static_cast<int32_t>(r.range(48, 160));
  p.prefill_chunk_tokens = static_cast<int32_t>(r.range(16, 96));
  p.overlap = r.chance(0.75);
  p.mixed_batches = r.chance(0.6);
  p.prefix_cache = r.chance(0.8);
  p.arrivals_per_step = 0.2 + 1.8 * r.uniform();
  p.prompt_tokens_min = static_cast<int32_t>(r.range(1, 8));
  p.prompt_tokens_max = static_cast<int32_t>(r.range(p.prompt_tokens_min, p.context_length / 2));
  p.shared_prefixes_count = static_cast<int32_t>(r.range(1, 3));
  p.shared_prefix_tokens = static_cast<int32_t>(r.range(p.page_size, 3 * p.page_size));
  p.shared_prefix_fraction = r.uniform() * 0.6;
  p.max_new_tokens_min = static_cast<int32_t>(r.range(1, 8));
  p.max_new_tokens_max = static_cast<int32_t>(r.range(p.max_new_tokens_min, 48));
  p.greedy_fraction = r.uniform();
  p.client_abort_fraction = r.uniform() * 0.1;
  // Enough pages for every row to hold a full context, unless page pressure is planted below.
  const int32_t pages_per_row =
      (p.context_length + 2) / p.page_size + 2 + (spec_tokens + p.page_size - 1) / p.page_size;
  p.pages_count = p.max_batch_rows * pages_per_row + 1;
  p.host_pages_count = r.chance(0.5) ? static_cast<int32_t>(r.range(0, 2)) * pages_per_row * 2 : 0;
  if (overrides.faults) {
    p.faults = *overrides.faults;
  } else if (overrides.faults_enabled) {
    for (FaultSite site : kAllSites) {
      if (r.chance(0.5)) p.faults.push_back(site);
    }
  }
  p.fault_rate = p.faults.empty() ? 0.0 : 0.02 + 0.08 * r.uniform();
  p.tp_degree = overrides.tp_degree;  // drawn last and from nothing: every other draw is unchanged
  if (std::find(p.faults.begin(), p.faults.end(), FaultSite::kPagePressure) != p.faults.end()) {
    // Room for about two full contexts: decode growth runs out of pages and must retract.
    p.pages_count = std::max(2 * pages_per_row, 4) + 1;
  }
  apply_hybrid_limits(overrides, p);  // last, from nothing drawn: every draw is the same
  return p;
}

std::optional<SimDrafter> sim_drafter_named(std::string_view name) {
  if (name == "ngram") return SimDrafter::kNgram;
  if (name == "oracle-mix") return SimDrafter::kOracleMix;
  return std::nullopt;
}

std::string SimParams::drafter_name() const {
  switch (drafter) {
    case SimDrafter::kNone: return "none";
    case SimDrafter::kNgram: return "ngram";
    case SimDrafter::kOracleMix: return fmt::format("oracle-mix(p={:.2f})", oracle_acceptance);
  }
  return "?";
}

std::string SimParams::describe() const {
  std::vector<std::string> fault_names;
  for (FaultSite site : faults) fault_names.emplace_back(to_string(site));
  const std::string speculative =
      verify_width > 1 ? fmt::format("\n  speculative: W {}, drafter {}", verify_width, drafter_name())
                       : std::string();
  const std::string tensor_parallel =
      tp_degree > 1 ? fmt::format("\n  tensor parallel: TP {} (simulated ranks)", tp_degree)
                    : std::string();
  const std::string hybrid =
      recurrent_state
          ? fmt::format("\n  model {}: Mamba2 state slots {} ({} working, {} checkpoints); {}",
                        model, mamba_slots_count, max_batch_rows,
                        mamba_slots_count - max_batch_rows,
                        verify_width > 1 ? "host pages 0 (speculative decoding on a hybrid "
                                           "retracts by recompute, not by swap)"
                                         : "a swap carries the working state with the pages")
          : std::string();
  return fmt::format(
      "seed {}\n"
      "  requests {}, arrivals/step {:.3f}, prompt tokens [{}, {}], max_new_tokens [{}, {}]\n"
      "  shared prefixes {} x {} tokens for {:.0f}% of requests, greedy {:.0f}%, client aborts "
      "{:.1f}%\n"
      "  limits: B {}, L {}, P {}, pages {}, host pages {}, token budget {}\n"
      "  overlap {}, mixed batches {}, prefix cache {}\n"
      "  faults: {} (rate {:.3f}/step){}{}{}",
      seed, requests_count, arrivals_per_step, prompt_tokens_min, prompt_tokens_max,
      max_new_tokens_min, max_new_tokens_max, shared_prefixes_count, shared_prefix_tokens,
      100 * shared_prefix_fraction, 100 * greedy_fraction, 100 * client_abort_fraction,
      max_batch_rows, context_length, page_size, pages_count, host_pages_count, prefill_chunk_tokens,
      overlap ? "on" : "off", mixed_batches ? "on" : "off", prefix_cache ? "on" : "off",
      fault_names.empty() ? "none" : fmt::format("{}", fmt::join(fault_names, ", ")), fault_rate,
      speculative, tensor_parallel, hybrid);
}

}  // namespace ls::sim
