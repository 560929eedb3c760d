// The arithmetic of cuda_workspace.h.
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

}  // namespace ls
