// Fuzzes ParseRange and ParseContentRange. The input is the header value; ParseRange is tried
// against fixed representation sizes and against sizes next to every number in the header (so
// the first == size - 1 / first == size edges are reached). Accepted ranges lie inside the
// representation, their Content-Range parses back to the same range, syntax errors do not depend
// on the size, satisfiability only grows with the size, and every error is the documented code
// with a printable message.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/http/range.h"
#include "tests/fuzz/fuzz_check.h"

using namespace shoal;
using namespace shoal::http;

namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

bool IsSyntaxError(ErrorCode code) {
  return code == ErrorCode::kInvalidArgument || code == ErrorCode::kUnsupported;
}

// Up to a few numbers written in the header (saturating), to probe sizes around them.
std::vector<uint64_t> NumbersIn(std::string_view text) {
  std::vector<uint64_t> out;
  for (size_t i = 0; i < text.size() && out.size() < 4;) {
    if (text[i] < '0' || text[i] > '9') {
      ++i;
      continue;
    }
    uint64_t v = 0;
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
      uint64_t d = static_cast<uint64_t>(text[i] - '0');
      v = (v > (kMax - d) / 10) ? kMax : v * 10 + d;
    }
    out.push_back(v);
  }
  return out;
}

bool SameRange(ByteRange a, ByteRange b) { return a.first == b.first && a.last == b.last; }

void CheckRangeError(const Error& e) {
  FUZZ_CHECK(e.code == ErrorCode::kInvalidArgument || e.code == ErrorCode::kUnsupported ||
             e.code == ErrorCode::kRangeNotSatisfiable);
  FUZZ_CHECK(std::string_view(e.message).starts_with("Range header \""));
  FUZZ_CHECK(fuzz::IsPrintable(e.message));
  FUZZ_CHECK(e.message.size() < 400);
}

// What a 206 for r says, parsed back as a client would.
void CheckContentRangeRoundTrip(ByteRange r, uint64_t size) {
  std::string header = ContentRange(r, size);
  FUZZ_CHECK(fuzz::IsPrintable(header));
  auto parsed = ParseContentRange(header);
  if (size == kMax || r.last == kMax) {
    // "bytes a-b/18446744073709551615" is refused: the size cannot be represented + 1.
    FUZZ_CHECK(!parsed);
    return;
  }
  FUZZ_CHECK(parsed);
  FUZZ_CHECK(SameRange(parsed.value().range, r));
  FUZZ_CHECK(parsed.value().size == size);
}

void CheckRange(std::string_view header, uint64_t size, const Result<ByteRange>& result) {
  if (!result) {
    CheckRangeError(result.error());
    return;
  }
  ByteRange r = result.value();
  FUZZ_CHECK(size > 0);
  FUZZ_CHECK(r.first <= r.last);
  FUZZ_CHECK(r.last < size);
  FUZZ_CHECK(r.length() >= 1 && r.length() <= size);
  CheckContentRangeRoundTrip(r, size);

  // The canonical forms of the same range select the same bytes.
  std::string closed = "bytes=" + std::to_string(r.first) + "-" + std::to_string(r.last);
  auto again = ParseRange(closed, size);
  FUZZ_CHECK(again && SameRange(again.value(), r));
  if (r.last == size - 1) {
    auto open = ParseRange("bytes=" + std::to_string(r.first) + "-", size);
    FUZZ_CHECK(open && SameRange(open.value(), r));
    auto suffix = ParseRange("bytes=-" + std::to_string(r.length()), size);
    FUZZ_CHECK(suffix && SameRange(suffix.value(), r));
  }
  // Surrounding whitespace and the unit's case do not matter.
  auto padded = ParseRange(" \t" + std::string(header) + "\t ", size);
  FUZZ_CHECK(padded && SameRange(padded.value(), r));
}

void CheckParsedContentRange(std::string_view header) {
  auto result = ParseContentRange(header);
  if (!result) {
    const Error& e = result.error();
    FUZZ_CHECK(e.code == ErrorCode::kProtocol);
    FUZZ_CHECK(std::string_view(e.message).starts_with("Content-Range \""));
    FUZZ_CHECK(fuzz::IsPrintable(e.message));
    return;
  }
  const ContentRangeValue& v = result.value();
  FUZZ_CHECK(v.range.first <= v.range.last);
  FUZZ_CHECK(v.range.last < kMax);
  std::string canonical;
  if (v.size) {
    FUZZ_CHECK(v.range.last < *v.size);
    FUZZ_CHECK(*v.size < kMax);
    canonical = ContentRange(v.range, *v.size);
  } else {
    canonical = "bytes " + std::to_string(v.range.first) + "-" + std::to_string(v.range.last) +
                "/*";
  }
  auto again = ParseContentRange(canonical);
  FUZZ_CHECK(again);
  FUZZ_CHECK(SameRange(again.value().range, v.range));
  FUZZ_CHECK(again.value().size == v.size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view header(reinterpret_cast<const char*>(data), size);

  std::vector<uint64_t> sizes = {0, 1, 2, 100, 1000, uint64_t{1} << 32, kMax - 1, kMax};
  for (uint64_t n : NumbersIn(header)) {
    if (n > 0) sizes.push_back(n - 1);
    sizes.push_back(n);
    if (n < kMax) sizes.push_back(n + 1);
  }

  std::optional<ErrorCode> syntax;  // the syntax verdict, which must not depend on the size
  for (uint64_t s : sizes) {
    auto result = ParseRange(header, s);
    CheckRange(header, s, result);
    bool is_syntax_error = !result && IsSyntaxError(result.error().code);
    if (s == sizes.front()) {
      if (is_syntax_error) syntax = result.error().code;
    } else if (syntax) {
      FUZZ_CHECK(!result && result.error().code == *syntax);
    } else {
      FUZZ_CHECK(!is_syntax_error);
    }
    if (syntax) continue;
    // Satisfiable at s means satisfiable at every larger size, starting at the same byte
    // unless it is a suffix range.
    for (uint64_t bigger : {s + 1, s * 2, kMax}) {
      if (bigger <= s) continue;
      auto grown = ParseRange(header, bigger);
      if (result) {
        FUZZ_CHECK(grown);
        FUZZ_CHECK(grown.value().last >= result.value().last);
      } else {
        FUZZ_CHECK(result.error().code == ErrorCode::kRangeNotSatisfiable);
      }
    }
  }

  CheckParsedContentRange(header);
  // The 416 form is not a 206 Content-Range.
  FUZZ_CHECK(!ParseContentRange(ContentRangeUnsatisfied(size)));
  return 0;
}
