// Fuzzes the tracker's BitTorrent query parsers: ParseAnnounceQuery, ParseScrapeQuery and
// PercentDecode, over the raw (still percent-encoded) query string any client can send.
//
// Properties: an accepted announce satisfies the documented bounds (port != 0, numwant, key and
// ip lengths, query length) and re-encoding it gives a query that parses to the same request;
// repeating a known parameter is refused while an unknown one changes nothing; a valid announce
// is also a valid scrape of exactly its info_hash; an accepted scrape has 1..64 distinct hashes
// and re-encodes to itself; PercentDecode inverts percent-encoding. Errors are kInvalidArgument
// with a short message that starts with what was wrong.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "tests/fuzz/fuzz_check.h"
#include "tracker/swarms/announce.h"

using namespace shoal;
using namespace shoal::tracker;

namespace {

// Error messages echo client bytes only through oci::Quote, so they are printable ASCII on one
// line whatever the query holds.
constexpr bool kErrorsArePrintable = true;

// Messages quote at most 32 bytes of a value; nothing a client sends makes them long.
constexpr size_t kMaxMessage = 256;

std::string Encode(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (char c : bytes) {
    auto u = static_cast<unsigned char>(c);
    out += '%';
    out += kHex[u >> 4];
    out += kHex[u & 15];
  }
  return out;
}

void CheckError(const Error& e, std::span<const std::string_view> prefixes) {
  FUZZ_CHECK(e.code == ErrorCode::kInvalidArgument);
  FUZZ_CHECK(!e.message.empty() && e.message.size() <= kMaxMessage);
  bool named = false;
  for (std::string_view p : prefixes) named = named || std::string_view(e.message).starts_with(p);
  FUZZ_CHECK(named);
  if (kErrorsArePrintable) FUZZ_CHECK(fuzz::IsPrintable(e.message));
}

// Non-empty '&'-separated parts, and those whose key is exactly "info_hash".
struct Counts {
  size_t params = 0;
  size_t info_hashes = 0;
};
Counts CountParams(std::string_view query) {
  Counts n;
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view part = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (part.empty()) continue;
    ++n.params;
    if (part.substr(0, part.find('=')) == "info_hash") ++n.info_hashes;
  }
  return n;
}

std::string EncodeAnnounce(const AnnounceRequest& r) {
  std::string q = "info_hash=" + Encode(r.info_hash.bytes()) + "&peer_id=" +
                  Encode(r.peer_id.bytes()) + "&port=" + std::to_string(r.port) +
                  "&uploaded=" + std::to_string(r.uploaded) +
                  "&downloaded=" + std::to_string(r.downloaded) +
                  "&left=" + std::to_string(r.left) + (r.compact ? "&compact=1" : "&compact=0");
  if (r.event != AnnounceEvent::kNone) q += "&event=" + std::string(AnnounceEventName(r.event));
  if (r.numwant) q += "&numwant=" + std::to_string(*r.numwant);
  if (!r.key.empty()) q += "&key=" + Encode(r.key);
  if (!r.ip.empty()) q += "&ip=" + Encode(r.ip);
  return q;
}

bool SameRequest(const AnnounceRequest& a, const AnnounceRequest& b) {
  return a.info_hash == b.info_hash && a.peer_id == b.peer_id && a.port == b.port &&
         a.uploaded == b.uploaded && a.downloaded == b.downloaded && a.left == b.left &&
         a.event == b.event && a.numwant == b.numwant && a.compact == b.compact &&
         a.key == b.key && a.ip == b.ip;
}

constexpr std::string_view kAnnouncePrefixes[] = {
    "announce ", "info_hash ", "peer_id ", "port ", "uploaded ", "downloaded ", "left ",
    "event ",    "numwant ",   "compact ", "key ",  "ip "};

