// KV page copies the scheduler asks for around retraction: swap a request's pages out to the host
// pool, or back into fresh device pages on recovery.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace ls {

enum class CacheOpKind : uint8_t { kSwapOut = 0, kSwapIn = 1 };

struct CacheOp {
  CacheOpKind kind = CacheOpKind::kSwapOut;
  std::vector<int32_t> device_pages;  // [n] in [1, pages_count)
  std::vector<int32_t> host_pages;    // [n] in [0, host_pages_count), pairwise with device_pages

  bool operator==(const CacheOp&) const = default;
};

inline std::string_view to_string(CacheOpKind kind) {
  return kind == CacheOpKind::kSwapOut ? "swap_out" : "swap_in";
}

}  // namespace ls
