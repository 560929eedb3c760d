// KV page copies the scheduler asks for around retraction: swap a request's pages out to the host
// pool, or back into fresh device pages on recovery. On a model with Mamba layers the request's
// recurrent state travels with its pages: out of its working slot into the host state of its
// first host page, and back into its new working slot.
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
  // −1, or (models with Mamba layers, n >= 1) the device state slot in [0, mamba_slots_count)
  // whose state is copied with the pages: swap_out from it into the host state of host_pages[0],
  // swap_in from there into it.
  int32_t state_slot = -1;

  bool operator==(const CacheOp&) const = default;
};

inline std::string_view to_string(CacheOpKind kind) {
  return kind == CacheOpKind::kSwapOut ? "swap_out" : "swap_in";
}

}  // namespace ls
