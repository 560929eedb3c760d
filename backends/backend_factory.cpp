#include "backends/backend_factory.h"

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

namespace ls {

namespace {

constexpr const char* kNoCuda =
    "this build has no CUDA backend (configured without nvcc, or with -DLOCKSTEP_CUDA=OFF)";

#ifdef LOCKSTEP_HAVE_CUDA
// The CUDA backend's options for `spec` (its KV memory fraction left at the default).
CudaBackendOptions cuda_options(const BackendSpec& spec) {
  CudaBackendOptions options{.graphs = spec.cuda_graphs};
  if (spec.batch_invariant) options = batch_invariant_options(options);
  options.drafter = spec.drafter;
  options.time_steps = spec.time_steps;
  return options;
}
#endif

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

std::unique_ptr<Backend> make_backend(const BackendSpec& spec, const ModelWeights& weights,
                                      const ExecutorConfig& limits) {
  const std::string error = backend_name_error(spec.name);
  LS_REQUIRE(error.empty(), "{}", error);
  make_tp_layout(weights.config, spec.tp_degree);  // the model's refusal first: it names the field
  if (spec.name == "cpu") {
    return std::make_unique<CpuBackend>(weights, limits, nullptr, false,
                                        make_drafter(spec.drafter), spec.tp_degree);
  }
  prepare_backend_environment(spec.name, spec.tp_degree);  // in time unless CUDA already started
#ifdef LOCKSTEP_HAVE_CUDA
  CudaBackendOptions options = cuda_options(spec);
  if (spec.tp_degree > 1) {
    return std::make_unique<TpCudaBackend>(weights, limits, options, tp_devices(spec.tp_degree));
  }
  return make_cuda_backend(weights, limits, options);
#else
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

std::optional<int32_t> kv_pages_from_memory(const BackendSpec& spec, const ModelConfig& model,
                                            const ExecutorConfig& limits, double fraction) {
  if (spec.name != "cuda") return std::nullopt;
#ifdef LOCKSTEP_HAVE_CUDA
  CudaBackendOptions options = cuda_options(spec);
  options.kv_memory_fraction = fraction;
  if (spec.tp_degree > 1) {
    return tp_cuda_kv_sizing(model, limits, options, tp_devices(spec.tp_degree)).pages_count;
  }
  return cuda_kv_sizing(model, limits, options).pages_count;
#else
  (void)model, (void)limits, (void)fraction;
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

}  // namespace ls
