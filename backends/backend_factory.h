// Which backend runs the model, chosen by name (the command's --backend, the Python module's
// backend=). The CUDA backend exists only in builds that found nvcc at configure time
// (LOCKSTEP_HAVE_CUDA); elsewhere asking for it is an error that says so.
#pragma once

#include "core/backend.h"
#include "core/config.h"
#include "core/model/weights.h"
#include "trace/records.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ls {

// "cpu", and "cuda" when this build has the CUDA backend.
std::vector<std::string> backend_names();

// Empty when `name` is a backend of this build; else the message that says why not.
std::string backend_name_error(const std::string& name);

// What runs a model: the backend by name and how it is built.
struct BackendSpec {
  std::string name = "cpu";      // "cpu", or "cuda" in a build with the CUDA backend
  std::string drafter = "none";  // "none" or "ngram" (core/drafter.h), when verify_width > 1
  // The tensor-parallel ranks (the CPU reference simulates them in one process,
  // core/tensor_parallel.h; CUDA runs one rank per GPU over NCCL, kernels/tp_cuda_backend.h, the
  // ranks sharing devices when the host has fewer than N).
  int32_t tp_degree = 1;
  // CUDA in batch-invariant mode (CudaBackendOptions::batch_invariant, `--determinism
  // invariant`; it refuses by name what it cannot cover); the CPU reference is batch-invariant
  // either way.
  bool batch_invariant = false;
  bool time_steps = false;   // CUDA: the device times each step with events (a recording's stats)
  bool cuda_graphs = true;   // CUDA: decode steps replay captured graphs
};

// The backend `spec` names over `weights`, sized from `limits` (CUDA: bf16). Throws ls::Error for
// an unknown backend or drafter name (oracle-mix included: it cannot be rebuilt outside the
// simulator), a CUDA backend in a build without one, or a model that cannot shard at
// spec.tp_degree (naming the field).
std::unique_ptr<Backend> make_backend(const BackendSpec& spec, const ModelWeights& weights,
                                      const ExecutorConfig& limits);

// Before the process's first CUDA call, for a run of backend `name` at `tp_degree`: a CUDA TP
// group loads every CUDA module eagerly and takes every hardware queue (kernels/tp_cuda_backend.h,
// prepare_tp_environment).
void prepare_backend_environment(const std::string& name, int32_t tp_degree);

// KV pages sized from the device memory left after weights and workspaces (`fraction` of it)
// for the backend `spec` names (the drafter's token history is a workspace; batch-invariant
// mode has workspaces of its own); nullopt for a backend whose memory is not sized this way (the
// CPU). At tp_degree > 1 each rank's pages hold its kv heads, sized on the devices the ranks use.
std::optional<int32_t> kv_pages_from_memory(const BackendSpec& spec, const ModelConfig& model,
                                            const ExecutorConfig& limits, double fraction);

// What a trace header records about the device that backend `name` runs on (GPU name, SM count,
// driver, CUDA and cuBLAS versions); nullopt for the CPU.
std::optional<trace::MachineInfo> machine_info_for(const std::string& name);

// What a trace header records about the collectives of backend `name` at `tp_degree` (NCCL's
// version and the pinned NCCL_ALGO and NCCL_PROTO, kernels/nccl_comm.h) for CUDA above TP 1 on
// one GPU per rank; nothing otherwise (TP 1, the CPU's simulated ranks, CUDA ranks sharing one
// GPU, whose collectives are lockstep's kernels). ls::Error when NCCL cannot be loaded or the
// environment asks for another algorithm or protocol.
void describe_collectives(const std::string& name, int32_t tp_degree, trace::TraceHeader& header);

}  // namespace ls
