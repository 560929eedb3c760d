// Plain C++ mirrors of the trace records (trace/trace.capnp is the format's contract). Nothing
// here depends on Cap'n Proto: the recorder encodes these on its writer thread and the reader
// decodes into them, so callers never see capnp types.
#pragma once

#include "core/config.h"
#include "core/executor.h"
#include "core/forward_op.h"
#include "core/model/weights.h"
#include "core/step_result.h"
#include "core/step_stats.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ls::trace {

// 2: checksummed framing (a preamble, then frames of a header and a message; trace.capnp).
// A reader of version 2 refuses version 1 files, naming the version.
inline constexpr uint32_t kFormatVersion = 5;
// The oldest version this build still reads (trace.capnp: version 3 files read with every
// CacheOp.stateSlot −1, versions 3 and 4 with a weights digest of the stream form).
inline constexpr uint32_t kOldestReadableFormatVersion = 3;
inline constexpr int32_t kTopLogitsCountMax = ls::kTopLogitsCountMax;
// At most this many steps may be open (input written, output not yet) at once: an overlapped
// executor records input k+1 before output k.
inline constexpr int32_t kOpenStepsMax = 2;
// One message (one record) may not exceed this; the reader rejects larger ones as corrupt.
inline constexpr uint64_t kRecordBytesMax = uint64_t{64} << 20;

struct MachineInfo {
  std::string cpu_name;
  std::string gpu_name;
  int32_t sm_count = 0;
  std::string driver_version;
  std::string cuda_version;
  std::string cublas_version;

  bool operator==(const MachineInfo&) const = default;
};

struct TraceHeader {
  uint32_t format_version = kFormatVersion;
  std::string build_id;
  ModelConfig model;
  WeightSource weights;
  uint64_t weights_digest = 0;
  WeightsDigestForm weights_digest_form = kWeightsDigestFormRecorded;  // how weights_digest hashes
  ExecutorConfig executor;
  ExecutorOptions executor_options;
  int32_t top_logits_count = 0;  // (id, logit) pairs per logits row, 0..kTopLogitsCountMax
  std::string backend;
  std::string determinism_mode;
  MachineInfo machine;
  int32_t index_stride = 16;  // the footer indexes step input records 0, stride, 2·stride, …
  std::string drafter = "none";  // the backend's drafter (core/drafter.h); replay rebuilds it
  // Empty: lockstep's executor produced the outputs. Else the engine whose own executor did (a
  // trace written by a foreign executor through lockstep.TraceWriter): its outputs carry no state
  // digests and its weights digest may be 0 (not recorded), and exact replay refuses it.
  std::string foreign_executor;
  // The clocks of the stepStats records ("" when the trace has none): stepClock "steady" or
  // "simulated"; deviceTimer "cuda-events", "host-clock" or "simulated".
  std::string step_clock;
  std::string device_timer;
  // The tensor-parallel degree the outputs were computed at (core/tensor_parallel.h); 1 in traces
  // from before the field.
  int32_t tp_degree = 1;
  // Every output carries the state digest of each row's working slot (a model with Mamba layers;
  // trace.capnp DIGESTS). false in traces from before the field.
  bool mamba_state_digests = false;
  // Every output carries per-layer activation digests (trace.capnp ACTIVATIONS). false in traces
  // from before the field.
  bool activation_digests = false;
  // The collectives' library at TP > 1 on CUDA (kernels/nccl_pinning.h): NCCL's version and the
  // pinned NCCL_ALGO and NCCL_PROTO. 0 and "" when no library ran them (TP 1, the CPU reference)
  // and in traces from before the fields.
  int32_t nccl_version = 0;
  std::string nccl_algo;
  std::string nccl_proto;

  bool is_foreign() const { return !foreign_executor.empty(); }
};

struct StepInputRecord {
  int64_t step = 0;
  ForwardOp op;
  std::vector<CacheOp> cache_ops;  // ran just before the step, in order
  StepFaults faults;               // planted into the step; a replay plants the same

  bool operator==(const StepInputRecord&) const = default;
};

using TopLogit = ls::TopLogit;  // core/logits_digest.h: the backends compute them

struct StepOutputRecord {
  int64_t step = 0;
  // Everything the step returned except `logits`, which a trace never stores (always empty).
  StepResult result;
  std::vector<uint64_t> logits_digests;        // [logits rows] or empty (logits not captured)
  std::vector<int32_t> valid_cache_lengths;    // [bs] vcl of each op row's pool row after the step
  std::vector<uint64_t> future_input_digests;  // [bs] XXH3-64 of the row's W future input ids
  int32_t top_logits_count = 0;                // k: pairs per logits row in top_logits
  std::vector<TopLogit> top_logits;            // [logits rows, k] or empty
  std::vector<int32_t> drafts;                 // [bs, W] when W > 1, else empty: the future
                                               // input ids of each op row's pool row after the step
  std::vector<uint64_t> mamba_state_digests;   // [bs] when the header records them, else empty:
                                               // each op row's working slot after the step
  std::vector<uint64_t> activation_digests;    // when the header records them, else empty:
                                               // core/activations.h activation_digests

  bool operator==(const StepOutputRecord&) const = default;
};

enum class EventKind : uint8_t {
  kArrive = 0,
  kFinish = 1,
  kAbort = 2,
  kRetract = 3,
  kRecover = 4,
  kFaultFired = 5,
  kStepRejected = 6,  // written by the recorder when a recorded op fails validation
};
std::string_view to_string(EventKind kind);

struct TraceEvent {
  EventKind kind = EventKind::kArrive;
  RequestId request_id = 0;
  int64_t step = 0;    // the step at which it happened
  std::string detail;  // finish reason, fault site, rejection message
  std::optional<int32_t> hist_token_length;

  bool operator==(const TraceEvent&) const = default;
};

struct TraceFooter {
  int64_t steps_count = 0;    // step input records
  int64_t outputs_count = 0;  // step output records
  int64_t events_count = 0;
  int32_t index_stride = 0;
  std::vector<uint64_t> step_offsets;  // byte offset of step input record j·index_stride

  bool operator==(const TraceFooter&) const = default;
};

// What TraceReader::next yields after the header.
// When and how a step ran, after its output (core/step_stats.h; not replayed: timing is not
// execution).
using StepStatsRecord = StepStats;

using TraceRecord =
    std::variant<StepInputRecord, StepOutputRecord, TraceEvent, TraceFooter, StepStatsRecord>;

}  // namespace ls::trace
