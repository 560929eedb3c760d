#include "core/sampling.h"

#include "core/check.h"
#include "core/logits_digest.h"
#include "core/ops/portable_exp.h"
#include "core/sampling_params.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace ls {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kSeed = 0x5eed5eed12345678ull;

// mt19937's raw output is fixed by the standard (std::uniform_*_distribution is not), so these
// logits are the same everywhere. Values in [lo, hi).
std::vector<float> random_logits(size_t vocab, uint32_t seed, float lo, float hi) {
  std::mt19937 engine(seed);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = lo + (hi - lo) * uniform_from_bits(static_cast<uint32_t>(engine()));
  return logits;
}

// Logits on a coarse grid, so many are tied.
std::vector<float> tied_logits(size_t vocab, uint32_t seed) {
  std::mt19937 engine(seed);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = 0.25f * static_cast<float>(engine() % 17) - 2.0f;
  return logits;
}

ResolvedSampling stochastic(float temperature, int32_t top_k = SamplingParams::kTopKMax,
                            float top_p = 1.0f, float min_p = 0.0f) {
  ResolvedSampling s;
  s.seed = kSeed;
  s.temperature = temperature;
  s.top_k = top_k;
  s.top_p = top_p;
  s.min_p = min_p;
  return s;
}

ResolvedSampling greedy() {
  ResolvedSampling s;
  s.seed = kSeed;
  s.top_k = 1;
  return s;
}

// ---- Philox ------------------------------------------------------------------------------------

