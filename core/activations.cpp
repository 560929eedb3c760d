#include "core/activations.h"

#include "core/check.h"
#include "core/logits_digest.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

namespace ls {

std::string_view activation_kind_name(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kAttnIn: return "attn_in";
    case ActivationKind::kQ: return "q";
    case ActivationKind::kK: return "k";
    case ActivationKind::kV: return "v";
    case ActivationKind::kAttnOut: return "attn_out";
    case ActivationKind::kMlpOut: return "mlp_out";
    case ActivationKind::kFinalNorm: return "final_norm";
    case ActivationKind::kLogits: return "logits";
  }
  LS_ASSERT(false, "activation kind {}", static_cast<int>(kind));
  return "";
}

namespace {

std::string site_name(int32_t layer, ActivationKind kind) {
  if (layer < 0) return std::string(activation_kind_name(kind));
  return fmt::format("layer {} {}", layer, activation_kind_name(kind));
}

uint32_t bits(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Where two rows part: bitwise, or beyond tolerance · max|expected| over the row; −1 if nowhere.
int32_t first_differing_element(std::span<const float> a, std::span<const float> b,
                                std::optional<double> tolerance, double& scale) {
  scale = 0;
  if (!tolerance) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (bits(a[i]) != bits(b[i])) return static_cast<int32_t>(i);
    }
    return -1;
  }
  for (const float x : b) scale = std::max(scale, std::fabs(static_cast<double>(x)));
  for (size_t i = 0; i < a.size(); ++i) {
    const double delta = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    // A NaN on either side is beyond any tolerance.
    if (!(delta <= *tolerance * scale)) return static_cast<int32_t>(i);
  }
  return -1;
}

}  // namespace

std::string ActivationTensor::name() const { return site_name(layer, kind); }

std::string ActivationSite::name() const { return site_name(layer, kind); }

ActivationTensor& StepActivations::add(int32_t layer, ActivationKind kind, int32_t rows,
                                       int32_t width, bool stored_bf16, ActivationCapture mode) {
  LS_ASSERT(rows >= 0 && width >= 0, "activation tensor [{}, {}]", rows, width);
  LS_ASSERT(mode != ActivationCapture::kOff, "a tensor captured with the capture off");
  ActivationTensor& t = tensors.emplace_back();
  t.layer = layer, t.kind = kind, t.rows = rows, t.width = width, t.stored_bf16 = stored_bf16;
  if (mode == ActivationCapture::kValues) {
    t.values.assign(static_cast<size_t>(rows) * width, 0.0f);
  } else {
    t.digests.assign(static_cast<size_t>(rows), 0);
  }
  return t;
}

void StepActivations::keep_digests_only() {
  for (ActivationTensor& t : tensors) {
    if (!t.digests.empty() || t.rows == 0) continue;
    for (int32_t r = 0; r < t.rows; ++r) t.digests.push_back(activation_row_digest(t.row(r)));
    t.values = {};
  }
}

uint64_t activation_row_digest(std::span<const float> row) { return logits_row_digest(row); }

std::vector<uint64_t> activation_digests(const StepActivations& activations) {
  std::vector<uint64_t> out;
  for (const ActivationTensor& t : activations.tensors) {
    if (!t.digests.empty()) {
      LS_ASSERT(t.digests.size() == static_cast<size_t>(t.rows), "{}: {} digests for {} rows",
                t.name(), t.digests.size(), t.rows);
      out.insert(out.end(), t.digests.begin(), t.digests.end());
      continue;
    }
    LS_ASSERT(t.values.size() == static_cast<size_t>(t.rows) * t.width, "{}: {} values for [{}, {}]",
              t.name(), t.values.size(), t.rows, t.width);
    for (int32_t r = 0; r < t.rows; ++r) out.push_back(activation_row_digest(t.row(r)));
  }
  return out;
}

int64_t activation_digests_count(int32_t layers, int32_t tokens, int32_t logits_rows) {
  return int64_t{layers} * kLayerActivationKinds * tokens + 2 * int64_t{logits_rows};
}

ActivationSite activation_site(int32_t layers, int32_t tokens, int32_t logits_rows, int64_t index) {
  LS_ASSERT(index >= 0 && index < activation_digests_count(layers, tokens, logits_rows),
            "activation digest {} of {}", index, activation_digests_count(layers, tokens, logits_rows));
  const int64_t per_layer = int64_t{kLayerActivationKinds} * tokens;
  if (index < per_layer * layers) {
    const int64_t in_layer = index % per_layer;
    return ActivationSite{.layer = static_cast<int32_t>(index / per_layer),
                          .kind = static_cast<ActivationKind>(in_layer / tokens),
                          .row = static_cast<int32_t>(in_layer % tokens)};
  }
  const int64_t rest = index - per_layer * layers;
  return ActivationSite{.layer = -1,
                        .kind = rest < logits_rows ? ActivationKind::kFinalNorm
                                                   : ActivationKind::kLogits,
                        .row = static_cast<int32_t>(rest % logits_rows)};
}

std::optional<ActivationDifference> first_activation_difference(const StepActivations& actual,
                                                                const StepActivations& expected,
                                                                std::optional<double> tolerance) {
  LS_REQUIRE(actual.tensors.size() == expected.tensors.size(),
             "the two captures of the step hold {} and {} tensors", actual.tensors.size(),
             expected.tensors.size());
  for (size_t i = 0; i < actual.tensors.size(); ++i) {
    const ActivationTensor& a = actual.tensors[i];
    const ActivationTensor& b = expected.tensors[i];
    LS_ASSERT(a.values.size() == static_cast<size_t>(a.rows) * a.width &&
                  b.values.size() == static_cast<size_t>(b.rows) * b.width,
              "{}: compared without its values (captured as digests)", a.name());
    LS_REQUIRE(a.layer == b.layer && a.kind == b.kind && a.rows == b.rows && a.width == b.width,
               "the two captures of the step differ in shape at tensor {}: {} [{}, {}] and {} [{}, {}]",
               i, a.name(), a.rows, a.width, b.name(), b.rows, b.width);
    for (int32_t r = 0; r < a.rows; ++r) {
      double scale = 0;
      const int32_t e = first_differing_element(a.row(r), b.row(r), tolerance, scale);
      if (e < 0) continue;
      return ActivationDifference{.tensor = a.name(), .layer = a.layer, .kind = a.kind, .row = r,
                                  .element = e, .actual = a.row(r)[e], .expected = b.row(r)[e],
                                  .row_scale = scale};
    }
  }
  return std::nullopt;
}

}  // namespace ls
