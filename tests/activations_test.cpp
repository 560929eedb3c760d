// Per-layer activations (core/activations.h) on the CPU reference: the capture order and shapes
// the trace's digest count assumes, a capture that changes nothing, batch invariance tensor by
// tensor, and the first-difference search bit for bit and within a tolerance.
#include "core/activations.h"
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "replay/localise.h"
#include "tests/test_support.h"

#include <gtest/gtest.h>

#include <cstring>

namespace ls {
namespace {

using testing::decode_row;
using testing::Harness;
using testing::pages_from;
using testing::prefill_row;
using testing::prompt_for;
using testing::small_config;

constexpr ExecutorOptions kCapture{.capture_logits = true,
                                   .activations = ActivationCapture::kValues};

// Request `id` prefilled on `pool_row` with `length` tokens (pages from `first_page`).
void add_prefill(ForwardOp& op, RequestId id, int32_t pool_row, int32_t length, int32_t first_page) {
  op.rows.push_back(prefill_row(id, pool_row, 0, length, length));
  op.rows.back().refresh = {0, pages_from(first_page, 4)};
  op.rows.back().sampling = SamplingParams{};
  const std::vector<int32_t> ids = prompt_for(id, length);
  op.prefill_token_ids.insert(op.prefill_token_ids.end(), ids.begin(), ids.end());
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double norm_of(std::span<const float> v) {
  double n = 0;
  for (const float x : v) n += double{x} * x;
  return n;
}

TEST(Activations, CaptureOrderAndShapesAreTheDefinitions) {
  Harness h(small_config(), nullptr, kCapture);
  ForwardOp op;
  add_prefill(op, 1, 1, 3, 10);
  add_prefill(op, 2, 2, 5, 20);
  const StepResult r = h.executor.step(op);
  const ModelConfig& m = testing::tiny_weights().config;
  const int32_t tokens = 8, logits_rows = 2;
  ASSERT_EQ(r.activations.tensors.size(), static_cast<size_t>(m.layers_count * kLayerActivationKinds + 2));
  const ActivationKind order[] = {ActivationKind::kAttnIn, ActivationKind::kQ, ActivationKind::kK,
                                  ActivationKind::kV, ActivationKind::kAttnOut, ActivationKind::kMlpOut};
  const int32_t widths[] = {m.hidden_size, m.q_size(), m.kv_size(), m.kv_size(), m.q_size(), m.hidden_size};
  for (int32_t l = 0; l < m.layers_count; ++l) {
    for (int32_t k = 0; k < kLayerActivationKinds; ++k) {
      const ActivationTensor& t = r.activations.tensors[static_cast<size_t>(l * kLayerActivationKinds + k)];
      EXPECT_EQ(t.layer, l);
      EXPECT_EQ(t.kind, order[k]) << t.name();
      EXPECT_EQ(t.rows, tokens) << t.name();
      EXPECT_EQ(t.width, widths[k]) << t.name();
      EXPECT_GT(norm_of(t.values), 0) << t.name();
    }
  }
  const ActivationTensor& final_norm = r.activations.tensors[r.activations.tensors.size() - 2];
  const ActivationTensor& logits = r.activations.tensors.back();
  EXPECT_EQ(final_norm.kind, ActivationKind::kFinalNorm);
  EXPECT_EQ(final_norm.rows, logits_rows);
  EXPECT_EQ(logits.kind, ActivationKind::kLogits);
  EXPECT_EQ(logits.width, m.vocab_size);
  // The logits captured are the step's own (no NaN: the guard left them as they were).
  EXPECT_TRUE(same_bits(logits.values, r.logits));
  // Every digest index maps back to the tensor and row it was computed from.
  const std::vector<uint64_t> digests = activation_digests(r.activations);
  ASSERT_EQ(static_cast<int64_t>(digests.size()),
            activation_digests_count(m.layers_count, tokens, logits_rows));
  int64_t index = 0;
  for (const ActivationTensor& t : r.activations.tensors) {
    for (int32_t row = 0; row < t.rows; ++row, ++index) {
      const ActivationSite site = activation_site(m.layers_count, tokens, logits_rows, index);
      ASSERT_EQ(site.name(), t.name()) << "digest " << index;
      ASSERT_EQ(site.row, row) << "digest " << index;
      ASSERT_EQ(digests[static_cast<size_t>(index)], logits_row_digest(t.row(row)));
    }
  }
}

// Capturing copies tensors and changes no bit of what the step computes.
TEST(Activations, CapturingChangesNoOutputBit) {
  Harness plain(small_config(), nullptr, {.capture_logits = true});
  Harness captured(small_config(), nullptr, kCapture);
  ForwardOp prefill;
  add_prefill(prefill, 1, 1, 6, 10);
  ForwardOp decode;
  decode.rows.push_back(decode_row(1, 1));
  for (const ForwardOp* op : {&prefill, &decode, &decode, &decode}) {
    const StepResult a = plain.executor.step(*op);
    const StepResult b = captured.executor.step(*op);
    EXPECT_TRUE(a.activations.empty());
    EXPECT_FALSE(b.activations.empty());
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_TRUE(same_bits(a.logits, b.logits));
  }
}

// The CPU reference is batch-invariant: request 1's rows of every tensor are the same bits alone
// and beside request 2 (a capture that took another row or another token's slot would differ).
TEST(Activations, ARequestsTensorsAreBitIdenticalAloneAndInABatch) {
  Harness alone(small_config(), nullptr, kCapture);
  Harness batched(small_config(), nullptr, kCapture);
  ForwardOp a;
  add_prefill(a, 1, 1, 4, 10);
  ForwardOp b;
  add_prefill(b, 2, 2, 5, 20);  // request 2's tokens first, on another pool row
  add_prefill(b, 1, 1, 4, 10);
  const StepResult ra = alone.executor.step(a);
  const StepResult rb = batched.executor.step(b);
  ASSERT_EQ(ra.activations.tensors.size(), rb.activations.tensors.size());
  for (size_t i = 0; i < ra.activations.tensors.size(); ++i) {
    const ActivationTensor& x = ra.activations.tensors[i];
    const ActivationTensor& y = rb.activations.tensors[i];
    const bool per_logits_row = x.layer < 0;
    for (int32_t row = 0; row < x.rows; ++row) {
      const int32_t in_batch = per_logits_row ? 1 : 5 + row;
      EXPECT_TRUE(same_bits(x.row(row), y.row(in_batch))) << x.name() << " row " << row;
    }
  }
}

// A recording's capture (kDigests) keeps each row's digest of the values a localisation captures.
TEST(Activations, ADigestCaptureHoldsTheDigestsOfTheValues) {
  Harness with_values(small_config(), nullptr, kCapture);
  Harness with_digests(small_config(), nullptr, {.activations = ActivationCapture::kDigests});
  ForwardOp op;
  add_prefill(op, 1, 1, 6, 10);
  const StepResult a = with_values.executor.step(op);
  const StepResult b = with_digests.executor.step(op);
  ASSERT_EQ(a.activations.tensors.size(), b.activations.tensors.size());
  for (const ActivationTensor& t : b.activations.tensors) {
    EXPECT_TRUE(t.values.empty()) << t.name();
    EXPECT_EQ(t.digests.size(), static_cast<size_t>(t.rows)) << t.name();
  }
  EXPECT_EQ(activation_digests(b.activations), activation_digests(a.activations));
}

TEST(Activations, FirstDifferenceNamesTheChangedElement) {
  Harness h(small_config(), nullptr, kCapture);
  ForwardOp op;
  add_prefill(op, 1, 1, 5, 10);
  const StepActivations base = h.executor.step(op).activations;
  EXPECT_FALSE(first_activation_difference(base, base, std::nullopt));
  EXPECT_FALSE(first_activation_difference(base, base, 0.1));
  // One bit of layer 1's q, row 2, element 5.
  StepActivations flipped = base;
  ActivationTensor& q = flipped.tensors[kLayerActivationKinds + 1];
  ASSERT_EQ(q.name(), "layer 1 q");
  float& x = q.values[static_cast<size_t>(2 * q.width + 5)];
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  bits ^= 1u;
  std::memcpy(&x, &bits, sizeof bits);
  const std::optional<ActivationDifference> d = first_activation_difference(flipped, base, std::nullopt);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->tensor, "layer 1 q");
  EXPECT_EQ(d->row, 2);
  EXPECT_EQ(d->element, 5);
  EXPECT_EQ(d->expected, base.tensors[kLayerActivationKinds + 1].values[static_cast<size_t>(2 * q.width + 5)]);
  // One ulp is within a 10% tolerance; a change of the row's whole scale is not.
  EXPECT_FALSE(first_activation_difference(flipped, base, 0.1));
  double scale = 0;
  for (const float v : q.row(2)) scale = std::max(scale, std::fabs(double{v}));
  x += static_cast<float>(scale);
  const std::optional<ActivationDifference> far = first_activation_difference(flipped, base, 0.1);
  ASSERT_TRUE(far);
  EXPECT_EQ(far->tensor, "layer 1 q");
  EXPECT_EQ(far->element, 5);
}

// What --localise prints of an in-process comparison: the tensor, its row's op row and request,
// the element with both values and their bits, and the tolerance when one applies.
TEST(Activations, ALocalisationPrintsTheElementWithBothValuesAndTheTolerance) {
  replay::Localisation l{.step = 4, .replay_backend = "cuda", .against = "a replay on cpu",
                         .tolerance = replay::kCrossBackendTolerance, .differs = true,
                         .tensor = "layer 1 mlp_out", .layer = 1, .kind = "mlp_out", .token_row = 2,
                         .op_row = 1, .request_id = 1004, .row_width = 64};
  l.difference = ActivationDifference{.tensor = "layer 1 mlp_out", .layer = 1,
                                      .kind = ActivationKind::kMlpOut, .row = 2, .element = 5,
                                      .actual = 1.5f, .expected = 65.5f, .row_scale = 65.5};
  const std::string text = replay::describe_localisation(l);
  EXPECT_NE(text.find("(tolerance: |a - b| > 0.1 x max|b| over the row)"), std::string::npos) << text;
  EXPECT_NE(text.find("first difference: layer 1 mlp_out, row 2 (op row 1, request 1004)"),
            std::string::npos) << text;
  EXPECT_NE(text.find("element 5 of 64: replay 1.5 (0x3fc00000), other side 65.5 (0x42830000)"),
            std::string::npos) << text;
  const nlohmann::ordered_json j = replay::localisation_json(l);
  EXPECT_EQ(j.at("element"), 5);
  EXPECT_EQ(j.at("other_value"), 65.5);
  EXPECT_EQ(j.at("tolerance"), 0.1);
  l.differs = false;
  l.difference.reset();
  EXPECT_NE(replay::describe_localisation(l).find("IDENTICAL: every layer's tensors agree within "
                                                  "the tolerance"), std::string::npos);
}

TEST(Activations, BackendsThatCannotCaptureRefuseByName) {
  CpuBackend stub(testing::tiny_weights(), small_config(), nullptr, /*stub_model=*/true);
  try {
    stub.capture_activations(ActivationCapture::kValues);
    FAIL() << "the stub model captured";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stub model"), std::string::npos) << e.what();
  }
  CpuBackend tp2(testing::tiny_weights(), small_config(), nullptr, false, nullptr, 2);
  try {
    tp2.capture_activations(ActivationCapture::kDigests);
    FAIL() << "TP 2 captured";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor-parallel degree 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ls
