#include "agent/agent.h"

#include <utility>

#include <csignal>

#include <fstream>
#include <map>
#include <thread>

#include <sys/stat.h>
#include <unistd.h>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "agent/announce_relay.h"
#include "agent/chunk_fetcher.h"
#include "agent/https_proxy.h"
#include "agent/on_pool.h"
#include "agent/prefetch.h"
#include "agent/prefetch_poller.h"
#include "agent/pull_through.h"
#include "agent/seed_book.h"
#include "agent/swarm_metrics.h"
#include "agent/swarm_setup.h"
#include "agent/tracker_client.h"
#include "lib/http/udp_probe.h"
#include "lib/auth/tokens.h"
#include "lib/core/fd_limit.h"
#include "lib/core/log.h"
#include "lib/store/blob_store.h"
#include "lib/upstream/credentials.h"
#include "lib/upstream/registry_client.h"
#include "lib/upstream/upstream_map.h"
#include "registry-shim/metrics.h"
#include "registry-shim/server.h"
#include "agent/layer_source.h"
#include "snapshotter/layer_prep.h"
#include "snapshotter/service.h"
#include "snapshotter/store.h"

namespace shoal::agent {
namespace asio = boost::asio;

namespace {

// UDP announces to a replica that timed out within one check, while its HTTP API answered, before
// both its ports are probed (and its announces move to HTTP if only TCP answers).
constexpr uint64_t kUdpTimeoutsBeforeHttp = 3;

// Follows the announce URLs every chunk torrent must carry: when the agent token's file gives a
// new token, every chunk torrent announces with the new announce key (the old one stops working
// once the trackers drop the old token); when a replica's UDP announces keep timing out while
// its HTTP API answers, and a probe then finds its TCP port open and its UDP port silent (UDP
// blocked on the way, not a replica that died or restarted), they move to HTTP.
asio::awaitable<void> FollowAnnounceUrls(asio::io_context& ioc, asio::thread_pool& pool,
                                         TrackerClient& tracker, swarm::Swarm& swarm) {
  uint64_t seen = tracker.token_generation();
  std::map<std::string, uint64_t> timeouts_seen;
  asio::steady_timer timer(ioc);
  for (;;) {
    timer.expires_after(std::chrono::seconds(5));
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return;
    bool moved = false;
    const std::map<std::string, uint64_t> timeouts = swarm.UdpAnnounceTimeouts();
    const std::vector<std::string> before = tracker.AnnounceUrls();
    for (size_t r = 0; r < tracker.replicas(); ++r) {
      if (!tracker.AnnouncesOverUdp(r)) continue;
      const std::string base = before[r].substr(0, before[r].find('?'));
      auto it = timeouts.find(base);
      const uint64_t now_count = it == timeouts.end() ? 0 : it->second;
      const uint64_t grew = now_count - timeouts_seen[base];
      timeouts_seen[base] = now_count;
      if (grew < kUdpTimeoutsBeforeHttp || !tracker.AnsweredWithin(r, std::chrono::seconds(30)))
        continue;
      // Timeouts alone do not tell a blocked UDP port from a replica that died or restarted
      // a moment ago (its HTTP answer was from before): ask both ports now.
      const http::Url url = tracker.Replica(r);
      // By reference, as on_pool.h asks (url lives in this frame until the call ends).
      const http::UdpReach reach = co_await OnPool(pool, [&url] {
        return http::ProbeUdpAnnounce(url, 3, std::chrono::milliseconds(300));
      });
      if (reach == http::UdpReach::kTcpOnly) {
        tracker.AnnounceOverHttp(r, "UDP announces to it time out while its TCP port answers");
        moved = true;
      } else {
        spdlog::info("tracker {}: {} UDP announces timed out, but {}: they stay on UDP",
                     url.str(), grew,
                     reach == http::UdpReach::kAnswers ? "its UDP port answers now"
                                                       : "it does not answer at all (down)");
      }
    }
    std::vector<std::string> urls = tracker.AnnounceUrls();  // re-reads a changed token file
    if (tracker.token_generation() != seen) {
      seen = tracker.token_generation();
      spdlog::info("agent token rotated: chunk torrents announce with its new key");
      moved = true;
    }
    if (moved) swarm.ReplaceTrackers(urls);
  }
}

Result<std::vector<http::Url>> ParseTrackers(const std::vector<std::string>& specs) {
  std::vector<http::Url> out;
  for (const auto& spec : specs) {
    if (spec.empty()) continue;
    auto url = http::Url::Parse(spec);
    if (!url) return MakeError(ErrorCode::kInvalidArgument, "--tracker: " + url.error().message);
    url.value().target = "/";
    out.push_back(url.value());
  }
  return out;
}

// Whether two existing paths are on one file system (same device).
bool SameFileSystem(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev;
}

std::string DefaultAgentId() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "agent");
  return std::string(host) + "-" + std::to_string(getpid());
}

