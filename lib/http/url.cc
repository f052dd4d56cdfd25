#include "lib/http/url.h"

#include <utility>

#include <boost/asio/ip/address_v6.hpp>

namespace shoal::http {
namespace {

std::string Quote(std::string_view text) {
  constexpr size_t kMax = 200;
  std::string s = "\"";
  for (char c : text.substr(0, kMax)) {
    unsigned char u = static_cast<unsigned char>(c);
    s += (u < 0x20 || u >= 0x7f) ? '?' : c;
  }
  if (text.size() > kMax) s += "...";
  s += '"';
  return s;
}

Error Invalid(std::string_view text, std::string_view why) {
  return MakeError(ErrorCode::kInvalidArgument, "URL " + Quote(text) + " " + std::string(why));
}

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string ToLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = Lower(c);
  return out;
}

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Path, query and fragment may hold any printable ASCII except space; everything else would let
// a hostile Location smuggle bytes into the request line.
bool IsTargetText(std::string_view s) {
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) return false;
  }
  return true;
}

bool IsHostName(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  for (char c : s) {
    if (!IsAlpha(c) && !IsDigit(c) && c != '-' && c != '.' && c != '_') return false;
  }
  return true;
}

uint16_t DefaultPort(std::string_view scheme) { return scheme == "https" ? 443 : 80; }

// Length of a leading RFC 3986 scheme followed by ':', or 0 if the text does not start with one.
size_t SchemeLength(std::string_view s) {
  if (s.empty() || !IsAlpha(s[0])) return 0;
  for (size_t i = 1; i < s.size(); ++i) {
    char c = s[i];
    if (c == ':') return i;
    if (!IsAlpha(c) && !IsDigit(c) && c != '+' && c != '-' && c != '.') return 0;
  }
  return 0;
}

std::string StripFragment(std::string_view s) {
  return std::string(s.substr(0, s.find('#')));
}

// RFC 3986 section 5.2.4, applied to the path only (the query is carried along untouched).
std::string RemoveDotSegments(std::string_view target) {
  size_t q = target.find('?');
  std::string_view path = target.substr(0, q);
  std::string_view query = q == std::string_view::npos ? std::string_view() : target.substr(q);
  std::string out;
  std::string in(path);
  while (!in.empty()) {
    if (in.rfind("../", 0) == 0) {
      in.erase(0, 3);
    } else if (in.rfind("./", 0) == 0) {
      in.erase(0, 2);
    } else if (in.rfind("/./", 0) == 0) {
      in.replace(0, 3, "/");
    } else if (in == "/.") {
      in = "/";
    } else if (in.rfind("/../", 0) == 0 || in == "/..") {
      in = in.size() == 3 ? std::string("/") : in.substr(3);
      size_t slash = out.rfind('/');
      out.erase(slash == std::string::npos ? 0 : slash);
    } else if (in == "." || in == "..") {
      in.clear();
    } else {
      size_t next = in.find('/', 1);
      out += in.substr(0, next);
      in.erase(0, next == std::string::npos ? in.size() : next);
    }
  }
  if (out.empty() || out[0] != '/') out.insert(0, "/");
  out += query;
  return out;
}

}  // namespace