// Known answers from Random123's kat_vectors for philox4x32_10 (counter[4], key[2] -> out[4]).
TEST(Philox, MatchesRandom123KnownAnswers) {
  using Words4 = std::array<uint32_t, 4>;
  using Words2 = std::array<uint32_t, 2>;
  EXPECT_EQ(philox4x32_10_raw(Words4{0, 0, 0, 0}, Words2{0, 0}),
            (Words4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10_raw(Words4{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                              Words2{0xffffffff, 0xffffffff}),
            (Words4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10_raw(Words4{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                              Words2{0xa4093822, 0x299f31d0}),
            (Words4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, ZeroKeyAndCounterMatchesKnownAnswer) {
  EXPECT_EQ(philox4x32_10(0, 0, 0),
            (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
}

TEST(Philox, PacksKeyAndCounterLowWordFirst) {
  const auto packed = philox4x32_10(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, 0x13198a2e);
  const auto raw = philox4x32_10_raw({0x243f6a88, 0x85a308d3, 0x13198a2e, 0},
                                     {0xa4093822, 0x299f31d0});
  EXPECT_EQ(packed, raw);
}

// ---- Uniform draws -----------------------------------------------------------------------------

TEST(Uniform, EdgeBitPatternsConvertExactly) {
  EXPECT_EQ(uniform_from_bits(0u), 0.0f);
  // 0xFFFFFFFF >> 8 = 2^24 - 1, so the value is (2^24 - 1) / 2^24.
  EXPECT_EQ(uniform_from_bits(0xFFFFFFFFu), 1.0f - 1.0f / 16777216.0f);
  EXPECT_EQ(uniform_from_bits(0x80000000u), 0.5f);
  // The low 8 bits are dropped.
  EXPECT_EQ(uniform_from_bits(0x000000FFu), 0.0f);
  EXPECT_EQ(uniform_from_bits(0x00000100u), 1.0f / 16777216.0f);
}

TEST(Uniform, DrawDependsOnlyOnSeedPositionAndIndex) {
  const float a = draw_uniform(kSeed, 41, 0);
  EXPECT_EQ(a, draw_uniform(kSeed, 41, 0));
  EXPECT_NE(a, draw_uniform(kSeed, 42, 0));
  EXPECT_NE(a, draw_uniform(kSeed, 41, 1));
  EXPECT_NE(a, draw_uniform(kSeed + 1, 41, 0));
  EXPECT_EQ(a, uniform_from_bits(philox4x32_10(kSeed, 41, 0)[0]));
}

TEST(Uniform, DrawsAreInUnitIntervalAndNotConstant) {
  float lo = 1.0f;
  float hi = 0.0f;
  for (int64_t position = 0; position < 1000; ++position) {
    const float u = draw_uniform(kSeed, position, 0);
    ASSERT_GE(u, 0.0f) << "position " << position;
    ASSERT_LT(u, 1.0f) << "position " << position;
    lo = std::min(lo, u);
    hi = std::max(hi, u);
  }
  EXPECT_LT(lo, 0.01f);
  EXPECT_GT(hi, 0.99f);
}

// ---- sample_token ------------------------------------------------------------------------------

TEST(Argmax, TieGoesToLowestId) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 3.0f};
  EXPECT_EQ(argmax_token(logits), 1);
  EXPECT_EQ(argmax_token(std::vector<float>{-1.0f}), 0);
}

// A recording step's greedy rows read their token off the row's recorded top logits
// (greedy_token) instead of scanning it again: on rows full of ties, ±0, the guard's ±1e30 and
// NaNs (sanitised first, as a step does), the top's first is the first maximum — by the record's
// AVX-512 pass and its portable one.
TEST(GreedyToken, TheRecordedTopsFirstIsTheFirstMaximum) {
  const std::array<float, 9> values = {-0.0f, 0.0f, 1.0f, 2.0f, 2.0f, -3.0f,
                                       std::numeric_limits<float>::quiet_NaN(),
                                       std::numeric_limits<float>::infinity(),
                                       -std::numeric_limits<float>::infinity()};
  std::mt19937 gen(41);
  int64_t not_first_id = 0;
  for (int32_t trial = 0; trial < 600; ++trial) {
    const size_t vocab = 1 + gen() % 300;
    std::vector<float> row(vocab);
    const size_t distinct = 1 + gen() % values.size();
    for (float& x : row) x = values[gen() % distinct];
    for (const auto record : {sanitise_and_record_row, sanitise_and_record_row_portable}) {
      std::vector<float> sanitised = row;
      uint64_t digest = 0;
      std::vector<TopLogit> top;
      record(sanitised, 1 + static_cast<int32_t>(gen() % 8), digest, top);
      const auto first_max = std::max_element(sanitised.begin(), sanitised.end());
      const int32_t expected = static_cast<int32_t>(first_max - sanitised.begin());
      ASSERT_EQ(greedy_token(sanitised, top), expected) << "trial " << trial;
      ASSERT_EQ(greedy_token(sanitised, {}), expected) << "trial " << trial;
      not_first_id += expected != 0;
    }
  }
  EXPECT_GT(not_first_id, 300);  // the rows' maxima are not all at id 0
}

TEST(SampleToken, GreedyReturnsArgmaxWithZeroLogprob) {
  const std::vector<float> logits = random_logits(111, 3, -4.0f, 4.0f);
  const int32_t expected = static_cast<int32_t>(
      std::max_element(logits.begin(), logits.end()) - logits.begin());
  SamplingScratch scratch;
  for (int64_t position = 0; position < 20; ++position) {
    const SampleOutcome outcome = sample_token(logits, greedy(), position, scratch);
    EXPECT_EQ(outcome.token, expected);
    EXPECT_EQ(outcome.logprob, 0.0f);
  }
}

TEST(SampleToken, TopKOneIsArgmaxAtAnyTemperature) {
  const std::vector<float> logits = random_logits(500, 4, -4.0f, 4.0f);
  const int32_t expected = argmax_token(logits);
  SamplingScratch scratch;
  for (const float temperature : {0.1f, 1.0f, 7.0f, 100.0f}) {
    for (int64_t position = 0; position < 50; ++position) {
      EXPECT_EQ(sample_token(logits, stochastic(temperature, 1), position, scratch).token,
                expected)
          << "temperature " << temperature << " position " << position;
    }
  }
}

// Two leading tokens close together and a tail that, unfiltered, holds about half the mass.
std::vector<float> two_leaders_logits() {
  std::vector<float> logits = random_logits(50, 5, -4.0f, 4.0f);
  logits[17] = 5.0f;
  logits[31] = 4.9f;
  return logits;
}

// Counts of each token over `positions` draws.
std::vector<int> sample_counts(std::span<const float> logits, const ResolvedSampling& sampling,
                               int64_t positions) {
  SamplingScratch scratch;
  std::vector<int> counts(logits.size(), 0);
  for (int64_t position = 0; position < positions; ++position) {
    ++counts[sample_token(logits, sampling, position, scratch).token];
  }
  return counts;
}

int count_outside(const std::vector<int>& counts, std::vector<size_t> allowed) {
  int outside = 0;
  for (size_t t = 0; t < counts.size(); ++t) {
    if (std::find(allowed.begin(), allowed.end(), t) == allowed.end()) outside += counts[t];
  }
  return outside;
}

TEST(SampleToken, UnfilteredTailIsSampledSoTheFilterTestsCanFail) {
  const std::vector<int> counts = sample_counts(two_leaders_logits(), stochastic(1.0f), 1000);
  EXPECT_GT(count_outside(counts, {17, 31}), 100);
  EXPECT_GT(count_outside(counts, {17}), 200);
}

TEST(SampleToken, TopKTwoNeverLeavesTheTopTwo) {
  const std::vector<int> counts = sample_counts(two_leaders_logits(), stochastic(1.0f, 2), 1000);
  EXPECT_EQ(count_outside(counts, {17, 31}), 0);
  EXPECT_GT(counts[17], 100);
  EXPECT_GT(counts[31], 100);
}

TEST(SampleToken, SmallTopPKeepsOnlyTheMax) {
  const std::vector<int> counts =
      sample_counts(two_leaders_logits(), stochastic(1.0f, SamplingParams::kTopKMax, 0.05f), 1000);
  EXPECT_EQ(counts[17], 1000);
}

TEST(SampleToken, MinPOneKeepsOnlyTheMax) {
  const std::vector<int> counts = sample_counts(
      two_leaders_logits(), stochastic(1.0f, SamplingParams::kTopKMax, 1.0f, 1.0f), 1000);
  EXPECT_EQ(counts[17], 1000);
}

// min-p keeps p >= min_p * p_max, so at min_p = 1 tokens tied with the max stay.
TEST(SampleToken, MinPOneKeepsEveryTokenTiedWithTheMax) {
  std::vector<float> logits = two_leaders_logits();
  logits[31] = logits[17];
  const std::vector<int> counts =
      sample_counts(logits, stochastic(1.0f, SamplingParams::kTopKMax, 1.0f, 1.0f), 1000);
  EXPECT_EQ(counts[17] + counts[31], 1000);
  EXPECT_GT(counts[17], 100);
  EXPECT_GT(counts[31], 100);
}

// An independent statistical check: p = [0.5, 0.25, 0.25] by construction. Over 20000 draws the
// standard deviation of a frequency is at most 0.0036, so 0.02 is more than five of them.
TEST(SampleToken, HandComputedDistributionFrequencies) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.25f), std::log(0.25f)};
  constexpr int64_t kPositions = 20000;
  const std::vector<int> counts = sample_counts(logits, stochastic(1.0f), kPositions);
  const std::array<double, 3> expected = {0.5, 0.25, 0.25};
  for (size_t t = 0; t < 3; ++t) {
    EXPECT_NEAR(static_cast<double>(counts[t]) / kPositions, expected[t], 0.02) << "token " << t;
  }
}

TEST(SampleToken, LogprobIsTheFilteredProbability) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.25f), std::log(0.25f)};
  SamplingScratch scratch;
  const std::array<double, 3> expected = {std::log(0.5), std::log(0.25), std::log(0.25)};
  for (int64_t position = 0; position < 50; ++position) {
    const SampleOutcome outcome = sample_token(logits, stochastic(1.0f), position, scratch);
    EXPECT_NEAR(outcome.logprob, expected[outcome.token], 1e-5) << "position " << position;
  }
  // Top-k 2 keeps tokens 0 and 1 (id breaks the 1/2 tie): 0.5/0.75 and 0.25/0.75.
  for (int64_t position = 0; position < 50; ++position) {
    const SampleOutcome outcome = sample_token(logits, stochastic(1.0f, 2), position, scratch);
    ASSERT_NE(outcome.token, 2) << "position " << position;
    EXPECT_NEAR(outcome.logprob, std::log(outcome.token == 0 ? 2.0 / 3.0 : 1.0 / 3.0), 1e-5);
  }
}

