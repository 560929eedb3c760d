// Localisation of a replay divergence (issue 15): re-runs the first divergent step of a replay
// with per-layer activations (core/activations.h) on the replay side and compares them with the
// other side — the digests the recording wrote (`--record-activations`), or a second replay of
// the same trace up to that step on another backend — to name the first layer, tensor, token row
// and element where the two part.
#pragma once

#include "core/activations.h"
#include "replay/replay.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace ls::replay {

// CUDA (bf16) against the CPU reference (fp32): an element differs when
// |a − b| > kCrossBackendTolerance · max|b| over its row (b the reference side's row).
inline constexpr double kCrossBackendTolerance = 0.1;

struct Localisation {
  int64_t step = 0;
  std::string replay_backend;
  std::string against;                // "recorded activation digests" or "a replay on BACKEND"
  std::optional<double> tolerance;    // nullopt: bits compared
  bool step_ran = true;               // false: the step was refused, nothing ran to compare
  bool differs = false;
  std::string tensor;                 // "layer 1 mlp_out"
  int32_t layer = -1;
  std::string kind;                   // "mlp_out"
  int32_t token_row = 0;              // the row of the tensor: a token, or a logits row
  int32_t op_row = -1;                // the op row that token belongs to
  RequestId request_id = 0;
  // Against recorded digests: both digests of the row, and the replay side's first values.
  uint64_t recorded_digest = 0;
  uint64_t replayed_digest = 0;
  std::vector<float> replayed_values;  // the row's first kValuesShown values
  int32_t row_width = 0;
  // Against a second replay: the first element beyond the tolerance (or whose bits differ).
  std::optional<ActivationDifference> difference;

  static constexpr int32_t kValuesShown = 8;
};

// The two sides of a localisation: how to replay (the replay side's options; mode, backend and
// weights as the replay had them), and the other side's options when it is a second replay
// (nullopt: the recorded digests, which the trace must carry).
struct LocaliseRequest {
  std::filesystem::path trace;
  int64_t step = 0;
  ReplayOptions replay_side;
  std::string replay_backend;
  std::optional<ReplayOptions> other_side;
  std::string other_backend;
  std::optional<double> tolerance;  // with other_side: nullopt compares bits
};

// ls::Error when the step's activations cannot be captured (a hybrid model, TP > 1) or the
// recorded digests do not fit the step.
Localisation localise_step(const LocaliseRequest& request);

// What --localise prints, and its --json form (the replay result's "localisation").
std::string describe_localisation(const Localisation& l);
nlohmann::ordered_json localisation_json(const Localisation& l);

}  // namespace ls::replay
