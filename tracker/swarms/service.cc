#include "tracker/swarms/service.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "tracker/swarms/announce.h"
#include "tracker/swarms/response.h"

namespace shoal::tracker {
namespace {

constexpr size_t kStatusPageSwarms = 100;

}  // namespace

ServiceOptions TrackerService::WithPeerTtl(ServiceOptions options) {
  options.table.peer_ttl = PeerTtl(options.announce_interval, options.interval_jitter);
  return options;
}

std::chrono::seconds LongestInterval(std::chrono::seconds announce_interval,
                                     double interval_jitter) {
  return std::chrono::seconds(
      announce_interval.count() +
      static_cast<int64_t>(std::ceil(announce_interval.count() * std::max(0.0, interval_jitter))));
}

std::chrono::seconds PeerTtl(std::chrono::seconds announce_interval, double interval_jitter) {
  return 2 * LongestInterval(announce_interval, interval_jitter) + std::chrono::seconds(60);
}

TrackerService::TrackerService(ServiceOptions options, prometheus::Registry& registry,
                               uint64_t seed)
    : options_(WithPeerTtl(std::move(options))),
      table_(options_.table, seed),
      metrics_(TrackerMetrics::Create(registry)),
      jitter_rng_(static_cast<std::minstd_rand::result_type>(seed ^ 0x9e3779b97f4a7c15ULL)) {}

std::string TrackerService::Announce(std::string_view query, const boost::asio::ip::address& remote,
                                     TimePoint now) {
  auto request = ParseAnnounceQuery(query);
  if (!request) {
    metrics_.rejected_invalid.Increment();
    if (spdlog::should_log(spdlog::level::debug)) {
      spdlog::debug("announce from {} rejected: {}", remote.to_string(), request.error().message);
    }
    return EncodeFailure(request.error().message);
  }
  auto outcome = Register(request.value(), remote, now);
  if (!outcome) return EncodeFailure(outcome.error().message);
  return reply_encoder_.Encode(outcome.value().reply, outcome.value().interval,
                               options_.min_interval, outcome.value().warning);
}

Result<AnnounceOutcome> TrackerService::Register(const AnnounceRequest& req,
                                                 const boost::asio::ip::address& remote,
                                                 TimePoint now) {
  boost::asio::ip::address address = remote;
  if (options_.trust_ip_param && !req.ip.empty()) {
    boost::system::error_code ec;
    address = boost::asio::ip::make_address(req.ip, ec);
    if (ec) {
      metrics_.rejected_invalid.Increment();
      return MakeError(ErrorCode::kInvalidArgument, "ip \"" + req.ip + "\" is not an IP address");
    }
  }
  PeerEndpoint from = PeerEndpoint::FromAddress(address, req.port);
  auto reply = table_.Announce(req, from, now);
  if (!reply) {
    metrics_.rejected_full.Increment();
    spdlog::warn("announce from {}: {}", from.ToString(), reply.error().message);
    return reply.error();
  }
  metrics_.CountAnnounce(req.event);
  AnnounceOutcome out;
  if (!reply.value().registered) {
    metrics_.unregistered.Increment();
    out.warning = "swarm is full: this peer was not registered";
  }
  auto jitter_max = static_cast<int64_t>(options_.announce_interval.count() *
                                         std::max(0.0, options_.interval_jitter));
  out.interval =
      options_.announce_interval +
      std::chrono::seconds(
          jitter_max > 0 ? std::uniform_int_distribution<int64_t>(0, jitter_max)(jitter_rng_) : 0);
  if (spdlog::should_log(spdlog::level::debug)) {
    spdlog::debug("announce {} {} from {}: left {}, {} peers returned", req.info_hash.hex(),
                  AnnounceEventName(req.event), from.ToString(), req.left,
                  reply.value().peers.size());
  }
  out.reply = std::move(reply.value());
  return out;
}

std::string TrackerService::Scrape(std::string_view query) {
  auto hashes = ParseScrapeQuery(query);
  if (!hashes) return EncodeFailure(hashes.error().message);
  metrics_.scrapes.Increment();
  std::vector<std::pair<InfoHash, SwarmCounts>> files;
  files.reserve(hashes.value().size());
  for (const InfoHash& h : hashes.value()) files.emplace_back(h, table_.Counts(h));
  return EncodeScrapeReply(files);
}

std::string TrackerService::StatusPage(bool detail) const {
  SwarmTotals totals = table_.totals();
  std::string out;
  out += "shoal-tracker\n\n";
  out += fmt::format("swarms {}, peers {} (seeders {}, leechers {})\n", totals.swarms, totals.peers,
                     totals.seeders, totals.peers - totals.seeders);
  out += fmt::format(
      "announce interval {} s (+ up to {:.0f}% jitter), min interval {} s, peer ttl {} s, "
      "numwant {} (max {})\n",
      options_.announce_interval.count(), options_.interval_jitter * 100,
      options_.min_interval.count(), table_.options().peer_ttl.count(),
      table_.options().default_numwant, table_.options().max_numwant);
  out += fmt::format(
      "limits: {} swarms, {} peers per swarm, {} peers\n\n", table_.options().limits.max_swarms,
      table_.options().limits.max_peers_per_swarm, table_.options().limits.max_peers);
  if (!detail) return out;
  auto largest = table_.Largest(kStatusPageSwarms);
  out += fmt::format("{:<40}  {:>9}  {:>10}  {:>10}\n", "info_hash", "complete", "incomplete",
                     "downloaded");
  for (const SwarmSummary& s : largest) {
    out += fmt::format("{:<40}  {:>9}  {:>10}  {:>10}\n", s.info_hash.hex(), s.counts.complete,
                       s.counts.incomplete, s.counts.downloaded);
  }
  if (totals.swarms > largest.size()) {
    out += fmt::format("... and {} smaller swarms\n", totals.swarms - largest.size());
  }
  return out;
}

void TrackerService::Sweep(TimePoint now) {
  size_t dropped = table_.Sweep(now);
  if (dropped > 0) {
    metrics_.expired_peers.Increment(static_cast<double>(dropped));
    spdlog::info("dropped {} silent peers; {} swarms, {} peers remain", dropped,
                 table_.totals().swarms, table_.totals().peers);
  }
  UpdateGauges();
}

void TrackerService::UpdateGauges() { metrics_.SetTotals(table_.totals()); }

}  // namespace shoal::tracker
