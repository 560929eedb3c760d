// Every parameter of a simulated serving world, derived from one seed and printed first, so the
// seed alone reproduces the run (STYLE.md §17).
#pragma once

#include "core/scheduler.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ls::sim {

// Named fault sites; each is switched on per seed when faults are enabled.
enum class FaultSite : uint8_t {
  kNanLogits,        // a row's logits become NaN → the row is flagged and aborted
  kOovSample,        // a row emits an id outside [0, V) → flagged, clamped, aborted
  kPagePressure,     // the device pool is shrunk so that decode growth forces retraction
  kAbortMidPrefill,  // a client aborts a request while its prompt is still being prefilled
  kContextLimit,     // a request whose prompt + max_new_tokens runs into L
  kLateResult,       // a client aborts a request while its step is in flight: the result is late
};
constexpr int kFaultSitesCount = 6;

// Speculative mode's drafter: the production n-gram drafter, or the simulator's oracle-mix drafter
// (the target's true continuation with probability `oracle_acceptance`, junk otherwise).
enum class SimDrafter : uint8_t { kNone, kNgram, kOracleMix };
std::string_view to_string(FaultSite site);
std::optional<FaultSite> fault_site_named(std::string_view name);
// "ngram" or "oracle-mix" (the speculative drafters a seed can draw).
std::optional<SimDrafter> sim_drafter_named(std::string_view name);

// The limits and scheduler switches are the SchedulerConfig the world runs (W is 1 unless
// speculative mode draws 2..8); the rest describes the workload, the faults and the drafter.
struct SimParams : SchedulerConfig {
  uint64_t seed = 0;
  int32_t requests_count = 0;
  // Workload.
  double arrivals_per_step = 0;   // mean of the Poisson-like arrival process, per step
  int32_t prompt_tokens_min = 0;
  int32_t prompt_tokens_max = 0;
  int32_t shared_prefix_tokens = 0;    // length of the prefixes some prompts share
  int32_t shared_prefixes_count = 0;   // distinct shared prefixes
  double shared_prefix_fraction = 0;   // of requests that start with one
  int32_t max_new_tokens_min = 0;
  int32_t max_new_tokens_max = 0;
  double greedy_fraction = 0;          // the rest sample with temperature / top-k / top-p / min-p
  double client_abort_fraction = 0;    // requests a client aborts at a random later step
  // Faults.
  std::vector<FaultSite> faults;       // sites switched on for this seed
  double fault_rate = 0;               // chance per step that an enabled step-level site fires
  // Speculative decoding (off: W = 1 and no drafter).
  SimDrafter drafter = SimDrafter::kNone;
  double oracle_acceptance = 0;        // oracle-mix: chance that a draft is the true token
  // Tensor parallelism: the ranks the CPU reference simulates (`lockstep sim --tp`; not drawn).
  int32_t tp_degree = 1;
  // The named model shape the world runs (`lockstep sim --model`; not drawn): `tiny`, or the
  // hybrid `tiny-hybrid`, whose world has recurrent state (SchedulerConfig::recurrent_state, a
  // working slot per batch row) and, not in it yet, no prefix cache and no retraction by swap:
  // the seed's draws for those are overridden and describe() says so.
  std::string model = "tiny";

  // What a trace header records as the drafter: "none", "ngram" or "oracle-mix(p=0.50)".
  std::string drafter_name() const;

  // One line per parameter, for the run's header.
  std::string describe() const;
};

struct SimOverrides {
  std::optional<int32_t> requests_count;
  bool faults_enabled = true;
  std::optional<std::vector<FaultSite>> faults;  // replaces the seed's choice when set
  bool speculative = false;  // draw W in 2..8 and a drafter (`lockstep sim --spec`)
  // Speculative mode only: this drafter instead of the seed's (`lockstep sim --spec --drafter`);
  // W and the oracle-mix acceptance are still the seed's.
  std::optional<SimDrafter> drafter;
  int32_t tp_degree = 1;  // `lockstep sim --tp`
  std::string model = "tiny";  // `lockstep sim --model`: tiny or tiny-hybrid
};

// The named shapes a simulated world runs: tiny and tiny-hybrid.
std::vector<std::string> sim_model_names();

SimParams derive_params(uint64_t seed, const SimOverrides& overrides);

}  // namespace ls::sim
