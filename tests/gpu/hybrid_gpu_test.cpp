// The hybrid family (Mamba2 + attention, issue 19) on the CUDA backend: a small random Bamba
// checkpoint (tests/hybrid_checkpoint.h: 4 layers M A M M, partial rotary over half of each head)
// served through the scheduler against the CPU reference; the state rules (zeroing a reused slot,
// page-boundary checkpoints, copy-on-write) step by step against the CPU reference, eagerly and
// in decode graphs; and the CUDA claims for a hybrid compared bit for bit: the same run twice,
// graphs against eager, and a request's results whatever its co-batch, pool row and slot; a
// recorded step's state digests computed on the device against the host's digest of the slot,
// a hybrid trace recorded on CUDA replayed bit-identical on it, and retraction by swap (the
// working state copied out with the pages and back in) bit-identical to no retraction.
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/logits_digest.h"
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "kernels/cuda_backend.h"
#include "replay/replay.h"
#include "tests/gpu/backend_test_support.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/hybrid_checkpoint.h"
#include "tests/test_support.h"
#include "trace/recorder.h"
#include "trace/reader.h"
#include "trace/trace_observer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <variant>

namespace ls {
namespace {

namespace fs = std::filesystem;
using gpu_test::same_bits;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using testing::decode_row;
using testing::pages_from;
using testing::prefill_row;
using testing::prompt_for;

constexpr int32_t kVocab = 512;

const ModelWeights& hybrid() { return testing::hybrid_checkpoint_weights(); }

// ---- Served through the scheduler ----------------------------------------------------------

// Pages of 16: the prompts (40..129 tokens) cross 3 to 9 pages and are chunked under the 64-token
// budget; one working slot per batch row.
SchedulerConfig served_config() {
  Limits limits;
  limits.max_batch_rows = 8;
  limits.context_length = 256;
  limits.page_size = 16;
  limits.pages_count = 300;
  limits.prefill_chunk_tokens = 64;
  limits.mamba_slots_count = 8;
  return scheduler_config_for_model(limits, hybrid().config);
}

std::vector<RequestSpec> served_requests() {
  std::vector<RequestSpec> requests;
  for (int32_t i = 0; i < 16; ++i) {
    const RequestId id = static_cast<RequestId>(i + 1);
    requests.push_back(RequestSpec{.id = id, .prompt = prompt_for(id, 40 + (i * 23) % 90),
                                   .max_new_tokens = 32});
  }
  return requests;
}

void print_agreement(const char* what, const gpu_test::Agreement& a) {
  std::printf("%s: %d of %d sequences equal, %ld of %ld tokens (%.1f%%); first mismatch: request "
              "%lu at token %zu\n",
              what, a.equal_count, a.total_count, static_cast<long>(a.tokens_equal),
              static_cast<long>(a.tokens_total), 100.0 * static_cast<double>(a.tokens_equal) /
                                                     static_cast<double>(a.tokens_total),
              static_cast<unsigned long>(a.first_mismatch), a.first_mismatch_index);
}

class HybridServed : public ::testing::TestWithParam<bool> {};

// Issue 19's acceptance on CUDA: fp32 agrees with the CPU reference on ≥ 95% of greedy tokens
// over 16 prompts × 32 tokens. bf16 (weights, KV and GEMM inputs rounded) is bounded more
// loosely (70%; 79.7% on the H200 run of 609fd0f, eager and graphs alike): a tiny random
// model's top-2 logits are often near ties.
TEST_P(HybridServed, GreedyTokensAgreeWithTheCpu) {
  LS_SKIP_WITHOUT_DEVICE();
  const SchedulerConfig sc = served_config();
  const ExecutorConfig ec = executor_config_for(sc);
  const std::vector<RequestSpec> requests = served_requests();
  CpuBackend cpu(hybrid(), ec);
  const gpu_test::Outcomes expected = gpu_test::generate(cpu, sc, kVocab, requests);
  for (const auto& [id, tokens] : expected) ASSERT_EQ(tokens.size(), 32u) << id;
  const bool graphs = GetParam();
  {
    CudaBackend cuda(hybrid(), ec, CudaBackendOptions{.precision = CudaPrecision::kFp32,
                                                      .graphs = graphs});
    EXPECT_TRUE(cuda.has_recurrent_state());
    const auto agreement =
        gpu_test::compare(expected, gpu_test::generate(cuda, sc, kVocab, requests));
    print_agreement(graphs ? "hybrid, CUDA fp32 graphs vs CPU" : "hybrid, CUDA fp32 eager vs CPU",
                    agreement);
    EXPECT_GE(agreement.tokens_equal * 100, agreement.tokens_total * 95);
    if (graphs) {
      EXPECT_GT(cuda.graph_replays_count(), 0);
    }
  }
  CudaBackend cuda(hybrid(), ec, CudaBackendOptions{.graphs = graphs});
  const auto agreement =
      gpu_test::compare(expected, gpu_test::generate(cuda, sc, kVocab, requests));
  print_agreement(graphs ? "hybrid, CUDA bf16 graphs vs CPU" : "hybrid, CUDA bf16 eager vs CPU",
                  agreement);
  // A bound that a broken mixer or state rule (near-random tokens after the first) cannot meet;
  // the figure itself is printed for the README.
  EXPECT_GE(agreement.tokens_equal * 10, agreement.tokens_total * 7);
}

INSTANTIATE_TEST_SUITE_P(GraphsOffOn, HybridServed, ::testing::Values(false, true));

// ---- The state rules, op by op -------------------------------------------------------------

ExecutorConfig rules_config() {
  ExecutorConfig c = testing::small_config();  // B 8, L 64, P 4, W 1
  c.mamba_slots_count = 12;
  c.prefill_chunk_tokens = 96;
  return c;
}

constexpr RequestId kSubject = 42;
constexpr int32_t kPrompt = 37;
constexpr int32_t kDecodeSteps = 10;  // vcl 37 → 47: page boundaries at 40 and 44
constexpr int32_t kWatched[] = {0, 5, 6, 9, 10, 11};

struct Placement {
  int32_t pool_row, slot, checkpoint;
};

// The subject and a companion (`companion` its request id, its prompt) prefilled side by side
// after a dirty request left its state in the subject's slot; ten decode steps with checkpoint
// candidates (copies at vcl 40 and 44); then a branch on pool row 3 that copies the subject's
// checkpoint (vcl 44) into slot 5 and prefills 10 more tokens over the subject's first 11 pages,
// and decodes it three steps (checkpoint candidate slot 11).
std::vector<ForwardOp> rules_script(Placement subject, Placement other, RequestId companion) {
  std::vector<ForwardOp> ops;
  ForwardOp dirty;
  dirty.rows.push_back(prefill_row(3, subject.pool_row, 0, 20, 20));
  dirty.rows[0].mamba_working = subject.slot, dirty.rows[0].refresh = {0, pages_from(80, 6)};
  dirty.rows[0].sampling = SamplingParams{};
  dirty.prefill_token_ids = prompt_for(3, 20);
  ops.push_back(dirty);
  ForwardOp prefill;
  prefill.rows.push_back(prefill_row(kSubject, subject.pool_row, 0, kPrompt, kPrompt));
  prefill.rows.push_back(prefill_row(companion, other.pool_row, 0, kPrompt, kPrompt));
  prefill.rows[0].mamba_working = subject.slot, prefill.rows[0].refresh = {0, pages_from(20, 16)};
  prefill.rows[1].mamba_working = other.slot, prefill.rows[1].refresh = {0, pages_from(60, 16)};
  prefill.rows[0].sampling = prefill.rows[1].sampling = SamplingParams{};
  prefill.prefill_token_ids = prompt_for(kSubject, kPrompt);
  const std::vector<int32_t> other_prompt = prompt_for(companion, kPrompt);
  prefill.prefill_token_ids.insert(prefill.prefill_token_ids.end(), other_prompt.begin(),
                                   other_prompt.end());
  ops.push_back(prefill);
  ForwardOp decode;
  decode.rows.push_back(decode_row(kSubject, subject.pool_row));
  decode.rows.push_back(decode_row(companion, other.pool_row));
  decode.rows[0].mamba_working = subject.slot;
  decode.rows[0].mamba_checkpoint_dst = subject.checkpoint;
  decode.rows[1].mamba_working = other.slot;
  decode.rows[1].mamba_checkpoint_dst = other.checkpoint;
  for (int32_t s = 0; s < kDecodeSteps; ++s) ops.push_back(decode);
  ForwardOp branch;
  branch.rows.push_back(prefill_row(77, 3, 44, 10, 54));
  OpRow& row = branch.rows[0];
  row.mamba_working = 5, row.mamba_cow_src = subject.checkpoint, row.mamba_branching_seqlen = 44;
  std::vector<int32_t> pages = pages_from(20, 11);  // the subject's pages up to vcl 44
  const std::vector<int32_t> rest = pages_from(120, 5);
  pages.insert(pages.end(), rest.begin(), rest.end());
  row.refresh = {0, pages};
  row.sampling = SamplingParams{};
  branch.prefill_token_ids = prompt_for(77, 10);
  ops.push_back(branch);
  ForwardOp branch_decode;
  branch_decode.rows.push_back(decode_row(77, 3));
  branch_decode.rows[0].mamba_working = 5, branch_decode.rows[0].mamba_checkpoint_dst = 11;
  for (int32_t s = 0; s < 3; ++s) ops.push_back(branch_decode);
  return ops;
}

// Every step's logits rows (row 0 first), tokens, and the watched slots' states after it.
struct StepTrace {
  std::vector<float> logits;
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> states;  // by kWatched
};

std::vector<StepTrace> run_script(Backend& backend, const ExecutorConfig& c,
                                  const std::function<std::vector<float>(int32_t)>& read_state,
                                  const std::vector<ForwardOp>& ops) {
  Executor executor(c, kVocab, backend, ExecutorOptions{.capture_logits = true});
  std::vector<StepTrace> out;
  for (const ForwardOp& op : ops) {
    const StepResult r = executor.step(op);
    StepTrace t{r.logits, r.tokens, {}};
    for (const int32_t slot : kWatched) t.states.push_back(read_state(slot));
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<StepTrace> run_cuda(const std::vector<ForwardOp>& ops, CudaBackendOptions options) {
  const ExecutorConfig c = rules_config();
  CudaBackend cuda(hybrid(), c, options);
  return run_script(cuda, c, [&cuda](int32_t s) { return cuda.read_mamba_state(s); }, ops);
}

std::vector<StepTrace> run_cpu(const std::vector<ForwardOp>& ops) {
  const ExecutorConfig c = rules_config();
  CpuBackend cpu(hybrid(), c);
  return run_script(cpu, c, [&cpu](int32_t s) { return cpu.read_mamba_state(s); }, ops);
}

size_t watched_index(int32_t slot) {
  for (size_t i = 0; i < std::size(kWatched); ++i) {
    if (kWatched[i] == slot) return i;
  }
  ADD_FAILURE() << "slot " << slot << " is not watched";
  return 0;
}

constexpr Placement kSubjectAt{1, 0, 6};
constexpr Placement kCompanionAt{2, 9, 10};

// The rules as the CPU reference applies them, on CUDA fp32 eagerly and with decode graphs (the
// copies, zeroing and snapshots inside them): every step's tokens equal, its logits and the
// watched states within fp32 reordering error; and on CUDA itself, bit for bit, the checkpoint
// holds the working state exactly after the steps whose new vcl ends a page and is untouched
// after the others.
TEST(HybridRules, CopiesZeroingAndCheckpointsMatchTheCpuStepByStep) {
  LS_SKIP_WITHOUT_DEVICE();
  const std::vector<ForwardOp> ops = rules_script(kSubjectAt, kCompanionAt, 7);
  const std::vector<StepTrace> cpu = run_cpu(ops);
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    const std::vector<StepTrace> cuda =
        run_cuda(ops, CudaBackendOptions{.precision = CudaPrecision::kFp32, .graphs = graphs});
    ASSERT_EQ(cuda.size(), cpu.size());
    for (size_t s = 0; s < ops.size(); ++s) {
      EXPECT_EQ(cuda[s].tokens, cpu[s].tokens) << "step " << s;
      EXPECT_LT(gpu_test::relative_error(cuda[s].logits, cpu[s].logits), 1e-4) << "step " << s;
      for (size_t w = 0; w < std::size(kWatched); ++w) {
        EXPECT_LT(gpu_test::relative_error(cuda[s].states[w], cpu[s].states[w]), 1e-4)
            << "step " << s << " slot " << kWatched[w];
      }
    }
    const size_t working = watched_index(kSubjectAt.slot), checkpoint = watched_index(6);
    for (int32_t d = 0; d < kDecodeSteps; ++d) {
      const size_t s = 2 + static_cast<size_t>(d);
      const int32_t vcl = kPrompt + d + 1;
      if (vcl % 4 == 0) {
        EXPECT_TRUE(same_bits(cuda[s].states[checkpoint], cuda[s].states[working]))
            << "vcl " << vcl;
        EXPECT_FALSE(same_bits(cuda[s].states[checkpoint], cuda[s - 1].states[checkpoint]));
      } else {
        EXPECT_TRUE(same_bits(cuda[s].states[checkpoint], cuda[s - 1].states[checkpoint]))
            << "vcl " << vcl << ": copied off a page boundary";
      }
    }
    // The dirty request's state was real, so the subject's zeroing mattered.
    EXPECT_GT(gpu_test::norm(cuda[0].states[working]), 0.0);
  }
}

// ---- Determinism, bit for bit ----------------------------------------------------------------

bool same_trace(const std::vector<StepTrace>& a, const std::vector<StepTrace>& b) {
  if (a.size() != b.size()) return false;
  for (size_t s = 0; s < a.size(); ++s) {
    if (!same_bits(a[s].logits, b[s].logits) || a[s].tokens != b[s].tokens) return false;
    for (size_t w = 0; w < a[s].states.size(); ++w) {
      if (!same_bits(a[s].states[w], b[s].states[w])) return false;
    }
  }
  return true;
}

// bf16 (production): the same script twice gives the same logits and states bit for bit, and a
// decode step's graph gives the eager step's bits.
TEST(HybridDeterminism, RunTwiceAndGraphVersusEagerAreBitIdentical) {
  LS_SKIP_WITHOUT_DEVICE();
  const std::vector<ForwardOp> ops = rules_script(kSubjectAt, kCompanionAt, 7);
  const std::vector<StepTrace> first = run_cuda(ops, CudaBackendOptions{.graphs = false});
  EXPECT_TRUE(same_trace(first, run_cuda(ops, CudaBackendOptions{.graphs = false})));
  EXPECT_TRUE(same_trace(first, run_cuda(ops, CudaBackendOptions{.graphs = true})));
  EXPECT_GT(gpu_test::norm(first.back().logits), 0.0);
}

// The subject's logits rows and states depend on neither its companion's tokens nor the pool rows
// and slots either occupies (the shapes — rows, token counts, buckets — kept, so that every
// product runs the same plan): the mixer reads only its row's slot, attention only its row's
// pages.
TEST(HybridDeterminism, ARequestIsBitIdenticalWhateverItsCoBatchRowAndSlot) {
  LS_SKIP_WITHOUT_DEVICE();
  const auto subject_part = [](const std::vector<StepTrace>& run, int32_t slot,
                               int32_t checkpoint) {
    std::vector<std::vector<float>> out;
    for (size_t s = 1; s < 2 + kDecodeSteps; ++s) {  // the subject's steps
      out.emplace_back(run[s].logits.begin(), run[s].logits.begin() + kVocab);
      out.push_back(run[s].states[watched_index(slot)]);
      out.push_back(run[s].states[watched_index(checkpoint)]);
    }
    return out;
  };
  for (const CudaPrecision precision : {CudaPrecision::kBf16, CudaPrecision::kFp32}) {
    SCOPED_TRACE(to_string(precision));
    const CudaBackendOptions options{.precision = precision, .graphs = true};
    const auto alone = run_cuda(rules_script(kSubjectAt, kCompanionAt, 7), options);
    // Slot 9 with checkpoint 10 for the subject, slot 0 with checkpoint 6 for a different
    // companion on other pool rows.
    const auto moved = run_cuda(rules_script({4, 9, 10}, {2, 0, 6}, 8), options);
    const auto a = subject_part(alone, 0, 6);
    const auto b = subject_part(moved, 9, 10);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << "entry " << i;
    // The companions differ, so their own rows do (the comparison can tell rows apart).
    const auto companion_row = [](const StepTrace& t) {
      return std::vector<float>(t.logits.begin() + kVocab, t.logits.end());
    };
    EXPECT_FALSE(same_bits(companion_row(alone[1]), companion_row(moved[1])));
  }
}

// ---- Memory ------------------------------------------------------------------------------------

// KV pages hold the attention layers alone (one of the four here), and the state pool counts with
// the workspaces: twelve more slots add twelve slots' floats, which the KV sizing sees too.
TEST(HybridMemory, KvPagesHoldTheAttentionLayersAloneAndTheStatePoolIsCounted) {
  LS_SKIP_WITHOUT_DEVICE();
  const ExecutorConfig c = rules_config();
  const ModelConfig& m = hybrid().config;
  ASSERT_EQ(m.layers_count - m.mamba_layers_count(), 1);
  const int64_t kv_page = 2 * int64_t{c.page_size} * m.kv_size() * 2;  // K and V, bf16
  const CudaBackendOptions options{};
  EXPECT_EQ(cuda_kv_sizing(m, c, options).page_bytes, kv_page);
  CudaBackend cuda(hybrid(), c, options);
  EXPECT_EQ(cuda.memory_report().kv_bytes, kv_page * c.pages_count);
  ExecutorConfig more = c;
  more.mamba_slots_count = c.mamba_slots_count + 12;
  const int64_t slot_bytes = int64_t{m.mamba_layers_count()} *
                             (m.mamba.conv_state_floats() + m.mamba.ssm_state_floats()) * 4;
  EXPECT_EQ(cuda_kv_sizing(m, more, options).workspace_bytes -
                cuda_kv_sizing(m, c, options).workspace_bytes,
            12 * slot_bytes);
  CudaBackend bigger(hybrid(), more, options);
  EXPECT_EQ(bigger.memory_report().workspace_bytes - cuda.memory_report().workspace_bytes,
            12 * slot_bytes);
}

// ---- The record's state digests on the device ----------------------------------------------

// Every recorded step of the rules script (prefill, decode with checkpoints, a copy-on-write
// branch), eagerly and with decode graphs (the digests inside the record tail graphs): each row's
// state digest is the definition (core/logits_digest.h, the portable loop) over the row's working
// slot as read back after the step, and read_mamba_digests (the simulator's view) gives the same.
TEST(HybridRecord, StateDigestsAreTheWorkingSlotsDigestsAfterTheStep) {
  LS_SKIP_WITHOUT_DEVICE();
  const std::vector<ForwardOp> ops = rules_script(kSubjectAt, kCompanionAt, 7);
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    const ExecutorConfig c = rules_config();
    CudaBackend cuda(hybrid(), c,
                     CudaBackendOptions{.precision = CudaPrecision::kFp32, .graphs = graphs});
    Executor executor(c, kVocab, cuda, trace::recording_executor_options());
    std::vector<uint64_t> seen;
    for (size_t s = 0; s < ops.size(); ++s) {
      const StepResult r = executor.step(ops[s]);
      ASSERT_EQ(r.mamba_state_digests.size(), ops[s].rows.size()) << "step " << s;
      std::vector<int32_t> slots;
      for (size_t row = 0; row < ops[s].rows.size(); ++row) {
        const int32_t slot = ops[s].rows[row].mamba_working;
        const std::vector<float> state = cuda.read_mamba_state(slot);
        EXPECT_EQ(r.mamba_state_digests[row], logits_row_digest_portable(state))
            << "step " << s << " row " << row << " slot " << slot;
        slots.push_back(slot);
      }
      EXPECT_EQ(cuda.read_mamba_digests(slots), r.mamba_state_digests) << "step " << s;
      seen.insert(seen.end(), r.mamba_state_digests.begin(), r.mamba_state_digests.end());
    }
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end()) << "two steps' states digested "
                                                                    "alike: the state never moved";
    if (graphs) {
      EXPECT_GT(cuda.graph_replays_count(), 0) << "no decode step ran in a graph";
    }
    std::printf("hybrid record digests (%s): %zu steps, %ld graph replays (%ld with the tail)\n",
                graphs ? "graphs" : "eager", ops.size(),
                static_cast<long>(cuda.graph_replays_count()),
                static_cast<long>(cuda.tail_graph_replays_count()));
  }
}

// The simulator's view of slots no step touched: the digest of zeros (initialise_mamba), by the
// definition; and a slot out of range refused by name.
TEST(HybridRecord, ReadMambaDigestsOfUntouchedSlotsIsTheDigestOfZeros) {
  LS_SKIP_WITHOUT_DEVICE();
  const ExecutorConfig c = rules_config();
  CudaBackend cuda(hybrid(), c, CudaBackendOptions{.precision = CudaPrecision::kFp32});
  const std::vector<float> zeros(cuda.read_mamba_state(0).size(), 0.0f);
  const std::vector<int32_t> slots = {0, 11, 4};
  EXPECT_EQ(cuda.read_mamba_digests(slots),
            std::vector<uint64_t>(3, logits_row_digest_portable(zeros)));
  const std::vector<int32_t> bad = {12};
  EXPECT_THAT([&] { (void)cuda.read_mamba_digests(bad); },
              ThrowsMessage<Error>(HasSubstr("mamba slot 12 of 12")));
}

// The serving loop recording a hybrid on CUDA (what `lockstep generate --backend cuda --record`
// runs: the same observer, recorder and executor options), greedy and sampled requests with
// chunked prefill: the trace holds a state digest per row, and replays IDENTICAL in exact mode on
// CUDA with graphs as recorded and eagerly.
TEST(HybridRecord, ATraceRecordedOnCudaReplaysBitIdentical) {
  LS_SKIP_WITHOUT_DEVICE();
  const ModelWeights& weights = hybrid();
  const SchedulerConfig sc = served_config();
  const ExecutorConfig ec = executor_config_for(sc);
  std::vector<RequestSpec> requests = served_requests();
  for (size_t i = 1; i < requests.size(); i += 2) {
    requests[i].sampling.temperature = 0.9f, requests[i].sampling.top_k = 40;
    requests[i].sampling.seed = 100 + i;
  }
  const fs::path path =
      fs::temp_directory_path() / fmt::format("lockstep_{}_gpu_hybrid.trace", ::getpid());
  int64_t steps = 0;
  {
    CudaBackend cuda(weights, ec, CudaBackendOptions{.graphs = true});
    Scheduler scheduler(sc);
    for (const RequestSpec& r : requests) scheduler.submit(r, weights.config.vocab_size);
    Executor executor(ec, weights.config.vocab_size, cuda, trace::recording_executor_options());
    auto recorder = trace::Recorder::open(
        path, trace::make_trace_header(weights, {}, ec, cuda.name(), trace::MachineInfo{}));
    trace::TraceObserver observer(*recorder);
    steps = run_serving_loop(scheduler, executor, ServingLoopOptions{.observer = &observer})
                .steps_count;
    recorder->close();
  }
  ASSERT_GT(steps, 32);
  EXPECT_TRUE(trace::TraceReader::open(path).header().mamba_state_digests);
  for (const bool graphs : {true, false}) {
    replay::ReplayOptions options;
    options.mode = replay::ReplayMode::kExact;
    options.weights = &weights;
    options.make_backend = [graphs](const ModelWeights& w, const ExecutorConfig& c,
                                    const std::string& /*drafter: none*/, int32_t /*tp: 1*/) {
      return make_cuda_backend(w, c, CudaBackendOptions{.graphs = graphs});
    };
    const replay::ReplayReport report = replay::replay_trace(path, options);
    EXPECT_EQ(report.backend, "cuda");
    EXPECT_EQ(report.steps_compared, steps);
    EXPECT_FALSE(report.divergence.has_value())
        << "graphs " << graphs << ": diverged at step " << report.divergence->step << ", field "
        << report.divergence->field << ": expected " << report.divergence->expected
        << ", actual " << report.divergence->actual;
    std::printf("hybrid trace on CUDA (bf16): %ld steps, exact replay (graphs %d): %s\n",
                static_cast<long>(steps), graphs ? 1 : 0,
                report.divergence ? "DIVERGED" : "IDENTICAL");
  }
  fs::remove(path);
}

// ---- Retraction by swap: the working state copied out with the pages and back in -------------

// A script of steps and, between them, the cache ops the scheduler would run (copy_pages).
using ScriptItem = std::variant<ForwardOp, CacheOp>;

constexpr RequestId kOther = 7;
constexpr int32_t kBeforeSwap = 4;  // the subject's decode steps before it is swapped out
constexpr int32_t kAfterSwap = 8;   // and after it is back
constexpr int32_t kSwappedPages = (kPrompt + kBeforeSwap + 3) / 4;  // P 4: every page of its vcl

// The subject (request 42, pool row 1, slot 0, pages 20..35) prefills its 37 tokens and decodes
// kBeforeSwap steps; then another request prefills alone; then the subject decodes kAfterSwap
// more steps. `swap`: in between the subject is swapped out (its pages 20.. to host pages 0..,
// slot 0's state with them), the other request takes its slot and its first pages (its first
// chunk zeroes the slot, its KV overwrites the pages), and the subject comes back on pool row 3,
// slot 5 and pages 100.. — a swap-in of the host pages and the state, and a decode row resuming
// at its vcl with its last token as input, as Scheduler::recover_by_swap plans it. Without
// `swap` the subject stays where it is and the other request uses slot 1 and pages 60..: every
// step has the same shapes in both scripts.
std::vector<ScriptItem> swap_script(bool swap, int32_t last_token) {
  std::vector<ScriptItem> items;
  ForwardOp prefill;
  prefill.rows.push_back(prefill_row(kSubject, 1, 0, kPrompt, kPrompt));
  prefill.rows[0].mamba_working = 0, prefill.rows[0].refresh = {0, pages_from(20, 16)};
  prefill.rows[0].sampling = SamplingParams{};
  prefill.prefill_token_ids = prompt_for(kSubject, kPrompt);
  items.emplace_back(prefill);
  ForwardOp decode;
  decode.rows.push_back(decode_row(kSubject, 1));
  decode.rows[0].mamba_working = 0;
  for (int32_t s = 0; s < kBeforeSwap; ++s) items.emplace_back(decode);
  const std::vector<int32_t> host_pages = pages_from(0, kSwappedPages);
  if (swap) {
    items.emplace_back(CacheOp{.kind = CacheOpKind::kSwapOut,
                               .device_pages = pages_from(20, kSwappedPages),
                               .host_pages = host_pages, .state_slot = 0});
  }
  ForwardOp other;
  other.rows.push_back(prefill_row(kOther, 2, 0, 20, 20));
  other.rows[0].mamba_working = swap ? 0 : 1;
  other.rows[0].refresh = {0, pages_from(swap ? 20 : 60, 6)};
  other.rows[0].sampling = SamplingParams{};
  other.prefill_token_ids = prompt_for(kOther, 20);
  items.emplace_back(other);
  if (!swap) {
    for (int32_t s = 0; s < kAfterSwap; ++s) items.emplace_back(decode);
    return items;
  }
  items.emplace_back(CacheOp{.kind = CacheOpKind::kSwapIn,
                             .device_pages = pages_from(100, kSwappedPages),
                             .host_pages = host_pages, .state_slot = 5});
  ForwardOp resume;
  resume.rows.push_back(decode_row(kSubject, 3));
  OpRow& row = resume.rows[0];
  row.mamba_working = 5, row.refresh = {0, pages_from(100, 16)}, row.sampling = SamplingParams{};
  row.decode_override = last_token, row.hist_token_length = kPrompt + kBeforeSwap;
  items.emplace_back(resume);
  ForwardOp back = decode;
  back.rows[0].pool_row = 3, back.rows[0].mamba_working = 5;
  for (int32_t s = 1; s < kAfterSwap; ++s) items.emplace_back(back);
  return items;
}

// Each step's logits and tokens, and the subject's working state after each item (a step or a
// cache op), read from its slot of the moment.
struct SwapRun {
  std::vector<StepTrace> steps;
  std::vector<std::vector<float>> subject_states;
};

SwapRun run_swap_script(const std::vector<ScriptItem>& items, CudaBackendOptions options) {
  ExecutorConfig c = rules_config();
  c.host_pages_count = kSwappedPages + 2;
  CudaBackend cuda(hybrid(), c, options);
  Executor executor(c, kVocab, cuda, ExecutorOptions{.capture_logits = true});
  SwapRun run;
  int32_t subject_slot = 0;
  for (const ScriptItem& item : items) {
    if (const auto* cache_op = std::get_if<CacheOp>(&item)) {
      executor.copy_pages(*cache_op);
      if (cache_op->kind == CacheOpKind::kSwapIn) subject_slot = cache_op->state_slot;
    } else {
      const StepResult r = executor.step(std::get<ForwardOp>(item));
      run.steps.push_back(StepTrace{r.logits, r.tokens, {}});
    }
    run.subject_states.push_back(cuda.read_mamba_state(subject_slot));
  }
  return run;
}

// The subject's logits rows and tokens of every step it is in, in order.
std::vector<StepTrace> subject_steps(const SwapRun& run) {
  std::vector<StepTrace> out;
  for (size_t s = 0; s < run.steps.size(); ++s) {
    if (s == 1 + kBeforeSwap) continue;  // the other request's step
    out.push_back(run.steps[s]);
  }
  return out;
}

// On CUDA (fp32 and bf16, eager and with decode graphs): a request swapped out and back in — its
// slot and first pages meanwhile taken and overwritten by another request — gives the tokens and
// logits bits it gives without retraction, its state is restored bit for bit into the new slot,
// and the request that took its slot gives the same bits too.
TEST(HybridSwap, ASwappedRequestGivesTheBitsItGivesWithoutRetraction) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const CudaPrecision precision : {CudaPrecision::kFp32, CudaPrecision::kBf16}) {
    for (const bool graphs : {false, true}) {
      SCOPED_TRACE(fmt::format("{} {}", to_string(precision), graphs ? "graphs" : "eager"));
      const CudaBackendOptions options{.precision = precision, .graphs = graphs};
      const SwapRun stay = run_swap_script(swap_script(false, -1), options);
      // The decode input of the resumed row: the subject's last token before the swap.
      const int32_t last_token = stay.steps[kBeforeSwap].tokens.at(0);
      const SwapRun swapped = run_swap_script(swap_script(true, last_token), options);
      const std::vector<StepTrace> a = subject_steps(stay), b = subject_steps(swapped);
      ASSERT_EQ(a.size(), b.size());
      for (size_t s = 0; s < a.size(); ++s) {
        EXPECT_EQ(a[s].tokens, b[s].tokens) << "subject step " << s;
        EXPECT_TRUE(same_bits(a[s].logits, b[s].logits)) << "subject step " << s;
      }
      const size_t other_step = 1 + kBeforeSwap;
      EXPECT_EQ(stay.steps[other_step].tokens, swapped.steps[other_step].tokens);
      EXPECT_TRUE(same_bits(stay.steps[other_step].logits, swapped.steps[other_step].logits))
          << "the other request's first chunk did not start from a zeroed slot";
      // swapped: items prefill, decodes, swap out, other, swap in, resume...; stay: no cache ops.
      const size_t before_swap = static_cast<size_t>(kBeforeSwap);  // after the last decode
      const std::vector<float>& saved = swapped.subject_states[before_swap];
      EXPECT_TRUE(same_bits(swapped.subject_states[before_swap + 1], saved)) << "swap out";
      EXPECT_FALSE(same_bits(swapped.subject_states[before_swap + 2], saved))
          << "the other request did not overwrite the subject's old slot";
      EXPECT_TRUE(same_bits(swapped.subject_states[before_swap + 3], saved))
          << "the swap-in did not restore the state into slot 5";
      EXPECT_TRUE(same_bits(stay.subject_states[before_swap], saved));
      EXPECT_GT(gpu_test::norm(saved), 0.0);
    }
  }
}

