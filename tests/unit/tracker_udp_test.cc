// tracker/swarms/udp_protocol.* and tracker/udp_server.*: BEP 15 datagrams as libtorrent 2.0.8
// sends them (connect, announce with BEP 41 URL data, scrape), connection ids bound to the
// sender and the minute, and UdpServer::Answer's rules: no answer but a connect's without a valid
// id, the announce key checked like HTTP's, peers of the sender's family.

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <prometheus/registry.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/endian/conversion.hpp>

#include "lib/auth/tokens.h"
#include "tracker/access.h"
#include "tracker/swarms/service.h"
#include "tracker/swarms/udp_protocol.h"
#include "tracker/udp_server.h"

namespace shoal::tracker {
namespace {

using boost::asio::ip::udp;
const std::string kAgent = "agent-token-udp-0123456789";

template <typename T>
void Put(std::string& out, T v) {
  v = boost::endian::native_to_big(v);
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T Get(std::string_view in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  return boost::endian::big_to_native(v);
}

std::string Connect(uint32_t transaction) {
  std::string d;
  Put<uint64_t>(d, kUdpProtocolId);
  Put<uint32_t>(d, 0);
  Put<uint32_t>(d, transaction);
  return d;
}

// An announce laid out as libtorrent's udp_tracker_connection::send_udp_announce writes it.
std::string Announce(uint64_t connection, uint32_t transaction, char hash, char peer, uint64_t left,
                     uint32_t event, uint16_t port, std::string_view url_data,
                     int32_t num_want = -1) {
  std::string d;
  Put<uint64_t>(d, connection);
  Put<uint32_t>(d, 1);
  Put<uint32_t>(d, transaction);
  d.append(20, hash);
  d.append(20, peer);
  Put<uint64_t>(d, 0);     // downloaded
  Put<uint64_t>(d, left);  // left
  Put<uint64_t>(d, 0);     // uploaded
  Put<uint32_t>(d, event);
  Put<uint32_t>(d, 0);  // ip
  Put<uint32_t>(d, 7);  // key
  Put<uint32_t>(d, static_cast<uint32_t>(num_want));
  Put<uint16_t>(d, port);
  if (!url_data.empty()) {
    d += char(2);
    d += static_cast<char>(url_data.size());
    d.append(url_data);
  }
  return d;
}

struct Fixture {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("shoal-udp-" + std::to_string(::getpid()));
  prometheus::Registry registry;
  boost::asio::io_context ioc;
  TrackerService service{ServiceOptions{}, registry, 1};
  std::optional<Access> access;
  std::optional<UdpServer> server;
  TimePoint now = TrackerClock::now();
  std::string key = auth::AnnounceKey(kAgent);

  explicit Fixture(bool open = false) {
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "agents") << kAgent << "\n";
    AccessOptions o;
    if (open) {
      o.insecure_open = true;
    } else {
      o.agent_tokens_file = (dir / "agents").string();
    }
    access.emplace(std::move(Access::Create(o, registry).value()));
    server.emplace(ioc, service, *access, registry);
  }
  ~Fixture() { std::filesystem::remove_all(dir); }

  uint64_t Id(const udp::endpoint& from) {
    auto a = server->Answer(Connect(9), from, now);
    REQUIRE(a);
    REQUIRE(a->size() == 16);
    CHECK(Get<uint32_t>(*a, 0) == 0);
    CHECK(Get<uint32_t>(*a, 4) == 9);
    return Get<uint64_t>(*a, 8);
  }
};

udp::endpoint V4(const char* ip, uint16_t port) {
  return udp::endpoint(boost::asio::ip::make_address(ip), port);
}

}  // namespace

TEST_CASE("udp tracker: a datagram parses as libtorrent lays it out, and bad ones say why") {
  auto c = ParseUdpRequest(Connect(5));
  REQUIRE(c);
  CHECK(c.value().action == UdpAction::kConnect);
  CHECK(c.value().transaction_id == 5);

  auto a = ParseUdpRequest(Announce(42, 6, 'h', 'p', 100, 2, 6881, "/announce?auth=abc", 3));
  REQUIRE(a);
  CHECK(a.value().action == UdpAction::kAnnounce);
  CHECK(a.value().connection_id == 42);
  CHECK(a.value().announce.info_hash.bytes() == std::string(20, 'h'));
  CHECK(a.value().announce.left == 100);
  CHECK(a.value().announce.event == AnnounceEvent::kStarted);
  CHECK(a.value().announce.port == 6881);
  CHECK(a.value().announce.numwant == 3u);
  CHECK(a.value().url_data == "/announce?auth=abc");
  // Several URL data options are one string (BEP 41); NOP and end-of-options are understood.
  std::string split = Announce(42, 6, 'h', 'p', 0, 0, 1, "/ann");
  split += std::string("\x01\x02\x06ounce?\x00junk", 12);
  auto s = ParseUdpRequest(split);
  REQUIRE(s);
  CHECK(s.value().url_data == "/announce?");
  CHECK_FALSE(s.value().announce.numwant.has_value());

  auto err = [](const std::string& d) {
    auto r = ParseUdpRequest(d);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == ErrorCode::kInvalidArgument);
    return r.error().message;
  };
  CHECK(err("short").find("shorter than a request header") != std::string::npos);
  std::string wrong = Connect(1);
  wrong[7] ^= 1;
  CHECK(err(wrong) == "connect without BEP 15's protocol id");
  CHECK(err(Announce(1, 1, 'h', 'p', 0, 0, 1, "").substr(0, 50)).find("shorter") !=
        std::string::npos);
  CHECK(err(Announce(1, 1, 'h', 'p', 0, 4, 1, "")) == "announce event 4 is not 0-3");
  CHECK(err(Announce(1, 1, 'h', 'p', ~uint64_t{0}, 0, 1, "")) == "announce left is negative");
  CHECK(err(Announce(1, 1, 'h', 'p', 0, 0, 0, "")) == "announce port is 0");
  std::string cut = Announce(1, 1, 'h', 'p', 0, 0, 1, "/announce");
  cut.pop_back();
  CHECK(err(cut).find("URL data option says 9 bytes, 8 follow") != std::string::npos);
  CHECK(err(Announce(1, 1, 'h', 'p', 0, 0, 1, "") + "\x07").find("option type 7") !=
        std::string::npos);
  std::string scrape;
  Put<uint64_t>(scrape, 1);
  Put<uint32_t>(scrape, 2);
  Put<uint32_t>(scrape, 3);
  CHECK(err(scrape).find("not a whole number of info-hashes") != std::string::npos);
  CHECK(err(scrape + std::string(75 * 20, 'x')).find("more than 74") != std::string::npos);
  auto ok = ParseUdpRequest(scrape + std::string(40, 'y'));
  REQUIRE(ok);
  CHECK(ok.value().scrape.size() == 2);
  std::string action = Connect(1);
  action[11] = 9;
  CHECK(err(action) == "action 9 is not connect, announce or scrape");
}

