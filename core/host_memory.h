// A guard for allocations sized by untrusted input (a trace header, a config.json): refuse, with
// a clear error, what this machine cannot hold instead of thrashing or being killed.
#pragma once

#include <cstdint>
#include <string_view>

namespace ls {

// Physical memory of this machine, in bytes.
uint64_t host_memory_bytes();

// Throws ls::Error naming `what` when `bytes` exceeds three quarters of physical memory.
void require_host_memory(uint64_t bytes, std::string_view what);

}  // namespace ls
