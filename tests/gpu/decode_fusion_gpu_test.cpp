// The decode GEMV's fused forms (kernels/decode_gemv.h) against the unfused sequence they replace
// (launch_rms_norm, launch_gemv_bf16, then launch_rope_qkv or launch_swiglu), bit for bit, on
// llama-1b's and llama-8b's layer shapes with seeded random weights at every token count 1..8;
// run to run identical (the second run overlapping its predecessor, as a decode step launches
// it); and each token's result identical to that token run alone (batch invariance). Then whole
// backends with CudaBackendOptions::fuse_decode on and off: every logit of every step equal.
#include "core/executor.h"
#include "core/model/weights.h"
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "core/step_observer.h"
#include "kernels/cuda_backend.h"
#include "kernels/decode_gemv.h"
#include "kernels/gemm.h"
#include "kernels/layer_ops.h"
#include "kernels/weight_init.h"
#include "tests/gpu/backend_test_support.h"
#include "tests/gpu/gpu_test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace ls {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::differing;
using gpu_test::random_floats;
using gpu_test::same_bits;
using kernels::bf16;

struct LayerShape {
  const char* name;
  const char* label;  // the test name's part
  int32_t hidden, query_heads, kv_heads, head_dim, ffn;
  int32_t q_size() const { return query_heads * head_dim; }
  int32_t kv_size() const { return kv_heads * head_dim; }
  int32_t qkv_rows() const { return q_size() + 2 * kv_size(); }
};
constexpr LayerShape kLlama1b{"llama-1b", "Llama1b", 2048, 32, 8, 64, 8192};
constexpr LayerShape kLlama8b{"llama-8b", "Llama8b", 4096, 32, 8, 128, 14336};
// Qwen2.5-14B's layer: past the hidden size whose one-token norm the GEMV holds in registers
// (kernels/gemv.cu normalise_held), so its one-token steps take the reloading path.
constexpr LayerShape kQwen14b{"qwen2.5-14b", "Qwen14b", 5120, 40, 8, 128, 13824};
constexpr float kEps = 1e-5f;
constexpr int32_t kSlots = 40;
constexpr int32_t kPositions = 300;

// Seeded bf16 weights made on the device (the benchmark's generator), ±0.05 around 0.
void seed_weights(bf16* w, int64_t rows, int64_t cols, uint32_t tensor) {
  ASSERT_EQ(kernels::launch_seeded_bf16(w, kernels::SeededBlock{rows, cols, 0, cols}, 14, tensor,
                                        0.0f, 0.05f, nullptr),
            cudaSuccess);
}

// One step's activations: the residual stream, this layer's norm weight, RoPE tables, and each
// token's position (one past the table: clamped) and KV slot.
struct StepInputs {
  std::vector<float> residual, norm_weight, cos, sin;
  std::vector<int32_t> positions;
  std::vector<int64_t> slots;
};

StepInputs step_inputs(const LayerShape& shape, int32_t tokens, uint32_t seed) {
  StepInputs in;
  in.residual = random_floats(size_t(tokens) * shape.hidden, seed, -3, 3);
  in.norm_weight = random_floats(size_t(shape.hidden), seed + 1, 0.5f, 1.5f);
  const size_t table = size_t(kPositions) * size_t(shape.head_dim / 2);
  in.cos = random_floats(table, seed + 2, -1, 1);
  in.sin = random_floats(table, seed + 3, -1, 1);
  for (int32_t t = 0; t < tokens; ++t) {
    in.positions.push_back(t == tokens - 1 ? kPositions + 5 : 17 + 31 * t);
    in.slots.push_back((7 * t + 3) % kSlots);
  }
  return in;
}

// What the QKV stage leaves behind: Q, and the whole K and V caches (poisoned where unwritten).
struct QkvOut {
  std::vector<float> q;
  std::vector<bf16> k, v;
};

