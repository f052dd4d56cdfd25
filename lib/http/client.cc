#include "lib/http/client.h"

#include <utility>

#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <vector>

#include <openssl/ssl.h>
#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "lib/http/address_policy.h"

namespace shoal::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kBodyBufferSize = 256 * 1024;
constexpr uint32_t kHeaderLimit = 64 * 1024;

// One keep-alive connection: a plain or TLS stream plus the read buffer that belongs to it.
struct Connection {
  std::string key;              // scheme://host:port
  net::any_io_executor strand;  // every operation on the streams runs here
  std::unique_ptr<beast::tcp_stream> plain;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> secure;
  beast::flat_buffer buffer;
  Clock::time_point idle_since;

  beast::tcp_stream& Lowest() { return secure ? beast::get_lowest_layer(*secure) : *plain; }
};

bool IsIpLiteral(const std::string& host) {
  beast::error_code ec;
  net::ip::make_address(host, ec);
  return !ec;
}

bool IsHeaderSafe(std::string_view v) {
  for (char c : v) {
    if (c == '\r' || c == '\n' || c == '\0') return false;
  }
  return true;
}

// Transport failures are worth retrying (kUnavailable); a peer that speaks broken HTTP or fails
// TLS verification is not (kProtocol).
Error IoError(const beast::error_code& ec, std::string_view what, const Url& url) {
  ErrorCode code = ErrorCode::kUnavailable;
  const auto& http_category = bhttp::make_error_code(bhttp::error::bad_target).category();
  if (ec.category() == http_category && ec != bhttp::error::end_of_stream &&
      ec != bhttp::error::partial_message) {
    code = ErrorCode::kProtocol;
  }
  std::string reason = ec.message();
  if (ec == beast::error::timeout) reason = "timed out";
  if (ec == bhttp::error::partial_message) reason = "connection closed before the body ended";
  if (ec == bhttp::error::end_of_stream) reason = "connection closed before a response";
  return MakeError(code, std::string(what) + " " + url.Redacted() + ": " + reason);
}

bool IsStaleConnectionError(const beast::error_code& ec) {
  return ec == bhttp::error::end_of_stream || ec == net::error::eof ||
         ec == net::error::connection_reset || ec == net::error::broken_pipe ||
         ec == net::ssl::error::stream_truncated;
}

using Parser = bhttp::response_parser<bhttp::buffer_body>;

// The three coroutines below run on the connection's strand (see Client::Open): Beast's timeout
// handler runs on the executor of the operation that armed it, so every operation on a stream
// and its timer must share one strand when the io_context has several threads.

// Sends the request and reads the response head. `sent` tells whether the request went out.
struct Exchange {
  beast::error_code ec;
  bool sent = false;
};

net::awaitable<Exchange> ExchangeOn(Connection& c, bhttp::request<bhttp::string_body>& req,
                                    Parser& parser, std::chrono::milliseconds timeout) {
  Exchange x;
  c.Lowest().expires_after(timeout);
  if (c.secure) {
    co_await bhttp::async_write(*c.secure, req, net::redirect_error(net::use_awaitable, x.ec));
  } else {
    co_await bhttp::async_write(*c.plain, req, net::redirect_error(net::use_awaitable, x.ec));
  }
  if (x.ec) co_return x;
  x.sent = true;
  c.Lowest().expires_after(timeout);
  if (c.secure) {
    co_await bhttp::async_read_header(*c.secure, c.buffer, parser,
                                      net::redirect_error(net::use_awaitable, x.ec));
  } else {
    co_await bhttp::async_read_header(*c.plain, c.buffer, parser,
                                      net::redirect_error(net::use_awaitable, x.ec));
  }
  c.Lowest().expires_never();
  co_return x;
}

constexpr size_t kSocketReadReserve = 256 * 1024;

