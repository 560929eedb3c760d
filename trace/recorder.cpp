#include "trace/recorder.h"

#include "core/check.h"
#include "trace/checks.h"
#include "trace/codec.h"
#include "trace/digests.h"
#include "trace/framing.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include <pthread.h>
#include <sys/resource.h>

namespace ls::trace {

namespace {

constexpr size_t kFreeItemsMax = 1024;
constexpr int kWriterNice = 10;
constexpr uint64_t kItemOverheadBytes = 128;
// The first segment every record is built in, reused (capnp zeroes what it used when the builder
// is destroyed): a record that fits allocates nothing. 128 KiB holds a batch-256 output record.
constexpr size_t kScratchWords = size_t{16} << 10;

// One queued record. Items are recycled so that their vectors keep their capacity.
struct Item {
  enum class Kind : uint8_t { kInput, kRawOutput, kOutput, kEvent, kStats } kind = Kind::kInput;
  int64_t step = 0;
  StepInputRecord input;    // kInput
  StepResult result;        // kRawOutput
  StateSnapshot touched;    // kRawOutput
  StepOutputRecord output;  // kOutput
  TraceEvent event;         // kEvent
  StepStatsRecord stats;    // kStats
  uint64_t bytes = 0;       // estimate of the memory this record holds, for the in-flight bound
};

template <typename T>
uint64_t bytes_of(const std::vector<T>& v) {
  return v.size() * sizeof(T);
}

uint64_t bytes_of(const ForwardOp& op) {
  uint64_t bytes = bytes_of(op.rows) + bytes_of(op.prefill_token_ids);
  for (const OpRow& row : op.rows) bytes += bytes_of(row.refresh.pages);
  return bytes;
}

uint64_t bytes_of(const StateSnapshot& s) {
  return bytes_of(s.pool_rows) + bytes_of(s.valid_cache_length) + bytes_of(s.future_inputs) +
         bytes_of(s.table);
}

uint64_t bytes_of(const StepResult& r) {
  return bytes_of(r.tokens) + bytes_of(r.accepted_lengths) + bytes_of(r.logprobs) +
         bytes_of(r.nan_flags) + bytes_of(r.oov_flags) + bytes_of(r.logits) +
         bytes_of(r.logits_digests) + bytes_of(r.top_logits) + bytes_of(r.state) +
         bytes_of(r.mamba_state_digests);
}

uint64_t bytes_of(const StepOutputRecord& o) {
  return bytes_of(o.result) + bytes_of(o.logits_digests) + bytes_of(o.valid_cache_lengths) +
         bytes_of(o.future_input_digests) + bytes_of(o.top_logits) + bytes_of(o.drafts) +
         bytes_of(o.mamba_state_digests) + bytes_of(o.activation_digests);
}

// Appends capnp's stream framing to a byte vector.
class VectorOutput final : public kj::OutputStream {
 public:
  explicit VectorOutput(std::vector<kj::byte>& out) : out_(out) {}
  void write(const void* buffer, size_t size) override {
    const auto* bytes = static_cast<const kj::byte*>(buffer);
    out_.insert(out_.end(), bytes, bytes + size);
  }

