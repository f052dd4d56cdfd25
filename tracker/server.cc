#include "tracker/server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string_view>

#include <spdlog/spdlog.h>
#include <boost/algorithm/string/predicate.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace shoal::tracker {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::awaitable;
using asio::use_awaitable;
using tcp = asio::ip::tcp;

namespace {

// The first read of a new connection: an announce with its headers fits many times over.
constexpr size_t kFirstRead = 16 * 1024;
// Connections taken from the listener per wake-up, before other work gets a turn.
constexpr int kAcceptBatch = 64;

// A connection being served by a coroutine. Responses are built in named variables before
// being passed to co_await: GCC 12 can destroy temporaries of a co_await expression twice
// (seen as double frees in the registry shim), so no co_await here takes a non-trivial
// temporary.
class Connection {
 public:
  Connection(tcp::socket socket, const tcp::endpoint& remote, Router& router,
             TrackerService& service, const ServerOptions& options)
      : stream_(std::move(socket)),
        router_(router),
        service_(service),
        options_(options),
        remote_(remote) {}

  // Shutdown: a connection waiting for (the rest of) its next request's header is closed now;
  // one serving a request closes after answering it.
  void Stop() {
    stopping_ = true;
    if (reading_header_) stream_.close();
  }

  // Serves requests until the client or the server closes; `received` is what was already read.
  awaitable<void> Run(std::string received) {
    beast::flat_buffer buffer;
    if (!received.empty()) {
      auto space = buffer.prepare(received.size());
      std::memcpy(space.data(), received.data(), received.size());
      buffer.commit(received.size());
    }
    for (;;) {
      if (stopping_) break;
      HttpRequestParser parser;
      LimitRequest(parser);
      beast::error_code ec;
      stream_.expires_after(options_.idle_timeout);
      reading_header_ = true;
      co_await http::async_read_header(stream_, buffer, parser,
                                       asio::redirect_error(use_awaitable, ec));
      reading_header_ = false;
      if (stopping_ && (ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor))
        co_return;
      if (!ec && boost::iequals(parser.get()[http::field::expect], "100-continue")) {
        http::response<http::empty_body> go_on{http::status::continue_, parser.get().version()};
        co_await http::async_write(stream_, go_on, asio::redirect_error(use_awaitable, ec));
      }
      if (!ec) {
        co_await http::async_read(stream_, buffer, parser, asio::redirect_error(use_awaitable, ec));
      }
      if (ec == http::error::end_of_stream || ec == asio::error::eof ||
          ec == beast::error::timeout || ec == asio::error::connection_reset) {
        break;
      }
      if (ec == http::error::body_limit) {
        HttpResponse res = router_.TooLarge(parser.get(), kRequestBodyLimit);
        co_await Write(std::move(res));
        break;
      }
      if (ec) {
        std::string body = "malformed HTTP request: " + ec.message() + "\n";
        HttpResponse res =
            MakeHttpResponse(11, false, http::status::bad_request, std::move(body), "text/plain");
        service_.metrics().CountRequest("other", res.result_int());
        co_await Write(std::move(res));
        break;
      }
      HttpRequest req = parser.release();
      stream_.expires_never();
      HttpResponse res = co_await router_.Answer(req, remote_.address());
      if (stopping_) res.keep_alive(false);
      bool keep = req.keep_alive() && res.keep_alive();
      bool written = co_await Write(std::move(res));
      if (!written || !keep) break;
    }
    // No shutdown(SHUT_WR) first: the close that follows sends the same FIN, and a syscall is a
    // tenth of a connection-close announce's cost (docs/benchmarks.md, shoal-bench-tracker).
  }

 private:
  bool reading_header_ = false;  // waiting for a request's header
  bool stopping_ = false;        // the server is shutting down

  awaitable<bool> Write(HttpResponse res) {
    beast::error_code ec;
    stream_.expires_after(options_.write_timeout);
    co_await http::async_write(stream_, res, asio::redirect_error(use_awaitable, ec));
    stream_.expires_never();
    co_return !ec;
  }

  beast::tcp_stream stream_;
  Router& router_;
  TrackerService& service_;
  const ServerOptions& options_;
  tcp::endpoint remote_;
};

}  // namespace

