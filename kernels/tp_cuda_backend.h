// The CUDA backend at tensor-parallel degree N > 1 (DESIGN.md "Tensor parallelism"): N CudaBackend
// ranks, each holding its Megatron shard of the weights and of the KV pool and joined by NCCL
// (kernels/tp_rank.h), driven in lockstep behind the one Backend interface the executor sees.
//
// Process model: one process, one thread per rank. Each rank's CudaBackend lives on its own
// thread with its device current; every Backend call is handed to all ranks with the SAME plan
// (rank 0's: the executor and the recorder run once, on the caller's thread) and returns when every
// rank is done. One thread per rank, not one thread for all: an NCCL call made outside a group
// waits for its peers on the host at its first use, and a group would defer the collectives past
// the kernels after them. Rules 1–4 are handed over together with the step's finish (one hand-off
// per step and one per collect), as every rank must run them in the same order anyway.
//
// Every rank computes the whole logits (all-gathered), the guard, the sampler and the device state
// identically — their inputs are identical bits, NCCL's pinned ring giving every rank the same
// sums — so rank 0's result is the step's, and each other rank's result is checked equal to it
// (a rank that disagreed would be a broken determinism promise, reported as an internal error).
// That keeps every rank's future_input_map, vcl and table its own and exact without a broadcast
// of the sampled tokens (one fewer collective per step, and no second path for the tail).
//
// Ranks may share a device (tests on one GPU, a replay of a TP trace on a smaller host): they are
// slower that way, not different (the ring's sums are the same two-operand additions at TP 2).
//
// This header includes no CUDA header, so cli/ can include it.
#pragma once

#include "core/backend.h"
#include "core/tensor_parallel.h"
#include "kernels/cuda_backend.h"
#include "kernels/nccl_pinning.h"

#include <memory>
#include <optional>
#include <vector>

namespace ls {

// Devices of N ranks on this host: rank r on device r when there are at least N devices, else
// every rank on device 0 (ranks share it: tests, and replays on a smaller host). ls::Error when
// there is no device.
std::vector<int32_t> tp_devices(int32_t degree);

// What a TP group's collectives need of CUDA, which waits for each other on the device: every
// module loaded up front (CUDA_MODULE_LOADING=EAGER: a kernel loaded lazily, CUDA's default,
// while a peer's collective spins could wait for it forever — CUDA's lazy-loading guide,
// "concurrent execution"), and as many hardware queues as CUDA gives (CUDA_DEVICE_MAX_CONNECTIONS
// =32: ranks sharing a GPU must not share a queue, where one rank's waiting kernel would hold up
// the kernels its peer needs to arrive). Sets each unless the environment sets it; takes effect
// only before the process's first CUDA call, so callers that will build a TP group call it first
// thing (kernels/tp_collectives.cpp).
void prepare_tp_environment();

// KV pages for a TP group on `devices` (rank r on devices[r]): the fewest any device's share
// gives, where a device's share is options.kv_memory_fraction of its free memory less the weights
// and workspaces of every rank it holds, split among those ranks' pages. ls::Error when even two
// pages do not fit.
CudaKvSizing tp_cuda_kv_sizing(const ModelConfig& model, const ExecutorConfig& config,
                               const CudaBackendOptions& options,
                               const std::vector<int32_t>& devices);

class TpCudaBackend final : public Backend {
 public:
  // Rank r on devices[r], degree devices.size() (2..kTpDegreeMax), each built over `options`
  // (device, tp_degree, tp_rank and tp_comm are set per rank; options.graphs: captured once every
  // rank is built). Makes the collectives (kernels/tp_collectives.h: NCCL, pinned, across GPUs;
  // lockstep's kernels for ranks sharing one GPU, which needs CUDA_MODULE_LOADING=EAGER). Throws ls::Error
  // naming the field when the model cannot shard at that degree, and as CudaBackend does.
  TpCudaBackend(const ModelWeights& weights, const ExecutorConfig& config,
                const CudaBackendOptions& options, const std::vector<int32_t>& devices);
  TpCudaBackend(const DeviceSeededWeights& weights, const ExecutorConfig& config,
                const CudaBackendOptions& options, const std::vector<int32_t>& devices);
  ~TpCudaBackend() override;

  std::string name() const override { return "cuda"; }
  std::string drafter_name() const;
  int32_t tp_degree() const;
  // What the trace header records about the collectives (NCCL_ALGO, NCCL_PROTO, the version);
  // nullopt when the ranks share one GPU and lockstep's kernels ran them.
  const std::optional<NcclPinning>& nccl_pinning() const;
  // Rank r's backend (memory reports, graph counts, phase times; tests). Not for stepping it.
  const CudaBackend& rank(int32_t r) const;
  CudaBackend& rank(int32_t r);

  void apply_table_writes(const StepPlan& plan) override;
  void reset_lengths(const StepPlan& plan) override;
  void fill_inputs(const StepPlan& plan) override;
  void forward(const StepPlan& plan) override;
  void poison_logits(std::span<const int32_t> logits_rows, float value) override;
  void finish_step(const StepPlan& plan, StepResult& result) override;
  bool can_run_ahead() const override;
  void enqueue_finish(const StepPlan& plan) override;
  void collect_finish(const StepPlan& plan, StepResult& result) override;
  void copy_pages(const CacheOp& op) override;
  StateSnapshot read_state(std::span<const int32_t> pool_rows) const override;
  InputSnapshot read_inputs() const override;
  DeviceStepTime last_device_time() const override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ls
