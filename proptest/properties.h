// The executor properties (invariants, contract, metamorphic determinism, traces). Each returns an
// Outcome; a failing one has recorded its shrunk case as a trace (runner.h). `config.bug` runs the
// same property against a broken backend (broken_backend.h) — the companion tests expect failure.
#pragma once

#include "proptest/runner.h"

namespace ls::proptest {

Outcome prop_executor_invariants(const PropertyConfig& config);
// `config.planted`: a front that runs the valid op instead of rejecting the broken one.
Outcome prop_op_contract(const PropertyConfig& config);
Outcome prop_co_batch_invariance(const PropertyConfig& config);
Outcome prop_chunking_invariance(const PropertyConfig& config);
Outcome prop_pool_row_invariance(const PropertyConfig& config);
Outcome prop_retraction_invariance(const PropertyConfig& config);
Outcome prop_overlap_invariance(const PropertyConfig& config);
// `config.planted`: a run-ahead backend whose steps in flight share one result slot.
Outcome prop_run_ahead_invariance(const PropertyConfig& config);
Outcome prop_record_replay_identical(const PropertyConfig& config);
// `config.planted`: compares a seed's fingerprint with the next seed's (must differ, so equal fails).
Outcome prop_sim_fingerprint(const PropertyConfig& config);
Outcome prop_trace_check_clean(const PropertyConfig& config);
Outcome prop_trace_mutation(const PropertyConfig& config);
// Simulator runs with faults (NaN, OOV, page pressure, aborts, overlap) recorded: check_trace
// finds nothing. The companion for check_trace itself is trace_check_clean's.
Outcome prop_sim_trace_check_clean(const PropertyConfig& config);

}  // namespace ls::proptest