TEST(SampleToken, SameInputsSameTokenEvenWithReusedScratch) {
  const std::vector<float> big = random_logits(1000, 6, -3.0f, 3.0f);
  const std::vector<float> small = random_logits(7, 7, -3.0f, 3.0f);
  const ResolvedSampling sampling = stochastic(0.8f, 40, 0.9f, 0.01f);
  SamplingScratch reused;
  for (int64_t position = 0; position < 100; ++position) {
    SamplingScratch fresh;
    const SampleOutcome first = sample_token(big, sampling, position, fresh);
    const SampleOutcome again = sample_token(big, sampling, position, fresh);
    sample_token(small, sampling, position, reused);
    const SampleOutcome after_small = sample_token(big, sampling, position, reused);
    EXPECT_EQ(first.token, again.token) << "position " << position;
    EXPECT_EQ(first.logprob, again.logprob) << "position " << position;
    EXPECT_EQ(first.token, after_small.token) << "position " << position;
    EXPECT_EQ(first.logprob, after_small.logprob) << "position " << position;
  }
}

TEST(SampleToken, WarmedScratchIsNotReallocated) {
  const std::vector<float> big = random_logits(500, 8, -3.0f, 3.0f);
  const std::vector<float> small = random_logits(111, 9, -3.0f, 3.0f);
  SamplingScratch scratch;
  sample_token(big, stochastic(1.0f), 0, scratch);
  const float* probs = scratch.probs.data();
  const int32_t* order = scratch.order.data();
  for (int64_t position = 0; position < 20; ++position) {
    sample_token(small, stochastic(1.0f, 5), position, scratch);
    sample_token(big, stochastic(1.0f, SamplingParams::kTopKMax, 0.9f), position, scratch);
  }
  EXPECT_EQ(scratch.probs.data(), probs);
  EXPECT_EQ(scratch.order.data(), order);
}

