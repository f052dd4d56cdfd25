#include "agent/swarm_setup.h"

#include <utility>

#include <fmt/chrono.h>
#include <spdlog/spdlog.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>

#include "lib/tls/peer_tls.h"

namespace shoal::agent {
namespace asio = boost::asio;

Result<std::string> ResolveSwarmListen(const std::string& listen, const http::Url& tracker) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon + 1 == listen.size()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "--swarm-listen \"" + listen + "\" must be IP:PORT or auto:PORT");
  }
  if (listen.substr(0, colon) != "auto") return listen;
  const std::string port = listen.substr(colon + 1);
  asio::io_context ioc;
  boost::system::error_code ec;
  asio::ip::udp::resolver resolver(ioc);
  auto results = resolver.resolve(tracker.host, std::to_string(tracker.port), ec);
  if (ec || results.empty()) {
    return MakeError(ErrorCode::kUnavailable,
                     "--swarm-listen auto: cannot resolve the tracker host " + tracker.host + ": " +
                         (ec ? ec.message() : "no address"));
  }
  std::string last_error;
  for (const auto& entry : results) {
    asio::ip::udp::socket probe(ioc);
    probe.open(entry.endpoint().protocol(), ec);
    if (!ec) probe.connect(entry.endpoint(), ec);
    if (ec) {
      last_error = ec.message();
      continue;
    }
    asio::ip::address local = probe.local_endpoint(ec).address();
    if (ec) {
      last_error = ec.message();
      continue;
    }
    std::string ip = local.is_v6() ? "[" + local.to_string() + "]" : local.to_string();
    spdlog::info("swarm: listening on {} (the address this node reaches tracker {} from)", ip,
                 tracker.HostPort());
    return ip + ":" + port;
  }
  return MakeError(ErrorCode::kUnavailable, "--swarm-listen auto: no route to the tracker " +
                                                tracker.HostPort() + ": " + last_error);
}

Result<swarm::SwarmOptions> MakeSwarmOptions(const AgentConfig& config, const http::Url& tracker,
                                             const std::string& agent_id) {
  swarm::SwarmOptions options;
  auto listen = ResolveSwarmListen(config.swarm_listen, tracker);
  if (!listen) return listen.error();
  options.listen_interface = std::move(listen.value());
  options.allow_multiple_connections_per_ip = true;
  options.unchoke_slots = config.unchoke_slots;
  options.peers_per_chunk = config.peers_per_chunk;
  options.disk_write_delay = std::chrono::microseconds(config.disk_write_delay_us);
  if (config.tracker_announce == "batch") {
    // Every announce is an HTTP request to the agent's relay, held until its batch is answered:
    // libtorrent's default of 50 at once would cap a batch at 50. Overridable below.
    options.libtorrent_settings.push_back("max_concurrent_http_announces=4096");
  }
  options.libtorrent_settings.insert(options.libtorrent_settings.end(),
                                     config.libtorrent_settings.begin(),
                                     config.libtorrent_settings.end());
  if (config.peer_ca_cert.empty() != config.peer_ca_key.empty()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "--peer-ca-cert and --peer-ca-key go together (the cluster's peer CA)");
  }
  if (config.peer_ca_cert.empty()) {
    if (!config.insecure_peers) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "the swarm needs the cluster's peer CA (--peer-ca-cert and --peer-ca-key, "
                       "as the chart mounts them); --insecure-peers runs it with plain, "
                       "unauthenticated peers");
    }
    spdlog::warn(
        "swarm: --insecure-peers: plain TCP peers; anyone who reaches port {} can download "
        "the chunks of this node's blobs",
        options.listen_interface);
    return options;
  }
  auto peer_tls = tls::MintPeerTls(config.peer_ca_cert, config.peer_ca_key, agent_id);
  if (!peer_tls) return peer_tls.error();
  spdlog::info("swarm: peers use TLS; this agent's peer certificate (CN {}) is valid until {:%F}",
               agent_id, fmt::gmtime(std::chrono::system_clock::to_time_t(peer_tls.value().not_after)));
  options.tls = std::move(peer_tls.value());
  return options;
}

}  // namespace shoal::agent