// Counts the scheduler's retractions by path.
class RetractionCounter final : public StepObserver {
 public:
  void on_step_input(int64_t, const ForwardOp&, const std::vector<CacheOp>& cache_ops,
                     const StepFaults&) override {
    for (const CacheOp& c : cache_ops) state_slots += c.state_slot >= 0 ? 1 : 0;
  }
  void on_step_output(int64_t, const ForwardOp&, const StepResult&, const StateSnapshot&) override {}
  void on_scheduler_events(int64_t, const std::vector<SchedulerEvent>& events) override {
    for (const SchedulerEvent& e : events) {
      if (e.kind == SchedulerEvent::Kind::kRetract) {
        ++(e.retract_path == RetractPath::kSwap ? swaps : recomputes);
      }
    }
  }
  int32_t swaps = 0, recomputes = 0, state_slots = 0;
};

// The served requests through the scheduler, with the run-ahead loop (a recording executor keeps
// it with an observer), counting retractions.
gpu_test::Outcomes serve_counting(Backend& backend, const SchedulerConfig& sc,
                                  const std::vector<RequestSpec>& requests,
                                  RetractionCounter& counter) {
  Scheduler scheduler(sc);
  for (const RequestSpec& r : requests) scheduler.submit(r, kVocab);
  Executor executor(executor_config_for(sc), kVocab, backend, trace::recording_executor_options());
  run_serving_loop(scheduler, executor, ServingLoopOptions{.observer = &counter});
  EXPECT_EQ(scheduler.check_accounting(), "");
  gpu_test::Outcomes out;
  for (const auto& [id, outcome] : scheduler.outcomes()) out[id] = outcome.tokens;
  return out;
}

