#include "core/config.h"

#include "core/check.h"

#include <fmt/ranges.h>

namespace ls {

int64_t ModelConfig::parameters_count() const {
  const int64_t h = hidden_size;
  const int64_t per_layer = 2 * h + h * q_size() + 2 * h * kv_size() + int64_t{q_size()} * h +
                            3 * h * ffn_size;
  const int64_t embeddings = int64_t{vocab_size} * h * (tied_embeddings ? 1 : 2);
  return embeddings + h + per_layer * layers_count;
}

void ModelConfig::validate() const {
  // Upper bounds far above any real Llama keep every size product inside int64 and stop a
  // corrupt header from asking for absurd allocations.
  auto in_range = [&](int64_t value, int64_t max, const char* field) {
    LS_REQUIRE(value > 0 && value <= max, "model config '{}': {} must be in [1, {}], got {}", name,
               field, max, value);
  };
  in_range(hidden_size, 1 << 17, "hidden_size");
  in_range(layers_count, 1 << 12, "layers_count");
  in_range(query_heads_count, 1 << 12, "query_heads_count");
  in_range(kv_heads_count, 1 << 12, "kv_heads_count");
  in_range(head_dim, 1 << 12, "head_dim");
  in_range(ffn_size, 1 << 20, "ffn_size");
  in_range(vocab_size, 1 << 22, "vocab_size");
  LS_REQUIRE(head_dim % 2 == 0, "model config '{}': head_dim must be even for RoPE, got {}", name,
             head_dim);
  LS_REQUIRE(query_heads_count % kv_heads_count == 0,
             "model config '{}': query_heads_count {} is not a multiple of kv_heads_count {}",
             name, query_heads_count, kv_heads_count);
  LS_REQUIRE(rope_theta > 0.0f, "model config '{}': rope_theta must be > 0, got {}", name,
             rope_theta);
  LS_REQUIRE(rms_eps > 0.0f, "model config '{}': rms_eps must be > 0, got {}", name, rms_eps);
}

ModelConfig model_config_named(std::string_view name) {
  ModelConfig c;
  c.name = std::string(name);
  if (name == "tiny") {
    c.hidden_size = 64, c.layers_count = 2, c.query_heads_count = 4, c.kv_heads_count = 2;
    c.head_dim = 16, c.ffn_size = 128, c.vocab_size = 512, c.rope_theta = 10000.0f;
    c.rms_eps = 1e-5f, c.tied_embeddings = false;
  } else if (name == "llama-1b") {
    c.hidden_size = 2048, c.layers_count = 16, c.query_heads_count = 32, c.kv_heads_count = 8;
    c.head_dim = 64, c.ffn_size = 8192, c.vocab_size = 128256, c.rope_theta = 500000.0f;
    c.rms_eps = 1e-5f, c.tied_embeddings = true;
  } else if (name == "llama-8b") {
    c.hidden_size = 4096, c.layers_count = 32, c.query_heads_count = 32, c.kv_heads_count = 8;
    c.head_dim = 128, c.ffn_size = 14336, c.vocab_size = 128256, c.rope_theta = 500000.0f;
    c.rms_eps = 1e-5f, c.tied_embeddings = false;
  } else {
    throw Error(fmt::format("unknown model shape '{}'; known shapes: {}", name,
                            fmt::join(model_config_names(), ", ")));
  }
  return c;
}

std::vector<std::string> model_config_names() { return {"tiny", "llama-1b", "llama-8b"}; }

int32_t ExecutorConfig::table_width() const {
  if (verify_width == 1) return (context_length + page_size) / page_size;
  return (context_length + verify_width + page_size - 1) / page_size;
}

void ExecutorConfig::validate() const {
  auto in_range = [](int64_t value, int64_t lo, int64_t hi, const char* field) {
    LS_REQUIRE(value >= lo && value <= hi, "executor config: {} must be in [{}, {}], got {}",
               field, lo, hi, value);
  };
  in_range(max_batch_rows, 1, 4096, "max_batch_rows");
  in_range(context_length, 1, 1 << 24, "context_length");
  in_range(page_size, 1, 4096, "page_size");
  in_range(pages_count, 2, 1 << 26, "pages_count");
  in_range(verify_width, 1, 16, "verify_width");
  in_range(prefill_chunk_tokens, 1, 1 << 20, "prefill_chunk_tokens");
  in_range(host_pages_count, 0, 1 << 26, "host_pages_count");
}

}  // namespace ls
