#pragma once
// POST /v1/announces: many BitTorrent announces in one HTTP call. An agent's announce relay
// gathers the announces its libtorrent session sends and forwards them in one request, so a cold
// pull costs the tracker one request per batch instead of one datagram or connection per chunk
// torrent and event (docs/architecture.md, "Announces in batches").
//
// Body: one announce query per line, exactly as libtorrent sends it after `GET /announce?`
// (percent-encoded, so a query holds no line break; an `auth=` parameter is ignored: the call's
// bearer token admits it). Answer (200): one line per query, in order, each the base64 of the
// bencoded body GET /announce would have answered (peers, or a `failure reason` for that query
// alone). Each query registers the call's TCP source address with the query's port, as GET
// /announce does.

#include <cstddef>
#include <string>
#include <string_view>

#include <boost/asio/ip/address.hpp>

#include "tracker/swarms/service.h"

namespace shoal::tracker {

inline constexpr std::string_view kAnnounceBatchPath = "/v1/announces";
// Most queries in one call: the work of one call stays bounded (about 1 µs each).
inline constexpr size_t kMaxBatchAnnounces = 512;

struct BatchAnswer {
  unsigned status = 200;  // 200, or 400 for a body that is not a batch (nothing was applied)
  std::string body;       // the reply lines; the error text when status is 400
  size_t announces = 0;   // queries answered (0 on 400)
};

// Answers one batch from `remote`. A 400 (an empty body, an empty line, more than
// kMaxBatchAnnounces lines) applies none of the queries; a query that does not parse or is
// refused gets its own failure reply and the others are applied.
BatchAnswer AnswerAnnounceBatch(TrackerService& service, std::string_view body,
                                const boost::asio::ip::address& remote, TimePoint now);

}  // namespace shoal::tracker
