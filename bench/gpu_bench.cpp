// The GPU benchmark (GPU.md "How to spend GPU time", STYLE.md §24): in one run, the streaming
// bandwidth of this GPU (a plain copy kernel, read + write, and a plain read kernel), then decode
// step time of the CUDA backend for the llama-1b and llama-8b shapes (random bf16 weights made on
// the device from a seed) at batch 1, 16, 64 and context 192, 1024 with CUDA graphs (and batch 1
// eagerly), and for qwen3-0.6b and qwen2.5-7b (q/k head norms, q/k/v biases) at batch 1 and 64,
// context 1024, each with the bytes it must move (weights + KV read) and the fraction of the measured
// bandwidths it reached; the bf16 matrix rate of the backend's own cuBLASLt product (a square
// 8192³ one and llama-8b's widest prefill product) and prefill at a 2048-token prompt — tokens/s,
// its FLOPs (linear layers, causal attention, one lm_head row) and their rate as a fraction of that
// matrix rate — and, for the Llama shapes, that prefill's per-phase profile; host time per step and the
// host's critical path (the device's idle time between steps, from CUDA events), with step k+1
// submitted before step k is collected as the serving loop runs, and one step at a time; and a
// per-phase profile of the batch-1 decode step (CUDA events between phases, inside the graph),
// with lockstep's GEMV and with cuBLAS for the linear layers; and the second peer for the Llama
// shapes at batch 1 and 64: cuBLASLt replaying only the model's linear layers in one graph. Writes JSON (date, GPU, driver,
// commit, figures). The PyTorch peer (bench/torch_peer.py) runs in the same gpu-run.sh call.
//
// In the full run the Llama shapes also decode (context 1024) with the forward's kernels
// overlapped and in plain order (batch 1, 16, 64), and with the decode GEMV's fused forms and
// without (batch 1); --fusion runs only that comparison, at batch 1, 4 and 8 (the GEMV's steps),
// and the fused GEMV's grid, one group a block against one wave (batch 1).
// They also decode with lockstep's small-M GEMM and with cuBLAS for the linear layers (batch 2 to
// 64), the default (large products on the small-M GEMM above small_m_gemm_tokens_max tokens)
// against every product on cuBLAS there (batch 48 and 64), and time each projection's kernel both
// ways at 1, 16 and 64 tokens; --small-m runs only that. Last, what each kernel of a layer adds to
// a step inside its graph, left out of every layer one at a time (batch 1 and 64, context 1024);
// --leave-out runs only that.
//
// With --invariant: batch-invariant mode (issue 15, --determinism invariant: the small-M GEMM for
// every linear layer) against the default kernels instead, decode at batch 1, 16 and 64, context
// 1024, in alternating blocks.
//
// With --prefill: only the 2048-token prefill (issue 14), with prefill attention on the tile kernel
// (the default) and on the decode kernel (as batch-invariant mode runs it), each timed and
// profiled by phase, for llama-1b and llama-8b unless --shapes.
//
// With --recording: the cost of recording (issue 12) instead — decode at context 1024, batch 1,
// 16 and 64, running ahead, with and without the trace recorder (the executor computing digests,
// top-8 and the rows' state in the step; a Recorder writing every input and output record to a
// file), alternating blocks of steps on the two, with the step time, the device idle between
// steps and the trace bytes per step of each.
//
// With --tp N (issue 18): tensor-parallel decode instead — llama-8b (or --shapes) at TP N, one rank
// per GPU over NCCL (all ranks on GPU 0 when the host has fewer than N: figures of the machinery,
// not of speed), batch 1 and 64 at context 1024, each against the summed read bandwidth of the
// GPUs the ranks run on (each measured) and the bytes the whole model moves per step.
//
// With --hybrid (issue 19): decode of a hybrid shape instead — Bamba-9B's (29 Mamba2 layers, 3
// attention layers; random bf16 weights made on the host, since seeded weights have no layout for
// the mixer) at batch 1 and 64, context 1024, with graphs, against the read bandwidth: the bytes
// it must move are the weights, the attention layers' KV and every row's recurrent state (read and
// written once per Mamba layer).
//
//   lockstep_gpu_bench OUT.json [--quick] [--shapes llama-1b,llama-8b,qwen3-0.6b,qwen2.5-7b]
//                      [--hybrid]      (hybrid: Bamba-9B's shape)
//                      [--fusion]      (fused vs unfused decode: llama-1b and llama-8b unless --shapes)
//                      [--small-m]     (small-M GEMM vs cuBLAS: llama-1b and llama-8b unless --shapes)
//                      [--small-m-sweep] (small-M GEMM at every split count: the same shapes)
//                      [--invariant]   (batch-invariant mode vs default: llama-1b and llama-8b unless --shapes)
//                      [--prefill]     (prefill attention, tile vs decode kernel: llama-1b and llama-8b unless --shapes)
//                      [--decode]      (only each shape's prefill and decode table: an A/B's figures)
//                      [--recording]   (recording: llama-1b and llama-8b unless --shapes)
//                      [--tp N]        (TP: llama-8b unless --shapes)
#include "bench/gpu_bandwidth.h"
#include "bench/gpu_run_header.h"
#include "core/check.h"
#include "core/executor.h"
#include "kernels/attention.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_check.h"
#include "kernels/gemm.h"
#include "kernels/gemm_plans.h"
#include "kernels/gemm_small_m.h"
#include "kernels/gemm_small_m_tuning.h"
#include "kernels/logits_ops.h"
#include "kernels/tp_collectives.h"
#include "kernels/tp_cuda_backend.h"
#include "kernels/weight_init.h"
#include "trace/recorder.h"
#include "trace/trace_observer.h"

#include <CLI/CLI.hpp>
#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ls {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr uint64_t kWeightsSeed = 1234;
constexpr int32_t kPageSize = 16;
constexpr int32_t kPrefillChunk = 2048;
constexpr int32_t kRowsMax = 64;
constexpr int32_t kDecodeSlack = 64;  // decode steps past the context, warm-up included

using bench::Bandwidth;
using bench::measure_bandwidth;
using bench::median;
using bench::median_seconds;

// The bf16 matrix rate (FLOP/s) of the backend's own product (kernels/gemm_plans.h: bf16 operands,
// fp32 accumulation and output, the algorithm cuBLASLt's heuristic gives first) on a square
// 8192³ product and on llama-8b's widest prefill product (2048 tokens × gate/up), seeded
// operands (all-zero ones would draw less power): the rate a prefill's fraction is counted from is
// the faster of the two.
struct MatrixRate {
  double square = 0;   // FLOP/s, [8192, 8192] · [8192, 8192]ᵀ
  double prefill = 0;  // FLOP/s, [2048, 4096] · [28672, 4096]ᵀ
  double best() const { return std::max(square, prefill); }
};

double gemm_rate(kernels::GemmPlans& plans, int32_t tokens, int32_t out, int32_t in,
                 int32_t repeats) {
  __nv_bfloat16* x = nullptr;
  __nv_bfloat16* w = nullptr;
  float* y = nullptr;
  LS_CUDA(cudaMalloc(&x, sizeof(__nv_bfloat16) * size_t(tokens) * size_t(in)));
  LS_CUDA(cudaMalloc(&w, sizeof(__nv_bfloat16) * size_t(out) * size_t(in)));
  LS_CUDA(cudaMalloc(&y, sizeof(float) * size_t(tokens) * size_t(out)));
  LS_CUDA(kernels::launch_seeded_bf16(x, {tokens, in, 0, in}, 7, 0, 0.0f, 1.0f, nullptr));
  LS_CUDA(kernels::launch_seeded_bf16(w, {out, in, 0, in}, 7, 1, 0.0f, 0.05f, nullptr));
  LS_REQUIRE(plans.prepare(tokens, out, in, false) == CUBLAS_STATUS_SUCCESS,
             "matrix rate: no cuBLASLt plan for [{}, {}] x [{}, {}]", tokens, in, out, in);
  kernels::GemmPlans::Plan* plan = plans.find(tokens, out, in, false);
  const double seconds = median_seconds(nullptr, repeats, [&](int32_t) {
    LS_REQUIRE(plans.run(*plan, x, w, y, 0.0f) == CUBLAS_STATUS_SUCCESS, "matrix rate: run failed");
  });
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
  return 2.0 * tokens * double(out) * double(in) / seconds;
}

MatrixRate measure_matrix_rate(int32_t repeats) {
  constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  void* workspace = nullptr;
  LS_CUDA(cudaMalloc(&workspace, kWorkspaceBytes));
  MatrixRate rate;
  {
    kernels::GemmPlans plans(nullptr, workspace, kWorkspaceBytes);
    rate.square = gemm_rate(plans, 8192, 8192, 8192, repeats);
    rate.prefill = gemm_rate(plans, kPrefillChunk, 28672, 4096, repeats);
  }
  cudaFree(workspace);
  return rate;
}

// What one prefill of `tokens` tokens from an empty cache computes, counted as 2 FLOPs a
// multiply-add: every layer's linear products over every token (q/k/v, o, gate/up, down), the
// causal attention (q·kᵀ and p·v over the t + 1 keys of token t), and the lm_head for the one row
// the step samples.
struct PrefillFlops {
  double linear = 0, attention = 0, lm_head = 0;
  double total() const { return linear + attention + lm_head; }
};

PrefillFlops prefill_flops(const ModelConfig& m, int32_t tokens) {
  const double t = tokens, hidden = m.hidden_size, hd = m.head_dim;
  const double q_dim = hd * m.query_heads_count, kv_dim = hd * m.kv_heads_count;
  const double per_token = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden +
                           3 * hidden * double(m.ffn_size);
  PrefillFlops f;
  f.linear = 2 * t * per_token * m.layers_count;
  f.attention = 4 * hd * m.query_heads_count * (t * (t + 1) / 2) * m.layers_count;
  f.lm_head = 2 * hidden * double(m.vocab_size);
  return f;
}

ExecutorConfig bench_config(int32_t context_max) {
  ExecutorConfig c;
  c.max_batch_rows = kRowsMax;
  c.context_length = std::max(context_max, kPrefillChunk) + kDecodeSlack;
  c.page_size = kPageSize;
  const int32_t pages_per_row = (c.context_length + kPageSize - 1) / kPageSize;
  c.pages_count = kRowsMax * pages_per_row + 2;
  c.verify_width = 1;
  c.prefill_chunk_tokens = kPrefillChunk;
  return c;
}

// Drives an executor with hand-made ops: prefill `rows` requests to `context` tokens, then decode.
class Driver {
 public:
  // `sampling`: every request's parameters (greedy unless given).
  Driver(Executor& executor, const ExecutorConfig& config, int32_t vocab,
         const SamplingParams& sampling = {})
      : executor_(executor), config_(config), vocab_(vocab), sampling_(sampling) {}
  // Every decode step's input before its submit and output after its collect, as the serving
  // loop's trace observer records them (null: no recording).
  void set_recorder(trace::Recorder* recorder) { recorder_ = recorder; }

  // Prefills pool rows 1..rows with fresh requests of `context` tokens; returns seconds.
  double prefill(int32_t rows, int32_t context) {
    const int32_t pages_per_row = (config_.context_length + kPageSize - 1) / kPageSize;
    const auto begin = Clock::now();
    int32_t row = 0;
    std::vector<int32_t> prefix(static_cast<size_t>(rows), 0);
    StepResult result;  // every chunk's, into the same buffers
    first_id_ = next_id_;
    next_id_ += static_cast<RequestId>(rows);
    while (row < rows) {
      ForwardOp op;
      int32_t budget = kPrefillChunk;
      while (row < rows && budget > 0) {
        const int32_t done = prefix[static_cast<size_t>(row)];
        const int32_t chunk = std::min(context - done, budget);
        OpRow r;
        r.kind = RowKind::kPrefill;
        r.request_id = first_id_ + static_cast<RequestId>(row);
        r.pool_row = row + 1;
        r.input_length = chunk;
        r.prefix_length = done;
        r.prompt_length = context;
        if (config_.mamba_slots_count > 0) r.mamba_working = row;  // a hybrid: slot = pool row − 1
        if (done == 0) {
          r.sampling = sampling_;
          for (int32_t p = 0; p < pages_per_row; ++p) r.refresh.pages.push_back(1 + row * pages_per_row + p);
          r.refresh.pages.resize(std::min<size_t>(r.refresh.pages.size(),
                                                  static_cast<size_t>(config_.table_width())));
        }
        for (int32_t t = 0; t < chunk; ++t) {
          op.prefill_token_ids.push_back(static_cast<int32_t>((uint64_t(row) * 7919 + uint64_t(done + t) * 31 + 3) %
                                                              static_cast<uint64_t>(vocab_)));
        }
        op.rows.push_back(std::move(r));
        budget -= chunk;
        prefix[static_cast<size_t>(row)] += chunk;
        if (prefix[static_cast<size_t>(row)] == context) ++row;
      }
      executor_.step(op, result);
    }
    return std::chrono::duration<double>(Clock::now() - begin).count();
  }

