// RapidCheck under lockstep's rules, shared by the property suite (proptest/runner.h) and the
// properties under tests/ (tests/*_properties.cpp). Those build against the planted libraries
// (tests/planted/), so this header needs RapidCheck alone: one CI seed, RapidCheck's size, a
// listener that prints nothing and counts the cases, and run_property for a property written as a
// check that names what broke.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

namespace ls::rc_support {

// The seed CI runs the properties with; RC_PARAMS (a printed reproduce line, or another seed)
// overrides it.
constexpr uint64_t kCiSeed = 20240501;
// RapidCheck's nominal size: at 100, inRange draws its whole range and collections reach their
// generators' bounds.
constexpr int kGenSize = 100;

// Prints nothing (the callers print what they need) and counts the cases run, shrinks excluded.
class CaseCounter final : public rc::detail::TestListener {
 public:
  explicit CaseCounter(int& cases) : cases_(cases) {}
  void onTestCaseFinished(const rc::detail::CaseDescription&) override { ++cases_; }
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}

 private:
  int& cases_;
};

// `cases` successful cases at kGenSize, with kCiSeed unless RC_PARAMS is set.
inline rc::detail::TestParams ci_params(int cases) {
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  if (std::getenv("RC_PARAMS") == nullptr) params.seed = kCiSeed;
  params.maxSuccess = cases;
  params.maxSize = kGenSize;
  return params;
}

// Runs `testable` (RC_ASSERTs) as property `id` under `params`, RC_PARAMS's reproduce map applied
// (a printed reproduce line reruns the shrunk case); the cases run are added to `cases_run`.
template <typename Testable>
rc::detail::TestResult check_testable(const std::string& id, const rc::detail::TestParams& params,
                                      Testable&& testable, int& cases_run) {
  CaseCounter counter(cases_run);
  return rc::detail::checkTestable(std::forward<Testable>(testable), rc::detail::TestMetadata{id, id},
                                   params, counter, rc::detail::configuration().reproduce);
}

// RapidCheck's own description of a result (the shrunk case, the seed, how to reproduce).
inline std::string result_text(const rc::detail::TestResult& result) {
  std::ostringstream text;
  rc::detail::printResultMessage(result, text);
  return text.str();
}

// Runs `check` over `cases` generated cases under ci_params. `check` generates its case (`*gen`)
// and returns "" when the case holds, else what broke, naming the case. nullopt when every case
// holds, else the shrunk case's failure, then RapidCheck's report.
template <typename Check>
std::optional<std::string> run_property(const std::string& id, int cases, Check&& check) {
  std::string last;  // RapidCheck runs the shrunk case last
  int cases_run = 0;
  const rc::detail::TestResult result = check_testable(
      id, ci_params(cases),
      [&] {
        const std::string failure = check();
        if (!failure.empty()) last = failure;
        RC_ASSERT(failure.empty());
      },
      cases_run);
  if (result.is<rc::detail::SuccessResult>()) return std::nullopt;
  return last + "\n" + result_text(result);
}

}  // namespace ls::rc_support
