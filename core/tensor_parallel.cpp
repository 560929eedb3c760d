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
