#include "replay/replay.h"

#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/executor.h"
#include "core/serving_loop.h"
#include "trace/digests.h"

#include <fmt/format.h>

#include <cmath>
#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <memory>

namespace ls::replay {

namespace {

// The weights a trace's header names, not yet checked against its digest, and where they came from
// (for the refusal's message).
struct NamedWeights {
  ModelWeights weights;
  std::string origin;
};

NamedWeights load_named_weights(const trace::TraceHeader& h,
                                const std::optional<std::filesystem::path>& directory_override) {
  if (h.weights.kind == WeightSource::Kind::kSeed) {
    LS_REQUIRE(!directory_override,
               "the trace's weights are random weights of shape '{}' from seed {}, not a directory: "
               "a model directory ({}) does not apply to it",
               h.model.name, h.weights.seed, directory_override->string());
    return {weights_from_seed(h.model, h.weights.seed),
            fmt::format("random weights from seed {}", h.weights.seed)};
  }
  const std::filesystem::path dir = directory_override.value_or(h.weights.directory);
  return {load_hf_directory(dir), fmt::format("weights in {}", dir.string())};
}

// A foreign executor may not know lockstep's weight digest (0: not recorded); then the weights
// the user names are taken as the ones it ran, and the replay reports their digest.
bool digest_recorded(const trace::TraceHeader& h) {
  return !(h.is_foreign() && h.weights_digest == 0);
}

void require_recorded_digest(const trace::TraceHeader& h, uint64_t digest,
                             const std::string& origin) {
  LS_REQUIRE(digest == h.weights_digest,
             "the {} have digest {:016x} but the trace was recorded with weights of digest {:016x} "
             "({} form); refusing to replay against different weights",
             origin, digest, h.weights_digest, to_string(h.weights_digest_form));
}

}  // namespace

ModelWeights weights_for(const trace::TraceHeader& h,
                         const std::optional<std::filesystem::path>& directory_override) {
  NamedWeights named = load_named_weights(h, directory_override);
  if (digest_recorded(h)) require_recorded_weights(h, named.weights, named.origin);
  return std::move(named.weights);
}

void require_recorded_weights(const trace::TraceHeader& h, const ModelWeights& weights,
                              const std::string& origin) {
  require_recorded_digest(h, weights.digest(h.weights_digest_form), origin);
}

namespace {

struct Executed {
  int64_t step = 0;
  ForwardOp op;
  trace::StepOutputRecord output;
  int32_t recorded_row = -1;  // --isolate: the request's row in the recorded op
  std::vector<int32_t> forced_rows;  // op rows whose emitted token a recorded fault replaced
};

// What teacher forcing feeds back: a request's last recorded token and its recorded KV length.
struct Recorded {
  int32_t last_token = 0;
  int32_t valid_cache_length = 0;
};

// The caller's backend (options.make_backend), or the CPU reference with the drafter the header
// names (make_drafter says clearly which ones it cannot rebuild).
std::unique_ptr<Backend> make_replay_backend(const ReplayOptions& options,
                                             const ModelWeights& weights,
                                             const trace::TraceHeader& header) {
  const int32_t tp_degree = replay_tp_degree(options, header);
  if (options.make_backend) {
    return options.make_backend(weights, header.executor, header.drafter, tp_degree);
  }
  return std::make_unique<CpuBackend>(weights, header.executor, nullptr, false,
                                      make_drafter(header.drafter), tp_degree);
}

// The replaying executor computes what the recording one did (digests, top-k, the rows' state);
// teacher forcing also captures whole logits rows, to measure |Δlogit| at the recorded top ids.
ExecutorOptions replay_executor_options(const trace::TraceHeader& h, ReplayMode mode) {
  return ExecutorOptions{.capture_logits = mode == ReplayMode::kTeacherForced,
                         .want_logprobs = h.executor_options.want_logprobs,
                         .record = true,
                         .top_logits_count = h.top_logits_count};
}

// The backend, built while the weights are digested beside it (ModelWeights::digest_in_background),
// then checked against the trace's digest (in the form its header names): nothing runs on the
// backend before the check passes, and weights that are not the recorded ones are the error named
// even where the build failed too.
std::unique_ptr<Backend> make_checked_backend(const ReplayOptions& options,
                                              const ModelWeights& weights,
                                              const std::string& origin,
                                              const trace::TraceHeader& header) {
  if (!digest_recorded(header)) return make_replay_backend(options, weights, header);
  const std::shared_future<uint64_t> digest =
      weights.digest_in_background(header.weights_digest_form);
  std::unique_ptr<Backend> backend;
  try {
    backend = make_replay_backend(options, weights, header);
  } catch (...) {
    require_recorded_digest(header, digest.get(), origin);
    throw;
  }
  require_recorded_digest(header, digest.get(), origin);
  return backend;
}

class Replayer {
 public:
  Replayer(trace::TraceReader reader, const ReplayOptions& options)
      : options_(options),
        reader_(std::move(reader)),
        owned_weights_(options.weights ? NamedWeights{.origin = "weights given"}
                                       : load_named_weights(reader_.header(),
                                                            options.weights_directory)),
        weights_(options.weights ? *options.weights : owned_weights_.weights),
        backend_(make_checked_backend(options, weights_, owned_weights_.origin, reader_.header())),
        executor_(reader_.header().executor, weights_.config.vocab_size, *backend_,
                  replay_executor_options(reader_.header(), options.mode)) {
    report_.header = reader_.header();
    report_.backend = backend_->name();
    report_.tp_degree = replay_tp_degree(options, reader_.header());
  }

