#pragma once
// Bencoded tracker responses (BEP 3, BEP 7, BEP 23, BEP 48). Trackers report errors with HTTP
// 200 and a `failure reason`, which is what clients expect.

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/swarm/bencode.h"
#include "tracker/swarms/ids.h"
#include "tracker/swarms/swarm_table.h"

namespace shoal::tracker {

// The announce reply: interval, min interval, complete, incomplete, peers (compact IPv4, always
// present, possibly empty), peers6 (compact IPv6, only when there are IPv6 peers), and
// `warning message` when warning is not empty.
std::string EncodeAnnounceReply(const AnnounceReply& reply, std::chrono::seconds interval,
                                std::chrono::seconds min_interval, std::string_view warning = {});

// EncodeAnnounceReply with one dictionary kept between calls: only the values change, so a reply
// allocates no dictionary nodes (a cold burst asks for hundreds of thousands a second). Not
// thread-safe; the tracker's service owns one.
class AnnounceReplyEncoder {
 public:
  std::string Encode(const AnnounceReply& reply, std::chrono::seconds interval,
                     std::chrono::seconds min_interval, std::string_view warning = {});

 private:
  swarm::Bencode dict_ = swarm::Bencode::Dict();
  std::string peers_, peers6_;  // compact peers; kept for their capacity
};

// A reply that only carries `failure reason`; clients log it and retry later.
std::string EncodeFailure(std::string_view reason);

// The scrape reply: files = { <20-byte info-hash>: {complete, incomplete, downloaded} }.
std::string EncodeScrapeReply(const std::vector<std::pair<InfoHash, SwarmCounts>>& files);

}  // namespace shoal::tracker
