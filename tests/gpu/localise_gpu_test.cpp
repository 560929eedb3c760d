// Localisation on CUDA (issue 15): the CUDA capture of per-layer activations against the CPU
// reference's (every tensor within the cross-backend tolerance, on a prefill step and on fused
// decode steps), and `lockstep replay --localise` naming a planted single-layer change
// (lockstep_planted_cuda: layer 1's output perturbed on CUDA only) CUDA against CUDA (recorded
// digests) and CUDA against the CPU reference in teacher-forced mode.
#include "core/activations.h"
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "kernels/activation_ops.h"
#include "kernels/cuda_backend.h"
#include "kernels/device_memory.h"
#include "replay/localise.h"
#include "tests/gpu/cli_support.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/planted/perturb_layer_output.h"
#include "tests/test_support.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace ls {
namespace {

namespace fs = std::filesystem;
using testing::decode_row;
using testing::pages_from;
using testing::prefill_row;
using testing::prompt_for;
using testing::small_config;

constexpr ExecutorOptions kCapture{.capture_logits = true,
                                   .activations = ActivationCapture::kValues};

// Every tensor of `cuda` within the tolerance of `cpu`'s (and the same shapes), with non-zero
// norms on both sides: what replay's CUDA-against-CPU localisation assumes of a correct build.
void expect_within_tolerance(const StepActivations& cuda, const StepActivations& cpu,
                             const std::string& what) {
  ASSERT_EQ(cuda.tensors.size(), cpu.tensors.size()) << what;
  for (size_t i = 0; i < cpu.tensors.size(); ++i) {
    double a = 0, b = 0;
    for (const float x : cuda.tensors[i].values) a += double{x} * x;
    for (const float x : cpu.tensors[i].values) b += double{x} * x;
    EXPECT_GT(a, 0) << what << ": " << cuda.tensors[i].name();
    EXPECT_GT(b, 0) << what << ": " << cpu.tensors[i].name();
  }
  const std::optional<ActivationDifference> d =
      first_activation_difference(cuda, cpu, replay::kCrossBackendTolerance);
  EXPECT_FALSE(d) << what << ": " << d->tensor << " row " << d->row << " element " << d->element
                  << ": cuda " << d->actual << ", cpu " << d->expected << ", max|cpu| " << d->row_scale;
}

// The device digest of rows of x (gathered through row_index when given) against
// activation_row_digest of the same values as fp32 on the host, bit for bit.
template <typename Storage>
void expect_device_digests(int32_t rows, int32_t width, bool gather, uint32_t seed) {
  const int32_t stored_rows = rows + 3;
  std::mt19937 rng(seed);
  std::normal_distribution<float> value(0.0f, 2.0f);
  std::vector<Storage> stored(static_cast<size_t>(stored_rows) * width);
  std::vector<float> as_fp32(stored.size());
  for (size_t i = 0; i < stored.size(); ++i) {
    float x = value(rng);
    if (i % 13 == 5) x = -0.0f;  // signed zero, and ties of one value, are data too
    if constexpr (std::is_same_v<Storage, uint16_t>) {
      stored[i] = gpu_test::to_bf16_bits(x);
      as_fp32[i] = gpu_test::from_bf16_bits(stored[i]);
    } else {
      stored[i] = x;
      as_fp32[i] = x;
    }
  }
  std::vector<int64_t> index(static_cast<size_t>(rows));
  for (int32_t r = 0; r < rows; ++r) index[static_cast<size_t>(r)] = gather ? (r * 7 + 2) % stored_rows : r;
  DeviceArray<Storage> x(stored.size());
  DeviceArray<int64_t> row_index(index.size());
  DeviceArray<uint64_t> out(static_cast<size_t>(rows));
  ASSERT_EQ(cudaMemcpy(x.get(), stored.data(), x.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(row_index.get(), index.data(), row_index.bytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  cudaError_t status = cudaSuccess;
  if constexpr (std::is_same_v<Storage, uint16_t>) {
    status = kernels::launch_activation_digests(reinterpret_cast<const __nv_bfloat16*>(x.get()),
                                                gather ? row_index.get() : nullptr, rows, width,
                                                out.get(), nullptr);
  } else {
    status = kernels::launch_activation_digests(x.get(), gather ? row_index.get() : nullptr, rows,
                                                width, out.get(), nullptr);
  }
  ASSERT_EQ(status, cudaSuccess);
  std::vector<uint64_t> device(static_cast<size_t>(rows));
  ASSERT_EQ(cudaMemcpy(device.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int32_t r = 0; r < rows; ++r) {
    const std::span<const float> row(as_fp32.data() + index[static_cast<size_t>(r)] * width,
                                     static_cast<size_t>(width));
    ASSERT_EQ(device[static_cast<size_t>(r)], activation_row_digest(row))
        << (std::is_same_v<Storage, uint16_t> ? "bf16" : "fp32") << " rows " << rows << " width "
        << width << (gather ? " gathered" : "") << " seed " << seed << ": row " << r;
  }
}

TEST(ActivationDigestKernel, EqualsTheHostDigestOnOddShapes) {
  LS_SKIP_WITHOUT_DEVICE();
  uint32_t seed = 1;
  for (const int32_t rows : {1, 3, 17}) {
    for (const int32_t width : {1, 7, 111, 500, 4097}) {
      for (const bool gather : {false, true}) {
        expect_device_digests<float>(rows, width, gather, seed++);
        expect_device_digests<uint16_t>(rows, width, gather, seed++);
      }
    }
  }
  EXPECT_EQ(kernels::launch_activation_digests<float>(nullptr, nullptr, 1, 1, nullptr, nullptr),
            cudaErrorInvalidValue);
}

// A recording's device digests are the digests of the values a localisation captures of the
// same step (two backends, one capture each way; fast mode is run-to-run deterministic).
TEST(CudaLocalise, DeviceDigestsAreTheDigestsOfTheCapturedValues) {
  LS_SKIP_WITHOUT_DEVICE();
  const ModelWeights& w = testing::tiny_weights();
  CudaBackendOptions options{.graphs = true};
  const std::unique_ptr<Backend> values_backend = make_cuda_backend(w, small_config(), options);
  const std::unique_ptr<Backend> digests_backend = make_cuda_backend(w, small_config(), options);
  Executor values(small_config(), w.config.vocab_size, *values_backend, kCapture);
  Executor digests(small_config(), w.config.vocab_size, *digests_backend,
                   {.activations = ActivationCapture::kDigests});
  ForwardOp prefill;
  prefill.rows.push_back(prefill_row(1, 1, 0, 9, 9));
  prefill.rows.back().refresh = {0, pages_from(10, 4)};
  prefill.rows.back().sampling = SamplingParams{};
  prefill.prefill_token_ids = prompt_for(1, 9);
  ForwardOp decode;
  decode.rows.push_back(decode_row(1, 1));
  int32_t step = 0;
  for (const ForwardOp* op : {&prefill, &decode, &decode}) {
    const StepResult a = values.step(*op);
    const StepResult b = digests.step(*op);
    ASSERT_EQ(a.tokens, b.tokens);
    const std::vector<uint64_t> from_values = activation_digests(a.activations);
    ASSERT_FALSE(from_values.empty());
    EXPECT_TRUE(b.activations.tensors.front().values.empty()) << "a recording copied values";
    EXPECT_EQ(activation_digests(b.activations), from_values) << "step " << step;
    ++step;
  }
}

TEST(CudaLocalise, CapturedTensorsAgreeWithTheCpuReference) {
  LS_SKIP_WITHOUT_DEVICE();
  const ModelWeights& w = testing::tiny_weights();
  CpuBackend cpu_backend(w, small_config());
  CudaBackendOptions options{.graphs = true};
  const std::unique_ptr<Backend> cuda_backend = make_cuda_backend(w, small_config(), options);
  Executor cpu(small_config(), w.config.vocab_size, cpu_backend, kCapture);
  Executor cuda(small_config(), w.config.vocab_size, *cuda_backend, kCapture);
  ForwardOp prefill;
  for (const auto& [id, row, length] : {std::tuple{1, 1, 7}, std::tuple{2, 2, 3}}) {
    prefill.rows.push_back(prefill_row(id, row, 0, length, length));
    prefill.rows.back().refresh = {0, pages_from(10 * row, 4)};
    prefill.rows.back().sampling = SamplingParams{};
    const std::vector<int32_t> ids = prompt_for(static_cast<RequestId>(id), length);
    prefill.prefill_token_ids.insert(prefill.prefill_token_ids.end(), ids.begin(), ids.end());
  }
  StepResult a = cuda.step(prefill), b = cpu.step(prefill);
  expect_within_tolerance(a.activations, b.activations, "prefill");
  // Decode steps (1 token a row: the fused GEMV path, whose attention input the capture
  // recomputes), teacher-forced to the CPU's tokens so both sides read the same inputs.
  for (int32_t s = 0; s < 3; ++s) {
    ForwardOp decode;
    for (int32_t r = 0; r < 2; ++r) {
      decode.rows.push_back(decode_row(static_cast<RequestId>(r + 1), r + 1));
      decode.rows.back().decode_override = b.tokens[static_cast<size_t>(r)];
    }
    a = cuda.step(decode), b = cpu.step(decode);
    expect_within_tolerance(a.activations, b.activations, "decode " + std::to_string(s));
  }
}

using gpu_test::cli_bin_dir;

// The command's exit status; its output is printed when it is neither 0 nor 1 (a refusal, a
// crash), so that a failing run says why.
int run(const std::string& command) {
  const std::string log = (fs::temp_directory_path() / "lockstep_localise_gpu_run.log").string();
  const int status = std::system((command + " > " + log + " 2>&1").c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code != 0 && code != 1) {
    std::ifstream in(log);
    std::printf("%s exited %d:\n%s\n", command.c_str(), code,
                std::string(std::istreambuf_iterator<char>(in), {}).c_str());
  }
  return code;
}

nlohmann::json localisation_of(const fs::path& json) {
  std::ifstream in(json);
  return nlohmann::json::parse(in).at("localisation");
}

class CudaLocaliseCli : public ::testing::Test {
 protected:
  void SetUp() override {
    LS_SKIP_WITHOUT_DEVICE();
    lockstep = (cli_bin_dir() / "lockstep").string();
    planted = (cli_bin_dir() / "lockstep_planted_cuda").string();
    ASSERT_TRUE(fs::exists(lockstep) && fs::exists(planted))
        << "lockstep and lockstep_planted_cuda must be in " << cli_bin_dir() << " (LOCKSTEP_BIN_DIR)";
    dir = fs::temp_directory_path() / "lockstep_localise_gpu";
    fs::create_directories(dir);
    // Greedy and seeded-sampling prompts of several lengths (examples/prompts.jsonl's shape), in
    // the test so the binary needs no source tree on the GPU host.
    prompts = (dir / "prompts.jsonl").string();
    std::ofstream out(prompts);
    out << "{\"id\": 1, \"prompt\": [17, 204, 33, 401, 9, 88, 150, 3], \"max_new_tokens\": 16}\n"
           "{\"id\": 2, \"prompt\": [5, 5, 5, 5, 5, 5], \"max_new_tokens\": 12, \"temperature\": 0.8, "
           "\"top_k\": 40, \"seed\": 7}\n"
           "{\"id\": 3, \"prompt\": [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111], "
           "\"max_new_tokens\": 20, \"temperature\": 1.0, \"top_p\": 0.9}\n"
           "{\"id\": 4, \"prompt\": [42], \"max_new_tokens\": 24}\n";
  }
  std::string lockstep, planted, prompts;
  fs::path dir;
};

TEST_F(CudaLocaliseCli, APlantedLayerIsNamedCudaAgainstCuda) {
  const std::string trace = (dir / "cuda.trace").string();
  fs::remove(trace);
  ASSERT_EQ(run(lockstep + " generate --backend cuda --prompts " + prompts + " --record " + trace +
                " --record-activations -q"), 0);
  // The production build reproduces the recorded steps: nothing to localise.
  const fs::path same = dir / "same.json";
  ASSERT_EQ(run(lockstep + " replay " + trace + " --backend cuda --localise -q --json " + same.string()), 0);
  EXPECT_TRUE(localisation_of(same).is_null());
  const fs::path json = dir / "planted.json";
  ASSERT_EQ(run(planted + " replay " + trace + " --backend cuda --localise -q --json " + json.string()), 1);
  const nlohmann::json l = localisation_of(json);
  EXPECT_EQ(l.at("verdict"), "differs") << l.dump();
  EXPECT_EQ(l.at("layer"), planted::kPerturbedLayer) << l.dump();
  EXPECT_EQ(l.at("tensor"), "layer 1 mlp_out") << l.dump();
  EXPECT_EQ(l.at("row"), 0) << l.dump();
  std::printf("CUDA vs CUDA (recorded digests): %s\n", l.dump().c_str());
}

TEST_F(CudaLocaliseCli, APlantedLayerIsNamedCudaAgainstCpuTeacherForced) {
  const std::string trace = (dir / "cuda-plain.trace").string();
  fs::remove(trace);
  ASSERT_EQ(run(lockstep + " generate --backend cuda --prompts " + prompts + " --record " + trace + " -q"), 0);
  const fs::path json = dir / "planted-tf.json";
  // Exit 1: the planted build disagrees with the recorded tokens.
  ASSERT_EQ(run(planted + " replay " + trace + " --backend cuda --mode teacher-forced --localise "
                "--localise-against cpu -q --json " + json.string()), 1);
  const nlohmann::json l = localisation_of(json);
  EXPECT_EQ(l.at("verdict"), "differs") << l.dump();
  EXPECT_EQ(l.at("tolerance"), replay::kCrossBackendTolerance) << l.dump();
  EXPECT_EQ(l.at("tensor"), "layer 1 mlp_out") << l.dump();
  EXPECT_EQ(l.at("row"), 0) << l.dump();
  std::printf("CUDA vs CPU (teacher-forced, planted): %s\n", l.dump().c_str());
  // The production build against the CPU reference: its first disagreeing step (bf16 against
  // fp32 flips a near tie now and then) has every tensor within the tolerance.
  const fs::path plain = dir / "plain-tf.json";
  const int status = run(lockstep + " replay " + trace + " --backend cuda --mode teacher-forced "
                         "--localise --localise-against cpu -q --json " + plain.string());
  ASSERT_TRUE(status == 0 || status == 1) << status;
  const nlohmann::json p = localisation_of(plain);
  if (!p.is_null()) {
    EXPECT_EQ(p.at("verdict"), "identical") << p.dump();
  }
  std::printf("CUDA vs CPU (teacher-forced, production): %s\n", p.dump().c_str());
}

}  // namespace
}  // namespace ls
