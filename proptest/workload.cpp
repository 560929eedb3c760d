#include "proptest/workload.h"

#include "core/check.h"
#include "core/cpu_backend.h"
#include "core/invariants.h"
#include "core/serving_loop.h"
#include "trace/digests.h"
#include "trace/recorder.h"
#include "trace/trace_observer.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace ls::proptest {

const ModelWeights& tiny_weights() {
  static const ModelWeights weights = weights_from_seed(model_config_named("tiny"), kWeightsSeed);
  return weights;
}

int32_t tiny_vocab() { return tiny_weights().config.vocab_size; }

ExecutorConfig script_config(int32_t max_batch_rows, int32_t verify_width) {
  ExecutorConfig c;
  c.max_batch_rows = max_batch_rows;
  c.context_length = 48;
  c.page_size = 4;
  c.verify_width = verify_width;
  c.prefill_chunk_tokens = 64;
  c.pages_count = max_batch_rows * c.table_width() + 48;
  c.host_pages_count = max_batch_rows * c.table_width();
  return c;
}

void showValue(const Script& s, std::ostream& os) {
  os << describe(s) << "\n";
  for (const RequestScript& r : s.requests) {
    os << fmt::format("  request {}: prompt {} ids, max_new {}, temperature {}, seed {}\n", r.id,
                      r.prompt.size(), r.max_new_tokens, r.sampling.temperature,
                      r.sampling.seed ? fmt::format("{}", *r.sampling.seed) : "default");
  }
  for (size_t k = 0; k < s.steps.size(); ++k) {
    const StepChoice& c = s.steps[k];
    os << fmt::format("  step {}: admit {} chunk {} mixed {} retract {}{} recover {} row_pick {} poison {} invalid {}\n",
                      k, c.admit, c.chunk_tokens, c.mixed, c.retract, c.recompute ? " (recompute)" : "",
                      c.recover, c.pool_row_pick, c.poison, c.invalid);
  }
}

std::string describe(const Script& s) {
  std::string out = fmt::format("B={} W={} L={} P={} requests:", s.config.max_batch_rows,
                                s.config.verify_width, s.config.context_length, s.config.page_size);
  for (const RequestScript& r : s.requests) {
    out += fmt::format(" {}(prompt {}, new {}, T={})", r.id, r.prompt.size(), r.max_new_tokens,
                       r.sampling.temperature);
  }
  return out + fmt::format(", {} step choices", s.steps.size());
}

namespace {

// Empty when a refusal points where the mutation broke the op; else what it pointed at instead.
std::string misnamed_refusal(const OpFieldAt& got, const OpFieldAt& expected) {
  if (got.field == expected.field && got.row == expected.row && got.element == expected.element) {
    return "";
  }
  return fmt::format("the refusal names {} (row {}, element {}), expected {} (row {}, element {})",
                     to_string(got.field), got.row, got.element, to_string(expected.field),
                     expected.row, expected.element);
}

enum class Phase : uint8_t { kWaiting, kPrefilling, kDecoding, kRetracted, kDone };

struct Live {
  const RequestScript* spec = nullptr;
  Phase phase = Phase::kWaiting;
  int32_t pool_row = 0;
  std::vector<int32_t> pages;  // device pages in table order
  int32_t synced = 0;          // leading pages the device table row holds
  bool sampling_sent = false;
  std::vector<int32_t> tokens;  // prompt + generated
  int32_t target = 0;           // tokens the current (re)prefill covers
  int32_t prefilled = 0;        // of those, in KV
  int32_t vcl = 0;              // the model's committed KV length
  bool recompute = false;       // retracted by recompute (else by swap)
  std::vector<int32_t> host_pages;
  int32_t generated = 0;
  int32_t last_row = 0;  // the pool row it held before its last retraction
};

// What the model expects of one op row, computed before the step.
struct RowExpect {
  int32_t base = 0;      // vcl the row starts from (prefix, hist, or the committed length)
  int32_t written = 0;   // tokens whose KV the row writes
};

class Driver {
 public:
  Driver(const Script& script, const RunOptions& options)
      : script_(script),
        options_(options),
        config_(script.config),
        vocab_(tiny_vocab()),
        backend_(std::make_unique<CpuBackend>(tiny_weights(), config_), options.bug, config_),
        executor_(config_, vocab_, backend_, ExecutorOptions{.capture_logits = true}) {
    refs_.assign(static_cast<size_t>(config_.pages_count), 0);
    for (int32_t p = 1; p < config_.pages_count; ++p) free_pages_.insert(p);
    for (int32_t h = 0; h < config_.host_pages_count; ++h) free_host_.insert(h);
    for (int32_t r = 1; r <= config_.max_batch_rows; ++r) free_rows_.insert(r);
    for (const RequestScript& r : script.requests) {
      Live l{.spec = &r, .tokens = r.prompt, .target = static_cast<int32_t>(r.prompt.size())};
      live_.emplace(r.id, std::move(l));
      result_.outputs[r.id] = {};
    }
    if (options.trace_path) {
      recorder_ = trace::Recorder::open(
          *options.trace_path,
          trace::make_trace_header(tiny_weights(), WeightSource{.seed = kWeightsSeed}, config_, "cpu"),
          trace::RecorderOptions{.fsync_on_close = false});
    }
  }