// Every prefix sum of the definition's order (core/ops/order_sums.h) written the plain way, one
// pass: a block's running part from 0, added to the sum of the blocks before it.
std::vector<float> plain_prefixes(const std::vector<std::pair<float, int32_t>>& ranked) {
  std::vector<float> prefixes;
  float blocks_before = 0.0f, part = 0.0f;
  for (size_t j = 0; j < ranked.size(); ++j) {
    if (j % 128 == 0 && j > 0) blocks_before += part, part = 0.0f;
    part += ranked[j].first;
    prefixes.push_back(blocks_before + part);
  }
  return prefixes;
}

// The definition in sampling.cpp written the plain way: a full sort of (weight, id) pairs, fresh
// vectors, every prefix sum computed, linear searches. The two must agree bit for bit.
SampleOutcome reference_sample(std::span<const float> logits, const ResolvedSampling& s,
                               int64_t position) {
  std::vector<float> scaled(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) scaled[i] = logits[i] / s.temperature;
  const float m = *std::max_element(scaled.begin(), scaled.end());
  std::vector<std::pair<float, int32_t>> ranked;
  for (size_t i = 0; i < scaled.size(); ++i) {
    ranked.emplace_back(ops::portable_exp(scaled[i] - m), static_cast<int32_t>(i));
  }
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  ranked.resize(std::min(ranked.size(), static_cast<size_t>(s.top_k)));
  if (s.top_p < 1.0f) {
    const std::vector<float> prefixes = plain_prefixes(ranked);
    const float cut = s.top_p * prefixes.back();
    size_t n = 0;
    while (prefixes[n] < cut) ++n;
    ranked.resize(n + 1);
  }
  size_t n = 1;
  while (n < ranked.size() && ranked[n].first >= s.min_p * ranked[0].first) ++n;
  ranked.resize(n);
  const std::vector<float> prefixes = plain_prefixes(ranked);
  const float kept = prefixes.back();
  const float target = draw_uniform(s.seed, position, 0) * kept;
  for (size_t j = 0; j < ranked.size(); ++j) {
    if (prefixes[j] > target) return {ranked[j].second, std::log(ranked[j].first / kept)};
  }
  return {ranked.back().second, std::log(ranked.back().first / kept)};
}

