#include "replay/trace_report.h"

#include "core/check.h"
#include "replay/replay_json.h"
#include "trace/reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <deque>
#include <map>
#include <unordered_map>
#include <vector>

namespace ls::replay {

namespace {

using Json = nlohmann::ordered_json;

// Distinct names (finish reasons, fault sites) kept apart; the rest are counted as "other", so an
// untrusted trace cannot grow the report without bound.
constexpr size_t kNamesMax = 64;

// A log-linear histogram of non-negative integers: exact below 128, then 128 buckets per power of
// two (each value is reported as its bucket's lower bound: at most 0.8% below the true value).
// Fixed size, so percentiles of any number of samples cost no memory.
class Histogram {
 public:
  void add(int64_t value) {
    const uint64_t v = static_cast<uint64_t>(std::max<int64_t>(value, 0));
    const size_t index = index_of(v);
    if (counts_.size() <= index) counts_.resize(index + 1, 0);
    ++counts_[index];
    ++count_;
    sum_ += static_cast<double>(v);
    max_ = std::max(max_, v);
  }

  // count, mean, p50, p90, p99, max (in `scale` units: value / scale), or null with no samples.
  Json json(double scale) const {
    if (count_ == 0) return nullptr;
    return Json{{"count", count_},
                {"mean", sum_ / static_cast<double>(count_) / scale},
                {"p50", static_cast<double>(percentile(50)) / scale},
                {"p90", static_cast<double>(percentile(90)) / scale},
                {"p99", static_cast<double>(percentile(99)) / scale},
                {"max", static_cast<double>(max_) / scale}};
  }

 private:
  static constexpr uint64_t kExact = 128;

  static size_t index_of(uint64_t v) {
    if (v < kExact) return static_cast<size_t>(v);
    const int octave = static_cast<int>(std::bit_width(v)) - 1 - 7;  // v >> octave is in [128, 256)
    return static_cast<size_t>(kExact + static_cast<uint64_t>(octave) * kExact + ((v >> octave) - kExact));
  }
  static uint64_t lower_bound_of(size_t index) {
    if (index < kExact) return index;
    const uint64_t octave = (index - kExact) / kExact;
    return (kExact + (index - kExact) % kExact) << octave;
  }
  // Nearest rank: the smallest value with at least p% of the samples at or below it.
  uint64_t percentile(int p) const {
    const int64_t rank = std::max<int64_t>(1, (count_ * p + 99) / 100);
    int64_t seen = 0;
    for (size_t i = 0; i < counts_.size(); ++i) {
      seen += counts_[i];
      if (seen >= rank) return std::min(lower_bound_of(i), max_);
    }
    return max_;
  }

  std::vector<int64_t> counts_;
  int64_t count_ = 0;
  double sum_ = 0;
  uint64_t max_ = 0;
};

void count_name(std::map<std::string, int64_t>& counts, const std::string& name) {
  if (counts.size() >= kNamesMax && !counts.count(name)) {
    ++counts["other"];
  } else {
    ++counts[name.empty() ? "unnamed" : name];
  }
}

Json counts_json(const std::map<std::string, int64_t>& counts) {
  Json j = Json::object();
  for (const auto& [name, n] : counts) j[name] = n;
  return j;
}

// What one bucket of consecutive steps adds up to.
struct StepPoint {
  int64_t steps = 0;  // step outputs in the bucket
  int64_t prefill_rows = 0, decode_rows = 0, recovered_rows = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0, emitted_tokens = 0;
  int64_t kv_pages_max = 0;
  int64_t retractions = 0, recoveries = 0, finished = 0, aborted = 0, faults = 0, rejected = 0;
  int64_t drafts_proposed = 0, drafts_accepted = 0;
  // From step stats records (trace/trace.capnp StepStats), when the trace has them.
  int64_t timed_steps = 0;
  int64_t step_ns = 0, step_ns_max = 0, device_busy_ns = 0, wait_ns = 0;
  int64_t first_submit_ns = -1;  // the bucket's first timed step, on the trace's step clock
  int64_t pages_used_max = 0, queue_max = 0, running_max = 0, prefix_hit_tokens = 0;