  RunResult run() {
    while (!all_done() && !result_.failure && step_ < options_.steps_max) {
      const StepChoice choice =
          step_ < static_cast<int64_t>(script_.steps.size()) ? script_.steps[step_] : StepChoice{};
      run_step(choice);
    }
    if (!result_.failure && !all_done()) {
      fail(-1, nullptr, "liveness", fmt::format("requests unfinished after {} steps", step_));
    }
    if (recorder_) recorder_->close();
    result_.steps_count = step_;
    return std::move(result_);
  }

 private:
  bool all_done() const {
    return std::all_of(live_.begin(), live_.end(), [](const auto& kv) { return kv.second.phase == Phase::kDone; });
  }

  void fail(int32_t row, const Live* l, const std::string& field, const std::string& detail) {
    if (result_.failure) return;
    result_.failure = fmt::format("step {} row {} (request {}): {}: {}", step_, row,
                                  l ? l->spec->id : 0, field, detail);
    result_.failure_step = step_;
  }

  // ---- pages ----
  int32_t table_width() const { return config_.table_width(); }
  int32_t pages_for(int32_t tokens) const {
    const int32_t p = config_.page_size;
    return std::min((tokens + p - 1) / p, table_width());
  }
  void release(int32_t page) {
    LS_ASSERT(refs_[page] > 0, "driver released free page {}", page);
    if (--refs_[page] == 0) free_pages_.insert(page);
  }
  bool reserve(int32_t count) {
    if (static_cast<int32_t>(free_pages_.size()) >= count) return true;
    // Evict cache entries only the cache holds.
    for (auto it = cache_.begin(); it != cache_.end() && static_cast<int32_t>(free_pages_.size()) < count;) {
      if (refs_[it->second] == 1) {
        release(it->second);
        it = cache_.erase(it);
      } else {
        ++it;
      }
    }
    return static_cast<int32_t>(free_pages_.size()) >= count;
  }
  bool grow(Live& l, int32_t tokens) {
    const int32_t extra = pages_for(tokens) - static_cast<int32_t>(l.pages.size());
    if (extra <= 0) return true;
    if (!reserve(extra)) return false;
    for (int32_t i = 0; i < extra; ++i) {
      const int32_t page = *free_pages_.begin();
      free_pages_.erase(free_pages_.begin());
      refs_[page] = 1;
      l.pages.push_back(page);
    }
    return true;
  }
  void drop(Live& l) {
    for (int32_t page : l.pages) release(page);
    l.pages.clear();
    l.synced = 0;
    if (l.pool_row != 0) free_rows_.insert(l.pool_row);
    if (l.pool_row != 0) l.last_row = l.pool_row;
    l.pool_row = 0;
  }
  bool take_row(Live& l, const StepChoice& c) {
    if (free_rows_.empty()) return false;
    auto it = free_rows_.begin();
    std::advance(it, static_cast<size_t>(c.pool_row_pick) % free_rows_.size());
    l.pool_row = *it;
    free_rows_.erase(it);
    l.sampling_sent = false;
    l.synced = 0;
    return true;
  }
  OpRow start_row(Live& l, RowKind kind) {
    OpRow row{.kind = kind, .request_id = l.spec->id, .pool_row = l.pool_row};
    const int32_t held = static_cast<int32_t>(l.pages.size());
    if (l.synced < held) {
      row.refresh.begin = l.synced;
      row.refresh.pages.assign(l.pages.begin() + l.synced, l.pages.end());
      l.synced = held;
    }
    if (!l.sampling_sent) row.sampling = l.spec->sampling;
    l.sampling_sent = true;
    return row;
  }

