// lockstep.TraceWriter (an engine that keeps its own executor records the ops it scheduled and
// what its executor produced, in lockstep's trace format) and lockstep.open_trace's reader (the
// C++ reader validates every record; records come out as plain Python objects).
#include "bindings.h"

#include "core/check.h"
#include "core/model/weights.h"
#include "trace/checks.h"
#include "trace/digests.h"
#include "trace/reader.h"
#include "trace/recorder.h"
#include "trace/trace_observer.h"

#include <pybind11/stl.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <sstream>

namespace ls::py_bindings {

namespace {

const std::vector<std::string>& header_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = {"executor", "model", "weights_seed", "weights_digest",
                                  "weights_digest_form", "backend", "gpu_name"};
    n.insert(n.end(), executor_limit_names().begin(), executor_limit_names().end());
    return n;
  }();
  return names;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  LS_REQUIRE(in.good(), "TraceWriter: cannot read '{}'", path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The weight digest given, with its form ("stream" or "blocks", as the header of the trace it came
// from names it: the same weights digest differently in each), else 0 ("not recorded"): making or
// loading every weight just to hash it is the replay's job.
void header_digest(const Fields& f, trace::TraceHeader& h) {
  const auto digest = field(f, "weights_digest");
  const auto form = field(f, "weights_digest_form");
  if (!digest) {
    LS_REQUIRE(!form, "TraceWriter header: weights_digest_form is given without weights_digest");
    h.weights_digest = 0;
    return;
  }
  h.weights_digest = to_uint64(*digest, "TraceWriter header: weights_digest");
  LS_REQUIRE(form.has_value(),
             "TraceWriter header: weights_digest needs weights_digest_form ('stream' or 'blocks': "
             "header.weights_digest_form of the trace the digest came from)");
  const std::string name = to_string_value(*form, "TraceWriter header: weights_digest_form");
  const std::optional<WeightsDigestForm> parsed = weights_digest_form_named(name);
  LS_REQUIRE(parsed.has_value(),
             "TraceWriter header: weights_digest_form '{}' is neither 'stream' nor 'blocks'", name);
  h.weights_digest_form = *parsed;
}

// The model a foreign executor ran: a named shape with the seed of its random weights, or a
// Hugging Face directory (only its config.json is read).
void header_model(const Fields& f, trace::TraceHeader& h) {
  const auto model = field(f, "model");
  LS_REQUIRE(model.has_value(), "TraceWriter header: model is required (a named shape or a Hugging Face directory)");
  const std::string name = to_string_value(*model, "TraceWriter header: model");
  header_digest(f, h);
  if (is_model_directory(name)) {
    LS_REQUIRE(!field(f, "weights_seed"),
               "TraceWriter header: weights_seed is for a named shape; model '{}' is a directory", name);
    const std::filesystem::path dir(name);
    h.model = model_config_from_hf_json(read_file((dir / "config.json").string()), dir.filename().string());
    h.weights = {WeightSource::Kind::kDirectory, 0, name};
    return;
  }
  const std::vector<std::string> names = model_config_names();
  LS_REQUIRE(std::find(names.begin(), names.end(), name) != names.end(),
             "TraceWriter header: model '{}' is neither a named shape ({}) nor a directory", name,
             fmt::join(names, ", "));
  const auto seed = field(f, "weights_seed");
  h.model = model_config_named(name);
  h.weights = {WeightSource::Kind::kSeed, seed ? to_uint64(*seed, "TraceWriter header: weights_seed") : 0, ""};
}

trace::TraceHeader foreign_header(py::handle header) {
  LS_REQUIRE(py::isinstance<py::dict>(header), "TraceWriter: header must be a dict, got {}",
             Py_TYPE(header.ptr())->tp_name);
  Fields f = fields_from_kwargs(py::reinterpret_borrow<py::dict>(header), header_names(), "TraceWriter header");
  trace::TraceHeader h;
  h.build_id = trace::build_id();
  const auto executor = field(f, "executor");
  LS_REQUIRE(executor.has_value(), "TraceWriter header: executor is required: the name of the engine whose executor ran the steps");
  h.foreign_executor = to_string_value(*executor, "TraceWriter header: executor");
  LS_REQUIRE(!h.foreign_executor.empty(), "TraceWriter header: executor must not be empty");
  header_model(f, h);
  h.backend = field(f, "backend") ? to_string_value(*field(f, "backend"), "TraceWriter header: backend") : "unknown";
  if (const auto gpu = field(f, "gpu_name")) h.machine.gpu_name = to_string_value(*gpu, "TraceWriter header: gpu_name");
  h.determinism_mode = "foreign";
  h.top_logits_count = 0;
  h.executor_options = ExecutorOptions{};
  h.drafter = "none";
  h.executor = executor_config_from_fields(f, "TraceWriter header");
  return h;
}

const std::vector<std::string>& output_names() {
  static const std::vector<std::string> names = {
      "output_tokens", "output_lengths", "output_logprobs", "output_nan_flags", "output_oov_flags",
      "valid_cache_lengths", "future_input_ids"};
  return names;
}

// A step's outputs as the foreign executor reported them, in the seed's layouts.
trace::StepOutputRecord foreign_output(int64_t step, const ForwardOp& op, py::handle outputs,
                                       const trace::TraceHeader& h) {
  if (py::hasattr(outputs, "sync") && !py::isinstance<py::dict>(outputs)) outputs.attr("sync")();
  const Fields f = fields_from_object(outputs, output_names());
  const size_t bs = op.rows.size();
  trace::StepOutputRecord r;
  r.step = step;
  r.result.mode = op.mode();
  r.result.prefill_rows_count = op.prefill_rows_count();
  r.result.verify_width = h.executor.verify_width;
  const auto tokens = field(f, "output_tokens");
  const auto lengths = field(f, "output_lengths");
  const auto vcl = field(f, "valid_cache_lengths");
  LS_REQUIRE(tokens && lengths, "write_step: outputs need output_tokens and output_lengths");
  LS_REQUIRE(vcl.has_value(),
             "write_step: outputs need valid_cache_lengths (each row's KV length after the step): "
             "check and teacher-forced replay follow them");
  r.result.tokens = to_int32_list(*tokens, "output_tokens");
  r.result.accepted_lengths = to_int32_list(*lengths, "output_lengths");
  r.valid_cache_lengths = to_int32_list(*vcl, "valid_cache_lengths");
  if (const auto v = field(f, "output_logprobs")) r.result.logprobs = to_float_list(*v, "output_logprobs");
  const auto nan = field(f, "output_nan_flags");
  r.result.nan_flags = nan ? to_flag_list(*nan, "output_nan_flags") : std::vector<uint8_t>(bs, 0);
  const auto oov = field(f, "output_oov_flags");
  r.result.oov_flags = oov ? to_flag_list(*oov, "output_oov_flags") : std::vector<uint8_t>(bs, 0);
  if (const auto v = field(f, "future_input_ids")) {
    // [bs, W]: each row's next-round input ids (future_input_map) after the step.
    const size_t width = static_cast<size_t>(h.executor.verify_width);
    std::vector<int32_t> ids;
    for (py::handle row : *v) {
      const std::vector<int32_t> one = to_int32_list(row, "future_input_ids[]");
      LS_REQUIRE(one.size() == width, "write_step: future_input_ids rows hold {} ids, expected W = {}", one.size(), width);
      ids.insert(ids.end(), one.begin(), one.end());
    }
    LS_REQUIRE(ids.size() == bs * width, "write_step: future_input_ids holds {} rows, expected {}", ids.size() / width, bs);
    for (size_t i = 0; i < bs; ++i) {
      r.future_input_digests.push_back(trace::future_inputs_digest(
          std::span<const int32_t>(ids).subspan(i * width, width)));
    }
    if (width > 1) r.drafts = std::move(ids);
  }
  return r;
}

trace::EventKind event_kind(const std::string& name) {
  for (uint8_t k = 0; k <= static_cast<uint8_t>(trace::EventKind::kStepRejected); ++k) {
    const auto kind = static_cast<trace::EventKind>(k);
    if (to_string(kind) == name) return kind;
  }
  std::vector<std::string> names;
  for (uint8_t k = 0; k <= static_cast<uint8_t>(trace::EventKind::kStepRejected); ++k) {
    names.emplace_back(to_string(static_cast<trace::EventKind>(k)));
  }
  throw Error(fmt::format("write_event: unknown kind '{}' (known: {})", name, fmt::join(names, ", ")));
}

class PyTraceWriter {
 public:
  PyTraceWriter(const std::string& path, py::handle header)
      : header_(foreign_header(header)), recorder_(trace::Recorder::open(path, header_)) {}

  // Checks the op and the outputs with the same functions the reader runs, so a bad record is
  // refused here, naming the field, and never reaches the file.
  int64_t write_step(py::handle op_object, py::handle outputs) {
    LS_REQUIRE(recorder_, "write_step: the writer is closed");
    const ForwardOp op = py::isinstance<PyForwardOp>(op_object)
                             ? op_object.cast<const PyForwardOp&>().op
                             : forward_op_from_fields(fields_from_object(op_object, forward_op_field_names()));
    trace::StepInputRecord input{.step = next_step_, .op = op};
    try {
      trace::check_step_input(input, header_, true);
    } catch (const Error& e) {
      throw Error(fmt::format("write_step: {}", with_seed_field(e, op)));
    }
    trace::StepOutputRecord output = foreign_output(next_step_, op, outputs, header_);
    trace::check_step_output(output, trace::OpenStep{next_step_, op.rows_count(), op.prefill_rows_count()}, header_);
    py::gil_scoped_release release;
    recorder_->record_input(std::move(input));
    recorder_->record_output(std::move(output));
    return next_step_++;
  }

  void write_event(const std::string& kind, py::handle request_id, const std::string& detail,
                   py::handle hist_token_length, py::handle step) {
    LS_REQUIRE(recorder_, "write_event: the writer is closed");
    trace::TraceEvent e;
    e.kind = event_kind(kind);
    e.request_id = to_uint64(request_id, "write_event: request_id");
    e.detail = detail;
    e.step = step.is_none() ? next_step_ : to_int64(step, "write_event: step");
    if (!hist_token_length.is_none()) e.hist_token_length = to_int32(hist_token_length, "write_event: hist_token_length");
    trace::check_event(e, header_);
    recorder_->record_event(std::move(e));
  }

  void close() {
    if (!recorder_) return;
    py::gil_scoped_release release;
    recorder_->close();
    recorder_.reset();
  }

  int64_t steps_written() const { return next_step_; }

 private:
  trace::TraceHeader header_;
  std::unique_ptr<trace::Recorder> recorder_;
  int64_t next_step_ = 0;
};

// ---- reading ----

py::dict header_to_dict(const trace::TraceHeader& h) {
  py::dict d;
  d["format_version"] = h.format_version;
  d["build_id"] = h.build_id;
  d["model"] = model_config_to_dict(h.model);
  d["weights_source"] = h.weights.kind == WeightSource::Kind::kSeed ? "seed" : "directory";
  d["weights_seed"] = h.weights.seed;
  d["weights_directory"] = h.weights.directory;
  d["weights_digest"] = h.weights_digest;
  d["weights_digest_form"] = std::string(to_string(h.weights_digest_form));
  d["limits"] = executor_config_to_dict(h.executor);
  d["capture_logits"] = h.executor_options.capture_logits;
  d["want_logprobs"] = h.executor_options.want_logprobs;
  d["top_logits_count"] = h.top_logits_count;
  d["backend"] = h.backend;
  d["determinism_mode"] = h.determinism_mode;
  py::dict machine;
  machine["cpu_name"] = h.machine.cpu_name;
  machine["gpu_name"] = h.machine.gpu_name;
  machine["sm_count"] = h.machine.sm_count;
  machine["driver_version"] = h.machine.driver_version;
  machine["cuda_version"] = h.machine.cuda_version;
  machine["cublas_version"] = h.machine.cublas_version;
  d["machine"] = machine;
  d["index_stride"] = h.index_stride;
  d["drafter"] = h.drafter;
  d["foreign_executor"] = h.foreign_executor.empty() ? py::object(py::none()) : py::cast(h.foreign_executor);
  d["step_clock"] = h.step_clock;
  d["device_timer"] = h.device_timer;
  d["tp_degree"] = h.tp_degree;
  d["mamba_state_digests"] = h.mamba_state_digests;
  d["activation_digests"] = h.activation_digests;  // --record-activations (trace.capnp ACTIVATIONS)
  d["nccl_version"] = h.nccl_version;
  d["nccl_algo"] = h.nccl_algo;
  d["nccl_proto"] = h.nccl_proto;
  return d;
}

py::dict input_to_dict(trace::StepInputRecord& in) {
  py::dict d;
  d["step"] = in.step;
  d["op"] = py::cast(PyForwardOp{std::move(in.op)});
  py::list cache_ops;
  for (const CacheOp& c : in.cache_ops) {
    py::dict o;
    o["kind"] = std::string(to_string(c.kind));
    o["device_pages"] = c.device_pages;
    o["host_pages"] = c.host_pages;
    o["state_slot"] = c.state_slot;  // -1, or the recurrent-state slot copied with the pages
    cache_ops.append(o);
  }
  d["cache_ops"] = cache_ops;
  py::dict faults;
  faults["poisoned_rows"] = in.faults.poisoned_rows;
  faults["poison_value"] = in.faults.poison_value;
  faults["forced_outputs"] = in.faults.forced_outputs;
  d["faults"] = faults;
  return d;
}

py::dict output_to_dict(const trace::StepOutputRecord& out) {
  const StepResult& r = out.result;
  py::dict d;
  d["step"] = out.step;
  d["mode"] = std::string(to_string(r.mode));
  d["prefill_rows_count"] = r.prefill_rows_count;
  d["verify_width"] = r.verify_width;
  d["output_tokens"] = r.tokens;
  d["output_lengths"] = r.accepted_lengths;
  d["output_logprobs"] = r.logprobs.empty() ? py::object(py::none()) : py::cast(r.logprobs);
  d["output_nan_flags"] = r.nan_flags;
  d["output_oov_flags"] = r.oov_flags;
  d["valid_cache_lengths"] = out.valid_cache_lengths;
  d["future_input_digests"] = out.future_input_digests;
  d["logits_digests"] = out.logits_digests;
  py::list top;
  for (const trace::TopLogit& t : out.top_logits) top.append(py::make_tuple(t.id, t.logit));
  d["top_logits"] = top;
  d["top_logits_count"] = out.top_logits_count;
  d["drafts"] = out.drafts;
  d["mamba_state_digests"] = out.mamba_state_digests;
  d["activation_digests"] = out.activation_digests;  // empty unless the header records them
  return d;
}

py::dict event_to_dict(const trace::TraceEvent& e) {
  py::dict d;
  d["kind"] = std::string(to_string(e.kind));
  d["request_id"] = e.request_id;
  d["step"] = e.step;
  d["detail"] = e.detail;
  d["hist_token_length"] = e.hist_token_length ? py::cast(*e.hist_token_length) : py::object(py::none());
  return d;
}

py::dict footer_to_dict(const trace::TraceFooter& f) {
  py::dict d;
  d["steps_count"] = f.steps_count;
  d["outputs_count"] = f.outputs_count;
  d["events_count"] = f.events_count;
  d["index_stride"] = f.index_stride;
  d["step_offsets"] = f.step_offsets;
  return d;
}

py::dict stats_to_dict(const trace::StepStatsRecord& s) {
  py::dict d;
  d["step"] = s.step;
  d["submit_ns"] = s.submit_ns;
  d["done_ns"] = s.done_ns;
  d["wait_ns"] = s.wait_ns;
  d["device_busy_ns"] = s.device_busy_ns;
  d["device_idle_before_ns"] = s.device_idle_before_ns;
  d["pages_used"] = s.pages_used;
  d["pages_free"] = s.pages_free;
  d["prefix_hit_tokens"] = s.prefix_hit_tokens;
  d["queue_length"] = s.queue_length;
  d["running_count"] = s.running_count;
  return d;
}

// The reader behind lockstep.open_trace: `make` maps a record kind ("step_input", "step_output",
// "event", "footer", "step_stats") to the Python class its dict becomes.
class PyTraceReader {
 public:
  PyTraceReader(const std::string& path, py::dict make)
      : reader_(trace::TraceReader::open(path)), make_(std::move(make)) {}

  py::dict header() const { return header_to_dict(open().header()); }

  py::object next() {
    bool more = false;
    {
      trace::TraceReader& reader = open();
      py::gil_scoped_release release;
      more = reader.next(record_);
    }
    if (!more) throw py::stop_iteration();
    if (auto* in = std::get_if<trace::StepInputRecord>(&record_)) return make_["step_input"](input_to_dict(*in));
    if (auto* out = std::get_if<trace::StepOutputRecord>(&record_)) return make_["step_output"](output_to_dict(*out));
    if (auto* ev = std::get_if<trace::TraceEvent>(&record_)) return make_["event"](event_to_dict(*ev));
    if (auto* st = std::get_if<trace::StepStatsRecord>(&record_)) return make_["step_stats"](stats_to_dict(*st));
    return make_["footer"](footer_to_dict(std::get<trace::TraceFooter>(record_)));
  }

  py::object truncation() const {
    const auto t = open().truncation();
    if (!t) return py::none();
    py::dict d;
    d["complete_steps"] = t->complete_steps;
    d["open_step"] = t->open_step ? py::cast(*t->open_step) : py::object(py::none());
    d["complete_bytes"] = t->complete_bytes;
    d["trailing_bytes"] = t->trailing_bytes;
    d["describe"] = t->describe();
    return d;
  }

  int64_t records_read() const { return open().records_read(); }
  uint64_t offset() const { return open().offset(); }
  uint64_t file_bytes() const { return open().file_bytes(); }
  // Unmaps the file; closing again does nothing.
  void close() { reader_.reset(); }
  bool closed() const { return !reader_.has_value(); }

 private:
  const trace::TraceReader& open() const {
    LS_REQUIRE(reader_.has_value(), "open_trace: the trace is closed");
    return *reader_;
  }
  trace::TraceReader& open() {
    LS_REQUIRE(reader_.has_value(), "open_trace: the trace is closed");
    return *reader_;
  }

  std::optional<trace::TraceReader> reader_;
  py::dict make_;
  trace::TraceRecord record_;
};

}  // namespace

void bind_trace(py::module_& m) {
  py::class_<PyTraceWriter>(m, "TraceWriter",
                            "Records a foreign executor's steps in lockstep's trace format.")
      .def(py::init([](py::handle path, py::handle header) {
             return std::make_unique<PyTraceWriter>(to_string_value(path, "TraceWriter: path"), header);
           }),
           py::arg("path"), py::arg("header"))
      .def("write_step", &PyTraceWriter::write_step, py::arg("op"), py::arg("outputs"),
           "Records one step: the op the engine scheduled and what its executor produced.")
      .def("write_event", &PyTraceWriter::write_event, py::arg("kind"), py::arg("request_id"),
           py::arg("detail") = "", py::arg("hist_token_length") = py::none(), py::arg("step") = py::none())
      .def("close", &PyTraceWriter::close)
      .def_property_readonly("steps_written", &PyTraceWriter::steps_written)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyTraceWriter& w, py::args) { w.close(); return false; });

  py::class_<PyTraceReader>(m, "_TraceReader")
      .def(py::init([](py::handle path, py::dict make) {
             return std::make_unique<PyTraceReader>(to_string_value(path, "open_trace: path"), std::move(make));
           }))
      .def("header", &PyTraceReader::header)
      .def("next", &PyTraceReader::next)
      .def("truncation", &PyTraceReader::truncation)
      .def("close", &PyTraceReader::close)
      .def_property_readonly("closed", &PyTraceReader::closed)
      .def_property_readonly("records_read", &PyTraceReader::records_read)
      .def_property_readonly("offset", &PyTraceReader::offset)
      .def_property_readonly("file_bytes", &PyTraceReader::file_bytes);
}

}  // namespace ls::py_bindings