  void merge(const StepPoint& o) {
    steps += o.steps;
    prefill_rows += o.prefill_rows, decode_rows += o.decode_rows, recovered_rows += o.recovered_rows;
    prefill_tokens += o.prefill_tokens, decode_tokens += o.decode_tokens, emitted_tokens += o.emitted_tokens;
    kv_pages_max = std::max(kv_pages_max, o.kv_pages_max);
    retractions += o.retractions, recoveries += o.recoveries, finished += o.finished, aborted += o.aborted;
    faults += o.faults, rejected += o.rejected;
    drafts_proposed += o.drafts_proposed, drafts_accepted += o.drafts_accepted;
    if (first_submit_ns < 0) first_submit_ns = o.first_submit_ns;
    timed_steps += o.timed_steps;
    step_ns += o.step_ns, step_ns_max = std::max(step_ns_max, o.step_ns_max);
    device_busy_ns += o.device_busy_ns, wait_ns += o.wait_ns;
    pages_used_max = std::max(pages_used_max, o.pages_used_max);
    queue_max = std::max(queue_max, o.queue_max), running_max = std::max(running_max, o.running_max);
    prefix_hit_tokens += o.prefix_hit_tokens;
  }
  bool empty() const {
    return steps == 0 && retractions == 0 && recoveries == 0 && finished == 0 && aborted == 0 &&
           faults == 0 && rejected == 0;
  }
};

// Steps folded into at most `points_max` buckets of `width` consecutive step numbers; when a step
// falls past the last bucket, neighbouring buckets are merged pairwise and the width doubles. The
// trace's length is not known in advance (a footer is optional, a tail may be cut).
class StepSeries {
 public:
  explicit StepSeries(int32_t points_max) : points_max_(points_max) {}

  StepPoint& at(int64_t step) {
    step = std::max<int64_t>(step, 0);
    while (step / width_ >= points_max_) halve();
    const size_t index = static_cast<size_t>(step / width_);
    if (points_.size() <= index) points_.resize(index + 1);
    return points_[index];
  }

  // `t0_ns`: the trace's first submit time (times are seconds since it); -1: no step stats.
  Json json(int64_t t0_ns) const {
    Json points = Json::array();
    for (size_t i = 0; i < points_.size(); ++i) {
      if (points_[i].empty()) continue;
      const StepPoint& p = points_[i];
      const double steps = static_cast<double>(std::max<int64_t>(p.steps, 1));
      Json point{
          {"step_first", static_cast<int64_t>(i) * width_},
          {"step_last", (static_cast<int64_t>(i) + 1) * width_ - 1},
          {"steps", p.steps},
          {"prefill_rows", static_cast<double>(p.prefill_rows) / steps},
          {"decode_rows", static_cast<double>(p.decode_rows - p.recovered_rows) / steps},
          {"recovered_rows", static_cast<double>(p.recovered_rows) / steps},
          {"prefill_tokens", static_cast<double>(p.prefill_tokens) / steps},
          {"decode_tokens", static_cast<double>(p.decode_tokens) / steps},
          {"emitted_tokens", static_cast<double>(p.emitted_tokens) / steps},
          {"kv_pages_max", p.kv_pages_max},
          {"retractions", p.retractions},
          {"recoveries", p.recoveries},
          {"finished", p.finished},
          {"aborted", p.aborted},
          {"faults", p.faults},
          {"accept_rate", p.drafts_proposed ? Json(static_cast<double>(p.drafts_accepted) /
                                                   static_cast<double>(p.drafts_proposed))
                                            : Json(nullptr)}};
      if (t0_ns >= 0) timed_fields(p, t0_ns, point);
      points.push_back(std::move(point));
    }
    return Json{{"bucket_steps", width_}, {"points_max", points_max_}, {"points", points}};
  }

 private:
  // A bucket's figures from step stats (null where none of its steps was timed).
  static void timed_fields(const StepPoint& p, int64_t t0_ns, Json& point) {
    const bool timed = p.timed_steps > 0;
    const double n = static_cast<double>(std::max<int64_t>(p.timed_steps, 1));
    const auto or_null = [timed](double v) { return timed ? Json(v) : Json(nullptr); };
    point["time_s"] = timed ? Json(static_cast<double>(p.first_submit_ns - t0_ns) / 1e9) : Json(nullptr);
    point["step_us_mean"] = or_null(static_cast<double>(p.step_ns) / n / 1e3);
    point["step_us_max"] = or_null(static_cast<double>(p.step_ns_max) / 1e3);
    point["device_busy_us_mean"] = or_null(static_cast<double>(p.device_busy_ns) / n / 1e3);
    point["wait_us_mean"] = or_null(static_cast<double>(p.wait_ns) / n / 1e3);
    point["tokens_per_s"] = timed && p.step_ns > 0 ? Json(static_cast<double>(p.emitted_tokens) * 1e9 /
                                                          static_cast<double>(p.step_ns))
                                                   : Json(nullptr);
    point["pages_used_max"] = timed ? Json(p.pages_used_max) : Json(nullptr);
    point["queue_max"] = timed ? Json(p.queue_max) : Json(nullptr);
    point["running_max"] = timed ? Json(p.running_max) : Json(nullptr);
  }

