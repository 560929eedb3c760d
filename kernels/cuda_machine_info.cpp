// What a trace header and a benchmark record about the machine (CudaMachineInfo), and whether
// there is a device at all.
#include "kernels/cuda_backend.h"

#include "core/check.h"
#include "kernels/cuda_check.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <fstream>
#include <regex>
#include <string>

namespace ls {

namespace {

std::string version_string(int32_t v) {
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}

}  // namespace

bool cuda_device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

CudaMachineInfo cuda_machine_info(int32_t device) {
  LS_REQUIRE(cuda_device_available(), "no CUDA device is available");
  cudaDeviceProp props{};
  LS_CUDA(cudaGetDeviceProperties(&props, device));
  int driver = 0;
  int runtime = 0;
  LS_CUDA(cudaDriverGetVersion(&driver));
  LS_CUDA(cudaRuntimeGetVersion(&runtime));
  int major = 0, minor = 0, patch = 0;
  LS_CUBLAS(cublasGetProperty(MAJOR_VERSION, &major));
  LS_CUBLAS(cublasGetProperty(MINOR_VERSION, &minor));
  LS_CUBLAS(cublasGetProperty(PATCH_LEVEL, &patch));
  // The kernel module's version, when the proc file is there (Linux): the first dotted number
  // after "Kernel Module" ("... Open Kernel Module for x86_64  580.159.04  Release Build ...").
  std::string kernel_driver;
  std::ifstream proc("/proc/driver/nvidia/version");
  std::string line;
  if (proc && std::getline(proc, line)) {
    const size_t kernel_module = line.find("Kernel Module");
    const std::string rest = kernel_module == std::string::npos ? line : line.substr(kernel_module);
    std::smatch match;
    if (std::regex_search(rest, match, std::regex(R"(\b\d+\.\d+(\.\d+)?\b)"))) {
      kernel_driver = match.str();
    }
  }
  CudaMachineInfo info;
  info.gpu_name = props.name;
  info.sm_count = std::to_string(props.multiProcessorCount);
  info.driver_version = (kernel_driver.empty() ? std::string("unknown") : kernel_driver) +
                        " (CUDA " + version_string(driver) + ")";
  info.runtime_version = version_string(runtime);
  info.cublas_version = fmt::format("{}.{}.{}", major, minor, patch);
  return info;
}

}  // namespace ls