// Reads until some body bytes are in the parser's body buffer or the message is complete,
// re-arming the idle timeout before every socket read; then goes on only while more bytes have
// already arrived (a fast stream still fills the buffer). It does not wait to fill it: on a slow
// stream that held the first bytes back for up to 256 KiB (1.1 s seen at a shared 50 Mbit
// link), and a streaming reader should pass on bytes as they come.
net::awaitable<beast::error_code> FillBodyOn(Connection& c, Parser& parser,
                                             std::chrono::milliseconds timeout) {
  auto& body = parser.get().body();
  const size_t empty = body.size;
  beast::error_code ec;
  // Beast sizes each socket read by the buffer's spare capacity (at least 512 bytes, at most
  // 64 KiB); after a header read the capacity is tiny, which made body reads 512-byte syscalls.
  if (c.buffer.capacity() < kSocketReadReserve) c.buffer.reserve(kSocketReadReserve);
  auto more_arrived = [&c] {
    beast::error_code unused;
    return c.Lowest().socket().available(unused) > 0;
  };
  while (body.size > 0 && !parser.is_done() && (body.size == empty || more_arrived())) {
    c.Lowest().expires_after(timeout);
    if (c.secure) {
      co_await bhttp::async_read_some(*c.secure, c.buffer, parser,
                                      net::redirect_error(net::use_awaitable, ec));
    } else {
      co_await bhttp::async_read_some(*c.plain, c.buffer, parser,
                                      net::redirect_error(net::use_awaitable, ec));
    }
    if (ec == bhttp::error::need_buffer) {
      ec = {};
      break;
    }
    if (ec) break;
  }
  c.Lowest().expires_never();
  co_return ec;
}

}  // namespace

// Idle keep-alive connections by scheme://host:port.
class ConnectionPool {
 public:
  ConnectionPool(size_t max_per_host, std::chrono::milliseconds max_age)
      : max_per_host_(max_per_host), max_age_(max_age) {}

  // The most recently used idle connection for `key` that is young enough, or null.
  std::unique_ptr<Connection> Take(const std::string& key) {
    std::vector<std::unique_ptr<Connection>> expired;  // closed outside the lock
    std::unique_ptr<Connection> found;
    {
      std::lock_guard lock(mu_);
      auto it = idle_.find(key);
      if (it == idle_.end()) return nullptr;
      auto& list = it->second;
      auto now = Clock::now();
      while (!list.empty()) {
        std::unique_ptr<Connection> c = std::move(list.back());
        list.pop_back();
        if (now - c->idle_since < max_age_) {
          found = std::move(c);
          break;
        }
        expired.push_back(std::move(c));
      }
      if (list.empty()) idle_.erase(it);
    }
    return found;
  }

  // Keeps `conn` for reuse, or closes it when the host already has enough idle connections.
  void Put(std::unique_ptr<Connection> conn) {
    if (max_per_host_ == 0) return;
    std::unique_ptr<Connection> dropped;
    std::lock_guard lock(mu_);
    auto& list = idle_[conn->key];
    list.push_back(std::move(conn));
    if (list.size() > max_per_host_) {
      dropped = std::move(list.front());
      list.pop_front();
    }
  }

 private:
  const size_t max_per_host_;
  const std::chrono::milliseconds max_age_;
  std::mutex mu_;
  std::map<std::string, std::deque<std::unique_ptr<Connection>>> idle_;  // guarded by mu_
};

namespace detail {

struct ResponseState {
  std::unique_ptr<Connection> conn;
  std::shared_ptr<ConnectionPool> pool;
  std::unique_ptr<bhttp::response_parser<bhttp::buffer_body>> parser;
  std::unique_ptr<char[]> body_buffer;  // allocated on the first body read
  std::chrono::milliseconds idle_timeout{0};
  bool failed = false;  // a read failed: the connection's state is unknown, never reuse it
  std::optional<Error> pending_error;  // a failure to report after the bytes read before it
};

}  // namespace detail

