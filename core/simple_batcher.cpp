#include "core/simple_batcher.h"

#include "core/check.h"

#include <algorithm>
#include <deque>

namespace ls {

namespace {

struct Running {
  size_t request_index = 0;
  int32_t pool_row = 0;
  std::vector<int32_t> pages;
  int32_t prefilled = 0;  // prompt tokens already sent
  int32_t max_new_tokens = 0;
  bool refreshed = false;
  bool sampling_sent = false;
};

class SimpleBatcher {
 public:
  SimpleBatcher(Executor& executor, const std::vector<GenerationRequest>& requests)
      : executor_(executor), requests_(requests), outputs_(requests.size()) {
    const ExecutorConfig& c = executor.config();
    for (int32_t row = c.max_batch_rows; row >= 1; --row) free_rows_.push_back(row);
    for (int32_t page = c.pages_count - 1; page >= 1; --page) free_pages_.push_back(page);
    std::vector<size_t> order(requests.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return requests[a].id < requests[b].id; });
    waiting_.assign(order.begin(), order.end());
    for (size_t i = 0; i < requests.size(); ++i) {
      outputs_[i].id = requests[i].id;
      outputs_[i].prompt_tokens = static_cast<int32_t>(requests[i].prompt.size());
    }
  }

  std::vector<GenerationOutput> run(const std::function<void(const BatcherProgress&)>& on_step) {
    BatcherProgress progress{.requests_count = static_cast<int64_t>(requests_.size())};
    while (!waiting_.empty() || !running_.empty()) {
      admit();
      LS_REQUIRE(!running_.empty(),
                 "generate: request {} needs more pages than the executor has ({} pages of {} "
                 "tokens)",
                 requests_[waiting_.front()].id, executor_.config().pages_count,
                 executor_.config().page_size);
      const ForwardOp op = build_op();
      const StepResult result = executor_.step(op);
      progress.tokens_generated += apply(op, result);
      ++progress.steps_count;
      progress.finished_count = finished_count_;
      if (on_step) on_step(progress);
    }
    return std::move(outputs_);
  }

 private:
  int32_t pages_needed(const GenerationRequest& r, int32_t max_new) const {
    const int32_t tokens = static_cast<int32_t>(r.prompt.size()) + max_new;
    const int32_t p = executor_.config().page_size;
    return (tokens + p - 1) / p;
  }

  void admit() {
    const ExecutorConfig& c = executor_.config();
    while (!waiting_.empty() && !free_rows_.empty()) {
      const GenerationRequest& r = requests_[waiting_.front()];
      const int32_t room = c.context_length - static_cast<int32_t>(r.prompt.size());
      const int32_t max_new = std::min(r.max_new_tokens, room);
      const int32_t needed = pages_needed(r, max_new);
      if (needed > static_cast<int32_t>(free_pages_.size())) return;
      Running run{.request_index = waiting_.front(), .pool_row = free_rows_.back(),
                  .max_new_tokens = max_new};
      free_rows_.pop_back();
      run.pages.assign(free_pages_.end() - needed, free_pages_.end());
      free_pages_.resize(free_pages_.size() - needed);
      running_.push_back(std::move(run));
      waiting_.pop_front();
    }
  }

  ForwardOp build_op() {
    ForwardOp op;
    int32_t budget = executor_.config().prefill_chunk_tokens;
    // Prefill rows first, in admission order, each taking what is left of the token budget.
    for (Running& run : running_) {
      const GenerationRequest& r = requests_[run.request_index];
      const int32_t left = static_cast<int32_t>(r.prompt.size()) - run.prefilled;
      if (left == 0 || budget == 0) continue;
      const int32_t chunk = std::min(left, budget);
      OpRow row = common_row(run, RowKind::kPrefill);
      row.input_length = chunk;
      row.prefix_length = run.prefilled;
      row.prompt_length = static_cast<int32_t>(r.prompt.size());
      op.prefill_token_ids.insert(op.prefill_token_ids.end(), r.prompt.begin() + run.prefilled,
                                  r.prompt.begin() + run.prefilled + chunk);
      budget -= chunk;
      op.rows.push_back(std::move(row));
    }
    for (Running& run : running_) {
      const GenerationRequest& r = requests_[run.request_index];
      if (run.prefilled < static_cast<int32_t>(r.prompt.size())) continue;
      OpRow row = common_row(run, RowKind::kDecode);
      row.input_length = executor_.config().verify_width;
      op.rows.push_back(std::move(row));
    }
    return op;
  }

