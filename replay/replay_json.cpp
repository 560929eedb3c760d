#include "replay/replay_json.h"

#include "core/check.h"
#include "core/tensor_parallel.h"

#include <fmt/format.h>

#include <fstream>
#include <set>

namespace ls::replay {

namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kKind = "lockstep-replay";
const std::set<std::string, std::less<>> kKeys = {
    "kind", "trace", "trace_bytes", "weights_digest", "build_id", "mode", "backend", "tp_degree", "verdict",
    "steps_replayed", "steps_compared", "divergence", "truncation", "teacher_forced",
    "localisation"};
const std::set<std::string, std::less<>> kDivergenceKeys = {"step", "request_id", "row", "field",
                                                            "expected", "actual", "replay_until"};
const std::set<std::string, std::less<>> kAgreementKeys = {"tokens_equal", "tokens_count",
                                                           "steps_all_equal", "logit_delta_max"};

Json divergence_json(const Divergence& d, const std::string& replay_until) {
  return Json{{"step", d.step},         {"request_id", d.request_id}, {"row", d.row},
              {"field", d.field},       {"expected", d.expected},     {"actual", d.actual},
              {"replay_until", replay_until}};
}

Json agreement_json(const ReplayReport& r) {
  int64_t steps_all_equal = 0;
  for (const StepAgreement& a : r.agreement) steps_all_equal += a.tokens_equal == a.tokens_count;
  return Json{{"tokens_equal", r.tokens_equal},
              {"tokens_count", r.tokens_count},
              {"steps_all_equal", steps_all_equal},
              {"logit_delta_max", r.logit_delta_max}};
}

class Fields {
 public:
  Fields(const Json& j, std::string where) : j_(j), where_(std::move(where)) {}

  [[noreturn]] void refuse(std::string_view field, std::string_view why) const {
    throw Error(fmt::format("{}: field '{}': {}", where_, field, why));
  }
  void known_only(const std::set<std::string, std::less<>>& keys) const {
    for (const auto& [key, value] : j_.items()) {
      if (!keys.count(key)) refuse(key, "unknown field");
    }
    for (const std::string& key : keys) {
      if (!j_.contains(key)) refuse(key, "missing");
    }
  }
  std::string text(const char* key) const {
    if (!j_[key].is_string()) refuse(key, "expected a string");
    return j_[key].get<std::string>();
  }
  int64_t integer(const char* key) const {
    if (!j_[key].is_number_integer()) refuse(key, "expected an integer");
    return j_[key].get<int64_t>();
  }
  const Json& at(const char* key) const { return j_[key]; }

 private:
  const Json& j_;
  std::string where_;
};

Divergence divergence_of(const Json& j, const std::string& where, std::string& replay_until) {
  if (!j.is_object()) throw Error(fmt::format("{}: field 'divergence': expected an object or null", where));
  const Fields d(j, where + ": divergence");
  d.known_only(kDivergenceKeys);
  replay_until = d.text("replay_until");
  return Divergence{.step = d.integer("step"),
                    .request_id = static_cast<RequestId>(d.integer("request_id")),
                    .row = static_cast<int32_t>(d.integer("row")),
                    .field = d.text("field"),
                    .expected = d.text("expected"),
                    .actual = d.text("actual")};
}

double agreement_of(const Json& j, const std::string& where) {
  if (!j.is_object()) throw Error(fmt::format("{}: field 'teacher_forced': expected an object or null", where));
  const Fields a(j, where + ": teacher_forced");
  a.known_only(kAgreementKeys);
  a.integer("steps_all_equal");
  if (!a.at("logit_delta_max").is_number()) a.refuse("logit_delta_max", "expected a number");
  const int64_t count = a.integer("tokens_count");
  return count > 0 ? double(a.integer("tokens_equal")) / double(count) : 1.0;
}

}  // namespace

