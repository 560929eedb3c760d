// lockstep.Executor and its step results: ls::Executor over the CPU reference or the CUDA
// backend. submit() returns a Result at once; its sync() collects it (and any older step still in
// flight), so an engine's overlap loop (dispatch k, then sync k − 1) runs the device ahead of the
// host exactly as the C++ serving loop does. The GIL is released while a step is submitted or
// collected.
#include "bindings.h"

#include "backends/backend_factory.h"
#include "core/check.h"
#include "core/tensor_parallel.h"
#include "core/drafter.h"
#include "core/executor.h"
#include "core/model/weights.h"
#include "core/serving_loop.h"
#include "trace/recorder.h"
#include "trace/trace_observer.h"

#ifdef LOCKSTEP_HAVE_CUDA
#include "kernels/cuda_backend.h"  // cuda_device_available
#endif

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <fmt/format.h>

#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string_view>

namespace ls::py_bindings {

namespace {

// One submitted step, shared by the executor's queue and the Result the caller holds.
struct StepState {
  int64_t step = 0;
  int32_t prefill_rows = 0;
  bool done = false;
  StepResult result;
  std::optional<std::vector<int32_t>> next_input_ids;  // [ne, W] when captured
};

template <typename T>
py::array_t<T> to_numpy(const std::vector<T>& v) {
  py::array_t<T> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

py::array_t<bool> flags_to_numpy(const std::vector<uint8_t>& v) {
  py::array_t<bool> out(static_cast<py::ssize_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) out.mutable_data()[i] = v[i] != 0;
  return out;
}

class PyExecutor;

// What execute_forward_op returns in the seed (ModelExecutionResult), for lockstep's executor.
class PyResult {
 public:
  PyResult(std::shared_ptr<StepState> state, PyExecutor* executor, py::object owner)
      : state_(std::move(state)), executor_(executor), owner_(std::move(owner)) {}
  void sync();
  bool ready() const { return state_->done; }
  const StepResult& result() {
    sync();
    return state_->result;
  }
  int64_t step() const { return state_->step; }
  py::object next_input_ids(int32_t width) {
    sync();
    if (!state_->next_input_ids) return py::none();
    py::array_t<int32_t> a = to_numpy(*state_->next_input_ids);
    return a.reshape({static_cast<py::ssize_t>(state_->prefill_rows), static_cast<py::ssize_t>(width)});
  }
  int32_t width() const;

 private:
  std::shared_ptr<StepState> state_;
  PyExecutor* executor_;
  py::object owner_;  // keeps the executor alive while a result refers to it
};

const std::vector<std::string>& executor_option_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = {"model", "backend", "weights_seed", "drafter", "want_logprobs",
                                  "capture_logits", "capture_next_input_ids", "cuda_graphs",
                                  "context_beyond_max_positions", "tp"};
    n.insert(n.end(), executor_limit_names().begin(), executor_limit_names().end());
    return n;
  }();
  return names;
}

ModelWeights load_weights(const Fields& f, WeightSource& source) {
  const auto model = field(f, "model");
  LS_REQUIRE(model.has_value(), "Executor: model is required (a named shape or a Hugging Face directory)");
  const std::string name = to_string_value(*model, "Executor: model");
  if (is_model_directory(name)) {
    LS_REQUIRE(!field(f, "weights_seed"),
               "Executor: weights_seed is for a named shape's random weights; model '{}' is a directory", name);
    source = {WeightSource::Kind::kDirectory, 0, name};
    return load_hf_directory(name);
  }
  const std::vector<std::string> names = model_config_names();
  LS_REQUIRE(std::find(names.begin(), names.end(), name) != names.end(),
             "Executor: model '{}' is neither a named shape ({}) nor a directory", name, fmt::join(names, ", "));
  const auto seed = field(f, "weights_seed");
  source = {WeightSource::Kind::kSeed, seed ? to_uint64(*seed, "Executor: weights_seed") : 0, ""};
  return weights_from_seed(model_config_named(name), source.seed);
}

bool flag(const Fields& f, const std::string& name, bool fallback) {
  const auto v = field(f, name);
  return v ? to_bool(*v, "Executor: " + name) : fallback;
}

class PyExecutor {
 public:
  explicit PyExecutor(const py::kwargs& kwargs) {
    Fields f = fields_from_kwargs(kwargs, executor_option_names(), "Executor");
    weights_ = load_weights(f, source_);
    backend_name_ = field(f, "backend") ? to_string_value(*field(f, "backend"), "Executor: backend") : "cpu";
    drafter_ = field(f, "drafter") ? to_string_value(*field(f, "drafter"), "Executor: drafter") : "none";
    options_.want_logprobs = flag(f, "want_logprobs", false);
    options_.capture_logits = flag(f, "capture_logits", false);
    capture_next_ = flag(f, "capture_next_input_ids", false);
    const bool graphs = flag(f, "cuda_graphs", true);
    const bool beyond_max_positions = flag(f, "context_beyond_max_positions", false);
    tp_degree_ = field(f, "tp") ? to_int32(*field(f, "tp"), "Executor: tp") : 1;
    make_tp_layout(weights_.config, tp_degree_);  // refuses, naming the field, what cannot shard
    LS_REQUIRE(backend_name_ == "cuda" || !field(f, "cuda_graphs"),
               "Executor: cuda_graphs applies to backend='cuda', not '{}'", backend_name_);
    for (const char* used : {"model", "backend", "weights_seed", "drafter", "want_logprobs",
                             "capture_logits", "capture_next_input_ids", "cuda_graphs",
                             "context_beyond_max_positions", "tp"}) {
      f.erase(used);
    }
    config_ = executor_config_from_fields(f, "Executor");
    check_context_length(weights_.config, config_.context_length, beyond_max_positions);
    LS_REQUIRE(drafter_ == kNoDrafterName || config_.verify_width > 1,
               "Executor: drafter '{}' proposes W - 1 drafts per step: it needs verify_width >= 2", drafter_);
    // The digest a recording's header carries, once the options are checked: beside the backend's
    // start, and for every record() of this executor.
    weights_digest_ = weights_.digest_in_background();
    backend_ = make_backend(BackendSpec{.name = backend_name_,
                                        .drafter = drafter_,
                                        .tp_degree = tp_degree_,
                                        .cuda_graphs = graphs},
                            weights_, config_);
    executor_ = std::make_unique<Executor>(config_, weights_.config.vocab_size, *backend_, options_);
  }

