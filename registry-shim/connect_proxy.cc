#include "registry-shim/connect_proxy.h"

#include <algorithm>
#include <array>
#include <cctype>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include "lib/oci/quote.h"
#include "lib/oci/reference.h"

namespace shoal::shim {
namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using tcp = asio::ip::tcp;

std::string ConnectTarget::Registry() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  if (port != 443) h += ":" + std::to_string(port);
  return oci::NormalizeRegistryHost(h);
}

Result<ConnectTarget> ParseConnectTarget(std::string_view target) {
  auto fail = [&](const std::string& why) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "CONNECT target " + oci::Quote(target.substr(0, 300)) + " " + why);
  };
  if (target.empty()) return fail("is empty (expected HOST:PORT)");
  size_t colon;
  if (target.front() == '[') {
    size_t close = target.find(']');
    if (close == std::string_view::npos) return fail("has \"[\" without \"]\"");
    if (close + 1 >= target.size() || target[close + 1] != ':')
      return fail("has no port (expected HOST:PORT, e.g. gcr.io:443)");
    colon = close + 1;
  } else {
    colon = target.rfind(':');
    if (colon == std::string_view::npos)
      return fail("has no port (expected HOST:PORT, e.g. gcr.io:443)");
  }
  // Host and port syntax are those of a registry host in an image reference.
  if (auto st = oci::ValidateRegistryHost(target); !st)
    return fail("is not HOST:PORT: " + st.error().message);
  std::string_view host = target.substr(0, colon);
  ConnectTarget out;
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  out.host = std::string(host);
  std::transform(out.host.begin(), out.host.end(), out.host.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  out.port = static_cast<uint16_t>(std::stoi(std::string(target.substr(colon + 1))));
  return out;
}

awaitable<Result<tcp::socket>> DialTarget(asio::any_io_executor executor,
                                          const ConnectTarget& target,
                                          std::chrono::seconds timeout) {
  const std::string name = target.host + ":" + std::to_string(target.port);
  boost::system::error_code ec;
  tcp::resolver resolver(executor);
  const std::string port = std::to_string(target.port);
  auto results =
      co_await resolver.async_resolve(target.host, port, asio::redirect_error(use_awaitable, ec));
  if (ec)
    co_return MakeError(ErrorCode::kUnavailable, "cannot resolve " + name + ": " + ec.message());
  boost::beast::tcp_stream stream(executor);
  stream.expires_after(timeout);
  co_await stream.async_connect(results, asio::redirect_error(use_awaitable, ec));
  if (ec)
    co_return MakeError(ErrorCode::kUnavailable, "cannot connect to " + name + ": " + ec.message());
  stream.expires_never();
  co_return stream.release_socket();
}

namespace {

// Shared by the two copy directions and the watchdog of one tunnel; lives on one executor.
struct SpliceState {
  SpliceState(tcp::socket c, tcp::socket s)
      : client(std::move(c)), server(std::move(s)), wake(client.get_executor()) {}
  tcp::socket client;
  tcp::socket server;
  asio::steady_timer wake;  // cancelled when a direction ends
  int open_directions = 2;
  std::chrono::steady_clock::time_point last_activity = std::chrono::steady_clock::now();
  uint64_t up = 0, down = 0;

  void CloseBoth() {
    boost::system::error_code ignored;
    client.close(ignored);
    server.close(ignored);
  }
};

awaitable<void> Pump(std::shared_ptr<SpliceState> state, tcp::socket& from, tcp::socket& to,
                     uint64_t& counter) {
  std::array<char, 64 * 1024> buf;
  boost::system::error_code ec;
  for (;;) {
    size_t n =
        co_await from.async_read_some(asio::buffer(buf), asio::redirect_error(use_awaitable, ec));
    if (ec) break;
    state->last_activity = std::chrono::steady_clock::now();
    co_await asio::async_write(to, asio::buffer(buf.data(), n),
                               asio::redirect_error(use_awaitable, ec));
    if (ec) break;
    counter += n;
    state->last_activity = std::chrono::steady_clock::now();
  }
  boost::system::error_code ignored;
  if (ec == asio::error::eof) {
    to.shutdown(tcp::socket::shutdown_send, ignored);  // pass the half-close on
  } else {
    state->CloseBoth();  // a reset or a failed write ends the whole tunnel
  }
  --state->open_directions;
  state->wake.cancel();
}

}  // namespace

awaitable<std::pair<uint64_t, uint64_t>> Splice(tcp::socket client, tcp::socket server,
                                                std::string early_bytes,
                                                std::chrono::seconds idle_timeout) {
  auto state = std::make_shared<SpliceState>(std::move(client), std::move(server));
  boost::system::error_code ec;
  if (!early_bytes.empty()) {
    co_await asio::async_write(state->server, asio::buffer(early_bytes),
                               asio::redirect_error(use_awaitable, ec));
    if (ec) {
      state->CloseBoth();
      co_return std::make_pair(uint64_t{0}, uint64_t{0});
    }
    state->up += early_bytes.size();
  }
  auto ex = state->client.get_executor();
  asio::co_spawn(ex, Pump(state, state->client, state->server, state->up), asio::detached);
  asio::co_spawn(ex, Pump(state, state->server, state->client, state->down), asio::detached);
  // Waits for both directions; checks idleness at least every quarter of the timeout.
  const auto check =
      std::max<std::chrono::milliseconds>(idle_timeout / 4, std::chrono::milliseconds(100));
  while (state->open_directions > 0) {
    state->wake.expires_after(check);
    co_await state->wake.async_wait(asio::redirect_error(use_awaitable, ec));
    if (state->open_directions > 0 &&
        std::chrono::steady_clock::now() - state->last_activity >= idle_timeout) {
      state->CloseBoth();
    }
  }
  state->CloseBoth();
  co_return std::make_pair(state->up, state->down);
}

}  // namespace shoal::shim
