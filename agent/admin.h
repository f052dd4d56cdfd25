#pragma once
// Helpers shared by the agent's admin API handlers (/shoal/v1/... on the shim port): decoding a
// request target's query and building JSON answers.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "registry-shim/server.h"

namespace shoal::agent {

// The path and the decoded query parameters of an admin request target. A repeated key keeps
// its last value in `params` and every value, in order, in `lists`.
struct AdminTarget {
  std::string path;
  std::map<std::string, std::string> params;
  std::map<std::string, std::vector<std::string>> lists;

  // The parameter's value, or dflt when absent.
  std::string Param(const std::string& key, std::string dflt = "") const;
  // Every value given for key (empty when absent).
  const std::vector<std::string>& List(const std::string& key) const;
};

// Splits and percent-decodes target ("/path?a=1&b=2"); nullopt for a malformed escape.
std::optional<AdminTarget> ParseAdminTarget(const std::string& target);
// status and body rendered as indented JSON.
shim::AdminReply JsonReply(unsigned status, const nlohmann::json& body);
// {"error": e} with the status for e's code: 404 kNotFound, 400 kInvalidArgument,
// 503 kUnavailable, else 500.
shim::AdminReply ErrorReply(const Error& e);
// Milliseconds since the Unix epoch.
int64_t UnixMs(std::chrono::system_clock::time_point t);

}  // namespace shoal::agent
