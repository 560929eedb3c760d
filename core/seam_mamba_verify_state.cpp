// See core/seams.h.
#include "core/seams.h"

#include "core/ops/verify_state.h"

namespace ls::seams {

int32_t mamba_verify_state_token(int32_t tokens_in, int32_t /*verify_width*/) {
  return ops::mamba_verify_state_token(tokens_in);
}

}  // namespace ls::seams
