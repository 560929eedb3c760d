// The CUDA production backend (DESIGN.md "Backends"): bf16 weights and KV on the device, fp32
// accumulation, cuBLAS GEMMs (lockstep's GEMV and small-M GEMM for steps of a few tokens), own
// kernels for everything else, one execution stream, every buffer allocated once at construction
// from the ExecutorConfig's limits. An fp32 mode (weights, KV and GEMM inputs in fp32, pedantic
// fp32 cuBLAS) differs from the CPU reference only in the order of sums: the correctness oracle.
//
// This header includes no CUDA header, so cli/ can include it; everything CUDA lives in Impl.
#pragma once

#include "core/backend.h"
#include "core/config.h"
#include "core/model/weights.h"
#include "core/tensor_parallel.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ls {

class TpCollectives;

// What weights, KV and the inputs of the linear layers are stored in. Accumulation, the residual
// stream, norms, softmax and logits are fp32 in both.
enum class CudaPrecision : uint8_t {
  kBf16 = 0,  // production
  kFp32 = 1,  // the oracle mode: only the order of sums differs from the CPU reference
};
std::string_view to_string(CudaPrecision precision);

// Where a step's device time goes, for the benchmark's profile (CudaBackendOptions::profile).
enum class CudaPhase : uint8_t {
  kStateOps = 0,  // table writes, vcl resets, input fill
  kEmbedding,
  kNorms,
  kGemmQkv,
  kRope,          // RoPE and the KV write
  kAttention,
  kGemmO,
  kGemmGateUp,
  kSwiglu,
  kGemmDown,
  kLmHead,        // final norm and the LM head
  kGuard,         // NaN guard and argmax
  kSampling,      // sampling weights and sort (stochastic rows), verification and commit
  kCopyBack,      // the packed device-to-host copy of the results
  kCount,
};
std::string_view to_string(CudaPhase phase);

// Kernels a step can leave out (CudaBackendOptions::leave_out), for the benchmark's profile of
// what each adds to a step inside its graph: the step's time with it less the step's time
// without it (the device has no working timeline tool; bench/gpu_bench.cpp --leave-out).
enum class LeaveOut : uint32_t {
  kQkv = 1u << 0,        // the QKV product with its folded norm, RoPE and KV write
  kAttention = 1u << 1,  // decode attention: the split kernel and the combine
  kCombine = 1u << 2,    // the combine of attention's split partials only
  kO = 1u << 3,
  kGateUp = 1u << 4,     // the gate/up product with its folded norm and SwiGLU
  kDown = 1u << 5,
  kLayers = 1u << 6,     // every layer: the step keeps the embedding, final norm, LM head, tail
  // Parts of decode attention's split kernel (kernels/attention.h, AttentionLeaveOut; the
  // tensor-core kernel at llama's group of 4 query heads a KV head):
  kAttentionBody = 1u << 7,     // all but its launch and its wait; and the combine
  kAttentionKvReads = 1u << 8,  // its reads of the K/V rows (zeros instead)
  kAttentionArithmetic = 1u << 9,  // its scores, softmax, P·V and partials (its reads stay); and
                                   // the combine
};
// Every LeaveOut, in the order the benchmark's profile reports them.
inline constexpr LeaveOut kLeaveOutKinds[] = {
    LeaveOut::kQkv, LeaveOut::kAttention, LeaveOut::kCombine, LeaveOut::kAttentionBody,
    LeaveOut::kAttentionKvReads, LeaveOut::kAttentionArithmetic, LeaveOut::kO, LeaveOut::kGateUp,
    LeaveOut::kDown, LeaveOut::kLayers};
