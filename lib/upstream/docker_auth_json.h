#pragma once
// Internal to lib/upstream: the docker config.json "auths" entry parser, shared by Credentials
// (a plain config.json) and UpstreamMap (its map file takes the same entries). Parse errors
// never quote the entry's content (it holds secrets).

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/upstream/credentials.h"

namespace shoal::upstream::internal {

// Reads one auths entry: {"auth": "base64(user:pass)"} or {"username": ..., "password": ...}.
// Returns nothing for entries without usable credentials (credential helpers, identity tokens).
// `where` names the entry in error messages ("docker config /p: entry for gcr.io").
// Errors: kInvalidArgument.
Result<std::optional<BasicAuth>> ParseAuthEntry(const nlohmann::json& entry,
                                                const std::string& where);

// Adds every usable entry of an "auths" object to `creds`. `source` names the file.
// Errors: kInvalidArgument.
Status AddAuths(const nlohmann::json& auths, const std::string& source, Credentials& creds);

}  // namespace shoal::upstream::internal
