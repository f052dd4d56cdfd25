#include "tracker/server.h"

#include <array>
#include <string_view>

#include <spdlog/spdlog.h>
#include <boost/algorithm/string/predicate.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "tracker/access.h"
#include "tracker/cluster/cluster_view.h"
#include "tracker/cluster/page.h"
#include "tracker/swarms/response.h"

namespace shoal::tracker {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::awaitable;
using asio::use_awaitable;
using tcp = asio::ip::tcp;

namespace {

// Announce queries are ~300 bytes; nothing legitimate needs large headers.
constexpr uint32_t kHeaderLimit = 8 * 1024;
// Blob API bodies are small JSON; a publish carries one chunk's metainfo (about 20 bytes per
// piece, base64-encoded).
constexpr uint64_t kBodyLimit = 8u << 20;
constexpr char kServerName[] = "shoal-tracker";

using Request = http::request<http::string_body>;
using StringResponse = http::response<http::string_body>;

enum class Route { kAnnounce, kScrape, kMetrics, kHealth, kStatus, kCluster, kUi, kNotFound };

std::string_view RouteName(Route route) {
  switch (route) {
    case Route::kAnnounce:
      return "announce";
    case Route::kScrape:
      return "scrape";
    case Route::kMetrics:
      return "metrics";
    case Route::kHealth:
      return "health";
    case Route::kStatus:
      return "status";
    case Route::kCluster:
      return "cluster";
    case Route::kUi:
      return "ui";
    case Route::kNotFound:
      return "other";
  }
  return "other";
}

Route RouteOf(std::string_view path) {
  if (path == "/announce") return Route::kAnnounce;
  if (path == "/scrape") return Route::kScrape;
  if (path == "/metrics") return Route::kMetrics;
  if (path == "/healthz") return Route::kHealth;
  if (path == "/") return Route::kStatus;
  if (path == kClusterPath) return Route::kCluster;
  if (path == "/ui") return Route::kUi;
  return Route::kNotFound;
}

StringResponse MakeResponse(unsigned version, bool keep_alive, http::status status,
                            std::string body, std::string_view content_type) {
  StringResponse res{status, version};
  res.set(http::field::server, kServerName);
  res.set(http::field::content_type, content_type);
  res.set(http::field::cache_control, "no-store");
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

// A connection being served. Responses are built in named variables before being passed to
// co_await: GCC 12 can destroy temporaries of a co_await expression twice (seen as double
// frees in the registry shim), so no co_await here takes a non-trivial temporary.
class Connection {
 public:
  Connection(tcp::socket socket, const tcp::endpoint& remote, TrackerService& service,
             BlobApi& blobs, ManifestApi& manifests, PrefetchApi& prefetch, Access& access,
             const ServerOptions& options, const std::function<std::string()>& metrics_text,
             const std::function<std::string()>& cluster_view)
      : stream_(std::move(socket)),
        service_(service),
        access_(access),
        blobs_(blobs),
        manifests_(manifests),
        prefetch_(prefetch),
        options_(options),
        metrics_text_(metrics_text),
        cluster_view_(cluster_view),
        remote_(remote) {}

  // Shutdown: a connection waiting for its next request is closed now; one serving a request
  // closes after answering it.
  void Stop() {
    stopping_ = true;
    if (idle_) stream_.close();
  }

  awaitable<void> Run() {
    beast::flat_buffer buffer;
    for (;;) {
      if (stopping_) break;
      http::request_parser<http::string_body> parser;
      parser.header_limit(kHeaderLimit);
      parser.body_limit(kBodyLimit);
      beast::error_code ec;
      stream_.expires_after(options_.idle_timeout);
      idle_ = buffer.size() == 0;  // nothing of a next request has arrived yet
      co_await http::async_read_header(stream_, buffer, parser,
                                       asio::redirect_error(use_awaitable, ec));
      idle_ = false;
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
        std::string message =
            "request body is larger than " + std::to_string(kBodyLimit) + " bytes";
        std::string_view target = parser.get().target();
        StringResponse res =
            MakeResponse(parser.get().version(), false, http::status::payload_too_large,
                         message + "\n", "text/plain");
        std::string_view body_path = target.substr(0, target.find('?'));
        if (BlobApi::Owns(body_path) || ManifestApi::Owns(body_path) ||
            PrefetchApi::Owns(body_path)) {
          BlobResponse answer = blobs_.Error(413, std::move(message));
          res = MakeResponse(parser.get().version(), false, http::status::payload_too_large,
                             std::move(answer.body), "application/json");
        }
        service_.metrics().CountRequest("other", res.result_int());
        co_await Write(std::move(res));
        break;
      }
      if (ec) {
        std::string body = "malformed HTTP request: " + ec.message() + "\n";
        StringResponse res =
            MakeResponse(11, false, http::status::bad_request, std::move(body), "text/plain");
        service_.metrics().CountRequest("other", res.result_int());
        co_await Write(std::move(res));
        break;
      }
      Request req = parser.release();
      stream_.expires_never();
      StringResponse res = co_await Dispatch(req);
      if (stopping_) res.keep_alive(false);
      bool keep = req.keep_alive() && res.keep_alive();
      bool written = co_await Write(std::move(res));
      if (!written || !keep) break;
    }
    // No shutdown(SHUT_WR) first: the close that follows sends the same FIN, and a syscall is a
    // tenth of a connection-close announce's cost (docs/benchmarks.md, shoal-bench-tracker).
  }

 private:
  bool idle_ = false;      // waiting for the first byte of a request
  bool stopping_ = false;  // the server is shutting down

  awaitable<bool> Write(StringResponse res) {
    beast::error_code ec;
    stream_.expires_after(options_.write_timeout);
    co_await http::async_write(stream_, res, asio::redirect_error(use_awaitable, ec));
    stream_.expires_never();
    co_return !ec;
  }

  // A coroutine because lease long-polls wait; every other route answers synchronously.
  awaitable<StringResponse> Dispatch(const Request& req) {
    std::string_view target = req.target();
    size_t q = target.find('?');
    std::string_view path = target.substr(0, q);
    std::string_view query =
        q == std::string_view::npos ? std::string_view() : target.substr(q + 1);
    StringResponse res;
    std::string_view route_name;
    if (std::optional<StringResponse> refused = Refuse(req, path, query)) {
      res = std::move(*refused);
      route_name = RouteLabel(path);
    } else if (BlobApi::Owns(path)) {
      BlobRequest blob_req{req.method(), path, query, req.body(), remote_.address()};
      BlobResponse answer = co_await blobs_.Handle(blob_req);
      res = MakeResponse(req.version(), req.keep_alive(), static_cast<http::status>(answer.status),
                         std::move(answer.body), "application/json");
      if (!answer.allow.empty()) res.set(http::field::allow, answer.allow);
      route_name = "blobs";
    } else if (ManifestApi::Owns(path)) {
      BlobRequest manifest_req{req.method(), path, query, req.body(), remote_.address()};
      BlobResponse answer = co_await manifests_.Handle(manifest_req);
      res = MakeResponse(req.version(), req.keep_alive(), static_cast<http::status>(answer.status),
                         std::move(answer.body), "application/json");
      if (!answer.allow.empty()) res.set(http::field::allow, answer.allow);
      route_name = "manifests";
    } else if (PrefetchApi::Owns(path)) {
      BlobRequest prefetch_req{req.method(), path, query, req.body(), remote_.address()};
      BlobResponse answer = co_await prefetch_.Handle(prefetch_req);
      res = MakeResponse(req.version(), req.keep_alive(), static_cast<http::status>(answer.status),
                         std::move(answer.body), "application/json");
      if (!answer.allow.empty()) res.set(http::field::allow, answer.allow);
      route_name = "prefetch";
    } else {
      Route route = RouteOf(path);
      res = Answer(req, route, query,
                   route == Route::kStatus && access_.IsOperator(req[http::field::authorization]));
      route_name = RouteName(route);
    }
    if (req.method() == http::verb::head) {
      size_t size = res.body().size();
      res.body().clear();
      res.content_length(size);
    }
    service_.metrics().CountRequest(route_name, res.result_int());
    co_return res;
  }

  static std::string_view RouteLabel(std::string_view path) {
    if (BlobApi::Owns(path)) return "blobs";
    if (ManifestApi::Owns(path)) return "manifests";
    if (PrefetchApi::Owns(path)) return "prefetch";
    return RouteName(RouteOf(path));
  }

  // The refusal of a request whose credential does not admit it to path, or nullopt. Announce
  // and scrape carry an agent's announce key in the query (auth=); everything else a bearer
  // token.
  std::optional<StringResponse> Refuse(const Request& req, std::string_view path,
                                       std::string_view query) {
    Role needed = RequiredRole(req.method(), path);
    Access::Verdict verdict = Access::Verdict::kAllowed;
    bool announce = path == "/announce" || path == "/scrape";
    std::string_view key = announce ? AnnounceKeyOf(query) : std::string_view();
    if (announce && !access_.open()) {
      if (key.empty()) {
        verdict = access_.Check(needed, req[http::field::authorization]);
      } else if (!access_.CheckAnnounceKey(key)) {
        verdict = Access::Verdict::kInvalid;
      }
    } else {
      verdict = access_.Check(needed, req[http::field::authorization]);
    }
    if (verdict == Access::Verdict::kAllowed) return std::nullopt;
    const std::string_view label = RouteLabel(path);
    access_.CountRefused(label, verdict);
    std::string text = RefusalText(verdict, needed);
    if (announce && key.empty() && verdict == Access::Verdict::kMissing) {
      text = "this tracker needs an agent's announce key: /announce?auth=<key>";
    }
    auto status = verdict == Access::Verdict::kForbidden ? http::status::forbidden
                                                         : http::status::unauthorized;
    StringResponse res;
    if (announce) {
      res =
          MakeResponse(req.version(), req.keep_alive(), status, EncodeFailure(text), "text/plain");
    } else if (label == "blobs" || label == "manifests" || label == "prefetch" ||
               label == "cluster") {
      BlobResponse answer = blobs_.Error(static_cast<unsigned>(status), text);
      res = MakeResponse(req.version(), req.keep_alive(), status, std::move(answer.body),
                         "application/json");
    } else {
      res = MakeResponse(req.version(), req.keep_alive(), status, text + "\n", "text/plain");
    }
    if (status == http::status::unauthorized) {
      res.set(http::field::www_authenticate, "Bearer realm=\"shoal-tracker\"");
    }
    return res;
  }

  StringResponse Answer(const Request& req, Route route, std::string_view query,
                        bool operator_view) {
    unsigned v = req.version();
    bool keep = req.keep_alive();
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      StringResponse res = MakeResponse(
          v, keep, http::status::method_not_allowed,
          std::string(req.method_string()) + " is not supported; use GET\n", "text/plain");
      res.set(http::field::allow, "GET, HEAD");
      return res;
    }
    switch (route) {
      case Route::kAnnounce:
        return MakeResponse(v, keep, http::status::ok,
                            service_.Announce(query, remote_.address(), TrackerClock::now()),
                            "text/plain");
      case Route::kScrape:
        return MakeResponse(v, keep, http::status::ok, service_.Scrape(query), "text/plain");
      case Route::kMetrics:
        service_.UpdateGauges();
        blobs_.Sweep(TrackerClock::now());
        manifests_.Sweep(TrackerClock::now());
        prefetch_.Sweep(TrackerClock::now());
        return MakeResponse(v, keep, http::status::ok, metrics_text_ ? metrics_text_() : "",
                            "text/plain; version=0.0.4");
      case Route::kHealth:
        return MakeResponse(v, keep, http::status::ok, "ok\n", "text/plain");
      case Route::kStatus:
        if (!operator_view) {
          // Totals only: swarms, leases, manifests and jobs name images.
          return MakeResponse(v, keep, http::status::ok,
                              service_.StatusPage(false) +
                                  "\nswarms, leases, manifests and prefetch jobs: send an "
                                  "operator token (Authorization: Bearer <token>)\n",
                              "text/plain; charset=utf-8");
        }
        return MakeResponse(
            v, keep, http::status::ok,
            service_.StatusPage(true) + "\n" + blobs_.StatusSection(TrackerClock::now()) +
                manifests_.StatusSection() + prefetch_.StatusSection(TrackerClock::now()),
            "text/plain; charset=utf-8");
      case Route::kCluster: {
        StringResponse res = MakeResponse(v, keep, http::status::ok,
                                          cluster_view_ ? cluster_view_() : "{}",
                                          "application/json");
        res.set(http::field::cache_control, "no-store");
        return res;
      }
      case Route::kUi: {
        // The page itself holds no data: it asks for an operator token and reads /v1/cluster.
        // Nothing on it may load from anywhere else.
        StringResponse res =
            MakeResponse(v, keep, http::status::ok, std::string(ClusterPageHtml()),
                         "text/html; charset=utf-8");
        res.set("Content-Security-Policy",
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
                "frame-ancestors 'none'");
        res.set("X-Content-Type-Options", "nosniff");
        res.set(http::field::cache_control, "no-store");
        return res;
      }
      case Route::kNotFound:
        break;
    }
    std::string shown(req.target().substr(0, 200));
    return MakeResponse(v, keep, http::status::not_found, "no such endpoint: " + shown + "\n",
                        "text/plain");
  }

