// `lockstep report` on a ~1 GB trace: its peak RSS and time (not a ctest; run by hand).
//
//   build/bench/lockstep_bench_report [--gib 1.0] [--dir /tmp]
//
// The trace is a simulated run (seed 7, speculative decoding W 5, every fault site, page
// pressure: retractions and recoveries) recorded once, then written again and again behind
// itself — steps and request ids shifted each time so every repetition is new work for the
// report (new requests, later steps) — until the file reaches the size asked for. The report is
// then written by the `lockstep` command itself in a child process, and the child's peak RSS is
// read with getrusage(RUSAGE_CHILDREN) once it has exited: what a user running it would see. The
// child is forked first thing, while this process is still small, and waits on a pipe: a child
// forked later would start with this process's pages, which Linux counts in the child's peak.
#include "core/check.h"
#include "core/model/weights.h"
#include "replay/trace_report.h"
#include "sim/sweep.h"
#include "sim/trace_recording.h"
#include "trace/reader.h"
#include "trace/recorder.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <filesystem>
#include <string>
#include <vector>

namespace {

using namespace ls;

constexpr double kRssBoundMiB = 200;
constexpr uint64_t kRequestIdShift = 1'000'000;

trace::TraceHeader sim_header(const sim::SimParams& params, const ModelWeights& weights) {
  const WeightSource source{WeightSource::Kind::kSeed, 0, ""};
  trace::TraceHeader h = trace::make_trace_header(weights, source, sim::executor_config_for(params), "cpu",
                                                  trace::MachineInfo{.cpu_name = "bench"});
  h.drafter = params.drafter_name();
  h.step_clock = "simulated";
  h.device_timer = "simulated";
  return h;
}

// Records the seed's run and returns its records (a few MB).
std::vector<trace::TraceRecord> record_seed(const std::filesystem::path& path, trace::TraceHeader& header) {
  const sim::SimOverrides overrides{.requests_count = 80, .faults = std::vector<sim::FaultSite>{
      sim::FaultSite::kNanLogits, sim::FaultSite::kOovSample, sim::FaultSite::kPagePressure,
      sim::FaultSite::kAbortMidPrefill, sim::FaultSite::kContextLimit, sim::FaultSite::kLateResult},
      .speculative = true};
  const sim::SimParams params = sim::derive_params(7, overrides);
  const ModelWeights weights = weights_from_seed(model_config_named("tiny"), 0);
  header = sim_header(params, weights);
  {
    auto recorder = trace::Recorder::open(path, header);
    sim::SimTraceObserver observer(*recorder);
    sim::WorldOptions world{.observer = &observer, .executor_options = trace::recording_executor_options()};
    sim::run_seed(params, weights, world, false);
    recorder->close();
  }
  trace::TraceReader reader = trace::TraceReader::open(path);
  std::vector<trace::TraceRecord> records;
  while (auto record = reader.next()) {
    if (!std::holds_alternative<trace::TraceFooter>(*record)) records.push_back(std::move(*record));
  }
  return records;
}

// One repetition of the run, `steps` and `ids` later.
void write_repetition(trace::Recorder& recorder, const std::vector<trace::TraceRecord>& records, int64_t steps,
                      uint64_t ids) {
  for (const trace::TraceRecord& record : records) {
    if (auto* in = std::get_if<trace::StepInputRecord>(&record)) {
      trace::StepInputRecord copy = *in;
      copy.step += steps;
      for (OpRow& row : copy.op.rows) row.request_id += ids;
      recorder.record_input(std::move(copy));
    } else if (auto* out = std::get_if<trace::StepOutputRecord>(&record)) {
      trace::StepOutputRecord copy = *out;
      copy.step += steps;
      recorder.record_output(std::move(copy));
    } else if (auto* e = std::get_if<trace::TraceEvent>(&record)) {
      trace::TraceEvent copy = *e;
      copy.step += steps;
      copy.request_id += ids;
      recorder.record_event(std::move(copy));
    }
  }
}

int64_t last_step(const std::vector<trace::TraceRecord>& records) {
  int64_t last = 0;
  for (const trace::TraceRecord& record : records) {
    if (auto* in = std::get_if<trace::StepInputRecord>(&record)) last = std::max(last, in->step);
    if (auto* e = std::get_if<trace::TraceEvent>(&record)) last = std::max(last, e->step);
  }
  return last;
}

// A child forked while this process is small, waiting on a pipe for the trace's path; then it
// runs `what`. Its own peak RSS comes back from wait4.
struct Launcher {
  pid_t pid = -1;
  int write_fd = -1;
};

enum class Run { kLibrary, kCli, kCliHelp };

// The report written by the library inside the child: the report's own memory.
int report_in_process(const std::string& trace) {
  try {
    const nlohmann::ordered_json report = replay::build_trace_report(trace, {});
    std::ofstream(trace + ".html") << replay::render_report_html(report);
    std::ofstream(trace + ".json") << report.dump(1);
    return 0;
  } catch (const Error& e) {
    fmt::print(stderr, "report: {}\n", e.what());
    return 1;
  }
}

[[noreturn]] void launched(Run what, const std::string& trace) {
  const std::string html = trace + ".cli.html", json = trace + ".cli.json";
  switch (what) {
    case Run::kLibrary: ::_exit(report_in_process(trace));
    case Run::kCli:
      ::execl(LOCKSTEP_CLI, LOCKSTEP_CLI, "report", trace.c_str(), "-o", html.c_str(), "--json", json.c_str(),
              static_cast<char*>(nullptr));
      break;
    case Run::kCliHelp:
      ::execl(LOCKSTEP_CLI, LOCKSTEP_CLI, "--help", static_cast<char*>(nullptr));
      break;
  }
  ::_exit(127);
}

Launcher fork_launcher(Run what) {
  int fds[2];
  LS_REQUIRE(::pipe(fds) == 0, "pipe failed");
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[1]);
    std::string trace;
    char c = 0;
    // Up to a newline, not to EOF: later launchers hold copies of this pipe's write end.
    while (::read(fds[0], &c, 1) == 1 && c != '\n') trace += c;
    if (c != '\n') ::_exit(126);  // the parent gave up before the trace was written
    if (what == Run::kCliHelp && !std::freopen("/dev/null", "w", stdout)) ::_exit(125);
    launched(what, trace);
  }
  ::close(fds[0]);
  return {child, fds[1]};
}

