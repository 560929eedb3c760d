// The device sampler against core/sampling.cpp on IDENTICAL logits: greedy (lowest id on ties),
// temperature, top-k, top-p, min-p and their mixes draw the same tokens from the same Philox
// counters; decode rows verify (W = 3, greedy and stochastic) and commit exactly as CpuBackend
// does, context clamp included; forced outputs, the OOV flag and the output clamp; logprobs.
#include "core/ops/context_clamp.h"
#include "core/sampling.h"
#include "kernels/logits_ops.h"
#include "kernels/sampling_ops.h"
#include "tests/gpu/gpu_test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>

namespace ls {
namespace {

using gpu_test::DeviceBuffer;
using kernels::SamplingRow;
using kernels::StepHeader;

ResolvedSampling sampling_case(int32_t r) {
  ResolvedSampling s;
  s.seed = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(r + 1);
  switch (r % 6) {
    case 0: s.top_k = 1; break;  // greedy
    case 1: s.temperature = 0.7f, s.top_k = SamplingParams::kTopKMax; break;
    case 2: s.temperature = 1.0f, s.top_k = 40; break;
    case 3: s.temperature = 0.9f, s.top_k = SamplingParams::kTopKMax, s.top_p = 0.9f; break;
    case 4: s.temperature = 1.3f, s.top_k = SamplingParams::kTopKMax, s.min_p = 0.05f; break;
    default: s.temperature = 0.5f, s.top_k = 100, s.top_p = 0.8f, s.min_p = 0.02f; break;
  }
  return s;
}

SamplingRow device_row(const ResolvedSampling& s) {
  return SamplingRow{static_cast<uint32_t>(s.seed), static_cast<uint32_t>(s.seed >> 32),
                     s.temperature, s.top_k, s.top_p, s.min_p};
}

// Peaked logits (a few large values over a random floor) so that the filters bite; ties planted.
std::vector<float> make_logits(int32_t rows, int32_t vocab, uint32_t seed) {
  std::vector<float> logits = gpu_test::random_floats(size_t(rows) * vocab, seed, -4, 4);
  for (int32_t r = 0; r < rows; ++r) {
    float* row = logits.data() + size_t(r) * vocab;
    for (int32_t j = 0; j < 20; ++j) row[(r * 7919 + j * 104729) % vocab] += 6.0f - 0.25f * static_cast<float>(j);
    row[(r * 31) % vocab] = row[(r * 37 + 1) % vocab] = 12.0f;  // a tie at the top
  }
  return logits;
}

// One step's device inputs, built by hand (the backend builds the same from a StepPlan).
struct Step {
  Step(int32_t rows, int32_t w, int32_t vocab, int32_t pool_rows, int32_t tokens)
      : header(16), pool_rows_d(size_t(rows)), lengths(size_t(rows)), offsets(size_t(rows)),
        prefix(size_t(rows)), overrides(size_t(rows)), force(size_t(rows)),
        sampling(size_t(rows) * 6), forced(64), dummy(1), table(size_t(pool_rows)),
        vcl(size_t(pool_rows)), fim(size_t(pool_rows) * w), vcl_before(size_t(rows)),
        input_ids(size_t(tokens)), results(size_t(rows) * (2 * w + 3)), keys(size_t(rows) * w * vocab),
        sorted(size_t(rows) * w * vocab), argmax(size_t(rows) * w), nan(size_t(rows) * w),
        row_max(size_t(rows) * w), row_sum(size_t(rows) * w),
        block_sums(size_t(rows) * w * size_t(ops::order_sum_stride(vocab))),
        block_prefixes(size_t(rows) * w * size_t(ops::order_sum_stride(vocab))),
        offsets_seg(size_t(rows) * w + 1) {}

  kernels::StepInputs inputs() const {
    return kernels::StepInputs{reinterpret_cast<const StepHeader*>(header.ptr), pool_rows_d.ptr,
                               lengths.ptr, offsets.ptr, prefix.ptr, overrides.ptr, force.ptr,
                               dummy.ptr, reinterpret_cast<const SamplingRow*>(sampling.ptr),
                               dummy.ptr, dummy.ptr, forced.ptr, dummy.ptr, dummy.ptr};
  }

