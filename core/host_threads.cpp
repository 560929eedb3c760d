#include "core/host_threads.h"

#include <sched.h>

#include <algorithm>

namespace ls {

int32_t host_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int count = sched_getaffinity(0, sizeof(set), &set) == 0
                        ? CPU_COUNT(&set)
                        : static_cast<int>(std::thread::hardware_concurrency());
  return std::max(count, 1);
}

}  // namespace ls
