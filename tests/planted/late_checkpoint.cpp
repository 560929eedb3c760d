// Planted bug (core/seams.h): a checkpoint is booked one page late, so the prefix cache attaches
// the state at boundary b to the page ending at b + P and a hit there resumes a page short.
// tests/prefix_hit_planted_test.cpp expects the property of tests/prefix_hit_properties.h to catch
// it.
#include "core/seams.h"

namespace ls::seams {

int32_t checkpoint_boundary(int32_t kv_end, int32_t page_size) { return kv_end + page_size; }

}  // namespace ls::seams
