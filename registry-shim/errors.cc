#include "registry-shim/errors.h"

#include <nlohmann/json.hpp>

namespace shoal::shim {
namespace {

constexpr std::string_view kUrlMark = "<upstream URL>";
constexpr std::string_view kAddressMark = "<address>";

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsHex(char c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool IsHostChar(char c) { return IsAlpha(c) || IsDigit(c) || c == '-' || c == '.'; }

// Where a URL starting at s[i] (the first letter of its scheme) ends, or i when there is none.
size_t UrlEnd(std::string_view s, size_t i) {
  size_t j = i;
  while (j < s.size() &&
         (IsAlpha(s[j]) || IsDigit(s[j]) || s[j] == '+' || s[j] == '.' || s[j] == '-')) {
    ++j;
  }
  if (j == i || !IsAlpha(s[i]) || s.substr(j, 3) != "://") return i;
  j += 3;
  while (j < s.size()) {
    char c = s[j];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '"' || c == '\'' || c == '<' ||
        c == '>' || c == '(' || c == ')' || c == ',' || c == ';' || c == '`') {
      break;
    }
    ++j;
  }
  // Sentence punctuation after a URL ("...: answered 500", "... failed.") is not part of it.
  while (j > i && (s[j - 1] == ':' || s[j - 1] == '.')) --j;
  return j;
}

// Length of ":<1-5 digits>" at s[i] (0 when there is no port there).
size_t PortLength(std::string_view s, size_t i) {
  if (i >= s.size() || s[i] != ':') return 0;
  size_t j = i + 1;
  while (j < s.size() && IsDigit(s[j]) && j - i <= 5) ++j;
  if (j == i + 1 || (j < s.size() && (IsDigit(s[j]) || IsAlpha(s[j])))) return 0;
  return j - i;
}

// Length of an IPv4 address (and port) at s[i], or 0.
size_t Ipv4Length(std::string_view s, size_t i) {
  size_t j = i;
  for (int part = 0; part < 4; ++part) {
    if (part > 0) {
      if (j >= s.size() || s[j] != '.') return 0;
      ++j;
    }
    size_t start = j;
    while (j < s.size() && IsDigit(s[j]) && j - start < 3) ++j;
    if (j == start) return 0;
  }
  if (j < s.size() && (IsHostChar(s[j]) && s[j] != '.')) return 0;
  if (j + 1 < s.size() && s[j] == '.' && IsDigit(s[j + 1])) return 0;
  return j - i + PortLength(s, j);
}

// Length of "[IPv6]" (and port) at s[i], or 0.
size_t Ipv6Length(std::string_view s, size_t i) {
  if (s[i] != '[') return 0;
  size_t j = i + 1;
  int colons = 0;
  while (j < s.size() && (IsHex(s[j]) || s[j] == ':' || s[j] == '.')) {
    if (s[j] == ':') ++colons;
    ++j;
  }
  if (j >= s.size() || s[j] != ']' || colons < 2) return 0;
  ++j;
  return j - i + PortLength(s, j);
}

// Length of "host.name:port" at s[i], or 0.
size_t HostPortLength(std::string_view s, size_t i) {
  size_t j = i;
  bool dot = false;
  while (j < s.size() && IsHostChar(s[j])) {
    dot = dot || s[j] == '.';
    ++j;
  }
  if (!dot || j == i || (!IsAlpha(s[i]) && !IsDigit(s[i]))) return 0;
  size_t port = PortLength(s, j);
  return port == 0 ? 0 : j - i + port;
}

}  // namespace

std::string RedactAddresses(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    bool token_start = i == 0 || !IsHostChar(s[i - 1]);
    if (token_start) {
      if (size_t end = UrlEnd(s, i); end > i) {
        out += kUrlMark;
        i = end;
        continue;
      }
      size_t n = IsDigit(s[i]) ? Ipv4Length(s, i) : 0;
      if (n == 0) n = Ipv6Length(s, i);
      if (n == 0) n = HostPortLength(s, i);
      if (n > 0) {
        out += kAddressMark;
        i += n;
        continue;
      }
    }
    out += s[i];
    ++i;
  }
  return out;
}

unsigned HttpStatusFor(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return 400;
    case ErrorCode::kNotFound:
    case ErrorCode::kRefused:
      return 404;
    case ErrorCode::kUnauthorized:
      return 401;
    case ErrorCode::kDenied:
      return 403;
    case ErrorCode::kRangeNotSatisfiable:
      return 416;
    case ErrorCode::kUnsupported:
      return 405;
    case ErrorCode::kTooManyRequests:
      return 429;
    // The upstream served bytes that do not match what was asked for: a bad gateway.
    case ErrorCode::kDigestMismatch:
      return 502;
    case ErrorCode::kProtocol:
      return 502;
    case ErrorCode::kUnavailable:
      return 503;
    case ErrorCode::kCancelled:
      return 503;
    case ErrorCode::kIo:
      return 500;
    // RFC 4918's 507: the node's cache cannot hold the blob (budget, pins, disk); runtimes print
    // the status and the message.
    case ErrorCode::kInsufficientStorage:
      return 507;
    case ErrorCode::kInternal:
      return 500;
  }
  return 500;
}

ErrorReply MakeErrorReply(const Error& err, std::string_view oci_code) {
  std::string code(oci_code);
  switch (err.code) {
    case ErrorCode::kUnauthorized:
      code = "UNAUTHORIZED";
      break;
    case ErrorCode::kDenied:
      code = "DENIED";
      break;
    case ErrorCode::kTooManyRequests:
      code = "TOOMANYREQUESTS";
      break;
    case ErrorCode::kUnsupported:
      code = "UNSUPPORTED";
      break;
    case ErrorCode::kRangeNotSatisfiable:
      code = "RANGE_INVALID";
      break;
    case ErrorCode::kRefused:
      code = "NAME_UNKNOWN";
      break;
    case ErrorCode::kIo:
    case ErrorCode::kInsufficientStorage:
    case ErrorCode::kInternal:
    case ErrorCode::kUnavailable:
    case ErrorCode::kCancelled:
    case ErrorCode::kProtocol:
    case ErrorCode::kDigestMismatch:
      if (code.empty()) code = "UNKNOWN";
      break;
    default:
      break;
  }
  if (code.empty()) code = "UNKNOWN";
  std::string message = err.code == ErrorCode::kRefused ? std::string(kRefusedRegistryMessage)
                                                        : RedactAddresses(err.message);
  const bool redacted = message != err.message;
  nlohmann::json detail = {{"reason", ErrorCodeName(err.code)}};
  nlohmann::json body = {
      {"errors", nlohmann::json::array(
                     {{{"code", code}, {"message", std::move(message)}, {"detail", detail}}})}};
  unsigned status = HttpStatusFor(err.code);
  int retry = err.retry_after_s;
  if ((status == 429 || status == 503) && retry <= 0) retry = 1;
  return ErrorReply{status, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    (status == 429 || status == 503) ? retry : 0, redacted};
}

}  // namespace shoal::shim
