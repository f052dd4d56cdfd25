#pragma once
// WWW-Authenticate challenges (RFC 7235 / RFC 9110 section 11) as sent by registries.

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/error.h"

namespace shoal::upstream {

// One authentication challenge, e.g. Bearer realm="https://auth.docker.io/token",service="...".
struct Challenge {
  std::string scheme;                         // lowercased: "bearer", "basic", ...
  std::map<std::string, std::string> params;  // keys lowercased (realm, service, scope, error);
                                              // values unquoted and unescaped
  std::string token68;                        // the token68 form instead of params, rarely used
};

// Parses a WWW-Authenticate header value: one or more comma-separated challenges, each with
// auth-params (token or quoted-string values, backslash escapes) or a token68. A repeated
// parameter keeps its first value. Input longer than 16 KiB or with more than 64 challenges or
// parameters is refused. Errors: kProtocol with the reason.
Result<std::vector<Challenge>> ParseWwwAuthenticate(std::string_view header);

}  // namespace shoal::upstream