TEST_CASE("udp tracker: connection ids belong to one sender address, last two minutes and hold "
          "on every replica with the same tokens") {
  UdpSecret current{}, previous{}, other{};
  current[0] = 1;
  previous[0] = 2;
  other[0] = 3;
  const std::vector<UdpSecret> secrets = {current, previous};
  UdpConnectionIds ids, replica;  // two processes: own keys differ, the tokens' do not
  PeerEndpoint a = PeerEndpoint::FromV4({127, 0, 0, 1}, 6881);
  PeerEndpoint b = PeerEndpoint::FromV4({127, 0, 0, 2}, 6881);
  PeerEndpoint a_other_port = PeerEndpoint::FromV4({127, 0, 0, 1}, 6882);
  std::chrono::system_clock::time_point t{std::chrono::minutes(29'000'000)};
  uint64_t id = ids.Issue(secrets, a, t);
  CHECK(ids.Valid(secrets, id, a, t));
  CHECK(replica.Valid(secrets, id, a, t));  // another replica, or this one restarted
  CHECK(ids.Valid(secrets, id, a, t + std::chrono::seconds(119)));
  CHECK(ids.Valid(secrets, id, a, t - std::chrono::seconds(60)));  // a replica's clock behind
  CHECK_FALSE(ids.Valid(secrets, id, a, t + std::chrono::seconds(120)));
  CHECK_FALSE(ids.Valid(secrets, id, b, t));
  CHECK(ids.Valid(secrets, id, a_other_port, t));  // a NAT may move the sender's port
  // Issued under the previous token: still good while the tokens file lists it.
  const std::vector<UdpSecret> before = {previous};
  CHECK(ids.Valid(secrets, ids.Issue(before, a, t), a, t));
  const std::vector<UdpSecret> others = {other};
  CHECK_FALSE(ids.Valid(others, id, a, t));  // another cluster's tokens
  // Without tokens each process has its own key.
  uint64_t own = ids.Issue({}, a, t);
  CHECK(ids.Valid({}, own, a, t));
  CHECK_FALSE(replica.Valid({}, own, a, t));
}

