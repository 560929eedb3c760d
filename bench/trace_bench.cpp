// Trace recorder and reader costs (issue 3): the recorder's cost on the executor's thread per
// step, the writer's throughput, the reader's verification rate, and the reader's peak RSS on a
// large trace. Run: build/bench/lockstep_bench_trace
//
// Records are realistic decode steps of the `llama-8b` shape's limits (V = 128256): each row
// carries its request id, pool row and W = 1 input; one row in 16 refreshes one page; outputs
// carry tokens, accepted lengths, flags, vcl and future-input digests (no logits: production
// runs do not copy logits to the host).
#include "trace/reader.h"
#include "trace/recorder.h"

#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

using namespace ls;
using namespace ls::trace;

constexpr int32_t kBatchMax = 64;

TraceHeader bench_header() {
  TraceHeader h;
  h.build_id = "bench";
  h.model = model_config_named("llama-8b");
  h.weights = WeightSource{.kind = WeightSource::Kind::kSeed, .seed = 1};
  h.executor.max_batch_rows = kBatchMax;
  h.executor.context_length = 8192;
  h.executor.page_size = 16;
  h.executor.pages_count = 1 << 16;
  h.executor.prefill_chunk_tokens = 8192;
  h.backend = "cuda";
  h.determinism_mode = "batch-invariant";
  return h;
}

ForwardOp decode_op(int32_t batch, int64_t step) {
  ForwardOp op;
  for (int32_t r = 0; r < batch; ++r) {
    OpRow row{.kind = RowKind::kDecode, .request_id = static_cast<RequestId>(1000 + r),
              .pool_row = r + 1, .input_length = 1};
    if ((step + r) % 16 == 0) row.refresh = {static_cast<int32_t>(step % 400), {1 + r * 100 + static_cast<int32_t>(step % 97)}};
    op.rows.push_back(row);
  }
  return op;
}

StepResult decode_result(int32_t batch, int64_t step) {
  StepResult r;
  r.mode = batch > 0 ? ForwardMode::kDecode : ForwardMode::kIdle;
  r.verify_width = 1;
  for (int32_t i = 0; i < batch; ++i) {
    r.tokens.push_back(static_cast<int32_t>((step * 7919 + i * 104729) % 128256));
    r.accepted_lengths.push_back(1);
    r.nan_flags.push_back(0);
    r.oov_flags.push_back(0);
  }
  return r;
}

StateSnapshot decode_state(int32_t batch, int64_t step) {
  StateSnapshot s;
  for (int32_t i = 0; i < batch; ++i) {
    s.pool_rows.push_back(i + 1);
    s.valid_cache_length.push_back(static_cast<int32_t>(100 + step % 4000));
    s.future_inputs.push_back(static_cast<int32_t>((step * 31 + i) % 128256));
  }
  return s;
}

std::filesystem::path temp_trace(const char* name) {
  return std::filesystem::temp_directory_path() /
         (std::string("lockstep_bench_") + std::to_string(::getpid()) + "_" + name + ".bin");
}

// Writes `steps` decode steps at `batch`; returns the file's size.
uint64_t write_trace(const std::filesystem::path& path, int32_t batch, int64_t steps) {
  auto recorder = Recorder::open(path, bench_header(), {.fsync_on_close = false});
  const ForwardOp op = decode_op(batch, 0);
  const StepResult result = decode_result(batch, 0);
  const StateSnapshot state = decode_state(batch, 0);
  for (int64_t step = 0; step < steps; ++step) {
    recorder->record_input(step, op);
    recorder->record_output(step, result, state);
  }
  recorder->close();
  return recorder->stats().bytes_written;
}