void CheckAnnounce(std::string_view query) {
  auto result = ParseAnnounceQuery(query);
  if (!result) {
    CheckError(result.error(), kAnnouncePrefixes);
    return;
  }
  const AnnounceRequest& r = result.value();
  // Repeating port (required, so present in any valid announce) is refused.
  auto doubled = ParseAnnounceQuery(std::string(query) + "&port=1");
  FUZZ_CHECK(!doubled);
  CheckError(doubled.error(), kAnnouncePrefixes);

  FUZZ_CHECK(query.size() <= kMaxQueryBytes);
  FUZZ_CHECK(r.port != 0);
  if (r.numwant) FUZZ_CHECK(*r.numwant <= kMaxNumwantParam);
  FUZZ_CHECK(r.key.size() <= kMaxKeyBytes && r.ip.size() <= kMaxKeyBytes);
  FUZZ_CHECK(!AnnounceEventName(r.event).empty());

  std::string encoded = EncodeAnnounce(r);
  FUZZ_CHECK(encoded.size() <= kMaxQueryBytes);
  auto again = ParseAnnounceQuery(encoded);
  FUZZ_CHECK(again);
  FUZZ_CHECK(SameRequest(again.value(), r));

  Counts counts = CountParams(query);
  FUZZ_CHECK(counts.params <= kMaxQueryParams);
  FUZZ_CHECK(counts.info_hashes == 1);
  std::string extended_query = std::string(query) + "&supportcrypto=1";
  if (counts.params < kMaxQueryParams && extended_query.size() <= kMaxQueryBytes) {
    auto extended = ParseAnnounceQuery(extended_query);
    FUZZ_CHECK(extended && SameRequest(extended.value(), r));
  }

  // The same query sent to /scrape asks about exactly this torrent.
  auto scrape = ParseScrapeQuery(query);
  FUZZ_CHECK(scrape);
  FUZZ_CHECK(scrape.value().size() == 1 && scrape.value()[0] == r.info_hash);
}

void CheckScrape(std::string_view query) {
  auto result = ParseScrapeQuery(query);
  if (!result) {
    constexpr std::string_view kPrefixes[] = {"scrape ", "info_hash "};
    CheckError(result.error(), kPrefixes);
    return;
  }
  const std::vector<InfoHash>& hashes = result.value();
  FUZZ_CHECK(query.size() <= kMaxQueryBytes);
  FUZZ_CHECK(!hashes.empty() && hashes.size() <= kMaxScrapeHashes);
  std::unordered_set<InfoHash> distinct(hashes.begin(), hashes.end());
  FUZZ_CHECK(distinct.size() == hashes.size());
  Counts counts = CountParams(query);
  FUZZ_CHECK(counts.info_hashes >= hashes.size() && counts.info_hashes <= kMaxScrapeHashes);

  std::string encoded;
  for (const InfoHash& h : hashes) encoded += "&info_hash=" + Encode(h.bytes());
  auto again = ParseScrapeQuery(encoded);
  FUZZ_CHECK(again && again.value() == hashes);

  // Asking again for the first hash changes nothing (duplicates are dropped).
  std::string repeated = std::string(query) + "&info_hash=" + Encode(hashes[0].bytes());
  if (counts.params < kMaxQueryParams && counts.info_hashes < kMaxScrapeHashes &&
      repeated.size() <= kMaxQueryBytes) {
    auto same = ParseScrapeQuery(repeated);
    FUZZ_CHECK(same && same.value() == hashes);
  }
}

void CheckPercentDecode(std::string_view text) {
  auto decoded = PercentDecode(text, "input");
  if (!decoded) {
    constexpr std::string_view kPrefixes[] = {"input has "};
    CheckError(decoded.error(), kPrefixes);
    FUZZ_CHECK(text.find('%') != std::string_view::npos);
    return;
  }
  size_t escapes = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%') {
      ++escapes;
      i += 2;
    }
  }
  FUZZ_CHECK(decoded.value().size() == text.size() - 2 * escapes);
  if (escapes == 0) FUZZ_CHECK(decoded.value() == text);
  auto round = PercentDecode(Encode(decoded.value()), "input");
  FUZZ_CHECK(round && round.value() == decoded.value());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view query(reinterpret_cast<const char*>(data), size);
  CheckAnnounce(query);
  CheckScrape(query);
  CheckPercentDecode(query);
  return 0;
}