  // Per timed step: wall seconds, host seconds (wall less the wait for the device), the host
  // split (forward(); the finish's enqueue and collect less the wait; the executor's own rest),
  // and the device's idle time before the step and busy time in it (CudaStepTiming, NaN unless
  // the backend times steps).
  struct DecodeTimes {
    std::vector<double> wall, host, idle, busy;
    std::array<std::vector<double>, 3> split;
  };

  // Decodes rows 1..rows for `steps` timed steps. Pipelined: step k+1 is submitted before step k
  // is collected, as the serving loop runs (one more step runs, submitted before the first timed
  // one); else one step at a time (Executor::step). Either way each timed iteration submits one
  // step and collects one.
  DecodeTimes decode(int32_t rows, int32_t steps, CudaBackend& backend, bool pipelined) {
    ForwardOp op;
    for (int32_t r = 0; r < rows; ++r) {
      OpRow row;
      row.kind = RowKind::kDecode;
      row.request_id = first_id_ + static_cast<RequestId>(r);
      row.pool_row = r + 1;
      row.input_length = 1;
      if (config_.mamba_slots_count > 0) row.mamba_working = r;
      op.rows.push_back(row);
    }
    DecodeTimes t;
    if (pipelined) submit(op);
    for (int32_t s = 0; s < steps; ++s) {
      const auto begin = Clock::now();
      submit(op);
      collect();
      const double wall = std::chrono::duration<double>(Clock::now() - begin).count();
      const double host = wall - static_cast<double>(backend.last_wait_ns()) * 1e-9;
      const double forward = static_cast<double>(backend.last_forward_ns()) * 1e-9;
      const double finish =
          static_cast<double>(backend.last_finish_ns() - backend.last_wait_ns()) * 1e-9;
      t.wall.push_back(wall);
      t.host.push_back(host);
      t.split[0].push_back(forward);
      t.split[1].push_back(finish);
      t.split[2].push_back(host - forward - finish);
      const CudaStepTiming timing = backend.last_step_timing();
      // The first pipelined step was submitted after a synchronous one: not steady state.
      if (!std::isnan(timing.idle_before_ms) && (!pipelined || s > 0)) {
        t.idle.push_back(timing.idle_before_ms * 1e-3);
      }
      if (!std::isnan(timing.busy_ms)) t.busy.push_back(timing.busy_ms * 1e-3);
    }
    if (pipelined) collect();  // the step submitted last, untimed
    return t;
  }

 private:
  void submit(const ForwardOp& op) {
    if (recorder_) recorder_->record_input(submitted_, op);
    executor_.submit(op);
    ++submitted_;
  }
  void collect() {
    executor_.collect(result_);
    if (recorder_) recorder_->record_output(collected_, result_, StateSnapshot{});
    ++collected_;
  }

  trace::Recorder* recorder_ = nullptr;
  int64_t submitted_ = 0;  // trace step indices of the decode steps
  int64_t collected_ = 0;
  Executor& executor_;
  ExecutorConfig config_;
  int32_t vocab_;
  SamplingParams sampling_;
  StepResult result_;  // reused by every collect
  RequestId next_id_ = 1;
  RequestId first_id_ = 1;
};

// Block `block`'s order of two drivers: x then y, then y then x (ABBA), so that a drift within a
// block (the clocks after a prefill) falls on both alike.
std::array<Driver*, 2> abba(int32_t block, Driver* x, Driver* y) {
  return block % 2 == 0 ? std::array<Driver*, 2>{x, y} : std::array<Driver*, 2>{y, x};
}

// Bytes one decode step must move: every linear weight and the LM head once (bf16), the norm
// weights, Qwen2's q/k/v biases and Qwen3's q/k head norms (fp32 on the device), plus the KV of
// every row's context (read) — the floor a memory-bound step cannot beat. A hybrid's Mamba layers
// move their in_proj and out_proj (bf16) and mixer parameters (fp32) instead of attention's, no
// KV, and each row's recurrent state (fp32), read and written.
struct DecodeBytes {
  int64_t weights = 0, kv = 0, state = 0;
  int64_t total() const { return weights + kv + state; }
};

DecodeBytes decode_bytes_split(const ModelConfig& m, int32_t rows, int32_t context) {
  const int64_t h = m.hidden_size;
  const int64_t mambas = m.mamba_layers_count(), attentions = m.layers_count - mambas;
  const MambaConfig& c = m.mamba;
  const int64_t attention = h * (m.q_size() + 2 * m.kv_size()) + int64_t{m.q_size()} * h;
  const int64_t mixer = h * c.in_proj_size() + int64_t{c.inner_size()} * h;
  const int64_t ffn = 3 * h * m.ffn_size;
  const int64_t fp32_attention = (m.qkv_bias ? m.q_size() + 2 * m.kv_size() : 0) +
                                 (m.qk_norm ? 2 * m.head_dim : 0);
  const int64_t fp32_mixer = c.conv_state_floats() + (c.conv_bias ? c.conv_dim() : 0) +
                             3 * int64_t{c.heads_count} + c.inner_size();
  DecodeBytes b;
  b.weights = 2 * (attention * attentions + mixer * mambas + ffn * m.layers_count +
                   int64_t{m.vocab_size} * h) +
              4 * (2 * h * m.layers_count + fp32_attention * attentions + fp32_mixer * mambas + h);
  b.kv = 2 * int64_t{rows} * context * attentions * 2 * m.kv_size();
  b.state = 2 * int64_t{rows} * mambas * (c.conv_state_floats() + c.ssm_state_floats()) * 4;
  return b;
}

int64_t decode_bytes(const ModelConfig& m, int32_t rows, int32_t context) {
  return decode_bytes_split(m, rows, context).total();
}

struct Options {
  std::string out_path;
  bool quick = false;
  bool recording = false;     // only the recording figures
  bool hybrid = false;        // only the hybrid decode figures
  bool fusion = false;        // only the fused vs unfused decode figures
  bool small_m = false;       // only the small-M GEMM vs cuBLAS figures
  bool small_m_sweep = false; // only the small-M GEMM at every split count
  bool invariant = false;     // only batch-invariant mode vs the default
  bool prefill = false;       // only the prefill with and without the attention tile kernel
  bool decode = false;        // only each shape's prefill and decode table (an A/B's figures)
  bool sampling = false;      // only sampled decode rows vs greedy
  bool leave_out = false;     // only what each kernel adds to a step in its graph
  int32_t tp_degree = 1;      // > 1: only the tensor-parallel decode figures
  bool shapes_given = false;
  std::vector<std::string> shapes = {"llama-1b", "llama-8b", "qwen3-0.6b", "qwen2.5-7b"};
};

// The Llama shapes get the whole set (profiles, contexts 192 and 1024, batches 1/16/64, eager);
// the other families' shapes decode at batch 1 and 64, context 1024 (issue 11), which is what
// tells a second family's step apart at little device time.
bool full_set(const std::string& shape) { return shape.starts_with("llama-"); }

constexpr int32_t kWarmupSteps = 5;

// Decode figures of one (batch, context): pipelined, as the serving loop runs (the figures that
// count), then one step at a time (the same steps synchronously, for comparison). The host
// critical path is the device's idle time between consecutive steps (CUDA events at the start
// of a step's stream work and at its end), which the host's work per step only adds to when it
// cannot hide behind the device's.
json decode_figures(Driver& driver, CudaBackend& backend, const ModelConfig& model, int32_t rows,
                    int32_t context, int32_t steps, const Bandwidth& bandwidth, const char* label) {
  driver.prefill(rows, context);
  driver.decode(rows, kWarmupSteps, backend, false);
  const Driver::DecodeTimes piped = driver.decode(rows, steps, backend, true);
  const Driver::DecodeTimes sync = driver.decode(rows, steps, backend, false);
  const double step_s = median(piped.wall);
  const int32_t mean_context = context + kWarmupSteps + steps / 2;
  const int64_t bytes = decode_bytes(model, rows, mean_context);
  const double of_copy = static_cast<double>(bytes) / step_s / bandwidth.copy;
  const double of_read = static_cast<double>(bytes) / step_s / bandwidth.read;
  auto us = [](const std::vector<double>& v) {
    return v.empty() ? std::numeric_limits<double>::quiet_NaN() : median(v) * 1e6;
  };
  std::printf("  %s decode batch %2d context %4d: %.3f ms/step, host %.1f us, host critical path "
              "%.1f us (device idle between steps), %.2f GB moved, %.1f%% of copy BW, %.1f%% of "
              "read BW\n",
              label, rows, context, step_s * 1e3, us(piped.host), us(piped.idle),
              static_cast<double>(bytes) * 1e-9, of_copy * 100, of_read * 100);
  std::printf("    host split (medians): forward %.1f us, finish less its wait %.1f us, "
              "executor rest %.1f us; device busy %.1f us/step\n",
              us(piped.split[0]), us(piped.split[1]), us(piped.split[2]), us(piped.busy));
  std::printf("    one step at a time: %.3f ms/step, host %.1f us, host critical path %.1f us\n",
              median(sync.wall) * 1e3, us(sync.host), us(sync.idle));
  return {{"batch", rows},
          {"pipelined", true},
          {"host_forward_us_median", us(piped.split[0])},
          {"host_finish_us_median", us(piped.split[1])},
          {"host_executor_us_median", us(piped.split[2])},
          {"host_critical_path_us_median", us(piped.idle)},
          {"gpu_busy_us_median", us(piped.busy)},
          {"context", context},
          {"mean_context", mean_context},
          {"step_ms_median", step_s * 1e3},
          {"host_us_median", us(piped.host)},
          {"sync",
           {{"step_ms_median", median(sync.wall) * 1e3},
            {"host_us_median", us(sync.host)},
            {"host_critical_path_us_median", us(sync.idle)},
            {"gpu_busy_us_median", us(sync.busy)},
            {"host_forward_us_median", us(sync.split[0])},
            {"host_finish_us_median", us(sync.split[1])},
            {"host_executor_us_median", us(sync.split[2])}}},
          {"bytes_moved", bytes},
          {"bytes_moved_weights", decode_bytes_split(model, rows, mean_context).weights},
          {"bytes_moved_kv", decode_bytes_split(model, rows, mean_context).kv},
          {"bytes_moved_state", decode_bytes_split(model, rows, mean_context).state},
          {"bandwidth_fraction", of_copy},
          {"read_bandwidth_fraction", of_read},
          {"steps", steps}};
}

json bench_shape(const std::string& shape, const Options& o, const Bandwidth& bandwidth,
                 const MatrixRate& matrix_rate) {
  const ModelConfig model = model_config_named(shape);
  const bool full = full_set(shape);
  const std::vector<int32_t> contexts = o.quick  ? std::vector<int32_t>{192}
                                        : full   ? std::vector<int32_t>{192, 1024}
                                                 : std::vector<int32_t>{1024};
  const std::vector<int32_t> batches =
      o.quick || !full ? std::vector<int32_t>{1, 64} : std::vector<int32_t>{1, 16, 64};
  const int32_t steps = o.quick ? 10 : 20;
  ExecutorConfig config = bench_config(*std::max_element(contexts.begin(), contexts.end()));
  // KV pages sized at start-up from the default fraction of the memory left after weights and
  // workspaces (the backend's rule, as `--backend cuda` with `--pages 0` does).
  const CudaBackendOptions options{.graphs = true, .time_steps = true};
  const CudaKvSizing sizing = cuda_kv_sizing(model, config, options);
  config.pages_count = sizing.pages_count;
  CudaBackend backend(DeviceSeededWeights{model, kWeightsSeed}, config, options);
  Executor executor(config, model.vocab_size, backend);
  Driver driver(executor, config, model.vocab_size);
  const CudaMemoryReport memory = backend.memory_report();
  const int64_t kv_tokens = int64_t{config.pages_count - 1} * config.page_size;  // page 0: dummy
  size_t free_after = 0, total_bytes = 0;
  LS_CUDA(cudaMemGetInfo(&free_after, &total_bytes));
  json result = {{"shape", shape},
                 {"family", std::string(to_string(model.family))},
                 {"graphs", true},
                 {"weight_bytes", memory.weight_bytes},
                 {"kv_bytes", memory.kv_bytes},
                 {"workspace_bytes", memory.workspace_bytes},
                 {"kv_memory_fraction", options.kv_memory_fraction},
                 {"free_bytes_before", sizing.free_bytes},
                 {"free_bytes_after", static_cast<int64_t>(free_after)},
                 {"device_memory_bytes", static_cast<int64_t>(total_bytes)},
                 {"kv_pages", config.pages_count},
                 {"kv_tokens_capacity", kv_tokens},
                 {"decode", json::array()}};
  std::printf("%s: weights %.2f GB, KV %.2f GB (%.0f%% of the %.2f GB left after weights and "
              "workspaces), workspace %.2f GB; KV capacity %ld tokens (%d pages of %d)\n",
              shape.c_str(), static_cast<double>(memory.weight_bytes) * 1e-9,
              static_cast<double>(memory.kv_bytes) * 1e-9, options.kv_memory_fraction * 100,
              static_cast<double>(sizing.free_bytes - sizing.weight_bytes - sizing.workspace_bytes) *
                  1e-9,
              static_cast<double>(memory.workspace_bytes) * 1e-9, static_cast<long>(kv_tokens),
              config.pages_count, config.page_size);
  // Prefill of one 2048-token prompt (one chunk), after a warm-up prefill.
  driver.prefill(1, kPrefillChunk);
  const double prefill_s = driver.prefill(1, kPrefillChunk);
  result["prefill_2048_tokens_per_s"] = kPrefillChunk / prefill_s;
  result["prefill_2048_ms"] = prefill_s * 1e3;
  const PrefillFlops flops = prefill_flops(model, kPrefillChunk);
  const double prefill_rate = flops.total() / prefill_s;
  result["prefill_2048_flops"] = flops.total();
  result["prefill_2048_flop_per_s"] = prefill_rate;
  result["prefill_2048_matrix_rate_fraction"] = prefill_rate / matrix_rate.best();
  std::printf("  prefill 2048 tokens: %.1f ms, %.0f tokens/s, %.1f TFLOP/s (%.1f TFLOP: linear "
              "layers %.1f, attention %.2f, lm_head row %.4f), %.1f%% of the measured matrix rate\n",
              prefill_s * 1e3, kPrefillChunk / prefill_s, prefill_rate * 1e-12, flops.total() * 1e-12,
              flops.linear * 1e-12, flops.attention * 1e-12, flops.lm_head * 1e-12,
              100 * prefill_rate / matrix_rate.best());
  for (const int32_t context : contexts) {
    for (const int32_t rows : batches) {
      result["decode"].push_back(
          decode_figures(driver, backend, model, rows, context, steps, bandwidth, "graphs"));
    }
  }
  result["graph_replays"] = backend.graph_replays_count();
  return result;
}