  void halve() {
    std::vector<StepPoint> merged((points_.size() + 1) / 2);
    for (size_t i = 0; i < points_.size(); ++i) merged[i / 2].merge(points_[i]);
    points_ = std::move(merged);
    width_ *= 2;
  }

  int32_t points_max_;
  int64_t width_ = 1;
  std::vector<StepPoint> points_;
};

// One running request: what its timeline and latencies need.
struct RequestTrack {
  int64_t arrival_step = -1;
  int64_t first_token_step = -1;
  int64_t last_token_step = -1;
  int64_t tokens = 0;
  int64_t kv_pages = 0;
  // On the step clock (step stats): the submit of the first step at or after the arrival, the
  // done of the steps that carried its first and latest tokens; -1 unknown.
  int64_t arrival_ns = -1, first_token_ns = -1, last_token_ns = -1;
};

// Finished requests for the timeline: every `every`-th one is kept; when the sample is full,
// every other kept one is dropped and `every` doubles, so the sample stays evenly spread.
class TimelineSample {
 public:
  explicit TimelineSample(int32_t max) : max_(static_cast<size_t>(max)) {}

  void add(Json row) {
    if (seen_++ % every_ != 0) return;
    rows_.push_back(std::move(row));
    if (rows_.size() < max_) return;
    std::vector<Json> kept;
    for (size_t i = 0; i < rows_.size(); i += 2) kept.push_back(std::move(rows_[i]));
    rows_ = std::move(kept);
    every_ *= 2;
  }
  int64_t seen() const { return seen_; }
  int64_t every() const { return every_; }
  const std::vector<Json>& rows() const { return rows_; }

 private:
  size_t max_;
  int64_t seen_ = 0;
  int64_t every_ = 1;
  std::vector<Json> rows_;
};

class ReportBuilder {
 public:
  ReportBuilder(const trace::TraceHeader& header, const ReportOptions& options)
      : header_(header), series_(options.points_max), timeline_(options.timeline_requests_max) {}

  void on_input(trace::StepInputRecord&& in) { open_.push_back(std::move(in)); }

  void on_output(const trace::StepOutputRecord& out) {
    // The reader has checked that an output closes the oldest open step.
    LS_ASSERT(!open_.empty() && open_.front().step == out.step, "output of step {} without its input", out.step);
    const trace::StepInputRecord in = std::move(open_.front());
    open_.pop_front();
    emitters_.clear();
    emitters_step_ = out.step;
    forget_ended_before(out.step - trace::kOpenStepsMax);
    StepPoint& point = series_.at(out.step);
    ++point.steps;
    ++steps_;
    count_rows(in.op, point);
    for (int32_t row = 0; row < in.op.rows_count(); ++row) on_row(in.op, out, row, point);
    point.kv_pages_max = std::max(point.kv_pages_max, kv_pages_);
    kv_pages_max_ = std::max(kv_pages_max_, kv_pages_);
  }

  void on_event(const trace::TraceEvent& e) {
    StepPoint& point = series_.at(e.step);
    switch (e.kind) {
      case trace::EventKind::kArrive: arrive(e); break;
      case trace::EventKind::kFinish: ++point.finished, end(e, finished_); break;
      case trace::EventKind::kAbort: ++point.aborted, end(e, aborted_); break;
      case trace::EventKind::kRetract:
        ++point.retractions, count_name(retractions_, e.detail), drop_pages(e.request_id);
        break;
      case trace::EventKind::kRecover: ++point.recoveries, count_name(recoveries_, e.detail); break;
      case trace::EventKind::kFaultFired:
        ++point.faults, count_name(faults_, e.detail.substr(0, e.detail.find(':')));
        break;
      case trace::EventKind::kStepRejected:
        ++point.rejected, ++rejected_;
        if (!open_.empty() && open_.front().step == e.step) open_.pop_front();
        break;
    }
  }

