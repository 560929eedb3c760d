#include "trace/reader.h"

#include "core/check.h"
#include "trace/checks.h"
#include "trace/codec.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ls::trace {

namespace {

// capnp's own bound on segments per message; a larger count is corruption, not a big record.
constexpr uint64_t kSegmentsMax = 512;
constexpr uint64_t kNestingLimit = 16;
// A record is read once; the slack covers capnp's per-pointer accounting.
constexpr uint64_t kTraversalFactor = 8;
constexpr uint64_t kTraversalSlackWords = 1024;

// A read-only private mapping of a whole file. One owner; moves, never copies.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::filesystem::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    LS_REQUIRE(fd >= 0, "cannot open trace {}: {}", path.string(), std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      throw Error(fmt::format("cannot stat trace {}: {}", path.string(), std::strerror(err)));
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > 0) {
      void* addr = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      const int err = errno;
      ::close(fd);
      LS_REQUIRE(addr != MAP_FAILED, "cannot map trace {}: {}", path.string(), std::strerror(err));
      data_ = static_cast<const kj::byte*>(addr);
      ::madvise(addr, size_, MADV_SEQUENTIAL);
    } else {
      ::close(fd);
    }
  }
  ~MappedFile() { reset(); }
  MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }
  MappedFile& operator=(MappedFile&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const kj::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Drops the pages of [begin, end) from this process; they stay in the page cache.
  void release(uint64_t begin, uint64_t end) const {
    if (data_ != nullptr && end > begin) {
      ::madvise(const_cast<kj::byte*>(data_) + begin, end - begin, MADV_DONTNEED);
    }
  }

 private:
  void reset() {
    if (data_ != nullptr) ::munmap(const_cast<kj::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }
  const kj::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

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
  if (open_step) {
    std::string text =
        fmt::format("trace ends inside step {}; {} complete steps", *open_step, complete_steps);
    if (trailing_bytes > 0) text += fmt::format(" ({} bytes of a partial record)", trailing_bytes);
    return text;
  }
  return fmt::format("trace ends inside a record after {} complete steps ({} bytes of a partial "
                     "record)",
                     complete_steps, trailing_bytes);
}

struct TraceReader::Impl {
  enum class Frame { kEnd, kPartial, kWhole };

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

  Frame frame(uint64_t& message_bytes) const;
  void read_header();
  bool next(TraceRecord& out);
  enum class Read { kRecord, kSkipped, kEnd };
  Read read_record(TraceRecord& out);
  std::string where() const;
  void advance(uint64_t message_bytes);
};

TraceReader::Impl::Frame TraceReader::Impl::frame(uint64_t& message_bytes) const {
  const uint64_t remaining = size - pos;
  if (remaining == 0) return Frame::kEnd;
  if (remaining < 8) return Frame::kPartial;
  const kj::byte* p = data + pos;
  const uint64_t segments = uint64_t{load_u32(p)} + 1;
  LS_REQUIRE(segments <= kSegmentsMax, "corrupt message framing: {} segments (at most {})",
             segments, kSegmentsMax);
  const uint64_t table_bytes = (4 + 4 * segments + 7) / 8 * 8;
  if (remaining < table_bytes) return Frame::kPartial;
  uint64_t words = 0;
  for (uint64_t s = 0; s < segments; ++s) words += load_u32(p + 4 + 4 * s);
  message_bytes = table_bytes + words * 8;
  LS_REQUIRE(message_bytes <= kRecordBytesMax,
             "corrupt message framing: a record of {} bytes exceeds the {} byte limit",
             message_bytes, kRecordBytesMax);
  return message_bytes <= remaining ? Frame::kWhole : Frame::kPartial;
}

std::string TraceReader::Impl::where() const {
  std::string text = fmt::format("{}: record {} (", name, records_read);
  if (step) text += fmt::format("step {} ", *step);
  text += fmt::format("{}, byte offset {})", kind_label, pos);
  return text;
}

void TraceReader::Impl::advance(uint64_t message_bytes) {
  pos += message_bytes;
  ++records_read;
  if (mapped.data() != nullptr && pos - released >= options.release_window_bytes) {
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t until = pos / page * page;
    mapped.release(released, until);
    released = until;
  }
}

void TraceReader::Impl::read_header() {
  LS_REQUIRE(size > 0, "{}: empty file, not a lockstep trace", name);
  kind_label = "header";
  try {
    uint64_t bytes = 0;
    const Frame f = frame(bytes);
    LS_REQUIRE(f == Frame::kWhole, "the file ends inside the header ({} bytes): not a complete "
               "lockstep trace", size);
    capnp::ReaderOptions limits;
    limits.traversalLimitInWords = bytes / 8 * kTraversalFactor + kTraversalSlackWords;
    limits.nestingLimit = kNestingLimit;
    capnp::FlatArrayMessageReader message(
        kj::arrayPtr(reinterpret_cast<const capnp::word*>(data), bytes / 8), limits);
    const auto root = message.getRoot<schema::Record>();
    LS_REQUIRE(root.which() == schema::Record::HEADER,
               "the first record is not a header: not a lockstep trace");
    const auto h = root.getHeader();
    LS_REQUIRE(h.getMagic() == schema::TRACE_MAGIC, "bad magic {:#x}: not a lockstep trace",
               h.getMagic());
    codec::decode(h, header);
    check_header(header);
    advance(bytes);
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
  } catch (const Error& e) {
    failure = fmt::format("{}: {}", where(), e.what());
  } catch (const kj::Exception& e) {
    failure = fmt::format("{}: corrupt record: {}", where(), e.getDescription().cStr());
  }
  throw Error(failure);
}

TraceReader::Impl::Read TraceReader::Impl::read_record(TraceRecord& out) {
  uint64_t bytes = 0;
  const Frame f = frame(bytes);
  if (f != Frame::kWhole) {
    ended = true;
    const uint64_t trailing = size - pos;
    if (trailing > 0 || sequence->has_open_step()) {
      LS_REQUIRE(!footer, "{} bytes follow the footer", trailing);
      truncation = TraceTruncation{
          .complete_steps = sequence->complete_steps(),
          .open_step = sequence->has_open_step()
                           ? std::optional<int64_t>(sequence->oldest_open().step)
                           : std::nullopt,
          .complete_bytes = pos,
          .trailing_bytes = trailing};
    }
    return Read::kEnd;
  }
  LS_REQUIRE(!footer, "a record follows the footer");
  capnp::ReaderOptions limits;
  limits.traversalLimitInWords = bytes / 8 * kTraversalFactor + kTraversalSlackWords;
  limits.nestingLimit = kNestingLimit;
  capnp::FlatArrayMessageReader message(
      kj::arrayPtr(reinterpret_cast<const capnp::word*>(data + pos), bytes / 8), limits);
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
  impl->mapped = MappedFile(path);
  impl->data = impl->mapped.data();
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
