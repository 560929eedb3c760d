#include "kernels/nccl_comm.h"

#include "core/check.h"
#include "core/tensor_parallel.h"
#include "kernels/cuda_check.h"

#include <nccl.h>

#include <cstdlib>
#include <utility>

namespace ls {

namespace {

void check_nccl(ncclResult_t status, const char* expression, const char* file, int line) {
  if (status != ncclSuccess) [[unlikely]] {
    throw Error(fmt::format("NCCL call failed: {} returned {} ({}) at {}:{}", expression,
                            static_cast<int>(status), ncclGetErrorString(status), file, line));
  }
}

#define LS_NCCL(expr) check_nccl((expr), #expr, __FILE__, __LINE__)

// Sets `name` to `value`, or refuses a different value already there.
void pin_variable(const char* name, const char* value) {
  const char* current = std::getenv(name);
  LS_REQUIRE(current == nullptr || std::string(current) == value,
             "{}={} is set, but a tensor-parallel group pins {}={} (its reduction order must not "
             "change with the message size): unset it", name, current ? current : "", name, value);
  LS_REQUIRE(setenv(name, value, /*overwrite=*/1) == 0, "cannot set {}={}", name, value);
}

}  // namespace

void nccl_group_start() { LS_NCCL(ncclGroupStart()); }
void nccl_group_end() { LS_NCCL(ncclGroupEnd()); }

struct NcclComm::Handle {
  ncclComm_t comm = nullptr;
  ~Handle() {
    if (comm != nullptr) ncclCommDestroy(comm);  // a destructor reports nothing
  }
};

NcclPinning pin_nccl_environment() {
  pin_variable("NCCL_ALGO", kNcclAlgo);
  pin_variable("NCCL_PROTO", kNcclProto);
  pin_variable("NCCL_NVLS_ENABLE", "0");
  NcclPinning pinning{kNcclAlgo, kNcclProto, 0};
  int version = 0;
  LS_NCCL(ncclGetVersion(&version));
  pinning.version = version;
  return pinning;
}

std::vector<NcclComm> NcclComm::for_devices(const std::vector<int>& devices) {
  const int32_t count = static_cast<int32_t>(devices.size());
  LS_REQUIRE(count >= 1 && count <= kTpDegreeMax, "a TP group of {} devices (1..{})", count,
             kTpDegreeMax);
  pin_nccl_environment();
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  LS_NCCL(ncclCommInitAll(comms.data(), count, devices.data()));
  std::vector<NcclComm> ranks;
  for (int32_t rank = 0; rank < count; ++rank) {
    auto handle = std::make_unique<Handle>();
    handle->comm = comms[static_cast<size_t>(rank)];
    ranks.push_back(NcclComm(std::move(handle), rank, count));
  }
  return ranks;
}

NcclComm::NcclComm(std::unique_ptr<Handle> handle, int32_t rank, int32_t ranks_count)
    : handle_(std::move(handle)), rank_(rank), ranks_count_(ranks_count) {}
NcclComm::NcclComm(NcclComm&&) noexcept = default;
NcclComm& NcclComm::operator=(NcclComm&&) noexcept = default;
NcclComm::~NcclComm() = default;

void NcclComm::all_reduce_sum(const float* send, float* recv, size_t count,
                              cudaStream_t stream) const {
  LS_NCCL(ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, handle_->comm, stream));
}

void NcclComm::all_gather(const float* send, float* recv, size_t count, cudaStream_t stream) const {
  LS_NCCL(ncclAllGather(send, recv, count, ncclFloat32, handle_->comm, stream));
}

}  // namespace ls