Response::Response(std::unique_ptr<detail::ResponseState> state, Url url)
    : state_(std::move(state)), url_(std::move(url)) {}

Response::~Response() {
  if (!state_ || !state_->conn) return;
  auto& s = *state_;
  if (!s.failed && s.pool && s.parser->is_done() && s.parser->get().keep_alive() &&
      s.conn->buffer.size() == 0) {
    s.conn->idle_since = Clock::now();
    s.pool->Put(std::move(s.conn));
  }
}

unsigned Response::status() const { return state_->parser->get().result_int(); }

const bhttp::fields& Response::headers() const { return state_->parser->get().base(); }

std::string_view Response::header(bhttp::field name) const {
  const auto& fields = headers();
  auto it = fields.find(name);
  if (it == fields.end()) return {};
  return it->value();
}

std::string_view Response::header(std::string_view name) const {
  const auto& fields = headers();
  auto it = fields.find(name);
  if (it == fields.end()) return {};
  return it->value();
}

std::optional<uint64_t> Response::content_length() const {
  std::string_view v = header(bhttp::field::content_length);
  if (v.empty() || v.size() > 19) return std::nullopt;
  uint64_t n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  return n;
}

bool Response::done() const { return state_->parser->is_done(); }

net::awaitable<Result<std::string_view>> Response::ReadSome() {
  auto& s = *state_;
  if (s.pending_error) {
    Error e = std::move(*s.pending_error);
    s.pending_error.reset();
    co_return e;
  }
  if (s.failed) {
    co_return MakeError(ErrorCode::kUnavailable,
                        "reading from " + url_.Redacted() + " after an earlier failure");
  }
  if (s.parser->is_done()) co_return std::string_view();
  if (!s.body_buffer) s.body_buffer = std::make_unique<char[]>(kBodyBufferSize);
  auto& body = s.parser->get().body();
  body.data = s.body_buffer.get();
  body.size = kBodyBufferSize;
  beast::error_code ec = co_await net::co_spawn(
      s.conn->strand, FillBodyOn(*s.conn, *s.parser, s.idle_timeout), net::use_awaitable);
  if (ec) {
    s.failed = true;
    Error e = IoError(ec, "reading the body of", url_);
    if (body.size == kBodyBufferSize) co_return e;
    // Hand out what arrived before the failure first; the error comes with the next call.
    s.pending_error = std::move(e);
  }
  size_t n = kBodyBufferSize - body.size;
  body.data = nullptr;
  body.size = 0;
  co_return std::string_view(s.body_buffer.get(), n);
}

net::awaitable<Result<std::string>> Response::ReadAll(size_t max_bytes) {
  auto too_big = [&] {
    return MakeError(ErrorCode::kProtocol, "body of " + url_.Redacted() + " exceeds " +
                                               std::to_string(max_bytes) + " bytes");
  };
  auto length = content_length();
  if (length && *length > max_bytes && !done()) {
    state_->failed = true;
    co_return too_big();
  }
  std::string out;
  if (length) out.reserve(*length);
  while (true) {
    auto piece = co_await ReadSome();
    if (!piece) co_return piece.error();
    if (piece.value().empty()) break;
    if (out.size() + piece.value().size() > max_bytes) {
      state_->failed = true;
      co_return too_big();
    }
    out.append(piece.value());
  }
  co_return out;
}

net::awaitable<void> Response::Drain(size_t max_bytes) {
  auto length = content_length();
  if (done() || (length && *length > max_bytes)) co_return;
  size_t total = 0;
  while (total <= max_bytes) {
    auto piece = co_await ReadSome();
    if (!piece || piece.value().empty()) co_return;
    total += piece.value().size();
  }
  state_->failed = true;
}

struct Client::Impl {
  net::any_io_executor executor;
  ClientConfig config;
  net::ssl::context ssl_ctx{net::ssl::context::tls_client};
  std::string ssl_error;  // set when the TLS setup failed; every https request reports it
  std::shared_ptr<ConnectionPool> pool;

