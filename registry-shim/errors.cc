#include "registry-shim/errors.h"

#include <nlohmann/json.hpp>

namespace shoal::shim {

unsigned HttpStatusFor(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return 400;
    case ErrorCode::kNotFound: return 404;
    case ErrorCode::kUnauthorized: return 401;
    case ErrorCode::kDenied: return 403;
    case ErrorCode::kRangeNotSatisfiable: return 416;
    case ErrorCode::kUnsupported: return 405;
    case ErrorCode::kTooManyRequests: return 429;
    // The upstream served bytes that do not match what was asked for: a bad gateway.
    case ErrorCode::kDigestMismatch: return 502;
    case ErrorCode::kProtocol: return 502;
    case ErrorCode::kUnavailable: return 503;
    case ErrorCode::kCancelled: return 503;
    case ErrorCode::kIo: return 500;
    // RFC 4918's 507: the node's cache cannot hold the blob (budget, pins, disk); runtimes print
    // the status and the message.
    case ErrorCode::kInsufficientStorage: return 507;
    case ErrorCode::kInternal: return 500;
  }
  return 500;
}

ErrorReply MakeErrorReply(const Error& err, std::string_view oci_code) {
  std::string code(oci_code);
  switch (err.code) {
    case ErrorCode::kUnauthorized: code = "UNAUTHORIZED"; break;
    case ErrorCode::kDenied: code = "DENIED"; break;
    case ErrorCode::kTooManyRequests: code = "TOOMANYREQUESTS"; break;
    case ErrorCode::kUnsupported: code = "UNSUPPORTED"; break;
    case ErrorCode::kRangeNotSatisfiable: code = "RANGE_INVALID"; break;
    case ErrorCode::kIo:
    case ErrorCode::kInsufficientStorage:
    case ErrorCode::kInternal:
    case ErrorCode::kUnavailable:
    case ErrorCode::kCancelled:
    case ErrorCode::kProtocol:
    case ErrorCode::kDigestMismatch:
      if (code.empty()) code = "UNKNOWN";
      break;
    default: break;
  }
  if (code.empty()) code = "UNKNOWN";
  nlohmann::json detail = {{"reason", ErrorCodeName(err.code)}};
  nlohmann::json body = {
      {"errors", nlohmann::json::array({{{"code", code},
                                         {"message", err.message},
                                         {"detail", detail}}})}};
  unsigned status = HttpStatusFor(err.code);
  int retry = err.retry_after_s;
  if ((status == 429 || status == 503) && retry <= 0) retry = 1;
  return ErrorReply{status, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    (status == 429 || status == 503) ? retry : 0};
}

}  // namespace shoal::shim
