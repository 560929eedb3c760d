#include "cli/backend_factory.h"

#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/drafter.h"
#include "core/tensor_parallel.h"

#ifdef LOCKSTEP_HAVE_CUDA
#include "kernels/cuda_backend.h"
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
                                      bool time_steps, int32_t tp_degree) {
  const std::string error = backend_name_error(name);
  LS_REQUIRE(error.empty(), "--backend {}: {}", name, error);
  if (name == "cpu") {
    return std::make_unique<CpuBackend>(weights, limits, nullptr, false, make_drafter(drafter),
                                        tp_degree);
  }
  make_tp_layout(weights.config, tp_degree);  // the model's refusal first: it names the field
  LS_REQUIRE(tp_degree == 1,
             "--tp {} with --backend {}: the CUDA backend runs on one GPU; its NCCL tensor-parallel "
             "ranks are not built yet (the CPU reference simulates TP: --backend cpu)",
             tp_degree, name);
#ifdef LOCKSTEP_HAVE_CUDA
  CudaBackendOptions options{.graphs = true};
  options.drafter = drafter;
  options.time_steps = time_steps;
  return make_cuda_backend(weights, limits, options);
#else
  (void)time_steps;
  throw Error(kNoCuda);
#endif
}

std::optional<int32_t> kv_pages_from_memory(const std::string& name, const ModelConfig& model,
                                            const ExecutorConfig& limits, double fraction,
                                            const std::string& drafter) {
  if (name != "cuda") return std::nullopt;
#ifdef LOCKSTEP_HAVE_CUDA
  CudaBackendOptions options{.graphs = true};
  options.kv_memory_fraction = fraction;
  options.drafter = drafter;
  return cuda_kv_sizing(model, limits, options).pages_count;
#else
  (void)model, (void)limits, (void)fraction, (void)drafter;
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

}  // namespace ls::cli