 private:
  std::vector<kj::byte>& out_;
};

void write_all(int fd, const kj::byte* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    LS_REQUIRE(n > 0, "trace write failed: {}", std::strerror(errno));
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

struct Recorder::State {
  State(const TraceHeader& h, RecorderOptions o)
      : header(h),
        options(o),
        wake_bytes(std::max<uint64_t>(1, std::min(o.write_batch_bytes, o.max_in_flight_bytes / 2))),
        sequence(header) {}

  const TraceHeader header;
  const RecorderOptions options;
  const uint64_t wake_bytes;  // queued bytes that wake the writer before its period ends
  std::filesystem::path path;
  int fd = -1;

  // Writer-thread state (the caller's thread touches it only before start and after join).
  TraceSequence sequence;
  std::vector<kj::byte> buffer;
  uint64_t file_offset = 0;
  std::vector<uint64_t> step_offsets;  // of step inputs 0, stride, 2·stride, …
  StepOutputRecord scratch_output;
  std::vector<capnp::word> scratch_segment = std::vector<capnp::word>(kScratchWords);  // zeroed
  int64_t records_appended = 0;  // published to `stats` by flush()
  int64_t rejected_ops = 0;

  // Shared, under `mutex`.
  mutable std::mutex mutex;
  std::condition_variable has_work;
  std::condition_variable has_space;
  // Swapped whole with the writer's batch, so neither allocates once both have grown.
  std::vector<std::unique_ptr<Item>> queue;
  std::vector<std::unique_ptr<Item>> free_items;
  uint64_t in_flight_bytes = 0;
  bool writer_waiting = false;
  bool closing = false;
  bool closed = false;
  std::string error;  // the first I/O error; set once
  RecorderStats stats;

  std::thread writer;

  std::unique_ptr<Item> take_item();
  void push(std::unique_ptr<Item> item);
  void writer_main();
  void process(Item& item);
  template <typename Record, typename Encode>
  void append(const Record& record, Encode encode);
  void flush();
};

std::unique_ptr<Item> Recorder::State::take_item() {
  std::lock_guard lock(mutex);
  LS_REQUIRE(error.empty(), "trace recorder {}: {}", path.string(), error);
  LS_ASSERT(!closing, "a record after Recorder::close()");
  if (free_items.empty()) return std::make_unique<Item>();
  std::unique_ptr<Item> item = std::move(free_items.back());
  free_items.pop_back();
  return item;
}

void Recorder::State::push(std::unique_ptr<Item> item) {
  bool wake = false;
  {
    std::unique_lock lock(mutex);
    const uint64_t bytes = item->bytes;
    // A record larger than the bound still goes through once the queue has drained.
    auto fits = [&] {
      return in_flight_bytes + bytes <= options.max_in_flight_bytes || in_flight_bytes == 0 ||
             !error.empty();
    };
    if (!fits()) {
      if (writer_waiting) has_work.notify_one();  // it would otherwise sleep out its period
      const auto begin = std::chrono::steady_clock::now();
      has_space.wait(lock, fits);
      ++stats.waits;
      stats.wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - begin)
                           .count();
    }
    LS_REQUIRE(error.empty(), "trace recorder {}: {}", path.string(), error);
    in_flight_bytes += bytes;
    stats.in_flight_bytes_max = std::max(stats.in_flight_bytes_max, in_flight_bytes);
    queue.push_back(std::move(item));
    // Waking the writer costs a futex call and a thread switch per record, which on a busy host
    // showed in the serving loop's step time; the writer wakes itself every writer_period and
    // is woken early only once a write batch's worth waits.
    wake = writer_waiting && in_flight_bytes >= wake_bytes;
  }
  if (wake) has_work.notify_one();
}

// One frame: the header (sealed once the message is in place) and the message.
template <typename Record, typename Encode>
void Recorder::State::append(const Record& record, Encode encode) {
  capnp::MallocMessageBuilder message(kj::arrayPtr(scratch_segment.data(), scratch_segment.size()));
  encode(record, message.initRoot<schema::Record>());
  const size_t frame_at = buffer.size();
  buffer.resize(frame_at + framing::kFrameHeaderBytes);
  VectorOutput out(buffer);
  capnp::writeMessage(out, message);
  const uint64_t payload_bytes = buffer.size() - frame_at - framing::kFrameHeaderBytes;
  LS_REQUIRE(payload_bytes <= kRecordBytesMax,
             "trace record of {} bytes exceeds the {} byte limit of one record", payload_bytes,
             kRecordBytesMax);
  framing::seal_frame(buffer.data() + frame_at, payload_bytes, file_offset + frame_at);
  ++records_appended;
}

void Recorder::State::process(Item& item) {
  switch (item.kind) {
    case Item::Kind::kInput: {
      try {
        check_step_input(item.input, header, /*full=*/true);
      } catch (const Error& e) {
        item.event = TraceEvent{.kind = EventKind::kStepRejected, .step = item.input.step,
                                .detail = e.what()};
        item.kind = Item::Kind::kEvent;
        ++rejected_ops;
        process(item);
        return;
      }
      try {
        sequence.on_input(item.input, /*full_op_check=*/false);
      } catch (const Error& e) {
        LS_ASSERT(false, "recorder: step input breaks the trace's ordering: {}", e.what());
      }
      if ((sequence.inputs_count() - 1) % header.index_stride == 0) {
        step_offsets.push_back(file_offset + buffer.size());
      }
      append(item.input, [](const StepInputRecord& r, schema::Record::Builder root) {
        codec::encode(r, root.initStepInput());
      });
      return;
    }
    case Item::Kind::kRawOutput:
      fill_step_output(scratch_output, item.step, item.result, item.touched,
                       header.top_logits_count);
      std::swap(scratch_output, item.output);
      [[fallthrough]];
    case Item::Kind::kOutput:
      try {
        sequence.on_output(item.output);
      } catch (const Error& e) {
        // The caller's records do not match its own header (e.g. an executor that does not
        // compute the digests the header promises): an error for the caller, as an I/O error
        // is (every later record_* call and close() throw it); the records before it stay.
        throw Error(fmt::format("step output {} does not match the trace's header: {} (an "
                                "executor recording with this header needs its options: "
                                "trace::recording_executor_options())",
                                item.output.step, e.what()));
      }
      append(item.output, [](const StepOutputRecord& r, schema::Record::Builder root) {
        codec::encode(r, root.initStepOutput());
      });
      return;
    case Item::Kind::kEvent:
      try {
        sequence.on_event(item.event);
      } catch (const Error& e) {
        throw Error(fmt::format("event of step {} is invalid: {}", item.event.step, e.what()));
      }
      append(item.event, [](const TraceEvent& r, schema::Record::Builder root) {
        codec::encode(r, root.initEvent());
      });
      return;
    case Item::Kind::kStats:
      try {
        sequence.on_stats(item.stats);
      } catch (const Error& e) {
        LS_ASSERT(false, "recorder: step stats are invalid: {}", e.what());
      }
      append(item.stats, [](const StepStatsRecord& r, schema::Record::Builder root) {
        codec::encode(r, root.initStepStats());
      });
      return;
  }
}

void Recorder::State::flush() {
  if (buffer.empty()) return;
  write_all(fd, buffer.data(), buffer.size());
  file_offset += buffer.size();
  buffer.clear();
  std::lock_guard lock(mutex);
  stats.bytes_written = file_offset;
  stats.records_written = records_appended;
  stats.rejected_ops = rejected_ops;
  ++stats.writes_count;
}

void Recorder::State::writer_main() {
  std::vector<std::unique_ptr<Item>> batch;
  for (;;) {
    {
      std::unique_lock lock(mutex);
      writer_waiting = true;
      has_work.wait_for(lock, options.writer_period, [&] {
        return in_flight_bytes >= wake_bytes || closing;
      });
      writer_waiting = false;
      if (queue.empty() && !closing) continue;
      if (queue.empty()) return;  // closing, and drained
      batch.swap(queue);
    }
    uint64_t batch_bytes = 0;
    bool failed = false;
    for (std::unique_ptr<Item>& item : batch) {
      batch_bytes += item->bytes;
      if (failed) continue;
      try {
        process(*item);
        if (buffer.size() >= options.write_batch_bytes) flush();
      } catch (const Error& e) {
        // The records before the failing one are whole frames: keep them in the file.
        const std::string what = e.what();
        try {
          flush();
        } catch (const Error&) {
        }
        std::lock_guard lock(mutex);
        if (error.empty()) error = what;
        failed = true;
      }
    }
    try {
      if (!failed) flush();
    } catch (const Error& e) {
      std::lock_guard lock(mutex);
      if (error.empty()) error = e.what();
    }
    {
      std::lock_guard lock(mutex);
      if (!error.empty()) buffer.clear();  // keep draining so callers never block forever
      in_flight_bytes -= batch_bytes;
      for (std::unique_ptr<Item>& item : batch) {
        if (free_items.size() < kFreeItemsMax) free_items.push_back(std::move(item));
      }
    }
    batch.clear();
    has_space.notify_all();
  }
}

Recorder::Recorder(std::unique_ptr<State> state) : state_(std::move(state)) {}

std::unique_ptr<Recorder> Recorder::open(const std::filesystem::path& path,
                                         const TraceHeader& header, RecorderOptions options) {
  check_header(header);
  // A trace is written in this build's format only (an older version's readers would skip what
  // it cannot hold: CacheOp.stateSlot).
  LS_REQUIRE(header.format_version == kFormatVersion, "recorder: header format_version {}: this "
             "build writes version {} only", header.format_version, kFormatVersion);
  LS_REQUIRE(options.max_in_flight_bytes > 0, "recorder: max_in_flight_bytes must be > 0");
  auto state = std::make_unique<State>(header, options);
  state->path = path;
  state->fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LS_REQUIRE(state->fd >= 0, "cannot create trace file {}: {}", path.string(), std::strerror(errno));
  try {
    state->buffer.resize(framing::kPreambleBytes);
    framing::write_preamble(state->buffer.data(), header.format_version);
    state->append(header, [](const TraceHeader& h, schema::Record::Builder root) {
      codec::encode(h, root.initHeader());
    });
    state->flush();
  } catch (...) {
    ::close(state->fd);
    throw;
  }
  State* raw = state.get();
  state->writer = std::thread([raw] {
    // Named so that `top -H`, perf and gdb tell it from the serving loop's thread.
    pthread_setname_np(pthread_self(), "ls-trace-writer");
    // Below the serving loop's priority: on a host whose cores are all busy the loop keeps its
    // share and the writer takes what is left; the in-flight bound (push() waits) stops a
    // starved writer from letting records pile up. Best effort: a refusal changes nothing else.
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), kWriterNice);
    raw->writer_main();
  });
  return std::unique_ptr<Recorder>(new Recorder(std::move(state)));
}

