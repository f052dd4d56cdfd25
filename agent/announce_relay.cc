#include "agent/announce_relay.h"

#include <utility>

#include <algorithm>
#include <array>
#include <charconv>
#include <optional>
#include <stdexcept>
#include <string_view>

#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include "agent/notifier.h"
#include "lib/core/base64.h"
#include "lib/swarm/bencode.h"

namespace shoal::agent {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using asio::awaitable;
using asio::use_awaitable;
using asio::ip::tcp;

namespace {

// libtorrent's announces are about 300 bytes of query; nothing else is served here.
constexpr uint32_t kHeaderLimit = 8 * 1024;
// A libtorrent announce waits at most this long for its batch (libtorrent gives up after its
// tracker_receive_timeout, 10 s by default, and tries the next tier).
constexpr auto kAnswerWithin = std::chrono::seconds(30);
// A connection must have sent its whole request within this (libtorrent sends it at once).
constexpr auto kReadWithin = std::chrono::seconds(5);
// Connections served at once; beyond, new ones are closed at accept (libtorrent holds at most
// max_concurrent_http_announces, 4,096 in batch mode).
constexpr size_t kMaxConnections = 8192;

std::string Failure(std::string_view reason) {
  return swarm::Bencode::Dict().Set("failure reason", reason).Encode();
}

// The value of `name` in a query ("a=1&b=2"), empty when absent.
std::string_view ParamValue(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view param = query.substr(0, amp);
    if (param.size() > name.size() && param.substr(0, name.size()) == name &&
        param[name.size()] == '=') {
      return param.substr(name.size() + 1);
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return {};
}

// The value of `name` in a query, and the query without that parameter.
std::pair<std::string_view, std::string> TakeParam(std::string_view query, std::string_view name) {
  const std::string_view value = ParamValue(query, name);
  std::string rest;
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view param = query.substr(0, amp);
    const bool named = param.size() > name.size() && param.substr(0, name.size()) == name &&
                       param[name.size()] == '=';
    if (!named && !param.empty()) {
      if (!rest.empty()) rest += '&';
      rest += param;
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return {value, std::move(rest)};
}

// Whether the announce should leave at once: a torrent starting (a leaseholder's new seed
// included: the only holder of a chunk just published) or still downloading (left > 0) wants
// peers or is wanted now, and a completed one makes this node a seeder that others are told of
// (a leecher is offered seeders first). Stopped, paused and a seeder's periodic announces can
// wait for company.
bool Urgent(std::string_view query) {
  const std::string_view event = ParamValue(query, "event");
  if (event == "started" || event == "completed") return true;
  if (event == "stopped" || event == "paused") return false;
  return ParamValue(query, "left") != "0";
}

}  // namespace

struct AnnounceRelay::Pending {
  explicit Pending(asio::any_io_executor ex) : done(std::move(ex)) {}
  std::string query;
  std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now();
  bool urgent = false;
  bool answered = false;
  std::string reply;  // bencoded
  Notifier done;
};

struct AnnounceRelay::Queue {
  explicit Queue(asio::any_io_executor ex) : wake(std::move(ex)) {}
  std::deque<std::shared_ptr<Pending>> waiting;
  Notifier wake;
};

AnnounceRelay::AnnounceRelay(asio::io_context& ioc, TrackerClient& tracker,
                             AnnounceRelayOptions options)
    : ioc_(ioc), tracker_(tracker), options_(options), acceptor_(ioc) {
  std::array<unsigned char, 16> raw{};
  if (RAND_bytes(raw.data(), static_cast<int>(raw.size())) != 1) {
    throw std::runtime_error("announce relay: RAND_bytes failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned char c : raw) {
    key_ += kHex[c >> 4];
    key_ += kHex[c & 15];
  }
  options_.max_batch = std::max<size_t>(1, options_.max_batch);
}

AnnounceRelay::~AnnounceRelay() { Stop(); }

Status AnnounceRelay::Start(const std::string& address) {
  boost::system::error_code ec;
  asio::ip::address ip = asio::ip::make_address(address, ec);
  if (ec) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "announce relay: \"" + address + "\" is not an IP address");
  }
  host_ = ip.is_v6() ? "[" + ip.to_string() + "]" : ip.to_string();
  tcp::endpoint ep(ip, 0);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return MakeError(ErrorCode::kUnavailable, "announce relay: cannot listen: " + ec.message());
  port_ = acceptor_.local_endpoint().port();
  for (size_t r = 0; r < tracker_.replicas(); ++r) {
    queues_.push_back(std::make_unique<Queue>(ioc_.get_executor()));
    asio::co_spawn(ioc_, SendLoop(r), asio::detached);
  }
  asio::co_spawn(ioc_, AcceptLoop(), asio::detached);
  asio::co_spawn(ioc_, ReportLoop(), asio::detached);
  spdlog::info("announce relay on {}:{}: chunk torrents announce to it, and it sends "
               "their announces to the trackers in batches",
               host_, port_);
  return Ok();
}

void AnnounceRelay::SendAtOnce() {
  at_once_ = true;
  for (auto& q : queues_) q->wake.NotifyAll();
}

void AnnounceRelay::Stop() {
  if (!*alive_) return;
  *alive_ = false;
  if (stats_.announces > 0) LogStats(Stats{}, stats_, "since start");
  boost::system::error_code ec;
  acceptor_.close(ec);
  for (auto& q : queues_) {
    for (auto& p : q->waiting) {
      p->reply = Failure("the agent is stopping");
      p->answered = true;
      p->done.NotifyAll();
    }
    q->waiting.clear();
    q->wake.NotifyAll();
  }
}

std::string AnnounceRelay::Url(size_t replica) const {
  return "http://" + host_ + ":" + std::to_string(port_) + "/announce/" +
         std::to_string(replica) + "?auth=" + key_;
}

awaitable<void> AnnounceRelay::AcceptLoop() {
  auto alive = alive_;
  while (*alive) {
    boost::system::error_code ec;
    tcp::socket socket =
        co_await acceptor_.async_accept(asio::redirect_error(use_awaitable, ec));
    if (!*alive) co_return;
    if (ec) {
      if (ec == asio::error::operation_aborted) co_return;
      continue;  // EMFILE and the like: the next announce retries
    }
    // Only this node's libtorrent announces here, from the relay's own address (or loopback):
    // nobody else on the network holds a connection or reads a byte. A full relay sheds.
    boost::system::error_code rec;
    const asio::ip::address from = socket.remote_endpoint(rec).address();
    if (rec || (from != acceptor_.local_endpoint(rec).address() && !from.is_loopback()) ||
        connections_ >= kMaxConnections) {
      ++stats_.refused;
      socket.close(rec);
      continue;
    }
    asio::co_spawn(ioc_, Serve(std::move(socket)), asio::detached);
  }
}

awaitable<void> AnnounceRelay::Serve(tcp::socket socket) {
  auto alive = alive_;
  ++connections_;
  struct Count {
    size_t& n;
    std::shared_ptr<bool> alive;
    ~Count() {
      if (*alive) --n;
    }
  } count{connections_, alive};
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  bhttp::request_parser<bhttp::empty_body> parser;
  parser.header_limit(kHeaderLimit);
  parser.body_limit(0);
  boost::system::error_code ec;
  stream.expires_after(kReadWithin);
  co_await bhttp::async_read(stream, buffer, parser, asio::redirect_error(use_awaitable, ec));
  stream.expires_never();
  if (ec || !*alive) co_return;
  const auto& req = parser.get();
  std::string_view target = req.target();
  size_t q = target.find('?');
  std::string_view path = target.substr(0, q);
  std::string_view query = q == std::string_view::npos ? std::string_view() : target.substr(q + 1);
  auto [key, rest] = TakeParam(query, "auth");

  std::string body;
  size_t replica = queues_.size();
  constexpr std::string_view kPrefix = "/announce/";
  if (path.substr(0, kPrefix.size()) == kPrefix) {
    std::string_view digits = path.substr(kPrefix.size());
    size_t r = 0;
    auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), r);
    if (err == std::errc() && end == digits.data() + digits.size() && !digits.empty()) replica = r;
  }
  if (req.method() != bhttp::verb::get || replica >= queues_.size()) {
    body = Failure("this is the agent's announce relay: GET /announce/<replica>?auth=<key>&...");
    ++stats_.failed;
  } else if (key != key_) {
    body = Failure("announce relay: wrong or missing key");
    ++stats_.failed;
  } else if (rest.empty()) {
    body = Failure("announce relay: no announce parameters");
    ++stats_.failed;
  } else {
    auto pending = std::make_shared<Pending>(ioc_.get_executor());
    pending->urgent = Urgent(rest);
    pending->query = std::move(rest);
    Queue& queue = *queues_[replica];
    queue.waiting.push_back(pending);
    queue.wake.NotifyAll();
    const auto deadline = std::chrono::steady_clock::now() + kAnswerWithin;
    while (!pending->answered && *alive && std::chrono::steady_clock::now() < deadline) {
      co_await pending->done.Wait(deadline - std::chrono::steady_clock::now());
    }
    if (!*alive) co_return;
    body = pending->answered ? std::move(pending->reply)
                             : Failure("announce relay: the tracker did not answer in time");
  }
  bhttp::response<bhttp::string_body> res{bhttp::status::ok, req.version()};
  res.set(bhttp::field::content_type, "text/plain");
  res.keep_alive(false);
  res.body() = std::move(body);
  res.prepare_payload();
  stream.expires_after(kReadWithin);
  co_await bhttp::async_write(stream, res, asio::redirect_error(use_awaitable, ec));
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
}

