// Formatting of internal check failures.
#include "core/error.h"

namespace mt::core {

void fail_check(const char* condition, const char* file, int line, const std::string& message) {
    throw Error(ExitCode::internal, fmt::format("{} (check `{}` failed at {}:{})", message, condition, file, line));
}

}  // namespace mt::core
