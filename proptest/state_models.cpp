#include "proptest/state_models.h"

#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/page_allocator.h"
#include "core/scheduler.h"
#include "proptest/generators.h"

#include <rapidcheck/state.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>

namespace ls::proptest {

namespace {

// ---------------------------------------------------------------- page allocator + prefix cache

constexpr int32_t kAllocPages = 12;
constexpr int32_t kAllocPageSize = 2;

struct AllocShadow {
  std::set<int32_t> free;                                  // neither held nor cached
  std::map<int32_t, int32_t> refs;                         // held page → references
  std::map<int32_t, std::vector<int32_t>> cached;          // page → token prefix through it
};

struct AllocSut {
  AllocSut(bool planted_bug) : real(kAllocPages, kAllocPageSize), planted(planted_bug) {
    for (int32_t p = 1; p < kAllocPages; ++p) shadow.free.insert(p);
  }
  PageAllocator real;
  AllocShadow shadow;
  bool planted;

  int32_t unheld_cached() const {
    int32_t n = 0;
    for (const auto& [page, tokens] : shadow.cached) n += shadow.refs.contains(page) ? 0 : 1;
    return n;
  }
  std::optional<int32_t> cached_page_of(const std::vector<int32_t>& prefix) const {
    for (const auto& [page, tokens] : shadow.cached) if (tokens == prefix) return page;
    return std::nullopt;
  }
  int32_t nth_held(int32_t k) const {
    auto it = shadow.refs.begin();
    std::advance(it, static_cast<size_t>(k) % shadow.refs.size());
    return it->first;
  }
  void check_counts() const {
    RC_ASSERT(real.check() == std::string());
    RC_ASSERT(real.free_count() == static_cast<int32_t>(shadow.free.size()));
    RC_ASSERT(real.held_count() == static_cast<int32_t>(shadow.refs.size()));
    RC_ASSERT(real.cached_count() == unheld_cached());
  }
};

struct AllocModel {
  int32_t commands = 0;
};

using AllocCommand = rc::state::Command<AllocModel, AllocSut>;

struct Allocate : AllocCommand {
  int32_t count = *rc::gen::inRange(1, 5);
  void apply(AllocModel& m) const override { ++m.commands; }
  void run(const AllocModel&, AllocSut& s) const override {
    const int32_t available = static_cast<int32_t>(s.shadow.free.size()) + s.unheld_cached();
    RC_ASSERT(s.real.available_count() == available);
    if (count > available) return;  // an over-allocation is a caller bug (LS_ASSERT), not generated
    std::vector<int32_t> pages = s.real.allocate(count);
    if (s.planted && pages.size() >= 2) pages[1] = pages[0];  // the planted bug: a page twice
    const int32_t from_free = std::min(count, static_cast<int32_t>(s.shadow.free.size()));
    int32_t evicted = 0;
    std::set<int32_t> seen;
    for (int32_t page : pages) {
      RC_ASSERT(seen.insert(page).second);  // distinct
      RC_ASSERT(page >= 1 && page < kAllocPages);
      RC_ASSERT(!s.shadow.refs.contains(page));  // nobody holds it
      if (s.shadow.free.erase(page) == 0) {
        RC_ASSERT(s.shadow.cached.erase(page) == 1u);  // else it was an unheld cached page: evicted
        ++evicted;
      }
      s.shadow.refs[page] = 1;
    }
    RC_ASSERT(evicted == count - from_free);  // the cache is evicted only once the free list is dry
    s.check_counts();
  }
  void show(std::ostream& os) const override { os << "allocate " << count; }
};

struct Release : AllocCommand {
  int32_t k = *rc::gen::inRange(0, 16);
  void apply(AllocModel& m) const override { ++m.commands; }
  void run(const AllocModel&, AllocSut& s) const override {
    if (s.shadow.refs.empty()) return;
    const int32_t page = s.nth_held(k);
    s.real.release(page);
    if (--s.shadow.refs[page] == 0) {
      s.shadow.refs.erase(page);
      if (!s.shadow.cached.contains(page)) s.shadow.free.insert(page);
    }
    s.check_counts();
  }
  void show(std::ostream& os) const override { os << "release held#" << k; }
};

struct Retain : AllocCommand {
  int32_t k = *rc::gen::inRange(0, 16);
  void apply(AllocModel& m) const override { ++m.commands; }
  void run(const AllocModel&, AllocSut& s) const override {
    if (s.shadow.cached.empty()) return;
    auto it = s.shadow.cached.begin();
    std::advance(it, static_cast<size_t>(k) % s.shadow.cached.size());
    s.real.retain(it->first);
    ++s.shadow.refs[it->first];
    s.check_counts();
  }
  void show(std::ostream& os) const override { os << "retain cached#" << k; }
};

// Tokens over a 2-letter alphabet so that prefixes collide often.
std::vector<int32_t> gen_tokens(int32_t pages) {
  return *rc::gen::container<std::vector<int32_t>>(static_cast<size_t>(pages * kAllocPageSize),
                                                   rc::gen::inRange(0, 2));
}

struct Insert : AllocCommand {
  int32_t first = *rc::gen::inRange(0, 16);
  int32_t full = *rc::gen::inRange(1, 4);
  std::vector<int32_t> tokens = gen_tokens(3);
  void apply(AllocModel& m) const override { ++m.commands; }
  void run(const AllocModel&, AllocSut& s) const override {
    if (s.shadow.refs.empty()) return;
    std::vector<int32_t> pages;
    for (int32_t i = 0; i < full && i < static_cast<int32_t>(s.shadow.refs.size()); ++i) {
      pages.push_back(s.nth_held(first + i));
    }
    const int32_t n = static_cast<int32_t>(pages.size());
    s.real.insert(tokens, pages, n);
    for (int32_t i = 0; i < n; ++i) {
      std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + (i + 1) * kAllocPageSize);
      if (!s.cached_page_of(prefix) && !s.shadow.cached.contains(pages[i])) {
        s.shadow.cached[pages[i]] = std::move(prefix);
      }
    }
    s.check_counts();
  }
  void show(std::ostream& os) const override { os << "insert " << full << " pages from held#" << first; }
};

struct Match : AllocCommand {
  std::vector<int32_t> tokens = gen_tokens(*rc::gen::inRange(0, 4));
  int32_t pages_max = *rc::gen::inRange(0, 4);
  void apply(AllocModel& m) const override { ++m.commands; }
  void run(const AllocModel&, AllocSut& s) const override {
    const std::vector<int32_t> got = s.real.match(tokens, pages_max);
    std::vector<int32_t> expected;
    for (int32_t i = 0; i < pages_max && (i + 1) * kAllocPageSize <= static_cast<int32_t>(tokens.size()); ++i) {
      const auto page = s.cached_page_of({tokens.begin(), tokens.begin() + (i + 1) * kAllocPageSize});
      if (!page) break;
      expected.push_back(*page);
    }
    RC_ASSERT(got == expected);
  }
  void show(std::ostream& os) const override { os << "match " << tokens.size() << " tokens"; }
};

struct Touch : AllocCommand {
  int32_t k = *rc::gen::inRange(0, 16);
  void apply(AllocModel& m) const override { ++m.commands; }
  void run(const AllocModel&, AllocSut& s) const override {
    if (s.shadow.refs.empty()) return;
    const int32_t page = s.nth_held(k);
    s.real.touch(std::span<const int32_t>(&page, 1));
    s.check_counts();
  }
  void show(std::ostream& os) const override { os << "touch held#" << k; }
};

// ---------------------------------------------------------------- scheduler vs a queue model

struct SchedShadow {
  std::set<RequestId> submitted;
  std::map<RequestId, int32_t> ended;     // finish/abort events seen per request
  std::set<RequestId> retracted;          // retracted, not yet recovered or ended
  int64_t retractions = 0;
};

struct SchedSut {
  SchedSut(const SchedulerConfig& c, bool planted_bug)
      : config(c),
        scheduler(c),
        backend(tiny_weights(), executor_config_for(c), nullptr, /*stub_model=*/true),
        executor(executor_config_for(c), tiny_vocab(), backend),
        planted(planted_bug) {}

