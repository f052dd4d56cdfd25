#pragma once
// The registry shim's HTTP server: the OCI Distribution pull API (GET/HEAD of /v2/, manifests
// and blobs, with Range), plus /metrics and /healthz, on Boost.Beast with one coroutine per
// connection. Blob bodies go out with sendfile(2) from the cache or from the in-flight file.
// With the HTTPS proxy mode on (EnableProxy) it also answers CONNECT: registries it terminates
// are served over TLS by the same request handling (bodies copied with pread, since sendfile
// cannot encrypt), other targets are tunnelled or refused (registry-shim/connect_proxy.h).

#include <utility>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "lib/core/error.h"
#include "registry-shim/backend.h"
#include "registry-shim/connect_proxy.h"
#include "registry-shim/metrics.h"

namespace shoal::shim {

struct ServerOptions {
  // Registry for names without a registry prefix and without ?ns= (dockerd's registry-mirrors
  // are for Docker Hub only).
  std::string default_registry = "docker.io";
  // A connection idle for this long between requests is closed.
  std::chrono::seconds idle_timeout{120};
  // A blob response that makes no progress for this long is aborted (client or fetch stalled).
  std::chrono::seconds stall_timeout{300};
  // Serve the admin API (/shoal/v1/...) to peers that are not on loopback too.
  bool admin_any_address = false;
  // Serve GET /metrics and /healthz only: 404 for the pull API and the admin API (a listener on
  // the node IP for Prometheus, beside a shim on loopback).
  bool metrics_only = false;
};

// The answer of the admin API: a status and a JSON body.
struct AdminReply {
  unsigned status = 200;
  std::string body;
  std::string allow;  // the Allow header of a 405: the methods the endpoint has
};
// Handles an admin request: (method, origin-form target with its query); both stay alive until
// the returned awaitable completes. Runs on the server's io_context.
using AdminHandler = std::function<boost::asio::awaitable<AdminReply>(const std::string& method,
                                                                      const std::string& target)>;

// Lives on one io_context; all methods must be called on that context's thread.
class Server {
 public:
  // backend and metrics must outlive the server.
  Server(boost::asio::io_context& ioc, Backend& backend, Metrics& metrics, ServerOptions options);

  // Binds address:port (port 0 picks a free one) and returns the bound port. Errors: kIo.
  Result<uint16_t> Listen(const std::string& address, uint16_t port);
  // Starts accepting connections.
  void Start();
  // Stops accepting; open connections finish their current request.
  void Stop();
  // Connections currently open.
  int active_connections() const { return active_; }
  // Provides the /metrics body (Prometheus text format).
  void SetMetricsHandler(std::function<std::string()> handler) {
    metrics_text_ = std::move(handler);
  }
  // Serves requests under /shoal/v1/ (any method) through handler; without one they get 404.
  // Only loopback peers are answered unless ServerOptions::admin_any_address (others get 403).
  void SetAdminHandler(AdminHandler handler) { admin_ = std::move(handler); }
  // Turns the HTTPS proxy mode on: CONNECT is answered as `proxy` says (without it CONNECT gets
  // 405), and GET /shoal/v1/proxy/ca.crt serves proxy.ca_cert_pem. Call before Start().
  void EnableProxy(ProxyOptions proxy) {
    proxy_ = std::make_unique<ProxyOptions>(std::move(proxy));
  }

 private:
  boost::asio::awaitable<void> AcceptLoop();
  boost::asio::awaitable<void> Session(boost::asio::ip::tcp::socket socket);

  boost::asio::io_context& ioc_;
  Backend& backend_;
  Metrics& metrics_;
  ServerOptions options_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::function<std::string()> metrics_text_;
  AdminHandler admin_;
  std::unique_ptr<ProxyOptions> proxy_;  // null: the proxy mode is off
  int active_ = 0;
};

}  // namespace shoal::shim
