// Tracker replies decoded back with libtorrent's own decoder: what libtorrent will parse; the
// announce service, and announces in batches (tracker/swarms/batch.h).
#include <doctest/doctest.h>

#include <utility>

#include <memory>
#include <string>
#include <vector>

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <boost/asio/ip/address.hpp>
#include <libtorrent/bdecode.hpp>

#include "lib/core/base64.h"
#include "lib/http/url.h"
#include "lib/swarm/bencode.h"
#include "tracker/swarms/batch.h"
#include "tracker/swarms/response.h"
#include "tracker/swarms/service.h"

namespace shoal::tracker {
namespace {

namespace lt = libtorrent;
using std::chrono::seconds;

// A decoded reply that owns its bytes (a bdecode_node points into the buffer it was parsed
// from). The buffer is a base so that it is built before the node.
struct Buffer {
  std::unique_ptr<std::string> bytes;
};
struct Decoded : Buffer, lt::bdecode_node {
  explicit Decoded(std::string b) : Buffer{std::make_unique<std::string>(std::move(b))} {}
};

Decoded Decode(std::string bytes) {
  Decoded out(std::move(bytes));
  lt::error_code ec;
  static_cast<lt::bdecode_node&>(out) =
      lt::bdecode(lt::span<const char>(out.bytes->data(), out.bytes->size()), ec);
  REQUIRE_MESSAGE(!ec, "bdecode failed: " << ec.message() << " on " << *out.bytes);
  REQUIRE(out.type() == lt::bdecode_node::dict_t);
  return out;
}

// libtorrent 2.0.8's string_view is boost::string_view; tests compare std::strings.
std::string Str(const lt::bdecode_node& dict, const char* key) {
  auto v = dict.dict_find_string_value(key);
  return std::string(v.data(), v.size());
}

lt::string_view Key(std::string_view bytes) { return lt::string_view(bytes.data(), bytes.size()); }

std::string AnnounceQuery(const std::string& info_hash, uint16_t port, uint64_t left,
                          const std::string& extra = "") {
  return "info_hash=" + http::QueryEscape(info_hash) +
         "&peer_id=-LT2080-abcdefghijkl&port=" + std::to_string(port) +
         "&uploaded=0&downloaded=0&left=" + std::to_string(left) + "&compact=1" + extra;
}

}  // namespace

TEST_CASE("swarm bencode: encodes integers, byte strings, lists and sorted dictionaries") {
  using swarm::Bencode;
  Bencode list = Bencode::List();
  list.Append(Bencode::Int(-3)).Append(Bencode::String(std::string("a\0b", 3)));
  Bencode dict = Bencode::Dict();
  dict.Set("z", int64_t{1}).Set("a", std::string_view("x")).Set("m", std::move(list));
  CHECK(dict.Encode() == std::string("d1:a1:x1:mli-3e3:a\0be1:zi1ee", 28));
}

TEST_CASE("tracker response: announce reply has intervals, counts and compact peers") {
  AnnounceReply reply;
  reply.counts = SwarmCounts{3, 4, 5};
  reply.peers.push_back(PeerEndpoint::FromV4({127, 0, 0, 1}, 6881));
  reply.peers.push_back(
      PeerEndpoint::FromV6({0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 443));
  reply.peers.push_back(PeerEndpoint::FromV4({10, 1, 2, 3}, 80));
  std::string body = EncodeAnnounceReply(reply, seconds(300), seconds(60), "careful");
  Decoded d = Decode(body);
  CHECK(d.dict_find_int_value("interval") == 300);
  CHECK(d.dict_find_int_value("min interval") == 60);
  CHECK(d.dict_find_int_value("complete") == 3);
  CHECK(d.dict_find_int_value("incomplete") == 4);
  CHECK(Str(d, "peers") == std::string("\x7f\x00\x00\x01\x1a\xe1\x0a\x01\x02\x03\x00\x50", 12));
  auto peers6 = Str(d, "peers6");
  REQUIRE(peers6.size() == 18);
  CHECK(peers6.substr(16) == std::string("\x01\xbb", 2));
  CHECK(Str(d, "warning message") == "careful");
  CHECK_FALSE(d.dict_find("failure reason"));
}

TEST_CASE("tracker response: peers is present even when empty, no peers6 without IPv6 peers") {
  Decoded d = Decode(EncodeAnnounceReply(AnnounceReply{}, seconds(300), seconds(60)));
  lt::bdecode_node peers = d.dict_find_string("peers");
  REQUIRE(peers);
  CHECK(peers.string_value().empty());
  CHECK_FALSE(d.dict_find("peers6"));
  CHECK_FALSE(d.dict_find("warning message"));
}

TEST_CASE("tracker response: a reused encoder carries nothing over from the reply before") {
  AnnounceReplyEncoder encoder;
  AnnounceReply full;
  full.counts = SwarmCounts{7, 8, 9};
  full.peers.push_back(PeerEndpoint::FromV4({10, 0, 0, 1}, 6881));
  full.peers.push_back(
      PeerEndpoint::FromV6({0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}, 6881));
  std::string first = encoder.Encode(full, seconds(300), seconds(60), "swarm is full");
  CHECK(first == EncodeAnnounceReply(full, seconds(300), seconds(60), "swarm is full"));
  Decoded d = Decode(encoder.Encode(AnnounceReply{}, seconds(310), seconds(60)));
  CHECK(d.dict_find_int_value("interval") == 310);
  CHECK(d.dict_find_int_value("complete") == 0);
  CHECK(Str(d, "peers").empty());
  CHECK_FALSE(d.dict_find("peers6"));
  CHECK_FALSE(d.dict_find("warning message"));
  // And back: the keys come again, in bencode's sorted order, as a fresh encoder writes them.
  CHECK(encoder.Encode(full, seconds(300), seconds(60), "swarm is full") == first);
}

TEST_CASE("tracker response: failure and scrape replies") {
  Decoded f = Decode(EncodeFailure("info_hash must be 20 bytes"));
  CHECK(Str(f, "failure reason") == "info_hash must be 20 bytes");
  InfoHash a = *InfoHash::FromBytes(std::string(20, '\x01'));
  InfoHash b = *InfoHash::FromBytes(std::string(20, '\xfe'));
  Decoded s = Decode(EncodeScrapeReply({{a, SwarmCounts{1, 2, 3}}, {b, SwarmCounts{}}}));
  lt::bdecode_node files = s.dict_find_dict("files");
  REQUIRE(files);
  CHECK(files.dict_size() == 2);
  lt::bdecode_node fa = files.dict_find_dict(Key(a.bytes()));
  REQUIRE(fa);
  CHECK(fa.dict_find_int_value("complete") == 1);
  CHECK(fa.dict_find_int_value("incomplete") == 2);
  CHECK(fa.dict_find_int_value("downloaded") == 3);
  REQUIRE(files.dict_find_dict(Key(b.bytes())));
}

TEST_CASE("tracker service: uses the TCP source address and ignores ip= unless trusted") {
  prometheus::Registry registry;
  TrackerService service({}, registry, 42);
  auto now = TrackerClock::now();
  std::string ih(20, 'i');
  auto seeder = boost::asio::ip::make_address("10.0.0.5");
  auto leecher = boost::asio::ip::make_address("10.0.0.6");
  Decode(service.Announce(AnnounceQuery(ih, 7000, 0, "&ip=192.0.2.1"), seeder, now));
  Decoded d = Decode(service.Announce(AnnounceQuery(ih, 7001, 9), leecher, now));
  CHECK(Str(d, "peers") == std::string("\x0a\x00\x00\x05\x1b\x58", 6));
  auto interval = d.dict_find_int_value("interval");
  CHECK(interval >= 300);
  CHECK(interval <= 330);
  CHECK(d.dict_find_int_value("min interval") == 60);
  CHECK(service.table().options().peer_ttl == seconds(2 * 330 + 60));

  prometheus::Registry registry2;
  ServiceOptions trusting;
  trusting.trust_ip_param = true;
  TrackerService proxied(trusting, registry2, 42);
  Decode(proxied.Announce(AnnounceQuery(ih, 7000, 0, "&ip=192.0.2.1"), seeder, now));
  Decoded p = Decode(proxied.Announce(AnnounceQuery(ih, 7001, 9), leecher, now));
  CHECK(Str(p, "peers") == std::string("\xc0\x00\x02\x01\x1b\x58", 6));
  Decoded bad = Decode(proxied.Announce(AnnounceQuery(ih, 7002, 9, "&ip=not-an-ip"), leecher, now));
  CHECK(Str(bad, "failure reason").find("not-an-ip") != std::string::npos);
}

TEST_CASE("tracker service: IPv6 peers go to peers6, failures are bencoded, scrape counts") {
  prometheus::Registry registry;
  TrackerService service({}, registry, 42);
  auto now = TrackerClock::now();
  std::string ih(20, 'j');
  auto v6 = boost::asio::ip::make_address("2001:db8::7");
  auto mapped = boost::asio::ip::make_address("::ffff:10.0.0.9");
  Decode(service.Announce(AnnounceQuery(ih, 7000, 0), v6, now));
  Decoded d = Decode(service.Announce(AnnounceQuery(ih, 7001, 5), mapped, now));
  CHECK(Str(d, "peers").empty());
  CHECK(Str(d, "peers6").size() == 18);
  Decoded back = Decode(service.Announce(AnnounceQuery(ih, 7000, 0), v6, now));
  // The IPv4-mapped client is stored as plain IPv4.
  CHECK(Str(back, "peers") == std::string("\x0a\x00\x00\x09\x1b\x59", 6));

  Decoded f = Decode(service.Announce("info_hash=x", v6, now));
  CHECK(Str(f, "failure reason") == "info_hash must be 20 bytes once decoded, got 1");

  Decoded s = Decode(service.Scrape("info_hash=" + http::QueryEscape(ih)));
  lt::bdecode_node file = s.dict_find_dict("files").dict_find_dict(ih);
  REQUIRE(file);
  CHECK(file.dict_find_int_value("complete") == 1);
  CHECK(file.dict_find_int_value("incomplete") == 1);
  CHECK(Decode(service.Scrape("")).dict_find_string("failure reason"));

  std::string page = service.StatusPage(true);
  CHECK(page.find("swarms 1, peers 2 (seeders 1, leechers 1)") != std::string::npos);
  CHECK(page.find(InfoHash::FromBytes(ih)->hex()) != std::string::npos);

  service.UpdateGauges();
  std::string metrics = prometheus::TextSerializer().Serialize(registry.Collect());
  CHECK(metrics.find("shoal_tracker_peers 2") != std::string::npos);
  CHECK(metrics.find("shoal_tracker_announces_total{event=\"none\"} 3") != std::string::npos);
  CHECK(metrics.find("shoal_tracker_announce_failures_total{reason=\"invalid\"} 1") !=
        std::string::npos);
}

TEST_CASE("tracker announce batch: each line is answered in order as GET /announce would") {
  prometheus::Registry registry;
  TrackerService service({}, registry, 42);
  auto now = TrackerClock::now();
  std::string ih(20, 'k');
  auto node = boost::asio::ip::make_address("10.0.0.7");
  // A seeder, then a leecher on another port of the same node, then a query that does not
  // parse: the leecher gets the seeder, the bad line gets its own failure, the others stand.
  std::string body = AnnounceQuery(ih, 7000, 0, "&event=completed&auth=ignored") + "\n" +
                     AnnounceQuery(ih, 7001, 9, "&event=started") + "\r\n" +
                     "info_hash=short&port=1\n";
  BatchAnswer a = AnswerAnnounceBatch(service, body, node, now);
  REQUIRE(a.status == 200);
  CHECK(a.announces == 3);
  std::vector<std::string> lines;
  for (size_t at = 0; at < a.body.size();) {
    size_t nl = a.body.find('\n', at);
    REQUIRE(nl != std::string::npos);
    lines.push_back(a.body.substr(at, nl - at));
    at = nl + 1;
  }
  REQUIRE(lines.size() == 3);
  std::vector<std::string> replies;
  for (const auto& line : lines) {
    auto decoded = Base64Decode(line);
    REQUIRE(decoded.has_value());
    replies.push_back(*decoded);
  }
  Decoded seeder = Decode(replies[0]);
  CHECK(Str(seeder, "peers").empty());
  Decoded leecher = Decode(replies[1]);
  CHECK(Str(leecher, "peers") == std::string("\x0a\x00\x00\x07\x1b\x58", 6));
  CHECK(leecher.dict_find_int_value("complete") == 1);
  CHECK(leecher.dict_find_int_value("incomplete") == 1);
  Decoded bad = Decode(replies[2]);
  CHECK(Str(bad, "failure reason").find("info_hash") != std::string::npos);
  CHECK(service.table().totals().peers == 2);
  std::string metrics = prometheus::TextSerializer().Serialize(registry.Collect());
  CHECK(metrics.find("shoal_tracker_batched_announces_total 3") != std::string::npos);
  CHECK(metrics.find("shoal_tracker_announces_total{event=\"started\"} 1") != std::string::npos);
}

TEST_CASE("tracker announce batch: a body that is not a batch is refused whole, with the reason") {
  prometheus::Registry registry;
  TrackerService service({}, registry, 42);
  auto now = TrackerClock::now();
  auto node = boost::asio::ip::make_address("10.0.0.8");
  std::string good = AnnounceQuery(std::string(20, 'm'), 7000, 9);
  struct Case {
    std::string body;
    std::string says;
  };
  std::string too_many;
  for (size_t i = 0; i <= kMaxBatchAnnounces; ++i) too_many += good + "\n";
  for (const Case& c : {Case{"", "empty"}, Case{"\n", "empty"},
                        Case{good + "\n\n" + good, "line 2 of the batch is empty"},
                        Case{too_many, "more than 512 announces"}}) {
    BatchAnswer a = AnswerAnnounceBatch(service, c.body, node, now);
    CHECK(a.status == 400);
    CHECK(a.announces == 0);
    CHECK_MESSAGE(a.body.find(c.says) != std::string::npos, a.body);
  }
  // Nothing of a refused batch was applied, not even its good lines.
  CHECK(service.table().totals().peers == 0);
  // The largest batch allowed is answered whole.
  too_many.resize(too_many.size() - good.size() - 1);
  BatchAnswer full = AnswerAnnounceBatch(service, too_many, node, now);
  CHECK(full.status == 200);
  CHECK(full.announces == kMaxBatchAnnounces);
}

}  // namespace shoal::tracker