Result<std::pair<std::string, uint16_t>> SplitHostPort(const std::string& listen) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return MakeError(ErrorCode::kInvalidArgument, "--listen \"" + listen + "\" must be HOST:PORT");
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  try {
    int port = std::stoi(listen.substr(colon + 1));
    if (port < 0 || port > 65535) throw std::out_of_range("port");
    return std::make_pair(host, static_cast<uint16_t>(port));
  } catch (const std::exception&) {
    return MakeError(ErrorCode::kInvalidArgument, "--listen \"" + listen + "\" has a bad port");
  }
}

}  // namespace

int RunAgent(const AgentConfig& config) {
  // No peer may end this process: a client that closes its connection during a sendfile(2)
  // body would otherwise kill it with SIGPIPE (exit 141, no log line). Writes then fail with
  // EPIPE, which the code handles.
  std::signal(SIGPIPE, SIG_IGN);
  InitLogging(config.log_format, config.log_level, "shoal-agent");
  // Peer connections, client connections and open blob files are all descriptors.
  if (uint64_t fds = RaiseFdLimit(); fds < 4096) {
    spdlog::warn("the open-file limit is {}; a busy node may run out of descriptors", fds);
  }
  auto fail = [](const Error& e) {
    spdlog::critical("startup failed: {}", e.ToString());
    return 1;
  };

  auto store = store::BlobStore::Open(config.cache_dir);
  if (!store) return fail(store.error());
  if (store.value()->cleaned_temp_files() > 0) {
    spdlog::info("removed {} partial files left by an earlier run",
                 store.value()->cleaned_temp_files());
  }
  if (auto st = store.value()->SetBudgetSpec(config.cache_budget); !st) return fail(st.error());
  {
    store::CacheStats cs = store.value()->Stats();
    spdlog::info("cache {}: {} blobs, {} bytes; budget {} bytes ({}); {} bytes pinned",
                 config.cache_dir, cs.blobs, cs.bytes, cs.budget, config.cache_budget,
                 cs.pinned_bytes);
  }
  // Credentials: --credentials, then the map file's (which win for the same registry).
  upstream::Credentials credentials;
  if (!config.credentials_file.empty()) {
    auto loaded = upstream::Credentials::LoadDockerConfig(config.credentials_file);
    if (!loaded) return fail(loaded.error());
    credentials = std::move(loaded.value());
  }
  // The upstream map: the file, then --upstream entries, then the unmapped policy flags (a
  // --unmapped left at its default does not override the file's policy).
  upstream::UpstreamMap upstreams;
  if (!config.upstream_map_file.empty()) {
    if (auto st = upstreams.LoadFile(config.upstream_map_file, credentials); !st)
      return fail(st.error());
  }
  if (auto st = upstreams.AddSpecs(config.upstreams); !st) return fail(st.error());
  if (config.unmapped != AgentConfig{}.unmapped || config.upstream_map_file.empty()) {
    if (auto st = upstreams.SetUnmapped(config.unmapped); !st) return fail(st.error());
  }
  if (config.strict_upstreams) (void)upstreams.SetUnmapped("error");
  for (const auto& spec : config.pull_auth) {
    if (spec.empty()) continue;
    if (auto st = upstreams.SetPullAuth(spec); !st) return fail(st.error());
  }
  spdlog::info("upstream map: {}; credentials for {} registries", upstreams.Describe(),
               credentials.size());
  auto listen = SplitHostPort(config.listen);
  if (!listen) return fail(listen.error());

  asio::io_context ioc(1);
  // Hashing, fsync and other blocking work; never on the network thread.
  asio::thread_pool pool(2);
  prometheus::Registry registry;

  upstream::ClientOptions client_options;
  client_options.ca_file = config.ca_file;
  upstream::RegistryClient client(ioc.get_executor(), client_options, std::move(credentials));

  auto trackers = ParseTrackers(config.trackers);
  if (!trackers) return fail(trackers.error());
  TrackerClientOptions tracker_options;
  tracker_options.trackers = trackers.value();
  tracker_options.udp_announce = config.tracker_announce == "udp";
  tracker_options.agent_id = config.agent_id.empty() ? DefaultAgentId() : config.agent_id;
  if (!config.tracker_token_file.empty()) {
    auto token = auth::ClientToken::Open(config.tracker_token_file);
    if (!token) return fail(token.error());
    tracker_options.token = std::make_shared<auth::ClientToken>(std::move(token.value()));
  } else if (!tracker_options.trackers.empty()) {
    spdlog::warn(
        "no --tracker-token-file: only a tracker started with --insecure-open will answer");
  }
  // --tracker-announce batch: chunk torrents announce to the relay (started below).
  AnnounceRelay* relay_for_urls = nullptr;
  if (config.tracker_announce == "batch" && !tracker_options.trackers.empty()) {
    tracker_options.relay_url = [&relay_for_urls](size_t r) { return relay_for_urls->Url(r); };
  }
  TrackerClient tracker(ioc.get_executor(), tracker_options);
  std::unique_ptr<AnnounceRelay> relay;

  // The swarm runs only with a tracker: without one there is nobody to find peers through.
  std::unique_ptr<swarm::Swarm> swarm;
  std::unique_ptr<SeedBook> seeds;
  std::unique_ptr<SwarmMetrics> swarm_metrics;
  if (tracker.enabled()) {
    // UDP announces: a replica whose UDP port does not answer while its TCP port does (UDP
    // blocked on the way) gets HTTP announces from the start (lib/http/udp_probe.h).
    for (size_t r = 0; r < tracker.replicas(); ++r) {
      if (!tracker.AnnouncesOverUdp(r)) continue;
      if (http::ProbeUdpAnnounce(tracker_options.trackers[r], 3, std::chrono::milliseconds(300)) ==
          http::UdpReach::kTcpOnly) {
        tracker.AnnounceOverHttp(r, "its UDP announce port does not answer, its TCP port does");
      }
    }
    auto swarm_options =
        MakeSwarmOptions(config, tracker_options.trackers.front(), tracker.agent_id());
    if (!swarm_options) return fail(swarm_options.error());
    if (tracker_options.relay_url) {
      // On the swarm's address: libtorrent announces from its listen socket's.
      const std::string& li = swarm_options.value().listen_interface;
      std::string host = li.substr(0, li.rfind(':'));
      if (host.size() > 1 && host.front() == '[') host = host.substr(1, host.size() - 2);
      if (host == "0.0.0.0" || host == "::") host = "127.0.0.1";
      relay = std::make_unique<AnnounceRelay>(ioc, tracker);
      if (auto st = relay->Start(host); !st) return fail(st.error());
      relay_for_urls = relay.get();
    }
    swarm = std::make_unique<swarm::Swarm>(ioc, std::move(swarm_options.value()));
    if (auto st = swarm->Start(); !st) return fail(st.error());
    seeds =
        std::make_unique<SeedBook>(config.cache_dir + "/swarm", *store.value(), *swarm, &tracker);
    size_t restored = seeds->Restore();
    swarm_metrics = std::make_unique<SwarmMetrics>(registry);
    spdlog::info("swarm listening on port {} as {}; {} tracker replica(s); seeding {} cached blobs",
                 swarm->listen_port(), tracker.agent_id(), trackers.value().size(), restored);
    // A chunk announces to its blob's owner only (lib/swarm/session.h, ChunkSpec). A restarted
    // replica lost its peer lists and tables: the chunks it owns announce to it again and their
    // tables are re-published. A replica that stops answering: its blobs' chunks announce to the
    // next tier and their tables are re-published to the next replica, so seeders are found
    // there and no chunk goes to upstream again. Both are spread over random moments, so that
    // 2,500 agents do not come at once.
    // The chunk torrents and blobs that reach `replica` now (their earlier replicas down): a
    // restarted one lost their peers and tables; a failing one's move on to the next replica.
    auto reach = [&tracker](size_t replica) {
      return [&tracker, replica](const std::vector<std::string>& urls) {
        return tracker.Reaches(tracker.ReplicasOf(urls), replica);
      };
    };
    // How long re-announces and re-publications after a replica restart or failure are spread.
    const std::chrono::seconds spread{config.republish_spread_s};
    tracker.OnRestart([&seeds, &swarm, &ioc, &tracker, reach, spread](size_t replica) {
      size_t n = swarm->ReannounceWhere(reach(replica), spread);
      spdlog::info("re-announcing {} chunk torrents to the restarted tracker within {} s", n,
                   spread.count());
      asio::co_spawn(ioc,
                     seeds->RepublishAll(
                         [&tracker, replica](const Digest& d) {
                           return tracker.Reaches(tracker.Order(d), replica);
                         },
                         spread),
                     asio::detached);
    });
    tracker.OnFailing([&seeds, &swarm, &ioc, &tracker, reach, spread](size_t replica) {
      size_t n = swarm->ReannounceWhere(reach(replica), spread);
      spdlog::info("moving {} chunk torrents to the next tracker replica within {} s", n,
                   spread.count());
      asio::co_spawn(ioc,
                     seeds->RepublishAll(
                         [&tracker, replica](const Digest& d) {
                           return tracker.Reaches(tracker.Order(d), replica);
                         },
                         spread),
                     asio::detached);
    });
    asio::co_spawn(ioc, seeds->RepublishAll(), asio::detached);
    if (tracker_options.token || tracker_options.udp_announce)
      asio::co_spawn(ioc, FollowAnnounceUrls(ioc, pool, tracker, *swarm), asio::detached);
  } else {
    spdlog::info("no --tracker: every blob comes from upstream, no peer-to-peer");
  }

  ChunkFetchMetrics fetch_metrics(registry);
  ChunkFetchOptions fetch_options;
  fetch_options.local_layout.chunk_size = config.part_size_mib << 20;
  fetch_options.local_layout.piece_size = 4u << 20;
  while (fetch_options.local_layout.chunk_size % fetch_options.local_layout.piece_size != 0)
    fetch_options.local_layout.piece_size /= 2;
  fetch_options.window = config.range_streams;
  fetch_options.head_streams = config.head_streams;
  fetch_options.lease_wait = std::chrono::milliseconds(config.lease_wait_ms);
  fetch_options.ready_interval = std::chrono::milliseconds(config.ready_interval_ms);
  fetch_options.tracker_grace = std::chrono::milliseconds(config.tracker_grace_ms);
  fetch_options.tracker_busy_grace = std::chrono::milliseconds(config.tracker_busy_grace_ms);
  fetch_options.peer_stall = std::chrono::milliseconds(config.peer_stall_ms);
  std::unique_ptr<UpstreamReserve> reserve;
  if (swarm && config.upstream_reserve > 0) {
    Result<int64_t> mbit =
        config.link_mbit > 0 ? Result<int64_t>(config.link_mbit) : DefaultRouteLinkMbit();
    if (mbit) {
      const auto cap = static_cast<int64_t>(static_cast<double>(mbit.value()) * 1e6 / 8 *
                                            (1 - config.upstream_reserve));
      reserve = std::make_unique<UpstreamReserve>(
          cap, [&swarm](int64_t bytes_per_s) { swarm->CapDownloadRate(bytes_per_s); });
      spdlog::info(
          "upstream reserve: while fetching from upstream, peer downloads held to {} "
          "MB/s ({:g} of a {} Mbit/s link{})",
          cap / 1000000, 1 - config.upstream_reserve, mbit.value(),
          config.link_mbit > 0 ? "" : ", the default route's interface");
    } else {
      spdlog::info("upstream reserve off: link speed unknown ({}); set --link-mbit",
                   mbit.error().message);
    }
  }
  FetchServices services{ioc,           client,       tracker.enabled() ? &tracker : nullptr,
                         swarm.get(),   seeds.get(),  fetch_options,
                         fetch_metrics, reserve.get()};

  std::unique_ptr<HttpsProxy> https_proxy;
  if (config.https_proxy) {
    auto made = MakeHttpsProxy(config, upstreams);
    if (!made) return fail(made.error());
    https_proxy = std::move(made.value());
  }

  PullThroughOptions options;
  options.upstreams = std::move(upstreams);
  options.tag_ttl = std::chrono::seconds(config.tag_ttl_s);
  options.tracker_manifest_wait = std::chrono::milliseconds(config.manifest_wait_ms);
  PullThrough backend(ioc, pool, *store.value(), services, std::move(options), registry);
  // Before a blob's file goes, its chunk torrents leave the swarm (they read that file).
  store.value()->SetEvictHook([&seeds](const Digest& digest) {
    if (seeds) seeds->Forget(digest);
  });
  backend.RegisterCacheMetrics(registry);
  backend.Evict();  // the budget may be smaller than what an earlier run left

  shim::Metrics shim_metrics = shim::Metrics::Create(registry);
  shim::ServerOptions server_options;
  server_options.default_registry = config.default_registry;
  server_options.admin_any_address = config.admin_any_address;
  shim::Server server(ioc, backend, shim_metrics, server_options);
  if (https_proxy) server.EnableProxy(https_proxy->options);
  Prefetcher prefetcher(ioc, backend, *store.value());
  // Cluster prefetch: with a tracker, ask every replica for jobs for this node.
  auto node_labels = ParseNodeLabels(config.node_labels);
  if (!node_labels) return fail(node_labels.error());
  PrefetchPollerOptions poller_options;
  poller_options.node = config.node_name.empty() ? DefaultNodeName() : config.node_name;
  poller_options.labels = std::move(node_labels.value());
  if (swarm) poller_options.swarm_port = swarm->listen_port();
  PrefetchPoller poller(ioc, tracker, prefetcher, std::move(poller_options));
  if (tracker.enabled()) poller.Start();
  server.SetAdminHandler(
      [&backend, &prefetcher](const std::string& method, const std::string& target) {
        if (Prefetcher::Owns(target)) return prefetcher.HandleAdmin(method, target);
        return backend.HandleAdmin(method, target);
      });
  // The snapshotter's layer preparation (below), counted at each scrape from its totals.
  std::unique_ptr<snapshotter::LayerPrep> layer_prep;
  auto& prep_layers = prometheus::BuildCounter()
                          .Name("shoal_snapshotter_layers_total")
                          .Help("containerd unpacker Prepares of a layer, by result: prepared "
                                "(extracted by the agent, or there already) or fallback (left "
                                "to containerd)")
                          .Register(registry);
  prometheus::Counter& prep_prepared = prep_layers.Add({{"result", "prepared"}});
  prometheus::Counter& prep_fallback = prep_layers.Add({{"result", "fallback"}});
  prometheus::Counter& prep_extracted =
      prometheus::BuildCounter()
          .Name("shoal_snapshotter_layers_extracted_total")
          .Help("Layers the agent fetched and extracted for the snapshotter (claimed or not)")
          .Register(registry)
          .Add({});
  auto& snapshot_bytes = prometheus::BuildGauge()
                             .Name("shoal_snapshotter_bytes")
                             .Help(
                                 "Bytes on disk of the snapshotter's layers, by state: committed "
                                 "(snapshots) or staged (extracted, waiting for containerd's "
                                 "Prepare); on the cache's disk they count against its budget")
                             .Register(registry);
  prometheus::Gauge& snapshot_committed = snapshot_bytes.Add({{"state", "committed"}});
  prometheus::Gauge& snapshot_staged = snapshot_bytes.Add({{"state", "staged"}});
  std::unique_ptr<snapshotter::Store> snapshots;
  snapshotter::LayerPrepStats prep_seen;
  auto update_prep_metrics = [&] {
    if (snapshots) snapshot_committed.Set(static_cast<double>(snapshots->CommittedBytes()));
    if (!layer_prep) return;
    snapshot_staged.Set(static_cast<double>(layer_prep->StagedBytes()));
    snapshotter::LayerPrepStats now = layer_prep->stats();
    prep_prepared.Increment(static_cast<double>(now.prepared - prep_seen.prepared));
    prep_fallback.Increment(static_cast<double>(now.fallbacks - prep_seen.fallbacks));
    prep_extracted.Increment(static_cast<double>(now.extracted - prep_seen.extracted));
    prep_seen = now;
  };
  std::function<std::string()> metrics_text = [&registry, &swarm, &swarm_metrics, &backend,
                                                &update_prep_metrics] {
    if (swarm && swarm_metrics) swarm_metrics->Update(swarm->Stats());
    backend.UpdateCacheMetrics();
    update_prep_metrics();
    return prometheus::TextSerializer().Serialize(registry.Collect());
  };
  server.SetMetricsHandler(metrics_text);
  // Prometheus on the node IP while the shim (and the pull API) stays on loopback.
  std::unique_ptr<shim::Server> metrics_server;
  if (!config.metrics_listen.empty()) {
    auto where = SplitHostPort(config.metrics_listen);
    if (!where) return fail(where.error());
    shim::ServerOptions metrics_options;
    metrics_options.metrics_only = true;
    metrics_server = std::make_unique<shim::Server>(ioc, backend, shim_metrics, metrics_options);
    metrics_server->SetMetricsHandler(metrics_text);
    auto bound = metrics_server->Listen(where.value().first, where.value().second);
    if (!bound) return fail(bound.error());
    if (!config.metrics_port_file.empty()) {
      std::string tmp = config.metrics_port_file + ".tmp";
      std::ofstream(tmp) << bound.value() << "\n";
      std::rename(tmp.c_str(), config.metrics_port_file.c_str());
    }
    metrics_server->Start();
    spdlog::info("metrics (only /metrics and /healthz) on {}:{}", where.value().first,
                 bound.value());
  }
  // The containerd snapshotter: gRPC's own threads serve it, beside the io_context. It is up
  // before the port file is written, which tells supervisors and tests the agent is ready.
  std::unique_ptr<PullThroughLayerSource> layer_source;
  std::unique_ptr<snapshotter::Server> snapshot_server;
  if (!config.snapshotter_socket.empty()) {
    std::string root = config.snapshotter_root.empty() ? config.cache_dir + "/snapshotter"
                                                       : config.snapshotter_root;
    auto opened = snapshotter::Store::Open(root);
    if (!opened) {
      return fail(MakeError(ErrorCode::kIo, "snapshotter store: " + opened.error().ToString()));
    }
    snapshots = std::move(opened.value());
    // On the cache's disk, extracted layers share its budget: blobs are evicted to make room
    // for them (issue 18 item 4). containerd's GC (Remove) gives their space back.
    snapshotter::LayerPrepOptions prep_options;
    if (SameFileSystem(snapshots->root(), config.cache_dir)) {
      store.value()->SetExternalUsage([&snapshots, &layer_prep] {
        return snapshots->CommittedBytes() + (layer_prep ? layer_prep->StagedBytes() : 0);
      });
      auto recheck = [&ioc, &backend] { asio::post(ioc, [&backend] { backend.Evict(); }); };
      snapshots->SetOnChange(recheck);
      prep_options.on_staged = recheck;
    } else {
      spdlog::info(
          "snapshotter root {} is not on the cache's file system: its layers are not "
          "counted in the cache budget",
          snapshots->root());
    }
    // Layers of containerd's CRI pulls, fetched and extracted by the agent (layer_prep.h).
    if (!config.snapshotter_no_prepare) {
      layer_source = std::make_unique<PullThroughLayerSource>(ioc, backend, *store.value());
      prep_options.workers = static_cast<unsigned>(config.snapshotter_prepare_workers);
      prep_options.timeout = std::chrono::milliseconds(config.snapshotter_prepare_timeout_ms);
      layer_prep =
          std::make_unique<snapshotter::LayerPrep>(*snapshots, *layer_source, prep_options);
      prefetcher.EnableSnapshots(layer_prep.get());
    }
    auto started =
        snapshotter::Server::Start(*snapshots, config.snapshotter_socket, layer_prep.get());
    if (!started) return fail(started.error());
    snapshot_server = std::move(started.value());
    spdlog::info("containerd snapshotter on unix:{}, {} snapshots in {}",
                 config.snapshotter_socket, snapshots->List().size(), snapshots->root());
  }

  auto port = server.Listen(listen.value().first, listen.value().second);
  if (!port) return fail(port.error());
  if (!config.port_file.empty()) {
    std::string tmp = config.port_file + ".tmp";
    std::ofstream(tmp) << port.value() << "\n";
    std::rename(tmp.c_str(), config.port_file.c_str());
  }
  server.Start();
  spdlog::info("registry shim listening on {}:{}, cache {}", listen.value().first, port.value(),
               config.cache_dir);
  if (https_proxy) {
    spdlog::info(
        "HTTPS proxy mode on the shim port: CONNECTs to mapped registries are "
        "terminated with the node CA (GET /shoal/v1/proxy/ca.crt); others are {}",
        config.proxy_tunnel == "allow" ? "tunnelled for clients on this node" : "refused");
  }

  // Graceful shutdown: stop accepting, give open responses a bounded time, then stop.
  asio::signal_set signals(ioc, SIGINT, SIGTERM);
  asio::steady_timer drain(ioc);
  std::function<void()> drain_check;
  auto deadline = std::chrono::steady_clock::time_point::max();
  // With the relay, the swarm's `stopped` announces go through this thread: the swarm pauses,
  // the relay sends them at once, and the swarm stops when they are answered (or after 2 s).
  bool swarm_stopping = false;
  asio::steady_timer stops(ioc);
  std::function<void()> stops_check;
  auto stops_since = std::chrono::steady_clock::now();
  stops_check = [&] {
    const auto waited = std::chrono::steady_clock::now() - stops_since;
    // Pausing is asynchronous: give libtorrent a moment to start the announces it owes.
    const bool answered = waited >= std::chrono::milliseconds(200) && !swarm->AnnouncesInFlight();
    if (answered || waited >= std::chrono::seconds(2)) {
      spdlog::info("swarm: stopped announces {} after {} ms", answered ? "answered" : "unanswered",
                   std::chrono::duration_cast<std::chrono::milliseconds>(waited).count());
      swarm->Stop();
      relay->Stop();
      swarm_stopping = false;
      return;
    }
    stops.expires_after(std::chrono::milliseconds(25));
    stops.async_wait([&](boost::system::error_code) { stops_check(); });
  };
  drain_check = [&] {
    if ((server.active_connections() == 0 && !swarm_stopping) ||
        std::chrono::steady_clock::now() >= deadline) {
      ioc.stop();
      return;
    }
    drain.expires_after(std::chrono::milliseconds(100));
    drain.async_wait([&](boost::system::error_code) { drain_check(); });
  };
  signals.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    spdlog::info("signal {}: shutting down", sig);
    server.Stop();
    if (metrics_server) metrics_server->Stop();
    if (swarm && relay) {
      relay->SendAtOnce();
      swarm->Pause();
      swarm_stopping = true;
      stops_since = std::chrono::steady_clock::now();
      stops_check();
    } else if (swarm) {
      swarm->Stop();  // stop announces tell the tracker we are gone
    }
    deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    drain_check();
  });
  ioc.run();
  if (swarm) swarm->Stop();  // when the drain deadline came first
  if (relay) relay->Stop();
  // Prepares waiting for a layer fall back at once (the network thread has stopped), then the
  // server's calls in flight finish and the socket goes.
  if (layer_source) layer_source->Stop();
  if (layer_prep) layer_prep->Stop();
  if (snapshot_server) snapshot_server->Stop();
  pool.join();
  if (auto st = store.value()->Flush(); !st) spdlog::warn("cache index: {}", st.error().ToString());
  spdlog::info("stopped");
  return 0;
}

}  // namespace shoal::agent
