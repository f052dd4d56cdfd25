#include <doctest/doctest.h>

#include <string>

#include "lib/http/url.h"
#include "tracker/swarms/announce.h"

#include "tests/support/why.h"

namespace shoal::tracker {
namespace {

std::string Bytes20(char fill) { return std::string(20, fill); }

// A query as libtorrent 2.0 sends it (parameter order and extras included).
std::string LibtorrentQuery(const std::string& info_hash, const std::string& extra = "") {
  return "info_hash=" + http::QueryEscape(info_hash) + "&peer_id=-LT2080-" +
         http::QueryEscape("abcdefghijkl") +
         "&port=6881&uploaded=10&downloaded=20&left=30&corrupt=0&key=4d2c8a1f&numwant=200"
         "&compact=1&no_peer_id=1&supportcrypto=1&redundant=0" +
         extra;
}

std::string ErrorOf(std::string_view query) {
  auto r = ParseAnnounceQuery(query);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == ErrorCode::kInvalidArgument);
  return r.error().message;
}

bool Contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("tracker announce: parses a libtorrent announce with raw binary info_hash") {
  std::string hash(
      "\x12\x34\x56\x78\x9a\xbc\xde\xf1\x23\x45\x67\x89\xab\xcd\xef\x00\x25\x26\x2b\x3d", 20);
  auto r = ParseAnnounceQuery(LibtorrentQuery(hash, "&event=started"));
  REQUIRE_MESSAGE(r.has_value(), Why(r));
  const AnnounceRequest& a = r.value();
  CHECK(a.info_hash.bytes() == hash);
  CHECK(a.peer_id.bytes() == "-LT2080-abcdefghijkl");
  CHECK(a.port == 6881);
  CHECK(a.uploaded == 10);
  CHECK(a.downloaded == 20);
  CHECK(a.left == 30);
  CHECK(a.event == AnnounceEvent::kStarted);
  REQUIRE(a.numwant.has_value());
  CHECK(*a.numwant == 200);
  CHECK(a.compact);
  CHECK(a.key == "4d2c8a1f");
  CHECK(a.ip.empty());
}

TEST_CASE("tracker announce: unescaped safe bytes and mixed case escapes decode to the same id") {
  std::string q =
      "info_hash=abcdefghij%4B%4c%4D%4e%4F%50qrst&peer_id=" + Bytes20('p') + "&port=1&left=0";
  auto r = ParseAnnounceQuery(q);
  REQUIRE_MESSAGE(r.has_value(), Why(r));
  CHECK(r.value().info_hash.bytes() == "abcdefghijKLMNOPqrst");
  CHECK(r.value().left == 0);
  CHECK(r.value().uploaded == 0);  // optional, defaults to 0
  CHECK_FALSE(r.value().numwant.has_value());
  CHECK(r.value().event == AnnounceEvent::kNone);
}

TEST_CASE("tracker announce: every event value, and an empty or absent event is a regular one") {
  std::string base = LibtorrentQuery(Bytes20('h'));
  CHECK(ParseAnnounceQuery(base).value().event == AnnounceEvent::kNone);
  CHECK(ParseAnnounceQuery(base + "&event=").value().event == AnnounceEvent::kNone);
  CHECK(ParseAnnounceQuery(base + "&event=started").value().event == AnnounceEvent::kStarted);
  CHECK(ParseAnnounceQuery(base + "&event=completed").value().event == AnnounceEvent::kCompleted);
  CHECK(ParseAnnounceQuery(base + "&event=stopped").value().event == AnnounceEvent::kStopped);
  CHECK(ParseAnnounceQuery(base + "&event=paused").value().event == AnnounceEvent::kPaused);
  CHECK(Contains(ErrorOf(base + "&event=deleted"), "event \"deleted\""));
  CHECK(AnnounceEventName(AnnounceEvent::kCompleted) == "completed");
}

TEST_CASE("tracker announce: keeps the declared ip (unvalidated) and caps its length") {
  auto r = ParseAnnounceQuery(LibtorrentQuery(Bytes20('h'), "&ip=10.1.2.3"));
  REQUIRE(r.has_value());
  CHECK(r.value().ip == "10.1.2.3");
  CHECK(
      Contains(ErrorOf(LibtorrentQuery(Bytes20('h'), "&ip=" + std::string(65, '1'))), "ip is 65"));
  CHECK(Contains(ErrorOf(LibtorrentQuery(Bytes20('h'), "&key=" + std::string(65, 'k'))), "key"));
}

TEST_CASE("tracker announce: names each missing required parameter") {
  std::string ih = "info_hash=" + Bytes20('h');
  std::string pid = "peer_id=" + Bytes20('p');
  CHECK(ErrorOf(pid + "&port=1&left=0") == "announce is missing info_hash");
  CHECK(ErrorOf(ih + "&port=1&left=0") == "announce is missing peer_id");
  CHECK(ErrorOf(ih + "&" + pid + "&left=0") == "announce is missing port");
  CHECK(ErrorOf(ih + "&" + pid + "&port=1") == "announce is missing left");
  CHECK(ErrorOf("") == "announce is missing info_hash");
}

TEST_CASE("tracker announce: rejects ids of the wrong length") {
  std::string rest = "&port=1&left=0";
  CHECK(Contains(ErrorOf("info_hash=" + Bytes20('h').substr(1) + "&peer_id=" + Bytes20('p') + rest),
                 "info_hash must be 20 bytes once decoded, got 19"));
  CHECK(Contains(ErrorOf("info_hash=" + Bytes20('h') + "x&peer_id=" + Bytes20('p') + rest),
                 "got 21"));
  CHECK(Contains(ErrorOf("info_hash=" + Bytes20('h') + "&peer_id=" + rest), "peer_id must be 20"));
  // 20 escapes of one byte each are fine; 20 escapes plus one more byte are not.
  std::string escaped;
  for (int i = 0; i < 20; ++i) escaped += "%ff";
  CHECK(ParseAnnounceQuery("info_hash=" + escaped + "&peer_id=" + Bytes20('p') + rest).has_value());
  CHECK_FALSE(ParseAnnounceQuery("info_hash=" + escaped + "%00&peer_id=" + Bytes20('p') + rest)
                  .has_value());
}

TEST_CASE("tracker announce: rejects bad percent-escapes") {
  std::string tail = "&peer_id=" + Bytes20('p') + "&port=1&left=0";
  CHECK(Contains(ErrorOf("info_hash=%zz" + Bytes20('h').substr(1) + tail), "bad percent-escape"));
  CHECK(Contains(ErrorOf("info_hash=" + Bytes20('h').substr(1) + "%4" + tail), "truncated"));
  CHECK(Contains(ErrorOf("info_hash=" + Bytes20('h').substr(1) + "%" + tail), "truncated"));
  CHECK(Contains(ErrorOf(LibtorrentQuery(Bytes20('h'), "&event=%g1")), "event"));
}

TEST_CASE("tracker announce: port must be 1-65535 and numbers must be plain decimals") {
  std::string head = "info_hash=" + Bytes20('h') + "&peer_id=" + Bytes20('p');
  CHECK(Contains(ErrorOf(head + "&port=0&left=0"), "port 0"));
  CHECK(Contains(ErrorOf(head + "&port=65536&left=0"), "port \"65536\" is out of range"));
  CHECK(Contains(ErrorOf(head + "&port=-1&left=0"), "port must be a non-negative decimal"));
  CHECK(Contains(ErrorOf(head + "&port=%2B1&left=0"), "port must be"));
  CHECK(Contains(ErrorOf(head + "&port=+1&left=0"), "port must be"));
  CHECK(Contains(ErrorOf(head + "&port=0x10&left=0"), "port must be"));
  CHECK(Contains(ErrorOf(head + "&port=&left=0"), "port is empty"));
  CHECK(Contains(ErrorOf(head + "&port=1&left=1.5"), "left must be"));
  CHECK(Contains(ErrorOf(head + "&port=1&left=18446744073709551616"), "left"));
  CHECK(
      Contains(ErrorOf(head + "&port=1&left=0&uploaded=99999999999999999999999"), "out of range"));
  CHECK(ParseAnnounceQuery(head + "&port=65535&left=18446744073709551615").value().left ==
        UINT64_MAX);
  CHECK(Contains(ErrorOf(head + "&port=1&left=0&numwant=1000001"), "numwant"));
  CHECK(ParseAnnounceQuery(head + "&port=1&left=0&numwant=5000").value().numwant == 5000u);
  CHECK(Contains(ErrorOf(head + "&port=1&left=0&compact=2"), "compact"));
  CHECK_FALSE(ParseAnnounceQuery(head + "&port=1&left=0&compact=0").value().compact);
}

TEST_CASE("tracker announce: rejects duplicated parameters") {
  std::string q = LibtorrentQuery(Bytes20('h'));
  CHECK(ErrorOf(q + "&info_hash=" + Bytes20('i')) == "announce has info_hash more than once");
  CHECK(ErrorOf(q + "&port=7") == "announce has port more than once");
  CHECK(ErrorOf(q + "&left=7") == "announce has left more than once");
}

TEST_CASE("tracker announce: bounds the work on oversized or parameter-stuffed queries") {
  std::string q = LibtorrentQuery(Bytes20('h'));
  std::string padded = q + "&x=" + std::string(kMaxQueryBytes, 'a');
  CHECK(Contains(ErrorOf(padded), "more than the limit"));
  std::string stuffed = q;
  for (size_t i = 0; i < kMaxQueryParams; ++i) stuffed += "&u" + std::to_string(i) + "=1";
  CHECK(Contains(ErrorOf(stuffed), "parameters"));
  // Empty segments and unknown parameters are tolerated.
  CHECK(ParseAnnounceQuery("&&" + q + "&&trackerid=x&requirecrypto").has_value());
}

TEST_CASE("tracker scrape: parses repeated info_hash values and drops duplicates") {
  std::string
      a = Bytes20('a'),
      b = "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\xff";
  auto r = ParseScrapeQuery("info_hash=" + a + "&info_hash=" + http::QueryEscape(b) +
                            "&info_hash=" + a + "&foo=bar");
  REQUIRE_MESSAGE(r.has_value(), Why(r));
  REQUIRE(r.value().size() == 2);
  CHECK(r.value()[0].bytes() == a);
  CHECK(r.value()[1].bytes() == b);
  CHECK(r.value()[1].hex() == "0102030405060708090a0b0c0d0e0f10111213ff");
}

TEST_CASE("tracker scrape: refuses full scrapes, too many hashes and malformed ones") {
  CHECK(ParseScrapeQuery("").error().message.find("at least one info_hash") != std::string::npos);
  std::string many;
  for (size_t i = 0; i <= kMaxScrapeHashes; ++i) many += "&info_hash=" + Bytes20('a');
  CHECK(ParseScrapeQuery(many).error().message.find("more than") != std::string::npos);
  CHECK_FALSE(ParseScrapeQuery("info_hash=short").has_value());
  CHECK_FALSE(ParseScrapeQuery("info_hash=" + Bytes20('a').substr(2) + "%z1").has_value());
}

TEST_CASE("tracker ids: hex form, ordering and IPv4-mapped endpoints") {
  auto id = InfoHash::FromBytes(std::string(20, '\xab'));
  REQUIRE(id.has_value());
  std::string abab;
  for (int i = 0; i < 20; ++i) abab += "ab";
  CHECK(id->hex() == abab);
  CHECK_FALSE(InfoHash::FromBytes("short").has_value());
  auto v4 = PeerEndpoint::FromV4({10, 0, 0, 7}, 6881);
  auto mapped = PeerEndpoint::FromV6({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7}, 6881);
  CHECK(v4 == mapped);
  CHECK_FALSE(mapped.is_v6());
  CHECK(v4.ToString() == "10.0.0.7:6881");
  auto v6 = PeerEndpoint::FromV6({0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 80);
  CHECK(v6.is_v6());
  CHECK(v6.ToString() == "[2001:db8::1]:80");
  std::string compact;
  v4.AppendCompact(compact);
  CHECK(compact == std::string("\x0a\x00\x00\x07\x1a\xe1", 6));
  v6.AppendCompact(compact);
  CHECK(compact.size() == 6 + 18);
}

}  // namespace shoal::tracker