  std::shared_ptr<StepState> submit(const ForwardOp& op) {
    require_open("submit");
    auto state = std::make_shared<StepState>();
    state->step = next_step_++;
    state->prefill_rows = op.prefill_rows_count();
    {
      py::gil_scoped_release release;
      const std::lock_guard<std::mutex> lock(mutex_);
      if (synchronous()) drain();  // the state a recorder or capture reads must be this step's
      if (recorder_) {
        recorder_->record_input(state->step, op, pending_cache_ops_, StepFaults{});
        pending_cache_ops_.clear();
      }
      try {
        executor_->submit(op);
      } catch (const Error& e) {
        // The step index stays used (a trace allows gaps): a recorder may hold its input.
        if (recorder_ && op_is_valid(op)) recorder_->record_rejection(state->step, e.what());
        throw Error(with_seed_field(e, op));
      }
      in_flight_.push_back({state, op});
      if (synchronous()) collect_oldest();
    }
    return state;
  }

  // Collects the oldest step in flight into its state. Call without the GIL.
  void collect_oldest() {
    LS_REQUIRE(!in_flight_.empty(), "Executor: collect() with no step in flight");
    Pending p = std::move(in_flight_.front());
    in_flight_.pop_front();
    executor_->collect(p.state->result);
    if (synchronous()) read_state_after(p);
    p.state->done = true;
  }

  std::shared_ptr<StepState> collect() {
    require_open("collect");
    LS_REQUIRE(!in_flight_.empty(), "Executor: collect() with no step in flight");
    std::shared_ptr<StepState> state = in_flight_.front().state;
    py::gil_scoped_release release;
    const std::lock_guard<std::mutex> lock(mutex_);
    collect_oldest();
    return state;
  }

  void sync(const std::shared_ptr<StepState>& state) {
    if (state->done) return;
    require_open("sync");  // close() finished every step, unless finishing one failed
    py::gil_scoped_release release;
    const std::lock_guard<std::mutex> lock(mutex_);
    while (!state->done) collect_oldest();
  }

  // `state_slot`: −1, or the recurrent-state slot copied with the pages (core checks it).
  void copy_pages(const std::string& kind, const std::vector<int32_t>& device_pages,
                  const std::vector<int32_t>& host_pages, int32_t state_slot) {
    LS_REQUIRE(kind == "swap_out" || kind == "swap_in",
               "copy_pages: kind must be 'swap_out' or 'swap_in', got '{}'", kind);
    CacheOp op{kind == "swap_out" ? CacheOpKind::kSwapOut : CacheOpKind::kSwapIn, device_pages,
               host_pages, state_slot};
    LS_REQUIRE(op.device_pages.size() == op.host_pages.size(),
               "copy_pages: {} device_pages but {} host_pages (they pair up)", op.device_pages.size(),
               op.host_pages.size());
    require_open("copy_pages");
    py::gil_scoped_release release;
    const std::lock_guard<std::mutex> lock(mutex_);
    executor_->copy_pages(op);
    if (recorder_) pending_cache_ops_.push_back(std::move(op));
  }

