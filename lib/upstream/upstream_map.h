#pragma once
// The upstream map: for each registry named in image references ("docker.io", "gcr.io"), the
// endpoint the agent really talks to, and what to do with registries that have no entry.

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/error.h"
#include "lib/http/url.h"
#include "lib/upstream/credentials.h"
#include "lib/upstream/registry_client.h"

namespace shoal::upstream {

// Registry host -> endpoint. A value type; const methods are safe to call concurrently.
// Starts with docker.io -> https://registry-1.docker.io (Docker Hub's API host) and the
// "error" policy for unmapped registries.
//
// Map file (JSON; every key optional):
//   {"upstreams": {"gcr.io": "https://gcr.io",
//                  "ghcr.io": {"url": "https://ghcr.io", "auth": "base64(user:pass)"},
//                  "quay.io": {"url": "https://quay.io", "username": "u", "password": "p"},
//                  "corp.io": {"url": "https://corp.io", "pull_auth": "node"}},
//    "auths": {<docker config.json "auths", e.g. a mounted Kubernetes pull secret>},
//    "unmapped": "https" | "error" | "https://fallback.example",
//    "pull_auth": "client" | "node" | "deny"}
class UpstreamMap {
 public:
  // Who may be served a registry's private repositories (docs/runtimes.md, "Private images").
  enum class PullAuth {
    kClient,  // clients whose own credentials the upstream accepts for the repository
    kNode,    // every client of the node: the node's credentials decide (single tenant)
    kDeny,    // nobody: private repositories are refused, clients go to the upstream themselves
  };

  // How a registry without an entry is reached.
  enum class Unmapped {
    kHttps,     // https://<registry>, at global addresses only (http::AddressPolicy::kGlobalOnly)
    kError,     // refused: kRefused naming the registry and the mapped ones
    kEndpoint,  // one configured endpoint serves every unmapped registry
  };

  UpstreamMap();

  // Maps registry (a host[:port] as in image references; Docker Hub's aliases fold into
  // docker.io, case is ignored) to url (http or https, no path). Replaces an earlier entry.
  // Errors: kInvalidArgument naming the registry or the URL.
  Status Add(std::string_view registry, std::string_view url);
  // Adds "REGISTRY=URL" entries (from --upstream / --upstream-map). Errors: as Add, naming the
  // spec.
  Status AddSpecs(const std::vector<std::string>& specs);
  // Reads a map file (format above). Its entries replace earlier ones; its credentials are
  // added to `credentials` (replacing earlier ones for the same registry). Errors: kIo when
  // unreadable, kInvalidArgument naming the file and the bad part (never a secret).
  Status LoadFile(const std::string& path, Credentials& credentials);
  // Sets the unmapped policy from "https", "error" or an http(s) URL. Errors: kInvalidArgument.
  Status SetUnmapped(std::string_view policy);
  // Sets the pull_auth mode: "MODE" for every registry without a mode of its own, or
  // "REGISTRY=MODE" for one (from --pull-auth). Errors: kInvalidArgument naming the spec.
  Status SetPullAuth(std::string_view spec);
  // The pull_auth mode of a registry: its own, else the default (kNode unless set).
  PullAuth PullAuthFor(std::string_view registry) const;
  // "client", "node", "deny" and back. Errors: kInvalidArgument naming the accepted values.
  static Result<PullAuth> ParsePullAuth(std::string_view mode);
  static std::string_view PullAuthName(PullAuth mode);

  // The endpoint for a registry, by entry (any address) or by the unmapped policy. Errors:
  // kRefused for an unmapped registry under "error", or under "https" when it is an IP literal
  // that is not global; the message names it and the mapped ones (for the log, not clients).
  Result<RegistryEndpoint> Resolve(std::string_view registry) const;
  // Whether the registry has an entry of its own.
  bool Contains(std::string_view registry) const;
  // The mapped registries, sorted.
  std::vector<std::string> Registries() const;
  Unmapped unmapped() const { return unmapped_; }
  // One line per entry plus the policy, for the startup log.
  std::string Describe() const;

  // Canonical key of a registry: lowercased; index.docker.io, registry-1.docker.io and
  // registry.hub.docker.com become docker.io.
  static std::string Key(std::string_view registry);

 private:
  std::map<std::string, http::Url> entries_;
  std::map<std::string, PullAuth> pull_auth_;  // registries with a mode of their own
  PullAuth default_pull_auth_ = PullAuth::kNode;
  Unmapped unmapped_ = Unmapped::kError;
  http::Url unmapped_endpoint_;
};

}  // namespace shoal::upstream