  // ---- planning ----
  void retract(const StepChoice& c, std::vector<CacheOp>& cache_ops, std::set<RequestId>& retracted) {
    std::vector<Live*> decoding;
    for (auto& [id, l] : live_) if (l.phase == Phase::kDecoding) decoding.push_back(&l);
    if (c.retract < 0 || decoding.empty()) return;
    Live& l = *decoding[static_cast<size_t>(c.retract) % decoding.size()];
    const int32_t kv_pages = (l.vcl + config_.page_size - 1) / config_.page_size;
    // A re-prefill must fit in L: a request past the context limit can only be swapped.
    const bool fits = static_cast<int32_t>(l.tokens.size()) <= config_.context_length;
    const bool swap = (!c.recompute || !fits) && kv_pages <= static_cast<int32_t>(free_host_.size());
    if (!swap && !fits) return;
    if (swap && kv_pages > 0) {
      CacheOp out{.kind = CacheOpKind::kSwapOut};
      for (int32_t i = 0; i < kv_pages; ++i) {
        l.host_pages.push_back(*free_host_.begin());
        free_host_.erase(free_host_.begin());
        out.device_pages.push_back(l.pages[i]);
      }
      out.host_pages = l.host_pages;
      cache_ops.push_back(std::move(out));
    }
    drop(l);
    l.phase = Phase::kRetracted;
    l.recompute = !swap;
    if (l.recompute) {
      l.target = static_cast<int32_t>(l.tokens.size());
      l.prefilled = 0;
    }
    retracted.insert(l.spec->id);
    ++result_.retractions_count;
    if (recorder_) {
      recorder_->record_event({.kind = trace::EventKind::kRetract, .request_id = l.spec->id, .step = step_,
                               .detail = l.recompute ? "recompute" : "swap"});
    }
  }

  void add_prefill(Live& l, int32_t chunk, ForwardOp& op, std::vector<int32_t>& ids) {
    OpRow row = start_row(l, RowKind::kPrefill);
    row.input_length = chunk;
    row.prefix_length = l.prefilled;
    row.prompt_length = l.target;
    ids.insert(ids.end(), l.tokens.begin() + l.prefilled, l.tokens.begin() + l.prefilled + chunk);
    op.rows.push_back(std::move(row));
    expect_.push_back({l.prefilled, chunk});
  }

  // A new request (or a recompute-retracted one): a pool row, a prefix-cache match over full pages
  // excluding the last token, pages for the first chunk.
  bool admit(Live& l, const StepChoice& c, int32_t& budget, ForwardOp& op, std::vector<int32_t>& ids) {
    const int32_t p = config_.page_size;
    std::vector<int32_t> matched;
    if (script_.prefix_cache) {
      for (int32_t k = 1; k * p <= l.target - 1; ++k) {
        const auto it = cache_.find(std::vector<int32_t>(l.tokens.begin(), l.tokens.begin() + k * p));
        if (it == cache_.end()) break;
        matched.push_back(it->second);
      }
    }
    const int32_t matched_tokens = static_cast<int32_t>(matched.size()) * p;
    const int32_t chunk = std::min(budget, l.target - matched_tokens);
    const int32_t needed = pages_for(matched_tokens + chunk + config_.verify_width) -
                           static_cast<int32_t>(matched.size());
    for (int32_t page : matched) ++refs_[page];  // held before any eviction can take them
    if (free_rows_.empty() || !reserve(needed)) {
      for (int32_t page : matched) release(page);
      return false;
    }
    l.pages = std::move(matched);
    take_row(l, c);
    grow(l, matched_tokens + chunk + config_.verify_width);
    l.prefilled = matched_tokens;
    result_.prefix_hits_count += matched_tokens > 0 ? 1 : 0;
    l.phase = Phase::kPrefilling;
    add_prefill(l, chunk, op, ids);
    budget -= chunk;
    return true;
  }

