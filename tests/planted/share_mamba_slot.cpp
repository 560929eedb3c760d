// Planted bug (core/seams.h): pool rows 2k+1 and 2k+2 share working slot k, so two live requests
// on neighbouring rows would advance one recurrent state. tests/mamba_slot_planted_test.cpp
// expects the property of tests/mamba_slot_properties.h to catch it.
#include "core/scheduler_impl.h"
#include "core/seams.h"

namespace ls::seams {

int32_t mamba_working_slot(const SchedRequest& request) { return (request.pool_row - 1) / 2; }

}  // namespace ls::seams
