// The lockstep half of the independent oracle (tests/hf_oracle.py writes the other half):
//
//   lockstep_hf_oracle_check MODEL_DIR OUT.json
//
// Loads MODEL_DIR (config.json + *.safetensors written by transformers' save_pretrained) with
// ls::load_hf_directory, runs greedy decoding of hf_reference.json's prompts on the CUDA backend
// in its fp32 mode, on the CPU reference, and on the CUDA backend in bf16 (production), and
// compares each with transformers': tokens position by position over 32 prompts × 32 steps (the
// acceptance: ≥ 95% equal, CUDA fp32 and the CPU reference) and the first-step logits (‖Δ‖/‖ref‖
// within kFp32LogitsTolerance; the bf16 figure is informational). Prints the figures, writes
// OUT.json, exits 0 when the acceptance holds, 1 when it does not, 2 on an error.
#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/model/weights.h"
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "kernels/cuda_backend.h"
#include "tests/gpu/backend_test_support.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace ls {
namespace {

using nlohmann::json;

constexpr double kTokensAgreementMin = 0.95;
// fp32 on both sides; what differs is the order of sums (and HF's RoPE angles computed in fp32).
constexpr double kFp32LogitsTolerance = 1e-4;
constexpr double kBf16LogitsTolerance = 2e-2;  // informational: bf16 weights, KV, GEMM inputs

struct Reference {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> first_logits;
  json meta;
};

Reference read_reference(const std::filesystem::path& path) {
  std::ifstream in(path);
  LS_REQUIRE(in.good(), "cannot open {}", path.string());
  const json j = json::parse(in);
  Reference r;
  r.prompts = j.at("prompts").get<std::vector<std::vector<int32_t>>>();
  r.tokens = j.at("tokens").get<std::vector<std::vector<int32_t>>>();
  r.first_logits = j.at("first_logits").get<std::vector<std::vector<float>>>();
  LS_REQUIRE(r.prompts.size() == r.tokens.size() && r.prompts.size() == r.first_logits.size(),
             "{}: prompts, tokens and first_logits differ in length", path.string());
  r.meta = {{"torch", j.value("torch", "")},
            {"transformers", j.value("transformers", "")},
            {"dtype", j.value("dtype", "")},
            {"device", j.value("device", "")},
            {"seed", j.value("seed", 0)},
            {"config_keys_rewritten", j.value("config_keys_rewritten", json::array())}};
  return r;
}

struct Result {
  int64_t tokens_equal = 0;
  int64_t tokens_total = 0;
  int32_t sequences_equal = 0;
  int32_t first_mismatch_prompt = -1;
  int32_t first_mismatch_step = -1;
  double logits_relative_error_max = 0;
  double logits_abs_error_max = 0;
};

Result run(Backend& backend, const ModelWeights& weights, const Reference& ref) {
  const int32_t vocab = weights.config.vocab_size;
  SchedulerConfig sc;
  sc.max_batch_rows = 32;
  sc.token_budget = 256;
  sc.page_size = 16;
  sc.context_length = 96;
  sc.pages_count = 32 * 7 + 2;
  Scheduler scheduler(sc);
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    RequestSpec r;
    r.id = static_cast<RequestId>(i + 1);
    r.prompt = ref.prompts[i];
    r.max_new_tokens = static_cast<int32_t>(ref.tokens[i].size());
    scheduler.submit(r, vocab);
  }
  Executor executor(executor_config_for(sc), vocab, backend, ExecutorOptions{.capture_logits = true});
  gpu_test::FirstLogits observer(vocab);
  run_serving_loop(scheduler, executor, ServingLoopOptions{.observer = &observer});
  Result out;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    const RequestId id = static_cast<RequestId>(i + 1);
    const std::vector<int32_t>& got = scheduler.outcomes().at(id).tokens;
    const std::vector<int32_t>& want = ref.tokens[i];
    for (size_t t = 0; t < want.size(); ++t) {
      const bool equal = t < got.size() && got[t] == want[t];
      out.tokens_equal += equal;
      if (!equal && out.first_mismatch_prompt < 0) {
        out.first_mismatch_prompt = static_cast<int32_t>(i);
        out.first_mismatch_step = static_cast<int32_t>(t);
      }
    }
    out.tokens_total += static_cast<int64_t>(want.size());
    out.sequences_equal += got == want;
    const std::vector<float>& mine = observer.logits.at(id);
    const std::vector<float>& theirs = ref.first_logits[i];
    LS_REQUIRE(mine.size() == theirs.size(), "prompt {}: {} logits against {}", i, mine.size(),
               theirs.size());
    double diff = 0, base = 0;
    for (size_t k = 0; k < mine.size(); ++k) {
      const double d = double{mine[k]} - theirs[k];
      diff += d * d;
      base += double{theirs[k]} * theirs[k];
      out.logits_abs_error_max = std::max(out.logits_abs_error_max, std::abs(d));
    }
    LS_REQUIRE(base > 0, "prompt {}: HF's first-step logits are all zero", i);
    out.logits_relative_error_max = std::max(out.logits_relative_error_max, std::sqrt(diff / base));
  }
  return out;
}