  Json finish(Json trace_facts, Json replay) {
    // Still running when the trace ends, in id order (the map's order is not deterministic).
    std::map<RequestId, const RequestTrack*> running;
    for (const auto& [id, track] : running_) running.emplace(id, &track);
    for (const auto& [id, track] : running) timeline_row(id, *track, "running", "", -1);
    Json j{{"kind", "lockstep-report"},
           {"trace", std::move(trace_facts)},
           {"totals", totals()},
           {"accept", accept()},
           {"step_latency", step_latency()},
           {"requests", requests()},
           {"series", series_.json(timed_steps_ > 0 ? t0_ns_ : -1)},
           {"timeline", timeline()},
           {"replay", std::move(replay)}};
    return j;
  }

 private:
  void count_rows(const ForwardOp& op, StepPoint& point) {
    for (const OpRow& r : op.rows) {
      if (r.kind == RowKind::kPrefill) {
        ++point.prefill_rows, ++prefill_rows_;
        point.prefill_tokens += r.input_length, prefill_tokens_ += r.input_length;
      } else {
        ++point.decode_rows, ++decode_rows_;
        point.decode_tokens += r.input_length, decode_tokens_ += r.input_length;
        if (r.hist_token_length != -1) ++point.recovered_rows, ++recovered_rows_;
      }
    }
  }

  // The tokens a row returned, its accepted length (speculative rows), and its request's pages.
  void on_row(const ForwardOp& op, const trace::StepOutputRecord& out, int32_t row, StepPoint& point) {
    const OpRow& r = op.rows[static_cast<size_t>(row)];
    const bool decode = r.kind == RowKind::kDecode;
    const bool last_chunk = !decode && r.prefix_length + r.input_length == r.prompt_length;
    const int32_t accepted = out.result.accepted_lengths[static_cast<size_t>(row)];
    const int64_t emitted = decode ? accepted : (last_chunk ? 1 : 0);
    point.emitted_tokens += emitted, emitted_tokens_ += emitted;
    const int32_t w = out.result.verify_width;
    if (decode && w > 1) {
      // W − 1 drafts per decode row; a' tokens accepted of which the last is the target's own.
      point.drafts_proposed += w - 1, drafts_proposed_ += w - 1;
      const int64_t drafts = std::max(accepted - 1, 0);
      point.drafts_accepted += drafts, drafts_accepted_ += drafts;
      if (accepted >= 0 && accepted < static_cast<int32_t>(accepted_histogram_.size())) ++accepted_histogram_[static_cast<size_t>(accepted)];
    }
    // A request that ended while this step was in flight (an overlapped executor's late result,
    // which the scheduler ignores) is not brought back.
    if (recently_ended_.count(r.request_id)) return;
    RequestTrack& t = track(r.request_id, out.step);
    if (!out.valid_cache_lengths.empty()) {
      const int32_t vcl = out.valid_cache_lengths[static_cast<size_t>(row)];
      const int64_t pages = (vcl + header_.executor.page_size - 1) / header_.executor.page_size;
      kv_pages_ += pages - t.kv_pages;
      t.kv_pages = pages;
    }
    if (emitted == 0) return;
    if (t.first_token_step < 0) {
      t.first_token_step = out.step;
      ttft_steps_.add(out.step - t.arrival_step);
    } else {
      itl_steps_.add(out.step - t.last_token_step);
    }
    t.last_token_step = out.step;
    t.tokens += emitted;
    emitters_.push_back(r.request_id);  // timed when this step's stats follow
  }

