#include "replay/localise.h"

#include "core/check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ls::replay {

namespace {

// The op row of a tensor row: a token (prefill rows' tokens in order, then W per decode row) for
// the per-layer tensors, a logits row (one per prefill row, then W per decode row) for the last two.
int32_t op_row_of(const ForwardOp& op, int32_t verify_width, ActivationKind kind, int32_t row) {
  const int32_t ne = op.prefill_rows_count();
  const bool per_logits_row = kind == ActivationKind::kFinalNorm || kind == ActivationKind::kLogits;
  int32_t first = 0;
  for (int32_t r = 0; r < ne; ++r) {
    const int32_t count = per_logits_row ? 1 : op.rows[static_cast<size_t>(r)].input_length;
    if (row < first + count) return r;
    first += count;
  }
  const int32_t decode = (row - first) / verify_width;
  LS_ASSERT(ne + decode < op.rows_count(), "tensor row {} past the op's {} rows", row, op.rows_count());
  return ne + decode;
}

void name_row(Localisation& l, const ReplayReport& r, int32_t layer, ActivationKind kind,
              int32_t row) {
  l.differs = true;
  l.layer = layer;
  l.kind = std::string(activation_kind_name(kind));
  l.tensor = layer < 0 ? l.kind : fmt::format("layer {} {}", layer, l.kind);
  l.token_row = row;
  l.op_row = op_row_of(r.captured_op, r.header.executor.verify_width, kind, row);
  l.request_id = r.captured_op.rows[static_cast<size_t>(l.op_row)].request_id;
}

ReplayReport replay_with_capture(const std::filesystem::path& trace, ReplayOptions options,
                                 int64_t step) {
  options.until_step = step;
  options.capture_step = step;
  options.on_progress = nullptr;
  return replay_trace(trace, options);
}

void against_digests(Localisation& l, const ReplayReport& r) {
  const std::vector<uint64_t> replayed = activation_digests(r.captured);
  const std::vector<uint64_t>& recorded = r.recorded_activation_digests;
  LS_REQUIRE(replayed.size() == recorded.size(),
             "step {}: the trace records {} activation digests, the replay computed {}", l.step,
             recorded.size(), replayed.size());
  const auto [a, b] = std::mismatch(replayed.begin(), replayed.end(), recorded.begin());
  if (a == replayed.end()) return;
  const int64_t index = a - replayed.begin();
  int64_t first = 0;  // the digest index of the tensor's row 0
  for (const ActivationTensor& t : r.captured.tensors) {
    if (index < first + t.rows) {
      const int32_t row = static_cast<int32_t>(index - first);
      name_row(l, r, t.layer, t.kind, row);
      l.replayed_digest = *a, l.recorded_digest = *b;
      const std::span<const float> values = t.row(row);
      l.row_width = t.width;
      l.replayed_values.assign(values.begin(),
                               values.begin() + std::min<ptrdiff_t>(Localisation::kValuesShown,
                                                                    static_cast<ptrdiff_t>(values.size())));
      return;
    }
    first += t.rows;
  }
  LS_ASSERT(false, "activation digest {} in no tensor", index);
}

uint32_t bits_of(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

}  // namespace

Localisation localise_step(const LocaliseRequest& q) {
  Localisation l{.step = q.step, .replay_backend = q.replay_backend};
  const ReplayReport mine = replay_with_capture(q.trace, q.replay_side, q.step);
  l.step_ran = mine.captured_step_ran;
  if (!q.other_side) {
    l.against = "recorded activation digests";
    LS_REQUIRE(mine.header.activation_digests,
               "--localise: the trace records no activation digests (record with "
               "--record-activations) and no second replay was asked for (--localise-against)");
    if (l.step_ran) against_digests(l, mine);
    return l;
  }
  l.against = fmt::format("a replay on {}", q.other_backend);
  l.tolerance = q.tolerance;
  const ReplayReport other = replay_with_capture(q.trace, *q.other_side, q.step);
  l.step_ran = l.step_ran && other.captured_step_ran;
  if (!l.step_ran) return l;
  l.difference = first_activation_difference(mine.captured, other.captured, q.tolerance);
  if (l.difference) {
    name_row(l, mine, l.difference->layer, l.difference->kind, l.difference->row);
    const ActivationTensor* t = nullptr;
    for (const ActivationTensor& c : mine.captured.tensors) {
      if (c.layer == l.difference->layer && c.kind == l.difference->kind) t = &c;
    }
    l.row_width = t ? t->width : 0;
  }
  return l;
}

std::string describe_localisation(const Localisation& l) {
  std::string out = fmt::format("localise: step {} re-run with per-layer activations on {} against {}",
                                l.step, l.replay_backend, l.against);
  out += l.tolerance ? fmt::format(" (tolerance: |a - b| > {} x max|b| over the row)\n", *l.tolerance)
                     : std::string(" (bits compared)\n");
  if (!l.step_ran) return out + "  the step was refused on a side: no activations to compare\n";
  if (!l.differs) {
    return out + "  IDENTICAL: every layer's tensors agree" +
           (l.tolerance ? " within the tolerance\n" : " bit for bit\n");
  }
  out += fmt::format("  first difference: {}, row {} (op row {}, request {})\n", l.tensor,
                     l.token_row, l.op_row, l.request_id);
  if (l.difference) {
    const ActivationDifference& d = *l.difference;
    out += fmt::format("  element {} of {}: replay {:.9g} (0x{:08x}), {} {:.9g} (0x{:08x})", d.element,
                       l.row_width, d.actual, bits_of(d.actual), "other side", d.expected,
                       bits_of(d.expected));
    if (l.tolerance) out += fmt::format(", |a - b| {:.6g} against max|b| {:.6g}", std::fabs(d.actual - d.expected), d.row_scale);
    return out + "\n";
  }
  out += fmt::format("  digest: recorded {:016x}, replayed {:016x}; the recorded values are not in "
                     "the trace, the replay's first {} of {}:", l.recorded_digest,
                     l.replayed_digest, l.replayed_values.size(), l.row_width);
  for (const float v : l.replayed_values) out += fmt::format(" {:.9g}", v);
  return out + "\n";
}

nlohmann::ordered_json localisation_json(const Localisation& l) {
  using Json = nlohmann::ordered_json;
  Json j{{"step", l.step},
         {"replay_backend", l.replay_backend},
         {"against", l.against},
         {"tolerance", l.tolerance ? Json(*l.tolerance) : Json(nullptr)},
         {"step_ran", l.step_ran},
         {"verdict", !l.step_ran ? "not-run" : l.differs ? "differs" : "identical"}};
  if (!l.differs) return j;
  j["tensor"] = l.tensor;
  j["layer"] = l.layer;
  j["kind"] = l.kind;
  j["row"] = l.token_row;
  j["op_row"] = l.op_row;
  j["request_id"] = l.request_id;
  if (l.difference) {
    j["element"] = l.difference->element;
    j["replay_value"] = l.difference->actual;
    j["other_value"] = l.difference->expected;
  } else {
    j["recorded_digest"] = fmt::format("{:016x}", l.recorded_digest);
    j["replayed_digest"] = fmt::format("{:016x}", l.replayed_digest);
    j["replayed_values"] = l.replayed_values;
  }
  return j;
}

}  // namespace ls::replay
