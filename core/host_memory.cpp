#include "core/host_memory.h"

#include "core/check.h"

#include <unistd.h>

namespace ls {

uint64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return uint64_t{1} << 40;  // unknown: do not refuse
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

void require_host_memory(uint64_t bytes, std::string_view what) {
  const uint64_t limit = host_memory_bytes() / 4 * 3;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  LS_REQUIRE(bytes <= limit, "{} needs {:.1f} GiB of host memory; this machine allows {:.1f} GiB",
             what, static_cast<double>(bytes) / kGiB, static_cast<double>(limit) / kGiB);
}

ZeroedFloats::ZeroedFloats(size_t count)
    : data_(count == 0 ? nullptr : static_cast<float*>(std::calloc(count, sizeof(float)))),
      count_(count) {
  LS_REQUIRE(count == 0 || data_ != nullptr, "could not allocate {} zeroed floats ({} bytes)",
             count, count * sizeof(float));
}

}  // namespace ls
