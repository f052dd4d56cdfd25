#pragma once
// The Retry-After response header (RFC 9110 section 10.2.3).

#include <string_view>

namespace shoal::http {

// Seconds to wait from a Retry-After value, as delta-seconds or an HTTP-date, capped at a day;
// 0 when absent, unparsable or in the past.
int RetryAfterSeconds(std::string_view value);

}  // namespace shoal::http
