#pragma once
// A small blocking HTTP/1.1 server on 127.0.0.1 for test fixtures (token server, counting proxy,
// fake upstreams): one thread per connection, synchronous Beast I/O.

#include <utility>  // before Asio (GCC 12 + Boost 1.74)

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http.hpp>

#include "lib/core/error.h"

namespace shoal::testkit {

// Listens on 127.0.0.1 and hands each accepted connection to a handler on a thread of its own.
// Stop() (or the destructor) closes the listener, shuts down every open connection (so blocked
// reads return errors) and joins all threads. Thread-safe.
class SyncHttpServer {
 public:
  using Request = boost::beast::http::request<boost::beast::http::string_body>;
  using Response = boost::beast::http::response<boost::beast::http::string_body>;
  // Owns the connection for its lifetime; returns when done with it (the server then closes it).
  using ConnectionHandler = std::function<void(boost::asio::ip::tcp::socket& socket)>;
  // Maps a request to a response; called concurrently from connection threads. The server fills
  // in version, keep-alive and Content-Length.
  using RequestHandler = std::function<Response(const Request& request)>;

  // Raw mode: the handler does its own HTTP. port 0 picks a free port. Errors: kUnavailable.
  static Result<std::unique_ptr<SyncHttpServer>> StartRaw(ConnectionHandler handler,
                                                          uint16_t port = 0);
  // Request/response mode with keep-alive (bodies up to 64 MiB).
  static Result<std::unique_ptr<SyncHttpServer>> Start(RequestHandler handler, uint16_t port = 0);
  ~SyncHttpServer();
  SyncHttpServer(const SyncHttpServer&) = delete;
  SyncHttpServer& operator=(const SyncHttpServer&) = delete;

  // The port it listens on.
  uint16_t port() const { return port_; }
  // "127.0.0.1:PORT".
  std::string HostPort() const { return "127.0.0.1:" + std::to_string(port_); }
  // Closes everything and joins all threads. Idempotent; must not be called from a handler.
  void Stop();

 private:
  struct Conn {
    std::thread thread;
    int fd = -1;                    // GUARDED_BY(mu_); -1 once closed
    std::atomic<bool> done{false};  // the handler returned
  };
  SyncHttpServer() = default;
  void AcceptLoop();
  void ReapFinished();

  ConnectionHandler handler_;
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<boost::asio::ip::tcp::acceptor> acceptor_;
  uint16_t port_ = 0;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_;  // GUARDED_BY(mu_)
};

}  // namespace shoal::testkit
