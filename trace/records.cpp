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

bool same_sampling(const std::optional<SamplingParams>& a, const std::optional<SamplingParams>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a) return true;
  return a->temperature == b->temperature && a->top_k == b->top_k && a->top_p == b->top_p &&
         a->min_p == b->min_p && a->seed == b->seed;
}

bool same_row(const OpRow& a, const OpRow& b) {
  return a.kind == b.kind && a.request_id == b.request_id && a.pool_row == b.pool_row &&
         a.input_length == b.input_length && a.prefix_length == b.prefix_length &&
         a.prompt_length == b.prompt_length && a.decode_override == b.decode_override &&
         a.hist_token_length == b.hist_token_length && a.refresh == b.refresh &&
         same_sampling(a.sampling, b.sampling);
}

bool same_op(const ForwardOp& a, const ForwardOp& b) {
  if (a.rows.size() != b.rows.size() || a.prefill_token_ids != b.prefill_token_ids) return false;
  for (size_t i = 0; i < a.rows.size(); ++i) {
    if (!same_row(a.rows[i], b.rows[i])) return false;
  }
  return true;
}

}  // namespace ls::trace
