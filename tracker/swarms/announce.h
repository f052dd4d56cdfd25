#pragma once
// Parsing of BitTorrent tracker queries (BEP 3, BEP 23): the announce and scrape query strings,
// as sent by libtorrent, aria2 and other clients. Pure functions over untrusted input; the work
// is bounded by the query length limit below.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/error.h"
#include "tracker/swarms/ids.h"

namespace shoal::tracker {

// Longest query string accepted (libtorrent's announces are about 300 bytes).
inline constexpr size_t kMaxQueryBytes = 4096;
// Most parameters accepted in one query (known and unknown together).
inline constexpr size_t kMaxQueryParams = 64;
// Most info_hash values accepted in one scrape.
inline constexpr size_t kMaxScrapeHashes = 64;
// Longest `key` and `ip` values accepted (after decoding).
inline constexpr size_t kMaxKeyBytes = 64;
// Largest numwant accepted as a number; the swarm table caps what is actually returned.
inline constexpr uint32_t kMaxNumwantParam = 1'000'000;

// The announce `event` parameter; kNone for regular (periodic) announces.
enum class AnnounceEvent { kNone, kStarted, kCompleted, kStopped, kPaused };

// "none", "started", "completed", "stopped" or "paused"; used in logs and metric labels.
std::string_view AnnounceEventName(AnnounceEvent event);

// One parsed announce. Plain value type.
struct AnnounceRequest {
  InfoHash info_hash;
  PeerId peer_id;
  uint16_t port = 0;  // never 0 after parsing
  uint64_t uploaded = 0;
  uint64_t downloaded = 0;
  uint64_t left = 0;  // bytes still missing; 0 means the peer is a seeder
  AnnounceEvent event = AnnounceEvent::kNone;
  std::optional<uint32_t> numwant;  // as asked; absent means the tracker's default
  bool compact = true;              // the reply is always compact (BEP 23 lets trackers insist)
  std::string key;                  // opaque client key, at most kMaxKeyBytes
  std::string ip;  // the client's declared address, decoded and unvalidated; "" when absent.
                   // Only trusted when the tracker is configured to.
};

// Parses the query string of GET /announce (the part after '?', still percent-encoded).
// Required: info_hash and peer_id (exactly 20 bytes each once decoded), port (1-65535), left.
// Optional: uploaded, downloaded, event, numwant, compact, key, ip; other parameters are ignored.
// Errors: kInvalidArgument with a message naming the parameter and the problem (missing,
// duplicated, wrong length, bad percent-escape, not a number, out of range, unknown event).
Result<AnnounceRequest> ParseAnnounceQuery(std::string_view query);

// Parses the query string of GET /scrape: one or more info_hash parameters (20 bytes each),
// at most kMaxScrapeHashes, duplicates removed, in the order first seen; other parameters are
// ignored. Errors: kInvalidArgument as above, also when no info_hash is given (full scrapes of
// every swarm are not served: they cost O(swarms) per request).
Result<std::vector<InfoHash>> ParseScrapeQuery(std::string_view query);

// Decodes %XX escapes (any byte) in a query component; '+' stays '+'. Errors: kInvalidArgument
// for a truncated or non-hex escape, naming what (the parameter name passed in).
Result<std::string> PercentDecode(std::string_view text, std::string_view what);

}  // namespace shoal::tracker
