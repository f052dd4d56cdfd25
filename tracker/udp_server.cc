#include "tracker/udp_server.h"

#include <algorithm>
#include <utility>

#include <spdlog/spdlog.h>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/address.hpp>

namespace shoal::tracker {
namespace asio = boost::asio;
using asio::ip::udp;

namespace {

// Datagrams answered per wake-up before other work on the thread gets a turn.
constexpr int kBatch = 256;
// How long a key of a token dropped from the file still verifies ids: past the ids' own life.
constexpr std::chrono::minutes kRetiredKeyTtl{3};

constexpr std::array<std::string_view, 6> kResultNames = {
    "ok", "invalid", "bad_connection_id", "refused", "failed", "unverified"};

}  // namespace

UdpServer::UdpServer(asio::io_context& ioc, TrackerService& service, Access& access,
                     prometheus::Registry& registry)
    : socket_(ioc), service_(service), access_(access) {
  auto& family = prometheus::BuildCounter()
                     .Name("shoal_tracker_udp_requests_total")
                     .Help("UDP tracker datagrams (BEP 15), by action and result: ok, invalid "
                           "(malformed), bad_connection_id (an id this cluster did not issue), "
                           "refused (no accepted announce key), failed (tracker full), "
                           "unverified (an open tracker answered an unknown id, in as many "
                           "bytes as it was sent)")
                     .Register(registry);
  for (UdpAction a : {UdpAction::kConnect, UdpAction::kAnnounce, UdpAction::kScrape,
                      UdpAction::kError}) {
    for (size_t r = 0; r < kResults; ++r) {
      counted_[static_cast<size_t>(a)][r] = &family.Add(
          {{"action", std::string(UdpActionName(a))}, {"result", std::string(kResultNames[r])}});
    }
  }
  send_failures_ = &prometheus::BuildCounter()
                        .Name("shoal_tracker_udp_send_failures_total")
                        .Help("UDP answers the socket would not take (buffer full), dropped")
                        .Register(registry)
                        .Add({});
}

Result<uint16_t> UdpServer::Listen(const std::string& address, uint16_t port) {
  boost::system::error_code ec;
  auto ip = asio::ip::make_address(address, ec);
  if (ec) return MakeError(ErrorCode::kInvalidArgument, "bad listen address \"" + address + "\"");
  udp::endpoint ep(ip, port);
  socket_.open(ep.protocol(), ec);
  if (!ec) socket_.bind(ep, ec);
  if (!ec) socket_.non_blocking(true, ec);
  if (ec) {
    boost::system::error_code ignored;
    socket_.close(ignored);
    return MakeError(ErrorCode::kIo, "cannot bind UDP " + address + ":" + std::to_string(port) +
                                         ": " + ec.message());
  }
  // A burst of announces (a cold pull's chunk publishes) waits in the socket's receive buffer
  // while the thread answers others; a full buffer drops datagrams and libtorrent re-sends only
  // after seconds. Ask for 4 MiB (the kernel caps it at net.core.rmem_max).
  boost::system::error_code opt_ec;
  socket_.set_option(asio::socket_base::receive_buffer_size(4 << 20), opt_ec);
  asio::socket_base::receive_buffer_size got;
  socket_.get_option(got, opt_ec);
  if (!opt_ec && got.value() < (4 << 20)) {
    spdlog::info("UDP announce socket: {} KiB receive buffer (net.core.rmem_max caps it; 4 MiB "
                 "absorbs larger bursts)",
                 got.value() / 1024);
  }
  return socket_.local_endpoint().port();
}

void UdpServer::Start() { WaitReadable(); }

void UdpServer::Stop() {
  stopped_ = true;
  boost::system::error_code ec;
  socket_.close(ec);
}

void UdpServer::WaitReadable() {
  socket_.async_wait(udp::socket::wait_read, [this](boost::system::error_code ec) {
    if (ec || stopped_) return;
    Drain();
    WaitReadable();
  });
}

void UdpServer::Drain() {
  for (int i = 0; i < kBatch; ++i) {
    udp::endpoint from;
    boost::system::error_code ec;
    size_t n = socket_.receive_from(asio::buffer(buffer_), from, 0, ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) return;
    if (ec) {
      // An ICMP error for an earlier answer, or a closed socket: nothing to answer.
      if (ec == asio::error::bad_descriptor) return;
      continue;
    }
    std::optional<std::string> answer =
        Answer(std::string_view(buffer_.data(), n), from, TrackerClock::now());
    if (!answer) continue;
    socket_.send_to(asio::buffer(*answer), from, 0, ec);
    if (ec) send_failures_->Increment();
  }
}

void UdpServer::Count(UdpAction action, Result_ result) {
  counted_[static_cast<size_t>(action)][result]->Increment();
}

const std::vector<UdpSecret>& UdpServer::Keys(TimePoint now) {
  const auto& current = access_.agent_secrets();
  const bool expired = !retired_.empty() && retired_.front().second <= now;
  if (current == current_ && !expired) return keys_;
  for (const UdpSecret& k : current_) {
    if (std::find(current.begin(), current.end(), k) == current.end())
      retired_.emplace_back(k, now + kRetiredKeyTtl);
  }
  std::erase_if(retired_, [&](const auto& r) {
    return r.second <= now || std::find(current.begin(), current.end(), r.first) != current.end();
  });
  current_ = current;
  keys_ = current_;
  for (const auto& [k, until] : retired_) keys_.push_back(k);
  return keys_;
}

std::optional<std::string> UdpServer::Refusal(std::string_view url_data) {
  if (access_.open()) return std::nullopt;
  const size_t q = url_data.find('?');
  const std::string_view query = q == std::string_view::npos ? "" : url_data.substr(q + 1);
  const std::string_view key = AnnounceKeyOf(query);
  if (key.empty()) {
    access_.CountRefused("announce", Access::Verdict::kMissing);
    return "this tracker needs an agent's announce key: udp://<tracker>/announce?auth=<key>";
  }
  if (!access_.CheckAnnounceKey(key)) {
    access_.CountRefused("announce", Access::Verdict::kInvalid);
    return RefusalText(Access::Verdict::kInvalid, Role::kAgent);
  }
  return std::nullopt;
}

std::optional<std::string> UdpServer::Answer(std::string_view datagram, const udp::endpoint& from,
                                             TimePoint now) {
  const PeerEndpoint sender = PeerEndpoint::FromAddress(from.address(), from.port());
  const auto wall = std::chrono::system_clock::now();
  const std::vector<UdpSecret>& secrets = Keys(now);
  // A sender whose id this cluster issued in the last minutes receives at its address; anyone
  // else may be forging it, so what they get back is never larger than what they sent.
  auto cap = [&](bool verified) { return verified ? kMaxUdpAnswerBytes : datagram.size(); };
  auto parsed = ParseUdpRequest(datagram);
  if (!parsed) {
    Count(UdpAction::kError, kInvalid);
    std::optional<UdpHeader> head = PeekUdpHeader(datagram);
    if (!head) return std::nullopt;
    return EncodeUdpError(head->transaction_id, parsed.error().message,
                          cap(ids_.Valid(secrets, head->connection_id, sender, wall)));
  }
  UdpRequest& req = parsed.value();
  if (req.action == UdpAction::kConnect) {
    Count(UdpAction::kConnect, kOk);
    return EncodeUdpConnect(req.transaction_id, ids_.Issue(secrets, sender, wall));
  }
  const bool verified = ids_.Valid(secrets, req.connection_id, sender, wall);
  if (!verified && !access_.open()) {
    // libtorrent keeps an id for 60 s and would time out on silence: tell it at once.
    Count(req.action, kBadConnectionId);
    return EncodeUdpError(req.transaction_id,
                          "connection id not issued by this cluster's trackers in the last "
                          "minutes: connect again",
                          datagram.size());
  }
  if (req.action == UdpAction::kScrape) {
    if (!access_.open()) {
      access_.CountRefused("scrape", Access::Verdict::kMissing);
      Count(UdpAction::kScrape, kRefused);
      return EncodeUdpError(req.transaction_id,
                            "a UDP scrape carries no announce key: scrape over HTTP with "
                            "/scrape?auth=<key>");
    }
    std::vector<SwarmCounts> counts;
    for (const InfoHash& h : req.scrape) counts.push_back(service_.table().Counts(h));
    service_.metrics().scrapes.Increment();
    Count(UdpAction::kScrape, kOk);
    return EncodeUdpScrape(req.transaction_id, counts);  // 12 bytes per 20 asked for
  }
  if (std::optional<std::string> refusal = Refusal(req.url_data)) {
    Count(UdpAction::kAnnounce, kRefused);
    return EncodeUdpError(req.transaction_id, *refusal);
  }
  auto outcome = service_.Register(req.announce, from.address(), now);
  if (!outcome) {
    Count(UdpAction::kAnnounce, kFailed);
    return EncodeUdpError(req.transaction_id, outcome.error().message, cap(verified));
  }
  Count(UdpAction::kAnnounce, verified ? kOk : kUnverified);
  return EncodeUdpAnnounce(req.transaction_id, outcome.value().reply, outcome.value().interval,
                           sender.is_v6(), cap(verified));
}

}  // namespace shoal::tracker
