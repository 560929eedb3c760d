// See core/seams.h.
#include "core/ops/context_clamp.h"
#include "core/seams.h"

namespace ls::seams {

int32_t accepted_committed_in_step(int32_t accepted, int32_t vcl_old, int32_t context_length) {
  return ops::clamp_accepted_to_context(accepted, vcl_old, context_length);
}

}  // namespace ls::seams