void AnnounceRelay::LogStats(const Stats& from, const Stats& to, std::string_view when) {
  const uint64_t n = to.announces - from.announces;
  spdlog::info(
      "announce relay: {} announces in {} batches {} (mean wait {:.1f} ms, longest so far {:.1f} "
      "ms), {} answered with a failure",
      n, to.batches - from.batches, when,
      n ? static_cast<double>(to.wait_us - from.wait_us) / 1000.0 / static_cast<double>(n) : 0.0,
      static_cast<double>(to.max_wait_us) / 1000.0, to.failed - from.failed);
}

awaitable<void> AnnounceRelay::ReportLoop() {
  auto alive = alive_;
  Stats last;
  asio::steady_timer timer(ioc_);
  while (*alive) {
    timer.expires_after(std::chrono::seconds(60));
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
    if (!*alive) co_return;
    const Stats now = stats_;
    if (now.announces != last.announces || now.failed != last.failed) {
      LogStats(last, now, "in the last minute");
    }
    last = now;
  }
}

awaitable<void> AnnounceRelay::SendLoop(size_t replica) {
  auto alive = alive_;
  Queue& queue = *queues_[replica];
  std::optional<std::chrono::steady_clock::time_point> oldest;  // of the waiting announces
  while (*alive) {
    if (queue.waiting.empty()) {
      oldest.reset();
      co_await queue.wake.Wait();
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!oldest) oldest = now;
    const bool urgent = at_once_ || std::any_of(queue.waiting.begin(), queue.waiting.end(),
                                                [](const auto& p) { return p->urgent; });
    if (!urgent && queue.waiting.size() < options_.max_batch && now < *oldest + options_.linger) {
      co_await queue.wake.Wait(*oldest + options_.linger - now);
      continue;
    }
    std::vector<std::shared_ptr<Pending>> batch;
    std::string lines;
    while (!queue.waiting.empty() && batch.size() < options_.max_batch) {
      batch.push_back(std::move(queue.waiting.front()));
      queue.waiting.pop_front();
      lines += batch.back()->query;
      lines += '\n';
    }
    oldest.reset();
    if (!queue.waiting.empty()) oldest = now;
    auto reply = co_await tracker_.AnnounceBatch(replica, std::move(lines));
    if (!*alive) co_return;
    std::vector<std::string> replies;
    std::string failure;
    if (!reply) {
      failure = reply.error().message;
    } else {
      std::string_view text = reply.value();
      while (!text.empty()) {
        size_t nl = text.find('\n');
        auto decoded = Base64Decode(text.substr(0, nl));
        if (!decoded) break;
        replies.push_back(std::move(*decoded));
        if (nl == std::string_view::npos) break;
        text.remove_prefix(nl + 1);
      }
      if (replies.size() != batch.size()) {
        failure = "the tracker answered " + std::to_string(replies.size()) +
                  " announces of a batch of " + std::to_string(batch.size());
        replies.clear();
      }
    }
    if (failure.empty()) {
      ++stats_.batches;
      stats_.announces += batch.size();
    } else {
      stats_.failed += batch.size();
      spdlog::debug("announce relay: a batch of {} to tracker replica {} failed: {}", batch.size(),
                    replica, failure);
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i]->reply = failure.empty() ? std::move(replies[i])
                                        : Failure("tracker replica did not take the batch: " +
                                                  failure);
      batch[i]->answered = true;
      batch[i]->done.NotifyAll();
      if (failure.empty()) {
        const auto us = static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                                  batch[i]->arrived)
                .count());
        stats_.wait_us += us;
        stats_.max_wait_us = std::max(stats_.max_wait_us, us);
      }
    }
  }
}

}  // namespace shoal::agent
