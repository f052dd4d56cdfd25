#pragma once
// Absolute http/https URLs: parsing, printing, and resolving redirect Locations.

#include <cstdint>
#include <string>
#include <string_view>

#include "lib/core/error.h"

namespace shoal::http {

// An absolute http or https URL. Plain value type; no I/O.
struct Url {
  std::string scheme;  // "http" or "https", lowercase
  std::string host;    // lowercase name or IP; IPv6 literals without brackets ("::1")
  uint16_t port = 0;   // explicit or the scheme's default (80/443)
  std::string target;  // path + query, starts with "/"; the fragment is dropped

  // Parses "http[s]://host[:port][/path][?query][#fragment]". Userinfo, other schemes, control
  // characters, spaces and non-ASCII bytes are rejected. Errors: kInvalidArgument naming the URL.
  static Result<Url> Parse(std::string_view text);

  // The URL as text: scheme://HostPort()target.
  std::string str() const;
  // host[:port] as sent in the Host header; brackets IPv6 literals; omits the default port.
  std::string HostPort() const;
  // str() without the query: safe to log or put in error messages (signed CDN URLs carry
  // credentials in the query).
  std::string Redacted() const;
  // True when scheme, host and port are equal (the same origin, RFC 6454).
  bool SameOrigin(const Url& other) const;

  // Resolves a Location header value against this URL: absolute ("https://h/p"),
  // scheme-relative ("//h/p"), absolute-path ("/p?q") or relative ("p", "../p", "?q").
  // Errors: kInvalidArgument naming the location.
  Result<Url> Resolve(std::string_view location) const;
};

// Percent-encodes a query parameter value (RFC 3986 unreserved characters stay as they are).
std::string QueryEscape(std::string_view value);

}  // namespace shoal::http
