// Planted bug (core/seams.h mamba_verify_state_token): the state one verify token late — after
// the first rejected draft rather than the last accepted token (capped at the row's last token).
#include "core/seams.h"

#include <algorithm>

namespace ls::seams {

int32_t mamba_verify_state_token(int32_t tokens_in, int32_t verify_width) {
  return std::min(tokens_in, verify_width - 1);
}

}  // namespace ls::seams
