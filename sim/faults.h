// The faults a simulated world plants at their sites (SimParams::faults), each step-level site
// firing with probability fault_rate from a stream of the seed of its own, so that a fault's
// firing does not move the workload's draws. The world calls it from the serving loop's hooks
// (core/serving_loop.h): before a plan, before a step is submitted, after a step ran.
#pragma once

#include "core/executor.h"
#include "core/scheduler.h"
#include "sim/clients.h"
#include "sim/params.h"
#include "sim/random.h"

#include <functional>
#include <string>

namespace ls::sim {

// A fault as it fired: its site, the request it hit, what it did.
using FaultFired = std::function<void(FaultSite site, RequestId request, const std::string& detail)>;

class FaultInjector {
 public:
  FaultInjector(const SimParams& params, Executor& executor, const Scheduler& scheduler,
                Clients& clients, FaultFired fired);

  // Before a plan — abort-mid-prefill: a client aborts a request while it prefills.
  void before_plan();
  // Between the step's cache ops and its submit — nan-logits and oov-sample, planted on one of
  // its rows each (the executor takes them with the step's input, so a trace records them).
  void before_step(const ForwardOp& op);
  // After the step ran and, with overlap, was held back — late-result: a client aborts one of
  // its decoding requests, so that the result arrives late and must be ignored.
  void after_step(const ForwardOp& op);

 private:
  bool enabled(FaultSite site) const;
  // Draws only for an enabled site, so that turning one off leaves the other sites' draws alone.
  bool fires(FaultSite site) { return enabled(site) && random_.chance(params_.fault_rate); }

  const SimParams& params_;
  Executor& executor_;
  const Scheduler& scheduler_;
  Clients& clients_;
  FaultFired fired_;
  SimRandom random_;
};

}  // namespace ls::sim
