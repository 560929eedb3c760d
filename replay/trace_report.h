// The report of a trace (`lockstep report`): one pass over the reader's record iterator that
// folds every step and event into bounded state — step series downsampled to at most
// `points_max` buckets, percentiles from fixed-size histograms, per-request state only for
// requests still running, and a bounded, evenly spaced sample of finished requests for the
// timeline — so memory does not grow with the trace. The result is one JSON document (what
// `--json` writes); the HTML page embeds it and draws it (replay/report_html.cpp).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>

namespace ls::replay {

inline constexpr int32_t kReportPointsMin = 16;
inline constexpr int32_t kReportPointsMax = 10000;
inline constexpr int32_t kTimelineRequestsMax = 10000;

struct ReportOptions {
  int32_t points_max = 400;             // step buckets; between points_max / 2 and points_max remain
  int32_t timeline_requests_max = 200;  // finished requests drawn in the timeline
  std::optional<std::filesystem::path> replay_json;  // `lockstep replay --json` of this trace
};

// Reads the whole trace once. Throws ls::Error for an unusable trace or a replay result that is
// malformed or of another trace; a truncated tail is reported in the document, not an error.
nlohmann::ordered_json build_trace_report(const std::filesystem::path& trace, const ReportOptions& options);

// The self-contained page: inline CSS, SVG drawn by an inline script from the embedded
// document, no network.
std::string render_report_html(const nlohmann::ordered_json& report);

}  // namespace ls::replay
