// The fixed workload the tensor-parallel tests compare TP N against TP 1 on (the CPU reference's
// and the CUDA backend's): three requests (prompts of 5, 9 and 17 tokens) prefilled in one step,
// the last in two chunks, then decoded together for kTpWorkloadDecodeSteps steps; every step's
// logits and tokens kept. `sampled`: the second request samples (temperature 0.8, top-k 40).
#pragma once

#include "core/backend.h"
#include "core/config.h"
#include "core/executor.h"
#include "tests/test_support.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace ls::testing {

struct TpWorkloadRun {
  std::vector<std::vector<float>> logits;    // per step: [logits rows, V]
  std::vector<std::vector<int32_t>> tokens;  // per step: the output tokens
};

inline constexpr int32_t kTpWorkloadDecodeSteps = 12;

inline TpWorkloadRun run_tp_workload(Backend& backend, const ExecutorConfig& config, int32_t vocab,
                                     bool sampled) {
  Executor executor(config, vocab, backend, {.capture_logits = true});
  const int32_t lengths[] = {5, 9, 17};
  TpWorkloadRun run;
  auto keep = [&](const StepResult& r) {
    run.logits.push_back(r.logits);
    run.tokens.push_back(r.tokens);
  };
  for (int32_t chunk = 0; chunk < 2; ++chunk) {
    ForwardOp op;
    for (int32_t i = 0; i < 3; ++i) {
      const RequestId id = 10 + i;
      const int32_t half = lengths[i] / 2;
      const int32_t prefix = i == 2 && chunk == 1 ? half : 0;
      const int32_t take = i == 2 ? (chunk == 0 ? half : lengths[i] - half) : lengths[i];
      if (i != 2 && chunk == 1) continue;
      OpRow row = prefill_row(id, 1 + i, prefix, take, lengths[i]);
      if (prefix == 0) {
        row.refresh = {0, pages_from(1 + 20 * i, 10)};
        row.sampling = SamplingParams{};
        if (sampled && i == 1) row.sampling->temperature = 0.8f, row.sampling->top_k = 40;
      }
      op.rows.push_back(row);
      const std::vector<int32_t> prompt = prompt_for(id, lengths[i], vocab);
      op.prefill_token_ids.insert(op.prefill_token_ids.end(), prompt.begin() + prefix,
                                  prompt.begin() + prefix + take);
    }
    keep(executor.step(op));
  }
  for (int32_t step = 0; step < kTpWorkloadDecodeSteps; ++step) {
    ForwardOp op;
    for (int32_t i = 0; i < 3; ++i) op.rows.push_back(decode_row(10 + i, 1 + i));
    keep(executor.step(op));
  }
  return run;
}

// Every step's tokens and every logit's bits equal.
inline bool bit_identical(const TpWorkloadRun& a, const TpWorkloadRun& b) {
  if (a.logits.size() != b.logits.size() || a.tokens != b.tokens) return false;
  for (size_t s = 0; s < a.logits.size(); ++s) {
    if (a.logits[s].size() != b.logits[s].size() ||
        std::memcmp(a.logits[s].data(), b.logits[s].data(), a.logits[s].size() * sizeof(float))) {
      return false;
    }
  }
  return true;
}

// TP N against TP 1 over the logits of every step whose inputs agree: up to and including the
// first step with a token that differs (after it the two runs decode other tokens, and their
// logits are not comparable).
struct TpAgreement {
  double relative_max = 0;       // over rows: max |Δ| / max |logit|
  int64_t tokens_equal = 0;
  int64_t tokens_count = 0;
  int64_t logits_differing = 0;  // values whose bits differ
  double norm = 0;
  size_t steps_compared = 0;
};

inline TpAgreement compare_tp_runs(const TpWorkloadRun& tp1, const TpWorkloadRun& tpn,
                                   int32_t vocab) {
  TpAgreement a;
  for (size_t s = 0; s < tp1.logits.size() && s < tpn.logits.size(); ++s) {
    if (s > 0 && tp1.tokens[s - 1] != tpn.tokens[s - 1]) break;
    ++a.steps_compared;
    const std::vector<float>& x = tp1.logits[s];
    const std::vector<float>& y = tpn.logits[s];
    for (size_t row = 0; (row + 1) * vocab <= x.size() && (row + 1) * vocab <= y.size(); ++row) {
      double scale = 0, delta = 0;
      for (size_t v = row * vocab; v < (row + 1) * vocab; ++v) {
        scale = std::max(scale, std::fabs(double{x[v]}));
        delta = std::max(delta, std::fabs(double{x[v]} - double{y[v]}));
        a.logits_differing += std::memcmp(&x[v], &y[v], sizeof(float)) != 0;
        a.norm += double{y[v]} * y[v];
      }
      a.relative_max = std::max(a.relative_max, scale > 0 ? delta / scale : delta);
    }
    for (size_t i = 0; i < tp1.tokens[s].size() && i < tpn.tokens[s].size(); ++i) {
      a.tokens_equal += tp1.tokens[s][i] == tpn.tokens[s][i];
      ++a.tokens_count;
    }
  }
  return a;
}

}  // namespace ls::testing
