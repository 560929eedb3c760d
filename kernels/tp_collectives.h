// The collectives of one tensor-parallel rank on CUDA (DESIGN.md "Tensor parallelism"), enqueued
// on the caller's stream so that a CUDA graph captures them with the kernels around them. Two
// implementations, chosen by where the ranks are:
//  - ranks on distinct GPUs: NCCL (kernels/nccl_comm.h), NCCL_ALGO=Ring, NCCL_PROTO=Simple and
//    NVLS off pinned, so one reduction order whatever the message size;
//  - ranks sharing one GPU (tests and replays on a one-GPU host): NCCL refuses two ranks on one
//    device ("Duplicate GPU detected", ncclInvalidUsage since NCCL 2.5), so lockstep's own kernels
//    exchange through a slab in that device's memory: each rank copies its buffer in, the ranks
//    meet at a barrier (per-rank call counters in device memory, spun on by one thread), then each
//    sums the slab in rank order — ((p0 + p1) + p2) + …, the CPU reference's CpuTpGroup order.
//    At TP 2 that is the one two-operand sum NCCL's ring computes too, so TP 2 gives the same bits
//    on one GPU as on two. The ranks' host threads also meet before and after each barrier
//    kernel's launch (TpGroup::host_barrier), without which a rank's host waiting for the device
//    while a peer's barrier kernel waits for it deadlocks the group (kernels/tp_collectives.cpp).
// Every rank must issue the same calls in the same order with the same counts, each on its own
// thread.
#pragma once

#include "core/host_barrier.h"
#include "kernels/nccl_pinning.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace ls {

class TpCollectives {
 public:
  virtual ~TpCollectives() = default;
  virtual int32_t rank() const = 0;
  virtual int32_t ranks_count() const = 0;
  // buffer[i] = Σ over ranks of buffer[i] (fp32), the same bits on every rank, in place.
  virtual void all_reduce_sum(float* buffer, size_t count, cudaStream_t stream) = 0;
  // recv [ranks, count] = every rank's send [count], in rank order.
  virtual void all_gather(const float* send, float* recv, size_t count, cudaStream_t stream) = 0;
};

// The collectives of a TP group on `devices` (rank r on devices[r]): NCCL when every device is
// distinct, the shared-device kernels when every rank is on one device (their slab holds
// `count_max` floats per rank and call parity: the largest all-reduce or all-gather a rank
// issues). ls::Error for any other placement, or when NCCL cannot be loaded or pinned.
struct TpGroup {
  std::vector<std::unique_ptr<TpCollectives>> ranks;
  // What a trace header records: NCCL's pinning, or nullopt when lockstep's kernels ran them.
  std::optional<NcclPinning> nccl;
  // Shared-device groups only (null under NCCL): the host barrier the rank threads meet at around
  // each collective (kernels/tp_collectives.cpp says why). Every rank must call the collectives
  // on its own thread, concurrently with its peers; a rank that fails aborts it, so that its
  // peers' waits end (HostBarrierAborted) instead of blocking for ever.
  std::shared_ptr<HostBarrier> host_barrier;
};
TpGroup make_tp_group(const std::vector<int32_t>& devices, size_t count_max);

// True when the ranks on `devices` share one device (the shared-device kernels run their
// collectives); false when the devices are distinct (NCCL). ls::Error for a mix.
bool tp_ranks_share_a_device(const std::vector<int32_t>& devices);

// Device bytes of the shared-device slab for `ranks` ranks (0 when they are on distinct devices).
int64_t tp_group_bytes(const std::vector<int32_t>& devices, size_t count_max);

}  // namespace ls