  ReplayReport run() {
    trace::TraceRecord record;
    while (!report_.divergence && reader_.next(record)) {
      if (auto* in = std::get_if<trace::StepInputRecord>(&record)) {
        if (options_.until_step && in->step > *options_.until_step) {
          // A run-ahead recording writes input k+1 before output k: the last step's output may
          // still come.
          if (executed_.empty()) break;
          continue;
        }
        // A run-ahead recording writes input k+1 before output k: step k+1 runs once step k's
        // output is compared, so that teacher forcing feeds it step k's recorded tokens.
        if (!executed_.empty()) {
          deferred_ = std::move(*in);
          continue;
        }
        execute(*in);
      } else if (auto* out = std::get_if<trace::StepOutputRecord>(&record)) {
        compare(*out);
        run_deferred();
      } else if (auto* ev = std::get_if<trace::TraceEvent>(&record)) {
        if (ev->kind == trace::EventKind::kStepRejected) {
          on_recorded_rejection(*ev);
          run_deferred();
        }
      }
      if (options_.on_progress && reader_.records_read() % 4096 == 0) {
        options_.on_progress(report_.steps_replayed, reader_.offset(), reader_.file_bytes());
      }
    }
    report_.truncation = reader_.truncation();
    // An empty selection is an error, not IDENTICAL over 0 steps.
    if (options_.isolate && !isolated_seen_) {
      throw EmptySelection(fmt::format(
          "--isolate {}: request {} is in no step of the trace{}", *options_.isolate, *options_.isolate,
          options_.until_step ? fmt::format(" up to step {}", *options_.until_step) : ""));
    }
    return std::move(report_);
  }

