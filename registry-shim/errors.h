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
};

// Builds the reply for err. oci_code is the OCI code that fits the request when the error is
// about the thing requested (e.g. "BLOB_UNKNOWN" for a missing blob, "DIGEST_INVALID" for a bad
// digest); codes that do not depend on the request (UNAUTHORIZED, DENIED, TOOMANYREQUESTS,
// UNSUPPORTED) are chosen from err.code.
ErrorReply MakeErrorReply(const Error& err, std::string_view oci_code);

// The HTTP status for an error code.
unsigned HttpStatusFor(ErrorCode code);

}  // namespace shoal::shim