  // Swap recovery: fresh pages, a swap-in, and a decode row resuming at hist = vcl with the last
  // token as its override, on a (possibly different) pool row.
  void recover_swap(Live& l, const StepChoice& c, std::vector<CacheOp>& cache_ops, ForwardOp&) {
    if (free_rows_.empty() || !reserve(pages_for(l.vcl + config_.verify_width))) return;
    const int32_t old_row = l.last_row;
    take_row(l, c);
    result_.pool_row_moves_count += l.pool_row != old_row ? 1 : 0;
    grow(l, l.vcl + config_.verify_width);
    if (!l.host_pages.empty()) {
      CacheOp in{.kind = CacheOpKind::kSwapIn, .host_pages = l.host_pages};
      in.device_pages.assign(l.pages.begin(), l.pages.begin() + static_cast<ptrdiff_t>(l.host_pages.size()));
      cache_ops.push_back(std::move(in));
      free_host_.insert(l.host_pages.begin(), l.host_pages.end());
      l.host_pages.clear();
    }
    l.phase = Phase::kDecoding;
    OpRow row = start_row(l, RowKind::kDecode);
    row.input_length = config_.verify_width;
    row.decode_override = l.tokens.back();
    row.hist_token_length = l.vcl;
    decode_rows_.push_back(std::move(row));
    decode_expect_.push_back({l.vcl, config_.verify_width});
  }

  ForwardOp plan(const StepChoice& c, std::vector<CacheOp>& cache_ops) {
    ForwardOp op;
    expect_.clear(), decode_rows_.clear(), decode_expect_.clear();
    std::set<RequestId> retracted;
    retract(c, cache_ops, retracted);
    const int32_t b = config_.max_batch_rows;
    auto rows = [&] { return static_cast<int32_t>(op.rows.size() + decode_rows_.size()); };
    int32_t recovered = 0;
    for (auto& [id, l] : live_) {
      if (l.phase != Phase::kRetracted || l.recompute || retracted.contains(id)) continue;
      if (recovered >= c.recover || rows() >= b) break;
      recover_swap(l, c, cache_ops, op);
      recovered += l.phase == Phase::kDecoding ? 1 : 0;
    }
    int32_t budget = std::clamp(c.chunk_tokens, 1, config_.prefill_chunk_tokens);
    std::vector<int32_t> ids;
    for (auto& [id, l] : live_) {  // continuing prompts first
      if (l.phase != Phase::kPrefilling || budget <= 0 || rows() >= b) continue;
      const int32_t chunk = std::min(budget, l.target - l.prefilled);
      if (!grow(l, l.prefilled + chunk + config_.verify_width)) continue;
      add_prefill(l, chunk, op, ids);
      budget -= chunk;
    }
    int32_t admitted = 0;
    for (auto& [id, l] : live_) {
      const bool waiting = l.phase == Phase::kWaiting ||
                           (l.phase == Phase::kRetracted && l.recompute && !retracted.contains(id));
      if (!waiting || budget <= 0 || rows() >= b || admitted >= std::max(c.admit, 0)) continue;
      admitted += admit(l, c, budget, op, ids) ? 1 : 0;
    }
    op.prefill_token_ids = std::move(ids);
    if (c.mixed || op.rows.empty()) {
      for (auto& [id, l] : live_) {
        if (l.phase != Phase::kDecoding || rows() >= b || l.pool_row == 0) continue;
        if (std::any_of(decode_rows_.begin(), decode_rows_.end(),
                        [&](const OpRow& r) { return r.request_id == id; })) continue;
        if (!grow(l, l.vcl + config_.verify_width)) continue;
        OpRow row = start_row(l, RowKind::kDecode);
        row.input_length = config_.verify_width;
        decode_rows_.push_back(std::move(row));
        decode_expect_.push_back({l.vcl, config_.verify_width});
      }
    }
    op.rows.insert(op.rows.end(), decode_rows_.begin(), decode_rows_.end());
    expect_.insert(expect_.end(), decode_expect_.begin(), decode_expect_.end());
    return op;
  }

