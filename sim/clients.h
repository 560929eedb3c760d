// The clients of a simulated world: which requests are live and which the clients asked to
// abort. The workload's client aborts and the abort faults (sim/faults.h) both go through it, so
// a request is aborted at most once.
#pragma once

#include "core/scheduler.h"

#include <set>

namespace ls::sim {

class Clients {
 public:
  explicit Clients(Scheduler& scheduler) : scheduler_(scheduler) {}

  void arrived(RequestId id) { live_.insert(id); }
  // false: the request had ended already.
  bool ended(RequestId id) { return live_.erase(id) > 0; }

  const std::set<RequestId>& live() const { return live_; }  // in id order
  bool is_live(RequestId id) const { return live_.count(id) > 0; }
  bool abort_requested(RequestId id) const { return abort_requested_.count(id) > 0; }
  // A live request no client asked to abort yet.
  bool abortable(RequestId id) const { return is_live(id) && !abort_requested(id); }

  // A client abort, once per request.
  void abort(RequestId id) {
    if (!abort_requested_.insert(id).second) return;
    scheduler_.abort(id);
  }

 private:
  Scheduler& scheduler_;
  std::set<RequestId> live_;
  std::set<RequestId> abort_requested_;
};

}  // namespace ls::sim
