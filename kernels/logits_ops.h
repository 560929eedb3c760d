// The one pass over a step's logits on the CUDA backend: rule 5's NaN guard, the greedy argmax,
// the log-probability sums and — when the step is recorded — the trace's logits digests and top-k
// pairs (issue 12: computed where the logits are, in the pass that reads them anyway, by the
// definition of core/logits_digest.h; trace/trace.capnp "DIGESTS" is the contract). The CPU
// reference is CpuBackend's guard (core/cpu_backend.cpp) and core/logits_digest.cpp; tests/gpu/
// compares them bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ls::kernels {

// Each row is cut into fixed segments of kLogitsSegment ids, one a warp (a batch-1 row of 128 Ki
// logits is 251 warps; every warp is independent, no block barrier); a second kernel, a block a
// row (two when recording), combines a row's segment partials in a fixed order, so every result
// depends only on the row.
constexpr int32_t kLogitsSegment = 512;

struct LogitsPassArgs {
  float* logits = nullptr;  // [rows, vocab] fp32: NaN → −1e30, ±inf → ±1e30 in place
  int32_t rows = 0;
  int32_t vocab = 0;
  void* workspace = nullptr;  // logits_pass_workspace_bytes(rows or more, vocab) bytes
  int32_t* nan_flags = nullptr;  // [rows] 1 where the row held a NaN
  int32_t* argmax = nullptr;     // [rows] of the sanitised row, the lowest id on ties
  // Both or neither: max_r and Σ exp(x − max_r), for log-probabilities.
  float* row_max = nullptr;
  float* row_sum = nullptr;
  // Recording, when `digests` is set: digests [rows] and top [rows, kTopLogitsCountMax, 2]
  // (id, logit bits; best first) of the sanitised rows, `top_k` pairs a row.
  uint64_t* digests = nullptr;
  int32_t* top = nullptr;
  int32_t top_k = 0;
};

size_t logits_pass_workspace_bytes(int32_t rows, int32_t vocab);
// Two launches: the pass, then one combine kernel (the guard's and, recording, the record's).
cudaError_t launch_logits_pass(const LogitsPassArgs& args, cudaStream_t stream);

}  // namespace ls::kernels