TEST(SampleToken, SelectionMatchesThePlainFullSortDefinition) {
  SamplingScratch scratch;
  int differing_tokens = 0;
  for (const size_t vocab : {1u, 7u, 111u, 500u, 2000u}) {
    for (const bool ties : {false, true}) {
      const uint32_t data_seed = static_cast<uint32_t>(vocab) + (ties ? 1000u : 0u);
      const std::vector<float> logits =
          ties ? tied_logits(vocab, data_seed) : random_logits(vocab, data_seed, -4.0f, 4.0f);
      for (const int32_t top_k : {2, 5, 50, SamplingParams::kTopKMax}) {
        for (const float top_p : {1.0f, 0.9f, 0.5f}) {
          for (const float min_p : {0.0f, 0.05f}) {
            const ResolvedSampling s = stochastic(0.7f, top_k, top_p, min_p);
            for (int64_t position = 0; position < 30; ++position) {
              const SampleOutcome got = sample_token(logits, s, position, scratch);
              const SampleOutcome want = reference_sample(logits, s, position);
              ASSERT_EQ(got.token, want.token)
                  << "vocab " << vocab << " ties " << ties << " top_k " << top_k << " top_p "
                  << top_p << " min_p " << min_p << " position " << position;
              ASSERT_EQ(got.logprob, want.logprob) << "vocab " << vocab << " position "
                                                   << position;
              differing_tokens += got.token != argmax_token(logits);
            }
          }
        }
      }
    }
  }
  EXPECT_GT(differing_tokens, 100);  // the comparison covers more than argmax
}

// ---- SamplingParams ----------------------------------------------------------------------------

