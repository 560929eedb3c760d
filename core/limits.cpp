#include "core/limits.h"

#include "core/check.h"

namespace ls {

int32_t Limits::table_width() const {
  LS_ASSERT(page_size >= 1, "page_size {} (validate() first)", page_size);
  if (verify_width == 1) return (context_length + page_size) / page_size;
  return (context_length + verify_width + page_size - 1) / page_size;
}

const LimitField& limit_field(int32_t Limits::*member) {
  for (const LimitField& field : kLimitFields) {
    if (field.member == member) return field;
  }
  LS_ASSERT(false, "a member of Limits without a row in kLimitFields");
  __builtin_unreachable();
}

std::optional<std::string> limit_error(const LimitField& field, int64_t value) {
  if (value >= field.min && value <= field.max) return std::nullopt;
  return fmt::format("{} must be in [{}, {}], got {}", field.name, field.min, field.max, value);
}

void Limits::validate() const {
  for (const LimitField& field : kLimitFields) {
    const std::optional<std::string> error = limit_error(field, this->*field.member);
    LS_REQUIRE(!error, "limits: {}", *error);
  }
}

}  // namespace ls
