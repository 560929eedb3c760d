// Links an installed lockstep: runs two steps on the executor over the CPU reference (built by
// name, as the command builds its backends), records them with the recorder, reads the trace back
// with the reader and prints what it counted.
#include <backends/backend_factory.h>
#include <core/executor.h>
#include <core/model/weights.h>
#include <trace/reader.h>
#include <trace/recorder.h>
#include <trace/trace_observer.h>

#include <cstdio>
#include <filesystem>
#include <variant>

int main(int argc, char** argv) {
  const std::filesystem::path path = argc > 1 ? argv[1] : "consumer.trace";
  const ls::ModelWeights weights = ls::weights_from_seed(ls::model_config_named("tiny"), 0);
  const ls::ExecutorConfig config{{.max_batch_rows = 2, .context_length = 64, .pages_count = 16}};
  const std::unique_ptr<ls::Backend> made = ls::make_backend({.name = "cpu"}, weights, config);
  ls::Backend& backend = *made;
  // The options the trace header names: the step computes what the records carry.
  ls::Executor executor(config, weights.config.vocab_size, backend,
                        ls::trace::recording_executor_options());
  auto recorder = ls::trace::Recorder::open(
      path, ls::trace::make_trace_header(weights, {}, config, backend.name(),
                                         ls::machine_info_for(backend.name())));
  ls::ForwardOp prefill;
  prefill.rows.push_back(ls::OpRow{.kind = ls::RowKind::kPrefill, .request_id = 1, .pool_row = 1,
                                   .input_length = 3, .prompt_length = 3,
                                   .refresh = {0, {1}}, .sampling = ls::SamplingParams{}});
  prefill.prefill_token_ids = {5, 6, 7};
  ls::ForwardOp decode;
  decode.rows.push_back(ls::OpRow{.kind = ls::RowKind::kDecode, .request_id = 1, .pool_row = 1,
                                  .input_length = 1});
  int64_t step = 0;
  for (const ls::ForwardOp* op : {&prefill, &decode}) {
    recorder->record_input(step, *op);
    const ls::StepResult result = executor.step(*op);
    recorder->record_output(step, result, backend.read_state(std::vector<int32_t>{1}));
    std::printf("step %lld: token %d\n", static_cast<long long>(step), result.tokens[0]);
    ++step;
  }
  recorder->close();
  ls::trace::TraceReader reader = ls::trace::TraceReader::open(path);
  ls::trace::TraceRecord record;
  int outputs = 0;
  while (reader.next(record)) outputs += std::holds_alternative<ls::trace::StepOutputRecord>(record);
  std::printf("read back %d step outputs from %s\n", outputs, path.c_str());
  return outputs == 2 ? 0 : 1;
}