Recorder::~Recorder() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep: closing trace %s: %s\n", state_->path.c_str(), e.what());
  }
}

void Recorder::record_input(int64_t step, const ForwardOp& op) {
  record_input(step, op, {}, StepFaults{});
}

void Recorder::record_input(int64_t step, const ForwardOp& op, const std::vector<CacheOp>& cache_ops,
                            const StepFaults& faults) {
  std::unique_ptr<Item> item = state_->take_item();
  item->kind = Item::Kind::kInput;
  item->input.step = step;
  item->input.op = op;  // copy-assignment reuses the recycled vectors' capacity
  item->input.cache_ops = cache_ops;
  item->input.faults = faults;
  item->bytes = kItemOverheadBytes + bytes_of(op);
  for (const CacheOp& c : cache_ops) item->bytes += 8 * c.device_pages.size();
  state_->push(std::move(item));
}

void Recorder::record_input(StepInputRecord&& record) {
  std::unique_ptr<Item> item = state_->take_item();
  item->kind = Item::Kind::kInput;
  item->bytes = kItemOverheadBytes + bytes_of(record.op);
  item->input = std::move(record);
  state_->push(std::move(item));
}

void Recorder::record_output(int64_t step, const StepResult& result, const StateSnapshot& touched) {
  std::unique_ptr<Item> item = state_->take_item();
  item->kind = Item::Kind::kRawOutput;
  item->step = step;
  item->result = result;
  item->touched = touched;
  item->bytes = kItemOverheadBytes + bytes_of(result) + bytes_of(touched);
  state_->push(std::move(item));
}

