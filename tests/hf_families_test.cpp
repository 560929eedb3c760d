// The CPU reference against Hugging Face, one small checkpoint per family (tests/fixtures/hf/,
// saved by transformers 5.17; the references were computed by tests/hf_fixtures.py from the saved
// directory as AutoModelForCausalLM reads it back, fp32, eager attention). Nothing expected here
// comes from lockstep: tokens and logits are the fixture files'.
//
// Each family must agree on ≥ 95% of greedy tokens and on the first-step logits within 1e-4
// relative. Each also shows its feature matters: the same checkpoint with the feature switched
// off (rope scaling ignored, theta left at 10000 as when rope_parameters went unread, biases
// dropped, q/k norms skipped) must fail that bar.
#include "core/cpu_backend.h"
#include "core/model/weights.h"
#include "tests/hf_oracle.h"
#include "tests/scratch_dir.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>

namespace ls {
namespace {

namespace fs = std::filesystem;
using hf_oracle::kFp32LogitsTolerance;
using hf_oracle::kTokensAgreementMin;

fs::path fixture(const std::string& family) {
  return fs::path(LOCKSTEP_SOURCE_DIR) / "tests" / "fixtures" / "hf" / family;
}

hf_oracle::Result run_cpu(const ModelWeights& weights, const hf_oracle::Reference& ref) {
  CpuBackend cpu(weights, executor_config_for(hf_oracle::scheduler_config_for(ref)));
  return hf_oracle::run(cpu, weights, ref);
}

void print(const std::string& what, const hf_oracle::Result& r) {
  std::printf("[hf] %-34s tokens %ld/%ld (%.2f%%), sequences %d/%d, first-step logits max "
              "‖Δ‖/‖ref‖ %.3g, max |Δ| %.3g\n",
              what.c_str(), static_cast<long>(r.tokens_equal), static_cast<long>(r.tokens_total),
              100 * r.agreement(), r.sequences_equal, r.sequences_total,
              r.logits_relative_error_max, r.logits_abs_error_max);
}

struct FamilyCase {
  std::string fixture;
  ModelFamily family;
  std::string feature;                          // what the ablation switches off
  std::function<void(ModelWeights&)> ablate;    // the same weights without the feature
};

void ignore_rope_scaling(ModelWeights& w) { w.config.rope_type = RopeType::kDefault; }
void theta_unread(ModelWeights& w) {  // the bug of issue 11: rope_parameters never read
  w.config.rope_type = RopeType::kDefault;
  w.config.rope_theta = 10000.0f;
}
void drop_biases(ModelWeights& w) {
  w.config.qkv_bias = false;
  for (LayerWeights& l : w.layers) l.q_bias.clear(), l.k_bias.clear(), l.v_bias.clear();
}
void skip_qk_norm(ModelWeights& w) {
  w.config.qk_norm = false;
  for (LayerWeights& l : w.layers) l.q_norm.clear(), l.k_norm.clear();
}

class HfFamily : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(HfFamily, CpuMatchesHfAndTheFeatureMatters) {
  const FamilyCase& c = GetParam();
  SCOPED_TRACE("fixture " + fixture(c.fixture).string());
  const ModelWeights weights = load_hf_directory(fixture(c.fixture));
  ASSERT_EQ(weights.config.family, c.family);
  const hf_oracle::Reference ref = hf_oracle::read_reference(fixture(c.fixture) / "hf_reference.json");
  const hf_oracle::Result on = run_cpu(weights, ref);
  print(c.fixture, on);
  EXPECT_GT(on.lockstep_logits_norm_min, 0.0);
  EXPECT_GE(on.agreement(), kTokensAgreementMin)
      << "first mismatch: prompt " << on.first_mismatch_prompt << " step " << on.first_mismatch_step;
  EXPECT_LE(on.logits_relative_error_max, kFp32LogitsTolerance);

  ModelWeights ablated = weights;
  c.ablate(ablated);
  const hf_oracle::Result off = run_cpu(ablated, ref);
  print(c.fixture + " without " + c.feature, off);
  EXPECT_GT(off.lockstep_logits_norm_min, 0.0);
  EXPECT_FALSE(off.passes(kFp32LogitsTolerance)) << c.feature << " made no difference";
  EXPECT_LT(off.agreement(), on.agreement()) << c.feature;
  EXPECT_GT(off.logits_relative_error_max, 10 * on.logits_relative_error_max) << c.feature;
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, HfFamily,
    ::testing::Values(
        FamilyCase{"llama3", ModelFamily::kLlama, "llama3 rope scaling", ignore_rope_scaling},
        FamilyCase{"llama-linear", ModelFamily::kLlama, "linear rope scaling", ignore_rope_scaling},
        FamilyCase{"qwen2", ModelFamily::kQwen2, "q/k/v biases", drop_biases},
        FamilyCase{"qwen3", ModelFamily::kQwen3, "q/k head norms", skip_qk_norm},
        FamilyCase{"mistral", ModelFamily::kMistral, "rope_parameters' theta", theta_unread}),
    [](const auto& param_info) {
      std::string name = param_info.param.fixture;
      std::erase(name, '-');
      return name;
    });

// The legacy form (rope_theta + rope_scaling, as hub checkpoints carry it) of the llama3 model:
// the same config, digest, tokens and logits bit for bit as the rope_parameters form.
TEST(HfFamilyForms, Llama3LegacyConfigGivesIdenticalTokensAndLogits) {
  const testing::ScratchDir dir;
  fs::copy_file(fixture("llama3-legacy") / "config.json", dir.file("config.json"));
  fs::create_symlink(fixture("llama3") / "model.safetensors", dir.file("model.safetensors"));
  const ModelWeights current = load_hf_directory(fixture("llama3"));
  const ModelWeights legacy = load_hf_directory(dir.path());
  EXPECT_EQ(legacy.config.rope(), current.config.rope());
  EXPECT_EQ(legacy.config.rope_type, RopeType::kLlama3);
  EXPECT_EQ(legacy.config.rope_theta, 500000.0f);
  EXPECT_EQ(legacy.digest(), current.digest());
  const hf_oracle::Reference ref = hf_oracle::read_reference(fixture("llama3") / "hf_reference.json");
  const hf_oracle::Result a = run_cpu(current, ref);
  const hf_oracle::Result b = run_cpu(legacy, ref);
  print("llama3 (rope_parameters)", a);
  print("llama3-legacy (rope_theta + rope_scaling)", b);
  EXPECT_GE(b.agreement(), kTokensAgreementMin);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.first_logits.size(), b.first_logits.size());
  for (size_t i = 0; i < a.first_logits.size(); ++i) {
    ASSERT_EQ(a.first_logits[i].size(), b.first_logits[i].size());
    EXPECT_EQ(std::memcmp(a.first_logits[i].data(), b.first_logits[i].data(),
                          a.first_logits[i].size() * sizeof(float)), 0)
        << "prompt " << i << ": logits differ in their bits";
  }
}

}  // namespace
}  // namespace ls
