#include "proptest/generators.h"

#include <algorithm>

namespace ls::proptest {

std::vector<int32_t> make_prompt(RequestId id, int32_t prefix_kind, int32_t length, int32_t salt) {
  const int64_t v = tiny_vocab();
  std::vector<int32_t> ids;
  const int32_t prefix = prefix_kind == 1 ? 8 : prefix_kind == 2 ? 12 : 0;
  for (int32_t t = 0; t < length; ++t) {
    const int64_t x = t < prefix ? (t * 37 + prefix_kind * 101 + 11)
                                 : static_cast<int64_t>(id) * 97 + salt * 13 + t * 31 + 5;
    ids.push_back(static_cast<int32_t>(x % v));
  }
  return ids;
}

namespace {

SamplingParams sampling_of(int32_t kind, int32_t salt) {
  SamplingParams s;
  if (kind == 0) return s;  // greedy
  s.temperature = kind == 1 ? 0.8f : 1.0f;
  s.top_k = kind == 2 ? 20 : -1;
  s.top_p = kind == 1 ? 0.9f : 1.0f;
  if (salt % 2 == 1) s.seed = static_cast<uint64_t>(salt) * 7919u;
  return s;
}

}  // namespace

rc::Gen<RequestScript> gen_request(RequestId id, bool greedy_only) {
  return rc::gen::exec([id, greedy_only] {
    RequestScript r;
    r.id = id;
    const int32_t prefix_kind = *rc::gen::inRange(0, 3);
    const bool long_request = *rc::gen::inRange(0, 4) == 3;  // runs into the context limit
    const int32_t length = long_request ? *rc::gen::inRange(36, 41) : *rc::gen::inRange(1, 29);
    const int32_t salt = *rc::gen::inRange(0, 1000);
    r.prompt = make_prompt(id, prefix_kind, length, salt);
    r.sampling = sampling_of(greedy_only ? 0 : *rc::gen::inRange(0, 3), salt);
    r.max_new_tokens = long_request ? 14 : *rc::gen::inRange(1, 9);
    return r;
  });
}

rc::Gen<StepChoice> gen_choice(const ScriptShape& shape) {
  return rc::gen::exec([shape] {
    StepChoice c;
    c.admit = 2 - *rc::gen::inRange(0, 3);
    c.chunk_tokens = shape.vary_chunks ? 64 - *rc::gen::inRange(0, 64) : 64;
    c.mixed = shape.vary_mixed ? *rc::gen::inRange(0, 4) != 3 : true;
    if (shape.retract) {
      const int32_t x = *rc::gen::inRange(0, 24);
      c.retract = x >= 16 ? x - 16 : -1;
      c.recompute = *rc::gen::inRange(0, 2) == 1;
      c.recover = 1 - *rc::gen::inRange(0, 2);
    }
    c.pool_row_pick = shape.vary_rows ? *rc::gen::inRange(0, 8) : 0;
    if (shape.faults) {
      const int32_t p = *rc::gen::inRange(0, 48);
      c.poison = p >= 40 ? p - 40 : -1;
      const int32_t rate = std::max(shape.invalid_rate, 1);
      const int32_t x = *rc::gen::inRange(0, kMutationKinds * rate);
      c.invalid = x >= kMutationKinds * (rate - 1) ? x - kMutationKinds * (rate - 1) : -1;
    }
    return c;
  });
}

rc::Gen<Script> gen_script(const ScriptShape& shape) {
  return rc::gen::exec([shape] {
    Script s;
    const int32_t rows = *rc::gen::inRange(shape.rows_min, shape.rows_max + 1);
    const int32_t w = *rc::gen::elementOf(shape.widths);
    s.config = script_config(rows, w);
    const int32_t n = *rc::gen::inRange(shape.requests_min, shape.requests_max + 1);
    for (int32_t i = 0; i < n; ++i) {
      s.requests.push_back(*gen_request(static_cast<RequestId>(i + 1), shape.greedy_only));
    }
    const int32_t steps = *rc::gen::inRange(0, shape.steps_max + 1);
    s.steps = *rc::gen::container<std::vector<StepChoice>>(static_cast<size_t>(steps), gen_choice(shape));
    s.prefix_cache = *rc::gen::inRange(0, 4) != 3;
    return s;
  });
}

rc::Gen<std::vector<RequestSpec>> gen_request_specs(int32_t count_max, bool greedy_only) {
  return rc::gen::exec([count_max, greedy_only] {
    std::vector<RequestSpec> specs;
    const int32_t n = *rc::gen::inRange(1, count_max + 1);
    for (int32_t i = 0; i < n; ++i) {
      const RequestScript r = *gen_request(static_cast<RequestId>(i + 1), greedy_only);
      specs.push_back(RequestSpec{.id = r.id, .prompt = r.prompt, .max_new_tokens = r.max_new_tokens,
                                  .sampling = r.sampling});
    }
    return specs;
  });
}

}  // namespace ls::proptest
