#include "lib/core/error.h"

namespace shoal {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kUnauthorized: return "unauthorized";
    case ErrorCode::kDenied: return "denied";
    case ErrorCode::kRefused: return "refused";
    case ErrorCode::kRangeNotSatisfiable: return "range_not_satisfiable";
    case ErrorCode::kDigestMismatch: return "digest_mismatch";
    case ErrorCode::kTooManyRequests: return "too_many_requests";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kInsufficientStorage: return "insufficient_storage";
    case ErrorCode::kProtocol: return "protocol";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kCancelled: return "cancelled";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

std::string Error::ToString() const {
  std::string s(ErrorCodeName(code));
  s += ": ";
  s += message;
  return s;
}

}  // namespace shoal
