// Issue 7's speculative-decoding invariance as a RapidCheck property: across generated greedy
// workloads (some running into the context limit, some under page pressure so requests are
// retracted and recovered), W in 2..8 and any acceptance rate (the n-gram drafter, or oracle-mix
// with p in {0, 0.5, 1}), the production scheduler and serving loop produce token for token what
// they produce with speculative decoding off. Its companion plants a verifier that trusts a draft
// the target disagrees with, which the property must catch.
#include "core/cpu_backend.h"
#include "core/drafter.h"
#include "core/executor.h"
#include "core/scheduler.h"
#include "core/serving_loop.h"
#include "proptest/generators.h"
#include "proptest/runner.h"
#include "proptest/workload.h"
#include "sim/oracle_drafter.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <memory>

namespace ls::proptest {
namespace {

using Tokens = std::map<RequestId, std::vector<int32_t>>;

struct SpecCase {
  std::vector<RequestSpec> requests;
  int32_t width = 2;
  int32_t drafter = 0;  // 0 n-gram; 1, 2, 3: oracle-mix with p = 0, 0.5, 1
  bool overlap = true;
  bool tight_pages = false;
};

std::string describe(const SpecCase& c) {
  std::string text = fmt::format("W {}, drafter {}, overlap {}, {} pages\n", c.width,
                                 c.drafter == 0 ? "ngram" : fmt::format("oracle-mix p={}", (c.drafter - 1) * 0.5),
                                 c.overlap ? "on" : "off", c.tight_pages ? "tight" : "ample");
  for (const RequestSpec& r : c.requests) {
    text += fmt::format("  request {}: prompt [{}], max_new_tokens {}\n", r.id, fmt::join(r.prompt, " "),
                        r.max_new_tokens);
  }
  return text;
}

rc::Gen<SpecCase> gen_spec_case() {
  return rc::gen::exec([] {
    SpecCase c;
    c.requests = *gen_request_specs(6, /*greedy_only=*/true);
    c.width = *rc::gen::inRange(2, 9);
    c.drafter = *rc::gen::inRange(0, 4);
    c.overlap = *rc::gen::inRange(0, 2) == 1;
    c.tight_pages = *rc::gen::inRange(0, 3) == 0;
    return c;
  });
}

// The planted bug: a verifier that, where the target rejects the first draft, accepts it anyway.
class DraftTrustingVerifier final : public Verifier {
 public:
  int32_t verify(const VerifyRow& row, std::span<int32_t> out, SamplingScratch& scratch) const override {
    const int32_t accepted = StandardVerifier().verify(row, out, scratch);
    if (row.force_single || row.inputs.size() < 2 || accepted > 1 || out[0] == row.inputs[1]) {
      return accepted;
    }
    out[0] = row.inputs[1];
    out[1] = argmax_token(row.logits.subspan(static_cast<size_t>(row.vocab_size),
                                             static_cast<size_t>(row.vocab_size)));
    return 2;
  }
};

constexpr int32_t kContextLength = 48;  // the generator's long requests run into it

Tokens serve(const SpecCase& c, int32_t width, std::unique_ptr<Drafter> drafter, bool planted) {
  SchedulerConfig sc;
  sc.max_batch_rows = 4;
  sc.prefill_chunk_tokens = 32;
  sc.page_size = 4;
  sc.context_length = kContextLength;
  sc.verify_width = width;
  sc.overlap = c.overlap;
  sc.host_pages_count = 16;
  // Tight: room for about two full contexts, so decode growth retracts.
  sc.pages_count = c.tight_pages ? 2 * ((kContextLength + 2 * 8) / 4 + 2) + 1 : 400;
  const ExecutorConfig ec = executor_config_for(sc);
  CpuBackend backend(tiny_weights(), ec, planted ? std::make_unique<DraftTrustingVerifier>() : nullptr,
                     false, std::move(drafter));
  Executor executor(ec, tiny_vocab(), backend);
  Scheduler scheduler(sc);
  for (const RequestSpec& r : c.requests) scheduler.submit(r, tiny_vocab());
  run_serving_loop(scheduler, executor);
  Tokens tokens;
  for (const auto& [id, outcome] : scheduler.outcomes()) tokens[id] = outcome.tokens;
  return tokens;
}

std::unique_ptr<Drafter> drafter_of(const SpecCase& c, const Tokens& plain) {
  if (c.drafter == 0) return std::make_unique<NgramDrafter>();
  sim::References references;
  for (const RequestSpec& r : c.requests) {
    std::vector<int32_t> sequence = r.prompt;
    sequence.insert(sequence.end(), plain.at(r.id).begin(), plain.at(r.id).end());
    references[r.id] = std::move(sequence);
  }
  return std::make_unique<sim::OracleMixDrafter>(std::move(references), (c.drafter - 1) * 0.5, 17);
}

Outcome spec_decoding_invariance(const PropertyConfig& config) {
  return check_property("spec_decoding_invariance", config, [&] {
    const SpecCase c = *gen_spec_case();
    const Tokens plain = serve(c, 1, nullptr, false);
    const Tokens spec = serve(c, c.width, drafter_of(c, plain), config.planted);
    for (const auto& [id, tokens] : plain) {
      if (spec.at(id) != tokens) {
        RC_FAIL(fmt::format("request {}: speculative decoding off gave [{}], on gave [{}]\n{}", id,
                            fmt::join(tokens, " "), fmt::join(spec.at(id), " "), describe(c)));
      }
    }
  });
}

PropertyConfig ci(int cases) {
  PropertyConfig c;
  c.seed = rc::detail::configuration().testParams.seed;
  c.cases = cases;
  c.record_failure = false;
  return c;
}

TEST(SpecProperties, GreedyOutputIsIdenticalWithSpeculativeDecodingOnOrOff) {
  const Outcome o = spec_decoding_invariance(ci(200));
  EXPECT_TRUE(o.passed) << o.message;
  EXPECT_GT(o.cases_run, 0);
}

TEST(SpecPlanted, InvarianceCatchesAVerifierThatTrustsARejectedDraft) {
  PropertyConfig c = ci(150);
  c.planted = true;
  const Outcome o = spec_decoding_invariance(c);
  EXPECT_FALSE(o.passed) << "the planted verifier went unnoticed in " << o.cases_run << " cases";
  if (!o.passed) std::cout << "[ planted ] spec_decoding_invariance caught it:\n" << o.message << "\n";
}

}  // namespace
}  // namespace ls::proptest
