#include "lib/http/range.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace shoal::http {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

std::string Quote(std::string_view text) {
  constexpr size_t kShown = 100;
  std::string s = "\"";
  for (char c : text.substr(0, kShown)) {
    unsigned char u = static_cast<unsigned char>(c);
    s += (u < 0x20 || u >= 0x7f) ? '?' : c;
  }
  if (text.size() > kShown) s += "...";
  s += '"';
  return s;
}

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Parses 1*DIGIT; numbers beyond uint64 saturate to kMax, which keeps their meaning (a start that
// large is unsatisfiable, an end or suffix that large means "to the end").
std::optional<uint64_t> ParseDigits(std::string_view s) {
  if (s.empty()) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    uint64_t d = static_cast<uint64_t>(c - '0');
    v = (v > (kMax - d) / 10) ? kMax : v * 10 + d;
  }
  return v;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// RFC 9110 5.6.2 token characters.
bool IsTchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

struct Spec {
  std::optional<uint64_t> first;  // empty for a suffix range
  std::optional<uint64_t> last;   // empty for "a-"; the suffix length for "-n"
};

}  // namespace

Result<ByteRange> ParseRange(std::string_view header, uint64_t size) {
  auto malformed = [&](std::string_view why) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "Range header " + Quote(header) + " is malformed: " + std::string(why));
  };
  std::string_view s = TrimOws(header);
  size_t eq = s.find('=');
  if (eq == std::string_view::npos) return malformed("no '='");
  std::string_view unit = TrimOws(s.substr(0, eq));
  if (unit.empty() || !std::all_of(unit.begin(), unit.end(), IsTchar)) {
    return malformed("the range unit is not a token");
  }
  if (!EqualsIgnoreCase(unit, "bytes")) {
    // RFC 9110 14.2: a server MUST ignore a Range with a unit it does not understand.
    return MakeError(ErrorCode::kUnsupported, "Range header " + Quote(header) +
                                                  " has the unknown range unit " + Quote(unit));
  }
  std::string_view set = s.substr(eq + 1);

  std::vector<Spec> specs;
  while (true) {
    size_t comma = set.find(',');
    std::string_view item = TrimOws(set.substr(0, comma));
    if (!item.empty()) {  // RFC 9110 list syntax: empty elements are ignored
      size_t dash = item.find('-');
      if (dash == std::string_view::npos) return malformed("a range has no '-'");
      std::string_view a = item.substr(0, dash);
      std::string_view b = item.substr(dash + 1);
      Spec spec;
      if (!a.empty()) {
        spec.first = ParseDigits(a);
        if (!spec.first) return malformed("a range start is not a number");
      }
      if (!b.empty()) {
        spec.last = ParseDigits(b);
        if (!spec.last) return malformed("a range end is not a number");
      }
      if (!spec.first && !spec.last) return malformed("a range has neither start nor end");
      if (spec.first && spec.last && *spec.last < *spec.first) {
        return malformed("a range ends before it starts");
      }
      specs.push_back(spec);
    }
    if (comma == std::string_view::npos) break;
    set.remove_prefix(comma + 1);
  }
  if (specs.empty()) return malformed("no range");
  if (specs.size() > 1) {
    return MakeError(ErrorCode::kUnsupported, "Range header " + Quote(header) +
                                                  " asks for several ranges; only one is "
                                                  "supported");
  }

  const Spec& spec = specs[0];
  auto unsatisfiable = [&] {
    return MakeError(ErrorCode::kRangeNotSatisfiable, "Range header " + Quote(header) +
                                                          " is outside a representation of " +
                                                          std::to_string(size) + " bytes");
  };
  if (!spec.first) {  // suffix: the last n bytes
    uint64_t n = *spec.last;
    if (n == 0 || size == 0) return unsatisfiable();
    return ByteRange{size - std::min(n, size), size - 1};
  }
  if (*spec.first >= size) return unsatisfiable();
  uint64_t last = spec.last ? std::min(*spec.last, size - 1) : size - 1;
  return ByteRange{*spec.first, last};
}

std::string ContentRange(ByteRange r, uint64_t size) {
  return "bytes " + std::to_string(r.first) + "-" + std::to_string(r.last) + "/" +
         std::to_string(size);
}

std::string ContentRangeUnsatisfied(uint64_t size) { return "bytes */" + std::to_string(size); }

Result<ContentRangeValue> ParseContentRange(std::string_view header) {
  auto bad = [&] {
    return MakeError(ErrorCode::kProtocol, "Content-Range " + Quote(header) + " is malformed");
  };
  std::string_view s = TrimOws(header);
  size_t sp = s.find(' ');
  if (sp == std::string_view::npos || !EqualsIgnoreCase(s.substr(0, sp), "bytes")) return bad();
  s = TrimOws(s.substr(sp + 1));
  size_t dash = s.find('-');
  size_t slash = s.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || slash < dash) {
    return bad();
  }
  auto first = ParseDigits(s.substr(0, dash));
  auto last = ParseDigits(s.substr(dash + 1, slash - dash - 1));
  if (!first || !last || *last < *first || *last == kMax) return bad();
  ContentRangeValue v{ByteRange{*first, *last}, std::nullopt};
  std::string_view size_text = s.substr(slash + 1);
  if (size_text != "*") {
    v.size = ParseDigits(size_text);
    if (!v.size || *v.size == kMax || *last >= *v.size) return bad();
  }
  return v;
}

}  // namespace shoal::http
