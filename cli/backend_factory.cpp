#include "cli/backend_factory.h"

#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/drafter.h"
#include "core/tensor_parallel.h"

#ifdef LOCKSTEP_HAVE_CUDA
#include "kernels/cuda_backend.h"
#include "kernels/nccl_comm.h"
#include "kernels/tp_collectives.h"
#include "kernels/tp_cuda_backend.h"
#endif

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace ls::cli {

namespace {

constexpr const char* kNoCuda =
    "this build has no CUDA backend (nvcc was not found at configure time)";

}  // namespace

std::vector<std::string> backend_names() {
#ifdef LOCKSTEP_HAVE_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

std::string backend_name_error(const std::string& name) {
  const std::vector<std::string> names = backend_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) return "";
  if (name == "cuda") return kNoCuda;
  return fmt::format("unknown backend '{}'; this build has: {}", name, fmt::join(names, ", "));
}

std::unique_ptr<Backend> make_backend(const std::string& name, const ModelWeights& weights,
                                      const ExecutorConfig& limits, const std::string& drafter,
                                      bool time_steps, int32_t tp_degree, bool batch_invariant) {
  const std::string error = backend_name_error(name);
  LS_REQUIRE(error.empty(), "--backend {}: {}", name, error);
  if (name == "cpu") {
    return std::make_unique<CpuBackend>(weights, limits, nullptr, false, make_drafter(drafter),
                                        tp_degree);
  }
  make_tp_layout(weights.config, tp_degree);  // the model's refusal first: it names the field
  prepare_backend_environment(name, tp_degree);  // in time unless CUDA already started
#ifdef LOCKSTEP_HAVE_CUDA
  CudaBackendOptions options{.graphs = true};
  if (batch_invariant) options = batch_invariant_options(options);
  options.drafter = drafter;
  options.time_steps = time_steps;
  if (tp_degree > 1) {
    return std::make_unique<TpCudaBackend>(weights, limits, options, tp_devices(tp_degree));
  }
  return make_cuda_backend(weights, limits, options);
#else
  (void)time_steps, (void)batch_invariant;
  throw Error(kNoCuda);
#endif
}

void prepare_backend_environment(const std::string& name, int32_t tp_degree) {
#ifdef LOCKSTEP_HAVE_CUDA
  if (name == "cuda" && tp_degree > 1) prepare_tp_environment();
#else
  (void)name, (void)tp_degree;
#endif
}

std::optional<int32_t> kv_pages_from_memory(const std::string& name, const ModelConfig& model,
                                            const ExecutorConfig& limits, double fraction,
                                            const std::string& drafter, int32_t tp_degree,
                                            bool batch_invariant) {
  if (name != "cuda") return std::nullopt;
#ifdef LOCKSTEP_HAVE_CUDA
  CudaBackendOptions options{.graphs = true};
  if (batch_invariant) options = batch_invariant_options(options);
  options.kv_memory_fraction = fraction;
  options.drafter = drafter;
  if (tp_degree > 1) {
    return tp_cuda_kv_sizing(model, limits, options, tp_devices(tp_degree)).pages_count;
  }
  return cuda_kv_sizing(model, limits, options).pages_count;
#else
  (void)model, (void)limits, (void)fraction, (void)drafter, (void)tp_degree, (void)batch_invariant;
  throw Error(kNoCuda);
#endif
}

std::optional<trace::MachineInfo> machine_info_for(const std::string& name) {
  if (name != "cuda") return std::nullopt;
#ifdef LOCKSTEP_HAVE_CUDA
  const CudaMachineInfo cuda = cuda_machine_info();
  trace::MachineInfo info;
  info.gpu_name = cuda.gpu_name;
  info.sm_count = std::stoi(cuda.sm_count);
  info.driver_version = cuda.driver_version;
  info.cuda_version = cuda.runtime_version;
  info.cublas_version = cuda.cublas_version;
  return info;
#else
  throw Error(kNoCuda);
#endif
}

void describe_collectives(const std::string& name, int32_t tp_degree, trace::TraceHeader& header) {
  if (name != "cuda" || tp_degree == 1) return;
#ifdef LOCKSTEP_HAVE_CUDA
  // Ranks sharing one GPU run lockstep's own collectives: no library to record.
  if (tp_ranks_share_a_device(tp_devices(tp_degree))) return;
  const NcclPinning nccl = pin_nccl_environment();  // what every TP group of this process pins
  header.nccl_version = nccl.version;
  header.nccl_algo = nccl.algo;
  header.nccl_proto = nccl.proto;
#else
  (void)header;
  throw Error(kNoCuda);
#endif
}

}  // namespace ls::cli
