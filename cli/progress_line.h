// A long command's progress on stderr (`sim --seeds`, `generate`, `replay`). On a terminal, one
// line redrawn in place; anywhere else (a CI log, a file, a pipe) a plain line each time another
// tenth of the work is done — a sweep of 15,000 seeds leaves eleven lines in a log, not 15,000
// carriage returns on one.
#pragma once

#include <cstdio>
#include <string_view>

namespace ls::cli {

class ProgressLine {
 public:
  // Draws in place when `out` is a terminal.
  explicit ProgressLine(std::FILE* out = stderr);
  ProgressLine(std::FILE* out, bool terminal);

  // Shows `text`, the state after `fraction` (0..1) of the work.
  void show(std::string_view text, double fraction);
  // Before a line of its own after the progress: on a terminal, ends the drawn line (`keep`) or
  // clears it; elsewhere nothing (each line already ended).
  void finish(bool keep);
  bool terminal() const { return terminal_; }

 private:
  std::FILE* out_;
  bool terminal_;
  bool drawn_ = false;   // a line is drawn in place and not yet ended or cleared
  int last_tenth_ = -1;  // off a terminal: the last tenth of the work printed
};

}  // namespace ls::cli
