#include "agent/https_proxy.h"

#include <spdlog/spdlog.h>

namespace shoal::agent {

Result<std::unique_ptr<HttpsProxy>> MakeHttpsProxy(const AgentConfig& config,
                                                   upstream::UpstreamMap upstreams) {
  auto proxy = std::make_unique<HttpsProxy>();
  if (config.proxy_ca_cert.empty() != config.proxy_ca_key.empty()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "--proxy-ca-cert and --proxy-ca-key go together (or give neither to use "
                     "<cache>/proxy-ca)");
  }
  auto ca = config.proxy_ca_cert.empty()
                ? tls::NodeCa::LoadOrCreate(config.cache_dir + "/proxy-ca")
                : tls::NodeCa::Load(config.proxy_ca_cert, config.proxy_ca_key);
  if (!ca) return ca.error();
  proxy->ca = std::move(ca.value());
  tls::NodeCa* node_ca = proxy->ca.get();
  proxy->options.ca_cert_pem = node_ca->cert_pem();
  proxy->options.allow_tunnel = config.proxy_tunnel == "allow";
  proxy->options.terminates = [upstreams = std::move(upstreams)](const std::string& registry) {
    return registry != "docker.io" && upstreams.Contains(registry);
  };
  proxy->options.tls_context = [node_ca](const std::string& host) {
    return node_ca->ServerContext(host);
  };
  return proxy;
}

}  // namespace shoal::agent
