#include "tracker/config.h"

#include <algorithm>
#include <string>

namespace shoal::tracker {

void AddTrackerFlags(CLI::App& app, TrackerConfig& c) {
  app.add_option("--listen", c.listen, "Address host:port for announce, scrape and /metrics")
      ->envname("SHOAL_LISTEN")
      ->capture_default_str();
  app.add_option("--port-file", c.port_file, "Write the bound port to this file")
      ->envname("SHOAL_PORT_FILE");
  app.add_option("--announce-interval", c.announce_interval_s,
                 "Seconds between a peer's announces (the reply's interval, plus up to 10% "
                 "jitter); silent peers are dropped after two intervals and a minute. libtorrent "
                 "re-announces at max(interval, its min_announce_interval, default 300): below "
                 "300, lower that setting in the agents too")
      ->envname("SHOAL_ANNOUNCE_INTERVAL")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app.add_option("--min-interval", c.min_interval_s,
                 "The reply's min interval: the shortest time between forced announces")
      ->envname("SHOAL_MIN_INTERVAL")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app.add_option("--default-numwant", c.default_numwant,
                 "Peers returned when the client does not send numwant")
      ->envname("SHOAL_DEFAULT_NUMWANT")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--max-numwant", c.max_numwant, "Most peers returned by one announce")
      ->envname("SHOAL_MAX_NUMWANT")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--max-swarms", c.max_swarms, "Most swarms (info-hashes) tracked at once")
      ->envname("SHOAL_MAX_SWARMS")
      ->check(CLI::Range(static_cast<size_t>(1), static_cast<size_t>(100'000'000)))
      ->capture_default_str();
  app.add_option("--max-peers-per-swarm", c.max_peers_per_swarm, "Most peers stored per swarm")
      ->envname("SHOAL_MAX_PEERS_PER_SWARM")
      ->check(CLI::Range(static_cast<size_t>(1), static_cast<size_t>(10'000'000)))
      ->capture_default_str();
  app.add_option("--max-peers", c.max_peers, "Most peers stored over all swarms")
      ->envname("SHOAL_MAX_PEERS")
      ->check(CLI::Range(static_cast<size_t>(1), static_cast<size_t>(1'000'000'000)))
      ->capture_default_str();
  app.add_flag("--trust-ip-param", c.trust_ip_param,
               "Use the announce's ip= parameter instead of the connection's source address "
               "(only behind a proxy that sets it; any client could claim any address)")
      ->envname("SHOAL_TRUST_IP_PARAM");
  app.add_option("--udp-announce", c.udp_announce,
                 "Also answer UDP tracker announces (BEP 15, the announce key in BEP 41's URL "
                 "data) on --listen's port number: one datagram each way instead of a TCP "
                 "connection per announce. Agents use them with --tracker-announce udp")
      ->envname("SHOAL_UDP_ANNOUNCE")
      ->capture_default_str();
  app.add_option("--agent-tokens-file", c.agent_tokens_file,
                 "File of the tokens agents present (one per line, # comments): announces "
                 "(by each token's announce key), chunk tables, leases, publishes, bad reports, "
                 "manifests, prefetch polls. Re-read when it changes: list the new and the old "
                 "token while rotating")
      ->envname("SHOAL_AGENT_TOKENS_FILE");
  app.add_option("--operator-tokens-file", c.operator_tokens_file,
                 "File of the tokens operators present (shoalctl): prefetch jobs, the agent "
                 "list, the status page's detail. Re-read when it changes")
      ->envname("SHOAL_OPERATOR_TOKENS_FILE");
  app.add_flag("--insecure-open", c.insecure_open,
               "Run without token files: anyone who reaches the tracker may rebind tags, read "
               "chunk tables and force upstream re-fetches (throwaway test trackers only)")
      ->envname("SHOAL_INSECURE_OPEN");
  app.add_option("--peer-ca-cert", c.peer_ca_cert,
                 "The cluster's peer CA certificate (PEM), as the agents' --peer-ca-cert: "
                 "published chunk torrents must carry it (without it, only plain torrents are "
                 "accepted)")
      ->envname("SHOAL_PEER_CA_CERT")
      ->check(CLI::ExistingFile);
  app.add_option("--bad-reports-per-minute", c.bad_reports_per_minute,
                 "Bad-chunk reports accepted per source address and minute (a burst of as many); "
                 "each one accepted makes the cluster fetch the chunk upstream again")
      ->envname("SHOAL_BAD_REPORTS_PER_MINUTE")
      ->check(CLI::Range(1u, 100000u))
      ->capture_default_str();
  app.add_option("--bad-report-quorum", c.bad_report_quorum,
                 "Distinct source addresses whose bad-chunk reports drop a ready chunk (one "
                 "report suffices once the chunk's swarm has no seeder left); 1 trusts any "
                 "agent token holder to force upstream re-fetches")
      ->envname("SHOAL_BAD_REPORT_QUORUM")
      ->check(CLI::Range(1u, 1000u))
      ->capture_default_str();
  app.add_option("--max-connections", c.max_connections, "Open HTTP connections at most")
      ->envname("SHOAL_MAX_CONNECTIONS")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  app.add_option("--chunk-size-kib", c.chunk_size_kib,
                 "Chunk size of every blob's chunk table, in KiB: a multiple of the piece size")
      ->envname("SHOAL_CHUNK_SIZE_KIB")
      ->check(CLI::Range(uint64_t{16}, uint64_t{1} << 32))
      ->capture_default_str();
  app.add_option("--piece-size-kib", c.piece_size_kib,
                 "Piece size of the chunk torrents, in KiB: a power of two from 16 to 65536")
      ->envname("SHOAL_PIECE_SIZE_KIB")
      ->check(CLI::Range(16u, 65536u))
      ->capture_default_str();
  app.add_option("--target-chunks", c.target_chunks,
                 "Full chunks a blob is cut into at least: a blob smaller than target x chunk "
                 "size gets chunks of the power of two at or below size / target (at least "
                 "--min-chunk-size-kib) with pieces of an eighth of a chunk; 0 keeps "
                 "--chunk-size-kib for every blob")
      ->envname("SHOAL_TARGET_CHUNKS")
      ->check(CLI::Range(0u, 1u << 20))
      ->capture_default_str();
  app.add_option("--min-chunk-size-kib", c.min_chunk_size_kib,
                 "Smallest full chunk --target-chunks may choose, in KiB: a power of two")
      ->envname("SHOAL_MIN_CHUNK_SIZE_KIB")
      ->check(CLI::Range(uint64_t{16}, uint64_t{1} << 32))
      ->capture_default_str();
  app.add_option("--first-chunk-kib", c.first_chunk_kib,
                 "Size of a blob's first chunk, in KiB: each next chunk doubles up to the chunk "
                 "size, so peers share a blob's first bytes at once (a power of two; 0: all "
                 "chunks full size)")
      ->envname("SHOAL_FIRST_CHUNK_KIB")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 32))
      ->capture_default_str();
  app.add_option("--max-upstream-fetchers", c.max_upstream_fetchers,
                 "Upstream leases active at once in the whole cluster: at most this many agents "
                 "fetch chunks from the registries at a time. With --replicas N each replica "
                 "grants at most a 1/N share (rounded down) for the blobs it owns")
      ->envname("SHOAL_MAX_UPSTREAM_FETCHERS")
      ->check(CLI::Range(1u, 100'000u))
      ->capture_default_str();
  app.add_option("--base-upstream-fetchers", c.base_upstream_fetchers,
                 "Upstream leases active at once in the whole cluster until leases prove fast: "
                 "each lease that fetches a full chunk at --fast-lease-mbit raises the limit by "
                 "one toward --max-upstream-fetchers, each slower than half that lowers it by "
                 "one back toward this (shared by --replicas like the max)")
      ->envname("SHOAL_BASE_UPSTREAM_FETCHERS")
      ->check(CLI::Range(1u, 100'000u))
      ->capture_default_str();
  app.add_option("--fast-lease-mbit", c.fast_lease_mbit,
                 "A lease that fetches a full chunk at this rate (Mbit/s) or faster lets one more "
                 "lease run: on fast registry links more, smaller upstream flows spread over more "
                 "leaseholders, whose downlinks peers also fill; 0 keeps the limit at "
                 "--base-upstream-fetchers")
      ->envname("SHOAL_FAST_LEASE_MBIT")
      ->check(CLI::Range(0u, 10'000'000u))
      ->capture_default_str();
  app.add_option("--replicas", c.replicas,
                 "Tracker replicas in the cluster (every agent's --tracker list): they share "
                 "--max-upstream-fetchers, so the cap holds for the cluster, not per replica")
      ->envname("SHOAL_TRACKER_REPLICAS")
      ->check(CLI::Range(1u, 1'000u))
      ->capture_default_str();
  app.callback([&c] {
    if (c.max_upstream_fetchers < c.replicas) {
      throw CLI::ValidationError(
          "--max-upstream-fetchers",
          std::to_string(c.max_upstream_fetchers) + " is less than --replicas " +
              std::to_string(c.replicas) +
              ": each replica needs at least one upstream lease of the cluster's cap");
    }
  });
  app.add_option("--max-leases-per-blob", c.max_leases_per_blob,
                 "Upstream leases active at once on one blob: the upstream link goes to the "
                 "blob's next chunks, so peers can share them sooner")
      ->envname("SHOAL_MAX_LEASES_PER_BLOB")
      ->check(CLI::Range(1u, 100'000u))
      ->capture_default_str();
  app.add_option("--head-start-ms", c.head_start_ms,
                 "Milliseconds a blob's first chunk is fetched from upstream alone before the "
                 "blob's other chunks are leased (less if it is ready sooner), so the swarm gets "
                 "the first bytes at once instead of sharing the link four ways (0: off)")
      ->envname("SHOAL_HEAD_START_MS")
      ->check(CLI::Range(0, 60'000))
      ->capture_default_str();
  app.add_option("--max-leases-per-agent", c.max_leases_per_agent,
                 "Upstream leases one agent may hold at once")
      ->envname("SHOAL_MAX_LEASES_PER_AGENT")
      ->check(CLI::Range(1u, 10'000u))
      ->capture_default_str();
  app.add_option("--lease-ttl-s", c.lease_ttl_s,
                 "Seconds an upstream lease lives without a renewal; then the chunk goes to the "
                 "next agent that asks")
      ->envname("SHOAL_LEASE_TTL_S")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  app.add_option("--max-blobs", c.max_blobs,
                 "Blob chunk tables kept; beyond, the least recently used one without an active "
                 "lease is dropped")
      ->envname("SHOAL_MAX_BLOBS")
      ->check(CLI::Range(static_cast<size_t>(1), static_cast<size_t>(100'000'000)))
      ->capture_default_str();
  // The cluster-wide manifest cache.
  app.add_option("--manifest-ttl-s", c.manifest_ttl_s,
                 "Seconds a tag -> digest resolution an agent reported is served to every agent; "
                 "then the next agent that asks fetches it from upstream again (manifests by "
                 "digest never expire)")
      ->envname("SHOAL_MANIFEST_TTL_S")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app.add_option("--manifest-missing-ttl-s", c.manifest_missing_ttl_s,
                 "Seconds an agent's upstream \"not found\" for a manifest is answered to the "
                 "whole cluster without asking upstream again (0: never remembered)")
      ->envname("SHOAL_MANIFEST_MISSING_TTL_S")
      ->check(CLI::Range(0, 3600))
      ->capture_default_str();
  app.add_option("--manifest-lease-ttl-s", c.manifest_lease_ttl_s,
                 "Seconds the agent told to fetch a missing manifest has to publish it; then the "
                 "next agent that asks fetches it instead")
      ->envname("SHOAL_MANIFEST_LEASE_TTL_S")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  app.add_option("--max-manifests", c.max_manifests,
                 "Manifests kept in the cluster-wide cache; beyond, the least recently used go")
      ->envname("SHOAL_MAX_MANIFESTS")
      ->check(CLI::Range(static_cast<size_t>(1), static_cast<size_t>(100'000'000)))
      ->capture_default_str();
  app.add_option("--max-manifest-cache-mib", c.max_manifest_cache_mib,
                 "Manifest bytes kept in the cluster-wide cache, in MiB; beyond, the least "
                 "recently used go")
      ->envname("SHOAL_MAX_MANIFEST_CACHE_MIB")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--prefetch-agent-ttl-s", c.prefetch_agent_ttl_s,
                 "An agent that has not polled for prefetch jobs for this long counts as gone: "
                 "its parts of jobs fail and new jobs do not select it")
      ->envname("SHOAL_PREFETCH_AGENT_TTL_S")
      ->check(CLI::Range(2, 3600))
      ->capture_default_str();
  app.add_option("--max-prefetch-jobs", c.max_prefetch_jobs,
                 "Prefetch jobs kept, running or ended (the oldest ended one makes room)")
      ->envname("SHOAL_MAX_PREFETCH_JOBS")
      ->check(CLI::Range(size_t{1}, size_t{100'000}))
      ->capture_default_str();
  app.add_option("--prefetch-keep-s", c.prefetch_keep_s,
                 "Seconds an ended prefetch job stays readable")
      ->envname("SHOAL_PREFETCH_KEEP_S")
      ->check(CLI::Range(1, 7 * 86400))
      ->capture_default_str();
  app.add_option("--log-format", c.log_format, "json or text")
      ->envname("SHOAL_LOG_FORMAT")
      ->check(CLI::IsMember({"json", "text"}))
      ->capture_default_str();
  app.add_option("--log-level", c.log_level, "trace, debug, info, warn or error")
      ->envname("SHOAL_LOG_LEVEL")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
}

uint32_t UpstreamLeasesPerReplica(const TrackerConfig& config) {
  return config.max_upstream_fetchers / std::max(config.replicas, 1u);
}

uint32_t BaseUpstreamLeasesPerReplica(const TrackerConfig& config) {
  // Rounded up: the base is no cap (the max is), and rounding down would lower what a
  // multi-replica cluster grants on a slow link (8 over 3 replicas: 2 each, where a max of 9
  // gave 3 each before the base existed).
  const uint32_t replicas = std::max(config.replicas, 1u);
  return std::clamp((config.base_upstream_fetchers + replicas - 1) / replicas, 1u,
                    std::max(UpstreamLeasesPerReplica(config), 1u));
}

}  // namespace shoal::tracker