// The split kernel's parts, which only llama-like attention has (kernels/attention.h).
constexpr bool is_split_kernel_part(LeaveOut what) {
  return what == LeaveOut::kAttentionBody || what == LeaveOut::kAttentionKvReads ||
         what == LeaveOut::kAttentionArithmetic;
}
// The parts of attention's cost among them (the profile lists them, but does not add them to the
// step's losses: LeaveOut::kAttention's row holds them).
constexpr bool is_part_of_attention(LeaveOut what) {
  return what == LeaveOut::kCombine || is_split_kernel_part(what);
}
constexpr uint32_t kLeaveOutAll = [] {
  uint32_t all = 0;
  for (const LeaveOut what : kLeaveOutKinds) all |= static_cast<uint32_t>(what);
  return all;
}();
std::string_view to_string(LeaveOut what);

constexpr int32_t kSmallMGemmTokensDefault = 32;
// A product of at least this many bytes of bf16 weights, in a small-M grid that fills its waves,
// is large: it runs the small-M GEMM up to small_m_gemm_large_tokens_max tokens (llama-8b's
// gate/up, 224 MiB, and down, 112 MiB, and either model's LM head; not llama-1b's gate/up, 64 MiB,
// which cuBLAS runs faster at 64 tokens, nor qwen2.5-7b's, 259 MiB in 1.12 waves).
constexpr int64_t kSmallMGemmLargeProductBytes = int64_t{96} << 20;
constexpr int32_t kSmallMGemmLargeTokensDefault = 64;
// The small-M GEMM's most tokens a launch (kernels::kSmallMGemmTokensMax; this header includes no
// CUDA header, cuda_backend_setup.cpp asserts the two equal): batch-invariant mode's setting.
constexpr int32_t kSmallMGemmTokensInvariant = 64;

struct CudaPhaseTimes {
  std::array<double, static_cast<size_t>(CudaPhase::kCount)> ms{};  // summed over `steps`
  int64_t steps = 0;
  bool available = true;  // false when the device could not time the marks
};

// Device time around one step (CudaBackendOptions::time_steps), from CUDA events on the stream.
struct CudaStepTiming {
  // From the end of the previous step's stream work to the start of this one's: time the device
  // had nothing of these steps to run (cache copies between them count here). NaN for the first
  // step or when not measured.
  double idle_before_ms = std::numeric_limits<double>::quiet_NaN();
  // From the start of the step's stream work to its end. It includes any wait for the host's
  // launches inside the step (an eager step whose kernels are launched slower than they run, the
  // gap between the staging copy and the graph launch of a step submitted to an idle device).
  double busy_ms = std::numeric_limits<double>::quiet_NaN();
};

