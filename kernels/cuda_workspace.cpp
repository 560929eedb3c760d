// The arithmetic of cuda_workspace.h: decode buckets and the fixed bytes of a configuration.
#include "kernels/cuda_workspace.h"

#include "core/drafter.h"
#include "kernels/attention.h"
#include "kernels/drafter_ops.h"
#include "kernels/logits_ops.h"
#include "kernels/sampling_ops.h"
#include "kernels/tp_rank.h"

#include <algorithm>

namespace ls {

// Batch sizes that decode steps are padded to (and graphs captured at): 1, 2, 4, 8, then
// multiples of 8, and max_batch_rows itself.
std::vector<int32_t> decode_buckets(int32_t rows_max) {
  std::vector<int32_t> sizes;
  for (int32_t s : {1, 2, 4}) {
    if (s < rows_max) sizes.push_back(s);
  }
  for (int32_t s = 8; s < rows_max; s += 8) sizes.push_back(s);
  sizes.push_back(rows_max);
  return sizes;
}

static_assert(kernels::kDraftNgramMax == NgramDrafter::kNgramMax,
              "the device drafter matches the suffixes NgramDrafter matches");

// Whether a backend of these options drafts: the n-gram drafter with W > 1 (with W = 1 a drafter
// has no columns to fill, as on the CPU).
bool drafts_ngram(const ExecutorConfig& config, const CudaBackendOptions& options) {
  return options.drafter == "ngram" && config.verify_width > 1;
}

// The shard of `model` a backend of `options` holds (the whole model at TP 1).
TpRankShard rank_shard(const ModelConfig& model, const CudaBackendOptions& options) {
  return make_rank_shard(model, options.tp_degree, options.tp_rank);
}

// `full_model`: the whole model; a TP rank holds its shard (rank_model_config) and, at TP > 1,
// an LM head shard whether or not the embeddings are tied, plus TpRank's buffers.
FixedBytes fixed_bytes(const ModelConfig& full_model, const ExecutorConfig& config,
                       const CudaBackendOptions& options) {
  const TpRankShard shard = rank_shard(full_model, options);
  const ModelConfig model = rank_model_config(full_model, shard);
  const int64_t e = options.precision == CudaPrecision::kFp32 ? 4 : 2;
  const int64_t h = model.hidden_size, l = model.layers_count, v = model.vocab_size;
  const int64_t qs = model.q_size(), kvs = model.kv_size(), f = model.ffn_size;
  const int64_t t = config.step_tokens_max(), r = config.logits_rows_max();
  const int64_t b = config.max_batch_rows, pool = config.pool_rows_count();
  const int64_t tw = config.table_width();
  const int64_t positions = tw * config.page_size;
  FixedBytes out;
  const int64_t head_rows = shard.degree > 1 ? shard.vocab_rows : model.tied_embeddings ? 0 : v;
  out.weights = e * (v * h + head_rows * h + l * (qs + 2 * kvs) * h +
                     l * h * qs + l * 2 * f * h + l * h * f) +
                4 * (2 * l * h + h) +
                4 * l * ((model.qkv_bias ? qs + 2 * kvs : 0) + (model.qk_norm ? 2 * model.head_dim : 0));
  const kernels::AttentionShape shape{model.query_heads_count, model.kv_heads_count,
                                      model.head_dim, config.table_width(), config.page_size,
                                      config.table_width() * config.page_size};
  const size_t decode_floats = kernels::attention_workspace_floats(
      shape, config.max_batch_rows * config.verify_width);
  const size_t all_floats = kernels::attention_workspace_floats(shape, config.step_tokens_max());
  const size_t cap_floats = static_cast<size_t>(options.attention_workspace_bytes_max) / 4;
  const int64_t attention =
      static_cast<int64_t>(std::max(decode_floats, std::min(all_floats, cap_floats)));
  const StagingLayout layout(config.max_batch_rows, config.logits_rows_max(),
                             config.prefill_chunk_tokens, config.table_width());
  out.workspace =
      4 * 2 * positions * (model.head_dim / 2)                            // RoPE tables
      + 4 * t * h + e * t * h + 4 * t * (qs + 2 * kvs) + 4 * t * qs       // residual .. q
      + e * t * qs + 4 * t * 2 * f + e * t * f                            // attn_out .. act
      + 4 * attention + e * r * h + 4 * r * v + options.cublas_workspace_bytes
      + static_cast<int64_t>(kernels::logits_pass_workspace_bytes(config.logits_rows_max(),
                                                                  model.vocab_size))
      + 4 * 4 * r + 8 * 2 * r * v + 4 * (r + 1)                          // guard .. offsets
      + static_cast<int64_t>(kernels::sort_sampling_keys_temp_bytes(config.logits_rows_max(),
                                                                    model.vocab_size))
      + 4 * (pool * tw + pool + pool * config.verify_width + b)          // table .. vcl_before
      + 4 * t * 3 + 8 * t                                                 // ids, positions, ...
      + 4 * static_cast<int64_t>(layout.words)                            // staging
      + 4 * static_cast<int64_t>(ResultsLayout(config.max_batch_rows, config.logits_rows_max(),
                                               config.verify_width, config.table_width())
                                     .words);                             // results
  if (shard.degree > 1) {
    out.workspace += TpRank::workspace_bytes(shard, config.step_tokens_max(),
                                             config.logits_rows_max(), model.hidden_size);
  }
  if (drafts_ngram(config, options)) {
    out.workspace += 4 * pool * (int64_t{config.context_length} + config.verify_width)  // history
                     + 4 * pool;                                                         // begins
  }
  return out;
}

}  // namespace ls