Json replay_result_json(const ReplayReport& r, ReplayMode mode, const ReplayedTrace& trace,
                        const std::string& replay_until) {
  const bool exact = mode == ReplayMode::kExact;
  const std::string verdict = r.divergence ? "diverged" : r.identical() ? "identical" : "disagreed";
  return Json{{"kind", kKind},
              {"trace", trace.path},
              {"trace_bytes", trace.file_bytes},
              {"weights_digest", fmt::format("{:016x}", r.header.weights_digest)},
              {"build_id", r.header.build_id},
              {"mode", exact ? "exact" : "teacher-forced"},
              {"backend", r.backend},
              {"tp_degree", r.tp_degree},
              {"verdict", verdict},
              {"steps_replayed", r.steps_replayed},
              {"steps_compared", r.steps_compared},
              {"divergence", r.divergence ? divergence_json(*r.divergence, replay_until) : Json(nullptr)},
              {"truncation", r.truncation ? Json(r.truncation->describe()) : Json(nullptr)},
              {"teacher_forced", exact ? Json(nullptr) : agreement_json(r)},
              // --localise (replay/localise.h localisation_json) sets it; null otherwise.
              {"localisation", Json(nullptr)}};
}

ReplayResultSummary read_replay_result(const std::filesystem::path& path, const trace::TraceHeader& header,
                                       uint64_t trace_bytes) {
  std::ifstream in(path);
  LS_REQUIRE(in.good(), "--replay-json {}: cannot open", path.string());
  const std::string where = "--replay-json " + path.string();
  Json j;
  try {
    j = Json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(fmt::format("{}: not JSON: {}", where, e.what()));
  }
  LS_REQUIRE(j.is_object(), "{}: expected a JSON object (lockstep replay --json)", where);
  const Fields f(j, where);
  f.known_only(kKeys);
  if (f.text("kind") != kKind) f.refuse("kind", fmt::format("expected '{}'", kKind));
  const std::string digest = fmt::format("{:016x}", header.weights_digest);
  if (f.text("weights_digest") != digest || f.integer("trace_bytes") != static_cast<int64_t>(trace_bytes)) {
    throw Error(fmt::format("{} is the replay of another trace ({}: {} bytes, weights {}; this trace: {} bytes, "
                            "weights {})", where, f.text("trace"), f.integer("trace_bytes"),
                            f.text("weights_digest"), trace_bytes, digest));
  }
  f.text("trace");
  f.text("build_id");
  if (!f.at("truncation").is_null()) f.text("truncation");
  // A report does not show the localisation; it is an object (localisation_json) or null.
  // (Absent from results written before --localise.)
  if (j.contains("localisation") && !j["localisation"].is_null() && !j["localisation"].is_object()) {
    f.refuse("localisation", "expected an object or null");
  }
  ReplayResultSummary s{.mode = f.text("mode"), .verdict = f.text("verdict"), .backend = f.text("backend"),
                        .steps_replayed = f.integer("steps_replayed"), .steps_compared = f.integer("steps_compared")};
  s.tp_degree = f.integer("tp_degree");
  if (s.tp_degree < 1 || s.tp_degree > kTpDegreeMax) {
    f.refuse("tp_degree", fmt::format("expected 1..{}", kTpDegreeMax));
  }
  if (s.mode != "exact" && s.mode != "teacher-forced") f.refuse("mode", "expected exact or teacher-forced");
  if (s.verdict != "identical" && s.verdict != "diverged" && s.verdict != "disagreed") {
    f.refuse("verdict", "expected identical, diverged or disagreed");
  }
  if (!f.at("divergence").is_null()) s.divergence = divergence_of(f.at("divergence"), where, s.replay_until);
  if ((s.verdict == "diverged") != s.divergence.has_value()) f.refuse("divergence", "does not match the verdict");
  if (!f.at("teacher_forced").is_null()) s.token_agreement = agreement_of(f.at("teacher_forced"), where);
  if ((s.mode == "teacher-forced") != s.token_agreement.has_value()) f.refuse("teacher_forced", "does not match the mode");
  return s;
}

}  // namespace ls::replay
