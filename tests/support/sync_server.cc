#include "tests/support/sync_server.h"

#include <sys/socket.h>

#include <spdlog/spdlog.h>
#include <boost/asio/io_context.hpp>
#include <boost/beast/core.hpp>

namespace shoal::testkit {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

}  // namespace

Result<std::unique_ptr<SyncHttpServer>> SyncHttpServer::StartRaw(ConnectionHandler handler,
                                                                 uint16_t port) {
  std::unique_ptr<SyncHttpServer> s(new SyncHttpServer());
  s->handler_ = std::move(handler);
  s->io_ = std::make_unique<net::io_context>();
  beast::error_code ec;
  s->acceptor_ = std::make_unique<tcp::acceptor>(*s->io_);
  tcp::endpoint ep(net::ip::make_address_v4("127.0.0.1"), port);
  s->acceptor_->open(ep.protocol(), ec);
  if (!ec) s->acceptor_->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s->acceptor_->bind(ep, ec);
  if (!ec) s->acceptor_->listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return MakeError(ErrorCode::kUnavailable,
                     "listen on 127.0.0.1:" + std::to_string(port) + ": " + ec.message());
  }
  s->port_ = s->acceptor_->local_endpoint().port();
  s->accept_thread_ = std::thread([srv = s.get()] { srv->AcceptLoop(); });
  return s;
}

Result<std::unique_ptr<SyncHttpServer>> SyncHttpServer::Start(RequestHandler handler,
                                                              uint16_t port) {
  return StartRaw(
      [handler = std::move(handler)](tcp::socket& socket) {
        beast::flat_buffer buffer;
        for (;;) {
          beast::error_code ec;
          http::request_parser<http::string_body> parser;
          parser.body_limit(64 << 20);
          http::read(socket, buffer, parser, ec);
          if (ec) return;
          Request req = parser.release();
          Response res;
          try {
            res = handler(req);
          } catch (const std::exception& e) {
            res = Response(http::status::internal_server_error, req.version());
            res.body() = std::string("handler threw: ") + e.what();
          }
          res.version(req.version());
          res.keep_alive(req.keep_alive());
          if (req.method() != http::verb::head) res.prepare_payload();
          http::write(socket, res, ec);
          if (ec || !req.keep_alive()) return;
        }
      },
      port);
}

SyncHttpServer::~SyncHttpServer() { Stop(); }

void SyncHttpServer::AcceptLoop() {
  while (!stopping_) {
    tcp::socket socket(*io_);
    beast::error_code ec;
    acceptor_->accept(socket, ec);
    if (stopping_) break;
    if (ec) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    ReapFinished();
    auto conn = std::make_unique<Conn>();
    Conn* c = conn.get();
    c->fd = socket.native_handle();
    std::lock_guard<std::mutex> lock(mu_);
    c->thread = std::thread([this, c, s = std::move(socket)]() mutable {
      try {
        handler_(s);
      } catch (const std::exception& e) {
        spdlog::warn("testkit: connection handler on port {} threw: {}", port_, e.what());
      }
      {
        // Close under the lock so Stop() never shuts down a reused descriptor.
        std::lock_guard<std::mutex> l(mu_);
        c->fd = -1;
        beast::error_code ignored;
        s.close(ignored);
      }
      c->done = true;
    });
    conns_.push_back(std::move(conn));
  }
}

void SyncHttpServer::ReapFinished() {
  std::list<std::unique_ptr<Conn>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if ((*it)->done) {
        finished.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished) c->thread.join();
}

void SyncHttpServer::Stop() {
  if (stopping_.exchange(true)) return;
  // shutdown() on a listening socket wakes a blocked accept() on Linux.
  ::shutdown(acceptor_->native_handle(), SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<std::unique_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : conns_) {
      if (c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
    }
    conns.swap(conns_);
  }
  for (auto& c : conns) c->thread.join();
  beast::error_code ignored;
  acceptor_->close(ignored);
}

}  // namespace shoal::testkit
