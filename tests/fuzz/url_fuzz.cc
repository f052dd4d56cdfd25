// Fuzzes Url::Parse, str(), Resolve and QueryEscape. Redirect Locations and Bearer realms come
// from upstream registries, so both Parse and Resolve see hostile text. Input: "BASE\nLOCATION"
// resolves LOCATION against BASE (when BASE parses); the whole input is also parsed as a URL and
// resolved against a fixed base.
//
// Properties: an accepted URL is well-formed (http/https, lowercase host, port != 0, target
// starting with '/', no fragment, nothing but printable non-space ASCII in what goes on the
// wire) and its text parses back to the same URL; relative references keep the origin and their
// dot segments are gone; QueryEscape output is unreserved-or-%XX and decodes back to its input;
// errors are kInvalidArgument with a printable message.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "lib/http/url.h"
#include "tests/fuzz/fuzz_check.h"

using namespace shoal;
using namespace shoal::http;

namespace {

constexpr std::string_view kBase = "https://registry.example:5000/v2/library/alpine/manifests/x?n=1";

// What may go on the request line or into the Host header: printable ASCII, no space.
bool IsWireText(std::string_view s) {
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) return false;
  }
  return true;
}

bool SameUrl(const Url& a, const Url& b) {
  return a.scheme == b.scheme && a.host == b.host && a.port == b.port && a.target == b.target;
}

void CheckError(const Error& e) {
  FUZZ_CHECK(e.code == ErrorCode::kInvalidArgument);
  FUZZ_CHECK(!e.message.empty());
  FUZZ_CHECK(fuzz::IsPrintable(e.message));
}

// The path has no "." or ".." segments left (what RemoveDotSegments guarantees).
bool HasNoDotSegments(std::string_view target) {
  std::string_view path = target.substr(0, target.find('?'));
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    std::string_view seg = path.substr(start, slash == std::string_view::npos ? path.npos
                                                                              : slash - start);
    if (start > 0 && (seg == "." || seg == "..")) return false;
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return true;
}

void CheckUrl(const Url& u) {
  FUZZ_CHECK(u.scheme == "http" || u.scheme == "https");
  FUZZ_CHECK(!u.host.empty());
  for (char c : u.host) FUZZ_CHECK(!(c >= 'A' && c <= 'Z'));
  FUZZ_CHECK(IsWireText(u.host));
  FUZZ_CHECK(u.port != 0);
  FUZZ_CHECK(!u.target.empty() && u.target[0] == '/');
  FUZZ_CHECK(u.target.find('#') == std::string::npos);
  FUZZ_CHECK(IsWireText(u.target));

  std::string hostport = u.HostPort();
  FUZZ_CHECK(IsWireText(hostport));
  bool v6 = u.host.find(':') != std::string::npos;
  FUZZ_CHECK(hostport.starts_with(v6 ? "[" + u.host + "]" : u.host));
  uint16_t default_port = u.scheme == "https" ? 443 : 80;
  FUZZ_CHECK((u.port == default_port) == (hostport.size() == u.host.size() + (v6 ? 2 : 0)));

  std::string text = u.str();
  FUZZ_CHECK(IsWireText(text));
  std::string redacted = u.Redacted();
  FUZZ_CHECK(text.starts_with(redacted));
  FUZZ_CHECK(redacted.find('?') == std::string::npos);
  FUZZ_CHECK(u.SameOrigin(u));

  auto again = Url::Parse(text);
  FUZZ_CHECK(again);
  FUZZ_CHECK(SameUrl(again.value(), u));
  FUZZ_CHECK(again.value().str() == text);

  // Resolving references that name this very URL gives it back.
  auto self = u.Resolve(text);
  FUZZ_CHECK(self && SameUrl(self.value(), u));
  auto fragment = u.Resolve("#frag");
  FUZZ_CHECK(fragment && SameUrl(fragment.value(), u));
  auto scheme_relative = u.Resolve("//" + hostport + u.target);
  FUZZ_CHECK(scheme_relative && SameUrl(scheme_relative.value(), u));
  std::string path = u.target.substr(0, u.target.find('?'));
  auto query = u.Resolve("?a=b");
  FUZZ_CHECK(query && query.value().target == path + "?a=b");
}

void CheckResolve(const Url& base, std::string_view location) {
  auto result = base.Resolve(location);
  if (!result) {
    CheckError(result.error());
    return;
  }
  const Url& r = result.value();
  CheckUrl(r);
  std::string_view trimmed = location;
  while (!trimmed.empty() && (trimmed.front() == ' ' || trimmed.front() == '\t')) {
    trimmed.remove_prefix(1);
  }
  bool has_scheme = false;
  for (size_t i = 0; i < trimmed.size(); ++i) {
    char c = trimmed[i];
    bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (c == ':') {
      has_scheme = i > 0;
      break;
    }
    if (!alpha && (i == 0 || !((c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.'))) {
      break;
    }
  }
  if (!has_scheme && !trimmed.starts_with("//")) {
    // A relative reference stays on the same origin, and its path is normalised.
    FUZZ_CHECK(r.SameOrigin(base));
    if (!trimmed.starts_with("?") && !trimmed.starts_with("#")) {
      FUZZ_CHECK(HasNoDotSegments(r.target));
      // Normalising again changes nothing (a target starting "//" would be scheme-relative).
      if (!r.target.starts_with("//")) {
        auto again = base.Resolve(r.target);
        FUZZ_CHECK(again && SameUrl(again.value(), r));
      }
    }
  }
}

void CheckQueryEscape(std::string_view value) {
  static constexpr std::string_view kHex = "0123456789ABCDEF";
  std::string escaped = QueryEscape(value);
  FUZZ_CHECK(escaped.size() >= value.size() && escaped.size() <= 3 * value.size());
  std::string decoded;
  for (size_t i = 0; i < escaped.size(); ++i) {
    char c = escaped[i];
    if (c == '%') {
      FUZZ_CHECK(i + 2 < escaped.size());
      size_t hi = kHex.find(escaped[i + 1]);
      size_t lo = kHex.find(escaped[i + 2]);
      FUZZ_CHECK(hi != kHex.npos && lo != kHex.npos);
      decoded += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      bool unreserved = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                        (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
      FUZZ_CHECK(unreserved);
      decoded += c;
    }
  }
  FUZZ_CHECK(decoded == value);
  FUZZ_CHECK(QueryEscape(decoded) == escaped);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  static const Url fixed_base = Url::Parse(kBase).value();

  auto url = Url::Parse(input);
  if (url) {
    CheckUrl(url.value());
  } else {
    CheckError(url.error());
    FUZZ_CHECK(std::string_view(url.error().message).starts_with("URL \""));
  }
  CheckResolve(fixed_base, input);

  if (size_t nl = input.find('\n'); nl != std::string_view::npos) {
    auto base = Url::Parse(input.substr(0, nl));
    if (base) CheckResolve(base.value(), input.substr(nl + 1));
  }

  CheckQueryEscape(input);
  return 0;
}
