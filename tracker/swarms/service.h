#pragma once
// The tracker's request logic without the network: announce, scrape, status page and upkeep,
// over a SwarmTable. The HTTP server (tracker/server.h) calls it; unit tests call it directly.
// Later routes (chunk tables, leases) get their own services beside this one.

#include <utility>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>

#include <prometheus/registry.h>
#include <boost/asio/ip/address.hpp>

#include "tracker/metrics.h"
#include "tracker/swarms/response.h"
#include "tracker/swarms/swarm_table.h"

namespace shoal::tracker {

struct ServiceOptions {
  // The `interval` clients are told, plus a random jitter of up to interval_jitter * interval
  // so that nodes started together do not keep announcing in lockstep.
  std::chrono::seconds announce_interval{300};
  double interval_jitter = 0.1;
  // The `min interval`: clients must not announce more often than this, even when forced.
  std::chrono::seconds min_interval{60};
  // Use the announce's `ip` parameter instead of the TCP source address. Off by default: any
  // client could otherwise register someone else's address.
  bool trust_ip_param = false;
  // Peer selection and memory limits; peer_ttl is replaced by PeerTtl() of the intervals above.
  SwarmTableOptions table;
};

// The longest interval handed out: announce_interval plus its largest jitter, rounded up.
std::chrono::seconds LongestInterval(std::chrono::seconds announce_interval,
                                     double interval_jitter);
// How long a silent peer is kept: two of the longest intervals handed out, plus a minute.
std::chrono::seconds PeerTtl(std::chrono::seconds announce_interval, double interval_jitter);

// An announce the table took: what to answer and the interval to hand out.
struct AnnounceOutcome {
  AnnounceReply reply;
  std::chrono::seconds interval{0};  // announce_interval plus this announce's jitter
  std::string_view warning;          // non-empty when the peer was not registered (swarm full)
};

// Not thread-safe: used from the server's single io_context thread.
class TrackerService {
 public:
  // Registers its metrics on registry, which must outlive the service. seed feeds the peer
  // selection and interval jitter (tests pass a fixed one).
  TrackerService(ServiceOptions options, prometheus::Registry& registry,
                 uint64_t seed = std::random_device{}());

  // The bencoded body answering GET /announce?<query> from the TCP peer `remote`: peers, or a
  // `failure reason` for a malformed query or a full tracker (HTTP status 200 either way).
  std::string Announce(std::string_view query, const boost::asio::ip::address& remote,
                       TimePoint now);
  // One announce already parsed (from HTTP or UDP) from `remote`, counted. Errors:
  // kInvalidArgument for an `ip` that is not an address (only with trust_ip_param), and the
  // table's error when the tracker is full; both carry the text to send back.
  Result<AnnounceOutcome> Register(const AnnounceRequest& req,
                                   const boost::asio::ip::address& remote, TimePoint now);
  // The bencoded body answering GET /scrape?<query>, or a `failure reason`.
  std::string Scrape(std::string_view query);
  // A plain-text page: totals and settings, and with detail the largest swarms (info-hashes).
  std::string StatusPage(bool detail) const;
  // Drops silent peers and refreshes the gauges; the server calls it periodically.
  void Sweep(TimePoint now);
  // Refreshes the gauges from the table (before /metrics is rendered).
  void UpdateGauges();

  const SwarmTable& table() const { return table_; }
  TrackerMetrics& metrics() { return metrics_; }
  const ServiceOptions& options() const { return options_; }

 private:
  static ServiceOptions WithPeerTtl(ServiceOptions options);

  ServiceOptions options_;
  SwarmTable table_;
  TrackerMetrics metrics_;
  std::minstd_rand jitter_rng_;
  AnnounceReplyEncoder reply_encoder_;
};

}  // namespace shoal::tracker