// The served workload under page pressure that retracts by swap (host pages; each swap carrying
// the working state), on CUDA fp32 with graphs and the run-ahead loop: the CPU reference's tokens
// under the same limits are its tokens without retraction (HybridServing.* on the CPU, bit for
// bit), and CUDA agrees with them as the acceptance asks (≥ 95%); CUDA with and without
// retraction is printed beside it (its products see other batch shapes, so near-tie tokens may
// flip: a figure, not a claim).
TEST(HybridSwap, ServedWithSwapRetractionAgreesWithTheCpu) {
  LS_SKIP_WITHOUT_DEVICE();
  SchedulerConfig tight = served_config();
  tight.pages_count = 48;  // 8 rows of up to 11 pages: requests are retracted and swapped back
  tight.host_pages_count = 200;
  const std::vector<RequestSpec> requests = served_requests();
  RetractionCounter cpu_count, cuda_count, roomy_count;
  CpuBackend cpu(hybrid(), executor_config_for(tight));
  const gpu_test::Outcomes expected = serve_counting(cpu, tight, requests, cpu_count);
  for (const auto& [id, tokens] : expected) ASSERT_EQ(tokens.size(), 32u) << id;
  const CudaBackendOptions options{.precision = CudaPrecision::kFp32, .graphs = true};
  CudaBackend cuda(hybrid(), executor_config_for(tight), options);
  const gpu_test::Outcomes swapped = serve_counting(cuda, tight, requests, cuda_count);
  EXPECT_GT(cuda_count.swaps, 0) << "no retraction by swap: the pages are not tight enough";
  EXPECT_GT(cuda_count.state_slots, 0) << "no swap carried a state";
  const auto agreement = gpu_test::compare(expected, swapped);
  print_agreement("hybrid with swap retraction, CUDA fp32 graphs vs CPU", agreement);
  EXPECT_GE(agreement.tokens_equal * 100, agreement.tokens_total * 95);
  const SchedulerConfig roomy = served_config();
  CudaBackend cuda_roomy(hybrid(), executor_config_for(roomy), options);
  const gpu_test::Outcomes unretracted = serve_counting(cuda_roomy, roomy, requests, roomy_count);
  EXPECT_EQ(roomy_count.swaps + roomy_count.recomputes, 0);
  print_agreement("hybrid on CUDA fp32, swap retraction vs none", gpu_test::compare(unretracted, swapped));
  std::printf("hybrid swap: %d swaps on CUDA (%d on the CPU), %d cache ops with a state\n",
              cuda_count.swaps, cpu_count.swaps, cuda_count.state_slots);
}

