// Planted bug (lockstep_core_clamp_planted, in place of core/seam_clamp_in_step.cpp): site 1 of
// the context clamp forgets it, so the device commits the verify's unclamped accepted length
// while the step result is still clamped. tests/spec_clamp_planted_test.cpp must catch it.
#include "core/seams.h"

namespace ls::seams {

int32_t accepted_committed_in_step(int32_t accepted, int32_t /*vcl_old*/,
                                   int32_t /*context_length*/) {
  return accepted;
}

}  // namespace ls::seams
