// Speculative decoding's drafter on the CUDA backend (issue 7's GPU part):
//   - the device n-gram drafter against core/drafter.cpp's NgramDrafter on random histories with
//     planted repeats, loops that run past the history's end, windows that start late, and
//     windows of 1..4 tokens, at W in {2, 4, 8, 16}: every proposed id equal;
//   - spec invariance on the GPU: `tiny` in fp32, 32 prompts × 64 greedy tokens, W in {2, 4, 8}
//     with the n-gram drafter give token for token what W = 1 gives, graphs on and off;
//   - the CUDA backend's drafts (future_input_map via read_state) equal the CPU backend's step by
//     step on one workload fed to both (chunked prefill, prefix-cache hits, retraction by swap and
//     recovery, a forced output), so the history rules match too.
// Labelled `gpu`: run on the H200, skipped without a device.
#include "core/cpu_backend.h"
#include "core/drafter.h"
#include "kernels/cuda_backend.h"
#include "kernels/drafter_ops.h"
#include "tests/gpu/backend_test_support.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/test_support.h"

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace ls {
namespace {

using gpu_test::DeviceBuffer;

const ModelWeights& tiny() { return testing::tiny_weights(); }
constexpr int32_t kTinyVocab = 512;

// --- the kernel against NgramDrafter ---------------------------------------------------------------

constexpr int32_t kVocab = 512;
constexpr int32_t kStride = 2100;  // > 8 · 256: windows longer than eight passes of the block

// One history row: ids over the whole stride (junk outside the window, which must not matter),
// the window [begin, position].
struct HistoryRow {
  std::vector<int32_t> ids;  // [kStride]
  int32_t begin = 0;
  int32_t position = 0;
};

int32_t pick(std::mt19937& rng, int32_t lo, int32_t hi) {  // inclusive, platform-stable
  return lo + static_cast<int32_t>(rng() % static_cast<uint32_t>(hi - lo + 1));
}

// Six kinds of window, by r % 6: a 4-id alphabet (matches of every n everywhere); the full vocab
// (few matches: mostly the bonus fallback); a planted copy of an earlier segment; a short loop at
// the end (the copy runs past the history's end over its own drafts); a window of 1..4 ids; and a
// late begin whose only earlier match lies before the window (it must not be found).
HistoryRow make_row(int32_t r, std::mt19937& rng) {
  HistoryRow h;
  h.ids.resize(kStride);
  const int32_t kind = r % 6;
  const int32_t alphabet = kind == 0 ? 4 : kind == 2 || kind == 3 ? 64 : kVocab;
  for (int32_t& x : h.ids) x = pick(rng, 0, alphabet - 1);
  const int32_t long_window = r % 12 < 6 ? 40 : kStride - 8;
  h.begin = kind == 5 ? pick(rng, 20, 200) : pick(rng, 0, 30);
  // Kind 5's window holds distinct ids: at most 251 of them.
  h.position = std::min(kStride - 1, h.begin + pick(rng, 8, kind == 5 ? 250 : long_window));
  if (kind == 2) {
    const int32_t length = pick(rng, 3, 24);
    const int32_t window = h.position - h.begin + 1;
    if (window > 2 * length + 2) {
      const int32_t from = h.begin + pick(rng, 0, window - 2 * length - 2);
      std::copy_n(h.ids.begin() + from, length, h.ids.begin() + (h.position + 1 - length));
    }
  } else if (kind == 3) {
    const int32_t period = pick(rng, 1, 5);
    const int32_t repeats = pick(rng, 2, 5);
    const int32_t first = h.position + 1 - period * repeats;
    for (int32_t i = std::max(first, h.begin + period); i <= h.position; ++i) h.ids[i] = h.ids[i - period];
  } else if (kind == 4) {
    h.position = h.begin + pick(rng, 0, 3);
  } else if (kind == 5) {
    // The window's last three ids occur right before it, and nowhere inside it.
    for (int32_t i = h.begin; i <= h.position; ++i) h.ids[i] = 100 + (i - h.begin) % 300;
    for (int32_t j = 0; j < 3; ++j) h.ids[h.begin - 3 + j] = h.ids[h.position - 2 + j];
  }
  return h;
}

std::vector<int32_t> cpu_next_inputs(const HistoryRow& h, int32_t w) {
  const int32_t bonus = h.ids[h.position];
  std::vector<int32_t> next(static_cast<size_t>(w), bonus);
  const DraftContext context{
      .request_id = 1,
      .history = std::span<const int32_t>(h.ids.data() + h.begin,
                                          static_cast<size_t>(h.position - h.begin + 1)),
      .history_begin = h.begin,
      .bonus = bonus,
      .position = h.position,
      .verify_width = w,
      .vocab_size = kVocab,
  };
  NgramDrafter().draft(context, std::span<int32_t>(next.data() + 1, static_cast<size_t>(w - 1)));
  for (int32_t& x : next) x = std::clamp(x, 0, kVocab - 1);
  return next;
}

class NgramKernel : public ::testing::TestWithParam<int32_t> {};

TEST_P(NgramKernel, ProposesWhatNgramDrafterProposes) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t w = GetParam();
  const int32_t rows = 600;
  const uint32_t seed = 4242 + static_cast<uint32_t>(w);
  std::printf("reproduce: NgramKernel W %d, seed %u, %d rows of stride %d\n", w, seed, rows, kStride);
  std::mt19937 rng(seed);
  std::vector<HistoryRow> history;
  std::vector<int32_t> flat, begins, positions;
  for (int32_t r = 0; r < rows; ++r) {
    history.push_back(make_row(r, rng));
    flat.insert(flat.end(), history.back().ids.begin(), history.back().ids.end());
    begins.push_back(history.back().begin);
    positions.push_back(history.back().position);
  }
  DeviceBuffer<int32_t> d_history(flat), d_begins(begins), d_positions(positions);
  DeviceBuffer<int32_t> d_next(static_cast<size_t>(rows) * w);
  ASSERT_EQ(kernels::launch_ngram_drafts(d_history.ptr, kStride, d_begins.ptr, d_positions.ptr, rows,
                                         w, kVocab, d_next.ptr, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int32_t> next = d_next.download();
  int32_t drafted = 0, fallback = 0, mismatches = 0;
  for (int32_t r = 0; r < rows; ++r) {
    const std::vector<int32_t> expected = cpu_next_inputs(history[r], w);
    const std::vector<int32_t> actual(next.begin() + static_cast<ptrdiff_t>(r) * w,
                                      next.begin() + static_cast<ptrdiff_t>(r + 1) * w);
    const bool all_bonus = std::all_of(expected.begin(), expected.end(),
                                       [&](int32_t x) { return x == expected[0]; });
    (all_bonus ? fallback : drafted) += 1;
    if (actual != expected && mismatches++ < 5) {
      ADD_FAILURE() << fmt::format("W {} seed {} row {} (kind {}, window [{}, {}]): expected [{}], "
                                   "got [{}]",
                                   w, seed, r, r % 6, history[r].begin, history[r].position,
                                   fmt::join(expected, " "), fmt::join(actual, " "));
    }
  }
  std::printf("NgramKernel W %d: %d rows drafted from a match, %d fell back to the bonus, %d "
              "mismatches\n", w, drafted, fallback, mismatches);
  EXPECT_EQ(mismatches, 0);
  // Both outcomes occur often enough that the comparison means something.
  EXPECT_GT(drafted, rows / 3);
  EXPECT_GT(fallback, rows / 20);
}

INSTANTIATE_TEST_SUITE_P(Widths, NgramKernel, ::testing::Values(2, 4, 8, 16));

TEST(CudaDrafterOptions, AnUnknownDrafterIsAClearError) {
  ExecutorConfig c = testing::small_config();
  c.verify_width = 4;
  CudaBackendOptions options;
  options.drafter = "oracle-mix(p=0.50)";
  try {
    CudaBackend backend(tiny(), c, options);
    FAIL() << "an oracle-mix drafter was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown drafter 'oracle-mix(p=0.50)'"), std::string::npos)
        << e.what();
  }
}

// --- spec invariance on the GPU ----------------------------------------------------------------------

// 32 greedy requests: even ones repeat a short phrase (prompt lookup's workload), odd ones do not.
std::vector<RequestSpec> spec_requests(int32_t new_tokens) {
  std::vector<RequestSpec> requests;
  for (int32_t i = 0; i < 32; ++i) {
    RequestSpec r;
    r.id = static_cast<RequestId>(i + 1);
    if (i % 2 == 0) {
      const int32_t phrase = 3 + i % 6;
      const int32_t length = 12 + (i * 7) % 29;
      for (int32_t t = 0; t < length; ++t) {
        r.prompt.push_back(static_cast<int32_t>((r.id * 53 + (t % phrase) * 29 + 7) % kTinyVocab));
      }
    } else {
      r.prompt = testing::prompt_for(r.id, 1 + (i * 13 + 5) % 40);
    }
    r.max_new_tokens = new_tokens;
    requests.push_back(std::move(r));
  }
  return requests;
}

// A budget of 16 rows × W = 8 and more: the widest rows never crowd each other out of a step, so
// accepted drafts show up as fewer steps (the CPU reference takes 132 steps at W = 1, 125, 122
// and 121 at W = 2, 4, 8 with the n-gram drafter on this workload).
SchedulerConfig spec_scheduler(int32_t width) {
  SchedulerConfig c;
  c.max_batch_rows = 16;
  c.prefill_chunk_tokens = 256;
  c.page_size = 16;
  c.pages_count = 400;
  c.context_length = 256;
  c.verify_width = width;
  return c;
}

class CudaSpecInvariance : public ::testing::TestWithParam<bool> {};

// Issue 7's acceptance on the GPU, in the fp32 mode (only the order of sums differs from the CPU
// reference, whose every sequence the W = 1 run equals in cuda_backend_gpu_test): greedy tokens
// with the n-gram drafter at W = 2, 4, 8 are the W = 1 tokens, and drafting saves steps.
TEST_P(CudaSpecInvariance, GreedyTokensWithTheNgramDrafterEqualWidthOne) {
  LS_SKIP_WITHOUT_DEVICE();
  const bool graphs = GetParam();
  const auto requests = spec_requests(64);
  const CudaBackendOptions plain{.precision = CudaPrecision::kFp32, .graphs = graphs};
  const SchedulerConfig sc1 = spec_scheduler(1);
  CudaBackend reference_backend(tiny(), executor_config_for(sc1), plain);
  const gpu_test::Served reference = gpu_test::serve(reference_backend, sc1, kTinyVocab, requests);
  ASSERT_EQ(reference.tokens.size(), 32u);
  for (const auto& [id, tokens] : reference.tokens) ASSERT_EQ(tokens.size(), 64u) << id;
  for (const int32_t w : {2, 4, 8}) {
    CudaBackendOptions options = plain;
    options.drafter = "ngram";
    const SchedulerConfig sc = spec_scheduler(w);
    CudaBackend backend(tiny(), executor_config_for(sc), options);
    const gpu_test::Served run = gpu_test::serve(backend, sc, kTinyVocab, requests);
    const gpu_test::Agreement a = gpu_test::compare(reference.tokens, run.tokens);
    std::printf("spec invariance (fp32, graphs %d), W %d + ngram: %d of %d sequences equal W = 1; "
                "%ld steps against %ld, %.3f tokens per step against %.3f\n",
                graphs ? 1 : 0, w, a.equal_count, a.total_count, static_cast<long>(run.steps),
                static_cast<long>(reference.steps),
                static_cast<double>(run.generated) / static_cast<double>(run.steps),
                static_cast<double>(reference.generated) / static_cast<double>(reference.steps));
    EXPECT_EQ(a.equal_count, 32) << "W " << w << ", graphs " << graphs << ": first mismatch: request "
                                 << a.first_mismatch << " at token " << a.first_mismatch_index;
    // Accepted drafts: fewer steps for the same tokens.
    EXPECT_LT(run.steps, reference.steps) << "W " << w << ": no draft was ever accepted";
    if (graphs) {
      EXPECT_GT(backend.graph_replays_count(), 0);
      // The verify and the drafter ran inside the decode graph.
      EXPECT_GT(backend.tail_graph_replays_count(), 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GraphsOffOn, CudaSpecInvariance, ::testing::Values(false, true));

// --- the backend's drafts against the CPU's ------------------------------------------------------------

struct LockstepReport {
  int64_t steps = 0;
  int64_t drafted_rows = 0;    // op rows whose next inputs hold a draft other than the bonus
  int64_t recoveries = 0;      // decode rows with hist_token_length (a swap-in)
  int64_t prefix_rows = 0;     // first prefill chunks that start past 0 (a prefix-cache hit)
  bool diverged = false;       // the tokens differed (a near tie): comparison stopped there
};

// Drives one scheduler with the CPU backend's results and feeds every op to both backends (the
// n-gram drafter on each); after every step the accepted lengths, vcl and every pool row's
// future inputs must be equal. At step `force_at` one decode row's output is forced to another
// id: the result carries it, but the device commits the sampled token (both backends).
LockstepReport lockstep_drafts(const SchedulerConfig& sc, const std::vector<RequestSpec>& requests,
                               bool graphs, int64_t force_at) {
  const ExecutorConfig ec = executor_config_for(sc);
  CpuBackend cpu(tiny(), ec, nullptr, false, std::make_unique<NgramDrafter>());
  CudaBackendOptions options{.precision = CudaPrecision::kFp32, .graphs = graphs};
  options.drafter = "ngram";
  CudaBackend cuda(tiny(), ec, options);
  Executor cpu_exec(ec, kTinyVocab, cpu), cuda_exec(ec, kTinyVocab, cuda);
  Scheduler scheduler(sc);
  for (const RequestSpec& r : requests) scheduler.submit(r, kTinyVocab);
  std::vector<int32_t> all_rows(static_cast<size_t>(ec.pool_rows_count()));
  std::iota(all_rows.begin(), all_rows.end(), 0);
  const size_t w = static_cast<size_t>(ec.verify_width);
  LockstepReport report;
  int32_t idle = 0;
  bool forced = false;
  while (!scheduler.done()) {
    StepPlanOut plan = scheduler.plan();
    for (const CacheOp& c : plan.cache_ops) {
      cpu_exec.copy_pages(c);
      cuda_exec.copy_pages(c);
    }
    if (plan.op.rows.empty()) {
      EXPECT_LT(++idle, 1000) << "stuck";
      if (idle >= 1000) break;
      continue;
    }
    idle = 0;
    const int32_t last_row = plan.op.rows_count() - 1;
    if (!forced && report.steps >= force_at && plan.op.rows[last_row].kind == RowKind::kDecode) {
      forced = true;
      cpu_exec.force_next_output(last_row, 3);  // the row's first emitted token
      cuda_exec.force_next_output(last_row, 3);
    }
    const StepResult a = cpu_exec.step(plan.op);
    const StepResult b = cuda_exec.step(plan.op);
    const std::string where = fmt::format("step {} ({} rows, {} prefill)", report.steps,
                                          plan.op.rows_count(), plan.op.prefill_rows_count());
    ++report.steps;
    if (a.tokens != b.tokens) {
      std::printf("lockstep drafts: tokens differ at %s (a near tie in fp32): compared up to it\n",
                  where.c_str());
      report.diverged = true;
      break;
    }
    EXPECT_EQ(a.accepted_lengths, b.accepted_lengths) << where;
    const StateSnapshot sa = cpu.read_state(all_rows), sb = cuda.read_state(all_rows);
    EXPECT_EQ(sa.valid_cache_length, sb.valid_cache_length) << where;
    for (size_t p = 0; p < all_rows.size(); ++p) {
      const std::vector<int32_t> ea(sa.future_inputs.begin() + p * w, sa.future_inputs.begin() + (p + 1) * w);
      const std::vector<int32_t> eb(sb.future_inputs.begin() + p * w, sb.future_inputs.begin() + (p + 1) * w);
      if (ea != eb) {
        ADD_FAILURE() << where << ", pool row " << p << ": CPU next inputs [" << fmt::format("{}", fmt::join(ea, " "))
                      << "], CUDA [" << fmt::format("{}", fmt::join(eb, " ")) << "]";
      }
    }
    if (::testing::Test::HasFailure()) break;
    for (const OpRow& row : plan.op.rows) {
      const size_t p = static_cast<size_t>(row.pool_row);
      const auto first = sa.future_inputs.begin() + static_cast<ptrdiff_t>(p * w);
      report.drafted_rows += std::any_of(first + 1, first + static_cast<ptrdiff_t>(w),
                                         [&](int32_t x) { return x != *first; });
      report.recoveries += row.kind == RowKind::kDecode && row.hist_token_length != -1;
      report.prefix_rows += row.kind == RowKind::kPrefill && row.prefix_length > 0 &&
                            row.sampling.has_value();
    }
    scheduler.apply_result(plan.op, a);
  }
  return report;
}

// Requests sharing a 48-token prefix (three full pages: prefix-cache hits start their history
// late) with repetitive tails, and longer prompts chunked under the token budget.
std::vector<RequestSpec> drafter_requests() {
  std::vector<RequestSpec> requests;
  const std::vector<int32_t> shared = testing::prompt_for(999, 48);
  for (int32_t i = 0; i < 12; ++i) {
    RequestSpec r;
    r.id = static_cast<RequestId>(100 + i);
    if (i % 3 != 2) r.prompt = shared;
    const int32_t phrase = 2 + i % 5;
    for (int32_t t = 0; t < 10 + (i * 11) % 50; ++t) {
      r.prompt.push_back(static_cast<int32_t>((r.id * 37 + (t % phrase) * 61) % kTinyVocab));
    }
    r.max_new_tokens = 24 + (i * 7) % 40;
    requests.push_back(std::move(r));
  }
  return requests;
}

TEST(CudaDrafter, DraftsEqualTheCpuWithPrefixHitsAndChunkedPrefill) {
  LS_SKIP_WITHOUT_DEVICE();
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(fmt::format("graphs {}", graphs));
    SchedulerConfig sc;
    sc.max_batch_rows = 4;
    sc.prefill_chunk_tokens = 40;
    sc.page_size = 16;
    sc.pages_count = 200;
    sc.context_length = 192;
    sc.verify_width = 4;
    sc.overlap = false;
    const LockstepReport r = lockstep_drafts(sc, drafter_requests(), graphs, 30);
    std::printf("drafts vs CPU (W 4, graphs %d): %ld steps, %ld rows drafted, %ld prefix-hit "
                "prefills%s\n", graphs ? 1 : 0, static_cast<long>(r.steps),
                static_cast<long>(r.drafted_rows), static_cast<long>(r.prefix_rows),
                r.diverged ? ", stopped at a near tie" : "");
    EXPECT_GE(r.steps, 60);
    EXPECT_GT(r.drafted_rows, 20);
    EXPECT_GT(r.prefix_rows, 0) << "no prefix-cache hit: the late-history rule went untested";
  }
}

TEST(CudaDrafter, DraftsEqualTheCpuThroughRetractionAndRecovery) {
  LS_SKIP_WITHOUT_DEVICE();
  SchedulerConfig sc;
  sc.max_batch_rows = 4;
  sc.prefill_chunk_tokens = 48;
  sc.page_size = 4;
  sc.context_length = 160;
  sc.verify_width = 3;
  sc.pages_count = 2 * ((160 + 2 * 3) / 4 + 2) + 1;  // about two full contexts: decode growth retracts
  sc.host_pages_count = 120;
  sc.prefix_cache = false;
  sc.overlap = false;
  const LockstepReport r = lockstep_drafts(sc, drafter_requests(), false, 25);
  std::printf("drafts vs CPU (W 3, tight pages): %ld steps, %ld rows drafted, %ld recoveries%s\n",
              static_cast<long>(r.steps), static_cast<long>(r.drafted_rows),
              static_cast<long>(r.recoveries), r.diverged ? ", stopped at a near tie" : "");
  EXPECT_GE(r.steps, 60);
  EXPECT_GT(r.drafted_rows, 20);
  EXPECT_GT(r.recoveries, 0) << "no swap-in recovery: the recovered-history rule went untested";
}

}  // namespace
}  // namespace ls