struct Outcome {
  int status = 0;
  double seconds = 0;
  double rss_mib = 0;
};

// Hands the launcher the trace's path; its exit status, time and peak RSS (wait4, this child only).
Outcome run_launcher(const Launcher& launcher, const std::string& trace) {
  const auto start = std::chrono::steady_clock::now();
  const std::string line = trace + "\n";
  LS_REQUIRE(::write(launcher.write_fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()),
             "write to the launcher failed");
  ::close(launcher.write_fd);
  int status = 0;
  rusage usage{};
  ::wait4(launcher.pid, &status, 0, &usage);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
          double(usage.ru_maxrss) / 1024};  // ru_maxrss is in KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  const Launcher library = fork_launcher(Run::kLibrary);
  const Launcher cli = fork_launcher(Run::kCli);
  const Launcher help = fork_launcher(Run::kCliHelp);
  double gib = 1.0;
  std::string dir = "/tmp";
  CLI::App app{"lockstep report of a large trace: peak RSS and time", "lockstep_bench_report"};
  app.add_option("--gib", gib, "Size of the trace to write, GiB")
      ->check(CLI::Range(0.001, 1024.0))
      ->capture_default_str();
  app.add_option("--dir", dir, "Where the trace is written")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const std::filesystem::path base = std::filesystem::path(dir) / fmt::format("lockstep-report-bench-{}", ::getpid());
  const std::string seed_trace = base.string() + "-seed.trace", big = base.string() + ".trace";
  trace::TraceHeader header;
  const std::vector<trace::TraceRecord> records = record_seed(seed_trace, header);
  const int64_t period = last_step(records) + 1;
  const int64_t inputs = std::count_if(records.begin(), records.end(), [](const trace::TraceRecord& r) {
    return std::holds_alternative<trace::StepInputRecord>(r);
  });
  const uint64_t target = static_cast<uint64_t>(gib * double(uint64_t{1} << 30));
  const auto write_start = std::chrono::steady_clock::now();
  int64_t repetitions = 0;
  {
    auto recorder = trace::Recorder::open(big, header, {.fsync_on_close = false});
    while (recorder->stats().bytes_written < target) {
      write_repetition(*recorder, records, repetitions * period, static_cast<uint64_t>(repetitions) * kRequestIdShift);
      ++repetitions;
    }
    recorder->close();
  }
  const double write_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - write_start).count();
  const uint64_t bytes = std::filesystem::file_size(big);
  fmt::print("trace: {:.2f} GiB, {} repetitions of a run of {} steps over {} step numbers (seed 7, W 5, faults all), "
             "{} steps, written in {:.1f} s\n",
             double(bytes) / double(uint64_t{1} << 30), repetitions, inputs, period, repetitions * inputs, write_seconds);
  const Outcome own = run_launcher(library, big);
  fmt::print("report (the library, in a small process): exit {}, {:.1f} s ({:.0f} MB/s), peak RSS {:.1f} MiB "
             "(getrusage; bound {:.0f} MiB); page {} bytes, JSON {} bytes\n",
             own.status, own.seconds, double(bytes) / 1e6 / own.seconds, own.rss_mib, kRssBoundMiB,
             std::filesystem::file_size(big + ".html"), std::filesystem::file_size(big + ".json"));
  const Outcome command = run_launcher(cli, big);
  const Outcome baseline = run_launcher(help, big);
  fmt::print("lockstep report (the command): exit {}, {:.1f} s, peak RSS {:.1f} MiB; `lockstep --help` alone: "
             "{:.1f} MiB (the libraries the binary loads at start, e.g. cuBLAS on a CUDA build)\n",
             command.status, command.seconds, command.rss_mib, baseline.rss_mib);
  for (const std::string& p : {seed_trace, big, big + ".html", big + ".json", big + ".cli.html", big + ".cli.json"}) {
    std::filesystem::remove(p);
  }
  return own.status == 0 && command.status == 0 && own.rss_mib < kRssBoundMiB ? 0 : 1;
}
