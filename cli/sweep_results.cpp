#include "cli/sweep_results.h"

#include "cli/number_flags.h"
#include "core/check.h"
#include "core/model/strict_json.h"

#include <fmt/format.h>

#include <fstream>
#include <limits>
#include <set>

namespace ls::cli {

namespace {

using Json = nlohmann::ordered_json;

const std::set<std::string, std::less<>> kLineKeys = {
    "seed", "verdict", "failures", "fingerprint", "twin_fingerprint", "reproduce",
    "wall_seconds", "params", "summary"};
const std::set<std::string, std::less<>> kFailureKeys = {"checker", "step", "detail"};

Json params_json(const sim::SimParams& p) {
  Json faults = Json::array();
  for (sim::FaultSite site : p.faults) faults.push_back(std::string(sim::to_string(site)));
  return Json{{"requests", p.requests_count},
              {"max_batch_rows", p.max_batch_rows},
              {"context_length", p.context_length},
              {"page_size", p.page_size},
              {"pages", p.pages_count},
              {"host_pages", p.host_pages_count},
              {"token_budget", p.prefill_chunk_tokens},
              {"overlap", p.overlap},
              {"mixed_batches", p.mixed_batches},
              {"prefix_cache", p.prefix_cache},
              {"arrivals_per_step", p.arrivals_per_step},
              {"prompt_tokens", {p.prompt_tokens_min, p.prompt_tokens_max}},
              {"shared_prefix_tokens", p.shared_prefix_tokens},
              {"shared_prefixes", p.shared_prefixes_count},
              {"shared_prefix_fraction", p.shared_prefix_fraction},
              {"max_new_tokens", {p.max_new_tokens_min, p.max_new_tokens_max}},
              {"greedy_fraction", p.greedy_fraction},
              {"client_abort_fraction", p.client_abort_fraction},
              {"faults", faults},
              {"fault_rate", p.fault_rate},
              {"verify_width", p.verify_width},
              {"drafter", p.drafter_name()}};
}

Json summary_json(const sim::SimSummary& s) {
  Json fired = Json::object();
  for (int i = 0; i < sim::kFaultSitesCount; ++i) {
    fired[std::string(sim::to_string(static_cast<sim::FaultSite>(i)))] = s.faults_fired[i];
  }
  Json summary{{"steps", s.steps_count},
               {"requests_finished", s.requests_finished},
               {"requests_aborted", s.requests_aborted},
               {"requests_numerical_errors", s.requests_numerical_errors},
               {"tokens_generated", s.tokens_generated},
               {"prefix_hit_tokens", s.prefix_hit_tokens},
               {"retractions_swap", s.retractions_swap},
               {"retractions_recompute", s.retractions_recompute},
               {"recoveries", s.recoveries},
               {"faults_fired", fired}};
  if (s.params.verify_width > 1) {
    // Decode rows by accepted length 0..W: how far speculation got.
    const auto& by = s.decode_rows_by_accepted;
    summary["decode_rows_by_accepted"] =
        std::vector<int64_t>(by.begin(), by.begin() + s.params.verify_width + 1);
  }
  return summary;
}

Json failure_json(const SeedFailure& f) {
  return Json{{"checker", f.checker}, {"step", f.step}, {"detail", f.detail}};
}

Json line_json(const SeedResult& r) {
  Json failures = Json::array();
  for (const SeedFailure& f : r.failures) failures.push_back(failure_json(f));
  return Json{{"seed", r.seed},
              {"verdict", r.passed() ? "pass" : "fail"},
              {"failures", failures},
              {"fingerprint", fmt::format("{:016x}", r.fingerprint)},
              {"twin_fingerprint", r.twin_fingerprint ? Json(fmt::format("{:016x}", *r.twin_fingerprint))
                                                      : Json(nullptr)},
              {"reproduce", r.reproduce},
              {"wall_seconds", r.wall_seconds},
              {"params", r.params},
              {"summary", r.summary}};
}

// The reading side: every key is known, present and of its type, or the line is refused.
class LineReader {
 public:
  LineReader(const Json& object, const std::string& where) : object_(object), where_(where) {}

  [[noreturn]] void refuse(std::string_view field, std::string_view why) const {
    throw Error(fmt::format("{}: field '{}': {}", where_, field, why));
  }

  const Json& field(const char* name) const {
    const auto it = object_.find(name);
    if (it == object_.end()) refuse(name, "missing");
    return *it;
  }

  void no_unknown_keys(const Json& object, const std::set<std::string, std::less<>>& known,
                       std::string_view prefix) const {
    for (const auto& [key, value] : object.items()) {
      if (!known.count(key)) refuse(fmt::format("{}{}", prefix, key), "unknown field");
    }
  }