std::string validation_error(const SamplingParams& params) {
  try {
    params.validate("request 7");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_rejected(const SamplingParams& params, const std::string& name,
                     const std::string& value) {
  const std::string message = validation_error(params);
  EXPECT_THAT(message, HasSubstr(name));
  EXPECT_THAT(message, HasSubstr(value));
  EXPECT_THAT(message, HasSubstr("request 7"));
}

TEST(SamplingParamsValidate, AcceptsDefaultsAndBoundaries) {
  EXPECT_EQ(validation_error(SamplingParams{}), "");
  SamplingParams p;
  p.temperature = 100.0f;
  p.top_k = SamplingParams::kTopKMax;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  EXPECT_EQ(validation_error(p), "");
  p.top_k = 1;
  p.top_p = 1e-6f;
  p.min_p = 0.0f;
  EXPECT_EQ(validation_error(p), "");
}

TEST(SamplingParamsValidate, RejectsNegativeTemperature) {
  SamplingParams p;
  p.temperature = -0.5f;
  expect_rejected(p, "temperature", "-0.5");
}

TEST(SamplingParamsValidate, RejectsNanTemperature) {
  SamplingParams p;
  p.temperature = std::nanf("");
  expect_rejected(p, "temperature", "nan");
}

TEST(SamplingParamsValidate, RejectsInfiniteTemperature) {
  SamplingParams p;
  p.temperature = INFINITY;
  expect_rejected(p, "temperature", "inf");
}

TEST(SamplingParamsValidate, RejectsTopKZero) {
  SamplingParams p;
  p.top_k = 0;
  expect_rejected(p, "top_k", "got 0");
}

TEST(SamplingParamsValidate, RejectsTopKMinusTwo) {
  SamplingParams p;
  p.top_k = -2;
  expect_rejected(p, "top_k", "-2");
}

TEST(SamplingParamsValidate, RejectsTopKAboveMax) {
  SamplingParams p;
  p.top_k = SamplingParams::kTopKMax + 1;
  expect_rejected(p, "top_k", std::to_string(SamplingParams::kTopKMax + 1));
}

TEST(SamplingParamsValidate, RejectsTopPZero) {
  SamplingParams p;
  p.top_p = 0.0f;
  expect_rejected(p, "top_p", "got 0");
}

TEST(SamplingParamsValidate, RejectsTopPAboveOne) {
  SamplingParams p;
  p.top_p = 1.5f;
  expect_rejected(p, "top_p", "1.5");
}

TEST(SamplingParamsValidate, RejectsNanTopP) {
  SamplingParams p;
  p.top_p = std::nanf("");
  expect_rejected(p, "top_p", "nan");
}

TEST(SamplingParamsValidate, RejectsNegativeMinP) {
  SamplingParams p;
  p.min_p = -0.1f;
  expect_rejected(p, "min_p", "-0.1");
}

TEST(SamplingParamsValidate, RejectsMinPAboveOne) {
  SamplingParams p;
  p.min_p = 1.1f;
  expect_rejected(p, "min_p", "1.1");
}

TEST(SamplingParamsValidate, RejectsNanMinP) {
  SamplingParams p;
  p.min_p = std::nanf("");
  expect_rejected(p, "min_p", "nan");
}

TEST(DefaultRequestSeed, IsXxh64OfLittleEndianIdBytes) {
  const RequestId id = 0x0123456789abcdefull;
  const unsigned char bytes[8] = {0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01};
  EXPECT_EQ(default_request_seed(id), XXH64(bytes, sizeof bytes, 0));
  const unsigned char one[8] = {1, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(default_request_seed(1), XXH64(one, sizeof one, 0));
  EXPECT_NE(default_request_seed(1), default_request_seed(2));
}

TEST(ResolveSampling, GreedyBecomesTopKOneAtTemperatureOne) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_p = 0.5f;
  const ResolvedSampling r = resolve_sampling(p, 9);
  EXPECT_EQ(r.top_k, 1);
  EXPECT_EQ(r.temperature, 1.0f);
  EXPECT_EQ(r.seed, default_request_seed(9));

  SamplingParams hot;
  hot.temperature = 2.0f;
  hot.top_k = 1;
  EXPECT_EQ(resolve_sampling(hot, 9), r);
}

TEST(ResolveSampling, DisabledTopKBecomesMaxAndGivenSeedIsKept) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = -1;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.seed = 1234;
  const ResolvedSampling r = resolve_sampling(p, 9);
  EXPECT_EQ(r.seed, 1234u);
  EXPECT_EQ(r.temperature, 0.7f);
  EXPECT_EQ(r.top_k, SamplingParams::kTopKMax);
  EXPECT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.min_p, 0.05f);
}

// ---- Verify ------------------------------------------------------------------------------------

constexpr int32_t kVocab = 10;

// Rows whose argmax is peaks[i]: the peak at `margin`, every other logit at 0.
std::vector<float> peaked_logits(const std::vector<int32_t>& peaks, float margin) {
  std::vector<float> logits(peaks.size() * kVocab, 0.0f);
  for (size_t i = 0; i < peaks.size(); ++i) logits[i * kVocab + peaks[i]] = margin;
  return logits;
}

struct VerifyCase {
  std::vector<float> logits;
  std::vector<int32_t> inputs;
  ResolvedSampling sampling;
  int64_t first_position = 0;
  bool force_single = false;
};

// Returns the accepted tokens.
std::vector<int32_t> run_verify(const VerifyCase& c, SamplingScratch& scratch) {
  VerifyRow row;
  row.logits = c.logits;
  row.inputs = c.inputs;
  row.vocab_size = kVocab;
  row.sampling = c.sampling;
  row.first_position = c.first_position;
  row.force_single = c.force_single;
  std::vector<int32_t> out(c.inputs.size(), -1);
  const int32_t accepted = StandardVerifier{}.verify(row, out, scratch);
  EXPECT_GE(accepted, 1);
  EXPECT_LE(accepted, static_cast<int32_t>(c.inputs.size()));
  out.resize(static_cast<size_t>(std::clamp(accepted, 0, static_cast<int32_t>(out.size()))));
  return out;
}

TEST(VerifyGreedy, StopsAtFirstMismatchWithCorrection) {
  SamplingScratch scratch;
  const VerifyCase c{peaked_logits({5, 7, 9, 2}, 1.0f), {4, 5, 7, 3}, greedy()};
  EXPECT_EQ(run_verify(c, scratch), (std::vector<int32_t>{5, 7, 9}));
}