  // Resolves, connects and (for https) handshakes; runs on `strand`, which the new
  // connection keeps. Wrapped in optional because co_spawn needs a default-constructible value.
  net::awaitable<std::optional<Result<std::unique_ptr<Connection>>>> Connect(
      Url url, AddressPolicy addresses, net::any_io_executor strand);
};

Client::Client(net::any_io_executor executor, ClientConfig config)
    : impl_(std::make_shared<Impl>()) {
  impl_->executor = std::move(executor);
  impl_->config = std::move(config);
  impl_->pool =
      std::make_shared<ConnectionPool>(impl_->config.max_idle_per_host, impl_->config.max_idle_age);
  auto& ctx = impl_->ssl_ctx;
  SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_2_VERSION);
  beast::error_code ec;
  ctx.set_default_verify_paths(ec);
  if (ec) spdlog::warn("http: cannot load the system CA paths: {}", ec.message());
  if (!impl_->config.ca_file.empty()) {
    ctx.load_verify_file(impl_->config.ca_file, ec);
    if (ec) {
      impl_->ssl_error = "cannot load CA file " + impl_->config.ca_file + ": " + ec.message();
      spdlog::error("http: {}", impl_->ssl_error);
    }
  }
  ctx.set_verify_mode(net::ssl::verify_peer);
}

Client::~Client() = default;

net::awaitable<std::optional<Result<std::unique_ptr<Connection>>>> Client::Impl::Connect(
    Url url, AddressPolicy addresses, net::any_io_executor strand) {
  tcp::resolver resolver(strand);
  beast::error_code ec;
  auto flags = IsIpLiteral(url.host) ? tcp::resolver::numeric_host : tcp::resolver::flags();
  auto endpoints = co_await resolver.async_resolve(url.host, std::to_string(url.port), flags,
                                                   net::redirect_error(net::use_awaitable, ec));
  const bool global_only = addresses == AddressPolicy::kGlobalOnly;
  if (ec) {
    // The host only inside the URL, which the shim redacts from what clients see.
    co_return MakeError(global_only ? ErrorCode::kRefused : ErrorCode::kUnavailable,
                        "cannot resolve the host of " + url.Redacted() + ": " + ec.message());
  }
  if (global_only) {
    // Every address is checked, and the connect below uses these very results: no second lookup
    // that a short-TTL DNS answer could rebind to a private address.
    for (const auto& entry : endpoints) {
      const net::ip::address address = entry.endpoint().address();
      if (!IsGlobalAddress(address)) {
        co_return MakeError(ErrorCode::kRefused, "not connecting to " + url.Redacted() + ": " +
                                                     address.to_string() +
                                                     " is not a global address");
      }
    }
  }
  auto conn = std::make_unique<Connection>();
  conn->strand = strand;
  if (url.scheme == "https") {
    conn->secure = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(strand, ssl_ctx);
  } else {
    conn->plain = std::make_unique<beast::tcp_stream>(strand);
  }
  auto& lowest = conn->Lowest();
  lowest.expires_after(config.connect_timeout);
  co_await lowest.async_connect(endpoints, net::redirect_error(net::use_awaitable, ec));
  if (ec) co_return IoError(ec, "cannot connect to", url);
  if (conn->secure) {
    SSL* ssl = conn->secure->native_handle();
    if (!IsIpLiteral(url.host) &&
        !SSL_set_tlsext_host_name(ssl, const_cast<char*>(url.host.c_str()))) {
      co_return MakeError(ErrorCode::kInternal, "cannot set TLS SNI for " + url.Redacted());
    }
    conn->secure->set_verify_mode(net::ssl::verify_peer);
    conn->secure->set_verify_callback(net::ssl::host_name_verification(url.host));
    co_await conn->secure->async_handshake(net::ssl::stream_base::client,
                                           net::redirect_error(net::use_awaitable, ec));
    if (ec) {
      bool tls_refused = ec.category() == net::error::get_ssl_category();
      co_return MakeError(tls_refused ? ErrorCode::kProtocol : ErrorCode::kUnavailable,
                          "TLS handshake with " + url.HostPort() + " failed: " + ec.message());
    }
  }
  lowest.expires_never();
  co_return conn;
}