// Bamba-9B's shape (ibm-ai-platform/Bamba-9B's config.json): 32 layers, attention at 9, 18 and
// 27; 128 Mamba heads of 64, one group, state 128, conv 4; partial rotary over half of each head.
ModelConfig bamba_9b_shape() {
  ModelConfig c;
  c.name = "bamba-9b";
  c.family = ModelFamily::kBamba;
  c.hidden_size = 4096;
  c.layers_count = 32;
  c.query_heads_count = 32;
  c.kv_heads_count = 8;
  c.head_dim = 128;
  c.ffn_size = 14336;
  c.vocab_size = 128000;
  c.rms_eps = 1e-5f;
  c.partial_rotary_dim = 64;
  c.layer_kinds.assign(32, LayerKind::kMamba2);
  for (const int32_t l : {9, 18, 27}) c.layer_kinds[static_cast<size_t>(l)] = LayerKind::kAttention;
  c.mamba = MambaConfig{.heads_count = 128, .head_dim = 64, .groups_count = 1, .state_size = 128,
                        .conv_kernel = 4, .conv_bias = true, .dt_min = 0.0f,
                        .dt_max = std::numeric_limits<float>::infinity()};
  c.validate();
  return c;
}

// Random host weights for a shape (uniform ±1/sqrt(in) linear weights, norms around 1, A = −1):
// a hash of (tensor, element), filled on every core. Only the step time is measured.
ModelWeights random_host_weights(const ModelConfig& config) {
  ModelWeights w;
  w.config = config;
  uint64_t tensor = 0;
  const auto fill = [&tensor](std::vector<float>& v, int64_t count, float center, float half) {
    v.resize(static_cast<size_t>(count));
    const uint64_t key = ++tensor * 0x9e3779b97f4a7c15ull;
    const int64_t threads = std::max<int64_t>(1, std::thread::hardware_concurrency());
    const int64_t per = (count + threads - 1) / threads;
    std::vector<std::thread> workers;
    for (int64_t begin = 0; begin < count; begin += per) {
      workers.emplace_back([&v, key, center, half, begin, end = std::min(count, begin + per)] {
        for (int64_t i = begin; i < end; ++i) {
          uint64_t z = key + static_cast<uint64_t>(i) * 0xbf58476d1ce4e5b9ull;
          z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
          z ^= z >> 29;
          const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
          v[static_cast<size_t>(i)] = center + half * (2.0f * u - 1.0f);
        }
      });
    }
    for (std::thread& t : workers) t.join();
  };
  const int64_t h = config.hidden_size;
  const auto linear = [&](std::vector<float>& v, int64_t out, int64_t in) {
    fill(v, out * in, 0.0f, 1.0f / std::sqrt(static_cast<float>(in)));
  };
  fill(w.embedding, int64_t{config.vocab_size} * h, 0.0f, 1.0f);
  const MambaConfig& m = config.mamba;
  w.layers.resize(static_cast<size_t>(config.layers_count));
  for (int32_t l = 0; l < config.layers_count; ++l) {
    LayerWeights& x = w.layers[static_cast<size_t>(l)];
    fill(x.attn_norm, h, 1.0f, 0.125f);
    fill(x.ffn_norm, h, 1.0f, 0.125f);
    linear(x.w_gate, config.ffn_size, h);
    linear(x.w_up, config.ffn_size, h);
    linear(x.w_down, h, config.ffn_size);
    if (config.layer_kind(l) == LayerKind::kAttention) {
      linear(x.wq, config.q_size(), h);
      linear(x.wk, config.kv_size(), h);
      linear(x.wv, config.kv_size(), h);
      linear(x.wo, h, config.q_size());
      continue;
    }
    linear(x.in_proj, m.in_proj_size(), h);
    fill(x.conv_weight, m.conv_state_floats(), 0.0f, 0.5f);
    if (m.conv_bias) fill(x.conv_bias, m.conv_dim(), 0.0f, 0.125f);
    fill(x.dt_bias, m.heads_count, 0.0f, 1.0f);
    fill(x.a_log, m.heads_count, 0.0f, 0.0f);
    fill(x.d_skip, m.heads_count, 1.0f, 0.125f);
    fill(x.mamba_norm, m.inner_size(), 1.0f, 0.125f);
    linear(x.out_proj, h, m.inner_size());
  }
  fill(w.final_norm, h, 1.0f, 0.125f);
  if (!config.tied_embeddings) linear(w.lm_head, config.vocab_size, h);
  return w;
}

// A hybrid shape's decode at batch 1 and 64, context 1024 (192 with --quick), with graphs: step
// time against the bytes it must move (weights, KV, state) and the read bandwidth.
json bench_hybrid(const Options& o, const Bandwidth& bandwidth) {
  const ModelConfig model = bamba_9b_shape();
  const int32_t context = o.quick ? 192 : 1024;
  ExecutorConfig config = bench_config(context);
  config.mamba_slots_count = kRowsMax;
  const CudaBackendOptions options{.graphs = true, .time_steps = true};
  const CudaKvSizing sizing = cuda_kv_sizing(model, config, options);
  config.pages_count = sizing.pages_count;
  const auto made = Clock::now();
  CudaBackend backend(random_host_weights(model), config, options);
  const double setup_s = std::chrono::duration<double>(Clock::now() - made).count();
  Executor executor(config, model.vocab_size, backend);
  Driver driver(executor, config, model.vocab_size);
  const CudaMemoryReport memory = backend.memory_report();
  std::printf("%s (hybrid: %d Mamba2 + %d attention layers): weights %.2f GB, KV %.2f GB, "
              "workspace and state pool %.2f GB; built in %.1f s\n",
              model.name.c_str(), model.mamba_layers_count(),
              model.layers_count - model.mamba_layers_count(),
              static_cast<double>(memory.weight_bytes) * 1e-9,
              static_cast<double>(memory.kv_bytes) * 1e-9,
              static_cast<double>(memory.workspace_bytes) * 1e-9, setup_s);
  json result = {{"shape", model.name},
                 {"family", std::string(to_string(model.family))},
                 {"mamba_layers", model.mamba_layers_count()},
                 {"graphs", true},
                 {"weight_bytes", memory.weight_bytes},
                 {"kv_bytes", memory.kv_bytes},
                 {"workspace_bytes", memory.workspace_bytes},
                 {"kv_pages", config.pages_count},
                 {"decode", json::array()}};
  for (const int32_t rows : {1, 64}) {
    result["decode"].push_back(decode_figures(driver, backend, model, rows, context,
                                              o.quick ? 10 : 20, bandwidth, "hybrid"));
  }
  result["graph_replays"] = backend.graph_replays_count();
  return result;
}

