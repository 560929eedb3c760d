#include "core/tensor_parallel.h"

#include "core/check.h"

#include <algorithm>

namespace ls {

namespace {

// `count` split into `degree` equal parts; ls::Error naming `field` when it does not divide.
int32_t per_rank(int32_t count, int32_t degree, const char* field) {
  LS_REQUIRE(count % degree == 0,
             "tensor-parallel degree (--tp) {} does not divide the model's {} = {}", degree, field,
             count);
  return count / degree;
}

}  // namespace

ShardRange TpLayout::query_heads(int32_t rank) const {
  LS_ASSERT(rank >= 0 && rank < degree_, "rank {} of {}", rank, degree_);
  return {rank * query_heads_per_rank_, query_heads_per_rank_};
}

ShardRange TpLayout::kv_heads(int32_t rank) const {
  LS_ASSERT(rank >= 0 && rank < degree_, "rank {} of {}", rank, degree_);
  return {rank * kv_heads_per_rank_, kv_heads_per_rank_};
}

ShardRange TpLayout::ffn(int32_t rank) const {
  LS_ASSERT(rank >= 0 && rank < degree_, "rank {} of {}", rank, degree_);
  return {rank * ffn_per_rank_, ffn_per_rank_};
}

ShardRange TpLayout::vocab(int32_t rank) const {
  LS_ASSERT(rank >= 0 && rank < degree_, "rank {} of {}", rank, degree_);
  const int32_t begin = rank * vocab_per_rank_;
  return {begin, std::min(vocab_per_rank_, vocab_size_ - begin)};
}

TpLayout make_tp_layout(const ModelConfig& model, int32_t degree) {
  LS_REQUIRE(degree >= 1 && degree <= kTpDegreeMax,
             "tensor-parallel degree (--tp) must be in [1, {}], got {}", kTpDegreeMax, degree);
  TpLayout layout;
  layout.degree_ = degree;
  layout.query_heads_per_rank_ =
      per_rank(model.query_heads_count, degree, "attention heads (num_attention_heads)");
  layout.kv_heads_per_rank_ =
      per_rank(model.kv_heads_count, degree, "kv heads (num_key_value_heads)");
  layout.ffn_per_rank_ = per_rank(model.ffn_size, degree, "ffn size (intermediate_size)");
  layout.vocab_size_ = model.vocab_size;
  layout.vocab_per_rank_ = (model.vocab_size + degree - 1) / degree;
  // Every rank must own some vocabulary (a rank with an empty shard has nothing to gather).
  LS_REQUIRE(layout.vocab_per_rank_ * (degree - 1) < model.vocab_size,
             "tensor-parallel degree (--tp) {} leaves the last rank no ids of the model's "
             "vocabulary (vocab_size = {})", degree, model.vocab_size);
  return layout;
}

TpRankShard make_rank_shard(const ModelConfig& model, int32_t degree, int32_t rank) {
  const TpLayout layout = make_tp_layout(model, degree);
  LS_REQUIRE(rank >= 0 && rank < degree, "tensor-parallel rank {} is outside [0, {})", rank, degree);
  return TpRankShard{.degree = degree,
                     .rank = rank,
                     .query_heads = layout.query_heads(rank),
                     .kv_heads = layout.kv_heads(rank),
                     .ffn = layout.ffn(rank),
                     .vocab = layout.vocab(rank),
                     .vocab_rows = layout.vocab(0).count};
}

ModelConfig rank_model_config(const ModelConfig& model, const TpRankShard& shard) {
  ModelConfig local = model;
  local.query_heads_count = shard.query_heads.count;
  local.kv_heads_count = shard.kv_heads.count;
  local.ffn_size = shard.ffn.count;
  return local;
}

ShardRange head_elements(ShardRange heads, int32_t head_dim) {
  return {heads.begin * head_dim, heads.count * head_dim};
}

std::span<const float> shard_rows(std::span<const float> tensor, int64_t cols, ShardRange rows) {
  LS_ASSERT(rows.begin >= 0 && static_cast<size_t>(int64_t{rows.end()} * cols) <= tensor.size(),
            "rows [{}, {}) of a {}-element tensor of {} columns", rows.begin, rows.end(),
            tensor.size(), cols);
  return tensor.subspan(static_cast<size_t>(int64_t{rows.begin} * cols),
                        static_cast<size_t>(int64_t{rows.count} * cols));
}

std::span<const float> shard_columns(std::span<const float> tensor, int64_t rows, int64_t cols,
                                     ShardRange columns, std::vector<float>& storage) {
  LS_ASSERT(static_cast<size_t>(rows * cols) == tensor.size() && columns.begin >= 0 &&
                columns.end() <= cols,
            "columns [{}, {}) of a [{}, {}] tensor of {} elements", columns.begin, columns.end(),
            rows, cols, tensor.size());
  if (columns.begin == 0 && columns.count == cols) return tensor;
  storage.resize(static_cast<size_t>(rows * columns.count));
  for (int64_t r = 0; r < rows; ++r) {
    const auto from = tensor.begin() + static_cast<ptrdiff_t>(r * cols + columns.begin);
    std::copy(from, from + columns.count, storage.begin() + static_cast<ptrdiff_t>(r * columns.count));
  }
  return storage;
}

CpuTpGroup::CpuTpGroup(int32_t degree, int32_t calls_per_forward) : degree_(degree) {
  LS_ASSERT(degree >= 1 && degree <= kTpDegreeMax, "degree {}", degree);
  calls_.reserve(static_cast<size_t>(calls_per_forward));  // the step loop allocates nothing
}

void CpuTpGroup::all_reduce_sum(std::span<const float> partials, std::span<float> out) {
  const size_t n = out.size();
  LS_ASSERT(partials.size() == n * static_cast<size_t>(degree_), "{} partials for {} x {}",
            partials.size(), degree_, n);
  for (size_t i = 0; i < n; ++i) {
    float sum = partials[i];
    for (int32_t rank = 1; rank < degree_; ++rank) sum += partials[static_cast<size_t>(rank) * n + i];
    out[i] = sum;
  }
  calls_.push_back({CollectiveKind::kAllReduce, static_cast<int64_t>(n)});
}

void CpuTpGroup::all_gather(int64_t elements_per_rank) {
  LS_ASSERT(elements_per_rank >= 0, "{} elements", elements_per_rank);
  calls_.push_back({CollectiveKind::kAllGather, elements_per_rank});
}

}  // namespace ls
