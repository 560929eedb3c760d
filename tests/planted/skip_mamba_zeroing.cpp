// PLANTED BUG (test-only; see core/seams.h): a request's first chunk never zeroes its working
// slot, so a reused slot, or a recomputed request's own slot after a retraction, starts from the
// state it was left in. The chunking/retraction property of tests/hybrid_properties.h must fail
// against it.
#include "core/forward_op.h"
#include "core/seams.h"

namespace ls::seams {

bool mamba_zeroes_working_slot(const OpRow&) { return false; }

}  // namespace ls::seams