struct CudaBackendOptions {
  int32_t device = 0;
  CudaPrecision precision = CudaPrecision::kBf16;
  // Decode steps replay CUDA graphs captured at batch sizes 1, 2, 4, 8, 16, ... (multiples of 8)
  // up to max_batch_rows, padded with the sentinel pool row. Off: every step runs eagerly.
  bool graphs = false;
  // The attention split workspace's cap; prefill attention is launched in token chunks that fit.
  int64_t attention_workspace_bytes_max = int64_t{256} << 20;
  int64_t cublas_workspace_bytes = int64_t{32} << 20;
  // Steps of at most this many tokens (≤ 8) run their linear layers through lockstep's GEMV
  // kernel (bf16 only); larger ones through cuBLAS. 0: always cuBLAS. 1 by default: its time
  // grows with every token (the fused GEMV at llama-1b batch 4 took 1.92 ms a step on the H200,
  // batch 1 0.92 ms; cuBLAS at batch 16 1.36 ms — bench/results/2026-12-01-h200-656fb8fd3e25-*),
  // and `lockstep_gpu_bench` compares the two at batch 2, 4 and 8 in every full run.
  int32_t gemv_tokens_max = 1;
  // Steps of more than gemv_tokens_max and at most this many tokens (≤ 64) run their linear layers
  // through lockstep's tensor-core GEMM (kernels/gemm_small_m.h; bf16 only, a non-zero value is
  // refused in fp32): the weights streamed once whatever the token count, one summation order for
  // every token count (batch invariant). 0: cuBLAS. Unset: kSmallMGemmTokensDefault in bf16, 0 in
  // fp32 — the H200 bench (`lockstep_gpu_bench`, batch 2 to 64 in every full run, both backends
  // alternating in one run) measured the wgmma form (55efa00) faster a step than cuBLAS up to
  // batch 32 and slower at 64: llama-1b −10.1 / −10.8 / −10.8 / −8.3 / −3.9 / +3.4% at batch 2 /
  // 4 / 8 / 16 / 32 / 64, llama-8b −7.4 / −7.6 / −6.4 / −5.5 / −3.1 / +1.0%
  // (bench/results/2026-12-03-h200-55efa001b178-gpu-bench.log; the mma.sync form it replaced was
  // slower than cuBLAS from batch 16, …-c41e4227d721-small-m-bench.log, whence the old default 8).
  // A product whose GEMM grid runs past one wave and fills under four fifths of its waves stays on
  // cuBLAS whatever this says (kernels::gemm_small_m_fills_its_waves; qwen2.5-7b's gate/up), but
  // in batch-invariant mode, which runs every product on the GEMM.
  std::optional<int32_t> small_m_gemm_tokens_max;
  // Large products (kSmallMGemmLargeProductBytes of weights or more, in a grid that fills its
  // waves: kernels::gemm_small_m_fills_its_waves) run the small-M GEMM up to
  // this many tokens instead (≤ 64; not below small_m_gemm_tokens_max, where it would change
  // nothing: refused). Unset: kSmallMGemmLargeTokensDefault in bf16, 0 in fp32 — at 64 tokens
  // the kernel alone streams those weights faster than cuBLAS (H200, 94756dd: llama-8b gate/up
  // 65.3 against 67.0 µs, down 35.6 against 37.0, LM head 273 against 290; llama-1b's LM head 142
  // against 151) and the smaller ones slower (llama-8b q/k/v 20.2 against 17.8, o 15.3 against
  // 12.6; every llama-1b layer product): bench/results/2026-12-05-h200-94756ddde2e2-gpu-bench.log.
  // `lockstep_gpu_bench --small-m` measures the step both ways at batch 48 and 64 (H200, full run
  // of 20a2d1f: llama-8b −1.05% and −1.01% a step, llama-1b −0.30% and −0.06%).
  std::optional<int32_t> small_m_gemm_large_tokens_max;
  // Batch-invariant mode (issue 15, `--determinism invariant`): every linear layer of every step,
  // decode and prefill alike, runs the small-M GEMM — whose sums' order depends on (out, in) only —
  // over blocks of at most kSmallMGemmTokensMax tokens, so a token's results depend on its own
  // inputs alone: not on the batch, the chunking or the step's other rows (attention's splits are
  // fixed by position; norms, RoPE, SwiGLU and sampling are row-local). Needs bf16,
  // gemv_tokens_max 0 and small_m_gemm_tokens_max kSmallMGemmTokensMax (batch_invariant_options
  // sets them), TP 1, no drafter and no Mamba layers; each is refused by name otherwise.
  // Attention runs every token, a prefill chunk's too, through the decode kernel
  // (prefill_attention_by_decode_kernel, which batch_invariant_options sets and the mode needs).
  bool batch_invariant = false;
  // Prefill chunks' attention through the decode kernel, as decode rows' (a token then has the
  // same bits in a chunk as at decode), instead of the tile kernel (kernels/attention_tiles.cuh,
  // which computes a split in another order: bf16, head_dim 64 or 128, steps of at least
  // kernels::kAttentionTilePrefillTokensMin prefill tokens; elsewhere the decode kernel runs
  // either way). `lockstep_gpu_bench --prefill` compares the two.
  bool prefill_attention_by_decode_kernel = false;
  // The forward's kernels (embedding, norms, GEMV, RoPE, attention, SwiGLU) launched to overlap
  // their predecessor (kernels/launch.h: a GEMV's weight loads start while the kernel before it
  // finishes); the same bits either way. Off: plain stream order (for comparison).
  bool overlap_kernels = true;
  // Steps that run the GEMV (tokens <= gemv_tokens_max, bf16) fold each layer's RMSNorm into the
  // products that read it, SwiGLU into gate/up, and RoPE with the KV write into QKV where nothing
  // comes between them (kernels/decode_gemv.h); steps whose products run on the small-M GEMM
  // (batch-invariant mode's every step) fold SwiGLU into gate/up (kernels/gemm_small_m.h). The
  // same bits either way. Off: one kernel each (for comparison).
  bool fuse_decode = true;
  // The fused GEMV's grid (kernels/decode_gemv.h GemvNorm::block_per_group): one group of tasks a
  // block in as many waves as needed, instead of one wave of blocks each running several; the
  // same bits either way (for comparison: `lockstep_gpu_bench --fusion`).
  bool fused_gemv_block_per_group = false;
  // Record timing events between the phases of every step (graphs included) and sum them per
  // phase (phase_times()). The marks themselves cost a little: benchmarks report both. The marks
  // are one set, read when the step is collected, so a profiling backend does not run ahead
  // (can_run_ahead() is false): every step completes before the next is submitted.
  bool profile = false;
  // Record a timing event where each step's stream work begins (before its staging copy) and one
  // where it ends (step_done), so last_step_timing() can tell how long the device sat idle
  // between two steps: the host's critical path. Off: no extra events in the step.
  bool time_steps = false;
  // Benchmark only (a profile): the kernels every step leaves out, bits of LeaveOut; 0 (the
  // default) leaves nothing out. A step that leaves anything out computes wrong logits: refused
  // with Mamba layers, tensor parallelism, batch-invariant mode, a drafter or fp32 (the profile
  // covers the bf16 attention decoder at TP 1), and bits outside kLeaveOutAll.
  uint32_t leave_out = 0;
  // The fraction of the device memory left after the weights and workspaces that KV pages take
  // when the page count is sized from memory (cuda_kv_sizing).
  double kv_memory_fraction = 0.9;
  // The drafter that writes the next round's drafts into future_input_map inside each step when
  // W > 1: "none" (the extra columns repeat the last token) or "ngram" (core/drafter.h's
  // NgramDrafter on the device: the same ids for the same history). Any other name is an
  // ls::Error at construction; oracle-mix is the simulator's and runs on the CPU reference only.
  std::string drafter = "none";
  // Tensor parallelism (kernels/tp_cuda_backend.h builds the ranks): this backend is rank tp_rank
  // of tp_degree. It holds that rank's shard of every weight (q/k/v and gate/up by columns, o and
  // down by rows, the LM head by vocabulary: core/tensor_parallel.h) and of the KV pool (its kv
  // heads), and joins the ranks through tp_comm (not owned; rank tp_rank of tp_degree; null at
  // degree 1). Every rank computes the whole logits, guard, sampling and state, identically.
  int32_t tp_degree = 1;
  int32_t tp_rank = 0;
  TpCollectives* tp_comm = nullptr;
};