TEST_CASE("udp tracker: only a sender with its connection id and the announce key is registered") {
  Fixture f;
  udp::endpoint me = V4("127.0.0.5", 40000);
  const std::string url = "/announce?auth=" + f.key;
  // No connection id: an error no larger than the request, and nothing registered.
  const std::string unknown = Announce(123, 1, 'h', 'p', 5, 2, 6881, url);
  auto no_id = f.server->Answer(unknown, me, f.now);
  REQUIRE(no_id);
  CHECK(Get<uint32_t>(*no_id, 0) == 3);
  CHECK(no_id->find("connection id not issued") != std::string::npos);
  CHECK(no_id->size() <= unknown.size());
  uint64_t id = f.Id(me);
  // Someone else's id (another address) is as good as none.
  auto stolen = f.server->Answer(Announce(id, 1, 'h', 'p', 5, 2, 6881, url),
                                 V4("127.0.0.6", 40000), f.now);
  REQUIRE(stolen);
  CHECK(Get<uint32_t>(*stolen, 0) == 3);
  CHECK(f.service.table().totals().peers == 0);
  // Garbage gets the reason; a sender without an id only as many bytes as it sent.
  std::string bad = Announce(id, 77, 'h', 'p', 5, 9, 6881, url);
  auto why = f.server->Answer(bad, me, f.now);
  REQUIRE(why);
  CHECK(Get<uint32_t>(*why, 0) == 3);
  CHECK(Get<uint32_t>(*why, 4) == 77);
  CHECK(why->substr(8) == "announce event 9 is not 0-3");
  std::string tiny = Connect(5);
  tiny[11] = 7;  // action 7, 16 bytes
  auto tiny_why = f.server->Answer(tiny, V4("127.0.0.6", 40000), f.now);
  REQUIRE(tiny_why);
  CHECK(tiny_why->size() == 16);
  CHECK_FALSE(f.server->Answer("short", me, f.now));
  // Without the key, or with a wrong one: an error answer, nothing registered.
  auto missing = f.server->Answer(Announce(id, 2, 'h', 'p', 5, 2, 6881, "/announce"), me, f.now);
  REQUIRE(missing);
  CHECK(Get<uint32_t>(*missing, 0) == 3);
  CHECK(missing->find("needs an agent's announce key") != std::string::npos);
  auto wrong = f.server->Answer(Announce(id, 2, 'h', 'p', 5, 2, 6881, "/announce?auth=00"), me,
                                f.now);
  REQUIRE(wrong);
  CHECK(Get<uint32_t>(*wrong, 0) == 3);
  CHECK(f.service.table().totals().peers == 0);
  // With the key: registered, and a second peer gets the first back.
  auto first = f.server->Answer(Announce(id, 3, 'h', 'p', 0, 2, 6881, url), me, f.now);
  REQUIRE(first);
  CHECK(Get<uint32_t>(*first, 0) == 1);
  CHECK(Get<uint32_t>(*first, 4) == 3);
  CHECK(Get<uint32_t>(*first, 8) >= 300);  // interval
  CHECK(first->size() == 20);              // no other peer yet
  udp::endpoint other = V4("127.0.0.7", 40001);
  uint64_t id2 = f.Id(other);
  auto second = f.server->Answer(Announce(id2, 4, 'h', 'q', 10, 2, 7000, url), other, f.now);
  REQUIRE(second);
  CHECK(Get<uint32_t>(*second, 12) == 1);  // leechers: the new one
  CHECK(Get<uint32_t>(*second, 16) == 1);  // seeders: the first (left 0)
  REQUIRE(second->size() == 26);
  CHECK(second->substr(20) == std::string("\x7f\x00\x00\x05\x1a\xe1", 6));  // 127.0.0.5:6881
  CHECK(f.service.table().totals().peers == 2);
  // A UDP scrape carries no key: refused on a closed tracker.
  std::string scrape;
  Put<uint64_t>(scrape, id);
  Put<uint32_t>(scrape, 2);
  Put<uint32_t>(scrape, 8);
  scrape.append(20, 'h');
  auto refused = f.server->Answer(scrape, me, f.now);
  REQUIRE(refused);
  CHECK(Get<uint32_t>(*refused, 0) == 3);
}

