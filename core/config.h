// Model shape and executor limits. Every buffer in lockstep is sized from these once, at start-up
// (DESIGN.md "Limits"); input that exceeds one is rejected with an error naming the limit.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ls {

// A Llama-family decoder: RMSNorm, GQA attention with RoPE (HF rotate-half convention), SwiGLU.
struct ModelConfig {
  std::string name;
  int32_t hidden_size = 0;
  int32_t layers_count = 0;
  int32_t query_heads_count = 0;
  int32_t kv_heads_count = 0;
  int32_t head_dim = 0;
  int32_t ffn_size = 0;
  int32_t vocab_size = 0;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;

  int32_t q_size() const { return query_heads_count * head_dim; }
  int32_t kv_size() const { return kv_heads_count * head_dim; }
  // Parameters, for reports; counts the LM head once when tied.
  int64_t parameters_count() const;
  // Throws ls::Error naming the first field that is out of range or inconsistent.
  void validate() const;
};

// The named shapes: `tiny` (CI-sized), `llama-1b` and `llama-8b` (GPU.md's shapes).
ModelConfig model_config_named(std::string_view name);
std::vector<std::string> model_config_names();

// Declared limits of one executor. Pool row 0 is reserved, rows 1..max_batch_rows are real, and
// row max_batch_rows + 1 is the padding sentinel no request ever owns (seed spec §3.1).
struct ExecutorConfig {
  int32_t max_batch_rows = 16;         // B: rows in one forward op
  int32_t context_length = 512;        // L: tokens a request may hold in KV
  int32_t page_size = 16;              // P: tokens per KV page
  int32_t pages_count = 1024;          // KV pages, page 0 being the dummy that overflow writes hit
  int32_t verify_width = 1;            // W: decode input tokens per row (N with spec decoding)
  int32_t prefill_chunk_tokens = 512;  // prefill tokens in one forward op, summed over rows
  int32_t host_pages_count = 0;        // host KV pages that retraction may swap to; 0 = none

  int32_t pool_rows_count() const { return max_batch_rows + 2; }
  int32_t sentinel_pool_row() const { return max_batch_rows + 1; }
  // Wp: block-table columns. ⌊(L+P)/P⌋ without speculative decoding, ⌈(L+W)/P⌉ with it.
  int32_t table_width() const;
  // Tokens one step may carry: the prefill budget plus W for every row.
  int32_t step_tokens_max() const { return prefill_chunk_tokens + max_batch_rows * verify_width; }
  // Logits rows one step may produce: W for every row (prefill rows need one).
  int32_t logits_rows_max() const { return max_batch_rows * verify_width; }
  void validate() const;
};

}  // namespace ls
