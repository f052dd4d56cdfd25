// Tracker replies decoded back with libtorrent's own decoder: what libtorrent will parse.
#include <doctest/doctest.h>

#include <utility>

#include <memory>
#include <string>

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <boost/asio/ip/address.hpp>
#include <libtorrent/bdecode.hpp>

#include "lib/http/url.h"
#include "lib/swarm/bencode.h"
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

}  // namespace shoal::tracker
