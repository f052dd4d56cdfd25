#pragma once
// The agent's configuration: every flag has an environment-variable equivalent (SHOAL_*).

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "lib/core/error.h"

namespace shoal::agent {

struct AgentConfig {
  std::string listen = "127.0.0.1:5000";       // registry shim address (host:port; port 0 = any)
  std::string port_file;                       // if set, the bound port is written here
  std::string metrics_listen;  // host:port serving only /metrics and /healthz; empty: none
  std::string metrics_port_file;  // if set, the metrics listener's bound port is written here
  std::string cache_dir = "/var/lib/shoal";    // blob cache root (the instance SSD)
  std::vector<std::string> upstreams;          // "registry=url", e.g. docker.io=https://...
  std::string default_registry = "docker.io";  // for names without a registry
  std::string upstream_map_file;               // JSON map file (upstreams, auths, unmapped)
  std::string unmapped = "error";              // unmapped registries: error, https or a URL
  bool strict_upstreams = false;               // same as unmapped = "error"
  std::vector<std::string> pull_auth;          // "MODE" or "REGISTRY=MODE": client, node, deny
  std::string credentials_file;                // docker config.json with per-registry auth
  std::string ca_file;                         // extra CA bundle for upstream TLS
  int tag_ttl_s = 30;
  std::string cache_budget = "80%";  // bytes with a unit ("50GiB") or % of the cache's file system
  bool admin_any_address = false;    // serve /shoal/v1/ (cache admin) to non-loopback peers too
  bool https_proxy = false;          // answer CONNECT on the shim port (HTTPS proxy mode)
  std::string proxy_tunnel = "allow";  // CONNECTs not terminated: allow (tunnel) or deny (403)
  std::string proxy_ca_cert;           // proxy CA certificate (PEM); default <cache>/proxy-ca
  std::string proxy_ca_key;            // its key (PEM, mode 0600); with proxy_ca_cert
  int range_streams = 4;        // chunks of one blob in flight (upstream Range GETs or torrents)
  int head_streams = 1;         // of those, taken in order; the others take any ready chunk
  int64_t link_mbit = 0;        // this node's link; 0: the default route's interface speed
  double upstream_reserve = 0;  // share of the link kept from peers while fetching upstream
  uint64_t part_size_mib = 16;  // chunk size when no tracker dictates one
  std::vector<std::string> trackers;          // tracker replica base URLs; empty = no swarm
  std::string tracker_token_file;             // the cluster's agent token (re-read when it changes)
  std::string agent_id;                       // identity in leases; default hostname-pid
  // libtorrent listen address IP:port; "auto" as IP: the address this node reaches the first
  // tracker from (the node's own address, not every interface)
  std::string swarm_listen = "auto:6881";
  std::string peer_ca_cert;      // the cluster's peer CA certificate (PEM): peers use TLS
  std::string peer_ca_key;       // its key: this agent mints its peer certificate from it
  bool insecure_peers = false;   // no peer CA: plain, unauthenticated peers (tests, trials)
  int lease_wait_ms = 5000;                   // long-poll per lease request
  int ready_interval_ms = 250;  // a blob's ready poll no sooner than this after its last one
  std::string tracker_announce = "udp";  // chunk torrents announce over "udp", "http" or "batch"
  int tracker_grace_ms = 10000;  // tracker errors tolerated before fetching upstream directly
  int tracker_busy_grace_ms = 30000;  // a full tracker (503) is waited for this long, then upstream
  int manifest_wait_ms = 20000;  // longest wait on the tracker's manifest cache, then upstream
  int peer_stall_ms = 15000;     // a chunk with no verified piece for this long is re-leased
  // re-announces and re-publications to a restarted or failed tracker replica are spread over
  // this long, so that 2,500 agents do not all call the same replica in the same second
  int republish_spread_s = 10;
  int unchoke_slots = -1;        // peers uploaded to at once; -1: every interested LAN peer
  int disk_write_delay_us = 2000;  // writes alone wait this long for more before a disk wake-up
  int peers_per_chunk = 4;       // peer connections of one chunk torrent; 0: libtorrent's
  std::vector<std::string> libtorrent_settings;  // "name=value" settings_pack overrides
  std::string snapshotter_socket;  // containerd snapshotter's unix socket; empty = not served
  std::string snapshotter_root;    // its snapshots; default <cache_dir>/snapshotter
  bool snapshotter_no_prepare = false;  // leave every layer's fetch and unpack to containerd
  int snapshotter_prepare_timeout_ms = 300000;  // longest a Prepare waits for shoal's extraction
  int snapshotter_prepare_workers = 3;          // layers fetched and extracted at once
  std::string node_name;                 // cluster prefetch: this node's name; default hostname
  std::vector<std::string> node_labels;  // cluster prefetch: "k=v" labels for selectors
  std::string log_format = "json";
  std::string log_level = "info";
};

// Registers every flag (with its SHOAL_* environment variable) on app, writing into config.
void AddAgentFlags(CLI::App& app, AgentConfig& config);

}  // namespace shoal::agent