  std::string text(const char* name, const Json& v) const {
    if (!v.is_string()) refuse(name, "expected a string");
    return v.get<std::string>();
  }

  uint64_t hex64(const char* name, const Json& v) const {
    const std::string s = text(name, v);
    if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos) {
      refuse(name, fmt::format("expected 16 lowercase hex digits, got '{}'", s));
    }
    return std::stoull(s, nullptr, 16);
  }

  std::vector<SeedFailure> failures(const Json& v) const {
    if (!v.is_array()) refuse("failures", "expected an array");
    std::vector<SeedFailure> out;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string prefix = fmt::format("failures[{}].", i);
      const Json& f = v[i];
      if (!f.is_object()) refuse(fmt::format("failures[{}]", i), "expected an object");
      no_unknown_keys(f, kFailureKeys, prefix);
      for (const char* key : {"checker", "step", "detail"}) {
        if (!f.contains(key)) refuse(prefix + key, "missing");
      }
      if (!f["checker"].is_string()) refuse(prefix + "checker", "expected a string");
      if (!f["detail"].is_string()) refuse(prefix + "detail", "expected a string");
      const Json& step = f["step"];
      if (!step.is_number_integer() ||
          (step.is_number_unsigned() && step.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()})) {
        refuse(prefix + "step", fmt::format("expected a 64-bit integer, got {}", step.dump()));
      }
      out.push_back({f["checker"].get<std::string>(), f["step"].get<int64_t>(),
                     f["detail"].get<std::string>()});
    }
    return out;
  }

 private:
  const Json& object_;
  const std::string& where_;
};

SeedResult result_of_json(const Json& j, const std::string& where) {
  const LineReader in(j, where);
  in.no_unknown_keys(j, kLineKeys, "");
  SeedResult r;
  const Json& seed = in.field("seed");
  if (!seed.is_number_unsigned()) in.refuse("seed", "expected a non-negative integer");
  r.seed = seed.get<uint64_t>();
  r.failures = in.failures(in.field("failures"));
  const std::string verdict = in.text("verdict", in.field("verdict"));
  if (verdict != "pass" && verdict != "fail") in.refuse("verdict", fmt::format("expected pass or fail, got '{}'", verdict));
  if ((verdict == "pass") != r.failures.empty()) {
    in.refuse("verdict", fmt::format("'{}' with {} failures", verdict, r.failures.size()));
  }
  r.fingerprint = in.hex64("fingerprint", in.field("fingerprint"));
  const Json& twin = in.field("twin_fingerprint");
  if (!twin.is_null()) r.twin_fingerprint = in.hex64("twin_fingerprint", twin);
  r.reproduce = in.text("reproduce", in.field("reproduce"));
  if (r.reproduce.empty()) in.refuse("reproduce", "empty");
  const Json& wall = in.field("wall_seconds");
  if (!wall.is_number() || wall.get<double>() < 0) in.refuse("wall_seconds", "expected a number >= 0");
  r.wall_seconds = wall.get<double>();
  r.params = in.field("params");
  if (!r.params.is_object()) in.refuse("params", "expected an object");
  r.summary = in.field("summary");
  if (!r.summary.is_object()) in.refuse("summary", "expected an object");
  return r;
}

// XML 1.0 text and attribute values: the five entities, and characters XML cannot carry at all
// (C0 controls other than tab, newline, return) replaced so a checker's message never breaks
// the file.
std::string xml_escaped(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        const bool control = static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r';
        out += control ? '?' : c;
    }
  }
  return out;
}

std::string describe_failure(const SeedFailure& f) {
  return fmt::format("{} at {}: {}", f.checker, f.step < 0 ? "the end" : fmt::format("step {}", f.step),
                     f.detail);
}

std::string junit_case(const SeedResult& r) {
  std::string body = fmt::format("reproduce: {}\n", r.reproduce);
  std::string out = fmt::format("    <testcase classname=\"lockstep.sim\" name=\"seed {}\" time=\"{:.6f}\">\n",
                                r.seed, r.wall_seconds);
  if (!r.passed()) {
    std::string all;
    for (const SeedFailure& f : r.failures) all += describe_failure(f) + "\n";
    out += fmt::format("      <failure type=\"{}\" message=\"{}\">{}{}</failure>\n",
                       xml_escaped(r.failures[0].checker), xml_escaped(describe_failure(r.failures[0])),
                       xml_escaped(all), xml_escaped(body));
  }
  out += fmt::format("      <system-out>{}fingerprint {:016x}</system-out>\n", xml_escaped(body), r.fingerprint);
  out += "    </testcase>\n";
  return out;
}

}  // namespace

