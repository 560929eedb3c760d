#include "kernels/dynamic_library.h"

#include "core/check.h"

#include <dlfcn.h>
#include <fmt/format.h>

namespace ls::kernels {

void* open_library(const std::string& soname, const std::string& needed_by) {
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = dlerror();
    throw Error(fmt::format("{}, which could not be loaded: {}", needed_by,
                            reason != nullptr ? reason : "unknown reason"));
  }
  return handle;
}

void* resolve_function(void* handle, const char* name, const std::string& library) {
  void* const function = dlsym(handle, name);
  if (function == nullptr) {
    const char* reason = dlerror();
    throw Error(fmt::format("{} has no function {}: {}", library, name,
                            reason != nullptr ? reason : "not found"));
  }
  return function;
}

}  // namespace ls::kernels
