#pragma once
// Errors as values: every boundary that can fail (network, disk, parse) returns Result<T>.

#include <string>
#include <string_view>
#include <utility>

#include <boost/outcome/result.hpp>
#include <boost/outcome/success_failure.hpp>

namespace shoal {

// What went wrong, in terms a caller can act on. The registry shim maps these to HTTP statuses
// and OCI error codes in exactly one place (registry-shim/errors.cc).
enum class ErrorCode {
  kInvalidArgument,   // malformed input from a client or a file
  kNotFound,          // the thing does not exist (upstream 404, cache miss)
  kUnauthorized,      // credentials missing or rejected
  kDenied,            // credentials fine, access refused
  kRefused,           // a registry or address this node will not fetch from for the caller
  kRangeNotSatisfiable,
  kDigestMismatch,    // bytes do not hash to the digest they were requested by
  kTooManyRequests,   // upstream quota (429)
  kUnavailable,       // upstream or peer unreachable, 5xx, timed out after retries
  kIo,                // local disk or file system failure
  kInsufficientStorage,  // does not fit in the cache's budget or on its disk
  kProtocol,          // a peer or upstream spoke HTTP/JSON we cannot accept
  kUnsupported,       // valid but not something shoal does (e.g. md5 digests, pushes)
  kCancelled,         // the operation was abandoned (shutdown, client gone)
  kInternal,          // a bug: an invariant did not hold
};

// Short stable name of a code, e.g. "not_found"; used in logs and metrics labels.
std::string_view ErrorCodeName(ErrorCode code);

// An error: a code plus a message that names what failed and on what (digest, URL, path).
struct Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
  // Seconds the caller should wait before retrying (from upstream Retry-After); 0 when unknown.
  int retry_after_s = 0;

  std::string ToString() const;
};

// Either a T or an Error. Accessing the wrong side terminates (a bug, not a runtime condition).
template <typename T>
using Result = boost::outcome_v2::result<T, Error, boost::outcome_v2::policy::terminate>;
using Status = Result<void>;

// The success value for Status-returning functions.
inline auto Ok() { return boost::outcome_v2::success(); }

// Builds an Error; usable as a return value for any Result<T>.
inline Error MakeError(ErrorCode code, std::string message) {
  return Error{code, std::move(message), 0};
}

}  // namespace shoal
