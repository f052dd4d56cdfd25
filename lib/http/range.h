#pragma once
// HTTP byte ranges (RFC 9110 section 14): the Range request header and Content-Range.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "lib/core/error.h"

namespace shoal::http {

// A non-empty run of bytes [first, last], both inclusive.
struct ByteRange {
  uint64_t first = 0;
  uint64_t last = 0;
  // Number of bytes in the range (last - first + 1).
  uint64_t length() const { return last - first + 1; }
};

// Parses a Range header holding one range of a representation of `size` bytes: "bytes=a-b",
// "bytes=a-" or "bytes=-n" (the last n bytes). `last` is clamped to size-1; numbers of any length
// are accepted (they saturate). Errors: kInvalidArgument for malformed syntax (answer 400),
// kUnsupported for several ranges or a unit other than bytes (RFC 9110 14.2: ignore the header
// and send the whole representation), kRangeNotSatisfiable when first >= size or for a suffix
// of 0 (answer 416 with ContentRangeUnsatisfied).
Result<ByteRange> ParseRange(std::string_view header, uint64_t size);

// The Content-Range value of a 206 answer: "bytes a-b/size".
std::string ContentRange(ByteRange r, uint64_t size);

// The Content-Range value of a 416 answer: "bytes */size".
std::string ContentRangeUnsatisfied(uint64_t size);

// A parsed Content-Range of a 206 response.
struct ContentRangeValue {
  ByteRange range;
  std::optional<uint64_t> size;  // empty for "bytes a-b/*"
};

// Parses "bytes a-b/size" or "bytes a-b/*" as sent by a server with a 206. Errors: kProtocol.
Result<ContentRangeValue> ParseContentRange(std::string_view header);

}  // namespace shoal::http