 private:
  void execute(trace::StepInputRecord& in) {
    ForwardOp op = std::move(in.op);
    StepFaults faults = std::move(in.faults);
    int32_t recorded_row = -1;
    if (options_.isolate) {
      recorded_row = isolate(op, faults);
      if (recorded_row < 0) return;
    }
    if (options_.mode == ReplayMode::kTeacherForced) force_recorded_inputs(op);
    for (const CacheOp& c : in.cache_ops) executor_.copy_pages(c);
    std::vector<int32_t> forced_rows;
    for (const auto& [row, id] : faults.forced_outputs) forced_rows.push_back(row);
    executor_.inject_next_step(std::move(faults));
    StepResult& result = result_;  // the previous step's vectors, reused
    const bool capture = options_.capture_step == in.step;
    if (capture) backend_->capture_activations(ActivationCapture::kValues);
    try {
      executor_.step(op, result);
    } catch (const Error& e) {
      // The executor refused the op (e.g. a request new to its pool row without sampling
      // parameters); the recording must have refused it too (a stepRejected event follows).
      if (capture) backend_->capture_activations(ActivationCapture::kOff);
      rejected_.emplace(in.step, e.what());
      return;
    }
    if (capture) {
      report_.captured = backend_->take_activations();
      backend_->capture_activations(ActivationCapture::kOff);
      report_.captured_step_ran = true;
      report_.captured_op = op;
    }
    Executed done{in.step, op, {}, recorded_row, std::move(forced_rows)};
    // The step's own digests, top-k and state snapshot: what the recording backend computed.
    done.output = trace::make_step_output(in.step, result, StateSnapshot{},
                                          reader_.header().top_logits_count);
    if (options_.mode == ReplayMode::kTeacherForced) keep_logits(in.step, result);
    executed_.push_back(std::move(done));
    ++report_.steps_replayed;
  }

  // Keeps only the isolated request's row; returns its recorded row, or -1 when the step does not
  // contain the request.
  int32_t isolate(ForwardOp& op, StepFaults& faults) {
    int32_t kept = -1;
    int32_t token_offset = 0, kept_offset = 0;
    for (int32_t i = 0; i < op.rows_count(); ++i) {
      if (op.rows[i].request_id == *options_.isolate) kept = i, kept_offset = token_offset;
      if (op.rows[i].kind == RowKind::kPrefill) token_offset += op.rows[i].input_length;
    }
    if (kept < 0) return -1;
    isolated_seen_ = true;
    const OpRow row = op.rows[kept];
    std::vector<int32_t> tokens;
    if (row.kind == RowKind::kPrefill) {
      tokens.assign(op.prefill_token_ids.begin() + kept_offset,
                    op.prefill_token_ids.begin() + kept_offset + row.input_length);
    }
    op.rows = {row};
    op.prefill_token_ids = std::move(tokens);
    StepFaults only;
    only.poison_value = faults.poison_value;
    for (int32_t r : faults.poisoned_rows) if (r == kept) only.poisoned_rows.push_back(0);
    for (const auto& [r, id] : faults.forced_outputs) if (r == kept) only.forced_outputs.push_back({0, id});
    faults = std::move(only);
    return kept;
  }

  // Teacher forcing: a decode row reads the token the recording emitted last, at the recorded KV
  // length, so one divergence does not cascade into every later step.
  void force_recorded_inputs(ForwardOp& op) {
    for (OpRow& row : op.rows) {
      if (row.kind != RowKind::kDecode || row.hist_token_length != -1) continue;
      const auto it = recorded_.find(row.request_id);
      if (it == recorded_.end()) continue;
      row.decode_override = it->second.last_token;
      row.hist_token_length = it->second.valid_cache_length;
    }
  }

  void keep_logits(int64_t step, const StepResult& result) { logits_[step] = result.logits; }

  // The recording refused step `e.step` after writing its input: the replay must have too.
  void on_recorded_rejection(const trace::TraceEvent& e) {
    if (rejected_.erase(e.step) > 0) return;
    if (executed_.empty() || executed_.front().step != e.step) return;  // no input was written
    const Executed done = std::move(executed_.front());
    executed_.pop_front();
    if (options_.mode != ReplayMode::kExact) return;
    report_.divergence = Divergence{.step = e.step, .field = "rejected",
                                    .expected = "rejected: " + e.detail, .actual = "ran"};
  }

  void run_deferred() {
    if (!deferred_ || report_.divergence) return;
    trace::StepInputRecord in = std::move(*deferred_);
    deferred_.reset();
    execute(in);
  }

