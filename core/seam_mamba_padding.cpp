// See core/seams.h.
#include "core/seams.h"

namespace ls::seams {

int32_t mamba_padding_slot() { return -1; }

}  // namespace ls::seams
