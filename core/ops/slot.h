// The slot rule (seed spec §3.2 c): the KV slot of `position` in a row of the block table is
// page · P + position mod P, and 0 — the dummy slot — when the page column is past the table.
// Index is the caller's integer width (int32 on the device, int64 on the host).
#pragma once

#include "core/ops/host_device.h"

#include <cstdint>

namespace ls::ops {

// The slot of a position whose column is known to be inside the table.
template <typename Index>
LS_HOST_DEVICE LS_INLINE int64_t slot_in_table(const int32_t* table_row, int32_t page_size,
                                               Index position) {
  return int64_t{table_row[position / page_size]} * page_size + position % page_size;
}

template <typename Index>
LS_HOST_DEVICE LS_INLINE int64_t slot_for(const int32_t* table_row, Index table_width,
                                          int32_t page_size, Index position) {
  if (position / page_size >= table_width) return 0;
  return slot_in_table(table_row, page_size, position);
}

}  // namespace ls::ops