// block_per_group: the fused kernel's other grid (GemvNorm::block_per_group).
QkvOut run_qkv(const LayerShape& shape, const bf16* w, const StepInputs& in, int32_t tokens,
               bool fused, kernels::LaunchStream stream, bool block_per_group = false) {
  DeviceBuffer<float> residual(in.residual), norm_weight(in.norm_weight), cos(in.cos), sin(in.sin);
  DeviceBuffer<int32_t> positions(in.positions);
  DeviceBuffer<int64_t> slots(in.slots);
  DeviceBuffer<float> q(size_t(tokens) * shape.q_size());
  DeviceBuffer<bf16> k(size_t(kSlots) * shape.kv_size()), v(size_t(kSlots) * shape.kv_size());
  if (fused) {
    const kernels::RopeKvTarget target{positions.ptr, slots.ptr, shape.query_heads, shape.kv_heads,
                                       shape.head_dim, cos.ptr, sin.ptr, kPositions, q.ptr, k.ptr,
                                       v.ptr};
    EXPECT_EQ(kernels::launch_gemv_norm_rope_kv_bf16(
                  {residual.ptr, norm_weight.ptr, kEps, block_per_group}, w, target, tokens,
                  shape.hidden, stream),
              cudaSuccess);
  } else {
    DeviceBuffer<bf16> x(size_t(tokens) * shape.hidden);
    DeviceBuffer<float> qkv(size_t(tokens) * shape.qkv_rows());
    EXPECT_EQ(kernels::launch_rms_norm(residual.ptr, nullptr, tokens, shape.hidden,
                                       norm_weight.ptr, kEps, x.ptr, stream),
              cudaSuccess);
    EXPECT_EQ(kernels::launch_gemv_bf16(x.ptr, w, qkv.ptr, tokens, shape.qkv_rows(), shape.hidden,
                                        0.0f, stream),
              cudaSuccess);
    EXPECT_EQ(kernels::launch_rope_qkv(qkv.ptr, positions.ptr, slots.ptr, tokens,
                                       shape.query_heads, shape.kv_heads, shape.head_dim,
                                       shape.head_dim, cos.ptr, sin.ptr, kPositions, q.ptr, k.ptr,
                                       v.ptr, stream),
              cudaSuccess);
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return QkvOut{q.download(), k.download(), v.download()};
}

// y = rms_norm(residual) · wᵀ (fp32), launched fused or as the norm and the GEMV.
std::vector<float> run_norm_product(const LayerShape& shape, const bf16* w, int32_t rows,
                                    const StepInputs& in, int32_t tokens, bool fused,
                                    kernels::LaunchStream stream) {
  DeviceBuffer<float> residual(in.residual), norm_weight(in.norm_weight);
  DeviceBuffer<float> y(size_t(tokens) * rows);
  if (fused) {
    EXPECT_EQ(kernels::launch_gemv_norm_bf16({residual.ptr, norm_weight.ptr, kEps}, w, y.ptr,
                                             tokens, rows, shape.hidden, stream),
              cudaSuccess);
  } else {
    DeviceBuffer<bf16> x(size_t(tokens) * shape.hidden);
    EXPECT_EQ(kernels::launch_rms_norm(residual.ptr, nullptr, tokens, shape.hidden,
                                       norm_weight.ptr, kEps, x.ptr, stream),
              cudaSuccess);
    EXPECT_EQ(kernels::launch_gemv_bf16(x.ptr, w, y.ptr, tokens, rows, shape.hidden, 0.0f, stream),
              cudaSuccess);
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return y.download();
}

std::vector<bf16> run_swiglu(const LayerShape& shape, const bf16* w_gate_up, const StepInputs& in,
                             int32_t tokens, bool fused, kernels::LaunchStream stream,
                             bool block_per_group = false) {
  DeviceBuffer<float> residual(in.residual), norm_weight(in.norm_weight);
  DeviceBuffer<bf16> act(size_t(tokens) * shape.ffn);
  if (fused) {
    EXPECT_EQ(kernels::launch_gemv_norm_swiglu_bf16(
                  {residual.ptr, norm_weight.ptr, kEps, block_per_group}, w_gate_up, act.ptr,
                  tokens, shape.ffn, shape.hidden, stream),
              cudaSuccess);
  } else {
    DeviceBuffer<bf16> x(size_t(tokens) * shape.hidden);
    DeviceBuffer<float> gate_up(size_t(tokens) * 2 * shape.ffn);
    EXPECT_EQ(kernels::launch_rms_norm(residual.ptr, nullptr, tokens, shape.hidden,
                                       norm_weight.ptr, kEps, x.ptr, stream),
              cudaSuccess);
    EXPECT_EQ(kernels::launch_gemv_bf16(x.ptr, w_gate_up, gate_up.ptr, tokens, 2 * shape.ffn,
                                        shape.hidden, 0.0f, stream),
              cudaSuccess);
    EXPECT_EQ(kernels::launch_swiglu(gate_up.ptr, tokens, shape.ffn, act.ptr, stream),
              cudaSuccess);
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return act.download();
}

// The last token's inputs alone (its residual row, position and slot).
StepInputs last_token(const StepInputs& in, int32_t tokens, int32_t hidden) {
  StepInputs one = in;
  one.residual.assign(in.residual.begin() + size_t(tokens - 1) * hidden, in.residual.end());
  one.positions = {in.positions.back()};
  one.slots = {in.slots.back()};
  return one;
}

template <typename T>
std::vector<T> tail(const std::vector<T>& v, size_t n) {
  return std::vector<T>(v.end() - static_cast<std::ptrdiff_t>(n), v.end());
}

// A stream that launches overlapping its predecessor, as the forward does.
struct OverlapStream {
  // A blocking stream: it waits for the uploads on the legacy default stream.
  OverlapStream() { EXPECT_EQ(cudaStreamCreate(&s), cudaSuccess); }
  ~OverlapStream() { cudaStreamDestroy(s); }
  kernels::LaunchStream launch() const { return kernels::LaunchStream(s, true); }
  cudaStream_t s = nullptr;
};

class FusionShapes : public ::testing::TestWithParam<LayerShape> {};

TEST_P(FusionShapes, NormQkvRopeKvMatchesTheUnfusedKernelsBitForBit) {
  LS_SKIP_WITHOUT_DEVICE();
  const LayerShape shape = GetParam();
  DeviceBuffer<bf16> w(size_t(shape.qkv_rows()) * shape.hidden);
  seed_weights(w.ptr, shape.qkv_rows(), shape.hidden, 1);
  OverlapStream overlap;
  for (int32_t tokens = 1; tokens <= kernels::kGemvTokensMax; ++tokens) {
    SCOPED_TRACE(std::string(shape.name) + " tokens " + std::to_string(tokens));
    const StepInputs in = step_inputs(shape, tokens, 100 + tokens);
    const QkvOut unfused = run_qkv(shape, w.ptr, in, tokens, false, nullptr);
    const QkvOut fused = run_qkv(shape, w.ptr, in, tokens, true, nullptr);
    EXPECT_TRUE(same_bits(fused.q, unfused.q)) << differing(fused.q, unfused.q) << " of q differ";
    EXPECT_TRUE(same_bits(fused.k, unfused.k)) << differing(fused.k, unfused.k) << " of K differ";
    EXPECT_TRUE(same_bits(fused.v, unfused.v)) << differing(fused.v, unfused.v) << " of V differ";
    // Written at all: no poison (0xffffffff, a NaN) left in Q, and the product is not zero.
    for (const float x : fused.q) ASSERT_FALSE(std::isnan(x));
    EXPECT_GT(gpu_test::norm(unfused.q), 0);
    const QkvOut again = run_qkv(shape, w.ptr, in, tokens, true, overlap.launch());
    EXPECT_TRUE(same_bits(again.q, fused.q) && same_bits(again.k, fused.k) &&
                same_bits(again.v, fused.v))
        << "run to run";
    const QkvOut per_group = run_qkv(shape, w.ptr, in, tokens, true, overlap.launch(), true);
    EXPECT_TRUE(same_bits(per_group.q, fused.q) && same_bits(per_group.k, fused.k) &&
                same_bits(per_group.v, fused.v))
        << "a block per group of tasks";
    const QkvOut alone =
        run_qkv(shape, w.ptr, last_token(in, tokens, shape.hidden), 1, true, nullptr);
    EXPECT_TRUE(same_bits(alone.q, tail(fused.q, size_t(shape.q_size()))))
        << "the last token's Q alone";
    const size_t slot_at = size_t(in.slots.back()) * shape.kv_size();
    EXPECT_EQ(std::memcmp(alone.k.data() + slot_at, fused.k.data() + slot_at,
                          size_t(shape.kv_size()) * sizeof(bf16)), 0) << "its K alone";
    EXPECT_EQ(std::memcmp(alone.v.data() + slot_at, fused.v.data() + slot_at,
                          size_t(shape.kv_size()) * sizeof(bf16)), 0) << "its V alone";
  }
}

TEST_P(FusionShapes, NormQkvProductMatchesTheUnfusedKernelsBitForBit) {
  LS_SKIP_WITHOUT_DEVICE();
  const LayerShape shape = GetParam();
  // Odd row counts too: the last warp's pair has one row.
  for (const int32_t rows : {shape.qkv_rows(), shape.qkv_rows() - 3}) {
    DeviceBuffer<bf16> w(size_t(rows) * shape.hidden);
    seed_weights(w.ptr, rows, shape.hidden, 2);
    for (int32_t tokens = 1; tokens <= kernels::kGemvTokensMax; ++tokens) {
      SCOPED_TRACE(std::string(shape.name) + " rows " + std::to_string(rows) + " tokens " +
                   std::to_string(tokens));
      const StepInputs in = step_inputs(shape, tokens, 200 + tokens);
      const std::vector<float> unfused =
          run_norm_product(shape, w.ptr, rows, in, tokens, false, nullptr);
      const std::vector<float> fused =
          run_norm_product(shape, w.ptr, rows, in, tokens, true, nullptr);
      EXPECT_TRUE(same_bits(fused, unfused)) << differing(fused, unfused) << " differ";
      for (const float x : unfused) ASSERT_FALSE(std::isnan(x));
    }
  }
}

TEST_P(FusionShapes, NormGateUpSwigluMatchesTheUnfusedKernelsBitForBit) {
  LS_SKIP_WITHOUT_DEVICE();
  const LayerShape shape = GetParam();
  DeviceBuffer<bf16> w(size_t(2) * shape.ffn * shape.hidden);
  seed_weights(w.ptr, 2 * int64_t{shape.ffn}, shape.hidden, 3);
  OverlapStream overlap;
  for (int32_t tokens = 1; tokens <= kernels::kGemvTokensMax; ++tokens) {
    SCOPED_TRACE(std::string(shape.name) + " tokens " + std::to_string(tokens));
    const StepInputs in = step_inputs(shape, tokens, 300 + tokens);
    const std::vector<bf16> unfused = run_swiglu(shape, w.ptr, in, tokens, false, nullptr);
    const std::vector<bf16> fused = run_swiglu(shape, w.ptr, in, tokens, true, nullptr);
    EXPECT_TRUE(same_bits(fused, unfused)) << differing(fused, unfused) << " differ";
    for (const float x : gpu_test::from_bf16(unfused)) ASSERT_FALSE(std::isnan(x));
    EXPECT_TRUE(same_bits(run_swiglu(shape, w.ptr, in, tokens, true, overlap.launch()), fused))
        << "run to run";
    EXPECT_TRUE(
        same_bits(run_swiglu(shape, w.ptr, in, tokens, true, overlap.launch(), true), fused))
        << "a block per group of tasks";
    const std::vector<bf16> alone =
        run_swiglu(shape, w.ptr, last_token(in, tokens, shape.hidden), 1, true, nullptr);
    EXPECT_TRUE(same_bits(alone, tail(fused, size_t(shape.ffn)))) << "the last token alone";
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, FusionShapes, ::testing::Values(kLlama1b, kLlama8b, kQwen14b),
                         [](const auto& param_info) {
                           return std::string(param_info.param.label);
                         });

// Outside what the folded norm covers (the vectorised norm's widths, 16-byte aligned inputs) the
// launchers refuse rather than computing something else.
TEST(DecodeFusion, LaunchersRefuseWhatTheyDoNotCover) {
  LS_SKIP_WITHOUT_DEVICE();
  EXPECT_TRUE(kernels::gemv_norm_fits(2048));
  EXPECT_TRUE(kernels::gemv_norm_fits(8192));
  EXPECT_FALSE(kernels::gemv_norm_fits(8200));  // past the vectorised norm's registers
  EXPECT_FALSE(kernels::gemv_norm_fits(2052));  // not a whole number of 8-element chunks
  DeviceBuffer<float> residual(8200 * 2 + 4), weight(8200 + 4), y(64);
  DeviceBuffer<bf16> w(size_t(8) * 8200), act(64);
  const kernels::GemvNorm ok{residual.ptr, weight.ptr, kEps};
  EXPECT_EQ(kernels::launch_gemv_norm_bf16(ok, w.ptr, y.ptr, 1, 8, 8200, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::launch_gemv_norm_bf16({residual.ptr + 1, weight.ptr, kEps}, w.ptr, y.ptr, 1,
                                           8, 2048, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::launch_gemv_norm_bf16({residual.ptr, weight.ptr, 0.0f}, w.ptr, y.ptr, 1, 8,
                                           2048, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::launch_gemv_norm_swiglu_bf16(ok, w.ptr, act.ptr, kernels::kGemvTokensMax + 1,
                                                  4, 2048, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::launch_gemv_norm_rope_kv_bf16(ok, w.ptr, kernels::RopeKvTarget{}, 1, 2048,
                                                   nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Every step's logits rows, in order (the executor captures them).
class AllLogits : public StepObserver {
 public:
  void on_step_input(int64_t, const ForwardOp&, const std::vector<CacheOp>&,
                     const StepFaults&) override {}
  void on_step_output(int64_t, const ForwardOp&, const StepResult& result,
                      const StateSnapshot&) override {
    steps.push_back(result.logits);
  }
  void on_scheduler_events(int64_t, const std::vector<SchedulerEvent>&) override {}

  std::vector<std::vector<float>> steps;
};

struct Served {
  gpu_test::Outcomes tokens;
  std::vector<std::vector<float>> logits;
};

// 12 greedy prompts (1..40 tokens, 24 new each) under 8 batch rows: chunked prefills, then decode
// steps of 8 rows and fewer as requests finish (the GEMV's steps at one row, the small-M GEMM's
// above, graphs replayed); in batch-invariant mode the small-M GEMM's every step.
Served serve(const ModelWeights& weights, bool fused, bool invariant = false) {
  SchedulerConfig sc;
  sc.max_batch_rows = 8;
  sc.prefill_chunk_tokens = 32;
  sc.page_size = 16;
  sc.pages_count = 128;
  sc.context_length = 128;
  const ExecutorConfig ec = executor_config_for(sc);
  const int32_t vocab = weights.config.vocab_size;
  CudaBackendOptions options{.graphs = true, .fuse_decode = fused};
  if (invariant) options = batch_invariant_options(options);
  CudaBackend cuda(weights, ec, options);
  Scheduler scheduler(sc);
  for (const RequestSpec& r : gpu_test::greedy_requests(12, 40, 24, vocab, 5)) {
    scheduler.submit(r, vocab);
  }
  Executor executor(ec, vocab, cuda, ExecutorOptions{.capture_logits = true});
  AllLogits observer;
  run_serving_loop(scheduler, executor, ServingLoopOptions{.observer = &observer});
  Served out;
  for (const auto& [id, outcome] : scheduler.outcomes()) out.tokens[id] = outcome.tokens;
  out.logits = std::move(observer.steps);
  return out;
}

// The wiring of the fused forms in the backend (which norm weight, which layer's weights and KV,
// where the partly fused path hands over): tiny Llama (norm, QKV, RoPE and KV in one launch),
// tiny with Qwen3's head norms and with Qwen2's biases (norm-fused QKV product, then the bias or
// head norm and RoPE kernels), and tiny Llama in batch-invariant mode (the small-M GEMM's SwiGLU
// epilogue at every step, prefill chunks included). Each with fusion on and off: the same tokens
// and every logit of every step the same bits.
TEST(CudaDecodeFusion, FusedAndUnfusedBackendsGiveTheSameLogitsBitForBit) {
  LS_SKIP_WITHOUT_DEVICE();
  ModelConfig llama = model_config_named("tiny");
  ModelConfig qk_norm = llama, bias = llama;
  qk_norm.family = ModelFamily::kQwen3, qk_norm.qk_norm = true;
  bias.family = ModelFamily::kQwen2, bias.qkv_bias = true;
  struct Case {
    ModelConfig model;
    bool invariant;
  };
  for (const auto& [model, invariant] :
       {Case{llama, false}, Case{qk_norm, false}, Case{bias, false}, Case{llama, true}}) {
    SCOPED_TRACE(std::string("qk_norm ") + (model.qk_norm ? "on" : "off") + ", qkv_bias " +
                 (model.qkv_bias ? "on" : "off") + (invariant ? ", batch-invariant" : ""));
    const ModelWeights weights = weights_from_seed(model, 31);
    const Served fused = serve(weights, true, invariant);
    const Served unfused = serve(weights, false, invariant);
    EXPECT_EQ(fused.tokens, unfused.tokens);
    ASSERT_EQ(fused.logits.size(), unfused.logits.size());
    ASSERT_GT(fused.logits.size(), 24u);
    size_t differing_steps = 0;
    for (size_t k = 0; k < fused.logits.size(); ++k) {
      differing_steps += same_bits(fused.logits[k], unfused.logits[k]) ? 0 : 1;
    }
    EXPECT_EQ(differing_steps, 0u) << "of " << fused.logits.size() << " steps";
  }
}

}  // namespace
}  // namespace ls
