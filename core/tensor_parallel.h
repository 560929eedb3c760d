// Tensor parallelism (DESIGN.md "Tensor parallelism"): how a model's weights split over N ranks
// the Megatron way, and the CPU reference's simulated communicator.
//
// Column-parallel layers (q/k/v by heads, gate/up by ffn columns, the LM head by vocabulary)
// give each rank whole output elements, each the same dot product TP 1 computes: no reduction
// crosses ranks, so they are bit-identical to TP 1. Row-parallel layers (o, down) give each
// rank a partial sum over its slice of the input; the ranks' partials are added by an
// all-reduce in one FIXED order — ((p0 + p1) + p2) + … — so TP N is bit-identical run to run,
// and differs from TP 1 only by that re-association (a tolerance, stated where it is tested).
#pragma once

#include "core/config.h"

#include <cstdint>
#include <span>
#include <vector>

namespace ls {

// One host's GPUs: the most ranks a TP group may have.
inline constexpr int32_t kTpDegreeMax = 8;

// A contiguous range [begin, begin + count) of heads, ffn columns or vocabulary ids.
struct ShardRange {
  int32_t begin = 0;
  int32_t count = 0;
  int32_t end() const { return begin + count; }
  bool operator==(const ShardRange&) const = default;
};

// What each rank of a TP group owns. Made only by make_tp_layout, which refuses a degree the
// model cannot shard, so every range here is non-empty.
class TpLayout {
 public:
  int32_t degree() const { return degree_; }
  ShardRange query_heads(int32_t rank) const;  // num_heads / N per rank
  ShardRange kv_heads(int32_t rank) const;     // num_kv_heads / N per rank
  ShardRange ffn(int32_t rank) const;          // ffn / N gate/up rows = down columns
  // ⌈V / N⌉ ids per rank, the last rank's range shorter when N does not divide V (the padded
  // shard of Megatron's vocabulary-parallel head, without the padding rows).
  ShardRange vocab(int32_t rank) const;

 private:
  friend TpLayout make_tp_layout(const ModelConfig& model, int32_t degree);
  int32_t degree_ = 1;
  int32_t query_heads_per_rank_ = 0;
  int32_t kv_heads_per_rank_ = 0;
  int32_t ffn_per_rank_ = 0;
  int32_t vocab_per_rank_ = 0;
  int32_t vocab_size_ = 0;
};

// The layout of `model` over `degree` ranks. Throws ls::Error naming the flag and the field when
// the degree is outside [1, kTpDegreeMax] or does not divide the attention heads, the kv heads
// or the ffn size (a GQA group must sit on one rank whole, and each rank's kv heads serve
// exactly its query heads).
TpLayout make_tp_layout(const ModelConfig& model, int32_t degree);

// One rank's part of a TP group, as a backend that holds only its shard uploads it (the CUDA
// backend's ranks, kernels/tp_cuda_backend.h). At degree 1 every range is the whole tensor.
struct TpRankShard {
  int32_t degree = 1;
  int32_t rank = 0;
  ShardRange query_heads;
  ShardRange kv_heads;
  ShardRange ffn;
  ShardRange vocab;
  // The LM head shard's rows: ⌈V / N⌉ on every rank, so that every rank's all-gather sends the
  // same count; the last rank's rows past vocab.count are zero and never read.
  int32_t vocab_rows = 0;
};
TpRankShard make_rank_shard(const ModelConfig& model, int32_t degree, int32_t rank);

// The model a rank computes: `model` with query_heads_count, kv_heads_count and ffn_size divided by
// the degree (its own heads and ffn columns), everything else — hidden size, vocabulary, head_dim,
// the family's features — unchanged.
ModelConfig rank_model_config(const ModelConfig& model, const TpRankShard& shard);

// Elements [count · head_dim) of the heads `heads`: the rows of q/k/v (or the columns of o).
ShardRange head_elements(ShardRange heads, int32_t head_dim);

// Rows `rows` of a row-major tensor of `cols` columns: a view, no copy.
std::span<const float> shard_rows(std::span<const float> tensor, int64_t cols, ShardRange rows);
// Columns `columns` of a row-major [rows, cols] tensor, row by row: the tensor itself when the
// range is every column, else copied into `storage` [rows, columns.count].
std::span<const float> shard_columns(std::span<const float> tensor, int64_t rows, int64_t cols,
                                     ShardRange columns, std::vector<float>& storage);

// The collectives of one forward, in the order the ranks issue them (what an IDLE forward must
// repeat with no rows so the ranks of a data-parallel group stay in step).
enum class CollectiveKind : uint8_t { kAllReduce = 0, kAllGather = 1 };
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  int64_t elements_count = 0;  // per rank
  bool operator==(const CollectiveCall&) const = default;
};

// The TP group simulated in one process: the ranks' buffers lie side by side and a collective is
// a loop over them in rank order. Records the calls of the current forward.
class CpuTpGroup {
 public:
  // `calls_per_forward`: the collectives one forward issues (their log is sized once).
  CpuTpGroup(int32_t degree, int32_t calls_per_forward);

  int32_t degree() const { return degree_; }
  // out[i] = ((partials[0][i] + partials[1][i]) + partials[2][i]) + … : rank order, one fixed
  // association. `partials` is [degree, out.size()].
  void all_reduce_sum(std::span<const float> partials, std::span<float> out);
  // The ranks wrote their shards in place into `gathered` (the vocabulary split of the logits):
  // in one process the gather moves nothing; it is recorded so the call sequence is complete.
  void all_gather(int64_t elements_per_rank);

  // The calls since begin_forward. At TP 1 they are recorded too (the one rank's "all-reduce" is
  // a copy); a GPU rank at TP 1 issues none.
  void begin_forward() { calls_.clear(); }
  const std::vector<CollectiveCall>& calls() const { return calls_; }

 private:
  int32_t degree_;
  std::vector<CollectiveCall> calls_;
};

}  // namespace ls
