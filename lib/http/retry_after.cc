#include "lib/http/retry_after.h"

#include <algorithm>
#include <ctime>
#include <string>

namespace shoal::http {
namespace {
constexpr int kMaxRetryAfterSeconds = 24 * 3600;
}  // namespace

int RetryAfterSeconds(std::string_view v) {
  if (v.empty()) return 0;
  if (std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    if (v.size() > 6) return kMaxRetryAfterSeconds;
    return std::min(std::stoi(std::string(v)), kMaxRetryAfterSeconds);
  }
  std::tm tm{};
  std::string text(v);
  if (!strptime(text.c_str(), "%a, %d %b %Y %H:%M:%S", &tm)) return 0;
  time_t when = timegm(&tm);
  time_t now = std::time(nullptr);
  if (when <= now) return 0;
  return static_cast<int>(std::min<time_t>(when - now, kMaxRetryAfterSeconds));
}

}  // namespace shoal::http
