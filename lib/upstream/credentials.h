#pragma once
// Registry credentials, loaded from a docker config.json. Secrets are never logged.

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "lib/core/error.h"

namespace shoal::upstream {

// A username and password (or an access token used as a password).
struct BasicAuth {
  std::string username;
  std::string password;
};

// The "Basic base64(user:pass)" value of an Authorization header.
std::string BasicAuthHeader(const BasicAuth& auth);

// The credentials in an Authorization header value "Basic base64(user:pass)" (scheme matched
// case-insensitively), or nothing for any other scheme, bad base64, no ':' or an empty user name
// (podman sends "Basic Og==", an empty ":", when it has no entry for the host).
std::optional<BasicAuth> ParseBasicAuthorization(std::string_view header);

// Credentials per registry host. Copyable value; const methods are safe to call concurrently.
class Credentials {
 public:
  // Reads a docker config.json: {"auths": {"<registry>": {"auth": "base64(user:pass)"} or
  // {"username": "...", "password": "..."}}}. Keys may be hosts ("gcr.io", "127.0.0.1:5000") or
  // URLs ("https://index.docker.io/v1/"). Entries without usable credentials (credential
  // helpers, identity tokens) are skipped. Errors: kIo when the file cannot be read,
  // kInvalidArgument naming the file (and entry) when it is malformed; never quoting secrets.
  static Result<Credentials> LoadDockerConfig(const std::string& path);

  // The credentials for a registry as named in image references ("docker.io", "gcr.io",
  // "127.0.0.1:5000"), or nothing. Docker Hub's aliases (index.docker.io, registry-1.docker.io,
  // registry.hub.docker.com) all mean docker.io.
  std::optional<BasicAuth> For(std::string_view registry) const;

  // Sets the credentials of a registry (normalised as in For), replacing earlier ones.
  void Add(std::string registry, BasicAuth auth);

  // Number of registries with credentials.
  size_t size() const { return by_registry_.size(); }

  // Canonical registry key: scheme and path dropped, lowercased, Docker Hub aliases folded.
  static std::string NormalizeRegistry(std::string_view registry);

 private:
  std::map<std::string, BasicAuth> by_registry_;
};

}  // namespace shoal::upstream
