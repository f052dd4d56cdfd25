#pragma once
// The Link header of a paginated listing (tags/list, referrers) rewritten for the shim's client.

#include <optional>
#include <string>
#include <string_view>

namespace shoal::shim {

// Rewrites an upstream Link value (RFC 8288: `<uri-reference>; rel="next"`, possibly several
// comma-separated links) so that each link points at the shim: the upstream's scheme, host and
// path (which names the upstream repository) are replaced by client_path, the path the client
// asked for (e.g. "/v2/gcr.io/proj/img/tags/list"), and the upstream's query is kept; `ns`
// (containerd's ?ns=) is added back when the client sent it. Parameters after ";" are kept as
// they are. nullopt when the value has no usable link.
std::optional<std::string> RewriteLink(std::string_view upstream_link, std::string_view client_path,
                                       const std::optional<std::string>& ns);

}  // namespace shoal::shim
