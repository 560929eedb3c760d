// Two kinds of assertion, both active in every build type (STYLE.md §9):
//   LS_ASSERT  — a bug in lockstep: print file:line and the condition, then abort.
//   LS_REQUIRE — the caller's or the input's fault: throw ls::Error with a message that names
//                the field and the limit, so a bad forward op or file never takes the process down.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace ls {

// An operating error: bad input, a bad file, a violated limit. Always carries a readable message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

[[noreturn]] void assert_failed(const char* file, int line, const char* condition,
                                const std::string& detail);

}  // namespace ls

#define LS_ASSERT(cond, ...)                                                          \
  do {                                                                                \
    if (!(cond)) [[unlikely]]                                                         \
      ::ls::assert_failed(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
  } while (0)

#define LS_REQUIRE(cond, ...)                                      \
  do {                                                             \
    if (!(cond)) [[unlikely]]                                      \
      throw ::ls::Error(::fmt::format(__VA_ARGS__));               \
  } while (0)