  void compare(const trace::StepOutputRecord& recorded_full) {
    if (const auto it = rejected_.find(recorded_full.step); it != rejected_.end()) {
      report_.divergence = Divergence{.step = it->first, .field = "rejected",
                                      .expected = "ran", .actual = "rejected: " + it->second};
      return;
    }
    // Steps not executed (--isolate skipped them) have no replayed output to compare.
    if (executed_.empty() || executed_.front().step != recorded_full.step) return;
    Executed done = std::move(executed_.front());
    executed_.pop_front();
    const trace::StepOutputRecord recorded =
        options_.isolate ? isolated(recorded_full, done.op, done.recorded_row) : recorded_full;
    ++report_.steps_compared;
    if (options_.capture_step == recorded.step) {
      report_.recorded_activation_digests = recorded.activation_digests;
    }
    remember(done, recorded);
    if (options_.mode == ReplayMode::kExact) {
      report_.divergence = first_divergence(done.op, recorded, done.output);
    } else {
      agree(done, recorded);
    }
  }

  // The recorded output reduced to the isolated row.
  trace::StepOutputRecord isolated(const trace::StepOutputRecord& r, const ForwardOp& op,
                                   int32_t row) {
    trace::StepOutputRecord out = r;
    const int32_t ne = r.result.prefill_rows_count;
    const int32_t w = r.result.verify_width;
    const int32_t begin = row < ne ? row : ne + (row - ne) * w;
    const int32_t count = row < ne ? 1 : w;
    auto cut = [&](auto& v, int32_t b, int32_t n) {
      if (v.empty()) return;
      v.assign(v.begin() + b, v.begin() + b + n);
    };
    cut(out.result.tokens, begin, count);
    cut(out.result.logprobs, begin, count);
    cut(out.logits_digests, begin, count);
    cut(out.result.accepted_lengths, row, 1);
    cut(out.result.nan_flags, row, 1);
    cut(out.result.oov_flags, row, 1);
    cut(out.valid_cache_lengths, row, 1);
    cut(out.future_input_digests, row, 1);
    cut(out.drafts, row * w, w);
    cut(out.mamba_state_digests, row, 1);
    out.activation_digests.clear();  // --localise refuses --isolate: the rows' tokens interleave
    cut(out.top_logits, begin * r.top_logits_count, count * r.top_logits_count);
    out.result.mode = op.mode();
    out.result.prefill_rows_count = op.prefill_rows_count();
    return out;
  }

  // What the next decode of each request reads. A token a fault replaced (oov-sample) was emitted
  // but never entered the device's inputs (the backend wrote the sampled one there): the replay,
  // which injected the same fault, holds that input already, so the request is not forced.
  void remember(const Executed& done, const trace::StepOutputRecord& recorded) {
    const ForwardOp& op = done.op;
    for (int32_t row = 0; row < op.rows_count(); ++row) {
      if (std::find(done.forced_rows.begin(), done.forced_rows.end(), row) != done.forced_rows.end()) {
        recorded_.erase(op.rows[row].request_id);
        continue;
      }
      const std::vector<int32_t> tokens = recorded.result.row_tokens(row);
      Recorded& r = recorded_[op.rows[row].request_id];
      if (!tokens.empty()) r.last_token = tokens.back();
      if (!recorded.valid_cache_lengths.empty()) r.valid_cache_length = recorded.valid_cache_lengths[row];
    }
  }