// Batch 1 at context 192, eagerly (no graphs): the host-bound reference.
// The second peer (issue 14): cuBLASLt replaying only the model's linear layers — every layer's
// q/k/v, o, gate/up and down products and the LM head, each layer's weights its own, pinned plans
// as the backend makes them — in one CUDA graph, with nothing between them: the bound a design of
// one product per projection starts from (no attention, norms or activations). The bytes are the
// weights these products read; the fraction is of the read bandwidth measured in the same run.
json linear_layers_peer(const std::string& shape, int32_t rows, const Bandwidth& bandwidth) {
  const ModelConfig m = model_config_named(shape);
  const int32_t q = m.query_heads_count * m.head_dim, kv = m.kv_heads_count * m.head_dim;
  struct Product {
    int32_t out, in;
    bool accumulate;
  };
  const Product layer[] = {{q + 2 * kv, m.hidden_size, false}, {m.hidden_size, q, true},
                           {2 * m.ffn_size, m.hidden_size, false}, {m.hidden_size, m.ffn_size, true}};
  const Product head{m.vocab_size, m.hidden_size, false};
  cudaStream_t stream = nullptr;
  LS_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t workspace_bytes = size_t{32} << 20;
  void* workspace = nullptr;
  LS_CUDA(cudaMalloc(&workspace, workspace_bytes));
  kernels::GemmPlans plans(stream, workspace, workspace_bytes);
  std::vector<void*> weights;
  int64_t weight_bytes = 0;
  const auto weight = [&](const Product& p) {
    const size_t bytes = size_t{2} * static_cast<size_t>(p.out) * static_cast<size_t>(p.in);
    void* w = nullptr;
    LS_CUDA(cudaMalloc(&w, bytes));
    LS_CUDA(cudaMemset(w, 0x3c, bytes));  // bf16 ≈ 0.01: finite, the values do not matter
    weights.push_back(w);
    weight_bytes += static_cast<int64_t>(bytes);
    LS_CUBLAS(plans.prepare(rows, p.out, p.in, p.accumulate));
    return w;
  };
  const int32_t widest = std::max({q + 2 * kv, 2 * m.ffn_size, m.vocab_size});
  void* x = nullptr;
  float* y = nullptr;
  LS_CUDA(cudaMalloc(&x, size_t{2} * rows * std::max(m.ffn_size, m.hidden_size)));
  LS_CUDA(cudaMemset(x, 0x3c, size_t{2} * rows * std::max(m.ffn_size, m.hidden_size)));
  LS_CUDA(cudaMalloc(&y, sizeof(float) * rows * widest));
  struct Launch {
    Product p;
    void* w;
  };
  std::vector<Launch> launches;
  for (int32_t l = 0; l < m.layers_count; ++l) {
    for (const Product& p : layer) launches.push_back({p, weight(p)});
  }
  launches.push_back({head, weight(head)});
  const auto enqueue_all = [&] {
    for (const Launch& launch : launches) {
      kernels::GemmPlans::Plan* plan = plans.find(rows, launch.p.out, launch.p.in, launch.p.accumulate);
      LS_ASSERT(plan != nullptr, "no plan for [{}, {}]", launch.p.out, launch.p.in);
      LS_CUBLAS(plans.run(*plan, static_cast<const __nv_bfloat16*>(x),
                          static_cast<const __nv_bfloat16*>(launch.w), y,
                          launch.p.accumulate ? 1.0f : 0.0f));
    }
  };
  enqueue_all();  // warm-up, eagerly
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  LS_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  enqueue_all();
  LS_CUDA(cudaStreamEndCapture(stream, &graph));
  LS_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const double ms =
      1e3 * median_seconds(stream, 20, [&](int32_t) { LS_CUDA(cudaGraphLaunch(exec, stream)); });
  const double of_read = static_cast<double>(weight_bytes) / (ms * 1e-3) / bandwidth.read;
  std::printf("  %s cuBLAS linear layers alone (one graph, %zu products), batch %2d: %.3f ms, "
              "%.2f GB of weights, %.1f%% of read BW\n", shape.c_str(), launches.size(), rows, ms,
              static_cast<double>(weight_bytes) * 1e-9, of_read * 100.0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  for (void* w : weights) cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  cudaFree(workspace);
  cudaStreamDestroy(stream);
  return {{"shape", shape}, {"batch", rows}, {"ms", ms}, {"weight_bytes", weight_bytes},
          {"read_bandwidth_fraction", of_read}};
}

// A linear shape of the model, for the kernel-level figures.
struct Projection {
  const char* name;
  int32_t out, in;
  bool accumulate;
};

std::vector<Projection> projections_of(const ModelConfig& m) {
  return {{"qkv", m.q_size() + 2 * m.kv_size(), m.hidden_size, false},
          {"o", m.hidden_size, m.q_size(), true},
          {"gate_up", 2 * m.ffn_size, m.hidden_size, false},
          {"down", m.hidden_size, m.ffn_size, true},
          {"lm_head", m.vocab_size, m.hidden_size, false}};
}

// One projection's buffers for timing its kernel alone: copies of the weights enough to pass
// 256 MB (so that no product finds its weights in the L2), the same x (64 tokens), y and
// zeroed workspace for all. ms() is the time a product of a graph of back-to-back products,
// each over the next copy of the weights.
class ProjectionRig {
 public:
  ProjectionRig(const Projection& p, size_t workspace_bytes, cudaStream_t stream)
      : p_(p), stream_(stream), weight_bytes_(size_t{2} * static_cast<size_t>(p.out) *
                                              static_cast<size_t>(p.in)) {
    copies_ = static_cast<int32_t>(std::max<size_t>(2, (size_t{256} << 20) / weight_bytes_ + 1));
    LS_CUDA(cudaMalloc(&weights_, weight_bytes_ * static_cast<size_t>(copies_)));
    LS_CUDA(cudaMemset(weights_, 0x3c, weight_bytes_ * static_cast<size_t>(copies_)));  // ≈ 0.01
    const size_t x_bytes = size_t{2} * kernels::kSmallMGemmTokensMax * static_cast<size_t>(p.in);
    LS_CUDA(cudaMalloc(&x_, x_bytes));
    LS_CUDA(cudaMemset(x_, 0x3c, x_bytes));
    const size_t y_bytes =
        sizeof(float) * kernels::kSmallMGemmTokensMax * static_cast<size_t>(p.out);
    LS_CUDA(cudaMalloc(&y_, y_bytes));
    LS_CUDA(cudaMemset(y_, 0, y_bytes));
    workspace_bytes_ = std::max<size_t>(1, workspace_bytes);
    LS_CUDA(cudaMalloc(&workspace_, workspace_bytes_));
    LS_CUDA(cudaMemset(workspace_, 0, workspace_bytes_));
  }
  ~ProjectionRig() {
    cudaFree(weights_);
    cudaFree(x_);
    cudaFree(y_);
    cudaFree(workspace_);
  }
  ProjectionRig(const ProjectionRig&) = delete;
  ProjectionRig& operator=(const ProjectionRig&) = delete;

  const __nv_bfloat16* x() const { return static_cast<const __nv_bfloat16*>(x_); }
  float* y() const { return y_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  float beta() const { return p_.accumulate ? 1.0f : 0.0f; }
  size_t weight_bytes() const { return weight_bytes_; }

  // enqueue_one(w) launches one product over weights w on the rig's stream.
  template <typename Enqueue>
  double ms(Enqueue&& enqueue_one) {
    const int32_t launches = std::max(copies_, 24);
    for (int32_t i = 0; i < copies_; ++i) enqueue_one(copy(i));  // warm-up, eagerly
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    LS_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    for (int32_t i = 0; i < launches; ++i) enqueue_one(copy(i % copies_));
    LS_CUDA(cudaStreamEndCapture(stream_, &graph));
    LS_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    const double ms = 1e3 * median_seconds(stream_, 10, [&](int32_t) {
                        LS_CUDA(cudaGraphLaunch(exec, stream_));
                      });
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return ms / launches;
  }

  // The fraction of the read bandwidth a product of `ms` streams its weights at.
  double of_read(double ms, const Bandwidth& bandwidth) const {
    return static_cast<double>(weight_bytes_) / (ms * 1e-3) / bandwidth.read;
  }

 private:
  const __nv_bfloat16* copy(int32_t i) const {
    return reinterpret_cast<const __nv_bfloat16*>(static_cast<const uint8_t*>(weights_) +
                                                  weight_bytes_ * static_cast<size_t>(i));
  }

  Projection p_;
  cudaStream_t stream_;
  size_t weight_bytes_;
  int32_t copies_ = 0;
  void* weights_ = nullptr;
  void* x_ = nullptr;
  float* y_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// Kernel-level figure of the small-M GEMM (kernels/gemm_small_m.h) against the pinned cuBLASLt
// plan the backend would run, for each linear shape of the model at 1, 16 and 64 tokens
// (ProjectionRig), and at one token against the decode GEMV too (kernels/gemm.h: the default
// mode's o and down at batch 1, and the kernel its fused q/k/v and gate/up forms are made of —
// what batch-invariant mode's cost there is measured against);
// lockstep's kernels launched to overlap their predecessor, as the backend launches them. GB/s of
// weights and the fraction of the read bandwidth measured in the same run.
json small_m_kernel_figures(const std::string& shape, const Bandwidth& bandwidth) {
  const ModelConfig m = model_config_named(shape);
  cudaStream_t stream = nullptr;
  LS_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t cublas_bytes = size_t{32} << 20;
  void* cublas_workspace = nullptr;
  LS_CUDA(cudaMalloc(&cublas_workspace, cublas_bytes));
  kernels::GemmPlans plans(stream, cublas_workspace, cublas_bytes);
  json rows = json::array();
  for (const Projection& p : projections_of(m)) {
    ProjectionRig rig(
        p, kernels::gemm_small_m_workspace_bytes(p.out, p.in, kernels::kSmallMGemmTokensMax),
        stream);
    for (const int32_t tokens : {1, 16, 64}) {
      const double lockstep_ms = rig.ms([&](const __nv_bfloat16* w) {
        LS_CUDA(kernels::launch_gemm_small_m_bf16(rig.x(), w, rig.y(), tokens, p.out, p.in,
                                                  rig.beta(), rig.workspace(),
                                                  rig.workspace_bytes(),
                                                  kernels::LaunchStream(stream, true)));
      });
      LS_CUBLAS(plans.prepare(tokens, p.out, p.in, p.accumulate));
      kernels::GemmPlans::Plan* plan = plans.find(tokens, p.out, p.in, p.accumulate);
      LS_ASSERT(plan != nullptr, "no plan for [{}, {}]", p.out, p.in);
      const double cublas_ms = rig.ms([&](const __nv_bfloat16* w) {
        LS_CUBLAS(plans.run(*plan, rig.x(), w, rig.y(), rig.beta()));
      });
      const auto gbs = [&](double ms) {
        return static_cast<double>(rig.weight_bytes()) / (ms * 1e-3) * 1e-9;
      };
      std::printf("  %s %-7s [%6d, %5d] × %2d tokens: lockstep GEMM %.4f ms %.0f GB/s (%.1f%% of "
                  "read BW), cuBLAS %.4f ms %.0f GB/s (%.1f%%), %d splits",
                  shape.c_str(), p.name, p.out, p.in, tokens, lockstep_ms, gbs(lockstep_ms),
                  rig.of_read(lockstep_ms, bandwidth) * 100, cublas_ms, gbs(cublas_ms),
                  rig.of_read(cublas_ms, bandwidth) * 100,
                  kernels::gemm_small_m_splits(p.out, p.in));
      json gemv = nullptr;
      if (tokens == 1) {
        const double gemv_ms = rig.ms([&](const __nv_bfloat16* w) {
          LS_CUDA(kernels::launch_gemv_bf16(rig.x(), w, rig.y(), tokens, p.out, p.in, rig.beta(),
                                            kernels::LaunchStream(stream, true)));
        });
        std::printf(", GEMV %.4f ms %.0f GB/s (%.1f%%)", gemv_ms, gbs(gemv_ms),
                    rig.of_read(gemv_ms, bandwidth) * 100);
        gemv = {{"ms", gemv_ms}, {"read_bandwidth_fraction", rig.of_read(gemv_ms, bandwidth)}};
      }
      std::printf("\n");
      rows.push_back({{"shape", shape},
                      {"projection", p.name},
                      {"out", p.out},
                      {"in", p.in},
                      {"tokens", tokens},
                      {"splits", kernels::gemm_small_m_splits(p.out, p.in)},
                      {"weight_bytes", static_cast<int64_t>(rig.weight_bytes())},
                      {"ms_lockstep", lockstep_ms},
                      {"ms_cublas", cublas_ms},
                      {"read_bandwidth_fraction_lockstep", rig.of_read(lockstep_ms, bandwidth)},
                      {"read_bandwidth_fraction_cublas", rig.of_read(cublas_ms, bandwidth)},
                      {"gemv", gemv}});
    }
  }
  cudaFree(cublas_workspace);
  cudaStreamDestroy(stream);
  return rows;
}

// The small-M GEMM's design space (kernels/gemm_small_m_tuning.h): each projection but the LM
// head at 1, 8, 16, 32 and 64 tokens, K cut into 1 to 64 ranges (none under 2 chunks) — what the
// production split rule is chosen from. Fractions of the read bandwidth measured in the same run.
json small_m_sweep(const std::string& shape, const Bandwidth& bandwidth) {
  const ModelConfig m = model_config_named(shape);
  cudaStream_t stream = nullptr;
  LS_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  json rows = json::array();
  for (const Projection& p : projections_of(m)) {
    if (std::string(p.name) == "lm_head") continue;
    const int32_t chunks = (p.in + 63) / 64;
    size_t workspace_bytes = 0;
    for (int32_t wanted = 1; wanted <= 64; wanted *= 2) {
      workspace_bytes = std::max(workspace_bytes, kernels::gemm_small_m_workspace_bytes_with(
                                                      p.out, p.in, kernels::kSmallMGemmTokensMax,
                                                      wanted));
    }
    ProjectionRig rig(p, workspace_bytes, stream);
    for (const int32_t tokens : {1, 8, 16, 32, 64}) {
      for (int32_t wanted = 1; wanted <= 64 && chunks / wanted >= 2; wanted *= 2) {
        const int32_t splits = kernels::gemm_small_m_splits_with(p.out, p.in, wanted);
        const double ms = rig.ms([&](const __nv_bfloat16* w) {
          LS_CUDA(kernels::launch_gemm_small_m_bf16_with(
              rig.x(), w, rig.y(), tokens, p.out, p.in, rig.beta(), rig.workspace(),
              rig.workspace_bytes(), wanted, kernels::LaunchStream(stream, true)));
        });
        std::printf("  %s %-7s [%6d, %5d] × %2d tokens, %2d splits%s: %.4f ms %.1f%% of read BW\n",
                    shape.c_str(), p.name, p.out, p.in, tokens, splits,
                    splits == kernels::gemm_small_m_splits(p.out, p.in) ? " (production)" : "", ms,
                    rig.of_read(ms, bandwidth) * 100);
        rows.push_back({{"shape", shape},
                        {"projection", p.name},
                        {"out", p.out},
                        {"in", p.in},
                        {"tokens", tokens},
                        {"splits", splits},
                        {"production", splits == kernels::gemm_small_m_splits(p.out, p.in)},
                        {"ms", ms},
                        {"read_bandwidth_fraction", rig.of_read(ms, bandwidth)}});
      }
    }
  }
  cudaStreamDestroy(stream);
  return rows;
}

json bench_eager(const std::string& shape, const Options& o, const Bandwidth& bandwidth) {
  const ModelConfig model = model_config_named(shape);
  const ExecutorConfig config = bench_config(192);
  CudaBackend backend(DeviceSeededWeights{model, kWeightsSeed}, config,
                      CudaBackendOptions{.time_steps = true});
  Executor executor(config, model.vocab_size, backend);
  Driver driver(executor, config, model.vocab_size);
  json out = decode_figures(driver, backend, model, 1, 192, o.quick ? 10 : 20, bandwidth, "eager ");
  out["shape"] = shape;
  return out;
}

// The phase times of `t` per step, printed one a line with their share, and as JSON; `total`:
// their sum.
json print_phases(const CudaPhaseTimes& t, double& total) {
  json phases = json::object();
  total = 0;
  if (!t.available || t.steps == 0) return phases;
  for (size_t p = 0; p < t.ms.size(); ++p) total += t.ms[p] / static_cast<double>(t.steps);
  for (size_t p = 0; p < t.ms.size(); ++p) {
    const double ms = t.ms[p] / static_cast<double>(t.steps);
    const std::string name(to_string(static_cast<CudaPhase>(p)));
    phases[name] = ms;
    std::printf("    %-16s %7.3f ms  %5.1f%%\n", name.c_str(), ms, total > 0 ? 100 * ms / total : 0.0);
  }
  std::printf("    %-16s %7.3f ms\n", "sum", total);
  return phases;
}

// Where a 2048-token prefill (one chunk, empty cache) spends its device time: the phase marks of
// three timed prefills after a warm-up, cuBLAS for the linear layers as production runs them,
// attention on the prefill tile kernel (production's default) or on the decode kernel.
json prefill_profile(const std::string& shape, bool attention_by_decode_kernel = false) {
  const ModelConfig model = model_config_named(shape);
  ExecutorConfig config = bench_config(kPrefillChunk);
  config.max_batch_rows = 1;
  config.pages_count = (config.context_length + kPageSize - 1) / kPageSize + 2;
  CudaBackend backend(DeviceSeededWeights{model, kWeightsSeed}, config,
                      CudaBackendOptions{.graphs = true,
                                         .prefill_attention_by_decode_kernel =
                                             attention_by_decode_kernel,
                                         .profile = true});
  Executor executor(config, model.vocab_size, backend);
  Driver driver(executor, config, model.vocab_size);
  driver.prefill(1, kPrefillChunk);
  backend.reset_phase_times();
  std::vector<double> seconds;
  for (int32_t i = 0; i < 3; ++i) seconds.push_back(driver.prefill(1, kPrefillChunk));
  const CudaPhaseTimes t = backend.phase_times();
  std::printf("  profile %s prefill %d tokens, attention on the %s: %.1f ms wall (marks "
              "included)%s\n",
              shape.c_str(), kPrefillChunk,
              attention_by_decode_kernel ? "decode kernel" : "tile kernel", median(seconds) * 1e3,
              t.available ? "" : ": phase timing unavailable on this device");
  double total = 0;
  const json phases = print_phases(t, total);
  return {{"shape", shape},
          {"prefill_tokens", kPrefillChunk},
          {"attention", attention_by_decode_kernel ? "decode_kernel" : "tiles"},
          {"wall_ms_median_with_marks", median(seconds) * 1e3},
          {"available", t.available},
          {"steps", t.steps},
          {"phase_ms_per_step", phases},
          {"phase_ms_sum", total}};
}

// Where a decode step's device time goes: CUDA events between phases, recorded inside the graph,
// summed per phase over the timed steps, with the backend options given (profile forced on);
// `linear` names them in the output.
json profile_decode(const std::string& shape, CudaBackendOptions options, const std::string& linear,
                    const Options& o, int32_t rows, int32_t context,
                    const SamplingParams& sampling = {}) {
  const ModelConfig model = model_config_named(shape);
  ExecutorConfig config = bench_config(context);
  config.max_batch_rows = rows;
  config.pages_count = rows * ((config.context_length + kPageSize - 1) / kPageSize) + 2;
  options.profile = true;
  CudaBackend backend(DeviceSeededWeights{model, kWeightsSeed}, config, options);
  Executor executor(config, model.vocab_size, backend);
  Driver driver(executor, config, model.vocab_size, sampling);
  driver.prefill(rows, context);
  driver.decode(rows, kWarmupSteps, backend, false);
  backend.reset_phase_times();
  const int32_t steps = o.quick ? 10 : 20;
  // One step at a time: the phase marks are one set per step (a profiling backend cannot run
  // ahead).
  const std::vector<double> seconds = driver.decode(rows, steps, backend, false).wall;
  const CudaPhaseTimes t = backend.phase_times();
  std::printf("  profile %s batch %d context %d, %s: %.3f ms/step wall (marks included)%s\n",
              shape.c_str(), rows, context, linear.c_str(), median(seconds) * 1e3,
              t.available ? "" : ": phase timing unavailable on this device");
  double total = 0;
  const json phases = print_phases(t, total);
  return {{"shape", shape},
          {"linear", linear},
          {"batch", rows},
          {"context", context},
          {"step_ms_median_with_marks", median(seconds) * 1e3},
          {"available", t.available},
          {"steps", t.steps},
          {"phase_ms_per_step", phases},
          {"phase_ms_sum", total}};
}

// The batch-1 decode profile with lockstep's GEMV (the default for steps of at most 8 tokens) and
// with cuBLAS for every linear layer.
json profile_shape(const std::string& shape, bool gemv, const Options& o, int32_t rows = 1,
                   int32_t context = 192) {
  return profile_decode(shape,
                        {.graphs = true, .gemv_tokens_max = gemv ? 8 : 0,
                         .small_m_gemm_tokens_max = 0, .small_m_gemm_large_tokens_max = 0},
                        gemv && rows <= 8 ? "lockstep_gemv" : "cublas", o, rows, context);
}

// The logits pass alone (the guard, argmax and logprob sums of `rows` rows of llama's 128,256
// logits, as a graph's tail runs it), back to back, without and with the record's digests and
// top-8: what recording adds to a step's device time at most. Two inputs: normal logits (the
// usual, thresholded top-k path) and every logit equal (each one reaches the bound: the rounds).
json logits_pass_alone(int32_t rows) {
  constexpr int32_t kVocab = 128256;
  constexpr int32_t kLaunches = 200;
  const size_t count = static_cast<size_t>(rows) * kVocab;
  std::vector<float> normal(count);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (float& x : normal) x = dist(rng);
  float* logits = nullptr;
  void* workspace = nullptr;
  uint64_t* digests = nullptr;
  int32_t *top = nullptr, *flags = nullptr;
  float* sums = nullptr;
  const size_t workspace_bytes = kernels::logits_pass_workspace_bytes(rows, kVocab);
  LS_CUDA(cudaMalloc(&logits, count * sizeof(float)));
  LS_CUDA(cudaMalloc(&workspace, workspace_bytes));
  LS_CUDA(cudaMalloc(&digests, static_cast<size_t>(rows) * sizeof(uint64_t)));
  LS_CUDA(cudaMalloc(&top, static_cast<size_t>(rows) * kTopLogitsCountMax * 2 * sizeof(int32_t)));
  LS_CUDA(cudaMalloc(&flags, static_cast<size_t>(rows) * 2 * sizeof(int32_t)));
  LS_CUDA(cudaMalloc(&sums, static_cast<size_t>(rows) * 2 * sizeof(float)));
  cudaEvent_t start = nullptr, stop = nullptr;
  LS_CUDA(cudaEventCreate(&start));
  LS_CUDA(cudaEventCreate(&stop));
  auto time_us = [&](bool record) {
    const kernels::LogitsPassArgs pass{.logits = logits, .rows = rows, .vocab = kVocab,
                                       .workspace = workspace, .nan_flags = flags,
                                       .argmax = flags + rows, .row_max = sums,
                                       .row_sum = sums + rows,
                                       .digests = record ? digests : nullptr,
                                       .top = record ? top : nullptr,
                                       .top_k = record ? kTopLogitsCountMax : 0};
    for (int32_t i = 0; i < 10; ++i) LS_CUDA(kernels::launch_logits_pass(pass, nullptr));
    LS_CUDA(cudaEventRecord(start));
    for (int32_t i = 0; i < kLaunches; ++i) LS_CUDA(kernels::launch_logits_pass(pass, nullptr));
    LS_CUDA(cudaEventRecord(stop));
    LS_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    LS_CUDA(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms) * 1e3 / kLaunches;
  };
  json out = {{"rows", rows}, {"vocab", kVocab}};
  for (const bool equal : {false, true}) {
    if (equal) {
      LS_CUDA(cudaMemset(logits, 0x3c, count * sizeof(float)));  // 0x3c3c3c3c ≈ 0.0115
    } else {
      LS_CUDA(cudaMemcpy(logits, normal.data(), count * sizeof(float), cudaMemcpyHostToDevice));
    }
    const double without = time_us(false), with = time_us(true);
    const char* input = equal ? "equal" : "normal";
    std::printf("  logits pass, %2d rows of 128256 %-6s logits: %6.2f us, with the record %6.2f us "
                "(+%.2f)\n", rows, input, without, with, with - without);
    out[input] = {{"us_per_launch_without_record", without}, {"us_per_launch_with_record", with}};
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  for (void* p : {static_cast<void*>(sums), static_cast<void*>(flags), static_cast<void*>(top),
                  static_cast<void*>(digests), workspace, static_cast<void*>(logits)}) {
    cudaFree(p);
  }
  return out;
}

// Where a recorded step's extra device time goes: the tail's phases (CUDA events inside the
// graph, one step at a time, as profile_shape times them) of `rows` rows decoding at context
// 1024, without and with the record, two executors over one profiling backend.
json recording_tail_profile(const std::string& shape, int32_t rows, const Options& o) {
  const ModelConfig model = model_config_named(shape);
  constexpr int32_t kContext = 1024;
  ExecutorConfig config = bench_config(kContext);
  const CudaBackendOptions options{.graphs = true, .profile = true};
  config.pages_count = cuda_kv_sizing(model, config, options).pages_count;
  CudaBackend backend(DeviceSeededWeights{model, kWeightsSeed}, config, options);
  Executor plain(config, model.vocab_size, backend);
  Executor recording(config, model.vocab_size, backend, trace::recording_executor_options());
  const int32_t steps = o.quick ? 10 : 40;
  json out = {{"shape", shape}, {"batch", rows}, {"context", kContext}};
  for (Executor* e : {&plain, &recording}) {
    Driver driver(*e, config, model.vocab_size);
    driver.prefill(rows, kContext);
    driver.decode(rows, kWarmupSteps, backend, false);
    backend.reset_phase_times();
    driver.decode(rows, steps, backend, false);
    const CudaPhaseTimes t = backend.phase_times();
    const char* name = e == &plain ? "without" : "with";
    json phases = json::object();
    std::printf("  %s tail, decode batch %d context %d, %-7s the record:", shape.c_str(), rows,
                kContext, name);
    for (const CudaPhase p : {CudaPhase::kLmHead, CudaPhase::kGuard, CudaPhase::kSampling,
                              CudaPhase::kCopyBack}) {
      const double ms = t.available && t.steps > 0
                            ? t.ms[static_cast<size_t>(p)] / static_cast<double>(t.steps)
                            : std::numeric_limits<double>::quiet_NaN();
      phases[std::string(to_string(p))] = ms;
      std::printf(" %s %.2f us", std::string(to_string(p)).c_str(), ms * 1e3);
    }
    std::printf("\n");
    out[name] = phases;
  }
  return out;
}

// One shape's recording cost: two executors over one backend (one recording, one not), each
// prefilling its own requests into pool rows 1..rows before its blocks of decode steps; blocks
// alternate so that drift falls on both alike. The recorder writes to a file as `generate
// --record` does.
json recording_shape(const std::string& shape, const Options& o, const Bandwidth& bandwidth) {
  const ModelConfig model = model_config_named(shape);
  constexpr int32_t kContext = 1024;
  const int32_t steps = o.quick ? 10 : 40;
  // Blocks alternate; their ratios' spread (printed) says how far one run's median can be
  // trusted: a step-time difference of 0.1% needs this many.
  const int32_t blocks = o.quick ? 2 : 10;
  ExecutorConfig config = bench_config(kContext);
  const CudaBackendOptions options{.graphs = true, .time_steps = true};
  config.pages_count = cuda_kv_sizing(model, config, options).pages_count;
  CudaBackend backend(DeviceSeededWeights{model, kWeightsSeed}, config, options);
  Executor plain(config, model.vocab_size, backend);
  Executor recording(config, model.vocab_size, backend, trace::recording_executor_options());
  json rows_out = json::array();
  for (const int32_t rows : std::vector<int32_t>{1, 16, 64}) {
    const std::string path = o.out_path + ".recording.trace";
    trace::TraceHeader header;
    header.build_id = trace::build_id();
    header.model = model;
    header.weights = WeightSource{.kind = WeightSource::Kind::kSeed, .seed = kWeightsSeed};
    header.executor = config;
    header.executor_options = trace::recording_executor_options();
    header.top_logits_count = kTopLogitsCountMax;
    header.backend = "cuda";
    auto recorder = trace::Recorder::open(path, header);
    Driver off(plain, config, model.vocab_size);
    Driver on(recording, config, model.vocab_size);
    on.set_recorder(recorder.get());
    std::vector<double> off_wall, on_wall, off_idle, on_idle, block_ratios;
    for (int32_t b = 0; b < blocks; ++b) {
      double block_ms[2] = {0, 0};
      for (Driver* d : abba(b, &off, &on)) {
        d->prefill(rows, kContext);
        d->decode(rows, kWarmupSteps, backend, false);
        const Driver::DecodeTimes t = d->decode(rows, steps, backend, true);
        auto& wall = d == &off ? off_wall : on_wall;
        auto& idle = d == &off ? off_idle : on_idle;
        wall.insert(wall.end(), t.wall.begin(), t.wall.end());
        idle.insert(idle.end(), t.idle.begin(), t.idle.end());
        block_ms[d == &off ? 0 : 1] = median(t.wall);
      }
      block_ratios.push_back(block_ms[1] / block_ms[0] - 1);
    }
    std::sort(block_ratios.begin(), block_ratios.end());
    recorder->close();
    const trace::RecorderStats stats = recorder->stats();
    std::remove(path.c_str());
    const double off_ms = median(off_wall) * 1e3, on_ms = median(on_wall) * 1e3;
    const int64_t on_steps = static_cast<int64_t>(blocks) * (kWarmupSteps + steps + 1);
    const double bytes_per_step = static_cast<double>(stats.bytes_written) / static_cast<double>(on_steps);
    const int64_t moved = decode_bytes(model, rows, kContext + kWarmupSteps + steps / 2);
    std::printf("  %s recording, decode batch %2d context %d: without %.4f ms/step (%.1f%% of read "
                "BW), with %.4f ms/step: %+.3f%% step time (throughput ratio %.5f); device idle "
                "between steps %.1f us without, %.1f us with; trace %.0f bytes/step, recorder "
                "waits %ld\n",
                shape.c_str(), rows, kContext, off_ms,
                static_cast<double>(moved) / (off_ms * 1e-3) / bandwidth.read * 100, on_ms,
                (on_ms / off_ms - 1) * 100, off_ms / on_ms, median(off_idle) * 1e6,
                median(on_idle) * 1e6, bytes_per_step, static_cast<long>(stats.waits));
    std::printf("    the %d blocks' own step-time ratios: min %+.3f%%, median %+.3f%%, max %+.3f%%\n",
                blocks, block_ratios.front() * 100, median(block_ratios) * 100,
                block_ratios.back() * 100);
    rows_out.push_back({{"batch", rows},
                        {"block_cost_fractions_sorted", block_ratios},
                        {"context", kContext},
                        {"steps_per_block", steps},
                        {"blocks", blocks},
                        {"step_ms_median_without", off_ms},
                        {"step_ms_median_with", on_ms},
                        {"recording_cost_fraction", on_ms / off_ms - 1},
                        {"throughput_ratio_with_over_without", off_ms / on_ms},
                        {"device_idle_us_median_without", median(off_idle) * 1e6},
                        {"device_idle_us_median_with", median(on_idle) * 1e6},
                        {"read_bandwidth_fraction_without",
                         static_cast<double>(moved) / (off_ms * 1e-3) / bandwidth.read},
                        {"trace_bytes_per_step", bytes_per_step},
                        {"recorder_waits", stats.waits}});
  }
  return {{"shape", shape}, {"recording", rows_out}};
}


// Decode at TP N: batch 1 and 64 at context 1024 (batch 1 and 16 at 192 with --quick).
json tp_shape(const std::string& shape, const Options& o, const std::vector<int32_t>& devices,
              const Bandwidth& group_bandwidth) {
  const ModelConfig model = model_config_named(shape);
  const int32_t context = o.quick ? 192 : 1024;
  const std::vector<int32_t> batches = o.quick ? std::vector<int32_t>{1, 16} : std::vector<int32_t>{1, 64};
  ExecutorConfig config = bench_config(context);
  const CudaBackendOptions options{.graphs = true, .time_steps = true};
  const CudaKvSizing sizing = tp_cuda_kv_sizing(model, config, options, devices);
  config.pages_count = sizing.pages_count;
  TpCudaBackend backend(DeviceSeededWeights{model, kWeightsSeed}, config, options, devices);
  Executor executor(config, model.vocab_size, backend);
  Driver driver(executor, config, model.vocab_size);
  const CudaMemoryReport memory = backend.rank(0).memory_report();
  std::printf("%s at TP %zu: rank 0 holds weights %.2f GB, KV %.2f GB (%d pages of %d), "
              "workspace %.2f GB\n",
              shape.c_str(), devices.size(), static_cast<double>(memory.weight_bytes) * 1e-9,
              static_cast<double>(memory.kv_bytes) * 1e-9, config.pages_count, config.page_size,
              static_cast<double>(memory.workspace_bytes) * 1e-9);
  json result = {{"shape", shape},
                 {"tp_degree", devices.size()},
                 {"devices", devices},
                 {"rank0_weight_bytes", memory.weight_bytes},
                 {"rank0_kv_bytes", memory.kv_bytes},
                 {"kv_pages", config.pages_count},
                 {"decode", json::array()}};
  for (const int32_t rows : batches) {
    // The fractions are of the group's bandwidth: the bytes the whole model moves per step
    // (every rank its shard) over the summed read bandwidth of the ranks' GPUs.
    result["decode"].push_back(decode_figures(driver, backend.rank(0), model, rows, context,
                                              o.quick ? 10 : 20, group_bandwidth, "TP    "));
  }
  result["graph_replays"] = backend.rank(0).graph_replays_count();
  return result;
}

int run_tp(const Options& o, const CudaMachineInfo& machine) {
  const std::vector<int32_t> devices = tp_devices(o.tp_degree);
  const bool shared = tp_ranks_share_a_device(devices);
  // Each distinct GPU's bandwidth, summed: what N ranks on N GPUs can read at most.
  Bandwidth group;
  json per_device = json::array();
  for (size_t rank = 0; rank < (shared ? 1 : devices.size()); ++rank) {
    LS_CUDA(cudaSetDevice(devices[rank]));
    const Bandwidth b = measure_bandwidth(bench::kBandwidthBytes, o.quick ? 10 : 30);
    std::printf("device %d: bandwidth copy %.2f TB/s, read %.2f TB/s\n", devices[rank],
                b.copy * 1e-12, b.read * 1e-12);
    per_device.push_back({{"device", devices[rank]},
                          {"copy_bandwidth_bytes_per_s", b.copy},
                          {"read_bandwidth_bytes_per_s", b.read}});
    group.copy += b.copy;
    group.read += b.read;
  }
  LS_CUDA(cudaSetDevice(0));
  std::printf("TP %d on %s: summed read bandwidth %.2f TB/s\n", o.tp_degree,
              shared ? "one GPU (every rank on device 0: not a speed figure)" : "one GPU per rank",
              group.read * 1e-12);
  json out = bench::run_json(machine, fmt::format("lockstep_gpu_bench --tp {}", o.tp_degree));
  out.update({{"ranks_share_one_gpu", shared},
              {"devices", per_device},
              {"group_read_bandwidth_bytes_per_s", group.read},
              {"tp", json::array()}});
  const std::vector<std::string> shapes =
      o.shapes_given ? o.shapes : std::vector<std::string>{"llama-8b"};
  for (const std::string& shape : shapes) {
    out["tp"].push_back(tp_shape(shape, o, devices, group));
    std::ofstream(o.out_path) << out.dump(2) << "\n";
  }
  return 0;
}

// One option on and off: two backends over the same weights (KV pages as bench_config sizes
// them, so both fit), decode at context 1024 at each batch, alternating blocks of steps so that
// both see the same clocks. `key` names the JSON fields of each (step_ms_median_<key>, ...).
struct Variant {
  const char* key;
  CudaBackendOptions options;
  SamplingParams sampling{};  // the requests' (greedy unless given)
};

json compare_shape(const std::string& shape, const Options& o, const Bandwidth& bandwidth,
                   const char* what, const Variant& on_variant, const Variant& off_variant,
                   const std::vector<int32_t>& batches) {
  const ModelConfig model = model_config_named(shape);
  constexpr int32_t kContext = 1024;
  const int32_t steps = o.quick ? 10 : 30;
  const int32_t blocks = o.quick ? 2 : 4;
  const ExecutorConfig config = bench_config(kContext);
  CudaBackend on_backend(DeviceSeededWeights{model, kWeightsSeed}, config, on_variant.options);
  CudaBackend off_backend(DeviceSeededWeights{model, kWeightsSeed}, config, off_variant.options);
  Executor on_executor(config, model.vocab_size, on_backend);
  Executor off_executor(config, model.vocab_size, off_backend);
  json rows_out = json::array();
  for (const int32_t rows : batches) {
    Driver on(on_executor, config, model.vocab_size, on_variant.sampling);
    Driver off(off_executor, config, model.vocab_size, off_variant.sampling);
    std::vector<double> on_wall, off_wall;
    for (int32_t b = 0; b < blocks; ++b) {
      for (Driver* d : abba(b, &off, &on)) {
        CudaBackend& backend = d == &on ? on_backend : off_backend;
        d->prefill(rows, kContext);
        d->decode(rows, kWarmupSteps, backend, false);
        const Driver::DecodeTimes t = d->decode(rows, steps, backend, true);
        auto& wall = d == &on ? on_wall : off_wall;
        wall.insert(wall.end(), t.wall.begin(), t.wall.end());
      }
    }
    const double on_ms = median(on_wall) * 1e3, off_ms = median(off_wall) * 1e3;
    const int64_t moved = decode_bytes(model, rows, kContext + kWarmupSteps + steps / 2);
    const auto read_fraction = [&](double ms) {
      return static_cast<double>(moved) / (ms * 1e-3) / bandwidth.read;
    };
    std::printf("  %s %s, decode batch %2d context %d: %s %.4f ms/step (%.1f%% of read BW), %s "
                "%.4f ms/step (%.1f%%): %+.2f%% step time\n",
                shape.c_str(), what, rows, kContext, on_variant.key, on_ms,
                read_fraction(on_ms) * 100, off_variant.key, off_ms, read_fraction(off_ms) * 100,
                (on_ms / off_ms - 1) * 100);
    const std::string on_key = on_variant.key, off_key = off_variant.key;
    rows_out.push_back({{"batch", rows},
                        {"context", kContext},
                        {"steps_per_block", steps},
                        {"blocks", blocks},
                        {"step_ms_median_" + on_key, on_ms},
                        {"step_ms_median_" + off_key, off_ms},
                        {"read_bandwidth_fraction_" + on_key, read_fraction(on_ms)},
                        {"read_bandwidth_fraction_" + off_key, read_fraction(off_ms)}});
  }
  return rows_out;
}

// The bytes a decode step reads outside its layers, as decode_bytes counts them: the LM head's
// weights and the final norm's.
int64_t outside_layers_bytes(const ModelConfig& m) {
  return 2 * int64_t{m.vocab_size} * m.hidden_size + 4 * int64_t{m.hidden_size};
}

// The bytes a decode step's `what` reads (weights of its product; attention's K/V rows; every
// layer's for kLayers; the combine's partials, in L2, count as none), as decode_bytes counts them.
int64_t left_out_bytes(const ModelConfig& m, int32_t rows, int32_t context, LeaveOut what) {
  const int64_t h = m.hidden_size, layers = m.layers_count;
  switch (what) {
    case LeaveOut::kQkv: return 2 * layers * h * (m.q_size() + 2 * m.kv_size());
    case LeaveOut::kAttention:
    case LeaveOut::kAttentionBody:
    case LeaveOut::kAttentionKvReads: return decode_bytes_split(m, rows, context).kv;
    case LeaveOut::kCombine:
    case LeaveOut::kAttentionArithmetic: return 0;  // what it leaves out reads no DRAM
    case LeaveOut::kO: return 2 * layers * h * m.q_size();
    case LeaveOut::kGateUp: return 2 * layers * 2 * h * m.ffn_size;
    case LeaveOut::kDown: return 2 * layers * h * m.ffn_size;
    case LeaveOut::kLayers: return decode_bytes(m, rows, context) - outside_layers_bytes(m);
  }
  return 0;
}

// What the split kernel costs with its reads alone: attention's cost (split kernel and combine)
// less attention_arithmetic's (the split kernel's arithmetic and the combine), against its K/V
// bytes at the read bandwidth: near them, the reads overlap and the pattern streams; far above,
// the reads in this pattern are the limit, whatever the arithmetic does.
void print_reads_alone(const std::vector<LeaveOut>& kernels, const json& costs, double kv_read_us) {
  const auto cost_of = [&](LeaveOut what) {
    const size_t k = static_cast<size_t>(std::find(kernels.begin(), kernels.end(), what) -
                                         kernels.begin());
    return costs.at(k).at("cost_us").get<double>();
  };
  const double reads_us = cost_of(LeaveOut::kAttention) - cost_of(LeaveOut::kAttentionArithmetic);
  std::printf("    the split kernel with its K/V reads alone (attention less "
              "attention_arithmetic): %.1f us, its K/V bytes at the read BW %.1f us\n",
              reads_us, kv_read_us);
}

// What each kernel of a layer adds to a decode step inside its CUDA graph (the device has no
// working timeline tool, bench/results/HISTORY.md): the step's time with every kernel less its
// time with that kernel left out of every layer (CudaBackendOptions::leave_out; such a step
// computes wrong logits, only its time counts), at context 1024, batch 1 and 64. Each kernel's
// cost is set against its bytes at the read bandwidth measured in this run: the difference, its
// loss, is what keeps the step from that bandwidth. With every layer left out the step keeps the
// embedding, the final norm, the LM head and the sampling tail ("outside the layers"). Attention
// is also cut into parts (the combine; the split kernel past its wait, with the combine; its K/V
// reads alone; its arithmetic, with the combine), listed but not added to the losses; the split kernel's parts where the shape has
// them (kernels/attention.h: llama's group of 4), and there the step with and without the split
// kernel's body again with every kernel in plain stream order. One backend a variant, one after
// another; the full step is timed first and last (drift).
json leave_out_shape(const std::string& shape, const Options& o, const Bandwidth& bandwidth) {
  const ModelConfig model = model_config_named(shape);
  constexpr int32_t kContext = 1024;
  const std::vector<int32_t> batches = {1, 64};
  const int32_t steps = o.quick ? 10 : 20;
  const int32_t mean_context = kContext + kWarmupSteps + steps / 2;
  const ExecutorConfig config = bench_config(kContext);
  const bool has_split_parts = kernels::attention_split_parts_exist(
      model.head_dim, model.query_heads_count / model.kv_heads_count);
  std::vector<LeaveOut> kernels;
  for (const LeaveOut what : kLeaveOutKinds) {
    if (!is_split_kernel_part(what) || has_split_parts) kernels.push_back(what);
  }
  const size_t every_layer_at = static_cast<size_t>(
      std::find(kernels.begin(), kernels.end(), LeaveOut::kLayers) - kernels.begin());
  // The median step (ms) at each batch with `leave_out` left out, kernels overlapping or not.
  const auto time_steps = [&](uint32_t leave_out, bool overlap) {
    CudaBackendOptions options{.graphs = true, .overlap_kernels = overlap, .time_steps = true};
    options.leave_out = leave_out;
    CudaBackend backend(DeviceSeededWeights{model, kWeightsSeed}, config, options);
    Executor executor(config, model.vocab_size, backend);
    std::vector<double> ms;
    for (const int32_t rows : batches) {
      Driver driver(executor, config, model.vocab_size);
      driver.prefill(rows, kContext);
      driver.decode(rows, kWarmupSteps, backend, false);
      ms.push_back(median(driver.decode(rows, steps, backend, true).wall) * 1e3);
    }
    return ms;
  };
  // step_ms[v][b]: variant v (0: nothing left out, 1..: kernels[v − 1], last: nothing again).
  std::vector<std::vector<double>> step_ms;
  for (size_t v = 0; v <= kernels.size() + 1; ++v) {
    const bool full = v == 0 || v == kernels.size() + 1;
    step_ms.push_back(time_steps(full ? 0 : static_cast<uint32_t>(kernels[v - 1]), true));
  }
  // The split kernel's body, left out with every kernel in plain stream order too: at llama-8b
  // batch 1 the overlapped step without it runs ~0.5 ms slower than the whole step (the kernels
  // behind a split kernel that returns at its wait launch early and wait on the SMs,
  // kernels/launch.cuh), so there only plain order gives the body's cost (306 µs, 2026-12-07).
  std::vector<double> plain_ms, plain_body_ms;
  if (has_split_parts) {
    plain_ms = time_steps(0, false);
    plain_body_ms = time_steps(static_cast<uint32_t>(LeaveOut::kAttentionBody), false);
  }
  const auto at_read_us = [&](int64_t bytes) {
    return static_cast<double>(bytes) / bandwidth.read * 1e6;
  };
  json rows_out = json::array();
  for (size_t b = 0; b < batches.size(); ++b) {
    const int32_t rows = batches[b];
    const double full_ms = step_ms.front()[b], again_ms = step_ms.back()[b];
    const int64_t step_bytes = decode_bytes(model, rows, mean_context);
    std::printf("  %s decode batch %2d context %d: %.3f ms/step (%.3f last), its %.2f GB at the "
                "read BW %.3f ms\n    %-18s %9s %9s %10s %12s %9s\n",
                shape.c_str(), rows, kContext, full_ms, again_ms,
                static_cast<double>(step_bytes) * 1e-9, at_read_us(step_bytes) * 1e-3,
                "left out", "step ms", "costs us", "bytes MB", "at read us", "loss us");
    json kernels_out = json::array();
    double losses_us = 0;
    for (size_t k = 0; k < kernels.size(); ++k) {
      const double without_ms = step_ms[k + 1][b];
      const double cost_us = (full_ms - without_ms) * 1e3;
      const int64_t bytes = left_out_bytes(model, rows, mean_context, kernels[k]);
      const double loss_us = cost_us - at_read_us(bytes);
      const bool part_of_attention = is_part_of_attention(kernels[k]);
      const bool every_layer = kernels[k] == LeaveOut::kLayers;
      if (!part_of_attention && !every_layer) losses_us += loss_us;
      std::printf("    %-18s %9.3f %9.1f %10.1f %12.1f %9.1f%s\n",
                  std::string(to_string(kernels[k])).c_str(), without_ms, cost_us,
                  static_cast<double>(bytes) * 1e-6, at_read_us(bytes), loss_us,
                  part_of_attention ? "  (part of attention's)" : "");
      kernels_out.push_back({{"left_out", to_string(kernels[k])},
                             {"step_ms_without", without_ms},
                             {"cost_us", cost_us},
                             {"bytes", bytes},
                             {"at_read_bandwidth_us", at_read_us(bytes)},
                             {"loss_us", loss_us}});
    }
    if (has_split_parts) print_reads_alone(kernels, kernels_out, at_read_us(left_out_bytes(
                             model, rows, mean_context, LeaveOut::kAttentionKvReads)));
    // Outside the layers: the step with every layer left out, against the LM head's weights.
    const double outside_ms = step_ms[every_layer_at + 1][b];
    const int64_t outside_bytes = outside_layers_bytes(model);
    const double outside_loss_us = outside_ms * 1e3 - at_read_us(outside_bytes);
    losses_us += outside_loss_us;
    const double step_loss_us = full_ms * 1e3 - at_read_us(step_bytes);
    std::printf("    %-18s %9.3f %9s %10.1f %12.1f %9.1f\n    losses %.1f us of the step's %.1f "
                "(the rest: what leaving kernels out does not add up to)\n",
                "outside the layers", outside_ms, "", static_cast<double>(outside_bytes) * 1e-6,
                at_read_us(outside_bytes), outside_loss_us, losses_us, step_loss_us);
    json plain_order = nullptr;  // null where the shape has no split-kernel parts
    if (has_split_parts) {
      const double cost_us = (plain_ms[b] - plain_body_ms[b]) * 1e3;
      std::printf("    in plain stream order (no kernel overlapping its predecessor): %.3f ms/step, "
                  "%.3f with attention_body left out (costs %.1f us)\n",
                  plain_ms[b], plain_body_ms[b], cost_us);
      plain_order = {{"step_ms", plain_ms[b]},
                     {"step_ms_without_attention_body", plain_body_ms[b]},
                     {"attention_body_cost_us", cost_us}};
    }
    rows_out.push_back({{"batch", rows},
                        {"context", kContext},
                        {"mean_context", mean_context},
                        {"steps", steps},
                        {"step_ms", full_ms},
                        {"step_ms_last", again_ms},
                        {"bytes", step_bytes},
                        {"at_read_bandwidth_us", at_read_us(step_bytes)},
                        {"step_loss_us", step_loss_us},
                        {"kernels", kernels_out},
                        {"plain_order", plain_order},
                        {"outside_layers", {{"step_ms", outside_ms},
                                            {"bytes", outside_bytes},
                                            {"at_read_bandwidth_us", at_read_us(outside_bytes)},
                                            {"loss_us", outside_loss_us}}}});
  }
  return {{"shape", shape}, {"leave_out", rows_out}};
}

// The forward's kernels overlapping their predecessors (CudaBackendOptions::overlap_kernels,
// kernels/launch.h) against plain stream order.
json overlap_shape(const std::string& shape, const Options& o, const Bandwidth& bandwidth) {
  const Variant on{"overlapped", {.graphs = true, .overlap_kernels = true, .time_steps = true}};
  const Variant off{"plain_order", {.graphs = true, .overlap_kernels = false, .time_steps = true}};
  return {{"shape", shape},
          {"overlap", compare_shape(shape, o, bandwidth, "kernels overlapped vs plain stream order",
                                    on, off, {1, 16, 64})}};
}

// The decode GEMV's fused forms (CudaBackendOptions::fuse_decode, kernels/decode_gemv.h: norms
// folded into q/k/v and gate/up, SwiGLU, RoPE and the KV write in their epilogues) against one
// kernel each, at batches whose steps run the GEMV (the full run: batch 1 only).
json fusion_shape(const std::string& shape, const Options& o, const Bandwidth& bandwidth,
                  const std::vector<int32_t>& batches) {
  const Variant on{"fused",
                   {.graphs = true, .gemv_tokens_max = 8, .fuse_decode = true, .time_steps = true}};
  const Variant off{"unfused",
                    {.graphs = true, .gemv_tokens_max = 8, .fuse_decode = false, .time_steps = true}};
  return {{"shape", shape},
          {"fusion", compare_shape(shape, o, bandwidth, "decode GEMV fused vs unfused", on, off,
                                   batches)}};
}

// The fused GEMV's grid: one group of tasks a block (CudaBackendOptions::fused_gemv_block_per_group)
// against one wave of blocks each running several (the default).
json gemv_grid_shape(const std::string& shape, const Options& o, const Bandwidth& bandwidth,
                     const std::vector<int32_t>& batches) {
  const Variant on{"block_per_group",
                   {.graphs = true, .fused_gemv_block_per_group = true, .time_steps = true}};
  const Variant off{"one_wave",
                    {.graphs = true, .fused_gemv_block_per_group = false, .time_steps = true}};
  return {{"shape", shape},
          {"gemv_grid", compare_shape(shape, o, bandwidth,
                                      "fused GEMV a block per group vs one wave", on, off,
                                      batches)}};
}

// lockstep's (fused) GEMV against cuBLAS for the linear layers of steps of 2 to 8 tokens: where
// CudaBackendOptions::gemv_tokens_max's default comes from.
// What sampling costs a decode step against greedy rows (whose steps run the tail's argmax only):
// the sampled rows' weights, their sort over the vocabulary and the filters, with the
// production-like temperature 0.8 and top-p 0.95, at batch 1 and 64; and where a sampled step's
// time goes (the phases, eager, marks on: the tail's is "sampling").
json sampling_shape(const std::string& shape, const Options& o, const Bandwidth& bandwidth) {
  const CudaBackendOptions options{.graphs = true, .time_steps = true};
  const SamplingParams sampled{.temperature = 0.8f, .top_p = 0.95f};
  const Variant on{"sampled", options, sampled};
  const Variant off{"greedy", options};
  json profiles = json::array();
  for (const int32_t rows : {1, 64}) {
    profiles.push_back(profile_decode(shape, {.graphs = true}, "sampled rows", o, rows, 1024,
                                      sampled));
  }
  return {{"shape", shape},
          {"sampled_vs_greedy", compare_shape(shape, o, bandwidth,
                                              "sampled (temperature 0.8, top-p 0.95) vs greedy",
                                              on, off, {1, 64})},
          {"profiles", profiles}};
}

// What batch-invariant mode (issue 15, CudaBackendOptions::batch_invariant: the small-M GEMM for
// every linear layer) costs against the default kernels, decode at batch 1, 16 and 64.
json invariant_shape(const std::string& shape, const Options& o, const Bandwidth& bandwidth) {
  const Variant on{"invariant", batch_invariant_options({.graphs = true, .time_steps = true})};
  const Variant off{"default", {.graphs = true, .time_steps = true}};
  json profiles = json::array();
  for (const int32_t rows : {1, 64}) {  // where the cost is: each mode's phases
    profiles.push_back(profile_decode(shape, batch_invariant_options({.graphs = true}),
                                      "batch-invariant mode", o, rows, 1024));
    profiles.push_back(profile_decode(shape, {.graphs = true}, "default kernels", o, rows, 1024));
  }
  return {{"shape", shape},
          {"invariant_vs_default", compare_shape(shape, o, bandwidth,
                                                 "batch-invariant mode vs the default kernels",
                                                 on, off, {1, 16, 64})},
          {"profiles", profiles}};
}

json gemv_shape(const std::string& shape, const Options& o, const Bandwidth& bandwidth) {
  const Variant on{"gemv", {.graphs = true, .gemv_tokens_max = 8, .time_steps = true}};
  const Variant off{"cublas",
                    {.graphs = true, .gemv_tokens_max = 0, .small_m_gemm_tokens_max = 0,
                     .small_m_gemm_large_tokens_max = 0, .time_steps = true}};
  return {{"shape", shape},
          {"gemv_vs_cublas", compare_shape(shape, o, bandwidth, "linear layers by GEMV vs cuBLAS",
                                           on, off, {2, 4, 8})}};
}

// lockstep's small-M tensor-core GEMM (CudaBackendOptions::small_m_gemm_tokens_max = 64) against
// cuBLAS for the linear layers of decode steps of 2 to 64 tokens (batch 1 runs the GEMV in both,
// gemv_tokens_max's default): where small_m_gemm_tokens_max's default is to come from.
json small_m_gemm_shape(const std::string& shape, const Options& o, const Bandwidth& bandwidth) {
  const Variant on{"lockstep_gemm",
                   {.graphs = true, .small_m_gemm_tokens_max = 64, .time_steps = true}};
  const Variant off{"cublas", {.graphs = true, .small_m_gemm_tokens_max = 0,
                               .small_m_gemm_large_tokens_max = 0, .time_steps = true}};
  // The default (large products on the small-M GEMM up to 64 tokens) against every product of
  // a step of more than small_m_gemm_tokens_max tokens on cuBLAS.
  const Variant large{"large_products_on_lockstep_gemm", {.graphs = true, .time_steps = true}};
  const Variant none{"all_on_cublas", {.graphs = true,
                                       .small_m_gemm_large_tokens_max = kSmallMGemmTokensDefault,
                                       .time_steps = true}};
  // The default's comparison first (a braced list is evaluated in order): the one a short run
  // must not miss.
  return {{"shape", shape},
          {"large_products_vs_cublas",
           compare_shape(shape, o, bandwidth,
                         "large products by lockstep GEMM vs every product by cuBLAS", large,
                         none, {48, 64})},
          {"small_m_gemm_vs_cublas",
           compare_shape(shape, o, bandwidth, "linear layers by lockstep GEMM vs cuBLAS", on, off,
                         {2, 4, 8, 16, 32, 64})},
          {"kernels", small_m_kernel_figures(shape, bandwidth)}};
}

// A 2048-token prefill (one chunk, empty cache) with prefill attention on the tile kernel (the
// default) and on the decode kernel (CudaBackendOptions::prefill_attention_by_decode_kernel, as
// batch-invariant mode runs it): each timed without phase marks (the median of three after a
// warm-up, against the matrix rate) and profiled by phase.
json prefill_attention_shape(const std::string& shape, const MatrixRate& matrix_rate) {
  const ModelConfig model = model_config_named(shape);
  const PrefillFlops flops = prefill_flops(model, kPrefillChunk);
  ExecutorConfig config = bench_config(kPrefillChunk);
  config.max_batch_rows = 1;
  config.pages_count = (config.context_length + kPageSize - 1) / kPageSize + 2;
  json variants = json::array();
  for (const bool by_decode_kernel : {false, true}) {
    std::vector<double> seconds;
    {
      CudaBackend backend(DeviceSeededWeights{model, kWeightsSeed}, config,
                          CudaBackendOptions{.graphs = true,
                                             .prefill_attention_by_decode_kernel = by_decode_kernel});
      Executor executor(config, model.vocab_size, backend);
      Driver driver(executor, config, model.vocab_size);
      driver.prefill(1, kPrefillChunk);
      for (int32_t i = 0; i < 3; ++i) seconds.push_back(driver.prefill(1, kPrefillChunk));
    }
    const double s = median(seconds);
    const double rate = flops.total() / s;
    const char* attention = by_decode_kernel ? "decode kernel" : "tile kernel";
    std::printf("  %s prefill %d tokens, attention on the %s: %.1f ms, %.1f TFLOP/s, %.1f%% of the "
                "measured matrix rate\n",
                shape.c_str(), kPrefillChunk, attention, s * 1e3, rate * 1e-12,
                100 * rate / matrix_rate.best());
    variants.push_back({{"attention", by_decode_kernel ? "decode_kernel" : "tiles"},
                        {"prefill_ms_median", s * 1e3},
                        {"flop_per_s", rate},
                        {"matrix_rate_fraction", rate / matrix_rate.best()},
                        {"profile", prefill_profile(shape, by_decode_kernel)}});
  }
  return {{"shape", shape},
          {"prefill_tokens", kPrefillChunk},
          {"flops", flops.total()},
          {"variants", variants}};
}

void add_options(CLI::App& app, Options& o) {
  app.add_option("out", o.out_path, "Where the figures go (JSON)")->required();
  app.add_flag("--quick", o.quick, "Fewer iterations");
  // The "only" modes: a run takes at most one (a second is refused by name, not ignored).
  CLI::Option* const modes[] = {
      app.add_flag("--recording", o.recording, "Only the recording figures"),
      app.add_flag("--hybrid", o.hybrid,
                   "Only the hybrid decode figures (Bamba-9B's shape, batch 1 and 64)"),
      app.add_option("--tp", o.tp_degree,
                     "Only tensor-parallel decode at this degree (llama-8b unless --shapes), "
                     "against the summed read bandwidth of the GPUs its ranks run on")
          ->check(CLI::Range(1, kTpDegreeMax)),
      app.add_flag("--fusion", o.fusion,
                   "Only the decode GEMV fused vs unfused (llama-1b and llama-8b unless --shapes; "
                   "batch 1, 4 and 8, context 1024), and the fused GEMV's grid (a block per group "
                   "vs one wave, batch 1)"),
      app.add_flag("--small-m", o.small_m,
                   "Only lockstep's small-M GEMM vs cuBLAS (llama-1b and llama-8b unless "
                   "--shapes): decode batch 2 to 64 at context 1024, and each projection's kernel "
                   "at 1, 16 and 64 tokens"),
      app.add_flag("--small-m-sweep", o.small_m_sweep,
                   "Only the small-M GEMM's design space (llama-1b and llama-8b unless --shapes): "
                   "each projection at 1 to 64 tokens, K split 1 to 64 ways"),
      app.add_flag("--invariant", o.invariant,
                   "Only batch-invariant mode (--determinism invariant) vs the default kernels "
                   "(llama-1b and llama-8b unless --shapes): decode batch 1, 16 and 64 at context "
                   "1024"),
      app.add_flag("--prefill", o.prefill,
                   "Only the 2048-token prefill with prefill attention on the tile kernel and on "
                   "the decode kernel, each timed and profiled (llama-1b and llama-8b unless "
                   "--shapes)"),
      app.add_flag("--sampling", o.sampling,
                   "Only decode with sampled rows (temperature 0.8, top-p 0.95) against greedy "
                   "rows (llama-1b and llama-8b unless --shapes): batch 1 and 64, context 1024, "
                   "and a sampled step's phases (the tail's is 'sampling')"),
      app.add_flag("--leave-out", o.leave_out,
                   "Only what each kernel of a layer adds to a decode step inside its graph: the "
                   "step with every kernel against the step with one left out of every layer "
                   "(llama-1b and llama-8b unless --shapes; batch 1 and 64, context 1024), each "
                   "against its bytes at the measured read bandwidth; and the split kernel's "
                   "body left out in plain stream order too"),
      app.add_flag("--decode", o.decode,
                   "Only what the README's decode table and issue 14's lines read: each shape's "
                   "2048-token prefill and its decode steps with graphs (the Llama shapes at "
                   "context 192 and 1024, batch 1, 16 and 64; the others at 1024, batch 1 and 64; "
                   "--quick: context 192, batch 1 and 64), without the profiles, peers and "
                   "product tables"),
  };
  for (CLI::Option* mode : modes) {
    for (CLI::Option* other : modes) {
      if (other != mode) mode->excludes(other);
    }
  }
  app.add_option("--shapes", o.shapes, "Model shapes, a comma list")
      ->delimiter(',')
      ->each([&o](const std::string&) { o.shapes_given = true; });
}

int run(const Options& o) {
  const CudaMachineInfo machine = cuda_machine_info();
  bench::print_machine(machine);
  const Bandwidth bandwidth = measure_bandwidth(bench::kBandwidthBytes, o.quick ? 10 : 30);
  std::printf("bandwidth: copy (read + write) %.2f TB/s, read %.2f TB/s\n", bandwidth.copy * 1e-12,
              bandwidth.read * 1e-12);
  if (o.tp_degree > 1) return run_tp(o, machine);
  const MatrixRate matrix_rate = measure_matrix_rate(o.quick ? 5 : 20);
  std::printf("bf16 matrix rate (cuBLASLt, fp32 accumulate and output): %.0f TFLOP/s at "
              "[8192, 8192] x [8192, 8192], %.0f TFLOP/s at [2048, 4096] x [28672, 4096]\n",
              matrix_rate.square * 1e-12, matrix_rate.prefill * 1e-12);
  json out = bench::run_json(machine, "lockstep_gpu_bench");
  out.update({{"copy_bandwidth_bytes_per_s", bandwidth.copy},
              {"read_bandwidth_bytes_per_s", bandwidth.read},
              {"matrix_rate_flop_per_s", {{"square_8192", matrix_rate.square},
                                          {"prefill_2048x28672x4096", matrix_rate.prefill}}},
              {"shapes", json::array()},
              {"prefill_profile", json::array()},
              {"eager", json::array()},
              {"overlap", json::array()},
              {"fusion", json::array()},
              {"gemv_grid", json::array()},
              {"gemv_vs_cublas", json::array()},
              {"small_m_gemm_vs_cublas", json::array()},
              {"profile", json::array()},
              {"linear_layers_peer", json::array()},
              {"leave_out", json::array()}});
  auto save = [&] { std::ofstream(o.out_path) << out.dump(2) << "\n"; };
  if (o.hybrid) {
    out["command"] = "lockstep_gpu_bench --hybrid";
    out["hybrid"] = json::array({bench_hybrid(o, bandwidth)});
    save();
    return 0;
  }
  // An "only" mode: its flag recorded as the command, `figures(shape)` for llama-1b and llama-8b
  // (or --shapes), the file saved after each shape.
  const std::vector<std::string> mode_shapes =
      o.shapes_given ? o.shapes : std::vector<std::string>{"llama-1b", "llama-8b"};
  const auto only_mode = [&](const std::string& flag, const auto& figures) {
    out["command"] = "lockstep_gpu_bench " + flag;
    for (const std::string& shape : mode_shapes) {
      figures(shape);
      save();
    }
    return 0;
  };
  if (o.fusion) {
    return only_mode("--fusion", [&](const std::string& shape) {
      out["fusion"].push_back(fusion_shape(shape, o, bandwidth, {1, 4, 8}));
      out["gemv_grid"].push_back(gemv_grid_shape(shape, o, bandwidth, {1}));
    });
  }
  if (o.invariant) {
    out["invariant_vs_default"] = json::array();
    return only_mode("--invariant", [&](const std::string& shape) {
      out["invariant_vs_default"].push_back(invariant_shape(shape, o, bandwidth));
    });
  }
  if (o.small_m_sweep) {
    out["small_m_sweep"] = json::array();
    return only_mode("--small-m-sweep", [&](const std::string& shape) {
      for (json& row : small_m_sweep(shape, bandwidth)) out["small_m_sweep"].push_back(row);
    });
  }
  if (o.prefill) {
    out["prefill_attention"] = json::array();
    return only_mode("--prefill", [&](const std::string& shape) {
      out["prefill_attention"].push_back(prefill_attention_shape(shape, matrix_rate));
    });
  }
  if (o.sampling) {
    out["sampled_vs_greedy"] = json::array();
    return only_mode("--sampling", [&](const std::string& shape) {
      out["sampled_vs_greedy"].push_back(sampling_shape(shape, o, bandwidth));
    });
  }
  if (o.leave_out) {
    return only_mode("--leave-out", [&](const std::string& shape) {
      out["leave_out"].push_back(leave_out_shape(shape, o, bandwidth));
    });
  }
  if (o.decode) {
    out["command"] = "lockstep_gpu_bench --decode";
    for (const std::string& shape : o.shapes) {  // every family's shape unless --shapes
      out["shapes"].push_back(bench_shape(shape, o, bandwidth, matrix_rate));
      save();
    }
    return 0;
  }
  if (o.small_m) {
    return only_mode("--small-m", [&](const std::string& shape) {
      out["small_m_gemm_vs_cublas"].push_back(small_m_gemm_shape(shape, o, bandwidth));
    });
  }
  if (o.recording) {
    out["recording"] = json::array();
    out["logits_pass_alone"] = json::array();
    for (const int32_t rows : {1, 16, 64}) out["logits_pass_alone"].push_back(logits_pass_alone(rows));
    out["recording_tail_profile"] = json::array();
    return only_mode("--recording", [&](const std::string& shape) {
      out["recording"].push_back(recording_shape(shape, o, bandwidth));
      for (const int32_t rows : {1, 64}) {
        out["recording_tail_profile"].push_back(recording_tail_profile(shape, rows, o));
      }
    });
  }
  for (const std::string& shape : o.shapes) {
    if (full_set(shape)) {
      out["profile"].push_back(profile_shape(shape, true, o));
      out["profile"].push_back(profile_shape(shape, false, o));
    }
    // Where batch 64 at context 1024 goes (cuBLAS linear layers; attention reads 64 · 1024 rows).
    if (!o.quick && shape == "llama-8b") out["profile"].push_back(profile_shape(shape, true, o, 64, 1024));
    save();  // keep what is done if a later one fails
    out["shapes"].push_back(bench_shape(shape, o, bandwidth, matrix_rate));
    if (full_set(shape) && !o.quick) out["prefill_profile"].push_back(prefill_profile(shape));
    save();
    if (full_set(shape)) out["eager"].push_back(bench_eager(shape, o, bandwidth));
    save();
    if (full_set(shape)) out["overlap"].push_back(overlap_shape(shape, o, bandwidth));
    save();
    if (full_set(shape)) out["fusion"].push_back(fusion_shape(shape, o, bandwidth, {1}));
    save();
    if (full_set(shape)) {
      for (const int32_t rows : {1, 64}) {
        out["linear_layers_peer"].push_back(linear_layers_peer(shape, rows, bandwidth));
      }
    }
    save();
    if (full_set(shape)) out["gemv_vs_cublas"].push_back(gemv_shape(shape, o, bandwidth));
    save();
    if (full_set(shape)) out["leave_out"].push_back(leave_out_shape(shape, o, bandwidth));
    save();
    if (full_set(shape)) {
      out["small_m_gemm_vs_cublas"].push_back(small_m_gemm_shape(shape, o, bandwidth));
    }
    save();
  }
  return 0;
}

}  // namespace
}  // namespace ls

int main(int argc, char** argv) {
  ls::Options options;
  CLI::App app{"The GPU benchmark harness: bandwidth, decode step time, prefill, recording",
               "lockstep_gpu_bench"};
  ls::add_options(app, options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // Before CUDA starts: the ranks' collectives wait for each other (kernels/tp_collectives.h).
  if (options.tp_degree > 1) ls::prepare_tp_environment();
  try {
    return ls::run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep_gpu_bench: %s\n", e.what());
    return 1;
  }
}