 public:
  // A step's stats follow its output (trace/trace.capnp): they time that step's tokens and the
  // arrivals before it.
  void on_stats(const trace::StepStatsRecord& s) {
    if (t0_ns_ < 0) t0_ns_ = s.submit_ns;
    StepPoint& point = series_.at(s.step);
    const int64_t step_ns = s.done_ns - s.submit_ns;
    if (point.first_submit_ns < 0) point.first_submit_ns = s.submit_ns;
    ++point.timed_steps;
    point.step_ns += step_ns, point.step_ns_max = std::max(point.step_ns_max, step_ns);
    point.device_busy_ns += s.device_busy_ns, point.wait_ns += s.wait_ns;
    point.pages_used_max = std::max<int64_t>(point.pages_used_max, s.pages_used);
    point.queue_max = std::max<int64_t>(point.queue_max, s.queue_length);
    point.running_max = std::max<int64_t>(point.running_max, s.running_count);
    point.prefix_hit_tokens += s.prefix_hit_tokens;
    step_ns_.add(step_ns), device_busy_ns_.add(s.device_busy_ns), wait_ns_.add(s.wait_ns);
    if (s.device_idle_before_ns >= 0) device_idle_ns_.add(s.device_idle_before_ns);
    ++timed_steps_, timed_ns_ += step_ns, prefix_hit_tokens_ += s.prefix_hit_tokens;
    last_done_ns_ = s.done_ns;
    pages_used_max_ = std::max<int64_t>(pages_used_max_, s.pages_used);
    queue_max_ = std::max<int64_t>(queue_max_, s.queue_length);
    // Arrivals first: a request may get its first token in the step it arrived before.
    for (RequestId id : awaiting_arrival_time_) {
      const auto it = running_.find(id);
      if (it != running_.end() && it->second.arrival_ns < 0) it->second.arrival_ns = s.submit_ns;
    }
    awaiting_arrival_time_.clear();
    if (s.step == emitters_step_) time_tokens(s.done_ns);
    emitters_.clear();
  }

 private:
  void time_tokens(int64_t done_ns) {
    for (RequestId id : emitters_) {
      const auto it = running_.find(id);
      if (it == running_.end()) continue;
      RequestTrack& t = it->second;
      if (t.first_token_ns < 0) {
        t.first_token_ns = done_ns;
        if (t.arrival_ns >= 0) ttft_ns_.add(done_ns - t.arrival_ns);
      } else {
        itl_ns_.add(done_ns - t.last_token_ns);
      }
      t.last_token_ns = done_ns;
    }
  }

  // A request seen in a step before (or without) its arrival event arrives at that step.
  RequestTrack& track(RequestId id, int64_t step) {
    auto [it, inserted] = running_.try_emplace(id);
    if (inserted) {
      it->second.arrival_step = step;
      ++arrivals_unseen_;
    }
    return it->second;
  }

  // Ids ended this long ago cannot appear in an open step any more.
  void forget_ended_before(int64_t step) {
    for (auto it = recently_ended_.begin(); it != recently_ended_.end();) {
      it = it->second < step ? recently_ended_.erase(it) : std::next(it);
    }
  }

  void arrive(const trace::TraceEvent& e) {
    ++arrived_;
    auto [it, inserted] = running_.try_emplace(e.request_id);
    it->second.arrival_step = e.step;
    if (!inserted) --arrivals_unseen_;
    awaiting_arrival_time_.push_back(e.request_id);
  }

  void drop_pages(RequestId id) {
    const auto it = running_.find(id);
    if (it == running_.end()) return;
    kv_pages_ -= it->second.kv_pages;
    it->second.kv_pages = 0;
  }

  void end(const trace::TraceEvent& e, std::map<std::string, int64_t>& by_reason) {
    count_name(by_reason, e.detail);
    const auto it = running_.find(e.request_id);
    if (it == running_.end()) return;  // an end without any step or arrival: counted, not drawn
    const RequestTrack& t = it->second;
    if (t.tokens > 1) tpot_millisteps_.add((t.last_token_step - t.first_token_step) * 1000 / (t.tokens - 1));
    if (t.tokens > 1 && t.first_token_ns >= 0) tpot_ns_.add((t.last_token_ns - t.first_token_ns) / (t.tokens - 1));
    timeline_row(e.request_id, t, e.kind == trace::EventKind::kFinish ? "finish" : "abort", e.detail, e.step);
    kv_pages_ -= t.kv_pages;
    running_.erase(it);
    recently_ended_[e.request_id] = e.step;
  }

  void timeline_row(RequestId id, const RequestTrack& t, const char* end, const std::string& reason,
                    int64_t end_step) {
    const auto step_or_null = [](int64_t s) { return s < 0 ? Json(nullptr) : Json(s); };
    timeline_.add(Json{{"id", id},
                       {"arrival_step", t.arrival_step},
                       {"first_token_step", step_or_null(t.first_token_step)},
                       {"last_token_step", step_or_null(t.last_token_step)},
                       {"end_step", step_or_null(end_step)},
                       {"end", end},
                       {"reason", reason},
                       {"tokens", t.tokens}});
  }

