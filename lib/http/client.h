#pragma once
// An async HTTP/1.1 client (Boost.Beast, Asio C++20 coroutines) for http and https, with
// per-operation timeouts, streamed response bodies and a small keep-alive connection pool.

#include <utility>  // must precede Boost.Asio with GCC 12 + Boost 1.74

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/verb.hpp>

#include "lib/core/error.h"
#include "lib/http/address_policy.h"
#include "lib/http/url.h"

namespace shoal::http {

// Settings of a Client; fixed at construction.
struct ClientConfig {
  // Extra PEM CA file trusted in addition to the system's default CA paths; empty for none.
  std::string ca_file;
  // Budget for resolve + TCP connect + TLS handshake.
  std::chrono::milliseconds connect_timeout{10000};
  // Longest wait for any single write or read (header or body) to make progress, so a stalled
  // peer is detected while a slow but moving body is not cut off.
  std::chrono::milliseconds idle_timeout{30000};
  // Idle keep-alive connections kept per scheme+host+port; 0 disables reuse.
  size_t max_idle_per_host = 8;
  // An idle pooled connection older than this is closed instead of reused (servers drop them).
  std::chrono::milliseconds max_idle_age{15000};
};

// One request. The Host header is set from `url`; Content-Length from `body`.
struct Request {
  boost::beast::http::verb method = boost::beast::http::verb::get;
  Url url;
  boost::beast::http::fields headers;
  std::string body;
  AddressPolicy addresses = AddressPolicy::kAny;
};

namespace detail {
struct ResponseState;  // the connection, parser and body buffer behind a Response
}  // namespace detail

// A response whose head has been read and whose body is read on demand, in order. Owns its
// connection: when destroyed after the body was read to the end and the server allows keep-alive,
// the connection goes back to the pool; otherwise it is closed. Not thread-safe: one coroutine
// uses a Response at a time.
class Response {
 public:
  // Used by Client::Open; `state` holds a connection whose response head has been read.
  Response(std::unique_ptr<detail::ResponseState> state, Url url);
  ~Response();
  Response(const Response&) = delete;
  Response& operator=(const Response&) = delete;

  // The status code, e.g. 200.
  unsigned status() const;
  // All response header fields.
  const boost::beast::http::fields& headers() const;
  // A header's value, or "" when absent.
  std::string_view header(boost::beast::http::field name) const;
  // A header's value by name (case-insensitive), or "" when absent.
  std::string_view header(std::string_view name) const;
  // The Content-Length, when the server sent one (also for HEAD answers).
  std::optional<uint64_t> content_length() const;
  // The URL this response came from.
  const Url& url() const { return url_; }
  // True when the whole body has been read (always true for HEAD and bodiless statuses).
  bool done() const;

  // Reads the next piece of the body: what has arrived, once at least one byte has (up to
  // 256 KiB; it does not wait for more). The view points into a buffer owned by this
  // Response and stays valid until the next call. An empty view means the body is complete.
  // Bytes received before a failure are returned first; the failure comes with the next call.
  // Errors: kUnavailable (timeout, reset, body cut short), kProtocol (malformed HTTP).
  boost::asio::awaitable<Result<std::string_view>> ReadSome();
  // Reads the rest of the body into memory. Errors: as ReadSome, and kProtocol when it would
  // exceed `max_bytes`.
  boost::asio::awaitable<Result<std::string>> ReadAll(size_t max_bytes);
  // Reads and drops the rest of the body if it is at most `max_bytes`, so that the connection can
  // be reused; otherwise (or on error) leaves it to be closed. Never fails.
  boost::asio::awaitable<void> Drain(size_t max_bytes);

 private:
  std::unique_ptr<detail::ResponseState> state_;
  Url url_;
};

// The client. Thread-safe: any number of coroutines may call Open concurrently, on an
// io_context run by one or more threads (each connection gets its own strand; the pool is
// guarded by a mutex). Responses may outlive the Client.
class Client {
 public:
  // Loads the system CA paths and config.ca_file. A CA file that cannot be loaded is logged and
  // makes every https request fail with kInvalidArgument naming the file.
  Client(boost::asio::any_io_executor executor, ClientConfig config);
  ~Client();

  // Sends the request and reads the response head (following no redirects). Reuses a pooled
  // connection made under the same AddressPolicy when possible, and retries once on a fresh
  // connection when a reused one turns out to be closed (GET/HEAD only). The host is resolved
  // once per connection and only the addresses checked are connected to. Errors:
  // kInvalidArgument (bad request or CA file), kRefused (kGlobalOnly: the host did not resolve
  // or has a non-global address; nothing was connected to), kUnavailable (resolve, connect, TLS
  // handshake I/O, timeout, reset), kProtocol (TLS verification failure, malformed HTTP).
  boost::asio::awaitable<Result<std::unique_ptr<Response>>> Open(const Request& request);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace shoal::http
