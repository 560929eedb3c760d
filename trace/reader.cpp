#include "trace/reader.h"

#include "core/check.h"
#include "core/mapped_file.h"
#include "trace/checks.h"
#include "trace/codec.h"
#include "trace/framing.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cerrno>
#include <cstring>

namespace ls::trace {

static_assert(schema::FORMAT_VERSION == kFormatVersion, "trace.capnp and records.h name one version");

namespace {

// capnp's own bound on segments per message; a larger count is corruption, not a big record.
constexpr uint64_t kSegmentsMax = 512;
constexpr uint64_t kNestingLimit = 16;
// A record is read once; the slack covers capnp's per-pointer accounting.
constexpr uint64_t kTraversalFactor = 8;
constexpr uint64_t kTraversalSlackWords = 1024;

uint32_t load_u32(const kj::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
T& reuse(TraceRecord& out) {
  if (T* held = std::get_if<T>(&out)) return *held;
  return out.emplace<T>();
}

}  // namespace

std::string TraceTruncation::describe() const {
  std::string text = fmt::format("the trace ends at byte {} without its footer (not closed: a "
                                 "killed process, or written without one) after {} complete "
                                 "records; {} complete steps",
                                 complete_bytes, complete_records, complete_steps);
  if (open_step) text += fmt::format("; step {} has no output", *open_step);
  text += trailing_bytes > 0
              ? fmt::format("; {} bytes of a partial record dropped", trailing_bytes)
              : std::string("; no partial record");
  return text;
}

struct TraceReader::Impl {

  std::string name;
  TraceReaderOptions options;
  MappedFile mapped;
  std::unique_ptr<capnp::word[]> owned;  // from_bytes: an aligned copy
  const kj::byte* data = nullptr;
  uint64_t size = 0;

  uint64_t pos = 0;
  uint64_t released = 0;
  int64_t records_read = 0;
  int64_t unknown_records = 0;
  TraceHeader header;
  std::optional<TraceSequence> sequence;
  OffsetsDigest offsets_seen;
  std::optional<TraceFooter> footer;
  std::optional<TraceTruncation> truncation;
  bool ended = false;
  std::string failure;  // set once next() has thrown

  // Context of the record being read, for error messages.
  const char* kind_label = "record";
  std::optional<int64_t> step;
  std::optional<int64_t> last_step;  // of the last record read that names one

