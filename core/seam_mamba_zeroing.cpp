// See core/seams.h.
#include "core/forward_op.h"
#include "core/seams.h"

namespace ls::seams {

bool mamba_zeroes_working_slot(const OpRow& row) {
  return row.kind == RowKind::kPrefill && row.mamba_cow_src < 0 && row.prefix_length == 0;
}

}  // namespace ls::seams
