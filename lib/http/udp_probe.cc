#include "lib/http/udp_probe.h"

#include <poll.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/endian/conversion.hpp>

namespace shoal::http {
namespace asio = boost::asio;

namespace {

// Waits until fd is ready for `events` or `wait` passes.
bool Ready(int fd, short events, std::chrono::milliseconds wait) {
  pollfd p{fd, events, 0};
  return ::poll(&p, 1, static_cast<int>(wait.count())) == 1 && (p.revents & events) != 0;
}

template <typename T>
void Put(std::string& out, T v) {
  v = boost::endian::native_to_big(v);
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

bool UdpAnswers(asio::io_context& ioc, const asio::ip::udp::endpoint& to, int tries,
                std::chrono::milliseconds wait) {
  boost::system::error_code ec;
  asio::ip::udp::socket s(ioc);
  s.open(to.protocol(), ec);
  if (!ec) s.non_blocking(true, ec);
  if (ec) return false;
  std::mt19937 rng{std::random_device{}()};
  for (int i = 0; i < tries; ++i) {
    const uint32_t transaction = static_cast<uint32_t>(rng());
    std::string connect;
    Put<uint64_t>(connect, 0x41727101980ULL);  // BEP 15's protocol id
    Put<uint32_t>(connect, 0);                 // connect
    Put<uint32_t>(connect, transaction);
    s.send_to(asio::buffer(connect), to, 0, ec);
    if (ec) continue;  // e.g. an ICMP error from the last try: try again
    const auto until = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < until) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (!Ready(s.native_handle(), POLLIN, left)) break;
      char answer[64];
      asio::ip::udp::endpoint from;
      size_t n = s.receive_from(asio::buffer(answer), from, 0, ec);
      if (ec) break;
      uint32_t action = 0, tx = 0;
      if (n >= 16) {
        std::memcpy(&action, answer, 4);
        std::memcpy(&tx, answer + 4, 4);
      }
      if (n >= 16 && boost::endian::big_to_native(action) == 0 &&
          boost::endian::big_to_native(tx) == transaction)
        return true;
    }
  }
  return false;
}

bool TcpOpens(asio::io_context& ioc, const asio::ip::tcp::endpoint& to,
              std::chrono::milliseconds wait) {
  boost::system::error_code ec;
  asio::ip::tcp::socket s(ioc);
  s.open(to.protocol(), ec);
  if (!ec) s.non_blocking(true, ec);
  if (ec) return false;
  s.connect(to, ec);
  if (!ec) return true;
  if (ec != asio::error::would_block && ec != asio::error::in_progress) return false;
  if (!Ready(s.native_handle(), POLLOUT, wait)) return false;
  int err = 0;
  socklen_t len = sizeof(err);
  return ::getsockopt(s.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
}

}  // namespace

UdpReach ProbeUdpAnnounce(const Url& tracker, int tries, std::chrono::milliseconds wait) {
  asio::io_context ioc;
  boost::system::error_code ec;
  asio::ip::udp::resolver resolver(ioc);
  auto found = resolver.resolve(tracker.host, std::to_string(tracker.port), ec);
  if (ec || found.empty()) return UdpReach::kNeither;
  const asio::ip::udp::endpoint udp_ep = found.begin()->endpoint();
  if (UdpAnswers(ioc, udp_ep, tries, wait)) return UdpReach::kAnswers;
  const asio::ip::tcp::endpoint tcp_ep(udp_ep.address(), udp_ep.port());
  return TcpOpens(ioc, tcp_ep, wait) ? UdpReach::kTcpOnly : UdpReach::kNeither;
}

}  // namespace shoal::http
