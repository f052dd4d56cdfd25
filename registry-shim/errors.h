#pragma once
// The one place that turns an internal Error into an HTTP status and an OCI error body.

#include <string>
#include <string_view>

#include "lib/core/error.h"

namespace shoal::shim {

// An HTTP error answer in the OCI distribution format.
struct ErrorReply {
  unsigned status;        // HTTP status code
  std::string body;       // {"errors":[{"code":...,"message":...,"detail":...}]}
  int retry_after_s = 0;  // for 429/503, 0 when none
  // The message named an upstream URL or an IP address, which the body does not show, or was
  // replaced (kRefused): the caller should log err.message, so that the operator still sees it.
  bool redacted = false;
};

// Builds the reply for err. oci_code is the OCI code that fits the request when the error is
// about the thing requested (e.g. "BLOB_UNKNOWN" for a missing blob, "DIGEST_INVALID" for a bad
// digest); codes that do not depend on the request (UNAUTHORIZED, DENIED, TOOMANYREQUESTS,
// UNSUPPORTED) are chosen from err.code. The message is shown through RedactAddresses, except
// for kRefused: 404 NAME_UNKNOWN with kRefusedRegistryMessage whatever the reason (not mapped,
// a non-global address, a name that does not resolve), so that a client cannot probe which
// addresses or ports the node can reach.
ErrorReply MakeErrorReply(const Error& err, std::string_view oci_code);

// The one message a client sees for a refused registry (kRefused).
inline constexpr std::string_view kRefusedRegistryMessage =
    "registry not served: not in this agent's upstream map";

// The HTTP status for an error code.
unsigned HttpStatusFor(ErrorCode code);

// A message fit for a client of the shim, without internal addresses: every URL
// ("scheme://...": the upstream endpoint, a redirect target, a token realm, a tracker) becomes
// "<upstream URL>", every IP address (IPv4, or IPv6 in brackets, with its port if any: peers,
// resolved upstreams) and every "host.name:port" becomes "<address>". Host names without a port
// (gcr.io) and the rest of the text are kept. An image name the client sent with an IP or a port
// in it (127.0.0.1:5000/app) is redacted too: a small loss against any leak.
std::string RedactAddresses(std::string_view message);

}  // namespace shoal::shim