// `o` in batch-invariant mode: batch_invariant set, the GEMV off, the small-M GEMM for every step,
// prefill attention on the decode kernel.
inline CudaBackendOptions batch_invariant_options(CudaBackendOptions o) {
  o.batch_invariant = true;
  o.gemv_tokens_max = 0;
  o.small_m_gemm_tokens_max = kSmallMGemmTokensInvariant;
  o.prefill_attention_by_decode_kernel = true;
  return o;
}

// small_m_gemm_tokens_max as the backend runs it: the value given, else the precision's default.
inline int32_t small_m_gemm_tokens_max_of(const CudaBackendOptions& o) {
  return o.small_m_gemm_tokens_max.value_or(o.precision == CudaPrecision::kBf16 ? kSmallMGemmTokensDefault
                                                                                 : 0);
}

// small_m_gemm_large_tokens_max as the backend runs it: the value given, else the precision's
// default.
inline int32_t small_m_gemm_large_tokens_max_of(const CudaBackendOptions& o) {
  return o.small_m_gemm_large_tokens_max.value_or(
      o.precision == CudaPrecision::kBf16 ? kSmallMGemmLargeTokensDefault : 0);
}

// The most tokens at which a bf16 product of `out` × `in` weights runs the small-M GEMM (the
// larger of the two settings for a large product, one of kSmallMGemmLargeProductBytes or more
// whose GEMM grid fills its waves: kernels/gemm_small_m.h). The options are checked at
// construction; this also sizes memory before any backend exists.
int32_t small_m_gemm_tokens_max_for(const CudaBackendOptions& o, int64_t out, int64_t in);