TEST(VerifyGreedy, AllDraftsMatchAddsBonus) {
  SamplingScratch scratch;
  const VerifyCase c{peaked_logits({5, 7, 9, 2}, 1.0f), {4, 5, 7, 9}, greedy()};
  EXPECT_EQ(run_verify(c, scratch), (std::vector<int32_t>{5, 7, 9, 2}));
}

TEST(VerifyGreedy, FirstDraftWrongAcceptsOnlyTheCorrection) {
  SamplingScratch scratch;
  const VerifyCase c{peaked_logits({5, 7, 9, 2}, 1.0f), {4, 6, 7, 9}, greedy()};
  EXPECT_EQ(run_verify(c, scratch), (std::vector<int32_t>{5}));
}

TEST(VerifyGreedy, ForceSingleAcceptsOneToken) {
  SamplingScratch scratch;
  VerifyCase c{peaked_logits({5, 7, 9, 2}, 1.0f), {4, 5, 7, 9}, greedy()};
  c.force_single = true;
  EXPECT_EQ(run_verify(c, scratch), (std::vector<int32_t>{5}));
}

TEST(VerifyGreedy, TiedRowsPredictTheLowestId) {
  SamplingScratch scratch;
  std::vector<float> logits = peaked_logits({6, 3}, 2.0f);
  logits[0 * kVocab + 8] = 2.0f;  // row 0 ties 6 and 8
  logits[1 * kVocab + 1] = 2.0f;  // row 1 ties 1 and 3
  const VerifyCase c{logits, {0, 6}, greedy()};
  EXPECT_EQ(run_verify(c, scratch), (std::vector<int32_t>{6, 1}));
}

TEST(VerifyStochastic, PeakDraftsAreAcceptedOthersRejected) {
  SamplingScratch scratch;
  const std::vector<int32_t> peaks = {5, 7, 9, 2};
  const std::vector<float> logits = peaked_logits(peaks, 1000.0f);
  for (int64_t position = 0; position < 200; position += 7) {
    VerifyCase all{logits, {4, 5, 7, 9}, stochastic(1.0f), position};
    EXPECT_EQ(run_verify(all, scratch), peaks) << "position " << position;
    // d_2 = 3 is not row 1's peak: rejected, and the correction is the peak.
    VerifyCase wrong{logits, {4, 5, 3, 9}, stochastic(1.0f), position};
    EXPECT_EQ(run_verify(wrong, scratch), (std::vector<int32_t>{5, 7})) << "position " << position;
    VerifyCase first_wrong{logits, {4, 0, 7, 9}, stochastic(1.0f), position};
    EXPECT_EQ(run_verify(first_wrong, scratch), (std::vector<int32_t>{5}))
        << "position " << position;
  }
}

TEST(VerifyStochastic, WidthOneAndForceSingleMatchSampleToken) {
  SamplingScratch scratch;
  const std::vector<float> logits = random_logits(3 * kVocab, 11, -2.0f, 2.0f);
  const std::span<const float> row0(logits.data(), kVocab);
  for (int64_t position = 0; position < 100; ++position) {
    const int32_t expected = sample_token(row0, stochastic(1.0f), position, scratch).token;
    const VerifyCase single{std::vector<float>(row0.begin(), row0.end()), {3}, stochastic(1.0f),
                            position};
    EXPECT_EQ(run_verify(single, scratch), (std::vector<int32_t>{expected}));
    VerifyCase forced{logits, {3, 4, 5}, stochastic(1.0f), position};
    forced.force_single = true;
    EXPECT_EQ(run_verify(forced, scratch), (std::vector<int32_t>{expected}));
  }
}