  // ---- one step ----
  void run_step(const StepChoice& c) {
    std::vector<CacheOp> cache_ops;
    const ForwardOp op = plan(c, cache_ops);
    for (const CacheOp& cache_op : cache_ops) executor_.copy_pages(cache_op);
    if (options_.faults && c.invalid >= 0 && !op.rows.empty()) try_invalid(op, c.invalid);
    if (result_.failure) return;
    std::vector<int32_t> poisoned;
    if (options_.faults && c.poison >= 0 && !op.rows.empty()) {
      poisoned.push_back(c.poison % op.rows_count());
      ++result_.poisoned_count;
      executor_.poison_next_step(poisoned);
    }
    if (recorder_) recorder_->record_input(step_, op, cache_ops, executor_.pending_faults());
    if (op.rows.empty()) {
      idle_ = cache_ops.empty() ? idle_ + 1 : 0;
      LS_REQUIRE(idle_ < 50, "proptest driver: stuck with requests unfinished");
      const StepResult idle = executor_.step(op);
      if (recorder_) recorder_->record_output(step_, idle, {});
      ++step_;
      return;
    }
    idle_ = 0;
    result_.mixed_steps_count += op.mode() == ForwardMode::kMixed ? 1 : 0;
    const StepFaults faults = executor_.pending_faults();  // what the step injects
    const StepResult result = executor_.step(op);
    for (const OpRow& row : op.rows) row_owner_[row.pool_row] = row.request_id;
    if (recorder_) recorder_->record_output(step_, result, backend_.read_state(pool_rows_of(op)));
    if (options_.check_invariants) check(op, result, faults);
    apply(op, result, poisoned);
    ++step_;
  }

  void try_invalid(const ForwardOp& op, int32_t kind) {
    ForwardOp bad = op;
    std::string what;
    std::optional<OpFieldAt> expected;
    if (!mutate_op(bad, kind, config_, vocab_, what, expected)) return;
    // The executor asks for sampling only from a request new to its pool row: the same request
    // back on the row it last held (retraction and recovery) may omit them.
    for (size_t i = 0; kind % kMutationKinds == 11 && i < op.rows.size(); ++i) {
      if (op.rows[i].sampling && !bad.rows[i].sampling && row_owner_[op.rows[i].pool_row] == op.rows[i].request_id) return;
    }
    std::vector<int32_t> all_rows;
    for (int32_t r = 0; r < config_.pool_rows_count(); ++r) all_rows.push_back(r);
    const StateSnapshot before = backend_.read_state(all_rows);
    const InputSnapshot inputs_before = backend_.read_inputs();
    const int64_t calls = backend_.rule_calls();
    bool rejected = false;
    std::string misnamed;  // the refusal pointed elsewhere than the broken field
    try {
      executor_.step(options_.lenient_front ? op : bad);
    } catch (const OpFieldError& e) {
      rejected = true;
      if (expected) misnamed = misnamed_refusal(e.at(), *expected);
    } catch (const Error& e) {
      rejected = true;
      if (expected) misnamed = fmt::format("a refusal that names no field: {}", e.what());
    }
    const StateSnapshot after = backend_.read_state(all_rows);
    if (!rejected) return fail(-1, nullptr, "contract", "an op with " + what + " was executed, not rejected");
    if (!misnamed.empty()) return fail(-1, nullptr, "contract", "an op with " + what + ": " + misnamed);
    if (backend_.rule_calls() != calls) return fail(-1, nullptr, "contract", "a rejected op (" + what + ") reached the backend");
    if (after.valid_cache_length != before.valid_cache_length || after.table != before.table ||
        after.future_inputs != before.future_inputs || backend_.read_inputs().slots != inputs_before.slots) {
      return fail(-1, nullptr, "contract", "a rejected op (" + what + ") changed device state");
    }
    ++result_.rejected_count;
  }

