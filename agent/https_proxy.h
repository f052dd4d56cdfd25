#pragma once
// The agent's side of the HTTPS proxy mode (--https-proxy): the node CA and the rules the shim
// follows for CONNECT (which registries it terminates, whether other targets are tunnelled).

#include <memory>

#include "agent/config.h"
#include "lib/core/error.h"
#include "lib/tls/node_ca.h"
#include "lib/upstream/upstream_map.h"
#include "registry-shim/connect_proxy.h"

namespace shoal::agent {

// The node CA and the shim's proxy options, whose callbacks use the CA: keep this alive while
// the server runs. Used on the network thread.
struct HttpsProxy {
  std::unique_ptr<tls::NodeCa> ca;
  shim::ProxyOptions options;
};

// Loads the CA from --proxy-ca-cert/--proxy-ca-key, or loads or creates it under
// <cache>/proxy-ca, and builds the options: a CONNECT is terminated when its registry has an
// entry of its own in `upstreams`, except docker.io (dockerd reads no certs.d for Docker Hub and
// reaches it through registry-mirrors anyway); others follow --proxy-tunnel. Errors: as
// tls::NodeCa, and kInvalidArgument when only one of the two flags is given.
Result<std::unique_ptr<HttpsProxy>> MakeHttpsProxy(const AgentConfig& config,
                                                   upstream::UpstreamMap upstreams);

}  // namespace shoal::agent