// ---- What the CUDA backend refuses for a hybrid, by name -------------------------------------

TEST(HybridRefusals, TensorParallelismSpeculationWithSwapSeedsAndNoSlotsAreRefusedByName) {
  LS_SKIP_WITHOUT_DEVICE();
  const ExecutorConfig c = rules_config();
  EXPECT_THAT([&] { CudaBackend b(hybrid(), c, CudaBackendOptions{.tp_degree = 2}); },
              ThrowsMessage<Error>(HasSubstr("tensor parallelism is not implemented")));
  ExecutorConfig spec_with_swap = c;  // speculative decoding runs; with swap retraction it does not
  spec_with_swap.verify_width = 2;
  spec_with_swap.host_pages_count = 8;
  EXPECT_THAT([&] { CudaBackend b(hybrid(), spec_with_swap); },
              ThrowsMessage<Error>(HasSubstr("speculative decoding with retraction by swap is not "
                                             "implemented")));
  ExecutorConfig no_slots = c;
  no_slots.mamba_slots_count = 0;
  EXPECT_THAT([&] { CudaBackend b(hybrid(), no_slots); },
              ThrowsMessage<Error>(HasSubstr("mamba_slots_count is 0")));
  ModelWeights all_mamba = hybrid();
  all_mamba.config.layer_kinds.assign(all_mamba.config.layer_kinds.size(), LayerKind::kMamba2);
  EXPECT_THAT([&] { CudaBackend b(all_mamba, c); },
              ThrowsMessage<Error>(HasSubstr("has no attention layer")));
  EXPECT_THAT([&] { CudaBackend b(DeviceSeededWeights{hybrid().config, 5}, c); },
              ThrowsMessage<Error>(HasSubstr("seeded weights have no layout for the mixer")));
}

}  // namespace
}  // namespace ls
