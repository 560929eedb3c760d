// Generated workloads for the executor properties. A Script is plain data — requests and one small
// choice per step (admit, chunk budget, mixed or not, retract, recover, pool row, poison, invalid
// op) — and run_script() is a tiny deterministic client that turns it into forward ops obeying the
// executor's contract, runs them, and checks the executor's invariants after every step. Choices
// are read modulo the live state, so any shrunk Script is still a valid run.
#pragma once

#include "core/config.h"
#include "core/executor.h"
#include "core/forward_op.h"
#include "core/model/weights.h"
#include "proptest/broken_backend.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <ostream>
#include <optional>
#include <string>
#include <vector>

namespace ls::proptest {

// The model every property runs: `tiny` with random weights from this seed (a replayable header).
inline constexpr uint64_t kWeightsSeed = 7;
const ModelWeights& tiny_weights();
int32_t tiny_vocab();

struct RequestScript {
  RequestId id = 0;
  std::vector<int32_t> prompt;  // [1, 40] ids in [0, V)
  SamplingParams sampling;
  int32_t max_new_tokens = 1;

  bool operator==(const RequestScript&) const = default;
};

struct StepChoice {
  int32_t admit = 2;          // waiting requests admitted this step
  int32_t chunk_tokens = 64;  // prefill token budget of the step
  bool mixed = true;          // decode rows join a step that carries prefill rows
  int32_t retract = -1;       // -1, or which decoding request (mod count) is retracted first
  bool recompute = false;     // retraction path: re-prefill instead of swap
  int32_t recover = 1;        // retracted requests recovered this step
  int32_t pool_row_pick = 0;  // which free pool row (mod count) a request takes
  int32_t poison = -1;        // -1, or op row (mod rows) whose logits become NaN
  int32_t invalid = -1;       // -1, or a contract mutation tried (and rejected) before the step

  bool operator==(const StepChoice&) const = default;
};

struct Script {
  ExecutorConfig config;
  std::vector<RequestScript> requests;
  std::vector<StepChoice> steps;  // after these, default choices until every request is done
  bool prefix_cache = true;       // later requests reuse full prompt pages of earlier ones

  bool operator==(const Script&) const = default;
};

// What one request produced: each generated token and the digest of the logits row it came from.
struct RequestOutput {
  std::vector<int32_t> tokens;
  std::vector<uint64_t> logits_digests;
  bool aborted = false;  // poisoned: the NaN guard flagged it

  bool operator==(const RequestOutput&) const = default;
};

struct RunOptions {
  BackendBug bug = BackendBug::kNone;
  bool check_invariants = true;
  bool faults = true;  // poison and invalid-op choices take effect
  std::optional<std::filesystem::path> trace_path;  // record every executed step here
  int64_t steps_max = 600;
  // Test double for the contract property's companion: run the valid op instead of the broken one.
  bool lenient_front = false;
};

struct RunResult {
  std::map<RequestId, RequestOutput> outputs;
  std::optional<std::string> failure;  // the first broken invariant: step, row, request, field
  int64_t failure_step = -1;
  int64_t steps_count = 0;
  int64_t rejected_count = 0;  // contract-breaking ops rejected (as they must be)
  int64_t retractions_count = 0;
  int64_t prefix_hits_count = 0;
  int64_t poisoned_count = 0;
  int64_t mixed_steps_count = 0;
  int64_t context_clamped_count = 0;  // decode rows that accepted 0 at the context limit
  int64_t pool_row_moves_count = 0;   // recoveries onto a different pool row
};

// What the generated runs exercised, summed over every run_script call in the process — so a test
// can assert that its cases were not degenerate (STYLE.md §15).
struct Coverage {
  int64_t runs = 0, steps = 0, rejected = 0, retractions = 0, prefix_hits = 0, poisoned = 0,
          mixed_steps = 0, context_clamped = 0, pool_row_moves = 0, tokens = 0;
};
Coverage& coverage();

RunResult run_script(const Script& script, const RunOptions& options = {});

// A contract mutation of a valid op: one field broken, `what` says which, and `refused_at` where
// the refusal must point (std::nullopt where several fields may answer first: an input_length
// one past its ids may break the chunk budget, the context or the prompt length). Returns false
// when `kind` does not apply.
inline constexpr int32_t kMutationKinds = 16;
bool mutate_op(ForwardOp& op, int32_t kind, const ExecutorConfig& config, int32_t vocab_size,
               std::string& what, std::optional<OpFieldAt>& refused_at);

// Every request's outputs in `a` that `b` also has must be equal; the first difference, or empty.
std::string compare_outputs(const std::map<RequestId, RequestOutput>& a,
                            const std::map<RequestId, RequestOutput>& b, const std::string& a_name,
                            const std::string& b_name);

// The executor limits generated scripts use: B rows, W, L = 48, P = 4, host pages for swaps.
ExecutorConfig script_config(int32_t max_batch_rows, int32_t verify_width);

std::string describe(const Script& script);
// How RapidCheck prints a counterexample (found by ADL).
void showValue(const Script& script, std::ostream& os);

}  // namespace ls::proptest
