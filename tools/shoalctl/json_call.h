#pragma once
// One blocking JSON request from shoalctl to an agent's admin API or a tracker's JSON API, and
// the duration syntax shoalctl's flags take.

#include <utility>  // before Asio (GCC 12 + Boost 1.74)

#include <optional>
#include <string>

#include <boost/beast/http/verb.hpp>
#include <nlohmann/json.hpp>

#include "lib/core/error.h"

namespace shoal::ctl {

// An answer: the HTTP status and its JSON body.
struct JsonReply {
  unsigned status = 0;
  nlohmann::json body;
  // body["error"] when it is a string, else the body's text.
  std::string Error() const;
};

// Sends method base_url + target (with a JSON body when body is not empty, and with
// "Authorization: Bearer <bearer>" when bearer is not empty) on a fresh io_context and waits
// for the answer. Errors: kInvalidArgument for a bad base_url (naming `flag`), transport
// errors, kProtocol when the answer is not JSON.
Result<JsonReply> JsonCall(const std::string& base_url, boost::beast::http::verb method,
                           const std::string& target, const std::string& body = "",
                           const std::string& flag = "--agent", const std::string& bearer = "");

// "90" (seconds), "90s", "15m", "24h", "7d" -> seconds. nullopt when malformed or negative.
std::optional<long long> ParseDuration(const std::string& text);

}  // namespace shoal::ctl
