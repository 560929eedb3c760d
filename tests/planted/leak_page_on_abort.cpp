// Planted bug (lockstep_scheduler_planted, in place of core/seam_release_pages.cpp): an aborted
// request forgets to release its last page. tests/sim_planted_bug_test.cpp must see the simulator's
// checkers catch the leak.
#include "core/scheduler_impl.h"
#include "core/seams.h"

namespace ls::seams {

std::span<const int32_t> pages_released_at_end(const SchedRequest& request) {
  const std::span<const int32_t> pages(request.pages);
  if (request.finish_reason == FinishReason::kAbort && !pages.empty()) {
    return pages.first(pages.size() - 1);
  }
  return pages;
}

}  // namespace ls::seams
