// lib/http/retry_after: Retry-After as delta-seconds or an HTTP-date.
#include <doctest/doctest.h>

#include <ctime>

#include "lib/http/retry_after.h"

namespace shoal::http {

TEST_CASE("http retry-after: delta-seconds, HTTP-dates, junk and the one-day cap") {
  CHECK(RetryAfterSeconds("") == 0);
  CHECK(RetryAfterSeconds("1") == 1);
  CHECK(RetryAfterSeconds("120") == 120);
  CHECK(RetryAfterSeconds("9999999") == 24 * 3600);  // more than 6 digits saturates
  CHECK(RetryAfterSeconds("90000") == 24 * 3600);
  CHECK(RetryAfterSeconds("-5") == 0);
  CHECK(RetryAfterSeconds("soon") == 0);
  CHECK(RetryAfterSeconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0);  // in the past
  char future[64];
  std::time_t t = std::time(nullptr) + 3600;
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(future, sizeof future, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  int s = RetryAfterSeconds(future);
  CHECK(s >= 3590);
  CHECK(s <= 3600);
}

}  // namespace shoal::http