  const Live& live_of(const OpRow& row) const { return live_.at(row.request_id); }

  void check(const ForwardOp& op, const StepResult& r, const StepFaults& faults) {
    const InvariantLimits limits = InvariantLimits::of(config_, vocab_);
    const StateSnapshot state = backend_.read_state(pool_rows_of(op));
    const InputSnapshot in = backend_.read_inputs();
    int32_t offset = 0;
    for (int32_t i = 0; i < op.rows_count(); ++i) {
      const OpRow& row = op.rows[i];
      const Live& l = live_of(row);
      const RowExpect& e = expect_[i];
      const int32_t vcl = state.valid_cache_length[i];
      // The shared invariants, from the start this model expects (not the op's own fields).
      for (const std::optional<InvariantViolation>& v :
           {check_accepted_length(StepShape::of(op), r, i, limits), check_context_clamp(op, r, i, e.base, limits),
            check_valid_cache_length(op, r, i, e.base, vcl, limits)}) {
        if (v) return fail(i, &l, v->invariant, fmt::format("{}: {}", v->field, v->detail));
      }
      for (int32_t t = 0; t < e.written; ++t) {
        const int32_t q = e.base + t;
        if (auto v = check_kv_slot(i, offset + t, q, in.slots[offset + t], l.pages, limits)) {
          return fail(i, &l, v->invariant, fmt::format("{}: {}", v->field, v->detail));
        }
        if (in.positions[offset + t] != q) {
          return fail(i, &l, "position", fmt::format("token {} at position {}, expected {}", t, in.positions[offset + t], q));
        }
      }
      if (auto v = check_nan_flag(r, i, faults)) {
        return fail(i, &l, v->invariant, fmt::format("{}: {}", v->field, v->detail));
      }
      offset += row.input_length;
    }
    for (int32_t token : r.tokens) {
      if (token < 0 || token >= vocab_) return fail(-1, nullptr, "tokens", fmt::format("id {} outside [0, V = {})", token, vocab_));
    }
    for (size_t t = static_cast<size_t>(offset); t < in.slots.size(); ++t) {
      if (in.slots[t] != 0 || in.input_ids[t] != 1 || in.positions[t] != 0) {
        return fail(-1, nullptr, "padding", fmt::format("tail entry {} has id {}, position {}, slot {} (expected 1, 0, 0)",
                                                        t, in.input_ids[t], in.positions[t], in.slots[t]));
      }
    }
  }

  void finish(Live& l, bool aborted) {
    if (recorder_) {
      recorder_->record_event({.kind = aborted ? trace::EventKind::kAbort : trace::EventKind::kFinish,
                               .request_id = l.spec->id, .step = step_,
                               .detail = aborted ? "numerical_error" : "length"});
    }
    l.phase = Phase::kDone;
    result_.outputs[l.spec->id].aborted = aborted;
    drop(l);
  }

  void emit(Live& l, int32_t token, uint64_t digest) {
    if (l.generated >= l.spec->max_new_tokens) return;
    l.tokens.push_back(token);
    ++l.generated;
    RequestOutput& out = result_.outputs[l.spec->id];
    out.tokens.push_back(token);
    out.logits_digests.push_back(digest);
  }

  uint64_t digest_of(const StepResult& r, int32_t logits_row) const {
    const size_t v = static_cast<size_t>(vocab_);
    return trace::logits_row_digest(std::span<const float>(r.logits.data() + logits_row * v, v));
  }

