// Stateful model-based properties (rc::state, STYLE.md §16): the page allocator and prefix cache
// against a plain model (a set of free pages, reference counts, a map of cached prefixes), and the
// scheduler against a queue model (every submitted request finishes or is aborted exactly once,
// pool rows unique, token budget and row cap respected, retracted requests come back). Commands
// name pages and requests by index into the live model, so every shrunk sequence stays valid;
// invalid commands are generated too and must be rejected with ls::Error.
#pragma once

#include "proptest/runner.h"

namespace ls::proptest {

// `config.planted`: the allocator hands out one page twice.
Outcome prop_allocator_model(const PropertyConfig& config);
// `config.planted`: a finish event is swallowed between the scheduler and the client.
Outcome prop_scheduler_model(const PropertyConfig& config);

}  // namespace ls::proptest