// The most KV pages sizing from memory gives (4M tokens at 16 a page): host-side page tables,
// and the CPU reference replaying a trace recorded on the GPU, stay small for small models.
constexpr int64_t kCudaKvPagesMax = int64_t{1} << 18;

// KV pages sized from the memory the device has free now: pages_count is the number of whole
// pages that options.kv_memory_fraction of (free − weights − workspaces) holds, where weights and
// workspaces are what a CudaBackend built over (model, config, options) allocates besides KV
// (config.pages_count is ignored: nothing else depends on it). Call it before building the
// backend; throws ls::Error when even two pages do not fit.
struct CudaKvSizing {
  int64_t free_bytes = 0;       // device memory free when sized
  int64_t weight_bytes = 0;
  int64_t workspace_bytes = 0;
  int64_t kv_budget_bytes = 0;  // fraction · (free − weights − workspaces)
  int64_t page_bytes = 0;       // K and V of one page over all attention layers
  int32_t pages_count = 0;      // ⌊budget / page_bytes⌋, at most kCudaKvPagesMax
};
CudaKvSizing cuda_kv_sizing(const ModelConfig& model, const ExecutorConfig& config,
                            const CudaBackendOptions& options = {});

// What a trace header and a benchmark record about the machine.
struct CudaMachineInfo {
  std::string gpu_name;
  std::string sm_count;
  std::string driver_version;   // the kernel driver's version, and the CUDA version it supports
  std::string runtime_version;  // CUDA runtime linked in
  std::string cublas_version;
};

// Device memory the backend holds, by kind, for reports.
struct CudaMemoryReport {
  int64_t weight_bytes = 0;
  int64_t kv_bytes = 0;
  int64_t workspace_bytes = 0;  // activations, logits, sampler, attention and cuBLAS workspaces,
                                // a hybrid's recurrent-state pool
};

// Random weights made on the device (benchmarks): equal to weights_from_seed(config, seed)
// rounded to bf16, without ever holding fp32 host weights.
struct DeviceSeededWeights {
  ModelConfig config;
  uint64_t seed = 0;
};