  framing::Frame frame() const;
  capnp::FlatArrayMessageReader message_at(uint64_t payload_bytes) const;
  void read_preamble();
  [[noreturn]] void corrupt(const std::string& problem) const;
  void read_header();
  bool next(TraceRecord& out);
  enum class Read { kRecord, kSkipped, kEnd };
  Read read_record(TraceRecord& out);
  std::optional<int64_t> step_of_frame(uint64_t offset, uint64_t payload_bytes) const;
  std::string where() const;
  void advance(uint64_t message_bytes);
};

// The frame at `pos`; for a whole frame, also checks that the message's own segment table spans
// exactly the framed bytes (the writer's framing and capnp's must agree).
framing::Frame TraceReader::Impl::frame() const {
  framing::Frame f = framing::read_frame(data, size, pos, kRecordBytesMax, options.verify_checksums);
  if (f.status != framing::FrameStatus::kWhole) return f;
  const kj::byte* p = data + pos + framing::kFrameHeaderBytes;
  const uint64_t segments = uint64_t{load_u32(p)} + 1;
  const uint64_t table_bytes = (4 + 4 * segments + 7) / 8 * 8;
  uint64_t words = 0;
  if (segments <= kSegmentsMax && table_bytes <= f.payload_bytes) {
    for (uint64_t k = 0; k < segments; ++k) words += load_u32(p + 4 + 4 * k);
  }
  if (segments > kSegmentsMax || table_bytes > f.payload_bytes ||
      table_bytes + words * 8 != f.payload_bytes) {
    return {framing::FrameStatus::kCorrupt, f.payload_bytes,
            fmt::format("the message's segment table ({} segments) does not span its {} framed "
                        "bytes", segments, f.payload_bytes)};
  }
  return f;
}

std::string TraceReader::Impl::where() const {
  std::string text = fmt::format("{}: record {} (", name, records_read);
  if (step) text += fmt::format("step {} ", *step);
  text += fmt::format("{}, byte offset {})", kind_label, pos);
  return text;
}

void TraceReader::Impl::advance(uint64_t payload_bytes) {
  pos += framing::kFrameHeaderBytes + payload_bytes;
  ++records_read;
  if (mapped.data() != nullptr && pos - released >= options.release_window_bytes) {
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t until = pos / page * page;
    mapped.release(released, until);
    released = until;
  }
}

// The message of the whole frame at `pos`, with per-record limits.
capnp::FlatArrayMessageReader TraceReader::Impl::message_at(uint64_t payload_bytes) const {
  capnp::ReaderOptions limits;
  limits.traversalLimitInWords = payload_bytes / 8 * kTraversalFactor + kTraversalSlackWords;
  limits.nestingLimit = kNestingLimit;
  return capnp::FlatArrayMessageReader(
      kj::arrayPtr(reinterpret_cast<const capnp::word*>(data + pos + framing::kFrameHeaderBytes),
                   payload_bytes / 8),
      limits);
}

// A file without the preamble may be a trace of format version 1 (no framing): its first
// message is the header, which names the version. Refused by name, never misread.
void TraceReader::Impl::read_preamble() {
  LS_REQUIRE(size >= framing::kPreambleBytes,
             "the file ends inside the preamble ({} of {} bytes): not a complete lockstep trace",
             size, framing::kPreambleBytes);
  uint32_t version = 0;
  const framing::PreambleStatus status = framing::read_preamble(data, version);
  if (status == framing::PreambleStatus::kCorrupt) {
    throw Error("corrupt preamble: its check does not match (bytes 0..15)");
  }
  if (status == framing::PreambleStatus::kOk) {
    LS_REQUIRE(version != 2,
               "format version 2 is not supported: this build reads versions {} to {} only "
               "(version 2 records its logits digests by another definition); record the run "
               "again", kOldestReadableFormatVersion, kFormatVersion);
    LS_REQUIRE(version >= kOldestReadableFormatVersion && version <= kFormatVersion,
               "format version {} is not supported: this build reads versions {} to {} only",
               version, kOldestReadableFormatVersion, kFormatVersion);
    return;
  }
  std::optional<uint32_t> old_version;
  try {
    capnp::ReaderOptions limits;
    limits.traversalLimitInWords = 1 << 20;
    limits.nestingLimit = kNestingLimit;
    capnp::FlatArrayMessageReader message(
        kj::arrayPtr(reinterpret_cast<const capnp::word*>(data), size / 8), limits);
    const auto root = message.getRoot<schema::Record>();
    if (root.which() == schema::Record::HEADER && root.getHeader().getMagic() == schema::TRACE_MAGIC) {
      old_version = root.getHeader().getFormatVersion();
    }
  } catch (const kj::Exception&) {
  }
  LS_REQUIRE(old_version.has_value(), "no lockstep trace preamble (bad magic): not a lockstep trace");
  throw Error(fmt::format("format version {} (a trace without checksummed framing) is not "
                          "supported: this build reads versions {} to {} only; record the run "
                          "again", *old_version, kOldestReadableFormatVersion, kFormatVersion));
}

void TraceReader::Impl::read_header() {
  LS_REQUIRE(size > 0, "{}: empty file, not a lockstep trace", name);
  kind_label = "header";
  try {
    read_preamble();
    pos = framing::kPreambleBytes;
    const framing::Frame f = frame();
    LS_REQUIRE(f.status != framing::FrameStatus::kCorrupt, "corrupt header record: {}", f.problem);
    LS_REQUIRE(f.status == framing::FrameStatus::kWhole,
               "the file ends inside the header record ({} bytes): not a complete lockstep trace, "
               "nothing to replay", size);
    capnp::FlatArrayMessageReader message = message_at(f.payload_bytes);
    const auto root = message.getRoot<schema::Record>();
    LS_REQUIRE(root.which() == schema::Record::HEADER,
               "the first record is not a header: not a lockstep trace");
    const auto h = root.getHeader();
    LS_REQUIRE(h.getMagic() == schema::TRACE_MAGIC, "bad magic {:#x}: not a lockstep trace",
               h.getMagic());
    codec::decode(h, header);
    check_header(header);
    advance(f.payload_bytes);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", where(), e.what()));
  } catch (const kj::Exception& e) {
    throw Error(fmt::format("{}: corrupt record: {}", where(), e.getDescription().cStr()));
  }
  sequence.emplace(header);
}

bool TraceReader::Impl::next(TraceRecord& out) {
  LS_REQUIRE(failure.empty(), "{}: the reader already failed: {}", name, failure);
  if (ended) return false;
  try {
    for (;;) {
      kind_label = "record";
      step.reset();
      const Read read = read_record(out);
      if (read != Read::kSkipped) return read == Read::kRecord;
    }
  } catch (const TraceCorruption& e) {
    failure = e.what();
    throw;
  } catch (const Error& e) {
    failure = fmt::format("{}: {}", where(), e.what());
  } catch (const kj::Exception& e) {
    failure = fmt::format("{}: corrupt record: {}", where(), e.getDescription().cStr());
  }
  throw Error(failure);
}

// The step a whole frame's record names, if it decodes.
std::optional<int64_t> TraceReader::Impl::step_of_frame(uint64_t offset, uint64_t payload_bytes) const {
  try {
    capnp::ReaderOptions limits;
    limits.traversalLimitInWords = payload_bytes / 8 * kTraversalFactor + kTraversalSlackWords;
    limits.nestingLimit = kNestingLimit;
    capnp::FlatArrayMessageReader message(
        kj::arrayPtr(reinterpret_cast<const capnp::word*>(data + offset + framing::kFrameHeaderBytes),
                     payload_bytes / 8),
        limits);
    const auto root = message.getRoot<schema::Record>();
    switch (root.which()) {
      case schema::Record::STEP_INPUT: return root.getStepInput().getStep();
      case schema::Record::STEP_OUTPUT: return root.getStepOutput().getStep();
      case schema::Record::EVENT: return root.getEvent().getStep();
      default: return std::nullopt;
    }
  } catch (const kj::Exception&) {
    return std::nullopt;
  }
}

// Corruption inside the file: names where, and how much of the rest still checks out (frames
// start on 8-byte boundaries, so the scan tries each one after the bad frame).
void TraceReader::Impl::corrupt(const std::string& problem) const {
  int64_t intact = 0;
  uint64_t first_offset = 0;
  std::optional<int64_t> first_step;
  for (uint64_t o = pos + 8; o + framing::kFrameHeaderBytes <= size; o += 8) {
    const framing::Frame f = framing::read_frame(data, size, o, kRecordBytesMax);
    if (f.status != framing::FrameStatus::kWhole) continue;
    if (intact++ == 0) {
      first_offset = o;
      first_step = step_of_frame(o, f.payload_bytes);
    }
    o += framing::kFrameHeaderBytes + f.payload_bytes - 8;
  }
  std::string text = fmt::format("{}: corrupt record {} at byte offset {} (", name, records_read, pos);
  text += last_step ? fmt::format("after step {}", *last_step) : std::string("before any step");
  text += fmt::format("): {}; the file is damaged inside, not cut off: ", problem);
  if (intact == 0) {
    text += "no later record is intact";
  } else {
    text += fmt::format("{} later records are intact, the first at byte offset {}", intact,
                        first_offset);
    if (first_step) text += fmt::format(" (step {})", *first_step);
  }
  throw TraceCorruption(text);
}

TraceReader::Impl::Read TraceReader::Impl::read_record(TraceRecord& out) {
  const framing::Frame f = frame();
  if (f.status == framing::FrameStatus::kCorrupt) corrupt(f.problem);
  if (f.status != framing::FrameStatus::kWhole) {
    ended = true;
    const uint64_t trailing = size - pos;
    if (footer) {
      LS_REQUIRE(trailing == 0, "{} bytes follow the footer", trailing);
      return Read::kEnd;
    }
    // No footer: the writer did not close the file (killed, or a trace written without one).
    truncation = TraceTruncation{
        .complete_steps = sequence->complete_steps(),
        .open_step = sequence->has_open_step()
                         ? std::optional<int64_t>(sequence->oldest_open().step)
                         : std::nullopt,
        .complete_bytes = pos,
        .trailing_bytes = trailing,
        .complete_records = records_read};
    return Read::kEnd;
  }
  LS_REQUIRE(!footer, "a record follows the footer");
  const uint64_t bytes = f.payload_bytes;
  capnp::FlatArrayMessageReader message = message_at(bytes);
  const auto root = message.getRoot<schema::Record>();
  switch (root.which()) {
    case schema::Record::HEADER:
      kind_label = "header";
      throw Error("a second header");
    case schema::Record::STEP_INPUT: {
      kind_label = "input";
      const auto in = root.getStepInput();
      step = in.getStep();
      // Bound the lists before decoding them: they must fit the header's limits.
      LS_REQUIRE(in.getRows().size() <= static_cast<unsigned>(header.executor.max_batch_rows),
                 "rows: {} rows exceed max_batch_rows = {}", in.getRows().size(),
                 header.executor.max_batch_rows);
      LS_REQUIRE(in.getPrefillTokenIds().size() <=
                     static_cast<unsigned>(header.executor.prefill_chunk_tokens),
                 "prefill_token_ids: {} ids exceed prefill_chunk_tokens = {}",
                 in.getPrefillTokenIds().size(), header.executor.prefill_chunk_tokens);
      StepInputRecord& record = reuse<StepInputRecord>(out);
      codec::decode(in, record);
      sequence->on_input(record, options.validate_ops);
      if ((sequence->inputs_count() - 1) % header.index_stride == 0) offsets_seen.add(pos);
      break;
    }
    case schema::Record::STEP_OUTPUT: {
      kind_label = "output";
      const auto in = root.getStepOutput();
      step = in.getStep();
      const uint64_t outputs_max =
          static_cast<uint64_t>(header.executor.max_batch_rows) * header.executor.verify_width;
      LS_REQUIRE(in.getTokens().size() <= outputs_max && in.getTopLogits().size() <=
                     outputs_max * kTopLogitsCountMax,
                 "tokens ({}) or top_logits ({}) exceed the step's limits",
                 in.getTokens().size(), in.getTopLogits().size());
      StepOutputRecord& record = reuse<StepOutputRecord>(out);
      codec::decode(in, record);
      if (!record.top_logits.empty()) {
        record.top_logits_count = std::min(header.top_logits_count, header.model.vocab_size);
      }
      sequence->on_output(record);
      break;
    }
    case schema::Record::EVENT: {
      kind_label = "event";
      const auto in = root.getEvent();
      step = in.getStep();
      TraceEvent& event = reuse<TraceEvent>(out);
      codec::decode(in, event);
      sequence->on_event(event);
      break;
    }
    case schema::Record::STEP_STATS: {
      kind_label = "step stats";
      const auto in = root.getStepStats();
      step = in.getStep();
      StepStatsRecord& stats = reuse<StepStatsRecord>(out);
      codec::decode(in, stats);
      sequence->on_stats(stats);
      break;
    }
    case schema::Record::FOOTER: {
      kind_label = "footer";
      TraceFooter& record = reuse<TraceFooter>(out);
      codec::decode(root.getFooter(), record);
      sequence->on_footer(record, offsets_seen);
      footer = record;
      break;
    }
    default:
      // A record kind from a newer writer: skip it (schema evolution adds, never changes).
      ++unknown_records;
      advance(bytes);
      return Read::kSkipped;
  }
  advance(bytes);
  if (step) last_step = step;
  return Read::kRecord;
}

TraceReader::TraceReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TraceReader::~TraceReader() = default;
TraceReader::TraceReader(TraceReader&&) noexcept = default;
TraceReader& TraceReader::operator=(TraceReader&&) noexcept = default;

TraceReader TraceReader::open(const std::filesystem::path& path, TraceReaderOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->name = path.string();
  impl->options = options;
  impl->mapped = MappedFile(path, "trace");
  impl->mapped.advise_sequential();
  impl->data = reinterpret_cast<const kj::byte*>(impl->mapped.data());
  impl->size = impl->mapped.size();
  impl->read_header();
  return TraceReader(std::move(impl));
}

TraceReader TraceReader::from_bytes(std::span<const std::byte> bytes, TraceReaderOptions options,
                                    std::string name) {
  auto impl = std::make_unique<Impl>();
  impl->name = std::move(name);
  impl->options = options;
  const size_t words = (bytes.size() + 7) / 8;
  impl->owned = std::make_unique<capnp::word[]>(words);  // value-initialised: zero padding
  if (!bytes.empty()) std::memcpy(impl->owned.get(), bytes.data(), bytes.size());
  impl->data = reinterpret_cast<const kj::byte*>(impl->owned.get());
  impl->size = bytes.size();
  impl->read_header();
  return TraceReader(std::move(impl));
}

const TraceHeader& TraceReader::header() const { return impl_->header; }

bool TraceReader::next(TraceRecord& out) { return impl_->next(out); }

std::optional<TraceRecord> TraceReader::next() {
  TraceRecord record;
  if (!impl_->next(record)) return std::nullopt;
  return record;
}

int64_t TraceReader::records_read() const { return impl_->records_read; }
uint64_t TraceReader::offset() const { return impl_->pos; }
uint64_t TraceReader::file_bytes() const { return impl_->size; }
int64_t TraceReader::complete_steps() const { return impl_->sequence->complete_steps(); }
int64_t TraceReader::step_inputs_read() const { return impl_->sequence->inputs_count(); }
int64_t TraceReader::step_outputs_read() const { return impl_->sequence->outputs_count(); }
int64_t TraceReader::events_read() const { return impl_->sequence->events_count(); }
int64_t TraceReader::unknown_records_skipped() const { return impl_->unknown_records; }
bool TraceReader::at_end() const { return impl_->ended; }
std::optional<TraceTruncation> TraceReader::truncation() const { return impl_->truncation; }
const std::optional<TraceFooter>& TraceReader::footer() const { return impl_->footer; }

TraceSummary verify_trace(const std::filesystem::path& path, TraceReaderOptions options) {
  TraceReader reader = TraceReader::open(path, options);
  TraceRecord record;
  while (reader.next(record)) {
  }
  return TraceSummary{.header = reader.header(),
                      .records_count = reader.records_read(),
                      .step_inputs_count = reader.step_inputs_read(),
                      .step_outputs_count = reader.step_outputs_read(),
                      .events_count = reader.events_read(),
                      .complete_steps = reader.complete_steps(),
                      .has_footer = reader.footer().has_value(),
                      .truncation = reader.truncation()};
}

}  // namespace ls::trace