TEST_CASE("udp tracker: an open tracker scrapes, answers unknown ids in as many bytes as it was "
          "sent, and gives IPv6 senders IPv6 peers only") {
  Fixture f(/*open=*/true);
  udp::endpoint v4 = V4("127.0.0.5", 40000);
  udp::endpoint v6 = V4("2001:db8::1", 40000);
  uint64_t id4 = f.Id(v4);
  uint64_t id6 = f.Id(v6);
  REQUIRE(f.server->Answer(Announce(id4, 1, 'h', 'p', 0, 2, 6881, ""), v4, f.now));
  auto six = f.server->Answer(Announce(id6, 1, 'h', 'q', 0, 2, 6882, ""), v6, f.now);
  REQUIRE(six);
  CHECK(six->size() == 20);  // the IPv4 peer is not in an IPv6 answer
  udp::endpoint v6b = V4("2001:db8::2", 40000);
  auto six_b = f.server->Answer(Announce(f.Id(v6b), 1, 'h', 'r', 9, 2, 6883, ""), v6b, f.now);
  REQUIRE(six_b);
  CHECK(six_b->size() == 20 + 18);
  std::string scrape;
  Put<uint64_t>(scrape, id4);
  Put<uint32_t>(scrape, 2);
  Put<uint32_t>(scrape, 8);
  scrape.append(20, 'h');
  scrape.append(20, 'z');
  auto s = f.server->Answer(scrape, v4, f.now);
  REQUIRE(s);
  REQUIRE(s->size() == 8 + 2 * 12);
  CHECK(Get<uint32_t>(*s, 8) == 2);   // seeders of 'h'
  CHECK(Get<uint32_t>(*s, 16) == 1);  // leechers of 'h'
  CHECK(Get<uint32_t>(*s, 20) == 0);  // nothing for 'z'
  // An id this process did not issue (say, before a restart): answered, but truncated to the
  // request's size, so a forged sender cannot amplify.
  for (int i = 0; i < 40; ++i) {
    udp::endpoint p = V4(("127.0.1." + std::to_string(i + 1)).c_str(), 40000);
    REQUIRE(f.server->Answer(Announce(f.Id(p), 1, 'h', 'a' + i % 20, 0, 2, 6881, ""), p, f.now));
  }
  const std::string forged = Announce(12345, 5, 'h', 'Z', 9, 2, 6881, "");
  auto truncated = f.server->Answer(forged, V4("127.0.2.1", 40000), f.now);
  REQUIRE(truncated);
  CHECK(Get<uint32_t>(*truncated, 0) == 1);
  CHECK(truncated->size() <= forged.size());
  CHECK((truncated->size() - 20) % 6 == 0);
  CHECK(truncated->size() > 20);
}

TEST_CASE("udp tracker: the socket answers a burst of datagrams, each its own answer, and a "
          "datagram of garbage an error") {
  Fixture f;
  auto port = f.server->Listen("127.0.0.1", 0);
  REQUIRE(port);
  f.server->Start();
  udp::socket client(f.ioc, udp::endpoint(udp::v4(), 0));
  // Room for every answer while the server runs (the default buffer holds about 250 of them).
  client.set_option(boost::asio::socket_base::receive_buffer_size(4 << 20));
  const udp::endpoint tracker(boost::asio::ip::make_address("127.0.0.1"), port.value());
  // More connects than one wake-up of the server answers (256), then 2,500 bytes of an unknown
  // action.
  const uint32_t connects = 300;
  for (uint32_t t = 1; t <= connects; ++t) client.send_to(boost::asio::buffer(Connect(t)), tracker);
  std::string big = Connect(999);
  big[11] = 7;  // action 7
  big.resize(2500, 'x');
  client.send_to(boost::asio::buffer(big), tracker);
  // The answers, read as they come while the server's context runs (bounded: 5 s).
  std::vector<bool> seen(connects + 1, false);
  std::string garbage_answer;
  size_t answers = 0;
  std::array<char, 2048> in{};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  client.non_blocking(true);
  while (answers < connects + 1 && std::chrono::steady_clock::now() < deadline) {
    f.ioc.run_for(std::chrono::milliseconds(10));
    boost::system::error_code ec;
    udp::endpoint from;
    for (size_t n; (n = client.receive_from(boost::asio::buffer(in), from, 0, ec)), !ec;) {
      ++answers;
      std::string_view a(in.data(), n);
      const uint32_t t = Get<uint32_t>(a, 4);
      if (Get<uint32_t>(a, 0) == 0 && a.size() == 16 && t >= 1 && t <= connects) {
        CHECK_FALSE(seen[t]);
        seen[t] = true;
      } else if (Get<uint32_t>(a, 0) == 3 && t == 999) {
        garbage_answer = std::string(a.substr(8));
      } else {
        FAIL_CHECK("unexpected answer of " << n << " bytes");
      }
    }
  }
  CHECK(answers == connects + 1);
  CHECK(std::count(seen.begin() + 1, seen.end(), true) == connects);
  CHECK(garbage_answer.find("action 7") != std::string::npos);
  f.server->Stop();
}

}  // namespace shoal::tracker