  Json totals() const {
    return Json{{"steps", steps_},
                {"prefill_rows", prefill_rows_},
                {"decode_rows", decode_rows_ - recovered_rows_},
                {"recovered_rows", recovered_rows_},
                {"prefill_tokens", prefill_tokens_},
                {"decode_tokens", decode_tokens_},
                {"emitted_tokens", emitted_tokens_},
                {"kv_pages_max", kv_pages_max_},
                {"retractions", counts_json(retractions_)},
                {"recoveries", counts_json(recoveries_)},
                {"faults", counts_json(faults_)},
                {"rejected_steps", rejected_}};
  }

  Json accept() const {
    if (drafts_proposed_ == 0) return nullptr;
    int64_t rows = 0, accepted = 0;
    const int32_t w = header_.executor.verify_width;
    std::vector<int64_t> histogram;
    for (int32_t a = 0; a <= w && a < static_cast<int32_t>(accepted_histogram_.size()); ++a) {
      histogram.push_back(accepted_histogram_[static_cast<size_t>(a)]);
      rows += accepted_histogram_[static_cast<size_t>(a)];
      accepted += a * accepted_histogram_[static_cast<size_t>(a)];
    }
    return Json{{"verify_width", w},
                {"rate", static_cast<double>(drafts_accepted_) / static_cast<double>(drafts_proposed_)},
                {"mean_accepted_length", rows ? static_cast<double>(accepted) / static_cast<double>(rows) : 0.0},
                {"drafts_proposed", drafts_proposed_},
                {"drafts_accepted", drafts_accepted_},
                {"accepted_length_histogram", histogram}};
  }

  // The step stats' figures, or null for a trace without them.
  Json step_latency() const {
    if (timed_steps_ == 0) return nullptr;
    const double wall_s = static_cast<double>(last_done_ns_ - t0_ns_) / 1e9;
    return Json{{"clock", header_.step_clock},
                {"device_timer", header_.device_timer},
                {"timed_steps", timed_steps_},
                {"wall_s", wall_s},
                {"tokens_per_s_wall", wall_s > 0 ? Json(static_cast<double>(emitted_tokens_) / wall_s) : Json(nullptr)},
                {"tokens_per_s_in_steps", static_cast<double>(emitted_tokens_) * 1e9 / static_cast<double>(std::max<int64_t>(timed_ns_, 1))},
                {"step_us", step_ns_.json(1e3)},
                {"device_busy_us", device_busy_ns_.json(1e3)},
                {"wait_us", wait_ns_.json(1e3)},
                {"device_idle_before_us", device_idle_ns_.json(1e3)},
                {"pages_used_max", pages_used_max_},
                {"queue_max", queue_max_},
                {"prefix_hit_tokens", prefix_hit_tokens_}};
  }

  Json requests() const {
    return Json{{"arrived", arrived_},
                {"seen_without_arrival", arrivals_unseen_},
                {"finished", counts_json(finished_)},
                {"aborted", counts_json(aborted_)},
                {"running_at_end", running_.size()},
                {"ttft_steps", ttft_steps_.json(1)},
                {"tpot_steps", tpot_millisteps_.json(1000)},
                {"itl_steps", itl_steps_.json(1)},
                {"ttft_ms", ttft_ns_.json(1e6)},
                {"tpot_ms", tpot_ns_.json(1e6)},
                {"itl_ms", itl_ns_.json(1e6)}};
  }

  Json timeline() const {
    return Json{{"requests", timeline_.seen()},
                {"every", timeline_.every()},
                {"rows", timeline_.rows()}};
  }

