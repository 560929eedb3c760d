#include "kernels/tp_cuda_backend.h"

#include "core/check.h"
#include "core/host_barrier.h"
#include "kernels/cuda_check.h"
#include "kernels/tp_collectives.h"
#include "kernels/tp_rank.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

namespace ls {

namespace {

// One thread per rank, its device current while it runs a job. run(f) hands f to every rank at
// once and returns when all are done, rethrowing the lowest rank's exception — the lowest that is
// not a HostBarrierAborted, which only says that another rank failed. A job is a function
// pointer and a context: handing one over allocates nothing.
class RankThreads {
 public:
  explicit RankThreads(const std::vector<int32_t>& devices) : errors_(devices.size()) {
    for (size_t rank = 0; rank < devices.size(); ++rank) {
      threads_.emplace_back([this, rank, device = devices[rank]] {
        loop(static_cast<int32_t>(rank), device);
      });
    }
  }
  ~RankThreads() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  template <typename F>
  void run(F&& f) {
    dispatch([](void* context, int32_t rank) { (*static_cast<std::remove_reference_t<F>*>(context))(rank); },
             &f);
  }

 private:
  using Call = void (*)(void*, int32_t);

  void dispatch(Call call, void* context) {
    std::unique_lock lock(mutex_);
    call_ = call;
    context_ = context;
    running_ = static_cast<int32_t>(threads_.size());
    std::fill(errors_.begin(), errors_.end(), nullptr);
    ++generation_;
    work_.notify_all();
    done_.wait(lock, [this] { return running_ == 0; });
    std::exception_ptr first;
    for (const std::exception_ptr& error : errors_) {
      if (error && !is_host_barrier_abort(error)) std::rethrow_exception(error);
      if (error && !first) first = error;
    }
    if (first) std::rethrow_exception(first);
  }

  static bool is_host_barrier_abort(const std::exception_ptr& error) {
    try {
      std::rethrow_exception(error);
    } catch (const HostBarrierAborted&) {
      return true;
    } catch (...) {
      return false;
    }
  }