  OpRow common_row(Running& run, RowKind kind) {
    const GenerationRequest& r = requests_[run.request_index];
    OpRow row{.kind = kind, .request_id = r.id, .pool_row = run.pool_row};
    if (!run.refreshed) row.refresh = {0, run.pages};
    if (!run.sampling_sent) row.sampling = r.sampling;
    run.refreshed = run.sampling_sent = true;
    return row;
  }

  // Appends each row's tokens, finishes what is done, frees its pool row and pages.
  int64_t apply(const ForwardOp& op, const StepResult& result) {
    int64_t emitted = 0;
    const int32_t rows_count = op.rows_count();
    for (int32_t i = 0; i < rows_count; ++i) {
      Running& run = *std::find_if(running_.begin(), running_.end(), [&](const Running& x) {
        return requests_[x.request_index].id == op.rows[i].request_id;
      });
      const GenerationRequest& r = requests_[run.request_index];
      if (op.rows[i].kind == RowKind::kPrefill) {
        run.prefilled += op.rows[i].input_length;
        if (run.prefilled < static_cast<int32_t>(r.prompt.size())) continue;  // mid-prompt chunk
      }
      emitted += take_tokens(run, result.row_tokens(i), result.nan_flags[i] != 0);
    }
    std::erase_if(running_, [&](const Running& run) { return finished(run); });
    return emitted;
  }

  int64_t take_tokens(Running& run, const std::vector<int32_t>& tokens, bool nan_flagged) {
    GenerationOutput& out = outputs_[run.request_index];
    const GenerationRequest& r = requests_[run.request_index];
    int64_t taken = 0;
    for (int32_t token : tokens) {
      out.tokens.push_back(token);
      ++taken;
      if (nan_flagged) return finish(run, FinishReason::kNumericalError), taken;
      if (std::find(r.stop_ids.begin(), r.stop_ids.end(), token) != r.stop_ids.end()) {
        return finish(run, FinishReason::kStop), taken;
      }
      if (static_cast<int32_t>(out.tokens.size()) >= run.max_new_tokens) {
        const bool at_context = run.max_new_tokens < r.max_new_tokens;
        return finish(run, at_context ? FinishReason::kContext : FinishReason::kLength), taken;
      }
    }
    return taken;
  }

  void finish(Running& run, FinishReason reason) {
    outputs_[run.request_index].finish_reason = reason;
    free_rows_.push_back(run.pool_row);
    free_pages_.insert(free_pages_.end(), run.pages.begin(), run.pages.end());
    run.pages.clear();
    run.pool_row = 0;
    ++finished_count_;
  }

  static bool finished(const Running& run) { return run.pool_row == 0; }

  Executor& executor_;
  const std::vector<GenerationRequest>& requests_;
  std::vector<GenerationOutput> outputs_;
  std::deque<size_t> waiting_;
  std::vector<Running> running_;
  std::vector<int32_t> free_rows_;
  std::vector<int32_t> free_pages_;
  int64_t finished_count_ = 0;
};

}  // namespace

std::vector<GenerationOutput> run_simple_batcher(
    Executor& executor, const std::vector<GenerationRequest>& requests,
    const std::function<void(const BatcherProgress&)>& on_step) {
  SimpleBatcher batcher(executor, requests);
  return batcher.run(on_step);
}

}  // namespace ls
