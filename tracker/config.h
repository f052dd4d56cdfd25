#pragma once
// The tracker's configuration: every flag has an environment-variable equivalent (SHOAL_*).

#include <cstddef>
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace shoal::tracker {

struct TrackerConfig {
  std::string listen = "0.0.0.0:7070";  // host:port; port 0 picks a free one
  std::string port_file;                // if set, the bound port is written here
  int announce_interval_s = 300;        // suits 2,500 nodes; libtorrent's own minimum is 300
  int min_interval_s = 60;
  uint32_t default_numwant = 50;
  uint32_t max_numwant = 200;
  size_t max_swarms = 200'000;
  size_t max_peers_per_swarm = 20'000;
  size_t max_peers = 4'000'000;
  bool trust_ip_param = false;  // believe the announce's ip= (only behind a trusted proxy)
  bool udp_announce = true;     // also answer BEP 15 announces on UDP at --listen's port
  int max_connections = 32768;
  // Chunk tables and upstream leases (the blob API).
  uint64_t chunk_size_kib = 16384;     // 16 MiB chunks (the largest; smaller blobs get smaller)
  uint32_t piece_size_kib = 1024;      // 1 MiB pieces in each chunk torrent (the largest)
  uint32_t target_chunks = 64;         // smaller blobs get at least 64 full chunks
  uint64_t min_chunk_size_kib = 1024;  // but not below 1 MiB
  uint64_t first_chunk_kib = 256;      // ramp: chunk 0 is 256 KiB, then 512, 1024, ... (0: no ramp)
  uint32_t max_upstream_fetchers = 64;  // active leases in the whole cluster (NAT quota)
  uint32_t base_upstream_fetchers = 8;  // the limit below that until leases prove fast
  uint32_t fast_lease_mbit = 256;       // a lease this fast raises the limit (0: stays at base)
  uint32_t replicas = 1;               // tracker replicas that share max_upstream_fetchers
  uint32_t max_leases_per_agent = 2;
  uint32_t max_leases_per_blob = 4;
  int head_start_ms = 500;  // a blob's chunk 0 fetches alone this long, or until it is ready
  int lease_ttl_s = 15;
  size_t max_blobs = 100'000;
  // The cluster-wide manifest cache (the manifest API).
  int manifest_ttl_s = 30;                // a tag resolution is served this long
  int manifest_missing_ttl_s = 10;        // an upstream 404 is answered this long (0: never)
  int manifest_lease_ttl_s = 10;          // an agent fetching a manifest for the cluster, at most
  size_t max_manifests = 10'000;          // manifests kept (LRU beyond)
  uint64_t max_manifest_cache_mib = 256;  // manifest bytes kept (LRU beyond)
  // Cluster prefetch jobs (the prefetch API).
  int prefetch_agent_ttl_s = 30;   // an agent that has not polled for this long is gone
  size_t max_prefetch_jobs = 256;  // jobs kept, running or ended
  int prefetch_keep_s = 3600;      // an ended job is kept this long
  // Who may call what (tracker/access.h): token files, re-read when they change.
  std::string agent_tokens_file;     // tokens the cluster's agents present
  std::string operator_tokens_file;  // tokens operators present (shoalctl)
  std::string peer_ca_cert;          // published chunk torrents must carry this CA (PEM file)
  bool insecure_open = false;        // no token files: anyone who reaches the tracker may call it
  uint32_t bad_reports_per_minute = 6;  // per source address; a burst of as many is allowed
  uint32_t bad_report_quorum = 2;       // distinct source addresses that drop a ready chunk
  std::string log_format = "json";
  std::string log_level = "info";
};

// Registers every flag (with its SHOAL_* environment variable) on app, writing into config.
// Parsing fails with a ValidationError when max_upstream_fetchers < replicas.
void AddTrackerFlags(CLI::App& app, TrackerConfig& config);

// The upstream leases this replica may grant: its share of the cluster's max_upstream_fetchers,
// max_upstream_fetchers / replicas rounded down, so the replicas' sum never exceeds the cap
// (replicas share no state, and each owns the leases of its own blobs).
uint32_t UpstreamLeasesPerReplica(const TrackerConfig& config);
// This replica's share of base_upstream_fetchers, rounded up (at least 1, at most
// UpstreamLeasesPerReplica).
uint32_t BaseUpstreamLeasesPerReplica(const TrackerConfig& config);

}  // namespace shoal::tracker