// Accepted drafts are copied through, the result is in [1, W], and every token is in the vocab.
TEST(VerifyStochastic, AcceptedPrefixIsTheDraftsOverRandomRows) {
  SamplingScratch scratch;
  std::mt19937 engine(12);
  std::array<int, 5> accepted_histogram{};
  for (int64_t position = 0; position < 500; ++position) {
    constexpr size_t kWidth = 4;
    VerifyCase c{random_logits(kWidth * kVocab, static_cast<uint32_t>(position), -1.0f, 1.0f),
                 {}, stochastic(1.0f, 6, 0.95f), position};
    for (size_t i = 0; i < kWidth; ++i) c.inputs.push_back(static_cast<int32_t>(engine() % 3));
    const std::vector<int32_t> out = run_verify(c, scratch);
    ASSERT_FALSE(out.empty());
    ++accepted_histogram[out.size()];
    for (size_t j = 0; j + 1 < out.size(); ++j) EXPECT_EQ(out[j], c.inputs[j + 1]);
    for (const int32_t t : out) {
      EXPECT_GE(t, 0);
      EXPECT_LT(t, kVocab);
    }
  }
  // Non-degenerate: both early rejections and longer acceptances happen.
  EXPECT_GT(accepted_histogram[1], 0);
  EXPECT_GT(accepted_histogram[2] + accepted_histogram[3] + accepted_histogram[4], 0);
}

// Pins which draw each decision uses, from the definition alone. Row 0 has three tokens of
// weight exactly 1 (q = 1/3 each), row 1 two (S = 2); the rest have weight 0. The draft is 2:
// accepted iff coin(c, 1) <= 1/3, then the bonus is 0 iff u(c + 1, 0) * 2 < 1; on rejection the
// correction samples {0, 1} with S = 2: 0 iff u(c, 2) * 2 < 1.
TEST(VerifyStochastic, DrawsUseTheDocumentedPositionsAndIndices) {
  std::vector<float> logits(2 * kVocab, -1000.0f);
  for (const int t : {0, 1, 2}) logits[t] = 0.0f;
  for (const int t : {0, 1}) logits[kVocab + t] = 0.0f;
  SamplingScratch scratch;
  int accepted_count = 0;
  for (int64_t c = 0; c < 300; ++c) {
    const VerifyCase v{logits, {7, 2}, stochastic(1.0f), c};
    const std::vector<int32_t> out = run_verify(v, scratch);
    const bool accept = draw_uniform(kSeed, c, 1) <= 1.0f / 3.0f;
    if (accept) {
      ++accepted_count;
      const int32_t bonus = draw_uniform(kSeed, c + 1, 0) * 2.0f < 1.0f ? 0 : 1;
      EXPECT_EQ(out, (std::vector<int32_t>{2, bonus})) << "position " << c;
    } else {
      const int32_t correction = draw_uniform(kSeed, c, 2) * 2.0f < 1.0f ? 0 : 1;
      EXPECT_EQ(out, (std::vector<int32_t>{correction})) << "position " << c;
    }
  }
  EXPECT_GT(accepted_count, 50);
  EXPECT_LT(accepted_count, 250);
}

// Target-only rejection sampling leaves the first token distributed as q_0 whatever the draft:
// with q_0 = [0.5, 0.25, 0.25] and draft 1, P(1) = 0.25 (accepted), and a rejection (0.75)
// resamples from {0: 2/3, 2: 1/3}, giving 0.5 and 0.25. Tolerance as in the sampling test.
TEST(VerifyStochastic, FirstTokenFollowsTheTargetDistribution) {
  std::vector<float> logits(2 * kVocab, -1000.0f);
  logits[0] = std::log(0.5f);
  logits[1] = std::log(0.25f);
  logits[2] = std::log(0.25f);
  logits[kVocab] = 0.0f;
  SamplingScratch scratch;
  constexpr int64_t kPositions = 20000;
  std::array<int, kVocab> counts{};
  for (int64_t position = 0; position < kPositions; ++position) {
    const VerifyCase c{logits, {0, 1}, stochastic(1.0f), position};
    ++counts[run_verify(c, scratch).at(0)];
  }
  const std::array<double, 3> expected = {0.5, 0.25, 0.25};
  for (size_t t = 0; t < 3; ++t) {
    EXPECT_NEAR(static_cast<double>(counts[t]) / kPositions, expected[t], 0.02) << "token " << t;
  }
  EXPECT_EQ(counts[0] + counts[1] + counts[2], kPositions);
}

}  // namespace
}  // namespace ls
