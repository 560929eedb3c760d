// The GPU benchmark (GPU.md "How to spend GPU time", STYLE.md §24): in one run, the streaming
// bandwidth of this GPU (a plain copy kernel), then decode step time of the CUDA backend for the
// llama-1b and llama-8b shapes (random bf16 weights made on the device from a seed) at several
// batch sizes and contexts, eager and with CUDA graphs, each with the bytes it must move (weights
// + KV read) and the fraction of the measured bandwidth it reached; prefill tokens/s at a
// 2048-token prompt; host time per step. Writes JSON (date, GPU, driver, commit, figures).
//
//   lockstep_gpu_bench OUT.json [--quick] [--shapes llama-1b,llama-8b]
#include "core/check.h"
#include "core/executor.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_check.h"
#include "kernels/weight_init.h"

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#ifndef LOCKSTEP_GIT_COMMIT
#define LOCKSTEP_GIT_COMMIT "unknown"
#endif

namespace ls {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr uint64_t kWeightsSeed = 1234;
constexpr int32_t kPageSize = 16;
constexpr int32_t kPrefillChunk = 2048;
constexpr int32_t kRowsMax = 64;
constexpr int32_t kDecodeSlack = 64;  // decode steps past the context, warm-up included

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Device-to-device copy through a plain kernel; bytes counted as read + write.
double measure_copy_bandwidth(int64_t bytes, int32_t repeats) {
  void* a = nullptr;
  void* b = nullptr;
  LS_CUDA(cudaMalloc(&a, static_cast<size_t>(bytes)));
  LS_CUDA(cudaMalloc(&b, static_cast<size_t>(bytes)));
  LS_CUDA(cudaMemset(a, 1, static_cast<size_t>(bytes)));
  cudaEvent_t start = nullptr, stop = nullptr;
  LS_CUDA(cudaEventCreate(&start));
  LS_CUDA(cudaEventCreate(&stop));
  std::vector<double> rates;
  for (int32_t i = 0; i < repeats + 3; ++i) {
    LS_CUDA(cudaEventRecord(start));
    LS_CUDA(kernels::launch_copy_bytes(i % 2 ? a : b, i % 2 ? b : a, bytes, nullptr));
    LS_CUDA(cudaEventRecord(stop));
    LS_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    LS_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 3) rates.push_back(2.0 * static_cast<double>(bytes) / (ms * 1e-3));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return median(rates);
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
  Driver(Executor& executor, const ExecutorConfig& config, int32_t vocab)
      : executor_(executor), config_(config), vocab_(vocab) {}

  // Prefills pool rows 1..rows with fresh requests of `context` tokens; returns seconds.
  double prefill(int32_t rows, int32_t context) {
    const int32_t pages_per_row = (config_.context_length + kPageSize - 1) / kPageSize;
    const auto begin = Clock::now();
    int32_t row = 0;
    std::vector<int32_t> prefix(static_cast<size_t>(rows), 0);
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
        if (done == 0) {
          r.sampling = SamplingParams{};
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
      executor_.step(op);
    }
    return std::chrono::duration<double>(Clock::now() - begin).count();
  }

  // Decodes rows 1..rows for `steps` steps; returns each step's wall seconds.
  std::vector<double> decode(int32_t rows, int32_t steps, CudaBackend& backend,
                             std::vector<double>* host_seconds) {
    ForwardOp op;
    for (int32_t r = 0; r < rows; ++r) {
      OpRow row;
      row.kind = RowKind::kDecode;
      row.request_id = first_id_ + static_cast<RequestId>(r);
      row.pool_row = r + 1;
      row.input_length = 1;
      op.rows.push_back(row);
    }
    std::vector<double> seconds;
    for (int32_t s = 0; s < steps; ++s) {
      const auto begin = Clock::now();
      executor_.step(op);
      const double wall = std::chrono::duration<double>(Clock::now() - begin).count();
      seconds.push_back(wall);
      host_seconds->push_back(wall - static_cast<double>(backend.last_wait_ns()) * 1e-9);
    }
    return seconds;
  }

 private:
  Executor& executor_;
  ExecutorConfig config_;
  int32_t vocab_;
  RequestId next_id_ = 1;
  RequestId first_id_ = 1;
};

// Bytes one decode step must move: every linear weight and the LM head once, plus the KV of
// every row's context (read) — the floor a memory-bound step cannot beat.
int64_t decode_bytes(const ModelConfig& m, int32_t rows, int32_t context) {
  const int64_t h = m.hidden_size;
  const int64_t per_layer = h * (m.q_size() + 2 * m.kv_size()) + int64_t{m.q_size()} * h +
                            3 * h * m.ffn_size;
  const int64_t weights = 2 * (per_layer * m.layers_count + int64_t{m.vocab_size} * h);
  const int64_t kv = 2 * int64_t{rows} * context * m.layers_count * 2 * m.kv_size();
  return weights + kv;
}

struct Options {
  std::string out_path;
  bool quick = false;
  std::vector<std::string> shapes = {"llama-1b", "llama-8b"};
};

json bench_shape(const std::string& shape, bool graphs, const Options& o, double bandwidth) {
  const ModelConfig model = model_config_named(shape);
  const std::vector<int32_t> contexts = o.quick ? std::vector<int32_t>{192} : std::vector<int32_t>{192, 1024};
  const std::vector<int32_t> batches = o.quick ? std::vector<int32_t>{1, 64} : std::vector<int32_t>{1, 16, 64};
  const int32_t warmup = 5;
  const int32_t steps = o.quick ? 10 : 30;
  const ExecutorConfig config = bench_config(*std::max_element(contexts.begin(), contexts.end()));
  CudaBackend backend(DeviceSeededWeights{model, kWeightsSeed}, config,
                      CudaBackendOptions{.graphs = graphs});
  Executor executor(config, model.vocab_size, backend);
  Driver driver(executor, config, model.vocab_size);
  const CudaMemoryReport memory = backend.memory_report();
  json result = {{"shape", shape},
                 {"graphs", graphs},
                 {"weight_bytes", memory.weight_bytes},
                 {"kv_bytes", memory.kv_bytes},
                 {"workspace_bytes", memory.workspace_bytes},
                 {"kv_tokens_capacity", int64_t{config.pages_count} * config.page_size},
                 {"decode", json::array()}};
  std::printf("%s, %s: weights %.2f GB, KV %.2f GB, workspace %.2f GB\n", shape.c_str(),
              graphs ? "graphs" : "eager", static_cast<double>(memory.weight_bytes) * 1e-9,
              static_cast<double>(memory.kv_bytes) * 1e-9,
              static_cast<double>(memory.workspace_bytes) * 1e-9);
  // Prefill of one 2048-token prompt (one chunk), after a warm-up prefill.
  driver.prefill(1, kPrefillChunk);
  const double prefill_s = driver.prefill(1, kPrefillChunk);
  result["prefill_2048_tokens_per_s"] = kPrefillChunk / prefill_s;
  std::printf("  prefill 2048 tokens: %.1f ms, %.0f tokens/s\n", prefill_s * 1e3, kPrefillChunk / prefill_s);
  for (const int32_t context : contexts) {
    for (const int32_t rows : batches) {
      driver.prefill(rows, context);
      std::vector<double> host;
      driver.decode(rows, warmup, backend, &host);
      host.clear();
      const std::vector<double> seconds = driver.decode(rows, steps, backend, &host);
      const double step_s = median(seconds);
      const int32_t mean_context = context + warmup + steps / 2;
      const int64_t bytes = decode_bytes(model, rows, mean_context);
      const double fraction = static_cast<double>(bytes) / step_s / bandwidth;
      std::printf("  decode batch %2d context %4d: %.3f ms/step, host %.1f us, %.2f GB moved, "
                  "%.1f%% of %.2f TB/s\n",
                  rows, context, step_s * 1e3, median(host) * 1e6, static_cast<double>(bytes) * 1e-9,
                  fraction * 100, bandwidth * 1e-12);
      result["decode"].push_back({{"batch", rows},
                                  {"context", context},
                                  {"mean_context", mean_context},
                                  {"step_ms_median", step_s * 1e3},
                                  {"host_us_median", median(host) * 1e6},
                                  {"bytes_moved", bytes},
                                  {"bandwidth_fraction", fraction},
                                  {"steps", steps}});
    }
  }
  result["graph_replays"] = backend.graph_replays_count();
  return result;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--shapes" && i + 1 < argc) {
      o.shapes.clear();
      std::stringstream list(argv[++i]);
      for (std::string s; std::getline(list, s, ',');) o.shapes.push_back(s);
    } else if (o.out_path.empty() && !a.starts_with("--")) {
      o.out_path = a;
    } else {
      throw Error("usage: lockstep_gpu_bench OUT.json [--quick] [--shapes llama-1b,llama-8b]");
    }
  }
  LS_REQUIRE(!o.out_path.empty(), "usage: lockstep_gpu_bench OUT.json [--quick] [--shapes ...]");
  return o;
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const CudaMachineInfo machine = cuda_machine_info();
  std::printf("%s, %s SMs, driver %s, CUDA runtime %s, cuBLAS %s, commit %s\n",
              machine.gpu_name.c_str(), machine.sm_count.c_str(), machine.driver_version.c_str(),
              machine.runtime_version.c_str(), machine.cublas_version.c_str(), LOCKSTEP_GIT_COMMIT);
  const double bandwidth = measure_copy_bandwidth(int64_t{2} << 30, o.quick ? 10 : 30);
  std::printf("copy bandwidth (read + write): %.2f TB/s\n", bandwidth * 1e-12);
  json out = {{"date", utc_now()},
              {"gpu", machine.gpu_name},
              {"sm_count", machine.sm_count},
              {"driver", machine.driver_version},
              {"cuda_runtime", machine.runtime_version},
              {"cublas", machine.cublas_version},
              {"commit", LOCKSTEP_GIT_COMMIT},
              {"command", "lockstep_gpu_bench"},
              {"copy_bandwidth_bytes_per_s", bandwidth},
              {"shapes", json::array()}};
  for (const std::string& shape : o.shapes) {
    for (const bool graphs : {false, true}) {
      out["shapes"].push_back(bench_shape(shape, graphs, o, bandwidth));
      std::ofstream(o.out_path) << out.dump(2) << "\n";  // keep what is done if a later one fails
    }
  }
  std::ofstream(o.out_path) << out.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace ls

int main(int argc, char** argv) {
  try {
    return ls::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep_gpu_bench: %s\n", e.what());
    return 1;
  }
}