  void record(const std::string& path) {
    require_open("record");
    LS_REQUIRE(!recorder_, "Executor.record: already recording; call stop_recording() first");
    LS_REQUIRE(in_flight_.empty(), "Executor.record: {} steps are in flight; sync them first", in_flight_.size());
    uint64_t weights_digest = 0;
    {
      py::gil_scoped_release release;
      weights_digest = weights_digest_.get();
    }
    trace::TraceHeader header = trace::make_trace_header(weights_, weights_digest, source_, config_,
                                                         backend_->name(),
                                                         machine_info_for(backend_name_));
    header.executor_options = options_;  // what this executor captures, not what a recording would ask
    header.drafter = drafter_;
    header.tp_degree = tp_degree_;
    describe_collectives(backend_name_, tp_degree_, header);
    if (!options_.capture_logits) header.top_logits_count = 0;
    recorder_ = trace::Recorder::open(path, header);
  }

  void stop_recording() {
    LS_REQUIRE(recorder_, "Executor.stop_recording: not recording");
    py::gil_scoped_release release;
    const std::lock_guard<std::mutex> lock(mutex_);
    drain();
    recorder_->close();
    recorder_.reset();
  }

  int32_t tp_degree() const { return tp_degree_; }

  py::dict read_state(const std::vector<int32_t>& pool_rows) {
    require_open("read_state");
    for (size_t i = 0; i < pool_rows.size(); ++i) {
      LS_REQUIRE(pool_rows[i] >= 0 && pool_rows[i] < config_.pool_rows_count(),
                 "read_state: pool_rows[{}] = {} is outside [0, {})", i, pool_rows[i], config_.pool_rows_count());
    }
    StateSnapshot s;
    {
      py::gil_scoped_release release;
      const std::lock_guard<std::mutex> lock(mutex_);
      s = backend_->read_state(pool_rows);
    }
    py::dict d;
    const auto n = static_cast<py::ssize_t>(pool_rows.size());
    d["pool_rows"] = to_numpy(s.pool_rows);
    d["valid_cache_lengths"] = to_numpy(s.valid_cache_length);
    d["future_input_ids"] = to_numpy(s.future_inputs).reshape({n, static_cast<py::ssize_t>(config_.verify_width)});
    d["req_to_page"] = to_numpy(s.table).reshape({n, static_cast<py::ssize_t>(config_.table_width())});
    return d;
  }

  py::dict last_inputs() {
    require_open("last_inputs");
    InputSnapshot s;
    {
      py::gil_scoped_release release;
      const std::lock_guard<std::mutex> lock(mutex_);
      s = backend_->read_inputs();
    }
    py::dict d;
    d["input_ids"] = to_numpy(s.input_ids);
    d["positions"] = to_numpy(s.positions);
    d["out_cache_loc"] = to_numpy(s.slots);
    return d;
  }

  // Steps still in flight complete before the backend's buffers go away; a recording is closed.
  ~PyExecutor() {
    py::gil_scoped_release release;
    try {
      drain();
      if (recorder_) recorder_->close();
    } catch (const std::exception& e) {
      fmt::print(stderr, "lockstep.Executor: finishing the steps in flight or the recording failed: {}\n",
                 e.what());
    }
  }

  const ExecutorConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const std::string& backend_name() const { return backend_name_; }
  int32_t in_flight_count() const { return static_cast<int32_t>(in_flight_.size()); }
  bool runs_ahead() const { return executor_ && executor_->runs_ahead() && !synchronous(); }
  bool closed() const { return executor_ == nullptr; }

  // Finishes the steps in flight and closes a recording (its footer written), then frees the
  // backend — on CUDA its weights, KV pool and workspaces — without waiting for Python to collect
  // the object. Once closed, every call that needs the executor is an Error; closing again does
  // nothing. Whatever finishing the steps or the recording raises is raised after the backend is
  // freed.
  void close() {
    if (closed()) return;
    std::exception_ptr error;
    {
      py::gil_scoped_release release;
      const std::lock_guard<std::mutex> lock(mutex_);
      try {
        drain();
      } catch (...) {
        error = std::current_exception();
      }
      try {
        if (recorder_) recorder_->close();
      } catch (...) {
        if (!error) error = std::current_exception();
      }
      recorder_.reset();
      in_flight_.clear();
      executor_.reset();
      backend_.reset();
    }
    if (error) std::rethrow_exception(error);
  }
  bool recording() const { return recorder_ != nullptr; }
  bool captures_next_input_ids() const { return capture_next_; }

