// See core/seams.h.
#include "core/scheduler_impl.h"
#include "core/seams.h"

namespace ls::seams {

std::span<const int32_t> pages_released_at_end(const SchedRequest& request) {
  return request.pages;
}

}  // namespace ls::seams
