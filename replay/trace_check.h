// `lockstep check TRACE`: runs every executor invariant over a recorded trace WITHOUT re-executing
// it — from the step inputs, outputs and events alone — and names the first step, row, request and
// field that breaks one. Works on production, simulator and property-test traces.
//
// Invariants checked, per step (rows in op order):
//   forward_op          the op passes ls::validate_forward_op (pool rows unique per step, ...)
//   sampling            a request new to its pool row carries sampling parameters
//   pool_row            a request is never on two pool rows at once (until retracted/finished)
//   mamba_slot          (a model with Mamba layers) a working state slot changes requests only
//                       after the request holding it retracted, finished or aborted
//   decode_without_kv   a decode row on a pool row that holds no KV of its request is a recovery
//                       (hist_token_length != -1)
//   refresh             refresh slices start >= 0 with pages in [1, pages_count)
//   output_shape        output counts match the op
//   tokens              output ids in [0, V)
//   accepted_length     prefill rows accept 1; decode rows accept a in [0, W]
//   context_clamp       a decode row accepts at most max(0, L - vcl_before)
//   valid_cache_length  vcl <= L, and grows by exactly what the step committed: prefill rows end at
//                       prefix + input; decode rows at (hist_token_length, or the previous vcl) + a
//   nan_flags           flagged rows are exactly the rows the recorded faults poisoned with NaN
//                       (not checked for a foreign executor's trace: it plants no faults)
//   greedy_token        a greedy row emits the recorded top-1 id of each logits row it emitted from
//   (and, in the reader: top-k pairs in rank order with finite logits, ids in [0, V))
#pragma once

#include "core/forward_op.h"
#include "trace/reader.h"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace ls::replay {

struct TraceViolation {
  int64_t step = 0;
  int32_t row = -1;             // op row, -1 when the step as a whole breaks it
  RequestId request_id = 0;
  std::string invariant;        // e.g. "valid_cache_length" (the names above)
  std::string field;            // the record field that shows it, e.g. "valid_cache_lengths[1]"
  std::string detail;           // expected vs found

  // "step 12 row 1 (request 7): valid_cache_length (valid_cache_lengths[1]): 9, expected 13 = ..."
  std::string describe() const;
};

struct CheckReport {
  trace::TraceHeader header;
  int64_t steps_checked = 0;   // steps whose input and output were both checked
  int64_t rows_checked = 0;
  std::optional<TraceViolation> violation;  // the first one; checking stops there
  std::optional<trace::TraceTruncation> truncation;

  bool ok() const { return !violation; }
};

// Throws ls::Error when the file is not a readable trace (bad header, a record the reader refuses,
// an output with no open input), trace::TraceCorruption when a byte of it does not check out:
// unusable input (`lockstep check` exits 2), never reported as a violation (exit 1).
CheckReport check_trace(const std::filesystem::path& path);
// The same over an opened reader (tests: TraceReader::from_bytes; open it with validate_ops off,
// as the checker validates every op itself).
CheckReport check_trace(trace::TraceReader reader);

}  // namespace ls::replay
