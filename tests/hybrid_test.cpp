// The hybrid (Mamba2 + attention) family on the CPU reference (issue 19): loading a Bamba
// checkpoint with every config key and tensor used or refused, the forward op's recurrent-state
// fields validated like every other field, the state rules (zeroing, copy-on-write, page-boundary
// checkpoints), and the claims DESIGN.md makes for the reference, compared bit for bit: a
// request's logits do not depend on its chunking or its co-batch.
#include "core/executor.h"
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "tests/hybrid_checkpoint.h"
#include "tests/hybrid_properties.h"
#include "replay/compare.h"
#include "replay/trace_check.h"
#include "trace/recorder.h"
#include "trace/checks.h"
#include "trace/trace_observer.h"
#include "tests/mamba_slot_properties.h"
#include "tests/prefix_hit_properties.h"
#include "tests/scratch_dir.h"
#include "tests/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <fstream>
#include <functional>
#include <map>
#include <set>

namespace ls {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using testing::decode_row;
using testing::pages_from;
using testing::prefill_row;
using testing::prompt_for;

constexpr int32_t kVocab = 512;

const ModelWeights& hybrid_weights() { return prefix_props::hybrid_weights(); }

ExecutorConfig hybrid_config() {
  ExecutorConfig c = testing::small_config();
  c.mamba_slots_count = 12;
  c.prefill_chunk_tokens = 96;  // two rows of a whole prompt
  return c;
}

struct HybridHarness {
  explicit HybridHarness(ExecutorConfig c = hybrid_config())
      : config(c),
        backend(hybrid_weights(), c),
        executor(c, kVocab, backend, ExecutorOptions{.capture_logits = true}) {}
  ExecutorConfig config;
  CpuBackend backend;
  Executor executor;
};

std::vector<float> row_logits(const StepResult& r, int32_t row) {
  const auto begin = r.logits.begin() + static_cast<ptrdiff_t>(row) * kVocab;
  return {begin, begin + kVocab};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double norm_of(const std::vector<float>& v) {
  double n = 0;
  for (const float x : v) n += double{x} * x;
  return std::sqrt(n);
}

// ---- Loading -------------------------------------------------------------------------------

TEST(HybridLoad, ReadsTheLayerTableAndTheMixerShape) {
  const ModelConfig& c = hybrid_weights().config;
  EXPECT_EQ(c.family, ModelFamily::kBamba);
  const std::vector<LayerKind> kinds = {LayerKind::kMamba2, LayerKind::kAttention,
                                        LayerKind::kMamba2, LayerKind::kMamba2};
  EXPECT_EQ(c.layer_kinds, kinds);
  EXPECT_EQ(c.mamba_layers_count(), 3);
  EXPECT_EQ(c.mamba.heads_count, 8);
  EXPECT_EQ(c.mamba.head_dim, 16);
  EXPECT_EQ(c.mamba.groups_count, 2);
  EXPECT_EQ(c.mamba.state_size, 16);
  EXPECT_EQ(c.mamba.conv_kernel, 4);
  EXPECT_EQ(c.mamba.conv_dim(), 128 + 2 * 2 * 16);
  EXPECT_EQ(c.mamba.dt_min, 0.05f);
  EXPECT_EQ(c.mamba.dt_max, 2.0f);
  EXPECT_EQ(c.head_dim, 16);  // hidden / heads: BambaConfig writes no head_dim
  EXPECT_EQ(c.partial_rotary_dim, 8);  // int(16 · partial_rotary_factor 0.5)
  EXPECT_EQ(c.rotary_dim(), 8);
  EXPECT_TRUE(hybrid_weights().layers[0].wq.empty());
  EXPECT_EQ(hybrid_weights().layers[1].wq.size(), size_t{64 * 64});
  EXPECT_EQ(hybrid_weights().layers[2].conv_weight.size(), size_t{(128 + 2 * 2 * 16) * 4});
}

// The digest covers the mixer: another seed for the same config digests differently, and the
// time-step clamp is part of the config text.
TEST(HybridLoad, TheDigestCoversTheMixerTensorsAndFields) {
  const testing::ScratchDir dir;
  testing::write_hybrid_checkpoint(dir.path(), /*seed=*/20);
  EXPECT_NE(load_hf_directory(dir.path()).digest(), hybrid_weights().digest());
  ModelWeights changed = hybrid_weights();
  changed.config.mamba.dt_max = 3.0f;
  EXPECT_NE(changed.digest(), hybrid_weights().digest());
}

struct ConfigRefusal {
  std::string what;
  std::function<void(nlohmann::json&)> edit;
  std::string message;
};

class HybridConfigRefusal : public ::testing::TestWithParam<ConfigRefusal> {};

TEST_P(HybridConfigRefusal, NamesTheKey) {
  nlohmann::json config = testing::hybrid_config_json();
  GetParam().edit(config);
  EXPECT_THAT([&] { model_config_from_hf_json(config.dump(), "bamba-test"); },
              ThrowsMessage<Error>(HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Keys, HybridConfigRefusal,
    ::testing::Values(
        ConfigRefusal{"unknown", [](auto& j) { j["mamba_rmsnorm"] = true; },
                      "key 'mamba_rmsnorm' is not supported for BambaForCausalLM"},
        ConfigRefusal{"index_range", [](auto& j) { j["attn_layer_indices"] = {4}; },
                      "'attn_layer_indices'[0] = 4 is outside [0, num_hidden_layers = 4)"},
        ConfigRefusal{"index_twice", [](auto& j) { j["attn_layer_indices"] = {1, 1}; },
                      "'attn_layer_indices' names layer 1 twice"},
        ConfigRefusal{"proj_bias", [](auto& j) { j["mamba_proj_bias"] = true; },
                      "'mamba_proj_bias': true is not supported"},
        ConfigRefusal{"mlp_bias", [](auto& j) { j["mlp_bias"] = true; },
                      "'mlp_bias': true is not supported"},
        ConfigRefusal{"heads", [](auto& j) { j["mamba_n_heads"] = 7; },
                      "'mamba_n_heads' 7 does not divide mamba_expand · hidden_size = 128"},
        ConfigRefusal{"head_dim", [](auto& j) { j["mamba_d_head"] = 8; },
                      "'mamba_d_head' 8 times mamba_n_heads 8 is not mamba_expand"},
        ConfigRefusal{"groups", [](auto& j) { j["mamba_n_groups"] = 3; },
                      "mamba heads_count 8 is not a multiple of groups_count 3"},
        ConfigRefusal{"limit_null", [](auto& j) { j["time_step_limit"] = nullptr; },
                      "'time_step_limit' must be a list [min, max], got null"},
        ConfigRefusal{"limit_order", [](auto& j) { j["time_step_limit"] = {1.0, 0.5}; },
                      "mamba time-step limit [1, 0.5] must satisfy 0 <= min <= max"},
        ConfigRefusal{"partial_rotary_top_level", [](auto& j) { j["partial_rotary_factor"] = 0.25; },
                      "'partial_rotary_factor' 0.25 is not supported for BambaForCausalLM: "
                      "transformers' BambaConfig replaces it with 0.5"},
        ConfigRefusal{"partial_rotary_zero",
                      [](auto& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.0; },
                      "'rope_parameters.partial_rotary_factor' 0.0 is outside (0, 1]"},
        ConfigRefusal{"partial_rotary_above_one",
                      [](auto& j) { j["rope_parameters"]["partial_rotary_factor"] = 1.5; },
                      "'rope_parameters.partial_rotary_factor' 1.5 is outside (0, 1]"},
        ConfigRefusal{"partial_rotary_string",
                      [](auto& j) { j["rope_parameters"]["partial_rotary_factor"] = "0.5"; },
                      "'rope_parameters.partial_rotary_factor' must be a number"},
        ConfigRefusal{"partial_rotary_odd",  // int(16 · 0.1875) = 3
                      [](auto& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.1875; },
                      "rotates int(head_dim 16 · factor) = 3 dims of each head; RoPE needs an "
                      "even count >= 2"},
        ConfigRefusal{"partial_rotary_none",  // int(16 · 0.1) = 1
                      [](auto& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.1; },
                      "= 1 dims of each head; RoPE needs an even count >= 2"},
        ConfigRefusal{"rope_type", [](auto& j) {
                        j["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 1e4},
                                                {"factor", 2.0}};
                      }, "'rope_parameters.rope_type' \"linear\" is not supported for "
                         "BambaForCausalLM"},
        ConfigRefusal{"expand", [](auto& j) { j["mamba_expand"] = 1.5; },
                      "'mamba_expand' must be an integer"}),
    [](const auto& param_info) { return param_info.param.what; });

// The rotated part of each head, as transformers decides it: int(head_dim ·
// rope_parameters.partial_rotary_factor), BambaConfig's 0.5 when the config gives none, the
// product truncated in double as Python's int() does (20 · 0.7 is 14.0 in double but 13.99... with
// the factor in fp32, which would truncate to 13).
TEST(HybridLoad, PartialRotaryFactorDecidesTheRotatedDims) {
  auto rotary_dim_for = [](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json config = testing::hybrid_config_json();
    edit(config);
    return model_config_from_hf_json(config.dump(), "bamba-test").rotary_dim();
  };
  EXPECT_EQ(rotary_dim_for([](auto&) {}), 8);
  EXPECT_EQ(rotary_dim_for([](auto& j) {
              j.erase("partial_rotary_factor");
              j["rope_parameters"].erase("partial_rotary_factor");
            }), 8);
  EXPECT_EQ(rotary_dim_for([](auto& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.25; }), 4);
  EXPECT_EQ(rotary_dim_for([](auto& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.3; }), 4);
  EXPECT_EQ(rotary_dim_for([](auto& j) { j["rope_parameters"]["partial_rotary_factor"] = 1.0; }), 16);
  EXPECT_EQ(model_config_from_hf_json(
                [] {
                  nlohmann::json j = testing::hybrid_config_json();
                  j["rope_parameters"]["partial_rotary_factor"] = 1.0;
                  return j.dump();
                }(),
                "bamba-test").partial_rotary_dim, 0);  // the one spelling of "the whole head"
  EXPECT_EQ(rotary_dim_for([](auto& j) {
              j["hidden_size"] = 80, j["num_attention_heads"] = 4;  // head_dim 20
              j["mamba_d_head"] = 20;
              j["rope_parameters"]["partial_rotary_factor"] = 0.7;
            }), 14);
}

// The layer table decides which tensors each layer reads: a layer the config calls Mamba needs
// the mixer's tensors, and a tensor the config does not use (a conv bias with mamba_conv_bias
// false) fails the load by name.
TEST(HybridLoad, TheLayerTableDecidesTheTensorsAndNoneIsIgnored) {
  const testing::ScratchDir dir;
  testing::write_hybrid_checkpoint(dir.path());
  nlohmann::json config = testing::hybrid_config_json();
  config["attn_layer_indices"] = nlohmann::json::array();
  std::ofstream(dir.file("config.json")) << config.dump();
  EXPECT_THAT([&] { load_hf_directory(dir.path()); },
              ThrowsMessage<Error>(HasSubstr("tensor 'model.layers.1.mamba.in_proj.weight' not "
                                             "found")));
  config = testing::hybrid_config_json();
  config["mamba_conv_bias"] = false;
  std::ofstream(dir.file("config.json")) << config.dump();
  EXPECT_THAT([&] { load_hf_directory(dir.path()); },
              ThrowsMessage<Error>(HasSubstr("tensor 'model.layers.0.mamba.conv1d.bias' in "
                                             "model.safetensors is not used by a "
                                             "BambaForCausalLM")));
}

// `tiny-hybrid`'s seeded weights follow core/ops/seeded_weights.h: a Mamba layer holds the mixer
// tensors at 3 + 14·L + 8·l + k and no attention tensors, an attention layer the reverse; the
// checkpoint-loaded config takes seeded weights too.
TEST(HybridLoad, SeededWeightsFollowTheDocumentedLayout) {
  const ModelWeights w = weights_from_seed(model_config_named("tiny-hybrid"), 5);
  EXPECT_NO_THROW(w.validate());
  ASSERT_EQ(w.config.layers_count, 3);
  EXPECT_TRUE(w.layers[0].wq.empty());
  EXPECT_TRUE(w.layers[1].in_proj.empty());
  EXPECT_EQ(w.layers[1].wq.size(), size_t{64 * 64});
  const uint32_t layers = 3;
  // Layer 2's in_proj [4·16 + (64 + 2·2·8) + 4, 64]: linear weights of 64 inputs.
  const uint32_t in_proj = 3 + 14 * layers + 8 * 2 + 0;
  ASSERT_EQ(w.layers[2].in_proj.size(), size_t{164 * 64});
  for (const int64_t i : {int64_t{0}, int64_t{77}, int64_t{164 * 64 - 1}}) {
    EXPECT_EQ(w.layers[2].in_proj[static_cast<size_t>(i)],
              ops::seeded_value(5, in_proj, i, 0.0f, 0.125f)) << i;
  }
  // Layer 0's a_log: 0.5 + (2u − 1)/2, so A = −exp(a_log) is in (−e, −1].
  const uint32_t a_log = 3 + 14 * layers + 8 * 0 + 4;
  ASSERT_EQ(w.layers[0].a_log.size(), size_t{4});
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(w.layers[0].a_log[static_cast<size_t>(i)], ops::seeded_value(5, a_log, i, 0.5f, 0.5f));
  }
  EXPECT_NE(w.layers[0].in_proj, w.layers[2].in_proj);  // distinct indices, distinct values
  EXPECT_NE(w.digest(), weights_from_seed(model_config_named("tiny-hybrid"), 6).digest());
  EXPECT_NO_THROW(weights_from_seed(hybrid_weights().config, 1).validate());
}

TEST(HybridLoad, UnsupportedBackendsRefuseClearly) {
  ExecutorConfig no_slots = hybrid_config();
  no_slots.mamba_slots_count = 0;
  EXPECT_THAT([&] { CpuBackend(hybrid_weights(), no_slots); },
              ThrowsMessage<Error>(HasSubstr("mamba_slots_count is 0")));
  ExecutorConfig spec = hybrid_config();
  spec.verify_width = 2;  // served: verify-state slots (tests/hybrid_spec_test.cpp)
  EXPECT_NO_THROW(CpuBackend(hybrid_weights(), spec));
  EXPECT_THAT([&] { CpuBackend(hybrid_weights(), hybrid_config(), nullptr, false, nullptr, 2); },
              ThrowsMessage<Error>(HasSubstr("tensor parallelism is not implemented")));
}

// ---- Forward-op fields ---------------------------------------------------------------------

ForwardOp two_prefills() {
  ForwardOp op;
  op.rows.push_back(prefill_row(1, 1, 0, 4, 4));
  op.rows.push_back(prefill_row(2, 2, 0, 4, 4));
  op.rows[0].mamba_working = 0;  // slot 0 is a real slot
  op.rows[1].mamba_working = 3;
  op.prefill_token_ids.assign(8, 5);
  return op;
}

ForwardOp two_decodes() {
  ForwardOp op;
  op.rows.push_back(decode_row(1, 1));
  op.rows.push_back(decode_row(2, 2));
  op.rows[0].mamba_working = 0;
  op.rows[1].mamba_working = 3;
  return op;
}

struct FieldRefusal {
  std::string what;
  bool decode;  // edit two_decodes() rather than two_prefills()
  std::function<void(ForwardOp&)> edit;
  std::string message;
};

class MambaFieldRefusal : public ::testing::TestWithParam<FieldRefusal> {};

TEST_P(MambaFieldRefusal, NamesTheFieldAndTheRow) {
  const ExecutorConfig c = hybrid_config();
  ForwardOp op = GetParam().decode ? two_decodes() : two_prefills();
  EXPECT_NO_THROW(validate_forward_op(op, c, kVocab, /*recurrent_state=*/true));
  GetParam().edit(op);
  EXPECT_THAT([&] { validate_forward_op(op, c, kVocab, /*recurrent_state=*/true); },
              ThrowsMessage<Error>(HasSubstr(GetParam().message)));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, MambaFieldRefusal,
    ::testing::Values(
        FieldRefusal{"working_missing", false, [](ForwardOp& op) { op.rows[1].mamba_working = -1; },
                     "row 1 (request 2, prefill): mamba_working_index is -1, but the model has "
                     "Mamba layers"},
        FieldRefusal{"working_range", false, [](ForwardOp& op) { op.rows[1].mamba_working = 12; },
                     "mamba_working_index 12 is outside [0, mamba_slots_count = 12)"},
        FieldRefusal{"working_negative", false,
                     [](ForwardOp& op) { op.rows[0].mamba_working = -2; },
                     "row 0 (request 1, prefill): mamba_working_index -2 is outside"},
        FieldRefusal{"working_shared", false, [](ForwardOp& op) { op.rows[1].mamba_working = 0; },
                     "mamba_working_index 0 is written by an earlier row of the same op (two live "
                     "requests would share a state)"},
        FieldRefusal{"dst_range", true,
                     [](ForwardOp& op) { op.rows[0].mamba_checkpoint_dst = 99; },
                     "mamba_checkpoint_dst_index 99 is outside [0, mamba_slots_count = 12)"},
        FieldRefusal{"dst_is_other_working", true,
                     [](ForwardOp& op) { op.rows[1].mamba_checkpoint_dst = 0; },
                     "row 1 (request 2, decode): mamba_checkpoint_dst_index 0 is written by an "
                     "earlier row"},
        FieldRefusal{"dst_mid_page_prefill", false,
                     [](ForwardOp& op) {
                       op.rows[0].input_length = 3, op.rows[0].prompt_length = 3;
                       op.prefill_token_ids.pop_back();
                       op.rows[0].mamba_checkpoint_dst = 7;
                     },
                     "row 0 (request 1, prefill): mamba_checkpoint_dst_index 7 on a prefill chunk "
                     "that ends at 3, inside a page (page_size 4)"},
        FieldRefusal{"dst_decode_row_in_mixed_step", false,
                     [](ForwardOp& op) {
                       op.rows.push_back(decode_row(3, 4));
                       op.rows.back().mamba_working = 5, op.rows.back().mamba_checkpoint_dst = 7;
                     },
                     "row 2 (request 3, decode): mamba_checkpoint_dst_index 7 on a decode row in a "
                     "step with prefill rows: decode rows snapshot in DECODE steps only"},
        FieldRefusal{"cow_range", false, [](ForwardOp& op) { op.rows[0].mamba_cow_src = 12; },
                     "mamba_cow_src_index 12 is outside"},
        FieldRefusal{"cow_self", false,
                     [](ForwardOp& op) {
                       op.rows[0].mamba_cow_src = 0, op.rows[0].mamba_branching_seqlen = 0;
                     },
                     "mamba_cow_src_index 0 is the row's own working slot"},
        FieldRefusal{"cow_without_length", false,
                     [](ForwardOp& op) { op.rows[0].mamba_cow_src = 5; },
                     "mamba_cow_src_index 5 and mamba_branching_seqlen -1 must be -1 together"},
        FieldRefusal{"length_without_cow", false,
                     [](ForwardOp& op) { op.rows[0].mamba_branching_seqlen = 0; },
                     "mamba_cow_src_index -1 and mamba_branching_seqlen 0 must be -1 together"},
        FieldRefusal{"length_not_prefix", false,
                     [](ForwardOp& op) {
                       op.rows[0].mamba_cow_src = 5, op.rows[0].mamba_branching_seqlen = 3;
                     },
                     "mamba_branching_seqlen 3 differs from the prefix_length 0"},
        FieldRefusal{"cow_on_live_decode", true,
                     [](ForwardOp& op) {
                       op.rows[0].mamba_cow_src = 5, op.rows[0].mamba_branching_seqlen = 3;
                     },
                     "mamba_cow_src_index 5 on a decode row that is not recovering"}),
    [](const auto& param_info) { return param_info.param.what; });

TEST(MambaFields, AModelWithoutMambaLayersRefusesEveryField) {
  const ExecutorConfig c = hybrid_config();
  ForwardOp op = two_prefills();
  EXPECT_THAT([&] { validate_forward_op(op, c, kVocab, /*recurrent_state=*/false); },
              ThrowsMessage<Error>(HasSubstr("the model has no Mamba layers, so the mamba fields "
                                             "must be -1 (working 0,")));
  for (int32_t OpRow::*field : {&OpRow::mamba_checkpoint_dst, &OpRow::mamba_cow_src,
                      &OpRow::mamba_branching_seqlen}) {
    ForwardOp one = two_prefills();
    for (OpRow& row : one.rows) row.mamba_working = -1;
    one.rows[0].*field = 2;
    EXPECT_THROW(validate_forward_op(one, c, kVocab, false), Error);
  }
}

// A recovered decode row may copy its state in, branching at its recovered KV length; a
// checkpoint may be the row's own working slot (no copy then).
TEST(MambaFields, ValidCombinationsAreAccepted) {
  const ExecutorConfig c = hybrid_config();
  ForwardOp op = two_decodes();
  op.rows[0].hist_token_length = 9, op.rows[0].decode_override = 4;
  op.rows[0].mamba_cow_src = 7, op.rows[0].mamba_branching_seqlen = 9;
  op.rows[1].mamba_checkpoint_dst = 3;
  EXPECT_NO_THROW(validate_forward_op(op, c, kVocab, true));
  ForwardOp prefill = two_prefills();  // chunks that end a page (P = 4) may checkpoint
  prefill.rows[0].mamba_checkpoint_dst = 7, prefill.rows[1].mamba_checkpoint_dst = 8;
  EXPECT_NO_THROW(validate_forward_op(prefill, c, kVocab, true));
}

// ---- The CPU reference ---------------------------------------------------------------------

constexpr RequestId kSubject = 42;
constexpr int32_t kPrompt = 37;  // crosses nine pages of 4
constexpr int32_t kDecodeSteps = 10;

struct SubjectRun {
  std::vector<std::vector<float>> logits;  // the last prefill chunk's, then each decode step's
  std::vector<int32_t> tokens;
  std::vector<float> state;                // the working slot at the end
};

// Prefills the subject in `chunks` on pool row `row` and working slot `slot`, then decodes.
// `companion`: a second request prefilled and decoded beside it in every step (its rows after
// the subject's), or none.
SubjectRun run_subject(const std::vector<int32_t>& chunks, int32_t row, int32_t slot,
                bool companion = false) {
  HybridHarness h;
  const std::vector<int32_t> prompt = prompt_for(kSubject, kPrompt);
  const std::vector<int32_t> other = prompt_for(7, kPrompt);
  SubjectRun run;
  int32_t prefix = 0;
  for (const int32_t chunk : chunks) {
    ForwardOp op;
    op.rows.push_back(prefill_row(kSubject, row, prefix, chunk, kPrompt));
    op.rows[0].mamba_working = slot;
    op.prefill_token_ids.assign(prompt.begin() + prefix, prompt.begin() + prefix + chunk);
    if (companion) {
      op.rows.push_back(prefill_row(7, 5, prefix, chunk, kPrompt));
      op.rows[1].mamba_working = 9;
      op.prefill_token_ids.insert(op.prefill_token_ids.end(), other.begin() + prefix,
                                  other.begin() + prefix + chunk);
    }
    if (prefix == 0) {
      op.rows[0].refresh = {0, pages_from(20, 14)};
      op.rows[0].sampling = SamplingParams{};
      if (companion) op.rows[1].refresh = {0, pages_from(60, 14)}, op.rows[1].sampling = SamplingParams{};
    }
    const StepResult r = h.executor.step(op);
    prefix += chunk;
    if (prefix == kPrompt) run.logits.push_back(row_logits(r, 0)), run.tokens.push_back(r.tokens[0]);
  }
  ForwardOp decode;
  decode.rows.push_back(decode_row(kSubject, row));
  decode.rows[0].mamba_working = slot;
  if (companion) decode.rows.push_back(decode_row(7, 5)), decode.rows[1].mamba_working = 9;
  for (int32_t s = 0; s < kDecodeSteps; ++s) {
    const StepResult r = h.executor.step(decode);
    run.logits.push_back(row_logits(r, 0));
    run.tokens.push_back(r.tokens[0]);
  }
  run.state = h.backend.read_mamba_state(slot);
  return run;
}

bool same_run(const SubjectRun& a, const SubjectRun& b) {
  if (a.logits.size() != b.logits.size() || a.tokens != b.tokens) return false;
  for (size_t i = 0; i < a.logits.size(); ++i) {
    if (!same_bits(a.logits[i], b.logits[i])) return false;
  }
  return same_bits(a.state, b.state);
}

TEST(HybridCpu, PrefillTokenByTokenInChunksOrWholeIsBitIdentical) {
  const SubjectRun whole = run_subject({kPrompt}, 1, 0);
  ASSERT_EQ(whole.logits.size(), size_t{kDecodeSteps + 1});
  EXPECT_GT(norm_of(whole.logits[0]), 0.0);
  EXPECT_GT(norm_of(whole.state), 0.0);
  std::vector<int32_t> ones(kPrompt, 1);
  EXPECT_TRUE(same_run(whole, run_subject(ones, 1, 0))) << "token by token";
  EXPECT_TRUE(same_run(whole, run_subject({4, 4, 29}, 1, 0))) << "page-sized chunks";
  EXPECT_TRUE(same_run(whole, run_subject({1, 13, 23}, 1, 0))) << "odd chunks";
}

TEST(HybridCpu, ARequestAloneEqualsItselfCoBatchedOnAnotherRowAndSlot) {
  const SubjectRun alone = run_subject({kPrompt}, 1, 0);
  EXPECT_TRUE(same_run(alone, run_subject({kPrompt}, 3, 11)));
  EXPECT_TRUE(same_run(alone, run_subject({kPrompt}, 1, 0, /*companion=*/true)));
  EXPECT_TRUE(same_run(alone, run_subject({10, 27}, 2, 4, /*companion=*/true)));
}

// The greedy tokens are not degenerate (the model varies its output): a weak oracle otherwise.
TEST(HybridCpu, TheTinyModelIsNotDegenerate) {
  const SubjectRun run = run_subject({kPrompt}, 1, 0);
  std::set<int32_t> distinct(run.tokens.begin(), run.tokens.end());
  EXPECT_GE(distinct.size(), size_t{4}) << ::testing::PrintToString(run.tokens);
}

// A request's first chunk zeroes its working slot, so a slot left dirty by an earlier request
// changes nothing; the dirt is real (the earlier request's state is non-zero), so without the
// zeroing the later request's logits would differ (the SSM state enters every token's output).
TEST(HybridCpu, TheFirstChunkZeroesAReusedWorkingSlot) {
  HybridHarness h;
  const std::vector<int32_t> first = prompt_for(3, 20);
  ForwardOp a;
  a.rows.push_back(prefill_row(3, 1, 0, 20, 20));
  a.rows[0].mamba_working = 0, a.rows[0].refresh = {0, pages_from(80, 6)};
  a.rows[0].sampling = SamplingParams{};
  a.prefill_token_ids = first;
  h.executor.step(a);
  ASSERT_GT(norm_of(h.backend.read_mamba_state(0)), 0.0);
  const std::vector<int32_t> prompt = prompt_for(kSubject, kPrompt);
  ForwardOp b;
  b.rows.push_back(prefill_row(kSubject, 1, 0, kPrompt, kPrompt));
  b.rows[0].mamba_working = 0, b.rows[0].refresh = {0, pages_from(20, 14)};
  b.rows[0].sampling = SamplingParams{};
  b.prefill_token_ids = prompt;
  const StepResult reused = h.executor.step(b);
  const std::vector<float> fresh = run_subject({kPrompt}, 1, 0).logits[0];
  EXPECT_TRUE(same_bits(row_logits(reused, 0), fresh));
  // The same prompt starting from the dirty state instead (copied in, so not zeroed) differs.
  ForwardOp dirty = b;
  dirty.rows[0].request_id = 43, dirty.rows[0].pool_row = 2, dirty.rows[0].mamba_working = 4;
  dirty.rows[0].mamba_cow_src = 0, dirty.rows[0].mamba_branching_seqlen = 0;
  dirty.rows[0].refresh = {0, pages_from(40, 14)};
  h.backend.apply_state_rules(StepPlan{});  // nothing planned: nothing changes
  ASSERT_GT(norm_of(h.backend.read_mamba_state(0)), 0.0);
  EXPECT_FALSE(same_bits(row_logits(h.executor.step(dirty), 0), fresh));
}

// DECODE steps copy working → checkpoint exactly when the new vcl ends a page (P = 4), never in a
// step with prefill rows; the checkpoint then holds the working state of that moment.
TEST(HybridCpu, DecodeStepsCheckpointAtPageBoundariesOnly) {
  HybridHarness h;
  const std::vector<int32_t> prompt = prompt_for(kSubject, 9);
  ForwardOp prefill;
  prefill.rows.push_back(prefill_row(kSubject, 1, 0, 9, 9));
  prefill.rows[0].mamba_working = 2, prefill.rows[0].refresh = {0, pages_from(20, 14)};
  prefill.rows[0].sampling = SamplingParams{};
  prefill.prefill_token_ids = prompt;
  h.executor.step(prefill);  // vcl 9
  ForwardOp decode;
  decode.rows.push_back(decode_row(kSubject, 1));
  decode.rows[0].mamba_working = 2, decode.rows[0].mamba_checkpoint_dst = 6;
  const std::vector<float> zeros(h.backend.read_mamba_state(6).size(), 0.0f);
  for (int32_t vcl = 10; vcl <= 17; ++vcl) {
    const std::vector<float> before = h.backend.read_mamba_state(6);
    h.executor.step(decode);
    const std::vector<float> checkpoint = h.backend.read_mamba_state(6);
    if (vcl % 4 == 0) {
      EXPECT_TRUE(same_bits(checkpoint, h.backend.read_mamba_state(2))) << "vcl " << vcl;
      EXPECT_FALSE(same_bits(checkpoint, before)) << "vcl " << vcl;
    } else {
      EXPECT_TRUE(same_bits(checkpoint, before)) << "vcl " << vcl << ": copied off a boundary";
    }
    if (vcl < 12) {
      EXPECT_TRUE(same_bits(checkpoint, zeros)) << "vcl " << vcl;
    }
  }
}

// Copy-on-write: a request that shares the subject's first 8 tokens (two full pages: the KV pages
// shared, the state copied from the subject's checkpoint at vcl 8) and prefills only the rest
// computes the same logits, bit for bit, as the subject prefilling the whole prompt itself.
TEST(HybridCpu, CopyOnWriteFromACheckpointResumesTheSharedPrefix) {
  HybridHarness h;
  const std::vector<int32_t> prompt = prompt_for(kSubject, kPrompt);
  ForwardOp prefix;
  prefix.rows.push_back(prefill_row(1, 1, 0, 7, 7));
  prefix.rows[0].mamba_working = 0, prefix.rows[0].refresh = {0, pages_from(20, 14)};
  prefix.rows[0].sampling = SamplingParams{};
  prefix.prefill_token_ids.assign(prompt.begin(), prompt.begin() + 7);
  const StepResult first = h.executor.step(prefix);  // vcl 7; the sampled token is fed next
  ForwardOp decode;
  decode.rows.push_back(decode_row(1, 1));
  decode.rows[0].mamba_working = 0, decode.rows[0].mamba_checkpoint_dst = 8;
  decode.rows[0].decode_override = prompt[7];  // teacher-force the prompt's 8th token
  h.executor.step(decode);                     // vcl 8: a page boundary, checkpoint in slot 8
  (void)first;
  ForwardOp branch;
  branch.rows.push_back(prefill_row(kSubject, 2, 8, kPrompt - 8, kPrompt));
  OpRow& row = branch.rows[0];
  row.mamba_working = 5, row.mamba_cow_src = 8, row.mamba_branching_seqlen = 8;
  std::vector<int32_t> pages = pages_from(20, 2);  // the shared prefix's pages
  const std::vector<int32_t> rest = pages_from(40, 12);
  pages.insert(pages.end(), rest.begin(), rest.end());
  row.refresh = {0, pages};
  row.sampling = SamplingParams{};
  branch.prefill_token_ids.assign(prompt.begin() + 8, prompt.end());
  const StepResult r = h.executor.step(branch);
  EXPECT_TRUE(same_bits(row_logits(r, 0), run_subject({kPrompt}, 1, 0).logits[0]));
}

// A prefill chunk that ends a page snapshots the working state into its checkpoint slot after the
// step (the prefix cache's checkpoints at page-aligned chunk ends); a later chunk leaves it alone.
TEST(HybridCpu, APrefillChunkThatEndsAPageCheckpointsItsState) {
  HybridHarness h;
  const std::vector<int32_t> prompt = prompt_for(kSubject, kPrompt);
  ForwardOp first;
  first.rows.push_back(prefill_row(kSubject, 1, 0, 8, kPrompt));
  first.rows[0].mamba_working = 2, first.rows[0].mamba_checkpoint_dst = 9;
  first.rows[0].refresh = {0, pages_from(20, 14)}, first.rows[0].sampling = SamplingParams{};
  first.prefill_token_ids.assign(prompt.begin(), prompt.begin() + 8);
  h.executor.step(first);
  const std::vector<float> at_8 = h.backend.read_mamba_state(2);
  EXPECT_GT(norm_of(at_8), 0.0);
  EXPECT_TRUE(same_bits(h.backend.read_mamba_state(9), at_8));
  ForwardOp rest;
  rest.rows.push_back(prefill_row(kSubject, 1, 8, kPrompt - 8, kPrompt));
  rest.rows[0].mamba_working = 2;
  rest.prefill_token_ids.assign(prompt.begin() + 8, prompt.end());
  h.executor.step(rest);
  EXPECT_FALSE(same_bits(h.backend.read_mamba_state(2), at_8));
  EXPECT_TRUE(same_bits(h.backend.read_mamba_state(9), at_8));
}

// Retraction by swap on the CPU reference: a cache op with a state slot copies that slot's state
// into the host state of its first host page, and a swap-in copies it back into another slot,
// bit for bit.
TEST(HybridCpu, ASwapCarriesTheStateOutWithThePagesAndBackIn) {
  ExecutorConfig c = hybrid_config();
  c.host_pages_count = 6;
  HybridHarness h(c);
  const std::vector<int32_t> prompt = prompt_for(kSubject, 9);
  ForwardOp prefill;
  prefill.rows.push_back(prefill_row(kSubject, 1, 0, 9, 9));
  prefill.rows[0].mamba_working = 2, prefill.rows[0].refresh = {0, pages_from(20, 4)};
  prefill.rows[0].sampling = SamplingParams{};
  prefill.prefill_token_ids = prompt;
  h.executor.step(prefill);
  const std::vector<float> state = h.backend.read_mamba_state(2);
  ASSERT_GT(norm_of(state), 0.0);
  h.executor.copy_pages(CacheOp{.kind = CacheOpKind::kSwapOut, .device_pages = {20, 21, 22},
                                .host_pages = {4, 1, 2}, .state_slot = 2});
  h.backend.apply_state_rules([] {
    StepPlan plan;
    plan.mamba_zeroes = {2};  // the slot goes to another request, which zeroes it
    return plan;
  }());
  ASSERT_EQ(norm_of(h.backend.read_mamba_state(2)), 0.0);
  h.executor.copy_pages(CacheOp{.kind = CacheOpKind::kSwapIn, .device_pages = {30, 31, 32},
                                .host_pages = {4, 1, 2}, .state_slot = 7});
  EXPECT_TRUE(same_bits(h.backend.read_mamba_state(7), state));
  EXPECT_EQ(norm_of(h.backend.read_mamba_state(2)), 0.0);
}

TEST(HybridCpu, CacheOpStateSlotsAreValidated) {
  ExecutorConfig c = hybrid_config();
  c.host_pages_count = 6;
  HybridHarness h(c);
  const auto refused = [&](CacheOp op, const std::string& message) {
    EXPECT_THAT([&] { h.executor.copy_pages(op); }, ThrowsMessage<Error>(HasSubstr(message)));
  };
  refused({.device_pages = {20}, .host_pages = {0}, .state_slot = 12},
          "cache op swap_out: state_slot 12 is outside [0, mamba_slots_count = 12)");
  refused({.device_pages = {20}, .host_pages = {0}, .state_slot = -2}, "state_slot -2 is outside");
  refused({.kind = CacheOpKind::kSwapIn, .state_slot = 3},
          "cache op swap_in: state_slot 3 with no pages: the state travels with the first host page");
  // A recording executor takes a state swap too: the trace's CacheOp carries the slot.
  CpuBackend recording_backend(hybrid_weights(), c);
  Executor recording(c, kVocab, recording_backend, ExecutorOptions{.record = true});
  EXPECT_NO_THROW(recording.copy_pages({.device_pages = {20}, .host_pages = {0}, .state_slot = 3}));
  ExecutorConfig plain_config = testing::small_config();
  plain_config.host_pages_count = 2;
  testing::Harness plain(plain_config);  // the tiny model: no Mamba layers
  EXPECT_THAT([&] { plain.executor.copy_pages({.device_pages = {20}, .host_pages = {0}, .state_slot = 0}); },
              ThrowsMessage<Error>(HasSubstr("state_slot 0 but the model has no Mamba layers")));
}

// ---- Serving end to end ----------------------------------------------------------------------

std::map<RequestId, std::vector<int32_t>> serve(const std::vector<RequestSpec>& requests,
                                                int32_t max_batch_rows, int32_t pages_count,
                                                int32_t context_length = 64) {
  ExecutorConfig limits = hybrid_config();
  limits.context_length = context_length;
  limits.max_batch_rows = max_batch_rows;
  limits.pages_count = pages_count;
  limits.prefill_chunk_tokens = 24;
  limits.mamba_slots_count = max_batch_rows;
  const SchedulerConfig sc = scheduler_config_for_model(limits, hybrid_weights().config);
  EXPECT_TRUE(sc.recurrent_state);
  EXPECT_FALSE(sc.prefix_cache);
  Scheduler scheduler(sc);
  for (const RequestSpec& r : requests) scheduler.submit(r, kVocab);
  CpuBackend backend(hybrid_weights(), executor_config_for(sc));
  Executor executor(executor_config_for(sc), kVocab, backend);
  run_serving_loop(scheduler, executor, ServingLoopOptions{});
  std::map<RequestId, std::vector<int32_t>> tokens;
  for (const RequestSpec& r : requests) tokens[r.id] = scheduler.outcomes().at(r.id).tokens;
  return tokens;
}

// Through the scheduler (one working slot per live request, freed at finish; chunked prefill;
// page pressure that retracts and recomputes): each request's tokens equal its tokens served
// alone.
TEST(HybridServing, EachRequestsTokensEqualItsTokensServedAlone) {
  std::vector<RequestSpec> requests;
  for (RequestId id = 1; id <= 6; ++id) {
    requests.push_back(RequestSpec{.id = id, .prompt = prompt_for(id, 9 + 7 * static_cast<int32_t>(id)),
                                   .max_new_tokens = 12});
  }
  const auto together = serve(requests, 3, 30);  // 3 rows, 29 pages of 4: requests wait, retract
  for (const RequestSpec& r : requests) {
    const auto alone = serve({r}, 1, 40);
    EXPECT_EQ(together.at(r.id), alone.at(r.id)) << "request " << r.id;
    EXPECT_EQ(together.at(r.id).size(), size_t{12});
  }
}

TEST(HybridServing, TheSchedulerRefusesWhatTheStatePoolCannotServe) {
  ExecutorConfig limits = hybrid_config();  // B 8, 12 slots
  SchedulerConfig sc = scheduler_config_for_model(limits, hybrid_weights().config);
  EXPECT_TRUE(sc.prefix_cache);  // 4 slots past the working ones: checkpoints
  EXPECT_NO_THROW(Scheduler{sc});
  sc.mamba_slots_count = sc.max_batch_rows - 1;
  EXPECT_THAT([&] { Scheduler s(sc); }, ThrowsMessage<Error>(HasSubstr("mamba_slots_count 7 is "
                                                                      "below max_batch_rows")));
  limits.mamba_slots_count = limits.max_batch_rows;
  sc = scheduler_config_for_model(limits, hybrid_weights().config);
  EXPECT_FALSE(sc.prefix_cache);  // no slot for a checkpoint
  sc.prefix_cache = true;
  EXPECT_THAT([&] { Scheduler s(sc); },
              ThrowsMessage<Error>(HasSubstr("prefix_cache with recurrent state (Mamba layers) "
                                             "needs checkpoint slots, but mamba_slots_count 8 "
                                             "leaves none past the max_batch_rows B = 8")));
  sc.prefix_cache = false;
  sc.host_pages_count = 4;
  EXPECT_NO_THROW(Scheduler{sc});  // retraction by swap carries the state
  sc.verify_width = 2;
  EXPECT_THAT([&] { Scheduler s(sc); },
              ThrowsMessage<Error>(HasSubstr("verify_width 2 with recurrent state (Mamba layers) "
                                             "and host_pages_count 4 > 0 (retraction by swap): "
                                             "speculative decoding with swapped recurrent states "
                                             "is not implemented")));
  sc.host_pages_count = 0;
  EXPECT_NO_THROW(Scheduler{sc});
  sc.prefix_cache = true, sc.mamba_slots_count = sc.max_batch_rows + 4;
  EXPECT_NO_THROW(Scheduler{sc});  // checkpoints by the rule with a drafter
}

// Requests sharing a 26-token prefix, two rows, so the later ones start after the earlier ones
// cached their pages: with the prefix cache (checkpoints at the page-aligned chunk ends 12 and 24,
// and slots enough that no checkpoint is taken back) they hit at 24, and every request's greedy
// tokens and every logits row both runs computed are the same bits as without it.
TEST(HybridServing, APrefixHitGivesTheSameTokensAndLogitsBits) {
  const std::vector<int32_t> shared = prompt_for(90, 26);
  std::vector<RequestSpec> requests;
  for (RequestId id = 1; id <= 5; ++id) {
    RequestSpec r{.id = id, .prompt = shared, .max_new_tokens = 8};
    const std::vector<int32_t> suffix = prompt_for(id, 3 * static_cast<int32_t>(id));
    r.prompt.insert(r.prompt.end(), suffix.begin(), suffix.end());
    requests.push_back(std::move(r));
  }
  prefix_props::HybridWorld world{.max_batch_rows = 2, .page_size = 4, .pages_count = 80,
                                  .prefill_chunk_tokens = 12, .checkpoint_slots = 24};
  const prefix_props::ServedRun cached = prefix_props::serve(world, requests);
  world.prefix_cache = false;
  const prefix_props::ServedRun plain = prefix_props::serve(world, requests);
  EXPECT_GE(cached.prefix_hit_tokens, 3 * 24) << "requests 3 to 5 hit the shared 24 (6 pages)";
  EXPECT_EQ(plain.prefix_hit_tokens, 0);
  EXPECT_EQ(prefix_props::compare_runs(cached, plain, requests), "");
  for (const RequestSpec& r : requests) EXPECT_EQ(cached.tokens.at(r.id).size(), size_t{8});
}

// The same requests under page pressure that retracts — by swap (the working state copied out with
// the pages and back in), by recompute, and with room enough that nothing retracts — give the same
// tokens and logits bits; also with the prefix cache on, overlap off, and both.
TEST(HybridServing, SwapRecomputeAndNoRetractionGiveTheSameTokensAndLogitsBits) {
  std::vector<RequestSpec> requests;
  for (RequestId id = 1; id <= 5; ++id) {
    requests.push_back(RequestSpec{.id = id, .prompt = prompt_for(id, 9 + 5 * static_cast<int32_t>(id)),
                                   .max_new_tokens = 14});
  }
  const prefix_props::HybridWorld tight{.max_batch_rows = 3, .page_size = 4, .pages_count = 20,
                                        .prefill_chunk_tokens = 16, .checkpoint_slots = 4,
                                        .prefix_cache = false};
  prefix_props::HybridWorld roomy = tight;
  roomy.pages_count = 80;
  const prefix_props::ServedRun none = prefix_props::serve(roomy, requests);
  ASSERT_EQ(none.swaps + none.recomputes, 0);
  for (const bool overlap : {true, false}) {
    for (const bool prefix_cache : {false, true}) {
      prefix_props::HybridWorld world = tight;
      world.overlap = overlap, world.prefix_cache = prefix_cache;
      const prefix_props::ServedRun recompute = prefix_props::serve(world, requests);
      world.host_pages_count = 40;
      const prefix_props::ServedRun swap = prefix_props::serve(world, requests);
      const std::string where = world.describe();
      EXPECT_GT(recompute.recomputes, 0) << where;
      EXPECT_EQ(recompute.swaps, 0) << where;
      EXPECT_GT(swap.swaps, 0) << where;
      EXPECT_EQ(prefix_props::compare_runs(recompute, none, requests), "") << where;
      EXPECT_EQ(prefix_props::compare_runs(swap, none, requests), "") << where;
    }
  }
}

// Property (RapidCheck): a request's tokens are the same with and without a prefix hit, over
// generated workloads; its planted companion is tests/prefix_hit_planted_test.cpp.
TEST(PrefixHitProperty, TokensAreTheSameWithAndWithoutAPrefixHit) {
  int hits = 0;
  const std::optional<std::string> failure = prefix_props::counterexample(60, &hits);
  EXPECT_FALSE(failure.has_value()) << *failure;
  std::printf("%d of 60 workloads hit the prefix cache\n", hits);
  EXPECT_GE(hits, 20) << "too few generated workloads hit the prefix cache to test anything";
}

// The scheduler's slots over generated workloads (retraction, overlap on and off); its planted
// companion is tests/mamba_slot_planted_test.cpp.
TEST(MambaSlotProperty, NoTwoLiveRequestsShareAWorkingSlot) {
  const std::optional<std::string> failure = mamba_props::counterexample(150);
  EXPECT_FALSE(failure.has_value()) << *failure;
}

// The hybrid properties on tiny-hybrid (tests/hybrid_properties.h); their planted companions are
// tests/hybrid_planted_test.cpp.
TEST(HybridProperty, ARequestsTokensAreTheSameAcrossChunkingsAndRetractions) {
  const std::optional<std::string> failure =
      hybrid_props::counterexample(hybrid_props::Property::kTokens, 100);
  EXPECT_FALSE(failure.has_value()) << *failure;
}

TEST(HybridProperty, SlotsAreNeverSharedPaddingNeverTouchesASlotFirstChunksZero) {
  const std::optional<std::string> failure =
      hybrid_props::counterexample(hybrid_props::Property::kSlots, 100);
  EXPECT_FALSE(failure.has_value()) << *failure;
}

// The tight pool of the tokens property does retract by recompute (so the property covers it).
TEST(HybridProperty, TheTightPoolRetracts) {
  hybrid_props::HybridWorkload w;
  w.max_batch_rows = 3;
  w.page_size = 4;
  w.chunk_a = 16, w.chunk_b = 5;
  w.prompt_lengths = {30, 41, 25, 36};
  w.new_tokens = {8, 8, 8, 8};
  w.greedy = {1, 0, 1, 0};
  EXPECT_GT(hybrid_props::tight_pool_retractions(w), 0);
  EXPECT_EQ(hybrid_props::tokens_same_across_chunkings_and_retraction(w), "");
}

// ---- State digests in the trace ------------------------------------------------------------

// A recording step digests each row's working slot after the step, by the documented definition
// (core/logits_digest.h over the slot's floats in their stored order), and the header says so.
TEST(HybridTrace, TheStepDigestsEachRowsWorkingSlotAfterTheStep) {
  HybridHarness h;
  Executor recording(h.config, kVocab, h.backend, trace::recording_executor_options());
  ForwardOp op;
  op.rows = {prefill_row(1, 1, 0, 20, 20), prefill_row(2, 2, 0, 9, 9)};
  op.rows[0].mamba_working = 3;
  op.rows[1].mamba_working = 0;
  const std::vector<int32_t> a = prompt_for(1, 20), b = prompt_for(2, 9);
  op.prefill_token_ids = a;
  op.prefill_token_ids.insert(op.prefill_token_ids.end(), b.begin(), b.end());
  op.rows[0].refresh = {0, pages_from(20, 5)}, op.rows[0].sampling = SamplingParams{};
  op.rows[1].refresh = {0, pages_from(40, 3)}, op.rows[1].sampling = SamplingParams{};
  const StepResult r = recording.step(op);
  ASSERT_EQ(r.mamba_state_digests.size(), size_t{2});
  for (const auto& [row, slot] : {std::pair{0, 3}, std::pair{1, 0}}) {
    const std::vector<float> state = h.backend.read_mamba_state(slot);
    EXPECT_GT(norm_of(state), 0.0) << "slot " << slot;
    EXPECT_EQ(r.mamba_state_digests[static_cast<size_t>(row)], logits_row_digest_portable(state));
  }
  EXPECT_NE(r.mamba_state_digests[0], r.mamba_state_digests[1]);
  EXPECT_TRUE(trace::make_trace_header(hybrid_weights(), {}, h.config, "cpu").mamba_state_digests);
  EXPECT_FALSE(trace::make_trace_header(testing::tiny_weights(), {}, testing::small_config(), "cpu")
                   .mamba_state_digests);
}

// The reader holds an output to the header: one digest per row when it records them, none
// otherwise; a header that claims them for a model without Mamba layers is refused.
TEST(HybridTrace, TheReaderChecksTheStateDigestsAgainstTheHeader) {
  trace::TraceHeader h = trace::make_trace_header(hybrid_weights(), {}, hybrid_config(), "cpu");
  trace::StepOutputRecord out;
  out.step = 4;
  out.result.mode = ForwardMode::kDecode;
  out.result.tokens = {5, 6};
  out.result.accepted_lengths = {1, 1};
  out.result.nan_flags = {0, 0};
  out.result.oov_flags = {0, 0};
  out.logits_digests = {1, 2};
  out.valid_cache_lengths = {10, 12};
  out.future_input_digests = {3, 4};
  out.top_logits_count = 0;
  h.top_logits_count = 0;
  const trace::OpenStep open{4, 2, 0};
  out.mamba_state_digests = {7, 8};
  EXPECT_NO_THROW(trace::check_step_output(out, open, h));
  out.mamba_state_digests = {7};
  EXPECT_THAT([&] { trace::check_step_output(out, open, h); },
              ThrowsMessage<Error>(HasSubstr("mamba_state_digests holds 1 digests, expected 2 (the "
                                             "header records them)")));
  h.mamba_state_digests = false;
  out.mamba_state_digests = {7, 8};
  EXPECT_THAT([&] { trace::check_step_output(out, open, h); },
              ThrowsMessage<Error>(HasSubstr("expected 0 (the header does not record them)")));
  trace::TraceHeader plain = trace::make_trace_header(testing::tiny_weights(), {},
                                                      testing::small_config(), "cpu");
  plain.mamba_state_digests = true;
  EXPECT_THAT([&] { trace::check_header(plain); },
              ThrowsMessage<Error>(HasSubstr("mamba_state_digests is set but model 'tiny' has no "
                                             "Mamba layers")));
}

// `lockstep check` from the records alone: request 2 takes working slot 0 while request 1, which
// holds it, never retracted, finished or aborted; with request 1's finish in between it is fine.
TEST(HybridTrace, CheckNamesAWorkingSlotHandedOverWhileItsHolderLives) {
  const auto record = [](const fs::path& path, bool finish_first) {
    HybridHarness h;
    Executor executor(h.config, kVocab, h.backend, trace::recording_executor_options());
    auto recorder = trace::Recorder::open(
        path, trace::make_trace_header(hybrid_weights(), {}, h.config, "cpu"));
    for (const RequestId id : {RequestId{1}, RequestId{2}}) {
      const int64_t step = static_cast<int64_t>(id) - 1;
      if (id == 2 && finish_first) {
        recorder->record_event({.kind = trace::EventKind::kFinish, .request_id = 1, .step = step,
                                .detail = "length"});
      }
      ForwardOp op;
      op.rows = {prefill_row(id, static_cast<int32_t>(id), 0, 6, 6)};
      op.rows[0].mamba_working = 0;
      op.rows[0].refresh = {0, pages_from(10 * static_cast<int32_t>(id), 2)};
      op.rows[0].sampling = SamplingParams{};
      op.prefill_token_ids = prompt_for(id, 6);
      recorder->record_input(step, op);
      recorder->record_output(step, executor.step(op), StateSnapshot{});
    }
    recorder->close();
  };
  const testing::ScratchDir dir;
  record(dir.file("shared.trace"), false);
  const replay::CheckReport shared = replay::check_trace(dir.file("shared.trace"));
  ASSERT_TRUE(shared.violation.has_value());
  EXPECT_EQ(shared.violation->invariant, "mamba_slot");
  EXPECT_EQ(shared.violation->step, 1);
  EXPECT_EQ(shared.violation->request_id, RequestId{2});
  EXPECT_THAT(shared.violation->detail, HasSubstr("working slot 0 is given to this request while "
                                                  "request 1 holds it"));
  record(dir.file("handed.trace"), true);
  const replay::CheckReport handed = replay::check_trace(dir.file("handed.trace"));
  EXPECT_FALSE(handed.violation.has_value()) << handed.violation->describe();
  EXPECT_EQ(handed.steps_checked, 2);
}

// `lockstep generate --model DIR` on a hybrid checkpoint, end to end: --mamba-slots 0 (the
// default) sizes the pool for the model, and the tokens are the in-process serving loop's.
TEST(HybridCli, GenerateServesAHybridCheckpointEndToEnd) {
  const testing::ScratchDir dir;
  const fs::path model = dir.file("bamba");
  fs::create_directories(model);
  testing::write_hybrid_checkpoint(model);
  std::vector<RequestSpec> requests;
  std::string lines;
  for (RequestId id = 1; id <= 5; ++id) {
    const std::vector<int32_t> prompt = prompt_for(id, 20 * static_cast<int32_t>(id));
    requests.push_back(RequestSpec{.id = id, .prompt = prompt, .max_new_tokens = 16});
    lines += nlohmann::json{{"id", id}, {"prompt", prompt}, {"max_new_tokens", 16}}.dump() + "\n";
  }
  std::ofstream(dir.file("prompts.jsonl")) << lines;
  const std::string command = fmt::format(
      "timeout 120 '{}' generate --model '{}' --prompts '{}' --output '{}' --max-batch-rows 3 "
      "--prefill-chunk-tokens 48 --context-length 128 -q 2>'{}'", LOCKSTEP_CLI, model.string(),
      dir.file("prompts.jsonl").string(), dir.file("out.jsonl").string(),
      dir.file("err.txt").string());
  const int status = std::system(command.c_str());
  std::ifstream err(dir.file("err.txt"));
  const std::string err_text{std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>()};
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command << "\n" << err_text;
  const auto expected = serve(requests, 2, 80, /*context_length=*/128);
  std::ifstream out(dir.file("out.jsonl"));
  int32_t lines_count = 0;
  for (std::string line; std::getline(out, line); ++lines_count) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const RequestId id = j.at("id").get<RequestId>();
    EXPECT_EQ(j.at("tokens").get<std::vector<int32_t>>(), expected.at(id)) << "request " << id;
  }
  EXPECT_EQ(lines_count, 5);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A recorded hybrid run carries the state slots (trace inspect shows them) and replays bit for bit.
TEST(HybridCli, ARecordedRunReplaysBitForBit) {
  const testing::ScratchDir dir;
  const fs::path model = dir.file("bamba");
  fs::create_directories(model);
  testing::write_hybrid_checkpoint(model);
  std::ofstream(dir.file("p.jsonl")) << nlohmann::json{{"prompt", prompt_for(1, 30)}}.dump() << "\n"
                                     << nlohmann::json{{"prompt", prompt_for(2, 45)}}.dump() << "\n";
  const fs::path trace = dir.file("run.trace");
  const std::string record = fmt::format(
      "timeout 120 '{0}' generate --model '{1}' --prompts '{2}' --record '{3}' -q >/dev/null 2>'{4}'"
      " && '{0}' replay '{3}' >'{5}' 2>&1 && '{0}' trace inspect '{3}' --steps 0:2 >>'{5}' 2>&1",
      LOCKSTEP_CLI, model.string(), dir.file("p.jsonl").string(), trace.string(),
      dir.file("err.txt").string(), dir.file("out.txt").string());
  const int status = std::system(record.c_str());
  const std::string out = read_text(dir.file("out.txt"));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << record << "\n" << read_text(dir.file("err.txt")) << out;
  EXPECT_THAT(out, HasSubstr("IDENTICAL: every compared output and digest matches bit for bit"));
  EXPECT_THAT(out, HasSubstr("hybrid: layers MAMM; mamba2 heads 8 x 16, groups 2, state 16, conv 4 "
                             "(bias), dt in [0.05, 2]; state slots 16"));
  EXPECT_THAT(out, HasSubstr("1:P@1[0+30/30] state 0  2:P@2[0+45/45] state 1"));
}

// `--mamba-slots` above `--max-batch-rows` turns the prefix cache on for a hybrid: prompts that
// share a prefix give the tokens of the default (no prefix cache), and the recorded run — prefill
// rows that checkpoint, hits that copy a checkpoint in — replays bit for bit.
TEST(HybridCli, MoreStateSlotsThanRowsServeThePrefixCacheAndReplay) {
  const testing::ScratchDir dir;
  const fs::path model = dir.file("bamba");
  fs::create_directories(model);
  testing::write_hybrid_checkpoint(model);
  const std::vector<int32_t> shared = prompt_for(77, 40);
  std::string lines;
  for (RequestId id = 1; id <= 4; ++id) {
    std::vector<int32_t> prompt = shared;
    const std::vector<int32_t> suffix = prompt_for(id, 5 * static_cast<int32_t>(id));
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    lines += nlohmann::json{{"id", id}, {"prompt", prompt}, {"max_new_tokens", 10}}.dump() + "\n";
  }
  std::ofstream(dir.file("p.jsonl")) << lines;
  const std::string run = fmt::format(
      "timeout 120 '{0}' generate --model '{1}' --prompts '{2}' --max-batch-rows 2 "
      "--prefill-chunk-tokens 16 --context-length 128 -q", LOCKSTEP_CLI, model.string(),
      dir.file("p.jsonl").string());
  const fs::path trace = dir.file("run.trace");
  const std::string command = fmt::format(
      "{0} --output '{1}' 2>'{3}' && {0} --mamba-slots 10 --output '{2}' --record '{4}' 2>>'{3}' "
      "&& '{5}' replay '{4}' >'{6}' 2>&1", run, dir.file("plain.jsonl").string(),
      dir.file("cached.jsonl").string(), dir.file("err.txt").string(), trace.string(), LOCKSTEP_CLI,
      dir.file("replay.txt").string());
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << command << "\n" << read_text(dir.file("err.txt")) << read_text(dir.file("replay.txt"));
  const std::string plain = read_text(dir.file("plain.jsonl"));
  EXPECT_EQ(std::count(plain.begin(), plain.end(), '\n'), 4);
  EXPECT_EQ(read_text(dir.file("cached.jsonl")), plain);
  EXPECT_THAT(read_text(dir.file("replay.txt")),
              HasSubstr("IDENTICAL: every compared output and digest matches bit for bit"));
  // The hits happened: a hit row copies a checkpoint in, and trace inspect shows it.
  const std::string inspect = fmt::format("'{}' trace inspect '{}' --steps 0:40 >'{}' 2>&1",
                                          LOCKSTEP_CLI, trace.string(), dir.file("inspect.txt").string());
  ASSERT_EQ(std::system(inspect.c_str()), 0);
  EXPECT_THAT(read_text(dir.file("inspect.txt")), HasSubstr("cow"));
}

TEST(HybridCli, TheStatePoolFlagIsRefusedForAModelWithoutMambaLayers) {
  const testing::ScratchDir dir;
  std::ofstream(dir.file("p.jsonl")) << "{\"prompt\": [1, 2, 3], \"max_new_tokens\": 2}\n";
  const std::string command = fmt::format(
      "timeout 60 '{}' generate --model tiny --prompts '{}' --mamba-slots 4 -q >/dev/null 2>'{}'",
      LOCKSTEP_CLI, dir.file("p.jsonl").string(), dir.file("err.txt").string());
  const int status = std::system(command.c_str());
  std::ifstream err(dir.file("err.txt"));
  const std::string err_text{std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>()};
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << err_text;
  EXPECT_THAT(err_text, HasSubstr("--mamba-slots 4: model 'tiny' has no Mamba layers"));
}

}  // namespace
}  // namespace ls