  DeviceBuffer<int32_t> header, pool_rows_d, lengths, offsets, prefix, overrides, force, sampling,
      forced, dummy, table, vcl, fim, vcl_before, input_ids, results;
  DeviceBuffer<uint64_t> keys, sorted;
  DeviceBuffer<int32_t> argmax, nan;
  DeviceBuffer<float> row_max, row_sum, block_sums, block_prefixes;
  DeviceBuffer<int32_t> offsets_seg;
};

std::vector<int32_t> header_words(const StepHeader& h) {
  std::vector<int32_t> words(16);
  std::memcpy(words.data(), &h, sizeof(h));
  return words;
}

std::vector<int32_t> sampling_words(const std::vector<ResolvedSampling>& rows) {
  std::vector<int32_t> words(rows.size() * 6);
  for (size_t i = 0; i < rows.size(); ++i) {
    const SamplingRow s = device_row(rows[i]);
    std::memcpy(words.data() + 6 * i, &s, sizeof(s));
  }
  return words;
}

// Runs guard → weights → sort → finish; returns the packed results.
std::vector<int32_t> run_tail(Step& st, DeviceBuffer<float>& logits, int32_t rows,
                              int32_t logits_rows, int32_t vocab, int32_t w, int32_t context) {
  const kernels::SamplingKeys keys{st.keys.ptr, st.sorted.ptr, st.block_sums.ptr,
                                   st.block_prefixes.ptr};
  std::vector<int32_t> seg(size_t(logits_rows) + 1);
  for (size_t i = 0; i < seg.size(); ++i) seg[i] = static_cast<int32_t>(i) * vocab;
  st.offsets_seg.upload(seg);
  DeviceBuffer<uint8_t> workspace(kernels::logits_pass_workspace_bytes(logits_rows, vocab));
  const kernels::LogitsPassArgs pass{.logits = logits.ptr, .rows = logits_rows, .vocab = vocab,
                                     .workspace = workspace.ptr, .nan_flags = st.nan.ptr,
                                     .argmax = st.argmax.ptr, .row_max = st.row_max.ptr,
                                     .row_sum = st.row_sum.ptr};
  EXPECT_EQ(kernels::launch_logits_pass(pass, nullptr), cudaSuccess);
  EXPECT_EQ(kernels::launch_sampling_weights(st.inputs(), logits.ptr, logits_rows, vocab, keys,
                                             nullptr),
            cudaSuccess);
  const size_t temp_bytes = kernels::sort_sampling_keys_temp_bytes(logits_rows, vocab);
  DeviceBuffer<uint8_t> temp(temp_bytes);
  EXPECT_EQ(kernels::launch_sort_sampling_keys(temp.ptr, temp_bytes, keys, logits_rows, vocab,
                                               st.offsets_seg.ptr, nullptr),
            cudaSuccess);
  EXPECT_EQ(kernels::launch_sampling_block_sums(st.inputs(), logits_rows, vocab, keys, nullptr),
            cudaSuccess);
  const size_t r = size_t(logits_rows), b = size_t(rows);
  int32_t* base = st.results.ptr;
  const kernels::FinishArgs args{
      .in = st.inputs(),
      .state = kernels::DeviceState{st.table.ptr, st.vcl.ptr, st.fim.ptr, st.vcl_before.ptr, 1, 16,
                                    w, vocab, context, 0},
      .out = kernels::ResultBuffers{base, base + r, base + r + b, base + r + 2 * b,
                                    reinterpret_cast<float*>(base + r + 3 * b)},
      .logits = logits.ptr,
      .vocab = vocab,
      .argmax = st.argmax.ptr,
      .row_nan_flags = st.nan.ptr,
      .row_max = st.row_max.ptr,
      .row_sum = st.row_sum.ptr,
      .keys = keys,
      .input_ids = st.input_ids.ptr,
  };
  EXPECT_EQ(kernels::launch_finish_rows(args, rows, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return st.results.download();
}

class SampleRows : public ::testing::TestWithParam<int32_t> {};

TEST_P(SampleRows, PrefillRowsDrawWhatTheCpuDraws) {
  LS_SKIP_WITHOUT_DEVICE();
  // 4 rows are the most the sort takes a row at a time, 5 the fewest it sorts segmented; even
  // batches have a vocabulary of whole 128-weight sum blocks, odd ones a partial last block.
  const int32_t rows = GetParam(), vocab = rows % 2 == 0 ? 32000 : 32003;
  const std::vector<float> logits = make_logits(rows, vocab, 21 + static_cast<uint32_t>(rows));
  std::vector<ResolvedSampling> sampling;
  std::vector<int32_t> pool_rows, lengths, offsets, prefix;
  for (int32_t r = 0; r < rows; ++r) {
    sampling.push_back(sampling_case(r));
    pool_rows.push_back(1 + r), lengths.push_back(1 + r % 5), prefix.push_back(13 * r);
    offsets.push_back(r == 0 ? 0 : offsets.back() + lengths[size_t(r) - 1]);
  }
  Step st(rows, 1, vocab, rows + 2, 1);
  StepHeader h;
  h.rows_count = h.prefill_rows_count = h.logits_rows_count = rows;
  h.verify_width = 1;
  h.want_logprobs = 1;
  st.header.upload(header_words(h));
  st.pool_rows_d.upload(pool_rows), st.lengths.upload(lengths), st.offsets.upload(offsets);
  st.prefix.upload(prefix), st.sampling.upload(sampling_words(sampling));
  st.vcl.upload(std::vector<int32_t>(size_t(rows) + 2, 0));
  st.fim.upload(std::vector<int32_t>(size_t(rows) + 2, 0));
  DeviceBuffer<float> d_logits(logits);
  const std::vector<int32_t> out = run_tail(st, d_logits, rows, rows, vocab, 1, 1 << 20);
  const std::vector<int32_t> vcl = st.vcl.download(), fim = st.fim.download();
  SamplingScratch scratch;
  int32_t stochastic = 0;
  for (int32_t r = 0; r < rows; ++r) {
    const std::span<const float> row(logits.data() + size_t(r) * vocab, size_t(vocab));
    const int64_t position = prefix[r] + lengths[r];
    const SampleOutcome expected = sample_token(row, sampling[r], position, scratch);
    EXPECT_EQ(out[r], expected.token) << "row " << r << " case " << r % 6;
    EXPECT_EQ(out[rows + r], 1) << "accepted, row " << r;
    EXPECT_EQ(fim[size_t(1 + r)], expected.token) << "future input, row " << r;
    EXPECT_EQ(vcl[size_t(1 + r)], lengths[r]) << "vcl, row " << r;
    // logprob under softmax at temperature 1 (CpuBackend::fill_logprobs).
    const float max_logit = *std::max_element(row.begin(), row.end());
    double sum = 0;
    for (float x : row) sum += std::exp(double{x} - max_logit);
    float lp = 0;
    std::memcpy(&lp, &out[size_t(rows) * 4 + size_t(r)], 4);
    EXPECT_NEAR(lp, row[size_t(expected.token)] - max_logit - std::log(sum), 1e-4);
    stochastic += sampling[r].top_k != 1;
  }
  if (rows >= 17) {
    EXPECT_GT(stochastic, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(OddBatches, SampleRows, ::testing::Values(1, 3, 4, 5, 17, 64));

// Step 3's weights (e^(l/T − m), core/ops/portable_exp.h on both sides) have the definition's bits
// for every id: a row sweeping [−110, 0] evenly (every power of 2 down to the subnormals and 0),
// and rows of random logits at temperatures 0.7 and 1.3. libm's expf here would differ from the
// host's in the last bit for some of these inputs.
TEST(SamplingWeights, EveryWeightHasTheDefinitionsBits) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t rows = 3, vocab = 1 << 20;
  std::vector<float> logits = gpu_test::random_floats(size_t(rows) * vocab, 5, -30, 30);
  for (int32_t i = 0; i < vocab; ++i) {
    logits[size_t(i)] = -110.0f * float(vocab - 1 - i) / float(vocab - 1);
  }
  std::vector<ResolvedSampling> sampling(rows, sampling_case(2));  // temperature 1
  sampling[1].temperature = 0.7f, sampling[2].temperature = 1.3f;
  std::vector<int32_t> ones(rows, 1), offsets(rows), pool_rows(rows), zeros(size_t(rows) + 2, 0);
  for (int32_t r = 0; r < rows; ++r) offsets[size_t(r)] = r, pool_rows[size_t(r)] = 1 + r;
  Step st(rows, 1, vocab, rows + 2, 1);
  StepHeader h;
  h.rows_count = h.prefill_rows_count = h.logits_rows_count = rows;
  h.verify_width = 1;
  st.header.upload(header_words(h));
  st.pool_rows_d.upload(pool_rows), st.lengths.upload(ones), st.offsets.upload(offsets);
  st.prefix.upload(std::vector<int32_t>(rows, 0)), st.sampling.upload(sampling_words(sampling));
  st.vcl.upload(zeros), st.fim.upload(zeros);
  DeviceBuffer<float> d_logits(logits);
  run_tail(st, d_logits, rows, rows, vocab, 1, 1 << 20);
  const std::vector<uint64_t> keys = st.keys.download();  // by id: weight bits, then the id's
  const int32_t id_bits = kernels::sampling_key_id_bits(vocab);  // complement in id_bits
  std::vector<float> weights;
  int64_t differ = 0;
  for (int32_t r = 0; r < rows; ++r) {
    const std::span<const float> row(logits.data() + size_t(r) * vocab, size_t(vocab));
    sampling_weights(row, sampling[size_t(r)].temperature, weights);
    for (int32_t i = 0; i < vocab; ++i) {
      const uint64_t key = keys[size_t(r) * vocab + size_t(i)];
      const uint32_t expected = std::bit_cast<uint32_t>(weights[size_t(i)]);
      if (static_cast<uint32_t>(key >> id_bits) != expected && differ++ < 5) {
        ADD_FAILURE() << "row " << r << " id " << i << ": device weight bits 0x" << std::hex
                      << (key >> id_bits) << ", the definition's " << weights[size_t(i)];
      }
    }
  }
  EXPECT_EQ(differ, 0);
}

class VerifyRows : public ::testing::TestWithParam<int32_t> {};

// Decode rows with W = 3 against StandardVerifier and CpuBackend::verify_decode_rows' clamp and
// commit; forced outputs (one out of range) against flag_and_clamp_outputs.
TEST_P(VerifyRows, DecodeRowsVerifyClampAndCommitLikeTheCpu) {
  LS_SKIP_WITHOUT_DEVICE();
  const int32_t rows = GetParam(), vocab = 5003, w = 3, context = 300;
  const int32_t logits_rows = rows * w;
  const std::vector<float> logits = make_logits(logits_rows, vocab, 41 + static_cast<uint32_t>(rows));
  std::vector<ResolvedSampling> sampling;
  std::vector<int32_t> pool_rows, offsets, inputs, vcl_before, force, overrides;
  for (int32_t r = 0; r < rows; ++r) {
    sampling.push_back(sampling_case(r));
    pool_rows.push_back(1 + r), offsets.push_back(r * w), overrides.push_back(-1);
    force.push_back(r % 7 == 6 ? 1 : 0);
    vcl_before.push_back(r % 4 == 3 ? context - (r % 3) : 10 + r);  // some at the context limit
    // Drafts: the argmax of the previous row where r % 2 == 0 (accepted greedily), else random.
    inputs.push_back((r * 11) % vocab);
    for (int32_t i = 1; i < w; ++i) {
      const float* prev = logits.data() + size_t(r * w + i - 1) * vocab;
      const int32_t best = static_cast<int32_t>(std::max_element(prev, prev + vocab) - prev);
      inputs.push_back(r % 2 == 0 ? best : (r * 131 + i) % vocab);
    }
  }
  // Forced outputs: one in range, one out of range (flags OOV), as result indices.
  const std::vector<int32_t> forced = {0, 17, std::min(logits_rows - 1, 4), vocab + 5};
  Step st(rows, w, vocab, rows + 2, logits_rows);
  StepHeader h;
  h.rows_count = rows, h.prefill_rows_count = 0, h.logits_rows_count = logits_rows;
  h.verify_width = w, h.forced_count = 2;
  st.header.upload(header_words(h));
  st.pool_rows_d.upload(pool_rows), st.offsets.upload(offsets), st.overrides.upload(overrides);
  st.force.upload(force), st.sampling.upload(sampling_words(sampling)), st.forced.upload(forced);
  st.input_ids.upload(inputs), st.vcl_before.upload(vcl_before);
  std::vector<int32_t> vcl(size_t(rows) + 2, 0);
  for (int32_t r = 0; r < rows; ++r) vcl[size_t(1 + r)] = vcl_before[r];
  st.vcl.upload(vcl);
  st.fim.upload(std::vector<int32_t>((size_t(rows) + 2) * w, 0));
  DeviceBuffer<float> d_logits(logits);
  const std::vector<int32_t> out = run_tail(st, d_logits, rows, logits_rows, vocab, w, context);
  const std::vector<int32_t> vcl_out = st.vcl.download(), fim = st.fim.download();

  StandardVerifier verifier;
  SamplingScratch scratch;
  std::vector<int32_t> tokens(size_t(logits_rows), 0);
  std::vector<uint8_t> oov(size_t(rows), 0);
  for (int32_t r = 0; r < rows; ++r) {
    const VerifyRow row{
        .logits = std::span<const float>(logits.data() + size_t(r) * w * vocab, size_t(w) * vocab),
        .inputs = std::span<const int32_t>(inputs.data() + size_t(r) * w, size_t(w)),
        .vocab_size = vocab,
        .sampling = sampling[r],
        .first_position = int64_t{vcl_before[r]} + 1,
        .force_single = force[r] != 0,
    };
    std::span<int32_t> o(tokens.data() + size_t(r) * w, size_t(w));
    const int32_t accepted = verifier.verify(row, o, scratch);
    const int32_t clamped = ops::clamp_accepted_to_context(accepted, vcl_before[r], context);
    // The next input is read before the tail is zeroed: with a' = 0 it is predict[0] (the CPU
    // reference's commit, core/cpu_backend.cpp).
    const int32_t last = std::clamp(o[size_t(std::max(clamped, 1) - 1)], 0, vocab - 1);
    std::fill(o.begin() + clamped, o.end(), 0);
    EXPECT_EQ(out[size_t(logits_rows + r)], clamped) << "accepted, row " << r;
    EXPECT_EQ(vcl_out[size_t(1 + r)], vcl_before[r] + clamped) << "vcl, row " << r;
    for (int32_t i = 0; i < w; ++i) EXPECT_EQ(fim[size_t(1 + r) * w + i], last) << "fim, row " << r;
  }
  for (size_t f = 0; f < forced.size(); f += 2) tokens[size_t(forced[f])] = forced[f + 1];
  for (int32_t i = 0; i < logits_rows; ++i) {
    if (tokens[i] >= vocab || tokens[i] < 0) oov[size_t(i / w)] = 1;
    tokens[i] = std::clamp(tokens[i], 0, vocab - 1);
    EXPECT_EQ(out[i], tokens[i]) << "token " << i << " (row " << i / w << ", case " << (i / w) % 6 << ")";
  }
  for (int32_t r = 0; r < rows; ++r) {
    EXPECT_EQ(out[size_t(logits_rows + 2 * rows + r)], oov[r]) << "oov, row " << r;
    EXPECT_EQ(out[size_t(logits_rows + rows + r)], 0) << "nan, row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(OddBatches, VerifyRows, ::testing::Values(1, 3, 4, 5, 17, 64));

}  // namespace
}  // namespace ls