json report(const char* name, const Result& r, double tolerance, bool acceptance) {
  const double agreement = static_cast<double>(r.tokens_equal) / static_cast<double>(r.tokens_total);
  const bool tokens_ok = agreement >= kTokensAgreementMin;
  const bool logits_ok = r.logits_relative_error_max <= tolerance;
  std::printf("%-24s tokens %ld/%ld equal (%.2f%%), %d/32 sequences equal, first mismatch: prompt "
              "%d step %d; first-step logits max ‖Δ‖/‖ref‖ %.3g (tolerance %.3g), max |Δ| %.3g%s\n",
              name, static_cast<long>(r.tokens_equal), static_cast<long>(r.tokens_total),
              100 * agreement, r.sequences_equal, r.first_mismatch_prompt, r.first_mismatch_step,
              r.logits_relative_error_max, tolerance, r.logits_abs_error_max,
              acceptance ? (tokens_ok && logits_ok ? "  PASS" : "  FAIL") : "  (informational)");
  return {{"tokens_equal", r.tokens_equal},
          {"tokens_total", r.tokens_total},
          {"token_agreement", agreement},
          {"sequences_equal", r.sequences_equal},
          {"first_mismatch_prompt", r.first_mismatch_prompt},
          {"first_mismatch_step", r.first_mismatch_step},
          {"first_logits_relative_error_max", r.logits_relative_error_max},
          {"first_logits_abs_error_max", r.logits_abs_error_max},
          {"logits_tolerance", tolerance},
          {"acceptance", acceptance},
          {"pass", tokens_ok && logits_ok}};
}

int check(const std::filesystem::path& dir, const std::filesystem::path& out_path) {
  const ModelWeights weights = load_hf_directory(dir);
  const Reference ref = read_reference(dir / "hf_reference.json");
  const ExecutorConfig ec = executor_config_for(SchedulerConfig{
      .max_batch_rows = 32, .token_budget = 256, .page_size = 16, .pages_count = 32 * 7 + 2,
      .context_length = 96});
  std::printf("hf oracle: %s loaded (hidden %d, %d layers, %d/%d heads, vocab %d); %zu prompts\n",
              dir.string().c_str(), weights.config.hidden_size, weights.config.layers_count,
              weights.config.query_heads_count, weights.config.kv_heads_count,
              weights.config.vocab_size, ref.prompts.size());
  json out = {{"command", "lockstep_hf_oracle_check"},
              {"hf", ref.meta},
              {"token_agreement_min", kTokensAgreementMin}};
  bool pass = true;
  {
    CudaBackend cuda(weights, ec, CudaBackendOptions{.precision = CudaPrecision::kFp32, .graphs = true});
    out["cuda_fp32"] = report("CUDA fp32 vs HF:", run(cuda, weights, ref), kFp32LogitsTolerance, true);
    pass = pass && out["cuda_fp32"]["pass"].get<bool>();
  }
  {
    CpuBackend cpu(weights, ec);
    out["cpu_reference"] = report("CPU reference vs HF:", run(cpu, weights, ref), kFp32LogitsTolerance, true);
    pass = pass && out["cpu_reference"]["pass"].get<bool>();
  }
  {
    CudaBackend cuda(weights, ec, CudaBackendOptions{.graphs = true});
    out["cuda_bf16"] = report("CUDA bf16 vs HF:", run(cuda, weights, ref), kBf16LogitsTolerance, false);
  }
  out["pass"] = pass;
  std::ofstream(out_path) << out.dump(2) << "\n";
  std::printf("hf oracle: %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace
}  // namespace ls

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: lockstep_hf_oracle_check MODEL_DIR OUT.json\n");
    return 2;
  }
  try {
    return ls::check(argv[1], argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep_hf_oracle_check: %s\n", e.what());
    return 2;
  }
}