  void apply(const ForwardOp& op, const StepResult& r, const std::vector<int32_t>& poisoned) {
    const int32_t ne = op.prefill_rows_count();
    const int32_t w = config_.verify_width;
    for (int32_t i = 0; i < op.rows_count(); ++i) {
      Live& l = live_.at(op.rows[i].request_id);
      const bool poisoned_row = std::find(poisoned.begin(), poisoned.end(), i) != poisoned.end();
      if (i < ne) {
        l.prefilled += op.rows[i].input_length;
        l.vcl = l.prefilled;
        if (l.prefilled < l.target) {
          if (poisoned_row) finish(l, true);
          continue;
        }
        l.phase = Phase::kDecoding;
        cache_prompt_pages(l);
        emit(l, r.tokens[i], digest_of(r, i));
      } else {
        const int32_t a = r.accepted_lengths[i];
        l.vcl = expect_[i].base + a;
        for (int32_t j = 0; j < a; ++j) {
          emit(l, r.tokens[ne + (i - ne) * w + j], digest_of(r, ne + (i - ne) * w + j));
        }
        if (a == 0) {
          l.generated = l.spec->max_new_tokens;  // the context is full
          ++result_.context_clamped_count;
        }
      }
      if (poisoned_row) {
        finish(l, true);
      } else if (l.generated >= l.spec->max_new_tokens) {
        finish(l, false);
      }
    }
  }

  void cache_prompt_pages(const Live& l) {
    if (!script_.prefix_cache) return;
    const int32_t p = config_.page_size;
    for (int32_t k = 1; k * p <= l.target && k <= static_cast<int32_t>(l.pages.size()); ++k) {
      std::vector<int32_t> key(l.tokens.begin(), l.tokens.begin() + k * p);
      if (cache_.contains(key)) continue;
      cache_.emplace(std::move(key), l.pages[k - 1]);
      ++refs_[l.pages[k - 1]];
    }
  }

  const Script& script_;
  const RunOptions& options_;
  ExecutorConfig config_;
  int32_t vocab_;
  BrokenBackend backend_;
  Executor executor_;
  std::unique_ptr<trace::Recorder> recorder_;
  std::map<RequestId, Live> live_;
  std::vector<int32_t> refs_;
  std::map<int32_t, RequestId> row_owner_;  // pool row → the request the executor last ran there
  std::set<int32_t> free_pages_;
  std::set<int32_t> free_host_;
  std::set<int32_t> free_rows_;
  std::map<std::vector<int32_t>, int32_t> cache_;  // full-page token prefix → its last page
  std::vector<RowExpect> expect_;
  std::vector<OpRow> decode_rows_;
  std::vector<RowExpect> decode_expect_;
  RunResult result_;
  int64_t step_ = 0;
  int32_t idle_ = 0;
};

}  // namespace

Coverage& coverage() {
  static Coverage c;
  return c;
}

RunResult run_script(const Script& script, const RunOptions& options) {
  Driver driver(script, options);
  RunResult r = driver.run();
  Coverage& c = coverage();
  c.runs += 1, c.steps += r.steps_count, c.rejected += r.rejected_count;
  c.retractions += r.retractions_count, c.prefix_hits += r.prefix_hits_count;
  c.poisoned += r.poisoned_count, c.mixed_steps += r.mixed_steps_count;
  c.context_clamped += r.context_clamped_count, c.pool_row_moves += r.pool_row_moves_count;
  for (const auto& [id, out] : r.outputs) c.tokens += static_cast<int64_t>(out.tokens.size());
  return r;
}