  SchedulerConfig config;
  Scheduler scheduler;
  CpuBackend backend;
  Executor executor;
  SchedShadow shadow;
  std::optional<std::pair<ForwardOp, StepResult>> in_flight;
  RequestId next_id = 1;
  bool planted;
  int64_t steps = 0;

  void events(const std::vector<SchedulerEvent>& list) {
    for (const SchedulerEvent& e : list) {
      using K = SchedulerEvent::Kind;
      if (e.kind == K::kFinish || e.kind == K::kAbort) {
        if (planted && e.request_id % 3 == 2) continue;  // the planted bug: a finish is lost
        RC_ASSERT(shadow.submitted.contains(e.request_id));
        RC_ASSERT(++shadow.ended[e.request_id] == 1);  // exactly once
        shadow.retracted.erase(e.request_id);
      } else if (e.kind == K::kRetract) {
        RC_ASSERT(shadow.retracted.insert(e.request_id).second);
        ++shadow.retractions;
      } else if (e.kind == K::kRecover) {
        RC_ASSERT(shadow.retracted.erase(e.request_id) == 1u);  // it was retracted
      }
    }
  }

  void check_op(const ForwardOp& op) {
    const int32_t w = config.verify_width;
    RC_ASSERT(op.rows_count() <= config.max_batch_rows);
    std::set<int32_t> rows;
    std::set<RequestId> ids;
    int32_t prefill_tokens = 0;
    for (const OpRow& row : op.rows) {
      RC_ASSERT(rows.insert(row.pool_row).second);  // pool rows unique
      RC_ASSERT(ids.insert(row.request_id).second);
      RC_ASSERT(shadow.submitted.contains(row.request_id));
      RC_ASSERT(!shadow.ended.contains(row.request_id) || planted);  // never after its end
      if (row.kind == RowKind::kPrefill) prefill_tokens += row.input_length;
    }
    // Decode rows cost W tokens each; the whole step stays within the budget.
    RC_ASSERT(prefill_tokens + op.decode_rows_count() * w <= config.prefill_chunk_tokens);
  }

