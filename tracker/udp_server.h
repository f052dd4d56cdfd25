#pragma once
// The tracker's UDP announce endpoint (BEP 15, with BEP 41's URL data carrying the announce
// key), on the HTTP port's number. Over HTTP every announce is a TCP connection of its own
// (libtorrent closes after each); over UDP it is one datagram each way. A sender proves its
// address with a connection id before it may announce (the ids are keyed alike on every replica,
// from the agent tokens), so forged senders get nothing bigger than what they sent. Answers come
// from the same TrackerService and Access as HTTP ones.

#include <array>
#include <utility>
#include <vector>
#include <optional>
#include <string>
#include <string_view>

#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/udp.hpp>

#include "lib/core/error.h"
#include "tracker/access.h"
#include "tracker/swarms/service.h"
#include "tracker/swarms/udp_protocol.h"

namespace shoal::tracker {

// Lives on one io_context; all methods must be called on that context's (single) thread.
class UdpServer {
 public:
  // service and access must outlive the server; its metrics go on registry.
  UdpServer(boost::asio::io_context& ioc, TrackerService& service, Access& access,
            prometheus::Registry& registry);

  // Binds address:port for UDP and returns the bound port. Errors: kInvalidArgument for a bad
  // address, kIo when binding fails (the port is taken for UDP).
  Result<uint16_t> Listen(const std::string& address, uint16_t port);
  // Starts answering datagrams.
  void Start();
  // Stops answering and closes the socket.
  void Stop();

  // The answer to one datagram from `from` at `now`, counted; nullopt when nothing is sent back
  // (less than a request header). A sender without a connection id this cluster issued gets
  // nothing larger than it sent: an error on a closed tracker, or a truncated answer on an open
  // one.
  std::optional<std::string> Answer(std::string_view datagram,
                                    const boost::asio::ip::udp::endpoint& from, TimePoint now);

 private:
  enum Result_ { kOk, kInvalid, kBadConnectionId, kRefused, kFailed, kUnverified, kResults };
  void WaitReadable();
  // Answers the datagrams queued on the socket, at most a batch before yielding.
  void Drain();
  void Count(UdpAction action, Result_ result);
  // The refusal text when url_data carries no accepted announce key, or nullopt.
  std::optional<std::string> Refusal(std::string_view url_data);
  // The keys connection ids are checked with: the agent tokens' (current first), then those of
  // tokens dropped from the file in the last kRetiredKeyTtl (libtorrent keeps an id 60 s, so a
  // rotation must not void the ids handed out just before it).
  const std::vector<UdpSecret>& Keys(TimePoint now);

  boost::asio::ip::udp::socket socket_;
  TrackerService& service_;
  Access& access_;
  UdpConnectionIds ids_;
  std::vector<UdpSecret> current_;                            // the tokens' keys last seen
  std::vector<std::pair<UdpSecret, TimePoint>> retired_;      // dropped keys, until when
  std::vector<UdpSecret> keys_;                               // current_ then retired_
  // shoal_tracker_udp_requests_total{action, result}
  std::array<std::array<prometheus::Counter*, kResults>, 4> counted_{};
  prometheus::Counter* send_failures_ = nullptr;
  std::array<char, 65536> buffer_{};
  bool stopped_ = false;
};

}  // namespace shoal::tracker
