#include "agent/config.h"

namespace shoal::agent {

void AddAgentFlags(CLI::App& app, AgentConfig& c) {
  app.add_option("--listen", c.listen, "Registry shim address host:port (port 0 picks one)")
      ->envname("SHOAL_LISTEN")
      ->capture_default_str();
  app.add_option("--port-file", c.port_file, "Write the bound shim port to this file")
      ->envname("SHOAL_PORT_FILE");
  app.add_option("--metrics-listen", c.metrics_listen,
                 "Also serve GET /metrics and /healthz, and nothing else, on host:port (e.g. the "
                 "node IP, for Prometheus, while the shim stays on loopback); empty: off")
      ->envname("SHOAL_METRICS_LISTEN");
  app.add_option("--metrics-port-file", c.metrics_port_file,
                 "Write the bound --metrics-listen port to this file")
      ->envname("SHOAL_METRICS_PORT_FILE");
  app.add_option("--cache-dir", c.cache_dir, "Blob cache directory (put it on the local SSD)")
      ->envname("SHOAL_CACHE_DIR")
      ->capture_default_str();
  app.add_option("--upstream,--upstream-map", c.upstreams,
                 "Upstream map entries REGISTRY=URL (repeatable or comma-separated), e.g. "
                 "gcr.io=https://gcr.io,docker.io=https://registry-1.docker.io (docker.io maps "
                 "to registry-1.docker.io unless set)")
      ->envname("SHOAL_UPSTREAMS")
      ->delimiter(',');
  app.add_option("--upstream-map-file", c.upstream_map_file,
                 "JSON upstream map: {\"upstreams\": {REGISTRY: URL or {\"url\", \"auth\" or "
                 "\"username\"/\"password\", \"pull_auth\"}}, \"auths\": {docker config.json "
                 "auths}, \"unmapped\": ..., \"pull_auth\": ...}; --upstream entries override it")
      ->envname("SHOAL_UPSTREAM_MAP_FILE");
  app.add_option("--unmapped", c.unmapped,
                 "Registries not in the upstream map: error (refused with NAME_UNKNOWN), https "
                 "(https://REGISTRY, only at global addresses: never loopback, link-local or "
                 "private) or a URL that serves them all; overrides the map file's unless error")
      ->envname("SHOAL_UNMAPPED")
      ->capture_default_str();
  app.add_option("--pull-auth", c.pull_auth,
                 "Who gets a registry's private repositories (anonymous upstream pulls refused): "
                 "client (clients whose own Basic credentials the upstream accepts; others get "
                 "401 with a challenge), node (every client: the node's credentials decide) or "
                 "deny (nobody: 404, clients go upstream). MODE sets the default (node), "
                 "REGISTRY=MODE one registry; repeatable or comma-separated; overrides the map "
                 "file's \"pull_auth\"")
      ->envname("SHOAL_PULL_AUTH")
      ->delimiter(',');
  app.add_option("--default-registry", c.default_registry,
                 "Registry for names without a registry prefix or ?ns=")
      ->envname("SHOAL_DEFAULT_REGISTRY")
      ->capture_default_str();
  app.add_flag("--strict-upstreams", c.strict_upstreams,
               "Refuse registries that are not in the upstream map, whatever --unmapped and the "
               "map file say")
      ->envname("SHOAL_STRICT_UPSTREAMS");
  app.add_option("--credentials", c.credentials_file,
                 "docker config.json with upstream credentials per registry")
      ->envname("SHOAL_CREDENTIALS");
  app.add_option("--ca-file", c.ca_file, "Extra CA certificates (PEM) for upstream TLS")
      ->envname("SHOAL_CA_FILE");
  app.add_option("--cache-budget", c.cache_budget,
                 "Disk budget of the blob cache: bytes with a unit (50GiB, 512MiB) or a percentage "
                 "of the cache's file system (80%); 0 = unlimited. Least recently used unpinned "
                 "blobs that are not being served are evicted beyond it")
      ->envname("SHOAL_CACHE_BUDGET")
      ->capture_default_str();
  app.add_flag("--admin-any-address", c.admin_any_address,
               "Answer the cache admin API (/shoal/v1/cache...) from any address, not only from "
               "loopback")
      ->envname("SHOAL_ADMIN_ANY_ADDRESS");
  app.add_flag("--https-proxy", c.https_proxy,
               "Also be dockerd's HTTPS proxy on the shim port: CONNECTs to registries in the "
               "upstream map (except docker.io) are answered with a certificate of the node CA "
               "and served from the cache; trust GET /shoal/v1/proxy/ca.crt in "
               "/etc/docker/certs.d/<registry>/ca.crt")
      ->envname("SHOAL_HTTPS_PROXY");
  app.add_option("--proxy-tunnel", c.proxy_tunnel,
                 "Other CONNECTs in proxy mode: allow (tunnel bytes untouched, for clients on this "
                 "node only) or deny (403)")
      ->envname("SHOAL_PROXY_TUNNEL")
      ->check(CLI::IsMember({"allow", "deny"}))
      ->capture_default_str();
  app.add_option("--proxy-ca-cert", c.proxy_ca_cert,
                 "Proxy CA certificate (PEM); default: created once as <cache>/proxy-ca/ca.crt")
      ->envname("SHOAL_PROXY_CA_CERT");
  app.add_option("--proxy-ca-key", c.proxy_ca_key,
                 "Proxy CA private key (PEM; keep it mode 0600); default <cache>/proxy-ca/ca.key")
      ->envname("SHOAL_PROXY_CA_KEY");
  app.add_option("--tag-ttl", c.tag_ttl_s, "Seconds a tag resolution is cached")
      ->envname("SHOAL_TAG_TTL")
      ->check(CLI::Range(0, 86400))
      ->capture_default_str();
  app.add_option("--range-streams", c.range_streams,
                 "Chunks of one blob worked on at once (upstream Range requests or torrents)")
      ->envname("SHOAL_RANGE_STREAMS")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--head-streams", c.head_streams,
                 "Of the --range-streams of a blob, how many take its chunks in order (what the "
                 "client streams first); the others take any chunk the tracker says is ready, so "
                 "that nodes do not all want the same chunks at once")
      ->envname("SHOAL_HEAD_STREAMS")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--link-mbit", c.link_mbit,
                 "This node's link speed in Mbit/s, for --upstream-reserve; 0 reads the speed of "
                 "the default route's interface (/sys/class/net/IF/speed)")
      ->envname("SHOAL_LINK_MBIT")
      ->check(CLI::Range(int64_t{0}, int64_t{10000000}))
      ->capture_default_str();
  app.add_option("--upstream-reserve", c.upstream_reserve,
                 "While this agent fetches from upstream under a lease, its peer downloads are "
                 "held to (1 - this) of the link, so the upstream flows keep up; 0 (the default) "
                 "turns it off, and so does a link of unknown speed. Experimental: shoal-sim "
                 "gains from 0.5 at 10 Gbit/s, a 6-node bench at 100 Mbit/s lost (benchmarks.md)")
      ->envname("SHOAL_UPSTREAM_RESERVE")
      ->check(CLI::Range(0.0, 0.9))
      ->capture_default_str();
  app.add_option("--part-size-mib", c.part_size_mib,
                 "Chunk size in MiB when no tracker dictates one (one Range request each)")
      ->envname("SHOAL_PART_SIZE_MIB")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--tracker", c.trackers,
                 "Tracker replica base URL (repeatable or comma-separated), e.g. "
                 "http://shoal-tracker:7070; none = no swarm, every blob from upstream")
      ->envname("SHOAL_TRACKERS")
      ->delimiter(',');
  app.add_option("--tracker-token-file", c.tracker_token_file,
                 "File holding the cluster's agent token (its first line), sent to the tracker "
                 "as a bearer token and, as its announce key, in announce URLs. Re-read when it "
                 "changes (a Kubernetes Secret volume), so the token rotates without a restart")
      ->envname("SHOAL_TRACKER_TOKEN_FILE");
  app.add_option("--agent-id", c.agent_id, "This agent's identity in leases (default host-pid)")
      ->envname("SHOAL_AGENT_ID");
  app.add_option("--swarm-listen", c.swarm_listen,
                 "BitTorrent listen address IP:port. IP \"auto\": the address this node reaches "
                 "the first tracker from (the node's own address); 0.0.0.0 listens on every "
                 "interface and announces once per interface")
      ->envname("SHOAL_SWARM_LISTEN")
      ->capture_default_str();
  app.add_option("--peer-ca-cert", c.peer_ca_cert,
                 "The cluster's peer CA certificate (PEM). Chunk torrents carry it, and peers "
                 "connect over TLS with certificates issued by it: only the cluster's agents "
                 "take part in the swarm")
      ->envname("SHOAL_PEER_CA_CERT")
      ->check(CLI::ExistingFile);
  app.add_option("--peer-ca-key", c.peer_ca_key,
                 "The peer CA's private key (PEM): this agent mints its own peer certificate "
                 "from it at start (CN = --agent-id, valid 1 year)")
      ->envname("SHOAL_PEER_CA_KEY")
      ->check(CLI::ExistingFile);
  app.add_flag("--insecure-peers", c.insecure_peers,
               "Run the swarm without --peer-ca-cert/--peer-ca-key: plain TCP peers, and anyone "
               "who reaches the swarm port and knows a chunk's info-hash can download it")
      ->envname("SHOAL_INSECURE_PEERS");
  app.add_option("--lease-wait-ms", c.lease_wait_ms, "Long-poll per lease request")
      ->envname("SHOAL_LEASE_WAIT_MS")
      ->check(CLI::Range(0, 10000))
      ->capture_default_str();
  app.add_option("--ready-interval-ms", c.ready_interval_ms,
                 "A blob's ready watcher asks the tracker which of its chunks are ready no sooner "
                 "than this after its last ask (0: at once). Larger values batch more chunks into "
                 "one call: fewer tracker requests in a cold pull (shoal-sim at 2,500 nodes: 79% "
                 "fewer ready polls), each chunk's torrent up to this much later")
      ->envname("SHOAL_READY_INTERVAL_MS")
      ->check(CLI::Range(0, 5000))
      ->capture_default_str();
  app.add_option("--tracker-announce", c.tracker_announce,
                 "How chunk torrents announce to http:// replicas: udp (BEP 15 on the replica's "
                 "port number, one datagram each way; needs the tracker's --udp-announce), http "
                 "(a TCP connection per announce; https:// replicas always get HTTPS), or batch "
                 "(to the agent's own relay on the swarm's address, which sends them to the replica in "
                 "batches: POST /v1/announces, one request for many announces; the chart's "
                 "default, for clusters of hundreds of nodes and more)")
      ->envname("SHOAL_TRACKER_ANNOUNCE")
      ->check(CLI::IsMember({"udp", "http", "batch"}))
      ->capture_default_str();
  app.add_option("--tracker-grace-ms", c.tracker_grace_ms,
                 "How long tracker errors are retried before fetching from upstream directly")
      ->envname("SHOAL_TRACKER_GRACE_MS")
      ->check(CLI::Range(0, 600000))
      ->capture_default_str();
  app.add_option("--tracker-busy-grace-ms", c.tracker_busy_grace_ms,
                 "How long a full tracker (503 with Retry-After, at --max-connections) is asked "
                 "again, at the pace it sets, before fetching from upstream directly")
      ->envname("SHOAL_TRACKER_BUSY_GRACE_MS")
      ->check(CLI::Range(0, 600000))
      ->capture_default_str();
  app.add_option("--manifest-wait-ms", c.manifest_wait_ms,
                 "Longest wait for another agent's upstream manifest fetch through the "
                 "tracker's manifest cache before fetching it upstream directly")
      ->envname("SHOAL_MANIFEST_WAIT_MS")
      ->check(CLI::Range(0, 600000))
      ->capture_default_str();
  app.add_option("--republish-spread-s", c.republish_spread_s,
                 "When a tracker replica restarts or stops answering, this agent's re-announces "
                 "and re-publications of what it holds are spread at random over this long "
                 "(0: at once; keep the default on large clusters)")
      ->envname("SHOAL_REPUBLISH_SPREAD_S")
      ->check(CLI::Range(0, 600))
      ->capture_default_str();
  app.add_option("--peer-stall-ms", c.peer_stall_ms,
                 "A chunk with no verified piece from peers for this long is re-leased")
      ->envname("SHOAL_PEER_STALL_MS")
      ->check(CLI::Range(100, 600000))
      ->capture_default_str();
  app.add_option("--unchoke-slots", c.unchoke_slots,
                 "Peers this agent uploads to at once over all chunks; -1 unchokes every "
                 "interested peer (right on a LAN, where TCP shares the link fairly)")
      ->envname("SHOAL_UNCHOKE_SLOTS")
      ->check(CLI::Range(-1, 100000))
      ->capture_default_str();
  app.add_option("--peers-per-chunk", c.peers_per_chunk,
                 "Peer connections of one chunk torrent, incoming and outgoing; an announce "
                 "asks for half as many peers. Few keep TLS handshakes and duplicate blocks "
                 "down; 0: libtorrent's defaults (200 peers asked for, no per-chunk limit)")
      ->envname("SHOAL_PEERS_PER_CHUNK")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--disk-write-delay-us", c.disk_write_delay_us,
                 "Blocks received from peers wait up to this long (or until 256 KiB are queued) "
                 "for more before the disk thread wakes to write them in one pwritev; hashes and "
                 "reads never wait. 0: wake for every round of libtorrent's network loop")
      ->envname("SHOAL_DISK_WRITE_DELAY_US")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--libtorrent-setting", c.libtorrent_settings,
                 "Override one libtorrent settings_pack value, NAME=VALUE (repeatable or "
                 "comma-separated), e.g. max_out_request_queue=64; for tuning, applied last")
      ->envname("SHOAL_LIBTORRENT_SETTINGS")
      ->delimiter(',');
  app.add_option("--snapshotter-socket", c.snapshotter_socket,
                 "Serve containerd's snapshots API on this unix socket (a proxy snapshotter: "
                 "[proxy_plugins.shoal] type = \"snapshot\", address = this path); empty: off")
      ->envname("SHOAL_SNAPSHOTTER_SOCKET");
  app.add_option("--snapshotter-root", c.snapshotter_root,
                 "Directory of the snapshotter's overlayfs snapshots and their metadata (on the "
                 "node's SSD, a file system with d_type); default <cache-dir>/snapshotter")
      ->envname("SHOAL_SNAPSHOTTER_ROOT");
  app.add_flag("--snapshotter-no-prepare", c.snapshotter_no_prepare,
               "Do not prepare layers for containerd's CRI pulls: containerd then fetches every "
               "layer from the shim and unpacks it itself")
      ->envname("SHOAL_SNAPSHOTTER_NO_PREPARE");
  app.add_option("--snapshotter-prepare-timeout-ms", c.snapshotter_prepare_timeout_ms,
                 "Longest a layer's Prepare waits for shoal to fetch and extract it; then "
                 "containerd fetches and unpacks that layer itself")
      ->envname("SHOAL_SNAPSHOTTER_PREPARE_TIMEOUT_MS")
      ->check(CLI::Range(1, 3'600'000))
      ->capture_default_str();
  app.add_option("--snapshotter-prepare-workers", c.snapshotter_prepare_workers,
                 "Layers of an image fetched and extracted at once for the snapshotter")
      ->envname("SHOAL_SNAPSHOTTER_PREPARE_WORKERS")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--node-name", c.node_name,
                 "This node's name for cluster prefetch jobs (shoalctl prefetch --nodes); default "
                 "the hostname (in Kubernetes set it from spec.nodeName)")
      ->envname("SHOAL_NODE_NAME");
  app.add_option("--node-labels", c.node_labels,
                 "Labels KEY=VALUE (comma-separated) that prefetch jobs select nodes by "
                 "(shoalctl prefetch --selector)")
      ->envname("SHOAL_NODE_LABELS")
      ->delimiter(',');
  app.add_option("--log-format", c.log_format, "json or text")
      ->envname("SHOAL_LOG_FORMAT")
      ->check(CLI::IsMember({"json", "text"}))
      ->capture_default_str();
  app.add_option("--log-level", c.log_level, "trace, debug, info, warn or error")
      ->envname("SHOAL_LOG_LEVEL")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
}

}  // namespace shoal::agent
