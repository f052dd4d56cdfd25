#pragma once
// The tracker's HTTP server on Boost.Beast. A connection whose first read holds one whole
// request that closes the connection and needs no waiting (an agent's announce: libtorrent
// closes after each) is answered at once, without a coroutine: accept4, recv, send, close.
// Every other connection gets a coroutine, and long-polls suspend only that coroutine. What
// answers each request is tracker/router.h.

#include <utility>

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <string>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "lib/core/error.h"
#include "tracker/access.h"
#include "tracker/blobs/blob_api.h"
#include "tracker/manifests/manifest_api.h"
#include "tracker/prefetch/prefetch_api.h"
#include "tracker/router.h"
#include "tracker/swarms/service.h"

namespace shoal::tracker {

struct ServerOptions {
  // A connection idle this long between requests (or this slow to send one) is closed.
  std::chrono::seconds idle_timeout{30};
  // A response the client does not take within this long is dropped.
  std::chrono::seconds write_timeout{30};
  // Connections beyond this many get a 503 (Retry-After) as soon as they are accepted, and are
  // closed. Each agent holds a few long-polls: two per blob it pulls, one per manifest it waits
  // for, one prefetch poll.
  int max_connections = 32768;
};

// Lives on one io_context; all methods must be called on that context's (single) thread.
class Server {
 public:
  // service, blobs, manifests and prefetch must outlive the server.
  // access decides who may call what (tracker/access.h).
  Server(boost::asio::io_context& ioc, TrackerService& service, BlobApi& blobs,
         ManifestApi& manifests, PrefetchApi& prefetch, Access& access, ServerOptions options);

  // Binds address:port (port 0 picks a free one) and returns the bound port. Errors:
  // kInvalidArgument for a bad address, kIo when binding fails.
  Result<uint16_t> Listen(const std::string& address, uint16_t port);
  // Closes what Listen bound, before Start (to bind another port).
  void Unlisten();
  // Starts accepting connections.
  void Start();
  // Stops accepting; connections waiting for a request's header close at once, busy ones after
  // their current request.
  void Stop();
  // Connections currently open.
  int active_connections() const { return active_; }
  // Provides the /metrics body (Prometheus text format); called after the gauges are refreshed.
  void SetMetricsHandler(std::function<std::string()> handler) {
    router_.SetMetricsHandler(std::move(handler));
  }
  // Provides the GET /v1/cluster body (JSON, tracker/cluster/cluster_view.h).
  void SetClusterViewHandler(std::function<std::string()> handler) {
    router_.SetClusterViewHandler(std::move(handler));
  }

 private:
  boost::asio::awaitable<void> AcceptLoop();
  // Takes over a connection just accepted (fd, non-blocking): sheds it, answers it at once, or
  // starts its Session.
  void Accepted(int fd, const boost::asio::ip::tcp::endpoint& remote);
  // Serves a connection; `received` holds the bytes already read from it.
  boost::asio::awaitable<void> Session(boost::asio::ip::tcp::socket socket,
                                       boost::asio::ip::tcp::endpoint remote,
                                       std::string received);
  // Sends what a send(2) at once left of an answer, then closes the connection.
  boost::asio::awaitable<void> FinishSend(boost::asio::ip::tcp::socket socket, std::string rest);
  // Answers a connection over the limit with 503 and closes it (bounded: shedding_).
  boost::asio::awaitable<void> Shed(boost::asio::ip::tcp::socket socket);

  boost::asio::io_context& ioc_;
  TrackerService& service_;
  Router router_;
  ServerOptions options_;
  boost::asio::ip::tcp::acceptor acceptor_;
  int active_ = 0;
  std::chrono::steady_clock::time_point accept_logged_{};  // last warning about accept(2)
  std::list<std::function<void()>> stops_;   // one per open connection: Connection::Stop
  int shedding_ = 0;                          // Shed coroutines running
  std::chrono::steady_clock::time_point shed_logged_{};  // last warning about shedding
  uint64_t shed_unlogged_ = 0;                // shed since that warning
};

}  // namespace shoal::tracker
