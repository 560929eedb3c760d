// The replay driver (DESIGN.md "Replay"): rebuilds the executor a trace's header describes,
// re-executes every recorded step and compares what it produces with what was recorded.
#pragma once

#include "core/backend.h"
#include "replay/compare.h"
#include "trace/reader.h"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ls::replay {

enum class ReplayMode : uint8_t {
  kExact,          // compare every output and digest bit for bit; stop at the first divergence
  kTeacherForced,  // feed the recorded tokens back; report agreement per step and overall
};

// An option that selects nothing of the trace (--isolate of a request no step holds): the usage
// is wrong, not the trace.
class EmptySelection : public Error {
 public:
  using Error::Error;
};

struct ReplayOptions {
  ReplayMode mode = ReplayMode::kExact;
  std::optional<int64_t> until_step;      // stop after this step
  std::optional<RequestId> isolate;       // replay this request alone (needs batch invariance)
  std::optional<std::filesystem::path> weights_directory;  // where a directory model lives now
  // Weights already in memory (tools replaying many traces of one model); still checked against
  // the recorded digest. Borrowed: must outlive the replay.
  const ModelWeights* weights = nullptr;
  // The tensor-parallel degree to replay at; nullopt: the recorded one (TraceHeader::tp_degree).
  // Exact mode refuses a degree other than the recorded one.
  std::optional<int32_t> tp_degree;
  // The backend to replay on, built from the weights, the recorded executor limits, the recorded
  // drafter's name (TraceHeader::drafter) and the replay's TP degree; null: the CPU reference
  // with that drafter at that degree. It is built while another thread checks the weights'
  // digest: no step runs before the check passes, and a failed check is the error named.
  // (replay/ links no backend but the CPU one; the CLI passes CUDA's.)
  std::function<std::unique_ptr<Backend>(const ModelWeights&, const ExecutorConfig&,
                                         const std::string& drafter, int32_t tp_degree)>
      make_backend;
  std::function<void(int64_t steps_done, uint64_t bytes_done, uint64_t bytes_total)> on_progress;
  // Capture this step's per-layer activations (core/activations.h) into the report, the backend
  // capturing nothing before or after it (replay/localise.h).
  std::optional<int64_t> capture_step;
};

struct StepAgreement {
  int64_t step = 0;
  int32_t tokens_equal = 0;
  int32_t tokens_count = 0;
  float logit_delta_max = 0;  // max |Δlogit| over every recorded top-k pair
  int32_t top1_equal = 0;     // logits rows whose replayed top-1 id is the recorded one
  int32_t top1_count = 0;
};

struct ReplayReport {
  trace::TraceHeader header;
  std::string backend;                      // what replayed it
  int32_t tp_degree = 1;                    // the tensor-parallel degree it replayed at
  int64_t steps_replayed = 0;
  int64_t steps_compared = 0;               // steps whose output record was compared
  std::optional<Divergence> divergence;     // exact mode: the first one
  std::optional<trace::TraceTruncation> truncation;
  std::vector<StepAgreement> agreement;     // teacher-forced mode: per step
  int64_t tokens_equal = 0;
  int64_t tokens_count = 0;
  int64_t top1_equal = 0;
  int64_t top1_count = 0;
  float logit_delta_max = 0;
  bool isolate_invariance_guaranteed = true;  // false when the replay backend is not batch-invariant
  // ReplayOptions::capture_step: whether it ran, its op as replayed, the tensors it computed and
  // what the trace recorded of them (empty when the trace has no activation digests).
  bool captured_step_ran = false;
  ForwardOp captured_op;
  StepActivations captured;
  std::vector<uint64_t> recorded_activation_digests;

  // Teacher-forced mode: the first step with a token unlike the recorded one.
  std::optional<int64_t> first_disagreeing_step() const;

  bool identical() const { return !divergence && tokens_equal == tokens_count; }
};

// What a verdict that is not identical says when `header`'s trace was written by another build
// of lockstep than `replaying_build`: bit-identical replay is promised for the same build on the
// same machine (DESIGN.md), so a kernel or sampler change between the two builds diverges as a
// bug would. None for this build's traces and for a foreign executor's.
std::optional<std::string> other_build_note(const trace::TraceHeader& header,
                                            const std::string& replaying_build);

// The degree a replay runs at: options.tp_degree, else the recorded one.
int32_t replay_tp_degree(const ReplayOptions& options, const trace::TraceHeader& header);

// Throws ls::Error when the trace is unusable (bad header, corrupt record, weights that do not
// match the recorded digest); a truncated tail is not an error (see the report's truncation).
ReplayReport replay_trace(const std::filesystem::path& path, const ReplayOptions& options);
// The same over an opened reader (e.g. TraceReader::from_bytes).
ReplayReport replay_trace(trace::TraceReader reader, const ReplayOptions& options);

// The weights a trace's header names, regenerated from the seed or loaded from the directory,
// checked against the recorded digest.
ModelWeights weights_for(const trace::TraceHeader& header,
                         const std::optional<std::filesystem::path>& directory_override);
// Throws ls::Error naming both digests when `weights` are not the ones the header recorded.
void require_recorded_weights(const trace::TraceHeader& header, const ModelWeights& weights,
                              const std::string& origin);

}  // namespace ls::replay