void Recorder::record_output(int64_t step, StepResult&& result, StateSnapshot&& touched) {
  std::unique_ptr<Item> item = state_->take_item();
  item->kind = Item::Kind::kRawOutput;
  item->step = step;
  item->bytes = kItemOverheadBytes + bytes_of(result) + bytes_of(touched);
  item->result = std::move(result);
  item->touched = std::move(touched);
  state_->push(std::move(item));
}

void Recorder::record_output(StepOutputRecord&& record) {
  std::unique_ptr<Item> item = state_->take_item();
  item->kind = Item::Kind::kOutput;
  item->bytes = kItemOverheadBytes + bytes_of(record);
  item->output = std::move(record);
  state_->push(std::move(item));
}

void Recorder::record_event(TraceEvent event) {
  std::unique_ptr<Item> item = state_->take_item();
  item->kind = Item::Kind::kEvent;
  item->bytes = kItemOverheadBytes + event.detail.size();
  item->event = std::move(event);
  state_->push(std::move(item));
}

void Recorder::record_stats(const StepStatsRecord& stats) {
  std::unique_ptr<Item> item = state_->take_item();
  item->kind = Item::Kind::kStats;
  item->bytes = kItemOverheadBytes;
  item->stats = stats;
  state_->push(std::move(item));
}

void Recorder::record_rejection(int64_t step, std::string message) {
  record_event(TraceEvent{.kind = EventKind::kStepRejected, .step = step,
                          .detail = std::move(message)});
}

void Recorder::close() {
  State& s = *state_;
  {
    std::lock_guard lock(s.mutex);
    if (s.closed) return;
    s.closed = true;
    s.closing = true;
  }
  s.has_work.notify_one();
  s.writer.join();
  std::string error;
  {
    std::lock_guard lock(s.mutex);
    error = s.error;
  }
  if (error.empty() && s.options.write_footer) {
    const TraceFooter footer{.steps_count = s.sequence.inputs_count(),
                             .outputs_count = s.sequence.outputs_count(),
                             .events_count = s.sequence.events_count(),
                             .index_stride = s.header.index_stride,
                             .step_offsets = s.step_offsets};
    OffsetsDigest seen;
    for (uint64_t offset : s.step_offsets) seen.add(offset);
    try {
      s.sequence.on_footer(footer, seen);
    } catch (const Error& e) {
      LS_ASSERT(false, "recorder: footer is inconsistent: {}", e.what());
    }
    try {
      s.append(footer, [](const TraceFooter& f, schema::Record::Builder root) {
        codec::encode(f, root.initFooter());
      });
      s.flush();
    } catch (const Error& e) {
      error = e.what();
    }
  }
  if (error.empty() && s.options.fsync_on_close && ::fsync(s.fd) != 0) {
    error = fmt::format("fsync failed: {}", std::strerror(errno));
  }
  if (::close(s.fd) != 0 && error.empty()) {
    error = fmt::format("close failed: {}", std::strerror(errno));
  }
  s.fd = -1;
  if (!error.empty()) {
    std::lock_guard lock(s.mutex);
    if (s.error.empty()) s.error = error;
  }
  LS_REQUIRE(error.empty(), "trace recorder {}: {}", s.path.string(), error);
}

RecorderStats Recorder::stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->stats;
}

const TraceHeader& Recorder::header() const { return state_->header; }

}  // namespace ls::trace
