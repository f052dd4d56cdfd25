// Fuzzes ParseWwwAuthenticate: registries (and anything pretending to be one) send this header
// on every 401. Accepted challenges are well-formed (lowercase token schemes and parameter names,
// no control characters in values, token68 or parameters but not both, within the documented
// limits) and survive a round trip: printing them canonically and parsing that again gives the
// same challenges. Errors are kProtocol with a printable message.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lib/upstream/www_authenticate.h"
#include "tests/fuzz/fuzz_check.h"

using namespace shoal;
using namespace shoal::upstream;

namespace {

constexpr size_t kMaxHeader = 16 * 1024;
constexpr size_t kMaxItems = 64;

bool IsTchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool IsLowerToken(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTchar(c) || (c >= 'A' && c <= 'Z')) return false;
  }
  return true;
}

bool IsToken68(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
                          (s[i] >= '0' && s[i] <= '9') ||
                          std::string_view("-._~+/").find(s[i]) != std::string_view::npos)) {
    ++i;
  }
  if (i == 0) return false;
  while (i < s.size() && s[i] == '=') ++i;
  return i == s.size();
}

// The canonical text of challenges: `scheme token68` or `scheme k="v", k2="v2"` joined by ", ".
std::string Print(const std::vector<Challenge>& challenges) {
  std::string out;
  for (const Challenge& c : challenges) {
    if (!out.empty()) out += ", ";
    out += c.scheme;
    if (!c.token68.empty()) {
      out += " " + c.token68;
      continue;
    }
    bool first = true;
    for (const auto& [key, value] : c.params) {
      out += first ? " " : ", ";
      first = false;
      out += key + "=\"";
      for (char ch : value) {
        if (ch == '"' || ch == '\\') out += '\\';
        out += ch;
      }
      out += '"';
    }
  }
  return out;
}

bool Same(const std::vector<Challenge>& a, const std::vector<Challenge>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].scheme != b[i].scheme || a[i].params != b[i].params ||
        a[i].token68 != b[i].token68) {
      return false;
    }
  }
  return true;
}

void CheckError(const Error& e) {
  FUZZ_CHECK(e.code == ErrorCode::kProtocol);
  FUZZ_CHECK(std::string_view(e.message).starts_with("WWW-Authenticate header "));
  FUZZ_CHECK(fuzz::IsPrintable(e.message));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view header(reinterpret_cast<const char*>(data), size);
  auto result = ParseWwwAuthenticate(header);
  if (!result) {
    CheckError(result.error());
    return 0;
  }
  FUZZ_CHECK(size <= kMaxHeader);
  const std::vector<Challenge>& challenges = result.value();
  FUZZ_CHECK(!challenges.empty());
  std::string lower(header);
  for (char& ch : lower) {
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
  }
  size_t items = 0;
  for (const Challenge& c : challenges) {
    items += 1 + c.params.size();
    FUZZ_CHECK(IsLowerToken(c.scheme));
    FUZZ_CHECK(c.token68.empty() || c.params.empty());
    if (!c.token68.empty()) FUZZ_CHECK(IsToken68(c.token68));
    for (const auto& [key, value] : c.params) {
      FUZZ_CHECK(IsLowerToken(key));
      for (char ch : value) {
        auto u = static_cast<unsigned char>(ch);
        FUZZ_CHECK(!((u < 0x20 && ch != '\t') || u == 0x7f));
      }
    }
    // The scheme and the parameter names are in the header as sent (modulo case).
    FUZZ_CHECK(lower.find(c.scheme) != std::string::npos);
    for (const auto& param : c.params) FUZZ_CHECK(lower.find(param.first) != std::string::npos);
  }
  // Repeated parameters collapse, so the input had at least this many items.
  FUZZ_CHECK(items <= kMaxItems);

  std::string canonical = Print(challenges);
  auto again = ParseWwwAuthenticate(canonical);
  if (canonical.size() > kMaxHeader) {
    FUZZ_CHECK(!again);
    CheckError(again.error());
  } else {
    FUZZ_CHECK(again);
    FUZZ_CHECK(Same(again.value(), challenges));
    FUZZ_CHECK(Print(again.value()) == canonical);
  }

  // Challenges of a list stay independent: each challenge alone parses to itself.
  for (const Challenge& c : challenges) {
    std::string one = Print({c});
    if (one.size() > kMaxHeader) continue;
    auto alone = ParseWwwAuthenticate(one);
    FUZZ_CHECK(alone && alone.value().size() == 1 && Same(alone.value(), {c}));
  }
  return 0;
}
