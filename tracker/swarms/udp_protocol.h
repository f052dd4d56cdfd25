#pragma once
// The UDP tracker protocol (BEP 15) with the URL data option (BEP 41, which carries the announce
// key): parsing of untrusted datagrams, encoding of answers, and the connection ids that prove a
// sender's address before it may announce. Pure functions and values; no sockets.

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/error.h"
#include "tracker/swarms/announce.h"
#include "tracker/swarms/ids.h"
#include "tracker/swarms/swarm_table.h"

namespace shoal::tracker {

// BEP 15's magic protocol id, the first 8 bytes of a connect request.
inline constexpr uint64_t kUdpProtocolId = 0x41727101980ULL;
// Most info-hashes in one scrape (BEP 15: what fits a datagram).
inline constexpr size_t kMaxUdpScrapeHashes = 74;
// Largest answer sent: an Ethernet MTU's UDP payload over IPv4, so no answer is fragmented.
inline constexpr size_t kMaxUdpAnswerBytes = 1472;

enum class UdpAction : uint32_t { kConnect = 0, kAnnounce = 1, kScrape = 2, kError = 3 };

// "connect", "announce", "scrape" or "error"; used in logs and metric labels.
std::string_view UdpActionName(UdpAction action);

// One parsed request datagram. Plain value type.
struct UdpRequest {
  UdpAction action = UdpAction::kConnect;
  uint32_t transaction_id = 0;
  uint64_t connection_id = 0;   // announce and scrape: the id a connect handed out
  AnnounceRequest announce;     // announce only; `ip` is "" or a dotted IPv4 address
  std::string url_data;         // announce only: BEP 41 URL data, "/announce?auth=<key>"
  std::vector<InfoHash> scrape;  // scrape only: 1..kMaxUdpScrapeHashes, duplicates kept
};

// The ids every request starts with: the connection id (bytes 0-7) and the transaction id
// (bytes 12-15), read even from a datagram that does not parse; nullopt below 16 bytes.
struct UdpHeader {
  uint64_t connection_id = 0;
  uint32_t transaction_id = 0;
};
std::optional<UdpHeader> PeekUdpHeader(std::string_view datagram);

// Parses one request datagram. Errors: kInvalidArgument naming the problem (too short, wrong
// protocol id, unknown action, bad event, left negative, port 0, malformed or truncated
// options, too many scrape hashes). Never reads past `datagram`.
Result<UdpRequest> ParseUdpRequest(std::string_view datagram);

// The connect answer: action 0, transaction id, connection id.
std::string EncodeUdpConnect(uint32_t transaction_id, uint64_t connection_id);
// The announce answer: interval, leechers, seeders, then the peers of the requester's family
// (6 bytes each for IPv4, 18 for IPv6; BEP 15 has no mixed answers), as many as fit max_bytes
// (at most kMaxUdpAnswerBytes; never fewer than the 20-byte head).
std::string EncodeUdpAnnounce(uint32_t transaction_id, const AnnounceReply& reply,
                              std::chrono::seconds interval, bool v6,
                              size_t max_bytes = kMaxUdpAnswerBytes);
// The scrape answer: seeders, completed, leechers per info-hash, in the order asked.
std::string EncodeUdpScrape(uint32_t transaction_id, const std::vector<SwarmCounts>& counts);
// The error answer: action 3, transaction id, the message (cut to fit max_bytes, at most
// kMaxUdpAnswerBytes; never fewer than the 8-byte head).
std::string EncodeUdpError(uint32_t transaction_id, std::string_view message,
                           size_t max_bytes = kMaxUdpAnswerBytes);

// A key for connection ids: 32 bytes every replica holds alike (Access::agent_secrets).
using UdpSecret = std::array<unsigned char, 32>;

// Connection ids (BEP 15) as a keyed MAC of the sender's address (not its port: a NAT may move
// it) and the minute: a sender proves it receives at its address before it may announce, and
// no replica keeps state per sender. libtorrent keeps one id per tracker *address* for 60 s
// (whatever the port, and across a tracker's restart), so the key must be the same on every
// replica and survive restarts: the first of `secrets` issues, any of them verifies (a token
// rotation keeps the old ones for a while). Without secrets (an open tracker) a random key of
// this process is used. An id is accepted from the minute it was issued to the next.
class UdpConnectionIds {
 public:
  // Draws this process's own key (OpenSSL's RAND_bytes; throws if it cannot).
  UdpConnectionIds();

  // The id for a sender at `from` at time `now`.
  // `now` is wall-clock time: replicas agree on the minute, not on a steady clock.
  uint64_t Issue(std::span<const UdpSecret> secrets, const PeerEndpoint& from,
                 std::chrono::system_clock::time_point now) const;
  // Whether id was issued to `from` under any of secrets in the minute before, of or after
  // now's (a minute of clock skew between replicas).
  bool Valid(std::span<const UdpSecret> secrets, uint64_t id, const PeerEndpoint& from,
             std::chrono::system_clock::time_point now) const;

 private:
  static uint64_t Mac(const UdpSecret& key, const PeerEndpoint& from, int64_t minute);

  UdpSecret own_{};
};

}  // namespace shoal::tracker