Result<Url> Url::Parse(std::string_view text) {
  size_t scheme_len = SchemeLength(text);
  if (scheme_len == 0 || text.substr(scheme_len, 3) != "://") {
    return Invalid(text, "is not absolute (want http:// or https://)");
  }
  Url url;
  url.scheme = ToLower(text.substr(0, scheme_len));
  if (url.scheme != "http" && url.scheme != "https") {
    return Invalid(text, "has an unsupported scheme (want http or https)");
  }
  std::string_view rest = text.substr(scheme_len + 3);
  size_t auth_end = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, auth_end);
  std::string_view tail = auth_end == std::string_view::npos ? std::string_view() : rest.substr(auth_end);
  if (authority.find('@') != std::string_view::npos) {
    return Invalid(text, "has userinfo, which is not accepted");
  }
  std::string_view port_text;
  if (!authority.empty() && authority[0] == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return Invalid(text, "has an unterminated IPv6 literal");
    std::string literal(authority.substr(1, close - 1));
    // Hex digits, ':' and '.' (an embedded IPv4 address) only. make_address_v6 also takes a
    // "%zone" suffix with any bytes after the '%', and stops at a NUL, so "[::1%\r\nX: y]" would
    // put CR LF into the Host header; a zone id has no place in a Host header anyway.
    for (char c : literal) {
      if (!IsDigit(c) && !((c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')) && c != ':' &&
          c != '.') {
        return Invalid(text, "has an invalid IPv6 literal");
      }
    }
    boost::system::error_code ec;
    boost::asio::ip::make_address_v6(literal, ec);
    if (ec) return Invalid(text, "has an invalid IPv6 literal");
    url.host = ToLower(literal);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return Invalid(text, "has junk after the IPv6 literal");
      port_text = after.substr(1);
    }
  } else {
    size_t colon = authority.find(':');
    std::string_view host = authority.substr(0, colon);
    if (!IsHostName(host)) return Invalid(text, "has an invalid host");
    url.host = ToLower(host);
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  url.port = DefaultPort(url.scheme);
  if (!port_text.empty()) {
    if (port_text.size() > 5) return Invalid(text, "has an invalid port");
    uint32_t port = 0;
    for (char c : port_text) {
      if (!IsDigit(c)) return Invalid(text, "has an invalid port");
      port = port * 10 + static_cast<uint32_t>(c - '0');
    }
    if (port == 0 || port > 65535) return Invalid(text, "has a port out of range");
    url.port = static_cast<uint16_t>(port);
  }
  if (!IsTargetText(tail)) return Invalid(text, "has spaces, control or non-ASCII characters");
  std::string target = StripFragment(tail);
  if (target.empty() || target[0] != '/') target.insert(0, "/");
  url.target = std::move(target);
  return url;
}

std::string Url::HostPort() const {
  std::string s = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  if (port != DefaultPort(scheme)) s += ":" + std::to_string(port);
  return s;
}

std::string Url::str() const { return scheme + "://" + HostPort() + target; }

std::string Url::Redacted() const {
  return scheme + "://" + HostPort() + target.substr(0, target.find('?'));
}

bool Url::SameOrigin(const Url& other) const {
  return scheme == other.scheme && host == other.host && port == other.port;
}

Result<Url> Url::Resolve(std::string_view location) const {
  auto invalid = [&](std::string_view why) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "redirect location " + Quote(location) + " from " + Redacted() + " " +
                         std::string(why));
  };
  // Location values are trimmed of surrounding whitespace by the header parser already; be safe.
  while (!location.empty() && (location.front() == ' ' || location.front() == '\t')) {
    location.remove_prefix(1);
  }
  while (!location.empty() && (location.back() == ' ' || location.back() == '\t')) {
    location.remove_suffix(1);
  }
  if (location.empty()) return invalid("is empty");
  if (location.substr(0, 2) == "//") return Parse(scheme + ":" + std::string(location));
  if (SchemeLength(location) > 0) return Parse(location);
  if (!IsTargetText(location)) return invalid("has spaces, control or non-ASCII characters");
  Url url = *this;
  std::string ref = StripFragment(location);
  if (ref.empty()) return url;  // "#frag" alone: same resource
  std::string base_path = target.substr(0, target.find('?'));
  if (ref[0] == '/') {
    url.target = RemoveDotSegments(ref);
  } else if (ref[0] == '?') {
    url.target = base_path + ref;
  } else {
    url.target = RemoveDotSegments(base_path.substr(0, base_path.rfind('/') + 1) + ref);
  }
  return url;
}

std::string QueryEscape(std::string_view value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (IsAlpha(c) || IsDigit(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += c;
    } else {
      unsigned char u = static_cast<unsigned char>(c);
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return out;
}

}  // namespace shoal::http