std::pair<uint64_t, uint64_t> parse_seed_range(const std::string& text, std::string_view flag) {
  const size_t dots = text.find("..");
  LS_REQUIRE(dots != std::string::npos, "{} '{}': expected A..B, e.g. 1..200", flag, text);
  const std::string a = text.substr(0, dots), b = text.substr(dots + 2);
  const std::optional<uint64_t> first = parse_uint64(a), last = parse_uint64(b);
  LS_REQUIRE(first && last, "{} '{}': expected A..B with two integers in [0, {}]; '{}' is not one",
             flag, text, std::numeric_limits<uint64_t>::max(), first ? b : a);
  LS_REQUIRE(*first <= *last, "{} '{}': the first seed is larger than the last", flag, text);
  return {*first, *last};
}

bool SeedResult::same_run(const SeedResult& other) const { return first_difference(other).empty(); }

std::string SeedResult::first_difference(const SeedResult& o) const {
  if (seed != o.seed) return "seed";
  if (failures != o.failures) return "failures";
  if (fingerprint != o.fingerprint) return "fingerprint";
  if (twin_fingerprint != o.twin_fingerprint) return "twin_fingerprint";
  if (reproduce != o.reproduce) return "reproduce";
  // Compared as plain objects: the key order of a line is not part of its meaning.
  if (nlohmann::json(params) != nlohmann::json(o.params)) return "params";
  if (nlohmann::json(summary) != nlohmann::json(o.summary)) return "summary";
  return "";
}

SeedResult seed_result_of(const sim::SimParams& params, const sim::SeedVerdict& verdict,
                          std::string reproduce, double wall_seconds) {
  SeedResult r;
  r.seed = params.seed;
  r.params = params_json(params);
  r.summary = summary_json(verdict.summary);
  for (const sim::CheckFailure& f : verdict.summary.failures) r.failures.push_back({f.checker, f.step, f.detail});
  if (!verdict.twin_ok()) {
    r.failures.push_back({"twin-run", -1,
                          fmt::format("the twin run's fingerprint {:016x} differs from {:016x}",
                                      verdict.twin_fingerprint, verdict.summary.fingerprint)});
  }
  r.fingerprint = verdict.summary.fingerprint;
  if (verdict.twin_checked) r.twin_fingerprint = verdict.twin_fingerprint;
  r.reproduce = std::move(reproduce);
  r.wall_seconds = wall_seconds;
  return r;
}

std::string result_line(const SeedResult& result) { return line_json(result).dump(); }

SeedResult parse_result_line(std::string_view line, const std::string& where) {
  Json j;
  try {
    // Strict: a key written twice is refused, not resolved to its last value; then parsed again
    // keeping the key order (the lines are rewritten as read).
    parse_json_document(line, where);
    j = Json::parse(line);
  } catch (const Error& e) {
    throw Error(fmt::format("not a JSON line: {}", e.what()));
  }
  LS_REQUIRE(j.is_object(), "{}: expected a JSON object per line", where);
  return result_of_json(j, where);
}

std::vector<LocatedResult> read_results_file(const std::string& path) {
  std::ifstream in(path);
  LS_REQUIRE(in.good(), "{}: cannot open the results file", path);
  std::vector<LocatedResult> out;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    const std::string where = fmt::format("{}:{}", path, number);
    out.push_back({parse_result_line(line, where), where});
  }
  LS_REQUIRE(!in.bad(), "{}: read error", path);
  return out;
}

std::ofstream open_output_file(const std::string& path) {
  std::ofstream out(path);
  LS_REQUIRE(out.good(), "{}: cannot open for writing", path);
  return out;
}

void write_results(std::ostream& out, const std::vector<SeedResult>& results, const std::string& path) {
  for (const SeedResult& r : results) out << result_line(r) << '\n';
  out.flush();
  LS_REQUIRE(out.good(), "{}: write failed", path);
}

void write_junit(std::ostream& out, const std::vector<SeedResult>& results,
                 const std::string& suite_name, const std::string& path) {
  int64_t failed = 0;
  double seconds = 0;
  for (const SeedResult& r : results) failed += !r.passed(), seconds += r.wall_seconds;
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out << fmt::format("<testsuites name=\"lockstep sim\" tests=\"{}\" failures=\"{}\" errors=\"0\" time=\"{:.6f}\">\n",
                     results.size(), failed, seconds);
  out << fmt::format("  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"0\" time=\"{:.6f}\">\n",
                     xml_escaped(suite_name), results.size(), failed, seconds);
  for (const SeedResult& r : results) out << junit_case(r);
  out << "  </testsuite>\n</testsuites>\n";
  out.flush();
  LS_REQUIRE(out.good(), "{}: write failed", path);
}

}  // namespace ls::cli
