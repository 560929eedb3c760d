#include "sim/workload.h"

#include "sim/random.h"

#include <algorithm>

namespace ls::sim {

namespace {

constexpr uint32_t kWorkloadStream = 2;

bool has_fault(const SimParams& p, FaultSite site) {
  return std::find(p.faults.begin(), p.faults.end(), site) != p.faults.end();
}

std::vector<int32_t> random_tokens(SimRandom& r, int32_t count, int32_t vocab_size) {
  std::vector<int32_t> ids(static_cast<size_t>(count));
  for (int32_t& id : ids) id = static_cast<int32_t>(r.range(0, vocab_size - 1));
  return ids;
}

SamplingParams random_sampling(SimRandom& r, const SimParams& p) {
  SamplingParams s;
  if (r.chance(p.greedy_fraction)) return s;
  s.temperature = static_cast<float>(0.3 + 1.2 * r.uniform());
  if (r.chance(0.5)) s.top_k = static_cast<int32_t>(r.range(1, 64));
  if (r.chance(0.5)) s.top_p = static_cast<float>(0.5 + 0.5 * r.uniform());
  if (r.chance(0.3)) s.min_p = static_cast<float>(0.2 * r.uniform());
  if (r.chance(0.5)) s.seed = r.next_u64();
  return s;
}

}  // namespace

std::vector<SimRequest> generate_workload(const SimParams& p, int32_t vocab_size) {
  SimRandom r(p.seed, kWorkloadStream);
  std::vector<std::vector<int32_t>> prefixes;
  for (int32_t i = 0; i < p.shared_prefixes_count; ++i) {
    prefixes.push_back(random_tokens(r, p.shared_prefix_tokens, vocab_size));
  }
  std::vector<SimRequest> requests;
  // Gaps between arrivals are uniform integers with mean 1 / arrivals_per_step: integer arithmetic
  // only, so the world is identical on every platform.
  const int64_t gap_max = static_cast<int64_t>(2.0 / p.arrivals_per_step + 0.5);
  int64_t clock = 0;
  for (int32_t i = 0; i < p.requests_count; ++i) {
    SimRequest q;
    q.spec.id = static_cast<RequestId>(1000 + i);
    clock += r.range(0, gap_max);
    q.arrival_step = clock;
    const int32_t length = static_cast<int32_t>(r.range(p.prompt_tokens_min, p.prompt_tokens_max));
    if (r.chance(p.shared_prefix_fraction)) {
      q.spec.prompt = prefixes[static_cast<size_t>(r.range(0, p.shared_prefixes_count - 1))];
    }
    const std::vector<int32_t> tail = random_tokens(r, std::max(1, length), vocab_size);
    q.spec.prompt.insert(q.spec.prompt.end(), tail.begin(), tail.end());
    q.spec.prompt.resize(std::min<size_t>(q.spec.prompt.size(), p.context_length - 1));
    q.spec.max_new_tokens = static_cast<int32_t>(r.range(p.max_new_tokens_min, p.max_new_tokens_max));
    q.spec.sampling = random_sampling(r, p);
    if (r.chance(0.2)) q.spec.stop_ids = random_tokens(r, 2, vocab_size);
    if (r.chance(p.client_abort_fraction)) q.abort_step = q.arrival_step + r.range(0, 30);
    requests.push_back(std::move(q));
  }
  if (has_fault(p, FaultSite::kContextLimit) && !requests.empty()) {
    // One request whose prompt nearly fills L and asks for more than fits: it must finish by
    // the context limit, never past it.
    SimRequest& q = requests[static_cast<size_t>(r.range(0, p.requests_count - 1))];
    q.spec.prompt = random_tokens(r, p.context_length - static_cast<int32_t>(r.range(1, 4)), vocab_size);
    q.spec.max_new_tokens = p.context_length;
    q.spec.stop_ids.clear();
  }
  std::stable_sort(requests.begin(), requests.end(), [](const SimRequest& a, const SimRequest& b) {
    return a.arrival_step < b.arrival_step;
  });
  return requests;
}

}  // namespace ls::sim