 private:
  struct Pending {
    std::shared_ptr<StepState> state;
    ForwardOp op;
  };

  void require_open(std::string_view call) const {
    LS_REQUIRE(!closed(), "Executor.{}: the executor is closed", call);
  }

  // Recording and next_input_ids read the device state a step left, so such steps complete
  // before the next one is submitted (the C++ serving loop does the same with an observer).
  bool synchronous() const { return recorder_ != nullptr || capture_next_; }
  void drain() {
    while (!in_flight_.empty()) collect_oldest();
  }

  static bool op_is_valid_for(const ForwardOp& op, const ExecutorConfig& c, int32_t vocab,
                              bool recurrent_state) {
    try {
      validate_forward_op(op, c, vocab, recurrent_state);
      return true;
    } catch (const Error&) {
      return false;
    }
  }
  // The recorder writes the rejection itself for an op that fails validation.
  bool op_is_valid(const ForwardOp& op) const {
    return op_is_valid_for(op, config_, weights_.config.vocab_size,
                           weights_.config.has_recurrent_state());
  }

  void read_state_after(const Pending& p) {
    const StateSnapshot touched = backend_->read_state(pool_rows_of(p.op));
    if (capture_next_) {
      const size_t width = static_cast<size_t>(config_.verify_width);
      const size_t ne = static_cast<size_t>(p.state->prefill_rows);
      p.state->next_input_ids = std::vector<int32_t>(touched.future_inputs.begin(),
                                                     touched.future_inputs.begin() + static_cast<std::ptrdiff_t>(ne * width));
    }
    if (!recorder_) return;
    // A trace of a model with Mamba layers digests each row's working slot after the step (the
    // header says so: make_trace_header), which this executor's steps do not compute.
    if (weights_.config.has_recurrent_state()) {
      std::vector<int32_t> working;
      for (const OpRow& row : p.op.rows) working.push_back(row.mamba_working);
      p.state->result.mamba_state_digests = backend_->read_mamba_digests(working);
    }
    recorder_->record_output(p.state->step, p.state->result, touched);
  }

 public:
  static bool has_cuda() { return backend_name_error("cuda").empty(); }

 private:
  ModelWeights weights_;
  std::shared_future<uint64_t> weights_digest_;  // of weights_, computed once (record())
  WeightSource source_;
  std::string backend_name_;
  std::string drafter_;
  int32_t tp_degree_ = 1;  // tensor-parallel ranks (core/tensor_parallel.h)
  ExecutorOptions options_;
  bool capture_next_ = false;
  ExecutorConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Executor> executor_;
  std::deque<Pending> in_flight_;
  std::unique_ptr<trace::Recorder> recorder_;
  std::vector<CacheOp> pending_cache_ops_;
  int64_t next_step_ = 0;
  // Held while the GIL is released: another Python thread may call in meanwhile.
  std::mutex mutex_;
};

void PyResult::sync() {
  if (!state_->done) executor_->sync(state_);
}

int32_t PyResult::width() const { return executor_->config().verify_width; }

PyResult make_result(std::shared_ptr<StepState> state, py::object self) {
  PyExecutor* executor = self.cast<PyExecutor*>();
  return PyResult(std::move(state), executor, std::move(self));
}

}  // namespace

