// Running a RapidCheck property with lockstep's budgets (fixed seeds in CI, fresh ones in the long
// run) and turning a failure into something a user can act on: the shrunk case recorded as a trace
// under a folder the message names, the `lockstep replay` command, and the RC_PARAMS line that
// reproduces the case.
#pragma once

#include "proptest/broken_backend.h"
#include "proptest/rc_support.h"

#include <rapidcheck.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ls::proptest {

struct PropertyConfig {
  uint64_t seed = 0;
  int cases = 20;     // successful cases before the property passes
  int max_size = rc_support::kGenSize;  // RapidCheck's size: bounds every generated collection
  BackendBug bug = BackendBug::kNone;  // a planted backend bug (companion tests)
  bool planted = false;  // the property's own planted non-backend bug (companion tests)
  bool record_failure = true;  // write the shrunk case as a trace
};

struct Outcome {
  bool passed = false;
  int cases_run = 0;           // cases executed, shrink attempts excluded
  std::string message;         // RapidCheck's failure description, then the trace and reproduce lines
  std::optional<std::filesystem::path> trace;  // the shrunk case, recorded
  std::string reproduce;       // RC_PARAMS="..." that reruns exactly the shrunk case
};

// Where failing cases are written: $LOCKSTEP_PROPTEST_DIR, else /tmp/lockstep-proptest.
std::filesystem::path failure_directory();
// "<dir>/<property>-<hash>.trace".
std::filesystem::path failure_trace_path(const std::string& property, uint64_t case_hash);

namespace detail {

struct RunState {
  std::string id;
  rc::detail::TestParams params;
  int cases_run = 0;
};
RunState begin(const std::string& id, const PropertyConfig& config);
Outcome finish(RunState& state, const rc::detail::TestResult& result);

}  // namespace detail

// Runs `testable` under RapidCheck with the config's seed and case count (RC_PARAMS's reproduce
// map still applies, so a printed reproduce line reruns the shrunk case).
template <typename Testable>
Outcome check_property(const std::string& id, const PropertyConfig& config, Testable&& testable) {
  detail::RunState state = detail::begin(id, config);
  const rc::detail::TestResult result = rc_support::check_testable(
      id, state.params, std::forward<Testable>(testable), state.cases_run);
  return detail::finish(state, result);
}

// Remembers the last failing case; once RapidCheck has shrunk, that is the minimal one (it reruns
// the minimal case last).
template <typename Case>
class LastFailure {
 public:
  void set(const Case& value) { value_ = value; }
  const std::optional<Case>& get() const { return value_; }

 private:
  std::optional<Case> value_;
};

// Appends the trace lines to a failed outcome: where the case was recorded and how to replay it.
void attach_trace(Outcome& outcome, const std::filesystem::path& trace, const std::string& note);

// A property of the suite: its name, the run function, and its CI case count.
struct PropertyEntry {
  std::string name;
  std::function<Outcome(const PropertyConfig&)> run;
  int ci_cases = 20;
};

// Every property, in a fixed order (the CI test and the long runner share it).
const std::vector<PropertyEntry>& all_properties();
const PropertyEntry& property_named(const std::string& name);

// A 64-bit FNV-1a over a string, for case hashes and per-property seeds.
uint64_t fnv1a(const std::string& text);

}  // namespace ls::proptest
