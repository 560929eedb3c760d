#include "trace/records.h"

namespace ls::trace {

std::string_view to_string(EventKind kind) {
  switch (kind) {
    case EventKind::kArrive: return "arrive";
    case EventKind::kFinish: return "finish";
    case EventKind::kAbort: return "abort";
    case EventKind::kRetract: return "retract";
    case EventKind::kRecover: return "recover";
    case EventKind::kFaultFired: return "fault_fired";
    case EventKind::kStepRejected: return "step_rejected";
  }
  return "?";
}

}  // namespace ls::trace
