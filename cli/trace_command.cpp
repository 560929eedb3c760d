#include "cli/trace_command.h"

#include "cli/number_flags.h"
#include "cli/exit_status.h"
#include "core/check.h"
#include "replay/compare.h"
#include "trace/reader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>
#include <map>
#include <optional>
#include <memory>

namespace ls::cli {

namespace {

struct InspectOptions {
  std::string trace;
  std::string steps;  // "A:B"
  std::optional<RequestId> request;
};

struct DiffOptions {
  std::string a, b;
};

// "A:B" with 0 <= A <= B: an empty range is an error, not an empty table.
std::pair<int64_t, int64_t> parse_steps(const std::string& text) {
  const size_t colon = text.find(':');
  LS_REQUIRE(colon != std::string::npos, "--steps '{}': expected A:B, e.g. 0:20", text);
  const std::optional<int64_t> first = parse_int64(text.substr(0, colon));
  const std::optional<int64_t> last = parse_int64(text.substr(colon + 1));
  LS_REQUIRE(first && last && *first >= 0 && *last >= 0,
             "--steps '{}': expected A:B with two integers in [0, {}]", text,
             std::numeric_limits<int64_t>::max());
  LS_REQUIRE(*first <= *last, "--steps '{}': the range is empty (step {} is after step {})", text,
             *first, *last);
  return {*first, *last};
}

void print_header(const trace::TraceHeader& h) {
  const ModelConfig& m = h.model;
  const ExecutorConfig& e = h.executor;
  fmt::print("format v{}, written by {}\n", h.format_version, h.build_id);
  if (h.is_foreign()) fmt::print("outputs from a foreign executor: {}\n", h.foreign_executor);
  fmt::print("model {}: hidden {}, layers {}, heads {}/{} x {}, ffn {}, vocab {}, rope theta {}, "
             "rms eps {}, tied {}\n", m.name, m.hidden_size, m.layers_count, m.query_heads_count,
             m.kv_heads_count, m.head_dim, m.ffn_size, m.vocab_size, m.rope_theta, m.rms_eps,
             m.tied_embeddings);
  fmt::print("family {} ({}): qkv bias {}, qk norm {}, max positions {}, sliding window {}\n",
             to_string(m.family), architecture_name(m.family), m.qkv_bias, m.qk_norm,
             m.max_positions == 0 ? std::string("none") : std::to_string(m.max_positions),
             m.sliding_window == 0 ? std::string("none") : std::to_string(m.sliding_window));
  fmt::print("rope {}: factor {}, low freq factor {}, high freq factor {}, original max positions "
             "{}, rotates {} of head_dim {}\n", to_string(m.rope_type), m.rope_factor,
             m.rope_low_freq_factor, m.rope_high_freq_factor, m.rope_original_max_positions,
             m.rotary_dim(), m.head_dim);
  fmt::print("weights {} (digest {:016x}, {} form)\n",
             h.weights.kind == WeightSource::Kind::kSeed ? fmt::format("from seed {}", h.weights.seed)
                                                         : fmt::format("from {}", h.weights.directory),
             h.weights_digest, to_string(h.weights_digest_form));
  fmt::print("limits: B {}, L {}, P {}, pages {}, host pages {}, W {}, prefill chunk {}; drafter {}\n",
             e.max_batch_rows, e.context_length, e.page_size, e.pages_count, e.host_pages_count,
             e.verify_width, e.prefill_chunk_tokens, h.drafter.empty() ? "none" : h.drafter);
  if (h.activation_digests) {
    fmt::print("activation digests: every step, per layer attn_in, q, k, v, attn_out, mlp_out, "
               "then final_norm and logits (replay --localise)\n");
  }
  if (m.has_recurrent_state()) {
    std::string kinds;
    for (const LayerKind kind : m.layer_kinds) kinds += kind == LayerKind::kMamba2 ? 'M' : 'A';
    fmt::print("hybrid: layers {}; mamba2 heads {} x {}, groups {}, state {}, conv {}{}, dt in "
               "[{}, {}]; state slots {}\n", kinds, m.mamba.heads_count, m.mamba.head_dim,
               m.mamba.groups_count, m.mamba.state_size, m.mamba.conv_kernel,
               m.mamba.conv_bias ? " (bias)" : "", m.mamba.dt_min, m.mamba.dt_max,
               e.mamba_slots_count);
  }
  if (!h.step_clock.empty()) fmt::print("step stats: clock {}, device timer {}\n", h.step_clock, h.device_timer);
  fmt::print("backend {} ({}, TP {}), machine: {}{}\n", h.backend, h.determinism_mode, h.tp_degree,
             h.machine.cpu_name,
             h.machine.gpu_name.empty() ? "" : fmt::format(", {} ({} SMs, driver {}, CUDA {}, cuBLAS {})",
                                                           h.machine.gpu_name, h.machine.sm_count,
                                                           h.machine.driver_version, h.machine.cuda_version,
                                                           h.machine.cublas_version));
  if (h.nccl_version != 0) {
    fmt::print("collectives: NCCL {}.{}.{}, NCCL_ALGO={}, NCCL_PROTO={}\n", h.nccl_version / 10000,
               h.nccl_version / 100 % 100, h.nccl_version % 100, h.nccl_algo, h.nccl_proto);
  }
}

std::string row_summary(const OpRow& r) {
  std::string s = fmt::format("{}:{}@{}", r.request_id, r.kind == RowKind::kPrefill ? "P" : "D", r.pool_row);
  if (r.kind == RowKind::kPrefill) s += fmt::format("[{}+{}/{}]", r.prefix_length, r.input_length, r.prompt_length);
  if (r.decode_override != -1) s += fmt::format(" override {}", r.decode_override);
  if (r.hist_token_length != -1) s += fmt::format(" hist {}", r.hist_token_length);
  if (r.mamba_working != -1) s += fmt::format(" state {}", r.mamba_working);
  if (r.mamba_checkpoint_dst != -1) s += fmt::format(" checkpoint {}", r.mamba_checkpoint_dst);
  if (r.mamba_cow_src != -1) {
    s += fmt::format(" cow {}@{}", r.mamba_cow_src, r.mamba_branching_seqlen);
  }
  return s;
}

// One line per step in the range: the op, then its output.
void print_step_table(const trace::StepInputRecord& in, bool in_range) {
  if (!in_range) return;
  std::vector<std::string> rows;
  for (const OpRow& r : in.op.rows) rows.push_back(row_summary(r));
  fmt::print("step {:>6} {:<6} {:>2} rows  {}{}{}\n", in.step, to_string(in.op.mode()), in.op.rows_count(),
             fmt::join(rows, "  "), in.cache_ops.empty() ? "" : fmt::format("  +{} cache ops", in.cache_ops.size()),
             in.faults.empty() ? "" : "  +faults");
}

void print_request_step(const trace::StepInputRecord& in, RequestId id) {
  for (const OpRow& r : in.op.rows) {
    if (r.request_id == id) fmt::print("step {:>6}  {}\n", in.step, row_summary(r));
  }
}

void print_request_output(const trace::StepOutputRecord& out, const trace::StepInputRecord& in, RequestId id) {
  for (int32_t row = 0; row < in.op.rows_count(); ++row) {
    if (in.op.rows[row].request_id != id) continue;
    const std::string state =
        out.mamba_state_digests.empty()
            ? std::string()
            : fmt::format(", state {:016x}", out.mamba_state_digests[static_cast<size_t>(row)]);
    fmt::print("             -> tokens [{}], vcl {}{}{}{}\n", fmt::join(out.result.row_tokens(row), ", "),
               out.valid_cache_lengths.empty() ? -1 : out.valid_cache_lengths[row], state,
               out.result.nan_flags[row] ? ", NaN flagged" : "", out.result.oov_flags[row] ? ", OOV flagged" : "");
  }
}

void print_event(const trace::TraceEvent& e) {
  fmt::print("step {:>6}  event {} request {}{}{}\n", e.step, trace::to_string(e.kind), e.request_id,
             e.detail.empty() ? "" : fmt::format(" ({})", e.detail),
             e.hist_token_length ? fmt::format(" hist_token_length {}", *e.hist_token_length) : "");
}

void print_stats(const trace::StepStatsRecord& s) {
  fmt::print("step {:>6}  stats: {:.1f} us (device {:.1f} us, wait {:.1f} us{}), pages {} used {} free, "
             "{} running, {} queued, {} prefix-hit tokens\n",
             s.step, double(s.done_ns - s.submit_ns) / 1e3, double(s.device_busy_ns) / 1e3, double(s.wait_ns) / 1e3,
             s.device_idle_before_ns < 0 ? "" : fmt::format(", idle before {:.1f} us", double(s.device_idle_before_ns) / 1e3),
             s.pages_used, s.pages_free, s.running_count, s.queue_length, s.prefix_hit_tokens);
}

int run_inspect(const InspectOptions& o) {
  trace::TraceReader reader = trace::TraceReader::open(o.trace);
  print_header(reader.header());
  const bool table = !o.steps.empty();
  const auto [first, last] = table ? parse_steps(o.steps) : std::pair<int64_t, int64_t>{0, -1};
  const bool timeline = o.request.has_value();
  const RequestId id = o.request.value_or(0);
  int64_t steps_shown = 0;     // --steps: steps of the trace in the range
  bool request_seen = false;   // --request: the request is in a step or an event
  std::map<std::string, int64_t> event_counts;
  int64_t stats_count = 0;
  std::map<int64_t, trace::StepInputRecord> open_inputs;  // for the timeline's outputs
  trace::TraceRecord record;
  while (reader.next(record)) {
    if (auto* in = std::get_if<trace::StepInputRecord>(&record)) {
      const bool in_table = table && in->step >= first && in->step <= last;
      print_step_table(*in, in_table);
      steps_shown += in_table ? 1 : 0;
      if (timeline) {
        for (const OpRow& r : in->op.rows) request_seen = request_seen || r.request_id == id;
        print_request_step(*in, id);
        open_inputs[in->step] = *in;
      }
    } else if (auto* out = std::get_if<trace::StepOutputRecord>(&record)) {
      if (timeline && open_inputs.count(out->step)) {
        print_request_output(*out, open_inputs[out->step], id);
        open_inputs.erase(out->step);
      }
    } else if (auto* st = std::get_if<trace::StepStatsRecord>(&record)) {
      ++stats_count;
      if (table && st->step >= first && st->step <= last) print_stats(*st);
    } else if (auto* e = std::get_if<trace::TraceEvent>(&record)) {
      ++event_counts[std::string(trace::to_string(e->kind))];
      const bool in_table = table && e->step >= first && e->step <= last;
      if ((timeline && e->request_id == id) || in_table) print_event(*e);
      request_seen = request_seen || (timeline && e->request_id == id);
    }
  }
  // An empty selection is an error (exit 2), not an empty table with exit 0.
  LS_REQUIRE(!table || steps_shown > 0, "--steps {}: no step of the trace is in the range ({} steps "
             "recorded)", o.steps, reader.step_inputs_read());
  LS_REQUIRE(!timeline || request_seen, "--request {}: request {} is in no step or event of the trace",
             id, id);
  std::vector<std::string> events;
  for (const auto& [kind, n] : event_counts) events.push_back(fmt::format("{} {}", kind, n));
  fmt::print("records {}: {} step inputs, {} step outputs, {} events ({}), {} step stats; {} complete steps; {}\n",
             reader.records_read(), reader.step_inputs_read(), reader.step_outputs_read(),
             reader.events_read(), events.empty() ? "none" : fmt::format("{}", fmt::join(events, ", ")),
             stats_count,
             reader.complete_steps(), reader.footer() ? "closed cleanly (footer present)" : "no footer");
  if (reader.truncation()) fmt::print("truncated: {}\n", reader.truncation()->describe());
  return kExitOk;
}

// The first field where two ops differ, or empty.
std::string op_difference(const ForwardOp& a, const ForwardOp& b) {
  if (a.rows.size() != b.rows.size()) return fmt::format("rows: {} vs {}", a.rows.size(), b.rows.size());
  for (size_t i = 0; i < a.rows.size(); ++i) {
    if (!(a.rows[i] == b.rows[i])) {
      return fmt::format("row {}: {} vs {}", i, row_summary(a.rows[i]), row_summary(b.rows[i]));
    }
  }
  if (a.prefill_token_ids != b.prefill_token_ids) return "prefill_token_ids differ";
  return "";
}

std::string record_difference(const trace::TraceRecord& a, const trace::TraceRecord& b,
                              const ForwardOp& last_op) {
  if (a.index() != b.index()) return "record kinds differ";
  if (auto* x = std::get_if<trace::StepInputRecord>(&a)) {
    const auto& y = std::get<trace::StepInputRecord>(b);
    if (x->step != y.step) return fmt::format("step {} vs {}", x->step, y.step);
    const std::string d = op_difference(x->op, y.op);
    if (!d.empty()) return "input " + d;
    if (!(x->cache_ops == y.cache_ops)) return "input cache_ops differ";
    if (!(x->faults == y.faults)) return "input faults differ";
    return "";
  }
  if (auto* x = std::get_if<trace::StepOutputRecord>(&a)) {
    const auto d = replay::first_divergence(last_op, *x, std::get<trace::StepOutputRecord>(b));
    return d ? "output: " + d->describe() : "";
  }
  if (auto* x = std::get_if<trace::TraceEvent>(&a)) {
    return *x == std::get<trace::TraceEvent>(b) ? "" : "events differ";
  }
  if (auto* x = std::get_if<trace::StepStatsRecord>(&a)) {
    // Times differ between any two real runs; what the scheduler held must not.
    trace::StepStatsRecord y = std::get<trace::StepStatsRecord>(b);
    y.submit_ns = x->submit_ns, y.done_ns = x->done_ns, y.wait_ns = x->wait_ns;
    y.device_busy_ns = x->device_busy_ns, y.device_idle_before_ns = x->device_idle_before_ns;
    return *x == y ? "" : fmt::format("step stats {} differ (pages, queue or prefix hits)", x->step);
  }
  return "";
}

int run_diff(const DiffOptions& o) {
  trace::TraceReader a = trace::TraceReader::open(o.a);
  trace::TraceReader b = trace::TraceReader::open(o.b);
  const trace::TraceHeader& ha = a.header();
  const trace::TraceHeader& hb = b.header();
  if (ha.weights_digest_form != hb.weights_digest_form) {
    fmt::print("headers: weight digests of different forms ({} and {}): not comparable\n",
               to_string(ha.weights_digest_form), to_string(hb.weights_digest_form));
  } else if (ha.weights_digest != hb.weights_digest) {
    fmt::print("headers: weight digests differ\n");
  }
  if (!(ha.executor.context_length == hb.executor.context_length &&
        ha.executor.max_batch_rows == hb.executor.max_batch_rows)) {
    fmt::print("headers: executor limits differ\n");
  }
  trace::TraceRecord ra, rb;
  ForwardOp last_op;
  for (int64_t n = 1;; ++n) {
    const bool more_a = a.next(ra);
    const bool more_b = b.next(rb);
    if (!more_a || !more_b) {
      if (more_a == more_b) break;
      fmt::print("{} ends after {} records; the other goes on\n", more_a ? o.b : o.a, n);
      return kExitFinding;
    }
    const std::string d = record_difference(ra, rb, last_op);
    if (auto* in = std::get_if<trace::StepInputRecord>(&ra)) last_op = in->op;
    if (!d.empty()) {
      fmt::print("first difference at record {}: {}\n", n, d);
      return kExitFinding;
    }
  }
  fmt::print("no difference in {} and {}\n", o.a, o.b);
  return kExitOk;
}

}  // namespace

std::function<int()> add_trace_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("trace", "Look inside traces: inspect one, diff two");
  cmd->require_subcommand(1);
  auto inspect = std::make_shared<InspectOptions>();
  CLI::App* i = cmd->add_subcommand("inspect", "Header, counts, a per-step table, a per-request timeline");
  i->add_option("trace", inspect->trace, "The trace file")->required()->check(CLI::ExistingFile);
  i->add_option("--steps", inspect->steps, "Print a table of steps A:B (inclusive)");
  i->add_option("--request", inspect->request,
                "Print the timeline of one request id (one in no step or event is an error)")
      ->check(unsigned_64());
  auto diff = std::make_shared<DiffOptions>();
  CLI::App* d = cmd->add_subcommand("diff", "The first record and field where two traces differ");
  d->add_option("a", diff->a, "First trace")->required()->check(CLI::ExistingFile);
  d->add_option("b", diff->b, "Second trace")->required()->check(CLI::ExistingFile);
  d->footer(kExitStatusHelp);
  i->footer(kExitStatusHelp);
  return [cmd, i, d, inspect, diff]() {
    if (!cmd->parsed()) return -1;
    return i->parsed() ? run_inspect(*inspect) : run_diff(*diff);
  };
}

}  // namespace ls::cli