  void loop(int32_t rank, int32_t device) {
    uint64_t seen = 0;
    std::unique_lock lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      const Call call = call_;
      void* const context = context_;
      lock.unlock();
      std::exception_ptr error;
      try {
        LS_CUDA(cudaSetDevice(device));  // the runtime's current device is per thread
        call(context, rank);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      errors_[static_cast<size_t>(rank)] = error;
      if (--running_ == 0) done_.notify_one();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable done_;
  uint64_t generation_ = 0;
  int32_t running_ = 0;
  bool stopping_ = false;
  Call call_ = nullptr;
  void* context_ = nullptr;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

// Rules 1–4 of a step, held until the next call that needs them run (its hand-off runs them
// first, on every rank, in this order).
enum DeferredRule : uint8_t {
  kTableWrites = 1 << 0,
  kLengthResets = 1 << 1,
  kFillInputs = 1 << 2,
  kForward = 1 << 3,
};

// A follower's result must be rank 0's: the tokens and everything the executor reads of them.
void check_same_result(const StepResult& leader, const StepResult& follower, int32_t rank) {
  LS_ASSERT(follower.tokens == leader.tokens && follower.accepted_lengths == leader.accepted_lengths &&
                follower.nan_flags == leader.nan_flags && follower.oov_flags == leader.oov_flags &&
                follower.logits_digests == leader.logits_digests,
            "tensor-parallel rank {} computed another step result than rank 0 (the ranks' logits "
            "differ: the all-reduce or all-gather did not give every rank the same bits)",
            rank);
}

}  // namespace

std::vector<int32_t> tp_devices(int32_t degree) {
  LS_REQUIRE(degree >= 1 && degree <= kTpDegreeMax,
             "tensor-parallel degree (--tp) must be in [1, {}], got {}", kTpDegreeMax, degree);
  int count = 0;
  LS_REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess && count > 0, "no CUDA device is available");
  std::vector<int32_t> devices;
  for (int32_t rank = 0; rank < degree; ++rank) devices.push_back(count >= degree ? rank : 0);
  return devices;
}

CudaKvSizing tp_cuda_kv_sizing(const ModelConfig& model, const ExecutorConfig& config,
                               const CudaBackendOptions& options,
                               const std::vector<int32_t>& devices) {
  const int32_t degree = static_cast<int32_t>(devices.size());
  make_tp_layout(model, degree);  // the model's refusal first: it names the field
  std::vector<int32_t> distinct = devices;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  CudaKvSizing tightest;
  bool first = true;
  for (const int32_t device : distinct) {
    // Every rank on this device: their weights and workspaces, and their pages side by side.
    CudaKvSizing share;
    int64_t ranks_here = 0;
    for (int32_t rank = 0; rank < degree; ++rank) {
      if (devices[static_cast<size_t>(rank)] != device) continue;
      CudaBackendOptions o = options;
      o.device = device, o.tp_degree = degree, o.tp_rank = rank;
      const CudaKvSizing s = cuda_kv_sizing(model, config, o);
      share.free_bytes = s.free_bytes;
      share.weight_bytes += s.weight_bytes;
      share.workspace_bytes += s.workspace_bytes;
      share.page_bytes = s.page_bytes;
      ++ranks_here;
    }
    // Ranks sharing the device also share the slab their collectives exchange through.
    share.workspace_bytes += tp_group_bytes(
        devices, TpRank::collective_floats_max(make_rank_shard(model, degree, 0),
                                               config.step_tokens_max(), config.logits_rows_max(),
                                               model.hidden_size));
    const int64_t left = share.free_bytes - share.weight_bytes - share.workspace_bytes;
    LS_REQUIRE(left > 0,
               "cuda backend: the weights ({} B) and workspaces ({} B) of {} TP ranks on device {} "
               "exceed its {} B free", share.weight_bytes, share.workspace_bytes, ranks_here, device,
               share.free_bytes);
    share.kv_budget_bytes =
        static_cast<int64_t>(options.kv_memory_fraction * static_cast<double>(left));
    const int64_t pages =
        std::min<int64_t>(share.kv_budget_bytes / (ranks_here * share.page_bytes), kCudaKvPagesMax);
    share.pages_count = static_cast<int32_t>(pages);
    if (first || share.pages_count < tightest.pages_count) tightest = share;
    first = false;
  }
  LS_REQUIRE(tightest.pages_count >= 2,
             "cuda backend: {} B for KV hold {} pages of {} B per TP rank; at least 2 are needed",
             tightest.kv_budget_bytes, tightest.pages_count, tightest.page_bytes);
  return tightest;
}

struct TpCudaBackend::Impl {
  explicit Impl(const std::vector<int32_t>& device_list) : devices(device_list), threads(device_list) {
    LS_REQUIRE(devices.size() >= 2 && devices.size() <= static_cast<size_t>(kTpDegreeMax),
               "a CUDA TP group has 2..{} ranks, got {}", kTpDegreeMax, devices.size());
    ranks.resize(devices.size());
    follower_results.resize(devices.size() - 1);
  }
  ~Impl() {
    // Each rank's buffers freed on its own thread (its device current), before the communicators.
    try {
      run_ranks([this](int32_t rank) { ranks[static_cast<size_t>(rank)].reset(); });
    } catch (...) {  // a destructor reports nothing
    }
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // threads.run(f), where a rank that fails aborts the group's host barrier (a shared-device
  // group's ranks meet there around each collective, kernels/tp_collectives.cpp): its peers'
  // waits for it end instead of blocking for ever. Rearmed once every rank has returned. The
  // meetings also keep the device consistent: a rank launches a collective's barrier kernel only
  // once every rank has reached that collective, so when one fails before it, no peer's kernel
  // waits for it on the device.
  template <typename F>
  void run_ranks(F&& f) {
    HostBarrier* const barrier = group.host_barrier.get();
    try {
      threads.run([&](int32_t rank) {
        try {
          f(rank);
        } catch (...) {
          if (barrier != nullptr) barrier->abort();
          throw;
        }
      });
    } catch (...) {
      if (barrier != nullptr) barrier->rearm();
      throw;
    }
  }

  // Builds every rank at once (graphs off), then captures their graphs at once: a capture's
  // warm-up runs the collectives, which wait for every rank. No collective runs while any rank is
  // still being built (allocating, creating its cuBLAS handles, seeding or uploading weights —
  // calls that can wait for the whole device): the first is enqueued after every rank's
  // constructor returned.
  template <typename Weights>
  void build(const Weights& weights, const ExecutorConfig& config,
             const CudaBackendOptions& options) {
    const int32_t degree = static_cast<int32_t>(devices.size());
    const TpRankShard shard = make_rank_shard(weights.config, degree, 0);
    group = make_tp_group(devices, TpRank::collective_floats_max(shard, config.step_tokens_max(),
                                                                 config.logits_rows_max(),
                                                                 weights.config.hidden_size));
    run_ranks([&](int32_t rank) {
      CudaBackendOptions o = options;
      o.device = devices[static_cast<size_t>(rank)];
      o.tp_degree = degree;
      o.tp_rank = rank;
      o.tp_comm = group.ranks[static_cast<size_t>(rank)].get();
      o.graphs = false;
      ranks[static_cast<size_t>(rank)] = std::make_unique<CudaBackend>(weights, config, o);
    });
    if (options.graphs) {
      run_ranks([&](int32_t rank) { ranks[static_cast<size_t>(rank)]->capture_graphs(); });
    }
  }

  void defer(const StepPlan& plan, DeferredRule rule) {
    LS_ASSERT(deferred_plan == nullptr || deferred_plan == &plan, "rules of two plans deferred");
    LS_ASSERT(deferred < rule, "rule {} after rules {}", static_cast<int>(rule),
              static_cast<int>(deferred));
    deferred_plan = &plan;
    deferred = static_cast<uint8_t>(deferred | rule);
  }

  static void run_deferred(CudaBackend& backend, const StepPlan* plan, uint8_t rules) {
    if (plan == nullptr) return;
    if (rules & kTableWrites) backend.apply_table_writes(*plan);
    if (rules & kLengthResets) backend.reset_lengths(*plan);
    if (rules & kFillInputs) backend.fill_inputs(*plan);
    if (rules & kForward) backend.forward(*plan);
  }

  // f(rank, backend) on every rank at once, after the deferred rules (handed over once, whether
  // or not a rank throws).
  template <typename F>
  void on_every_rank(F&& f) {
    const StepPlan* const plan = std::exchange(deferred_plan, nullptr);
    const uint8_t rules = std::exchange(deferred, uint8_t{0});
    run_ranks([&](int32_t rank) {
      CudaBackend& backend = *ranks[static_cast<size_t>(rank)];
      run_deferred(backend, plan, rules);
      f(rank, backend);
    });
  }

  // Every rank's result into its own; rank 0's into `result`, the others checked equal to it.
  template <typename F>
  void collect(StepResult& result, F&& step) {
    on_every_rank([&](int32_t rank, CudaBackend& backend) {
      step(backend, rank == 0 ? result : follower_results[static_cast<size_t>(rank - 1)]);
    });
    for (size_t i = 0; i < follower_results.size(); ++i) {
      check_same_result(result, follower_results[i], static_cast<int32_t>(i + 1));
    }
  }

  std::vector<int32_t> devices;
  RankThreads threads;  // declared before the ranks: joined after they are gone
  TpGroup group;        // the ranks' collectives, destroyed after the ranks
  std::vector<std::unique_ptr<CudaBackend>> ranks;
  std::vector<StepResult> follower_results;  // [ranks − 1], reused
  const StepPlan* deferred_plan = nullptr;
  uint8_t deferred = 0;
};

TpCudaBackend::TpCudaBackend(const ModelWeights& weights, const ExecutorConfig& config,
                             const CudaBackendOptions& options, const std::vector<int32_t>& devices) {
  make_tp_layout(weights.config, static_cast<int32_t>(devices.size()));  // names the field first
  impl_ = std::make_unique<Impl>(devices);
  impl_->build(weights, config, options);
}

TpCudaBackend::TpCudaBackend(const DeviceSeededWeights& weights, const ExecutorConfig& config,
                             const CudaBackendOptions& options, const std::vector<int32_t>& devices) {
  make_tp_layout(weights.config, static_cast<int32_t>(devices.size()));
  impl_ = std::make_unique<Impl>(devices);
  impl_->build(weights, config, options);
}

TpCudaBackend::~TpCudaBackend() = default;

std::string TpCudaBackend::drafter_name() const { return impl_->ranks[0]->drafter_name(); }
int32_t TpCudaBackend::tp_degree() const { return static_cast<int32_t>(impl_->ranks.size()); }
const std::optional<NcclPinning>& TpCudaBackend::nccl_pinning() const { return impl_->group.nccl; }

const CudaBackend& TpCudaBackend::rank(int32_t r) const {
  LS_ASSERT(r >= 0 && r < tp_degree(), "rank {} of {}", r, tp_degree());
  return *impl_->ranks[static_cast<size_t>(r)];
}
CudaBackend& TpCudaBackend::rank(int32_t r) {
  LS_ASSERT(r >= 0 && r < tp_degree(), "rank {} of {}", r, tp_degree());
  return *impl_->ranks[static_cast<size_t>(r)];
}

void TpCudaBackend::apply_table_writes(const StepPlan& plan) { impl_->defer(plan, kTableWrites); }
void TpCudaBackend::reset_lengths(const StepPlan& plan) { impl_->defer(plan, kLengthResets); }
void TpCudaBackend::fill_inputs(const StepPlan& plan) { impl_->defer(plan, kFillInputs); }
void TpCudaBackend::forward(const StepPlan& plan) { impl_->defer(plan, kForward); }

void TpCudaBackend::poison_logits(std::span<const int32_t> logits_rows, float value) {
  impl_->on_every_rank(
      [&](int32_t, CudaBackend& backend) { backend.poison_logits(logits_rows, value); });
}

void TpCudaBackend::finish_step(const StepPlan& plan, StepResult& result) {
  impl_->collect(result, [&](CudaBackend& backend, StepResult& out) { backend.finish_step(plan, out); });
}

bool TpCudaBackend::can_run_ahead() const { return impl_->ranks[0]->can_run_ahead(); }

void TpCudaBackend::enqueue_finish(const StepPlan& plan) {
  impl_->on_every_rank([&](int32_t, CudaBackend& backend) { backend.enqueue_finish(plan); });
}

void TpCudaBackend::collect_finish(const StepPlan& plan, StepResult& result) {
  impl_->collect(result,
                 [&](CudaBackend& backend, StepResult& out) { backend.collect_finish(plan, out); });
}

void TpCudaBackend::copy_pages(const CacheOp& op) {
  impl_->on_every_rank([&](int32_t, CudaBackend& backend) { backend.copy_pages(op); });
}

// Every rank's state is the same (the same plans, the same results); rank 0's is read, after the
// deferred rules ran on every rank.
StateSnapshot TpCudaBackend::read_state(std::span<const int32_t> pool_rows) const {
  StateSnapshot state;
  impl_->on_every_rank([&](int32_t rank, CudaBackend& backend) {
    if (rank == 0) state = backend.read_state(pool_rows);
  });
  return state;
}

InputSnapshot TpCudaBackend::read_inputs() const {
  InputSnapshot inputs;
  impl_->on_every_rank([&](int32_t rank, CudaBackend& backend) {
    if (rank == 0) inputs = backend.read_inputs();
  });
  return inputs;
}

DeviceStepTime TpCudaBackend::last_device_time() const { return impl_->ranks[0]->last_device_time(); }

}  // namespace ls