  void step() {
    StepPlanOut plan = scheduler.plan();
    events(plan.events);
    check_op(plan.op);
    if (in_flight) {
      events(scheduler.apply_result(in_flight->first, in_flight->second));
      in_flight.reset();
    }
    for (const CacheOp& c : plan.cache_ops) executor.copy_pages(c);
    if (!plan.op.rows.empty()) {
      StepResult result = executor.step(plan.op);
      if (config.overlap) {
        in_flight.emplace(std::move(plan.op), std::move(result));
      } else {
        events(scheduler.apply_result(plan.op, result));
      }
    }
    ++steps;
    const std::string accounting = scheduler.check_accounting();
    RC_ASSERT(accounting == std::string());
  }

  void drain() {
    for (int32_t i = 0; i < 3000 && !scheduler.done(); ++i) step();
    RC_ASSERT(scheduler.done());
    for (RequestId id : shadow.submitted) {
      if (!shadow.ended.contains(id)) RC_FAIL(fmt::format("request {} was lost: no finish or abort event", id));
      RC_ASSERT(scheduler.outcomes().contains(id));
    }
    RC_ASSERT(shadow.retracted.empty());  // every retracted request came back
    RC_ASSERT(scheduler.held_pages_count() == 0);
  }
};

struct SchedModel {
  int32_t submitted = 0;
};

using SchedCommand = rc::state::Command<SchedModel, SchedSut>;

struct Submit : SchedCommand {
  RequestScript request = *gen_request(0, false);
  void apply(SchedModel& m) const override { ++m.submitted; }
  void run(const SchedModel&, SchedSut& s) const override {
    const RequestId id = s.next_id++;
    s.scheduler.submit(RequestSpec{.id = id, .prompt = request.prompt,
                                   .max_new_tokens = request.max_new_tokens, .sampling = request.sampling},
                       tiny_vocab());
    s.shadow.submitted.insert(id);
  }
  void show(std::ostream& os) const override { os << "submit prompt " << request.prompt.size(); }
};

// Invalid submissions: duplicate id, empty prompt, prompt >= L, id = V, max_new_tokens = 0, a bad
// sampling parameter. Each must throw ls::Error and change nothing.
struct SubmitInvalid : SchedCommand {
  int32_t kind = *rc::gen::inRange(0, 6);
  void apply(SchedModel&) const override {}
  void run(const SchedModel&, SchedSut& s) const override {
    RequestSpec spec{.id = s.next_id + 1000, .prompt = {1, 2, 3}, .max_new_tokens = 2};
    switch (kind) {
      case 0:
        if (s.shadow.submitted.empty()) return;
        spec.id = *s.shadow.submitted.begin();
        break;
      case 1: spec.prompt.clear(); break;
      case 2: spec.prompt.assign(static_cast<size_t>(s.config.context_length), 3); break;
      case 3: spec.prompt.push_back(tiny_vocab()); break;
      case 4: spec.max_new_tokens = 0; break;
      default: spec.sampling.top_p = 0.0f; break;
    }
    const auto before = s.scheduler.state_of(spec.id);
    bool rejected = false;
    try {
      s.scheduler.submit(spec, tiny_vocab());
    } catch (const Error&) {
      rejected = true;
    }
    RC_ASSERT(rejected);
    RC_ASSERT(s.scheduler.state_of(spec.id) == before);
  }
  void show(std::ostream& os) const override { os << "invalid submit kind " << kind; }
};

struct Abort : SchedCommand {
  int32_t k = *rc::gen::inRange(0, 16);
  void apply(SchedModel&) const override {}
  void run(const SchedModel&, SchedSut& s) const override {
    std::vector<RequestId> live;
    for (RequestId id : s.shadow.submitted) {
      if (s.scheduler.state_of(id) != RequestState::kFinished) live.push_back(id);
    }
    if (live.empty()) return;
    s.scheduler.abort(live[static_cast<size_t>(k) % live.size()]);
  }
  void show(std::ostream& os) const override { os << "abort live#" << k; }
};

// Aborting an unknown id, or one that has finished, is rejected with ls::Error.
struct AbortInvalid : SchedCommand {
  bool finished = *rc::gen::arbitrary<bool>();
  void apply(SchedModel&) const override {}
  void run(const SchedModel&, SchedSut& s) const override {
    RequestId id = 1'000'000;
    if (finished) {
      for (RequestId r : s.shadow.submitted) {
        if (s.scheduler.state_of(r) == RequestState::kFinished) id = r;
      }
    }
    bool rejected = false;
    try {
      s.scheduler.abort(id);
    } catch (const Error&) {
      rejected = true;
    }
    RC_ASSERT(rejected);
  }
  void show(std::ostream& os) const override { os << (finished ? "abort a finished request" : "abort unknown id"); }
};

struct Step : SchedCommand {
  int32_t count = *rc::gen::inRange(1, 6);
  void apply(SchedModel&) const override {}
  void run(const SchedModel&, SchedSut& s) const override {
    for (int32_t i = 0; i < count; ++i) s.step();
  }
  void show(std::ostream& os) const override { os << "step x" << count; }
};

rc::Gen<SchedulerConfig> gen_scheduler_config() {
  return rc::gen::exec([] {
    SchedulerConfig c;
    c.max_batch_rows = *rc::gen::inRange(2, 7);
    c.prefill_chunk_tokens = *rc::gen::inRange(8, 65);
    c.page_size = 4;
    c.context_length = 48;
    c.verify_width = *rc::gen::inRange(1, 3);
    c.pages_count = *rc::gen::inRange(16, 48);
    c.host_pages_count = *rc::gen::inRange(0, 2) == 1 ? 24 : 0;
    c.mixed_batches = *rc::gen::inRange(0, 4) != 3;
    c.prefix_cache = *rc::gen::inRange(0, 4) != 3;
    c.overlap = *rc::gen::arbitrary<bool>();
    return c;
  });
}

}  // namespace

Outcome prop_allocator_model(const PropertyConfig& config) {
  return check_property(config.planted ? "allocator_model/planted_double_handout" : "allocator_model",
                        config, [&config] {
    AllocSut sut(config.planted);
    const auto commands = *rc::state::gen::commands(
        AllocModel{}, rc::state::gen::execOneOfWithArgs<Allocate, Release, Retain, Insert, Match, Touch>());
    rc::state::runAll(commands, AllocModel{}, sut);
  });
}

Outcome prop_scheduler_model(const PropertyConfig& config) {
  return check_property(config.planted ? "scheduler_model/planted_lost_finish" : "scheduler_model",
                        config, [&config] {
    const SchedulerConfig c = *gen_scheduler_config();
    SchedSut sut(c, config.planted);
    const auto commands = *rc::state::gen::commands(
        SchedModel{}, rc::state::gen::execOneOfWithArgs<Submit, Submit, SubmitInvalid, Abort, AbortInvalid, Step, Step>());
    rc::state::runAll(commands, SchedModel{}, sut);
    sut.drain();
    RC_TAG(sut.shadow.retractions > 0 ? "retraction" : "no retraction");
  });
}

}  // namespace ls::proptest
