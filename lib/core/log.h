#pragma once
// Process-wide logging setup on spdlog: JSON lines (for cluster log collectors) or text.

#include <chrono>
#include <string_view>

namespace shoal {

// Configures spdlog's default logger to write to stderr. format: "json" or "text"; level: one of
// trace, debug, info, warn, error. Unknown values fall back to json / info. Call once at startup.
void InitLogging(std::string_view format, std::string_view level, std::string_view component);

// Milliseconds from t to now, for timings in log messages.
inline long long MillisSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t)
      .count();
}

}  // namespace shoal
