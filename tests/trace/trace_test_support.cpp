#include "tests/trace/trace_test_support.h"

#include <algorithm>
#include <deque>

namespace ls::trace::testing {

namespace {

struct Request {
  RequestId id = 0;
  int32_t pool_row = 0;
  std::vector<int32_t> prompt;
  int32_t prefilled = 0;
  int32_t to_generate = 0;
  int32_t generated = 0;
};

constexpr int32_t kChunkTokens = 8;

}  // namespace

RecordedRun record_workload(const std::filesystem::path& path, int32_t requests_count,
                            RecorderOptions options, ExecutorConfig config) {
  ls::testing::Harness h(config);
  const TraceHeader header = header_for(config, {.capture_logits = true});
  auto recorder = Recorder::open(path, header, options);
  RecordedRun run;
  std::deque<RequestId> waiting;
  for (int32_t i = 0; i < requests_count; ++i) waiting.push_back(static_cast<RequestId>(100 + i));
  std::vector<Request> active;
  std::vector<int32_t> free_rows;
  for (int32_t r = config.max_batch_rows; r >= 1; --r) free_rows.push_back(r);
  int64_t step = 0;
  auto event = [&](EventKind kind, RequestId id, std::string detail) {
    TraceEvent e{.kind = kind, .request_id = id, .step = step, .detail = std::move(detail)};
    run.events.push_back(e);
    recorder->record_event(std::move(e));
  };
  while (!waiting.empty() || !active.empty()) {
    // Admit at most two new requests per step, while pool rows are free.
    for (int admitted = 0; admitted < 2 && !waiting.empty() && !free_rows.empty(); ++admitted) {
      const RequestId id = waiting.front();
      waiting.pop_front();
      Request q{.id = id, .pool_row = free_rows.back()};
      free_rows.pop_back();
      q.prompt = ls::testing::prompt_for(id, 3 + static_cast<int32_t>(id % 10));
      q.to_generate = 2 + static_cast<int32_t>(id % 5);
      active.push_back(q);
      event(EventKind::kArrive, id, "");
    }
    ForwardOp op;
    std::vector<Request*> decode;
    for (Request& q : active) {
      const int32_t prompt_length = static_cast<int32_t>(q.prompt.size());
      if (q.prefilled == prompt_length) {
        decode.push_back(&q);
        continue;
      }
      const int32_t chunk = std::min(kChunkTokens, prompt_length - q.prefilled);
      OpRow row = ls::testing::prefill_row(q.id, q.pool_row, q.prefilled, chunk, prompt_length);
      if (q.prefilled == 0) {
        row.refresh = {0, pages_of_pool_row(config, q.pool_row)};
        row.sampling = q.id % 3 == 0 ? SamplingParams{}
                                      : SamplingParams{.temperature = 0.8f, .top_k = 20,
                                                       .top_p = 0.9f, .seed = q.id * 11};
      }
      op.rows.push_back(row);
      op.prefill_token_ids.insert(op.prefill_token_ids.end(), q.prompt.begin() + q.prefilled,
                                  q.prompt.begin() + q.prefilled + chunk);
    }
    for (Request* q : decode) op.rows.push_back(ls::testing::decode_row(q->id, q->pool_row));

    recorder->record_input(step, op);
    StepResult result = h.executor.step(op);
    std::vector<int32_t> pool_rows;
    for (const OpRow& row : op.rows) pool_rows.push_back(row.pool_row);
    StateSnapshot snapshot = h.backend.read_state(pool_rows);
    recorder->record_output(step, result, snapshot);
    run.inputs.push_back(StepInputRecord{step, op});
    result.logits.clear();
    run.results.push_back(result);
    run.snapshots.push_back(snapshot);

    for (size_t i = 0; i < op.rows.size(); ++i) {
      Request& q = *std::find_if(active.begin(), active.end(),
                                 [&](const Request& a) { return a.id == op.rows[i].request_id; });
      if (op.rows[i].kind == RowKind::kPrefill) {
        q.prefilled += op.rows[i].input_length;
        if (q.prefilled == static_cast<int32_t>(q.prompt.size())) q.generated = 1;
      } else {
        q.generated += result.accepted_lengths[i];
      }
    }
    ++step;
    for (auto it = active.begin(); it != active.end();) {
      if (it->generated >= it->to_generate) {
        event(EventKind::kFinish, it->id, "length");
        free_rows.push_back(it->pool_row);
        it = active.erase(it);
      } else {
        ++it;
      }
    }
  }
  recorder->close();
  return run;
}

}  // namespace ls::trace::testing