bool mutate_op(ForwardOp& op, int32_t kind, const ExecutorConfig& c, int32_t vocab, std::string& what,
               std::optional<OpFieldAt>& refused_at) {
  const int32_t bs = op.rows_count();
  const int32_t ne = op.prefill_rows_count();
  if (bs == 0) return false;
  OpRow& first = op.rows[0];
  OpRow* prefill = ne > 0 ? &op.rows[0] : nullptr;
  OpRow* decode = ne < bs ? &op.rows[ne] : nullptr;
  const auto refused = [&](OpField field, int32_t row, int64_t element = -1) {
    refused_at = OpFieldAt(field, row, element);
    return true;
  };
  refused_at.reset();
  switch (kind % kMutationKinds) {
    case 0: first.pool_row = 0, what = "pool row 0 (reserved)"; return refused(OpField::kPoolRow, 0);
    case 1:
      first.pool_row = c.sentinel_pool_row(), what = "the padding sentinel as pool row";
      return refused(OpField::kPoolRow, 0);
    case 2:
      if (bs < 2) return false;
      op.rows[1].pool_row = first.pool_row, what = "a pool row used twice";
      return refused(OpField::kPoolRow, 1);
    case 3:
      if (!prefill) return false;
      prefill->input_length += 1, what = "input_length one past the prefill ids"; return true;
    case 4:
      if (!prefill) return false;
      prefill->prefix_length = c.context_length, what = "prefix + input past L";
      return refused(OpField::kPrefixLength, 0);
    case 5:
      if (!decode) return false;
      decode->input_length = c.verify_width + 1, what = "a decode row of W + 1 tokens";
      return refused(OpField::kInputLength, ne);
    case 6:
      if (!decode) return false;
      decode->decode_override = vocab, what = "decode_override = V";
      return refused(OpField::kDecodeOverride, ne);
    case 7:
      if (!decode) return false;
      decode->hist_token_length = c.context_length + 1, decode->decode_override = 1;
      what = "hist_token_length = L + 1";
      return refused(OpField::kHistTokenLength, ne);
    case 8:
      if (!decode) return false;
      decode->hist_token_length = 0, decode->decode_override = -1;
      what = "hist_token_length without an override";
      return refused(OpField::kHistTokenLength, ne);
    case 9:
      first.refresh.pages.push_back(c.pages_count), what = "a refresh page = pages_count";
      return refused(OpField::kRefreshPages, 0, static_cast<int64_t>(first.refresh.pages.size()) - 1);
    case 10:
      first.refresh.pages.push_back(0), what = "a refresh of the dummy page 0";
      return refused(OpField::kRefreshPages, 0, static_cast<int64_t>(first.refresh.pages.size()) - 1);
    case 11:
      for (int32_t i = 0; i < bs; ++i) {
        if (!op.rows[i].sampling) continue;
        op.rows[i].sampling.reset(), what = "no sampling parameters for a request new to its pool row";
        return refused(OpField::kSampling, i);
      }
      return false;
    case 12:
      if (!prefill || !decode) return false;
      std::rotate(op.rows.begin(), op.rows.begin() + 1, op.rows.end());
      what = "a prefill row after a decode row";
      return refused(OpField::kKind, bs - 1);  // the rotated-out prefill row, now last
    case 13:
      if (op.prefill_token_ids.empty()) return false;
      op.prefill_token_ids.back() = vocab, what = "a prefill id = V";
      return refused(OpField::kPrefillTokenIds, ne - 1,  // the last prefill row's last id
                     static_cast<int64_t>(op.prefill_token_ids.size()) - 1);
    case 14:
      if (!prefill) return false;
      prefill->prompt_length = prefill->prefix_length + prefill->input_length - 1;
      what = "prompt_length shorter than prefix + input";
      return refused(OpField::kPromptLength, 0);
    case 15:
      if (bs < 2) return false;
      op.rows[1].request_id = first.request_id, what = "a request id on two rows";
      return refused(OpField::kRequestId, 1);
  }
  return false;
}

std::string compare_outputs(const std::map<RequestId, RequestOutput>& a,
                            const std::map<RequestId, RequestOutput>& b, const std::string& a_name,
                            const std::string& b_name) {
  for (const auto& [id, out] : a) {
    const auto it = b.find(id);
    if (it == b.end()) continue;
    const RequestOutput& other = it->second;
    const size_t n = std::max(out.tokens.size(), other.tokens.size());
    for (size_t k = 0; k < n; ++k) {
      const bool has_a = k < out.tokens.size(), has_b = k < other.tokens.size();
      if (!has_a || !has_b) {
        return fmt::format("request {}: {} generated {} tokens, {} generated {}", id, a_name,
                           out.tokens.size(), b_name, other.tokens.size());
      }
      if (out.tokens[k] != other.tokens[k]) {
        return fmt::format("request {} token {}: {} {} vs {} {}", id, k, a_name, out.tokens[k], b_name, other.tokens[k]);
      }
      if (out.logits_digests[k] != other.logits_digests[k]) {
        return fmt::format("request {} token {}: logits digest {} {:016x} vs {} {:016x}", id, k, a_name,
                           out.logits_digests[k], b_name, other.logits_digests[k]);
      }
    }
  }
  return {};
}

}  // namespace ls::proptest
