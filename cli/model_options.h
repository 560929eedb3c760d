// Command-line options shared by every subcommand that builds an executor.
#pragma once

#include "core/config.h"
#include "core/model/weights.h"

#include <CLI/CLI.hpp>

#include <string>

namespace ls::cli {

// The --determinism flag's values: "default" (the backend's fastest kernels; on CUDA a token's
// bits may depend on its batch) and "invariant" (a token's results depend on its own inputs alone).
inline constexpr const char* kDeterminismHelp =
    "default: the backend's fastest kernels (on CUDA a token's low bits may depend on its batch); "
    "invariant: every result of a row depends on that row's inputs alone, whatever the batch or "
    "the prefill chunking (CUDA: lockstep's small-M GEMM for every linear layer; bf16, TP 1, no "
    "drafter, no Mamba layers; the CPU reference always is), recorded in a trace's header so that "
    "replay rebuilds the mode and `replay --isolate` can reproduce one request alone";

struct ModelOptions {
  std::string model = "tiny";  // a named shape (random weights from --weights-seed) or a directory
  uint64_t weights_seed = 0;
  std::string backend = "cpu";
  ExecutorConfig executor;
  int32_t pages_count = 0;  // 0: enough for every row to reach L (cuda: sized from memory)
  double kv_memory_fraction = 0.9;  // cuda, --pages 0: of the memory left after weights, workspaces
  std::string drafter = "none";     // with executor.verify_width > 1: "none" or "ngram"
  int32_t tp_degree = 1;            // tensor-parallel ranks (core/tensor_parallel.h)
  std::string determinism = "default";  // --determinism: "default" or "invariant"
  // Run a context longer than the checkpoint's max_position_embeddings (with a warning).
  bool context_beyond_max_positions = false;
};

void add_model_options(CLI::App& app, ModelOptions& options);

// Accepts the backends of this build (backends/backend_factory.h); its message says why another
// is not.
CLI::Validator backend_validator();

// Loads or generates the weights; fills executor.pages_count when it was left at 0: on the CUDA
// backend from the device memory left after weights and workspaces (--kv-memory-fraction of it),
// elsewhere enough for every row to reach the context length. Throws ls::Error for a --tp the
// model cannot shard (naming the field it does not divide), for a drafter
// without speculative decoding (--drafter ngram with --verify-width 1), and for a context length
// the model refuses (check_context_length: past its sliding window, or past its
// max_position_embeddings without --context-beyond-max-positions).
ModelWeights load_model(ModelOptions& options, WeightSource& source);

// The help of --record-activations, one text for every command that records (generate, sim).
inline constexpr const char* kRecordActivationsHelp =
    "With --record: also record per-layer activation digests of every step (attention input, q, "
    "k, v, attention output, MLP output per layer; final norm and logits), which `lockstep "
    "replay --localise` compares to name the first layer and tensor where a replay departs. "
    "Digests are computed where the tensors are (on CUDA by a kernel; the step runs eager, no "
    "graph): a debugging mode. TP 1, models without Mamba layers";

}  // namespace ls::cli