// The caller's cost: copying the op, result and state into the queue. CPU time is this thread's
// (a wait for queue space sleeps and is counted separately).
void BM_RecorderCallerPerStep(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  const auto path = temp_trace("caller");
  std::vector<ForwardOp> ops;
  std::vector<StepResult> results;
  std::vector<StateSnapshot> states;
  for (int64_t s = 0; s < 64; ++s) {
    ops.push_back(decode_op(batch, s));
    results.push_back(decode_result(batch, s));
    states.push_back(decode_state(batch, s));
  }
  auto recorder = Recorder::open(path, bench_header(), {.fsync_on_close = false});
  int64_t step = 0;
  for (auto _ : state) {
    const size_t k = static_cast<size_t>(step % 64);
    recorder->record_input(step, ops[k]);
    recorder->record_output(step, results[k], states[k]);
    ++step;
  }
  recorder->close();
  const RecorderStats stats = recorder->stats();
  state.counters["waits"] = static_cast<double>(stats.waits);
  state.counters["wait_ms"] = static_cast<double>(stats.wait_ns) / 1e6;
  state.counters["bytes_per_step"] =
      static_cast<double>(stats.bytes_written) / static_cast<double>(std::max<int64_t>(step, 1));
  std::filesystem::remove(path);
}
BENCHMARK(BM_RecorderCallerPerStep)->Arg(1)->Arg(64)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK(BM_RecorderCallerPerStep)->Name("BM_RecorderCallerPerStep_ThreadCpu")->Arg(1)->Arg(64);

// End to end: open, record `steps` steps, close (footer, no fsync). Records and bytes per second.
void BM_WriterThroughput(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  constexpr int64_t kSteps = 20000;
  const auto path = temp_trace("writer");
  uint64_t bytes = 0;
  for (auto _ : state) bytes = write_trace(path, batch, kSteps);
  state.SetItemsProcessed(state.iterations() * kSteps * 2);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  std::filesystem::remove(path);
}
BENCHMARK(BM_WriterThroughput)->Arg(1)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();

// Read and check every record (index checks and validate_forward_op), no re-execution.
void BM_ReaderVerify(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  const bool full = state.range(1) != 0;
  const int64_t steps = batch == 1 ? 200000 : 20000;
  const auto path = temp_trace("verify");
  write_trace(path, batch, steps);
  int64_t records = 0;
  for (auto _ : state) {
    const TraceSummary summary = verify_trace(path, {.validate_ops = full});
    records += summary.step_inputs_count + summary.step_outputs_count;
    benchmark::DoNotOptimize(summary.complete_steps);
  }
  state.counters["step_records_per_s"] =
      benchmark::Counter(static_cast<double>(records), benchmark::Counter::kIsRate);
  state.counters["steps_per_s"] =
      benchmark::Counter(static_cast<double>(records) / 2, benchmark::Counter::kIsRate);
  std::filesystem::remove(path);
}
BENCHMARK(BM_ReaderVerify)
    ->ArgsProduct({{1, 8, 64}, {0, 1}})
    ->ArgNames({"batch", "validate_ops"})
    ->Unit(benchmark::kMillisecond);

int64_t status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::string(field).size()));
  }
  return -1;
}

// Peak RSS growth while reading a trace of ~200 MB (40,000 steps) or ~1 GiB (200,000 steps): with
// pages released behind the cursor it stays flat as the trace grows. The trace is written by a child process so the
// writer's memory does not count; the peak (VmHWM) is reset first through /proc/self/clear_refs.
void BM_ReaderPeakRss(benchmark::State& state) {
  const uint64_t release_window = static_cast<uint64_t>(state.range(0)) << 20;
  const auto path = temp_trace("rss");
  const pid_t child = ::fork();
  if (child == 0) {
    write_trace(path, kBatchMax, static_cast<int32_t>(state.range(1)));
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  const uint64_t file_bytes = std::filesystem::file_size(path);
  for (auto _ : state) {
    std::ofstream("/proc/self/clear_refs") << "5";
    rusage before{};
    ::getrusage(RUSAGE_SELF, &before);
    const int64_t rss_before_kib = status_kib("VmRSS:");
    const TraceSummary summary = verify_trace(path, {.release_window_bytes = release_window});
    benchmark::DoNotOptimize(summary.complete_steps);
    rusage after{};
    ::getrusage(RUSAGE_SELF, &after);
    state.counters["trace_MiB"] = static_cast<double>(file_bytes) / (1 << 20);
    state.counters["peak_rss_growth_MiB"] =
        static_cast<double>(status_kib("VmHWM:") - rss_before_kib) / 1024;
    state.counters["ru_maxrss_growth_MiB"] =
        static_cast<double>(after.ru_maxrss - before.ru_maxrss) / 1024;
  }
  std::filesystem::remove(path);
}
BENCHMARK(BM_ReaderPeakRss)
    ->Args({16, 40000})
    ->Args({16, 200000})
    ->Args({1 << 20, 40000})
    ->ArgNames({"release_window_MiB", "steps"})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
