#pragma once
// Pure request-target parsing for the shim: which endpoint, which repository on which registry.

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "lib/core/error.h"
#include "registry-shim/backend.h"

namespace shoal::shim {

// One parsed request target.
struct Route {
  enum class Kind {
    kBase,
    kManifest,
    kBlob,
    kTags,       // /v2/<name>/tags/list
    kReferrers,  // /v2/<name>/referrers/<digest>
    kMetrics,
    kHealth,
    kPush,
    kNotFound
  };
  Kind kind = Kind::kNotFound;
  std::string name;               // raw repository name from the path (may carry a registry)
  std::string reference;          // tag or digest (manifests), digest (blobs, referrers)
  std::optional<std::string> ns;  // containerd's ?ns=<registry>, percent-decoded
  std::string path;               // the target's path, without the query
  std::string query;              // the target's raw query (after "?"), still percent-encoded
};

// Parses an origin-form target such as "/v2/proj/img/blobs/sha256:..?ns=gcr.io". Never fails
// on unknown paths (kind kNotFound); errors only for malformed encodings (kInvalidArgument).
Result<Route> ParseRoute(std::string_view target);

// The methods a route's resource answers, for the Allow header of a 405 (RFC 9110 15.5.6):
// "GET, HEAD" for the pull API, "" for push endpoints (a pull-only mirror allows none there).
std::string_view AllowedMethods(Route::Kind kind);

// The parameters of a raw query that may be sent upstream, re-joined in their order and still
// percent-encoded: those named in `keys` (e.g. "n", "last" for tags/list); others (ns) dropped.
// Errors: kInvalidArgument for a kept value with characters that cannot be forwarded as they
// are (anything but unreserved characters, "%XX", "+", "/" and ":").
Result<std::string> ForwardedQuery(std::string_view query,
                                   std::initializer_list<std::string_view> keys);

// Decides the upstream registry and repository for a name: ?ns= wins, then a registry-host
// prefix in the name ("gcr.io/proj/img"), then default_registry; a prefix equal to ?ns= is
// dropped. These cover every mirror mode at once: dockerd registry-mirrors ("library/x" ->
// default), a name prefix (dockerd, skopeo, CRI-O/podman mirrors whose location carries
// "/gcr.io"), and containerd hosts.toml (?ns=). Docker Hub's one-component names get
// "library/". Errors: kInvalidArgument (-> NAME_INVALID) naming the bad part.
Result<RepoRef> ResolveRepo(std::string_view name, const std::optional<std::string>& ns,
                            std::string_view default_registry);

// The repository of a request inside a terminated CONNECT tunnel (HTTPS proxy mode): the
// registry is the tunnel's (ConnectTarget::Registry()) and the name is taken as it is, with
// Docker Hub's "library/" rule. Errors: kInvalidArgument (-> NAME_INVALID) for a bad name.
Result<RepoRef> ResolveConnectRepo(std::string_view name, std::string_view registry);

}  // namespace shoal::shim