  beast::tcp_stream stream_;
  TrackerService& service_;
  Access& access_;
  BlobApi& blobs_;
  ManifestApi& manifests_;
  PrefetchApi& prefetch_;
  const ServerOptions& options_;
  const std::function<std::string()>& metrics_text_;
  const std::function<std::string()>& cluster_view_;
  tcp::endpoint remote_;
};

}  // namespace

Server::Server(asio::io_context& ioc, TrackerService& service, BlobApi& blobs,
               ManifestApi& manifests, PrefetchApi& prefetch, Access& access, ServerOptions options)
    : ioc_(ioc),
      service_(service),
      access_(access),
      blobs_(blobs),
      manifests_(manifests),
      prefetch_(prefetch),
      options_(std::move(options)),
      acceptor_(ioc) {}

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
  for (;;) {
    beast::error_code ec;
    // The peer's address comes with accept(2), so a connection needs no getpeername(2).
    tcp::endpoint remote;
    tcp::socket socket =
        co_await acceptor_.async_accept(remote, asio::redirect_error(use_awaitable, ec));
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
    if (ec) {
      spdlog::warn("accept failed: {}", ec.message());
      continue;
    }
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
      if (shedding_ < 1024) {
        asio::co_spawn(ioc_, Shed(std::move(socket)), asio::detached);
      } else {
        socket.close(ec);
      }
      continue;
    }
    asio::co_spawn(ioc_, Session(std::move(socket), remote), asio::detached);
  }
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

awaitable<void> Server::Session(tcp::socket socket, tcp::endpoint remote) {
  ++active_;
  service_.metrics().connections.Set(active_);
  Connection conn(std::move(socket), remote, service_, blobs_, manifests_, prefetch_, access_,
                  options_, metrics_text_, cluster_view_);
  auto registered = stops_.insert(stops_.end(), [&conn] { conn.Stop(); });
  try {
    co_await conn.Run();
  } catch (const std::exception& e) {
    spdlog::error("connection failed: {}", e.what());
  }
  stops_.erase(registered);
  --active_;
  service_.metrics().connections.Set(active_);
}

}  // namespace shoal::tracker
