// See core/seams.h.
#include "core/scheduler_impl.h"
#include "core/seams.h"

namespace ls::seams {

int32_t mamba_working_slot(const SchedRequest& request) { return request.pool_row - 1; }

}  // namespace ls::seams
