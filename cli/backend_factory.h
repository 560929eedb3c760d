// Which backend runs the model, chosen by name on the command line (--backend). The CUDA backend
// exists only in builds that found nvcc at configure time (LOCKSTEP_HAVE_CUDA); elsewhere asking
// for it is an error that says so.
#pragma once

#include "core/backend.h"
#include "core/config.h"
#include "core/model/weights.h"
#include "trace/records.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ls::cli {

// "cpu", and "cuda" when this build has the CUDA backend.
std::vector<std::string> backend_names();

// Empty when `name` is a backend of this build; else the message that says why not.
std::string backend_name_error(const std::string& name);

// The backend called `name` over `weights`, sized from `limits` (CUDA: bf16, CUDA graphs on),
// drafting with the drafter called `drafter` ("none" or "ngram", core/drafter.h) when
// limits.verify_width > 1. Throws ls::Error for an unknown backend or drafter name (oracle-mix
// included: it cannot be rebuilt outside the simulator) or a CUDA backend in a build without one.
// `time_steps`: the device times each step with events (CUDA; what a recorded run's step stats
// carry). `tp_degree`: the tensor-parallel ranks (the CPU reference simulates them in one
// process, core/tensor_parallel.h; CUDA runs one rank per GPU over NCCL, kernels/
// tp_cuda_backend.h, the ranks sharing devices when the host has fewer than N); ls::Error naming
// the field when the model cannot shard at that degree. `batch_invariant`: CUDA in batch-invariant
// mode (CudaBackendOptions::batch_invariant, `--determinism invariant`; it refuses by name what it
// cannot cover); the CPU reference is batch-invariant either way.
std::unique_ptr<Backend> make_backend(const std::string& name, const ModelWeights& weights,
                                      const ExecutorConfig& limits,
                                      const std::string& drafter = "none", bool time_steps = false,
                                      int32_t tp_degree = 1, bool batch_invariant = false);

// The --determinism flag's values: "default" (the backend's fastest kernels; on CUDA a token's
// bits may depend on its batch) and "invariant" (a token's results depend on its own inputs alone).
inline constexpr const char* kDeterminismHelp =
    "default: the backend's fastest kernels (on CUDA a token's low bits may depend on its batch); "
    "invariant: every result of a row depends on that row's inputs alone, whatever the batch or "
    "the prefill chunking (CUDA: lockstep's small-M GEMM for every linear layer; bf16, TP 1, no "
    "drafter, no Mamba layers; the CPU reference always is), recorded in a trace's header so that "
    "replay rebuilds the mode and `replay --isolate` can reproduce one request alone";

// Before the process's first CUDA call, for a run of backend `name` at `tp_degree`: a CUDA TP
// group loads every CUDA module eagerly and takes every hardware queue (kernels/tp_cuda_backend.h,
// prepare_tp_environment).
void prepare_backend_environment(const std::string& name, int32_t tp_degree);

// KV pages sized from the device memory left after weights and workspaces (`fraction` of it)
// for backend `name` with drafter `drafter` (whose token history is a workspace); nullopt for a
// backend whose memory is not sized this way (the CPU).
// At `tp_degree` > 1 each rank's pages hold its kv heads, sized on the devices the ranks use.
// `batch_invariant`: the workspaces of batch-invariant mode (make_backend's).
std::optional<int32_t> kv_pages_from_memory(const std::string& name, const ModelConfig& model,
                                            const ExecutorConfig& limits, double fraction,
                                            const std::string& drafter = "none",
                                            int32_t tp_degree = 1, bool batch_invariant = false);

// What a trace header records about the device that backend `name` runs on (GPU name, SM count,
// driver, CUDA and cuBLAS versions); nullopt for the CPU.
std::optional<trace::MachineInfo> machine_info_for(const std::string& name);

// What a trace header records about the collectives of backend `name` at `tp_degree` (NCCL's
// version and the pinned NCCL_ALGO and NCCL_PROTO, kernels/nccl_comm.h) for CUDA above TP 1 on
// one GPU per rank; nothing otherwise (TP 1, the CPU's simulated ranks, CUDA ranks sharing one
// GPU, whose collectives are lockstep's kernels). ls::Error when NCCL cannot be loaded or the
// environment asks for another algorithm or protocol.
void describe_collectives(const std::string& name, int32_t tp_degree, trace::TraceHeader& header);

}  // namespace ls::cli
