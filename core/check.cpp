#include "core/check.h"

#include <cstdio>
#include <cstdlib>

namespace ls {

void assert_failed(const char* file, int line, const char* condition, const std::string& detail) {
  std::fprintf(stderr, "lockstep: assertion failed at %s:%d: %s%s%s\n", file, line, condition,
               detail.empty() ? "" : " — ", detail.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace ls