class CudaBackend final : public Backend {
 public:
  // Uploads the weights as bf16 (norm weights stay fp32), allocates every buffer and makes every
  // GEMM plan. Throws ls::Error when there is no device, memory runs out, or a limit cannot be met.
  CudaBackend(const ModelWeights& weights, const ExecutorConfig& config,
              const CudaBackendOptions& options = {});
  CudaBackend(const DeviceSeededWeights& weights, const ExecutorConfig& config,
              const CudaBackendOptions& options = {});
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  // What a trace header records: options.drafter ("none" when empty), as CpuBackend reports its own.
  std::string drafter_name() const;
  void apply_table_writes(const StepPlan& plan) override;
  void reset_lengths(const StepPlan& plan) override;
  void fill_inputs(const StepPlan& plan) override;
  // A hybrid (Mamba2 layers): the copy-on-write and zeroing lists run on the device before the
  // forward (inside a decode step's graph), the checkpoints after the commit.
  bool has_recurrent_state() const override;
  void apply_state_rules(const StepPlan& plan) override;
  void forward(const StepPlan& plan) override;
  void poison_logits(std::span<const int32_t> logits_rows, float value) override;
  // enqueue_finish then collect_finish: one step at a time.
  void finish_step(const StepPlan& plan, StepResult& result) override;
  // Runs ahead unless options.profile. Results come back through a pinned buffer and an event
  // per step parity, so step k+1's copy never lands where the host unpacks step k; the device
  // buffers are single, ordered by the one stream.
  bool can_run_ahead() const override;
  void enqueue_finish(const StepPlan& plan) override;
  void collect_finish(const StepPlan& plan, StepResult& result) override;
  void copy_pages(const CacheOp& op) override;
  // Both synchronize the stream: with a step in flight they wait for it and show its effects.
  StateSnapshot read_state(std::span<const int32_t> pool_rows) const override;
  InputSnapshot read_inputs() const override;
  // The digests on the device (kernels/mamba_ops.h launch_mamba_state_digests), synchronously.
  std::vector<uint64_t> read_mamba_digests(std::span<const int32_t> slots) const override;
  // Per-layer activations (core/activations.h): their values copied to the host layer by layer,
  // or their digests computed on the device (kernels/activation_ops.h) and copied back once; the
  // step runs eager (no graph). ls::Error for a hybrid model. kernels/cuda_activations.cpp.
  void capture_activations(ActivationCapture mode) override;
  StepActivations take_activations() override;
  // One recurrent-state slot, every Mamba layer's conv window then SSM state in layer order
  // (CpuBackend::read_mamba_state's layout; tests). Synchronizes the stream.
  std::vector<float> read_mamba_state(int32_t slot) const;
  // From last_step_timing() (CUDA events; busy and idle need options.time_steps) and
  // last_wait_ns().
  DeviceStepTime last_device_time() const override;

  // Captures the decode steps' graphs: what options.graphs does at construction. A TP group's
  // ranks are built with graphs off and capture together once all are built, since a capture's
  // warm-up steps run the collectives every rank must join (kernels/tp_cuda_backend.h). Before
  // the first step, once.
  void capture_graphs();

  CudaMemoryReport memory_report() const;
  // The cuBLASLt plans made at construction (bf16: every linear layer at every token count a step
  // can carry that the GEMV does not run; fp32: none). Steps make none: they only look plans up.
  int64_t gemm_plans_count() const;
  int64_t graph_replays_count() const;
  // Of those, the replays whose graph also ran the greedy tail (guard, verify/commit, drafter).
  int64_t tail_graph_replays_count() const;
  // Nanoseconds the last collect_finish spent blocked on the step's completion, plus an eager
  // step's wait at staging since the collect before it (a statistic for
  // the benchmark's host-time figure: step wall time minus this is the host's own work).
  int64_t last_wait_ns() const;
  // Host nanoseconds of the last forward() (staging, graph launch), and of the last
  // enqueue_finish plus the last collect_finish (tail launches, wait and unpack): the benchmark
  // splits the host time into these and the executor's own work.
  int64_t last_forward_ns() const;
  int64_t last_finish_ns() const;
  // The last collected step's device timing (options.time_steps; NaN fields otherwise).
  CudaStepTiming last_step_timing() const;
  // Per-phase device time summed since construction or the last reset (options.profile).
  CudaPhaseTimes phase_times() const;
  void reset_phase_times();
  // TP > 1: the collectives of the last forward launched eagerly or captured (the CPU
  // reference's CpuModel::collectives() is their oracle); empty at TP 1, which issues none.
  std::vector<CollectiveCall> collectives() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

std::unique_ptr<Backend> make_cuda_backend(const ModelWeights& weights,
                                           const ExecutorConfig& config);
std::unique_ptr<Backend> make_cuda_backend(const ModelWeights& weights,
                                           const ExecutorConfig& config,
                                           const CudaBackendOptions& options);

// Throws ls::Error when no CUDA device is usable.
CudaMachineInfo cuda_machine_info(int32_t device = 0);

// True when a CUDA device is present and usable (tests skip otherwise).
bool cuda_device_available();

}  // namespace ls