net::awaitable<Result<std::unique_ptr<Response>>> Client::Open(const Request& request) {
  std::shared_ptr<Impl> impl = impl_;  // the Client may be destroyed while this runs
  const Url& url = request.url;
  if (url.scheme != "http" && url.scheme != "https") {
    co_return MakeError(ErrorCode::kInvalidArgument, "unsupported URL " + url.Redacted());
  }
  if (url.scheme == "https" && !impl->ssl_error.empty()) {
    co_return MakeError(ErrorCode::kInvalidArgument, impl->ssl_error);
  }
  if (!IsHeaderSafe(url.target)) {
    co_return MakeError(ErrorCode::kInvalidArgument, "URL " + url.Redacted() + " has CR/LF");
  }
  bhttp::request<bhttp::string_body> req{request.method, url.target, 11};
  for (const auto& f : request.headers) {
    if (!IsHeaderSafe(f.value())) {
      co_return MakeError(ErrorCode::kInvalidArgument, "header " + std::string(f.name_string()) +
                                                           " for " + url.Redacted() + " has CR/LF");
    }
    req.insert(f.name_string(), f.value());
  }
  req.set(bhttp::field::host, url.HostPort());
  if (!request.body.empty()) {
    req.body() = request.body;
    req.prepare_payload();
  }
  // A connection checked for kGlobalOnly may serve kAny, but not the other way round: keep the
  // two apart.
  const std::string key = url.scheme + "://" + url.HostPort() +
                          (request.addresses == AddressPolicy::kGlobalOnly ? " global" : "");
  const bool idempotent = request.method == bhttp::verb::get || request.method == bhttp::verb::head;

  for (int attempt = 0; attempt < 2; ++attempt) {
    std::unique_ptr<Connection> conn;
    if (attempt == 0) conn = impl->pool->Take(key);
    const bool reused = conn != nullptr;
    if (!conn) {
      net::any_io_executor strand = net::make_strand(impl->executor);
      auto connected = co_await net::co_spawn(strand, impl->Connect(url, request.addresses, strand),
                                              net::use_awaitable);
      if (!connected) co_return MakeError(ErrorCode::kInternal, "connect lost its result");
      if (!connected->has_value()) co_return connected->error();
      conn = std::move(*connected).value();
      conn->key = key;
    }
    auto parser = std::make_unique<Parser>();
    // Not boost::none: Boost 1.74 compares the length against an empty optional as "greater".
    parser->body_limit(std::numeric_limits<std::uint64_t>::max());  // callers cap bodies
    parser->header_limit(kHeaderLimit);
    if (request.method == bhttp::verb::head) parser->skip(true);
    Exchange x = co_await net::co_spawn(conn->strand,
                                        ExchangeOn(*conn, req, *parser, impl->config.idle_timeout),
                                        net::use_awaitable);
    if (x.ec) {
      // A pooled connection the server has closed meanwhile fails at once: try a fresh one.
      if (reused && idempotent && (!x.sent || IsStaleConnectionError(x.ec))) continue;
      co_return IoError(
          x.ec, x.sent ? "cannot read the response from" : "cannot send the request to", url);
    }
    auto state = std::make_unique<detail::ResponseState>();
    state->conn = std::move(conn);
    state->pool = impl->pool;
    state->parser = std::move(parser);
    state->idle_timeout = impl->config.idle_timeout;
    co_return std::make_unique<Response>(std::move(state), url);
  }
  co_return MakeError(ErrorCode::kUnavailable, "no usable connection to " + url.Redacted());
}

}  // namespace shoal::http
