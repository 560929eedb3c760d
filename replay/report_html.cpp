#include "core/check.h"
#include "replay/trace_report.h"

#include <string_view>

namespace ls::replay {

// replay/report_page.html, embedded at build time (replay/CMakeLists.txt).
extern const char kReportPageTemplate[];

namespace {
constexpr std::string_view kDataPlaceholder = "/*LOCKSTEP_REPORT_DATA*/";
}

std::string render_report_html(const nlohmann::ordered_json& report) {
  // Invalid UTF-8 from an untrusted trace's text becomes U+FFFD rather than an exception; '<'
  // is written as \u003c so no string in the document can close the <script> element it sits in.
  const std::string json = report.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  std::string escaped;
  escaped.reserve(json.size());
  for (const char c : json) {
    if (c == '<') {
      escaped += "\\u003c";
    } else {
      escaped += c;
    }
  }
  std::string page(kReportPageTemplate);
  const size_t at = page.find(kDataPlaceholder);
  LS_ASSERT(at != std::string::npos, "the report page template lacks its data placeholder");
  page.replace(at, kDataPlaceholder.size(), escaped);
  return page;
}

}  // namespace ls::replay
