// One CUDA backend's part of a tensor-parallel group (DESIGN.md "Tensor parallelism"): its shard
// of the model (core/tensor_parallel.h's TpRankShard), its NCCL communicator, and the buffers and
// collectives that join the ranks' shards — the all-reduce of the row-parallel partials after o
// and after down, and the all-gather of the vocabulary-split logits. Every collective is enqueued
// on the backend's step stream, so a CUDA graph captures it with the kernels around it, and every
// rank issues the same calls in the same order (its plan is rank 0's plan, kernels/
// tp_cuda_backend.h). The CPU reference's CpuTpGroup is the oracle of the call sequence.
#pragma once

#include "core/tensor_parallel.h"
#include "kernels/device_memory.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace ls {

class TpCollectives;

class TpRank {
 public:
  // Device bytes of the buffers a rank of `shard` allocates for these limits.
  static int64_t workspace_bytes(const TpRankShard& shard, int32_t tokens_max,
                                 int32_t logits_rows_max, int32_t hidden);

  // The largest collective a rank of `shard` issues, in floats (a shared-device group's slab).
  static size_t collective_floats_max(const TpRankShard& shard, int32_t tokens_max,
                                      int32_t logits_rows_max, int32_t hidden);

  // Rank shard.rank of `model` (the whole model's config) over shard.degree ranks. `comm` (not
  // owned) must be that rank's; the buffers' bytes are added to `workspace_ledger`.
  TpRank(const ModelConfig& model, const TpRankShard& shard, TpCollectives& comm,
         int32_t tokens_max, int32_t logits_rows_max, int64_t& workspace_ledger);

  const TpRankShard& shard() const { return shard_; }

  // Where a row-parallel layer (o, down) writes this rank's partial sum [tokens, hidden] fp32.
  float* partial() const { return partial_.get(); }
  // Sums the ranks' partials in place (kernels/tp_collectives.h: identical bits on every rank,
  // run to run) and adds the sum to residual [tokens, hidden] — the CPU reference's
  // reduce_into_residual.
  void reduce_into_residual(float* residual, int32_t tokens, cudaStream_t stream);

  // Where the LM head writes this rank's logits shard [rows, vocab_rows] fp32.
  float* head_shard() const { return head_shard_.get(); }
  // All-gathers the ranks' shards and lays them side by side into logits [rows, vocab]: the
  // padding rows of the last rank's shard are dropped, so every rank holds the whole logits.
  void gather_logits(float* logits, int32_t rows, cudaStream_t stream);

  // An IDLE forward: the busy forward's collectives (two all-reduces per layer, the all-gather),
  // in its order, each with no elements.
  void idle_collectives(cudaStream_t stream);

  // The collectives enqueued since begin_forward: those of the last forward launched eagerly or
  // captured into a graph (a replayed graph issues what its capture logged).
  void begin_forward() { calls_.clear(); }
  const std::vector<CollectiveCall>& calls() const { return calls_; }

 private:
  void all_reduce(float* buffer, size_t count, cudaStream_t stream);
  void all_gather(size_t count_per_rank, cudaStream_t stream);

  TpLayout layout_;
  TpRankShard shard_;
  TpCollectives& comm_;
  int32_t hidden_;
  int32_t vocab_;
  int32_t layers_;
  DeviceArray<float> partial_;     // [tokens_max, hidden]
  DeviceArray<float> head_shard_;  // [logits_rows_max, vocab_rows]
  DeviceArray<float> gathered_;    // [degree, logits_rows_max, vocab_rows]
  std::vector<CollectiveCall> calls_;
};

}  // namespace ls
