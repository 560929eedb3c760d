#include "kernels/tp_rank.h"

#include "core/check.h"

#include <algorithm>
#include "kernels/cuda_check.h"
#include "kernels/layer_ops.h"
#include "kernels/tp_collectives.h"

namespace ls {

namespace {

// The collectives one forward issues: two all-reduces per layer (after o, after down), then the
// all-gather of the logits (core/cpu_model.h's kCollectivesPerLayer and its LM head).
int32_t collectives_per_forward(int32_t layers) { return 2 * layers + 1; }

}  // namespace

int64_t TpRank::workspace_bytes(const TpRankShard& shard, int32_t tokens_max,
                                int32_t logits_rows_max, int32_t hidden) {
  const int64_t head = int64_t{logits_rows_max} * shard.vocab_rows;
  return 4 * (int64_t{tokens_max} * hidden + head + shard.degree * head);
}

size_t TpRank::collective_floats_max(const TpRankShard& shard, int32_t tokens_max,
                                     int32_t logits_rows_max, int32_t hidden) {
  return std::max(static_cast<size_t>(tokens_max) * static_cast<size_t>(hidden),
                  static_cast<size_t>(logits_rows_max) * static_cast<size_t>(shard.vocab_rows));
}

TpRank::TpRank(const ModelConfig& model, const TpRankShard& shard, TpCollectives& comm,
               int32_t tokens_max, int32_t logits_rows_max, int64_t& workspace_ledger)
    : layout_(make_tp_layout(model, shard.degree)),
      shard_(shard),
      comm_(comm),
      hidden_(model.hidden_size),
      vocab_(model.vocab_size),
      layers_(model.layers_count) {
  LS_REQUIRE(comm.ranks_count() == shard.degree && comm.rank() == shard.rank,
             "tensor-parallel rank {} of {} was given the communicator of rank {} of {}",
             shard.rank, shard.degree, comm.rank(), comm.ranks_count());
  const size_t head = static_cast<size_t>(logits_rows_max) * static_cast<size_t>(shard.vocab_rows);
  partial_ = DeviceArray<float>(static_cast<size_t>(tokens_max) * hidden_, workspace_ledger);
  head_shard_ = DeviceArray<float>(head, workspace_ledger);
  gathered_ = DeviceArray<float>(static_cast<size_t>(shard.degree) * head, workspace_ledger);
  calls_.reserve(static_cast<size_t>(collectives_per_forward(layers_)));
}

void TpRank::all_reduce(float* buffer, size_t count, cudaStream_t stream) {
  comm_.all_reduce_sum(buffer, count, stream);
  calls_.push_back({CollectiveKind::kAllReduce, static_cast<int64_t>(count)});
}

void TpRank::all_gather(size_t count_per_rank, cudaStream_t stream) {
  comm_.all_gather(head_shard_.get(), gathered_.get(), count_per_rank, stream);
  calls_.push_back({CollectiveKind::kAllGather, static_cast<int64_t>(count_per_rank)});
}

void TpRank::reduce_into_residual(float* residual, int32_t tokens, cudaStream_t stream) {
  const int64_t count = int64_t{tokens} * hidden_;
  LS_ASSERT(static_cast<size_t>(count) <= partial_.count(), "{} tokens", tokens);
  all_reduce(partial_.get(), static_cast<size_t>(count), stream);
  LS_CUDA(kernels::launch_residual_add(residual, partial_.get(), count, stream));
}

void TpRank::gather_logits(float* logits, int32_t rows, cudaStream_t stream) {
  const size_t per_rank = static_cast<size_t>(rows) * static_cast<size_t>(shard_.vocab_rows);
  LS_ASSERT(per_rank <= head_shard_.count(), "{} logits rows", rows);
  all_gather(per_rank, stream);
  if (rows == 0) return;
  for (int32_t rank = 0; rank < shard_.degree; ++rank) {
    const ShardRange ids = layout_.vocab(rank);
    LS_CUDA(cudaMemcpy2DAsync(logits + ids.begin, static_cast<size_t>(vocab_) * sizeof(float),
                              gathered_.get() + static_cast<size_t>(rank) * per_rank,
                              static_cast<size_t>(shard_.vocab_rows) * sizeof(float),
                              static_cast<size_t>(ids.count) * sizeof(float),
                              static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream));
  }
}

void TpRank::idle_collectives(cudaStream_t stream) {
  for (int32_t layer = 0; layer < layers_; ++layer) {
    all_reduce(partial_.get(), 0, stream);
    all_reduce(partial_.get(), 0, stream);
  }
  all_gather(0, stream);
}

}  // namespace ls
