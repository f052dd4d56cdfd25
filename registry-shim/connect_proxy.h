#pragma once
// The shim's HTTPS proxy mode (CONNECT on the shim's port): parsing CONNECT targets, what the
// agent decides per target, and the byte tunnel for targets that are not terminated.

#include <utility>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>

#include "lib/core/error.h"

namespace shoal::shim {

// What the server does with CONNECT requests when the proxy mode is on (Server::EnableProxy).
struct ProxyOptions {
  // Whether a CONNECT to this registry (ConnectTarget::Registry()) is terminated with a node-CA
  // certificate and served by the shim as that registry. Called on the network thread.
  std::function<bool(const std::string& registry)> terminates;
  // The TLS server context for a terminated host (DNS name or IP literal). Errors are answered
  // 502 to the CONNECT. Called on the network thread.
  std::function<Result<std::shared_ptr<boost::asio::ssl::context>>(const std::string& host)>
      tls_context;
  // The CA certificate (PEM) served at GET /shoal/v1/proxy/ca.crt. Never a key.
  std::string ca_cert_pem;
  // Other CONNECTs: tunnelled byte for byte (for clients on this node: loopback, or from the
  // address they connected to), or refused with 403.
  bool allow_tunnel = true;
  // A tunnel with no byte in either direction for this long is closed.
  std::chrono::seconds tunnel_idle_timeout{300};
  // Connecting to a tunnel's target, and a terminated CONNECT's TLS handshake, time out after.
  std::chrono::seconds connect_timeout{10};
};

// The authority-form target of a CONNECT ("gcr.io:443", "[::1]:5000").
struct ConnectTarget {
  std::string host;  // DNS name or IP literal, without brackets
  uint16_t port = 0;
  // The registry name this target stands for, as in image references: the host alone for port
  // 443, else host:port (IPv6 in brackets); normalised (registry-1.docker.io -> docker.io).
  std::string Registry() const;
};

// Parses a CONNECT request target. Errors: kInvalidArgument with a message naming the problem
// (no port, a bad port, a host that is not a DNS name or IP literal).
Result<ConnectTarget> ParseConnectTarget(std::string_view target);

// Resolves and connects to target within timeout. Errors: kUnavailable naming the target and
// the cause (resolution failure, refused, timed out).
boost::asio::awaitable<Result<boost::asio::ip::tcp::socket>> DialTarget(
    boost::asio::any_io_executor executor, const ConnectTarget& target,
    std::chrono::seconds timeout);

// Copies bytes both ways between client and server until both directions ended (an EOF is
// passed on as a half-close), either side fails, or nothing moved for idle_timeout; then closes
// both. early_bytes (read from the client past the CONNECT request) go to server first. Returns
// the bytes copied client -> server and server -> client.
boost::asio::awaitable<std::pair<uint64_t, uint64_t>> Splice(boost::asio::ip::tcp::socket client,
                                                             boost::asio::ip::tcp::socket server,
                                                             std::string early_bytes,
                                                             std::chrono::seconds idle_timeout);

}  // namespace shoal::shim