  void agree(const Executed& done, const trace::StepOutputRecord& recorded) {
    StepAgreement a{.step = done.step};
    const std::vector<int32_t>& expected = recorded.result.tokens;
    const std::vector<int32_t>& actual = done.output.result.tokens;
    for (size_t i = 0; i < expected.size() && i < actual.size(); ++i) {
      a.tokens_count += 1;
      a.tokens_equal += expected[i] == actual[i] ? 1 : 0;
    }
    // Every recorded top-k pair against the replayed logit of the same id: also where the
    // digests agree, so a recorded pair that does not match its own logits shows.
    const std::vector<float>& logits = logits_[done.step];
    const int32_t v = weights_.config.vocab_size;
    const int32_t k = recorded.top_logits_count;
    const size_t rows = k == 0 ? 0 : recorded.top_logits.size() / static_cast<size_t>(k);
    for (size_t r = 0; r < rows && (r + 1) * static_cast<size_t>(v) <= logits.size(); ++r) {
      for (int32_t j = 0; j < k; ++j) {
        const trace::TopLogit& t = recorded.top_logits[r * k + j];
        const float delta = std::fabs(logits[r * v + t.id] - t.logit);
        a.logit_delta_max = std::max(a.logit_delta_max, delta);
      }
      const trace::TopLogit& best = recorded.top_logits[r * k];
      a.top1_count += 1;
      a.top1_equal += done.output.top_logits.size() > r * k &&
                              done.output.top_logits[r * k].id == best.id
                          ? 1
                          : 0;
    }
    logits_.erase(done.step);
    report_.tokens_equal += a.tokens_equal;
    report_.tokens_count += a.tokens_count;
    report_.top1_equal += a.top1_equal;
    report_.top1_count += a.top1_count;
    report_.logit_delta_max = std::max(report_.logit_delta_max, a.logit_delta_max);
    report_.agreement.push_back(a);
  }

  ReplayOptions options_;
  trace::TraceReader reader_;
  NamedWeights owned_weights_;  // where the caller gave its weights, their origin alone
  const ModelWeights& weights_;
  std::unique_ptr<Backend> backend_;
  Executor executor_;
  StepResult result_;  // every step's result, into the same buffers
  ReplayReport report_;
  std::deque<Executed> executed_;
  std::optional<trace::StepInputRecord> deferred_;  // read while the step before it was open
  std::map<RequestId, Recorded> recorded_;
  std::map<int64_t, std::vector<float>> logits_;
  std::map<int64_t, std::string> rejected_;  // steps the replay's executor refused, with why
  bool isolated_seen_ = false;               // --isolate: the request was in a step
};

}  // namespace

std::optional<int64_t> ReplayReport::first_disagreeing_step() const {
  for (const StepAgreement& a : agreement) {
    if (a.tokens_equal != a.tokens_count) return a.step;
  }
  return std::nullopt;
}

std::optional<std::string> other_build_note(const trace::TraceHeader& header,
                                            const std::string& replaying_build) {
  if (header.is_foreign() || header.build_id == replaying_build) return std::nullopt;
  return fmt::format("note: recorded by {}, replayed by {}: replay is bit for bit on the build "
                     "that recorded it; a kernel or sampler change between builds differs too",
                     header.build_id, replaying_build);
}

int32_t replay_tp_degree(const ReplayOptions& options, const trace::TraceHeader& header) {
  return options.tp_degree.value_or(header.tp_degree);
}

ReplayReport replay_trace(const std::filesystem::path& path, const ReplayOptions& options) {
  return replay_trace(trace::TraceReader::open(path), options);
}

ReplayReport replay_trace(trace::TraceReader reader, const ReplayOptions& options) {
  const trace::TraceHeader& h = reader.header();
  LS_REQUIRE(!(h.is_foreign() && options.mode == ReplayMode::kExact),
             "exact replay refuses this trace: it came from a foreign executor ({}), whose outputs "
             "lockstep's executor is not built to reproduce bit for bit and whose state digests "
             "were not recorded; replay it with --mode teacher-forced to measure the agreement",
             h.foreign_executor);
  const int32_t tp_degree = replay_tp_degree(options, h);
  LS_REQUIRE(options.mode != ReplayMode::kExact || tp_degree == h.tp_degree,
             "exact replay refuses --tp {}: the trace was recorded at tensor-parallel degree {}, "
             "and TP {} equals TP {} only within a tolerance (the all-reduce adds in another "
             "order); replay it at --tp {}, or with --mode teacher-forced to measure the agreement",
             tp_degree, h.tp_degree, tp_degree, h.tp_degree, h.tp_degree);
  Replayer replayer(std::move(reader), options);
  return replayer.run();
}

}  // namespace ls::replay
