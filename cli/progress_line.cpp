#include "cli/progress_line.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include <unistd.h>

namespace ls::cli {

ProgressLine::ProgressLine(std::FILE* out) : ProgressLine(out, isatty(fileno(out)) != 0) {}

ProgressLine::ProgressLine(std::FILE* out, bool terminal) : out_(out), terminal_(terminal) {}

void ProgressLine::show(std::string_view text, double fraction) {
  if (terminal_) {
    fmt::print(out_, "\r{}\033[K", text);
    std::fflush(out_);
    drawn_ = true;
    return;
  }
  const int tenth = static_cast<int>(std::floor(std::clamp(fraction, 0.0, 1.0) * 10.0));
  if (tenth <= last_tenth_) return;
  last_tenth_ = tenth;
  fmt::print(out_, "{}\n", text);
  std::fflush(out_);
}

void ProgressLine::finish(bool keep) {
  if (!terminal_ || !drawn_) return;
  std::fputs(keep ? "\n" : "\r\033[K", out_);
  std::fflush(out_);
  drawn_ = false;
}

}  // namespace ls::cli
