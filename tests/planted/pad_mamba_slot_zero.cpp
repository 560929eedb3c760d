// PLANTED BUG (test-only; see core/seams.h): padded tokens carry working slot 0, a real slot, as
// the KV slot rule pads with the dummy slot 0. The padding property of tests/hybrid_properties.h
// must fail against it.
#include "core/seams.h"

namespace ls::seams {

int32_t mamba_padding_slot() { return 0; }

}  // namespace ls::seams
