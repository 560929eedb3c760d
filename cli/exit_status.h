// The exit status of every `lockstep` command, defined once: main prints kExitStatusHelp under
// every command's help, and the commands return these values.
#pragma once

namespace ls::cli {

inline constexpr int kExitOk = 0;
// A finding: a replay that diverged, a broken invariant, a seed that failed, traces that differ.
inline constexpr int kExitFinding = 1;
// Unusable input or usage: a bad flag, prompt file, trace, model or results file (CLI11's own
// parse errors, 104–114, are mapped to this too).
inline constexpr int kExitUnusable = 2;

inline constexpr const char* kExitStatusHelp =
    "Exit status (every command): 0 ok; 1 a divergence or a broken invariant (a replay that "
    "diverged, a checker or seed that failed, traces that differ); 2 unusable input or usage (a "
    "bad flag, prompt file, trace, model or results file).";

}  // namespace ls::cli
