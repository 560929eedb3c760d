#include "proptest/runner.h"

#include "core/check.h"

#include <fmt/format.h>

#include <cstdlib>

namespace ls::proptest {

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::filesystem::path failure_directory() {
  const char* dir = std::getenv("LOCKSTEP_PROPTEST_DIR");
  return dir != nullptr && *dir != '\0' ? std::filesystem::path(dir)
                                        : std::filesystem::path("/tmp/lockstep-proptest");
}

std::filesystem::path failure_trace_path(const std::string& property, uint64_t case_hash) {
  std::filesystem::create_directories(failure_directory());
  std::string name = property;
  for (char& c : name) c = (c == '/' || c == ' ') ? '-' : c;
  return failure_directory() / fmt::format("{}-{:016x}.trace", name, case_hash);
}

namespace detail {

RunState begin(const std::string& id, const PropertyConfig& config) {
  RunState s;
  s.id = id;
  s.params = rc::detail::configuration().testParams;
  s.params.seed = config.seed ^ fnv1a(id);
  s.params.maxSuccess = config.cases;
  s.params.maxSize = config.max_size;
  return s;
}

Outcome finish(RunState& state, const rc::detail::TestResult& result) {
  Outcome out;
  out.cases_run = state.cases_run;
  if (result.is<rc::detail::SuccessResult>()) {
    out.passed = true;
    return out;
  }
  out.message = fmt::format("property {} (seed {}) failed after {} cases:\n{}", state.id,
                            state.params.seed, state.cases_run, rc_support::result_text(result));
  if (result.is<rc::detail::FailureResult>()) {
    rc::detail::Configuration c;
    c.testParams = state.params;
    c.reproduce[state.id] = result.get<rc::detail::FailureResult>().reproduce;
    out.reproduce = fmt::format("RC_PARAMS=\"{}\"", rc::detail::configToMinimalString(c));
    out.message += fmt::format("\nreproduce the shrunk case: {} <this test binary> (property id {})",
                               out.reproduce, state.id);
  }
  return out;
}

}  // namespace detail

void attach_trace(Outcome& outcome, const std::filesystem::path& trace, const std::string& note) {
  outcome.trace = trace;
  outcome.message += fmt::format(
      "\nthe shrunk case is recorded in {} (folder: $LOCKSTEP_PROPTEST_DIR or "
      "/tmp/lockstep-proptest){}{}\n  replay it:  lockstep replay {}\n  check it:   lockstep check {}",
      trace.string(), note.empty() ? "" : "; ", note, trace.string(), trace.string());
}

const PropertyEntry& property_named(const std::string& name) {
  for (const PropertyEntry& e : all_properties()) {
    if (e.name == name) return e;
  }
  throw Error("no property named " + name);
}

}  // namespace ls::proptest