  const trace::TraceHeader& header_;
  StepSeries series_;
  TimelineSample timeline_;
  std::deque<trace::StepInputRecord> open_;  // at most trace::kOpenStepsMax
  std::unordered_map<RequestId, RequestTrack> running_;
  std::unordered_map<RequestId, int64_t> recently_ended_;  // id → step it ended (a few steps' worth)
  int64_t steps_ = 0, prefill_rows_ = 0, decode_rows_ = 0, recovered_rows_ = 0;
  int64_t prefill_tokens_ = 0, decode_tokens_ = 0, emitted_tokens_ = 0;
  int64_t kv_pages_ = 0, kv_pages_max_ = 0;
  int64_t drafts_proposed_ = 0, drafts_accepted_ = 0;
  std::array<int64_t, 17> accepted_histogram_{};
  int64_t arrived_ = 0, arrivals_unseen_ = 0, rejected_ = 0;
  std::map<std::string, int64_t> finished_, aborted_, retractions_, recoveries_, faults_;
  Histogram ttft_steps_, itl_steps_, tpot_millisteps_;
  // Step stats.
  Histogram step_ns_, device_busy_ns_, wait_ns_, device_idle_ns_, ttft_ns_, tpot_ns_, itl_ns_;
  int64_t t0_ns_ = -1, last_done_ns_ = 0, timed_steps_ = 0, timed_ns_ = 0, prefix_hit_tokens_ = 0;
  int64_t pages_used_max_ = 0, queue_max_ = 0;
  std::vector<RequestId> emitters_;  // requests that got tokens from the last output
  int64_t emitters_step_ = -1;
  std::vector<RequestId> awaiting_arrival_time_;  // arrived; timed by the next step's stats
};

Json trace_facts(const std::filesystem::path& path, const trace::TraceReader& reader) {
  const trace::TraceHeader& h = reader.header();
  const ExecutorConfig& e = h.executor;
  return Json{{"path", path.string()},
              {"file_bytes", reader.file_bytes()},
              {"build_id", h.build_id},
              {"model", h.model.name},
              {"backend", h.backend},
              {"determinism_mode", h.determinism_mode},
              {"machine", h.machine.gpu_name.empty() ? h.machine.cpu_name : h.machine.gpu_name},
              {"drafter", h.drafter.empty() ? "none" : h.drafter},
              {"tp_degree", h.tp_degree},
              {"verify_width", e.verify_width},
              {"max_batch_rows", e.max_batch_rows},
              {"context_length", e.context_length},
              {"page_size", e.page_size},
              {"pages", e.pages_count},
              {"complete_steps", reader.complete_steps()},
              {"closed_cleanly", reader.footer().has_value()},
              {"truncation", reader.truncation() ? Json(reader.truncation()->describe()) : Json(nullptr)}};
}

Json replay_facts(const ReplayResultSummary& r) {
  Json divergence = nullptr;
  if (r.divergence) {
    const Divergence& d = *r.divergence;
    divergence = Json{{"step", d.step},         {"request_id", d.request_id}, {"row", d.row},
                      {"field", d.field},       {"expected", d.expected},     {"actual", d.actual},
                      {"replay_until", r.replay_until}};
  }
  return Json{{"mode", r.mode},
              {"verdict", r.verdict},
              {"backend", r.backend},
              {"tp_degree", r.tp_degree},
              {"steps_compared", r.steps_compared},
              {"token_agreement", r.token_agreement ? Json(*r.token_agreement) : Json(nullptr)},
              {"divergence", divergence}};
}

}  // namespace

Json build_trace_report(const std::filesystem::path& path, const ReportOptions& options) {
  LS_REQUIRE(options.points_max >= kReportPointsMin && options.points_max <= kReportPointsMax,
             "--points {}: expected {}..{}", options.points_max, kReportPointsMin, kReportPointsMax);
  LS_REQUIRE(options.timeline_requests_max >= 2 && options.timeline_requests_max <= kTimelineRequestsMax,
             "--timeline-requests {}: expected 2..{}", options.timeline_requests_max, kTimelineRequestsMax);
  // The report reads what the records say; the checks of every index and of the ordering still
  // run, the forward-op validation (which replay and `check` do) does not need to.
  trace::TraceReader reader = trace::TraceReader::open(path, {.validate_ops = false});
  std::optional<ReplayResultSummary> replay;
  if (options.replay_json) replay = read_replay_result(*options.replay_json, reader.header(), reader.file_bytes());
  ReportBuilder builder(reader.header(), options);
  trace::TraceRecord record;
  while (reader.next(record)) {
    if (auto* in = std::get_if<trace::StepInputRecord>(&record)) {
      builder.on_input(std::move(*in));
    } else if (auto* out = std::get_if<trace::StepOutputRecord>(&record)) {
      builder.on_output(*out);
    } else if (auto* e = std::get_if<trace::TraceEvent>(&record)) {
      builder.on_event(*e);
    } else if (auto* s = std::get_if<trace::StepStatsRecord>(&record)) {
      builder.on_stats(*s);
    }
  }
  return builder.finish(trace_facts(path, reader), replay ? replay_facts(*replay) : Json(nullptr));
}

}  // namespace ls::replay
