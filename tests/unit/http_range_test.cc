#include <doctest/doctest.h>

#include "lib/http/range.h"

#include "tests/support/why.h"

namespace shoal::http {
TEST_SUITE_BEGIN("http");

namespace {
ByteRange Ok(std::string_view h, uint64_t size) {
  auto r = ParseRange(h, size);
  REQUIRE_MESSAGE(r.has_value(), Why(r));
  return r.value();
}
ErrorCode Code(std::string_view h, uint64_t size) {
  auto r = ParseRange(h, size);
  REQUIRE_FALSE(r.has_value());
  return r.error().code;
}
}  // namespace

TEST_CASE("range: parses a closed range") {
  ByteRange r = Ok("bytes=0-99", 1000);
  CHECK(r.first == 0);
  CHECK(r.last == 99);
  CHECK(r.length() == 100);
  CHECK(Ok("bytes=5-5", 6).length() == 1);
}

TEST_CASE("range: clamps the end to the last byte") {
  ByteRange r = Ok("bytes=10-5000", 100);
  CHECK(r.first == 10);
  CHECK(r.last == 99);
}

TEST_CASE("range: parses an open-ended range") {
  ByteRange r = Ok("bytes=100-", 1000);
  CHECK(r.first == 100);
  CHECK(r.last == 999);
}

TEST_CASE("range: parses a suffix range and caps it at the whole representation") {
  ByteRange r = Ok("bytes=-10", 1000);
  CHECK(r.first == 990);
  CHECK(r.last == 999);
  r = Ok("bytes=-5000", 1000);
  CHECK(r.first == 0);
  CHECK(r.last == 999);
}

TEST_CASE("range: accepts case-insensitive unit and optional whitespace") {
  CHECK(Ok("Bytes=1-2", 10).first == 1);
  CHECK(Ok("  bytes = 1-2 ", 10).last == 2);
  CHECK(Ok("bytes= 3-4 ,", 10).first == 3);  // empty list elements are ignored
}

TEST_CASE("range: rejects malformed syntax with invalid_argument") {
  for (const char* bad : {"", "bytes", "bytes=", "bytes=-", "bytes=a-b", "bytes=1-x", "bytes=x-1",
                          "bytes=5-1", "bytes=1", "bytes=+1-2", "bytes=1--2", "bytes=0x1-2",
                          "bytes=,", "bytes=1 -2", "=0-1", "by tes=0-1", "(bytes)=0-1"}) {
    std::string shown(bad);
    CAPTURE(shown);
    CHECK(Code(bad, 100) == ErrorCode::kInvalidArgument);
  }
  auto r = ParseRange("bytes=5-1", 100);
  CHECK(r.error().message.find("bytes=5-1") != std::string::npos);
}

TEST_CASE("range: a unit other than bytes is unsupported (RFC 9110 14.2: ignore it)") {
  for (const char* other : {"items=0-5", "items=0-1", "pages=1", "x=", "rows=a-b"}) {
    std::string shown(other);
    CAPTURE(shown);
    auto r = ParseRange(other, 100);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == ErrorCode::kUnsupported);
    CHECK(r.error().message.find("unknown range unit") != std::string::npos);
  }
}

TEST_CASE("range: refuses several ranges as unsupported") {
  CHECK(Code("bytes=0-1,5-6", 100) == ErrorCode::kUnsupported);
  CHECK(Code("bytes=0-1, -5", 100) == ErrorCode::kUnsupported);
  // Syntax errors win over the multi-range refusal.
  CHECK(Code("bytes=0-1,zz", 100) == ErrorCode::kInvalidArgument);
}

TEST_CASE("range: rejects a start beyond the end with 416") {
  CHECK(Code("bytes=100-", 100) == ErrorCode::kRangeNotSatisfiable);
  CHECK(Code("bytes=100-200", 100) == ErrorCode::kRangeNotSatisfiable);
  CHECK(Code("bytes=0-", 0) == ErrorCode::kRangeNotSatisfiable);
  CHECK(Code("bytes=-0", 100) == ErrorCode::kRangeNotSatisfiable);
  CHECK(Code("bytes=-5", 0) == ErrorCode::kRangeNotSatisfiable);
  CHECK(Ok("bytes=99-", 100).length() == 1);
}

TEST_CASE("range: numbers beyond 64 bits saturate instead of overflowing") {
  const uint64_t max = ~uint64_t{0};
  // A huge start is unsatisfiable, not wrapped around to a small number.
  CHECK(Code("bytes=18446744073709551616-", 100) == ErrorCode::kRangeNotSatisfiable);
  CHECK(Code("bytes=99999999999999999999999999999999-", 100) == ErrorCode::kRangeNotSatisfiable);
  // A huge end means "to the end".
  ByteRange r = Ok("bytes=10-99999999999999999999999999999999", 100);
  CHECK(r.last == 99);
  // A huge suffix means the whole representation.
  r = Ok("bytes=-99999999999999999999999999999999", 100);
  CHECK(r.first == 0);
  CHECK(r.last == 99);
  // The largest representation still works.
  r = Ok("bytes=18446744073709551613-", max);
  CHECK(r.first == max - 2);
  CHECK(r.last == max - 1);
  CHECK(Code("bytes=" + std::string(100000, '9') + "-", 100) == ErrorCode::kRangeNotSatisfiable);
}

TEST_CASE("range: formats Content-Range values") {
  CHECK(ContentRange(ByteRange{0, 99}, 1000) == "bytes 0-99/1000");
  CHECK(ContentRangeUnsatisfied(1000) == "bytes */1000");
}

TEST_CASE("range: parses a server's Content-Range") {
  auto v = ParseContentRange("bytes 100-199/1000");
  REQUIRE(v.has_value());
  CHECK(v.value().range.first == 100);
  CHECK(v.value().range.last == 199);
  CHECK(v.value().size == 1000);
  v = ParseContentRange("bytes 0-0/*");
  REQUIRE(v.has_value());
  CHECK_FALSE(v.value().size.has_value());
  for (const char* bad : {"", "bytes", "bytes 1-0/10", "bytes 0-10/10", "bytes */10",
                          "items 0-1/10", "bytes 0-1", "bytes a-b/c"}) {
    std::string shown(bad);
    CAPTURE(shown);
    CHECK(ParseContentRange(bad).error().code == ErrorCode::kProtocol);
  }
}

TEST_SUITE_END();
}  // namespace shoal::http
