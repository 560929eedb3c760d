#include "cli/report_command.h"

#include "cli/exit_status.h"
#include "cli/number_flags.h"
#include "core/check.h"
#include "replay/trace_report.h"

#include <fmt/format.h>

#include <fstream>
#include <memory>

namespace ls::cli {

namespace {

struct ReportCliOptions {
  std::string trace;
  std::string html;
  std::string json;
  std::string replay_json;
  int32_t points = 400;
  int32_t timeline_requests = 200;
};

void write_file(const std::string& path, const std::string& text, const char* flag) {
  std::ofstream out(path, std::ios::binary);
  LS_REQUIRE(out.good(), "{} {}: cannot open for writing", flag, path);
  out << text;
  out.flush();
  LS_REQUIRE(out.good(), "{} {}: write failed", flag, path);
}

int run_report(const ReportCliOptions& o) {
  LS_REQUIRE(!o.html.empty() || !o.json.empty(), "lockstep report: give -o report.html, --json out.json or both");
  replay::ReportOptions options{.points_max = o.points, .timeline_requests_max = o.timeline_requests};
  if (!o.replay_json.empty()) options.replay_json = o.replay_json;
  nlohmann::ordered_json report;
  try {
    report = replay::build_trace_report(o.trace, options);
  } catch (const Error& e) {
    throw Error(fmt::format("report of {}: {}", o.trace, e.what()));
  }
  const auto replace = nlohmann::ordered_json::error_handler_t::replace;
  if (!o.json.empty()) write_file(o.json, report.dump(1, ' ', false, replace) + "\n", "--json");
  if (!o.html.empty()) write_file(o.html, replay::render_report_html(report), "-o");
  const auto& totals = report["totals"];
  fmt::print("report of {}: {} steps, {} requests arrived{}{}{}\n", o.trace, totals["steps"].get<int64_t>(),
             report["requests"]["arrived"].get<int64_t>(), o.html.empty() ? "" : "; page " + o.html,
             o.json.empty() ? "" : "; JSON " + o.json,
             report["replay"].is_null() ? "" : "; replay " + report["replay"]["verdict"].get<std::string>());
  return kExitOk;
}

}  // namespace

std::function<int()> add_report_command(CLI::App& app) {
  auto o = std::make_shared<ReportCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "report", "One self-contained HTML page (and/or JSON) of a trace: batch composition, "
                "tokens, KV pages and retractions, accept rate, requests ended and why, TTFT and "
                "inter-token percentiles, a per-request timeline, the first divergence of a replay");
  cmd->add_option("trace", o->trace, "The trace file")->required();
  cmd->add_option("-o,--output", o->html, "Write the HTML page here");
  cmd->add_option("--json", o->json, "Write the report's numbers as JSON here (what the page shows)");
  cmd->add_option("--replay-json", o->replay_json,
                  "The result of `lockstep replay TRACE --json R` for this trace: its verdict and "
                  "first divergence are shown and marked on every chart");
  cmd->add_option("--points", o->points, "Step buckets per chart (the series is downsampled to at most this)")
      ->check(integer_in(replay::kReportPointsMin, replay::kReportPointsMax, "points"))
      ->capture_default_str();
  cmd->add_option("--timeline-requests", o->timeline_requests, "Requests drawn in the timeline (an even sample)")
      ->check(integer_in(2, replay::kTimelineRequestsMax, "timeline requests"))
      ->capture_default_str();
  cmd->footer(kExitStatusHelp);
  return [cmd, o]() { return cmd->parsed() ? run_report(*o) : -1; };
}

}  // namespace ls::cli