void bind_executor(py::module_& m) {
  m.attr("has_cuda") = PyExecutor::has_cuda();
  m.def("cuda_device_available", []() {
#ifdef LOCKSTEP_HAVE_CUDA
    return cuda_device_available();
#else
    return false;
#endif
  });
  m.def("model_names", &model_config_names);
  m.def("model_config", [](const std::string& name) { return model_config_to_dict(model_config_named(name)); },
        py::arg("name"), "The shape of a named model (no weights are made).");

  py::class_<PyResult>(m, "Result", "One step's outputs, with the seed's ModelExecutionResult layout.")
      .def("sync", &PyResult::sync, "Wait for the step (and any older one) and make its outputs readable.")
      .def_property_readonly("ready", &PyResult::ready)
      .def_property_readonly("step", &PyResult::step)
      .def_property_readonly("output_tokens", [](PyResult& r) { return to_numpy(r.result().tokens); })
      .def_property_readonly("output_lengths", [](PyResult& r) { return to_numpy(r.result().accepted_lengths); })
      .def_property_readonly("output_logprobs", [](PyResult& r) -> py::object {
        const StepResult& s = r.result();
        if (s.logprobs.empty()) return py::none();
        return to_numpy(s.logprobs);
      })
      .def_property_readonly("output_nan_flags", [](PyResult& r) { return flags_to_numpy(r.result().nan_flags); })
      .def_property_readonly("output_oov_flags", [](PyResult& r) { return flags_to_numpy(r.result().oov_flags); })
      .def_property_readonly("next_input_ids", [](PyResult& r) { return r.next_input_ids(r.width()); })
      .def_property_readonly("mode", [](PyResult& r) { return std::string(to_string(r.result().mode)); })
      .def_property_readonly("logits", [](PyResult& r) -> py::object {
        // [logits rows, V] float32 with capture_logits=True: one row per prefill row, W per decode row.
        const StepResult& s = r.result();
        if (s.logits.empty()) return py::none();
        const auto rows = static_cast<py::ssize_t>(s.prefill_rows_count +
                                                   (s.accepted_lengths.size() - s.prefill_rows_count) * s.verify_width);
        return to_numpy(s.logits).reshape({rows, static_cast<py::ssize_t>(s.logits.size()) / std::max<py::ssize_t>(rows, 1)});
      })
      .def_property_readonly("copy_event", [](const PyResult&) { return py::none(); })
      .def_property_readonly("grammar_completion", [](const PyResult&) { return py::none(); })
      .def("row_tokens", [](PyResult& r, int32_t row) {
        const StepResult& s = r.result();
        LS_REQUIRE(row >= 0 && static_cast<size_t>(row) < s.accepted_lengths.size(),
                   "row_tokens: row {} of a {}-row step", row, s.accepted_lengths.size());
        return s.row_tokens(row);
      });

  py::class_<PyExecutor>(m, "Executor", "lockstep's executor over the CPU reference or the CUDA backend.")
      .def(py::init([](const py::kwargs& kwargs) { return std::make_unique<PyExecutor>(kwargs); }))
      .def("submit", [](py::object self, const PyForwardOp& op) {
        return make_result(self.cast<PyExecutor&>().submit(op.op), self);
      }, py::arg("op"))
      .def("collect", [](py::object self) { return make_result(self.cast<PyExecutor&>().collect(), self); })
      .def("step", [](py::object self, const PyForwardOp& op) {
        PyResult r = make_result(self.cast<PyExecutor&>().submit(op.op), self);
        r.sync();
        return r;
      }, py::arg("op"))
      .def("copy_pages", [](PyExecutor& e, const std::string& kind, const std::vector<int32_t>& device_pages,
                            const std::vector<int32_t>& host_pages, py::handle state_slot) {
        e.copy_pages(kind, device_pages, host_pages, to_int32(state_slot, "copy_pages: state_slot"));
      }, py::arg("kind"), py::arg("device_pages"), py::arg("host_pages"), py::arg("state_slot") = -1)
      .def("record", [](PyExecutor& e, py::handle path) { e.record(to_string_value(path, "record: path")); },
           py::arg("path"))
      .def("stop_recording", &PyExecutor::stop_recording)
      .def("read_state", &PyExecutor::read_state, py::arg("pool_rows"))
      .def("last_inputs", &PyExecutor::last_inputs)
      .def("close", &PyExecutor::close,
           "Finish the steps in flight and the recording, then free the backend (device memory on "
           "CUDA). Idempotent; the executor refuses every later step.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyExecutor& e, py::handle, py::handle, py::handle) { e.close(); })
      .def_property_readonly("closed", &PyExecutor::closed)
      .def_property_readonly("in_flight_count", &PyExecutor::in_flight_count)
      .def_property_readonly("runs_ahead", &PyExecutor::runs_ahead)
      .def_property_readonly("recording", &PyExecutor::recording)
      .def_property_readonly("captures_next_input_ids", &PyExecutor::captures_next_input_ids)
      .def_property_readonly("backend", &PyExecutor::backend_name)
      .def_property_readonly("tp", &PyExecutor::tp_degree)
      .def_property_readonly("vocab_size", [](const PyExecutor& e) { return e.weights().config.vocab_size; })
      .def_property_readonly("model", [](const PyExecutor& e) { return model_config_to_dict(e.weights().config); })
      .def_property_readonly("limits", [](const PyExecutor& e) { return executor_config_to_dict(e.config()); });
}

}  // namespace ls::py_bindings
