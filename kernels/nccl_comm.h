// One rank's NCCL communicator for a tensor-parallel group (DESIGN.md "Tensor parallelism"), with
// the algorithm and protocol pinned so that an all-reduce's reduction order never depends on the
// message size (what vLLM's custom all-reduce does by token count, #50136). The CPU reference's
// CpuTpGroup (core/tensor_parallel.h) is its oracle for the call sequence; NCCL's ring order is
// its own, so TP N on CUDA is promised bit-identical run to run, not equal to the CPU's bits.
//
// The CUDA backend's ranks (kernels/tp_rank.h, kernels/tp_cuda_backend.h) call it;
// tests/gpu/nccl_comm_gpu_test.cpp checks it on the GPUs of one host (label gpu).
#pragma once

#include "kernels/nccl_pinning.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ls {

// Sets NCCL_ALGO, NCCL_PROTO and NCCL_NVLS_ENABLE=0 in this process's environment before the
// first communicator is made; a variable already set to another value is refused (ls::Error
// naming it): the run would not be the one the trace says. Loads NCCL (ls::Error if absent).
NcclPinning pin_nccl_environment();

// One thread driving several ranks (NcclComm::for_devices) brackets their calls in a group, or the
// first rank's call waits for the others forever.
void nccl_group_start();
void nccl_group_end();

// One rank of a group: owns the ncclComm_t (destroyed with it). Calls are checked (ls::Error
// naming the call, NCCL's message, file:line) and enqueued on `stream`.
class NcclComm {
 public:
  // Every rank of one process's GPUs: ranks 0..devices.size()-1 on those devices (tests, and a
  // single-process TP group). Pins the environment first.
  static std::vector<NcclComm> for_devices(const std::vector<int>& devices);

  NcclComm(NcclComm&&) noexcept;
  NcclComm& operator=(NcclComm&&) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm();

  int32_t rank() const { return rank_; }
  int32_t ranks_count() const { return ranks_count_; }
  // recv[i] = Σ over ranks of send[i] (fp32), identical on every rank. In place when send == recv.
  void all_reduce_sum(const float* send, float* recv, size_t count, cudaStream_t stream) const;
  // recv [ranks, count] = every rank's send [count], in rank order.
  void all_gather(const float* send, float* recv, size_t count, cudaStream_t stream) const;

 private:
  struct Handle;
  NcclComm(std::unique_ptr<Handle> handle, int32_t rank, int32_t ranks_count);
  std::unique_ptr<Handle> handle_;
  int32_t rank_ = 0;
  int32_t ranks_count_ = 0;
};

}  // namespace ls
