#include "kernels/tp_collectives.h"

#include "core/check.h"
#include "core/tensor_parallel.h"
#include "kernels/cuda_check.h"
#include "kernels/device_memory.h"
#include "kernels/nccl_comm.h"
#include "kernels/shared_device_ops.h"
#include "kernels/tp_cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace ls {

namespace {

class NcclCollectives final : public TpCollectives {
 public:
  explicit NcclCollectives(NcclComm comm) : comm_(std::move(comm)) {}
  int32_t rank() const override { return comm_.rank(); }
  int32_t ranks_count() const override { return comm_.ranks_count(); }
  void all_reduce_sum(float* buffer, size_t count, cudaStream_t stream) override {
    comm_.all_reduce_sum(buffer, buffer, count, stream);
  }
  void all_gather(const float* send, float* recv, size_t count, cudaStream_t stream) override {
    comm_.all_gather(send, recv, count, stream);
  }

 private:
  NcclComm comm_;
};

// The slab and call counters of ranks sharing one device, owned by rank 0's view and read by
// every rank's (the group outlives none of them: TpGroup holds them together), and the host
// barrier their threads meet at around each collective.
struct SharedDeviceMemory {
  DeviceArray<float> slab;                   // [2, ranks, count_max]
  DeviceArray<unsigned long long> calls;     // [ranks]
  std::shared_ptr<HostBarrier> host;
  kernels::SharedDeviceSlab view() const {
    return {slab.get(), calls.get(), static_cast<int32_t>(calls.count()),
            slab.count() / (2 * calls.count())};
  }
};

// The barrier kernel of a collective spins on the device until every rank's barrier kernel of
// that call arrived; a rank's host thread that blocks on the device meanwhile, before it has
// enqueued its own, deadlocks the group: its peer's kernel waits for this rank's launch, and this
// rank's host waits for the device. Much of what a forward calls can block on the device: a
// device-wide synchronisation (cudaMalloc/cudaFree/cudaMemset, pinned allocations), cuBLASLt's
// first use of a kernel (module loading), the first launch of a graph (its upload), or simply a
// full launch queue — one rank that ran a whole warm-up pass ahead (capture_graphs enqueues 33
// eager forwards at llama-1b, thousands of launches) fills it behind its spinning barrier.
// So the rank threads meet on the host around the barrier kernel's launch:
//  - before it (`host->arrive_and_wait()` #1): no rank's barrier kernel of call k is on the device
//    before every rank's host has done all its work that comes before call k;
//  - after it (#2): no rank goes on to the work after call k before every rank's barrier kernel
//    of call k is on the device.
// Between the two meetings a rank only launches its deposit and barrier kernels (lockstep's own,
// loaded up front). Anywhere else, every barrier kernel on the device has all its peers launched
// and none waits for a rank's host: whatever a rank's host waits for on the device completes, and
// no rank is ever more than one layer's launches ahead of another. A graph capture meets here
// too (every rank captures the same graphs in the same order); a graph replay is one launch on
// each rank per hand-off (kernels/tp_cuda_backend.cpp), its collectives inside it.
class SharedDeviceCollectives final : public TpCollectives {
 public:
  SharedDeviceCollectives(std::shared_ptr<const SharedDeviceMemory> memory, int32_t rank)
      : memory_(std::move(memory)), group_(memory_->view()), rank_(rank) {}
  int32_t rank() const override { return rank_; }
  int32_t ranks_count() const override { return group_.ranks; }
  void all_reduce_sum(float* buffer, size_t count, cudaStream_t stream) override {
    arrive(buffer, count, stream);
    LS_CUDA(kernels::launch_shared_sum(group_, rank_, buffer, count, stream));
  }
  void all_gather(const float* send, float* recv, size_t count, cudaStream_t stream) override {
    arrive(send, count, stream);
    LS_CUDA(kernels::launch_shared_gather(group_, rank_, recv, count, stream));
  }

 private:
  // Deposits `send` and launches the barrier kernel, between the two host meetings above.
  void arrive(const float* send, size_t count, cudaStream_t stream) {
    memory_->host->arrive_and_wait();
    LS_CUDA(kernels::launch_shared_deposit(group_, rank_, send, count, stream));
    LS_CUDA(kernels::launch_shared_barrier(group_, rank_, stream));
    memory_->host->arrive_and_wait();
  }

  std::shared_ptr<const SharedDeviceMemory> memory_;
  kernels::SharedDeviceSlab group_;
  int32_t rank_;
};

// Lazy module loading (CUDA's default since 12.2) loads a kernel at its first launch, which can
// wait for the device's running kernels: one rank loading while another's barrier spins for it
// would wait forever. Ranks sharing a device need every module loaded up front.
void require_eager_module_loading() {
  const char* mode = std::getenv("CUDA_MODULE_LOADING");
  LS_REQUIRE(mode != nullptr && std::string(mode) == "EAGER",
             "tensor-parallel ranks sharing one GPU need CUDA_MODULE_LOADING=EAGER in the "
             "environment (it is {}): a kernel loaded lazily while another rank's collective waits "
             "for it can wait forever", mode == nullptr ? "unset" : fmt::format("'{}'", mode));
}

}  // namespace

void prepare_tp_environment() {
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
}

bool tp_ranks_share_a_device(const std::vector<int32_t>& devices) {
  LS_REQUIRE(!devices.empty(), "a TP group of no devices");
  std::vector<int32_t> distinct = devices;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  if (distinct.size() == devices.size()) return false;
  LS_REQUIRE(distinct.size() == 1,
             "a TP group runs one rank per GPU (NCCL) or every rank on one GPU; {} ranks on {} "
             "devices is neither", devices.size(), distinct.size());
  return true;
}

int64_t tp_group_bytes(const std::vector<int32_t>& devices, size_t count_max) {
  if (!tp_ranks_share_a_device(devices)) return 0;
  const int64_t ranks = static_cast<int64_t>(devices.size());
  return 4 * 2 * ranks * static_cast<int64_t>(count_max) + 8 * ranks;
}

TpGroup make_tp_group(const std::vector<int32_t>& devices, size_t count_max) {
  const int32_t count = static_cast<int32_t>(devices.size());
  LS_REQUIRE(count >= 1 && count <= kTpDegreeMax, "a TP group of {} ranks (1..{})", count,
             kTpDegreeMax);
  TpGroup group;
  if (!tp_ranks_share_a_device(devices)) {
    group.nccl = pin_nccl_environment();
    for (NcclComm& comm : NcclComm::for_devices(std::vector<int>(devices.begin(), devices.end()))) {
      group.ranks.push_back(std::make_unique<NcclCollectives>(std::move(comm)));
    }
    return group;
  }
  require_eager_module_loading();
  LS_CUDA(cudaSetDevice(devices[0]));
  auto memory = std::make_shared<SharedDeviceMemory>();
  memory->slab = DeviceArray<float>(2 * static_cast<size_t>(count) * std::max<size_t>(count_max, 1));
  memory->calls = DeviceArray<unsigned long long>(static_cast<size_t>(count));
  memory->host = std::make_shared<HostBarrier>(count);
  group.host_barrier = memory->host;
  LS_CUDA(cudaMemset(memory->calls.get(), 0, memory->calls.bytes()));
  LS_CUDA(cudaStreamSynchronize(nullptr));  // done before any rank's stream (non-blocking) runs
  for (int32_t rank = 0; rank < count; ++rank) {
    group.ranks.push_back(std::make_unique<SharedDeviceCollectives>(memory, rank));
  }
  return group;
}

}  // namespace ls
