// The lockstep half of the independent oracle (tests/hf_oracle.py writes the other half):
//
//   lockstep_hf_oracle_check MODEL_DIR OUT.json
//
// Loads MODEL_DIR (config.json + *.safetensors written by transformers' save_pretrained) with
// ls::load_hf_directory, runs greedy decoding of hf_reference.json's prompts on the CUDA backend
// in its fp32 mode, on the CPU reference, and on the CUDA backend in bf16 (production), and
// compares each with transformers': tokens position by position over the reference's prompts and
// steps (the acceptance: ≥ 95% equal, CUDA fp32 and the CPU reference) and the first-step logits
// (‖Δ‖/‖ref‖ within kFp32LogitsTolerance; the bf16 figure is informational). tests/fixtures/hf/
// holds one such directory per family (scripts/gpu-run.sh runs them all). Prints the figures, writes
// OUT.json, exits 0 when the acceptance holds, 1 when it does not, 2 on an error.
#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/model/weights.h"
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "kernels/cuda_backend.h"
#include "tests/hf_oracle.h"

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
using hf_oracle::kFp32LogitsTolerance;
using hf_oracle::kTokensAgreementMin;
using hf_oracle::Reference;
using hf_oracle::Result;

constexpr double kBf16LogitsTolerance = 2e-2;  // informational: bf16 weights, KV, GEMM inputs

json report(const char* name, const Result& r, double tolerance, bool acceptance) {
  const double agreement = r.agreement();
  const bool tokens_ok = agreement >= kTokensAgreementMin;
  // A run whose logits are all zero would be a broken one, not an agreeing one.
  const bool logits_ok = r.logits_relative_error_max <= tolerance && r.lockstep_logits_norm_min > 0;
  std::printf("%-24s tokens %ld/%ld equal (%.2f%%), %d/%d sequences equal, first mismatch: prompt "
              "%d step %d; first-step logits max ‖Δ‖/‖ref‖ %.3g (tolerance %.3g), max |Δ| %.3g%s\n",
              name, static_cast<long>(r.tokens_equal), static_cast<long>(r.tokens_total),
              100 * agreement, r.sequences_equal, r.sequences_total, r.first_mismatch_prompt,
              r.first_mismatch_step,
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
  const Reference ref = hf_oracle::read_reference(dir / "hf_reference.json");
  // The model's scheduler config (a hybrid's state slots), as hf_oracle::run serves it.
  const ExecutorConfig ec =
      executor_config_for(hf_oracle::scheduler_config_for(ref, weights.config));
  const ModelConfig& c = weights.config;
  std::printf("hf oracle: %s loaded (%s, hidden %d, %d layers, %d/%d heads x %d, vocab %d, rope %s "
              "theta %g factor %g, qkv bias %d, qk norm %d, tied %d); %zu prompts, context %d\n",
              dir.string().c_str(), std::string(architecture_name(c.family)).c_str(),
              c.hidden_size, c.layers_count, c.query_heads_count, c.kv_heads_count, c.head_dim,
              c.vocab_size, std::string(to_string(c.rope_type)).c_str(), c.rope_theta,
              c.rope_factor, c.qkv_bias, c.qk_norm, c.tied_embeddings, ref.prompts.size(),
              ec.context_length);
  json out = {{"command", "lockstep_hf_oracle_check"},
              {"model_dir", dir.string()},
              {"family", std::string(to_string(c.family))},
              {"hf", ref.meta},
              {"token_agreement_min", kTokensAgreementMin}};
  bool pass = true;
  {
    CudaBackend cuda(weights, ec, CudaBackendOptions{.precision = CudaPrecision::kFp32, .graphs = true});
    out["cuda_fp32"] = report("CUDA fp32 vs HF:", hf_oracle::run(cuda, weights, ref), kFp32LogitsTolerance, true);
    pass = pass && out["cuda_fp32"]["pass"].get<bool>();
  }
  {
    CpuBackend cpu(weights, ec);
    out["cpu_reference"] = report("CPU reference vs HF:", hf_oracle::run(cpu, weights, ref), kFp32LogitsTolerance, true);
    pass = pass && out["cpu_reference"]["pass"].get<bool>();
  }
  {
    CudaBackend cuda(weights, ec, CudaBackendOptions{.graphs = true});
    out["cuda_bf16"] = report("CUDA bf16 vs HF:", hf_oracle::run(cuda, weights, ref), kBf16LogitsTolerance, false);
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