Server::Server(asio::io_context& ioc, TrackerService& service, BlobApi& blobs,
               ManifestApi& manifests, PrefetchApi& prefetch, Access& access, ServerOptions options)
    : ioc_(ioc),
      service_(service),
      router_(service, blobs, manifests, prefetch, access),
      options_(std::move(options)),
      acceptor_(ioc) {}

void Server::Unlisten() {
  beast::error_code ec;
  acceptor_.close(ec);
}

Result<uint16_t> Server::Listen(const std::string& address, uint16_t port) {
  beast::error_code ec;
  auto addr = asio::ip::make_address(address, ec);
  if (ec) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "listen address \"" + address + "\": " + ec.message());
  }
  tcp::endpoint ep(addr, port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  // Accepted sockets inherit TCP_NODELAY from the listener on Linux: one setsockopt(2) per
  // connection less.
  if (!ec) acceptor_.set_option(tcp::no_delay(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  // The accept loop calls accept4(2) itself until it would block.
  if (!ec) acceptor_.non_blocking(true, ec);
  // A connection is accepted once its first bytes have arrived (or after about a second
  // without any), so that recv(2) right after accept4(2) finds the request.
  if (!ec) {
    int secs = 1;
    if (::setsockopt(acceptor_.native_handle(), IPPROTO_TCP, TCP_DEFER_ACCEPT, &secs,
                     sizeof(secs)) != 0) {
      ec.assign(errno, boost::system::system_category());
    }
  }
  if (ec) {
    return MakeError(ErrorCode::kIo,
                     "listen on " + address + ":" + std::to_string(port) + ": " + ec.message());
  }
  return acceptor_.local_endpoint().port();
}

void Server::Start() { asio::co_spawn(ioc_, AcceptLoop(), asio::detached); }

void Server::Stop() {
  beast::error_code ec;
  acceptor_.close(ec);
  // Copied: a connection that stops now leaves the list.
  auto stops = stops_;
  for (auto& stop : stops) stop();
}

awaitable<void> Server::AcceptLoop() {
  asio::steady_timer pause(ioc_);
  for (;;) {
    beast::error_code ec;
    co_await acceptor_.async_wait(tcp::acceptor::wait_read,
                                  asio::redirect_error(use_awaitable, ec));
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
    bool out_of_resources = false;
    for (int i = 0; i < kAcceptBatch && acceptor_.is_open(); ++i) {
      // accept4(2) itself: the peer's address comes with it (no getpeername(2)), and the
      // connection is non-blocking from the start (no fcntl(2)).
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      int fd = ::accept4(acceptor_.native_handle(), reinterpret_cast<sockaddr*>(&addr), &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK) break;
        // The client gave up before it was accepted, or a signal came: the next one.
        if (err == ECONNABORTED || err == EINTR || err == EPROTO) continue;
        // Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM): the pending
        // connection stays pending, so retrying at once would spin. Wait for some to close.
        const auto now = std::chrono::steady_clock::now();
        if (now - accept_logged_ >= std::chrono::seconds(10)) {
          spdlog::warn("accept failed: {} (pausing accepts for 100 ms; {} connections open)",
                       std::strerror(err), active_);
          accept_logged_ = now;
        }
        out_of_resources = true;
        break;
      }
      tcp::endpoint remote;
      if (len <= remote.capacity()) {
        std::memcpy(remote.data(), &addr, len);
        remote.resize(len);
      }
      Accepted(fd, remote);
    }
    if (out_of_resources) {
      pause.expires_after(std::chrono::milliseconds(100));
      co_await pause.async_wait(asio::redirect_error(use_awaitable, ec));
    }
  }
}

void Server::Accepted(int fd, const tcp::endpoint& remote) {
  auto adopt = [&](tcp::socket& socket) {
    beast::error_code ec;
    socket.assign(remote.protocol(), fd, ec);
    if (ec) {
      spdlog::warn("connection from {} dropped: {}", remote.address().to_string(), ec.message());
      ::close(fd);
      return false;
    }
    return true;
  };
  if (active_ >= options_.max_connections) {
    // Shedding is cheaper than queueing: a 503 tells the client to come back (an agent keeps
    // waiting for the tracker instead of going upstream), and the operator sees it.
    service_.metrics().shed.Increment();
    ++shed_unlogged_;
    const auto now = std::chrono::steady_clock::now();
    if (now - shed_logged_ >= std::chrono::seconds(10)) {
      spdlog::warn("{} connections refused with 503: --max-connections {} are open",
                   shed_unlogged_, options_.max_connections);
      shed_logged_ = now;
      shed_unlogged_ = 0;
    }
    if (shedding_ >= 1024) {
      ::close(fd);
      return;
    }
    tcp::socket socket(ioc_);
    if (adopt(socket)) asio::co_spawn(ioc_, Shed(std::move(socket)), asio::detached);
    return;
  }
  // Answer at once what can be: the request is all here (a client sends it right after
  // connecting), it is the only one, it closes the connection, and its route needs no waiting.
  thread_local std::array<char, kFirstRead> first;
  ssize_t n = ::recv(fd, first.data(), first.size(), 0);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    ::close(fd);  // closed or reset before it asked anything
    return;
  }
  std::string received;
  if (n > 0) {
    std::string_view got(first.data(), static_cast<size_t>(n));
    if (std::optional<std::string> out = router_.AnswerFirstRead(got, remote.address())) {
      ssize_t sent = ::send(fd, out->data(), out->size(), MSG_NOSIGNAL);
      if (sent == static_cast<ssize_t>(out->size()) ||
          (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        ::close(fd);
        return;
      }
      // The socket buffer took only part of it (a large page on a slow link).
      tcp::socket socket(ioc_);
      if (adopt(socket)) {
        out->erase(0, sent < 0 ? 0 : static_cast<size_t>(sent));
        asio::co_spawn(ioc_, FinishSend(std::move(socket), std::move(*out)), asio::detached);
      }
      return;
    }
    // Anything else, malformed requests included, is the session's to read and answer.
    received.assign(got);
  }
  tcp::socket socket(ioc_);
  if (adopt(socket)) {
    asio::co_spawn(ioc_, Session(std::move(socket), remote, std::move(received)), asio::detached);
  }
}

awaitable<void> Server::FinishSend(tcp::socket socket, std::string rest) {
  ++active_;
  beast::tcp_stream stream(std::move(socket));
  stream.expires_after(options_.write_timeout);
  beast::error_code ec;
  co_await asio::async_write(stream, asio::buffer(rest), asio::redirect_error(use_awaitable, ec));
  stream.socket().close(ec);
  --active_;
}

awaitable<void> Server::Shed(tcp::socket socket) {
  static constexpr std::string_view kBusy =
      "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
      "Connection: close\r\nContent-Length: 61\r\n\r\n"
      "{\"error\": \"the tracker is at --max-connections; retry later\"}";
  static_assert(kBusy.size() - kBusy.find("\r\n\r\n") - 4 == 61);
  ++shedding_;
  beast::tcp_stream stream(std::move(socket));
  stream.expires_after(std::chrono::seconds(1));
  beast::error_code ec;
  co_await asio::async_write(stream, asio::buffer(kBusy.data(), kBusy.size()),
                             asio::redirect_error(use_awaitable, ec));
  if (!ec) {
    // Read what the client sent before closing: closing with unread bytes sends a reset, which
    // can destroy the 503 before the client reads it.
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
    std::array<char, 4096> sink;
    for (int i = 0; i < 16 && !ec; ++i) {
      co_await stream.async_read_some(asio::buffer(sink), asio::redirect_error(use_awaitable, ec));
    }
  }
  stream.socket().close(ec);
  --shedding_;
}

awaitable<void> Server::Session(tcp::socket socket, tcp::endpoint remote, std::string received) {
  ++active_;
  service_.metrics().connections.Set(active_);
  Connection conn(std::move(socket), remote, router_, service_, options_);
  auto registered = stops_.insert(stops_.end(), [&conn] { conn.Stop(); });
  try {
    co_await conn.Run(std::move(received));
  } catch (const std::exception& e) {
    spdlog::error("connection failed: {}", e.what());
  }
  stops_.erase(registered);
  --active_;
  service_.metrics().connections.Set(active_);
}

}  // namespace shoal::tracker
