#include "tracker/swarms/response.h"

#include "lib/swarm/bencode.h"

namespace shoal::tracker {

using swarm::Bencode;

std::string EncodeAnnounceReply(const AnnounceReply& reply, std::chrono::seconds interval,
                                std::chrono::seconds min_interval, std::string_view warning) {
  return AnnounceReplyEncoder().Encode(reply, interval, min_interval, warning);
}

std::string AnnounceReplyEncoder::Encode(const AnnounceReply& reply, std::chrono::seconds interval,
                                         std::chrono::seconds min_interval,
                                         std::string_view warning) {
  peers_.clear();
  peers6_.clear();
  for (const PeerEndpoint& ep : reply.peers) ep.AppendCompact(ep.is_v6() ? peers6_ : peers_);
  dict_.Set("interval", static_cast<int64_t>(interval.count()))
      .Set("min interval", static_cast<int64_t>(min_interval.count()))
      .Set("complete", static_cast<int64_t>(reply.counts.complete))
      .Set("incomplete", static_cast<int64_t>(reply.counts.incomplete))
      .Set("downloaded", static_cast<int64_t>(reply.counts.downloaded))
      .Set("peers", std::string_view(peers_));
  if (peers6_.empty()) {
    dict_.Erase("peers6");
  } else {
    dict_.Set("peers6", std::string_view(peers6_));
  }
  if (warning.empty()) {
    dict_.Erase("warning message");
  } else {
    dict_.Set("warning message", warning);
  }
  return dict_.Encode();
}

std::string EncodeFailure(std::string_view reason) {
  Bencode dict = Bencode::Dict();
  dict.Set("failure reason", reason);
  return dict.Encode();
}

std::string EncodeScrapeReply(const std::vector<std::pair<InfoHash, SwarmCounts>>& files) {
  Bencode by_hash = Bencode::Dict();
  for (const auto& [info_hash, counts] : files) {
    Bencode file = Bencode::Dict();
    file.Set("complete", static_cast<int64_t>(counts.complete))
        .Set("incomplete", static_cast<int64_t>(counts.incomplete))
        .Set("downloaded", static_cast<int64_t>(counts.downloaded));
    by_hash.Set(info_hash.bytes(), std::move(file));
  }
  Bencode dict = Bencode::Dict();
  dict.Set("files", std::move(by_hash));
  return dict.Encode();
}

}  // namespace shoal::tracker
