#include "tracker/run.h"

#include <utility>

#include <csignal>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "lib/core/error.h"
#include "lib/core/fd_limit.h"
#include "lib/core/log.h"
#include "lib/swarm/chunk_torrent.h"
#include "lib/tls/node_ca.h"
#include "tracker/access.h"
#include "tracker/blobs/blob_api.h"
#include "tracker/cluster/cluster_view.h"
#include "tracker/manifests/manifest_api.h"
#include "tracker/prefetch/prefetch_api.h"
#include "tracker/server.h"
#include "tracker/swarms/service.h"
#include "tracker/udp_server.h"

namespace shoal::tracker {
namespace asio = boost::asio;

namespace {

Result<std::pair<std::string, uint16_t>> SplitHostPort(const std::string& listen) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return MakeError(ErrorCode::kInvalidArgument, "--listen \"" + listen + "\" must be HOST:PORT");
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  try {
    size_t used = 0;
    int port = std::stoi(listen.substr(colon + 1), &used);
    if (used != listen.size() - colon - 1 || port < 0 || port > 65535)
      throw std::out_of_range("port");
    return std::make_pair(host, static_cast<uint16_t>(port));
  } catch (const std::exception&) {
    return MakeError(ErrorCode::kInvalidArgument, "--listen \"" + listen + "\" has a bad port");
  }
}

Status WritePortFile(const std::string& path, uint16_t port) {
  // Written then renamed, so a test polling the file never reads a partial number.
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << port << "\n";
    if (!out.flush()) return MakeError(ErrorCode::kIo, "cannot write port file " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return MakeError(ErrorCode::kIo, "cannot rename " + tmp + " to " + path);
  return Ok();
}

}  // namespace

int RunTracker(const TrackerConfig& config) {
  // No peer may end this process: a client that closes its connection during a sendfile(2)
  // body would otherwise kill it with SIGPIPE (exit 141, no log line). Writes then fail with
  // EPIPE, which the code handles.
  std::signal(SIGPIPE, SIG_IGN);
  InitLogging(config.log_format, config.log_level, "shoal-tracker");
  auto fail = [](const Error& e) {
    spdlog::critical("startup failed: {}", e.ToString());
    return 1;
  };
  auto listen = SplitHostPort(config.listen);
  if (!listen) return fail(listen.error());

  ServiceOptions options;
  options.announce_interval = std::chrono::seconds(config.announce_interval_s);
  options.min_interval =
      std::chrono::seconds(std::min(config.min_interval_s, config.announce_interval_s));
  options.trust_ip_param = config.trust_ip_param;
  options.table.max_numwant = config.max_numwant;
  options.table.default_numwant = std::min(config.default_numwant, config.max_numwant);
  options.table.limits.max_swarms = config.max_swarms;
  options.table.limits.max_peers_per_swarm = config.max_peers_per_swarm;
  options.table.limits.max_peers = config.max_peers;

  BlobApiOptions blob_options;
  // Every parked long-poll holds a connection, so the connection limit bounds them.
  blob_options.max_waiters = static_cast<size_t>(config.max_connections);
  blob_options.table.chunk_size = config.chunk_size_kib << 10;
  blob_options.table.piece_size = config.piece_size_kib << 10;
  blob_options.table.target_chunks = config.target_chunks;
  blob_options.table.min_chunk_size = config.min_chunk_size_kib << 10;
  blob_options.table.first_chunk_size = config.first_chunk_kib << 10;
  blob_options.table.max_upstream_fetchers = UpstreamLeasesPerReplica(config);
  blob_options.table.base_upstream_fetchers = BaseUpstreamLeasesPerReplica(config);
  blob_options.table.fast_lease_rate = uint64_t{config.fast_lease_mbit} * 1'000'000 / 8;
  blob_options.table.max_leases_per_agent = config.max_leases_per_agent;
  blob_options.table.max_leases_per_blob = config.max_leases_per_blob;
  blob_options.table.head_start = std::chrono::milliseconds(config.head_start_ms);
  blob_options.table.lease_ttl = std::chrono::seconds(config.lease_ttl_s);
  blob_options.table.max_blobs = config.max_blobs;
  blob_options.bad_reports_per_minute = config.bad_reports_per_minute;
  blob_options.table.bad_report_quorum = config.bad_report_quorum;
  if (!config.peer_ca_cert.empty()) {
    auto pem = tls::ReadCertPemFile(config.peer_ca_cert);
    if (!pem) return fail(pem.error());
    blob_options.table.root_cert = std::move(pem.value());
    spdlog::info("chunk torrents must carry the peer CA of {}", config.peer_ca_cert);
  }
  swarm::ChunkLayout layout{1, blob_options.table.chunk_size, blob_options.table.piece_size, 0};
  if (Status valid = layout.Validate(); !valid) {
    return fail(MakeError(ErrorCode::kInvalidArgument,
                          "--chunk-size-kib " + std::to_string(config.chunk_size_kib) +
                              " / --piece-size-kib " + std::to_string(config.piece_size_kib) +
                              ": " + valid.error().message));
  }
  auto pow2 = [](uint64_t v) { return v != 0 && (v & (v - 1)) == 0; };
  if (!pow2(config.min_chunk_size_kib)) {
    return fail(MakeError(ErrorCode::kInvalidArgument,
                          "--min-chunk-size-kib " + std::to_string(config.min_chunk_size_kib) +
                              " is not a power of two"));
  }
  if (config.first_chunk_kib != 0 &&
      (!pow2(config.first_chunk_kib) || config.first_chunk_kib < 16)) {
    return fail(MakeError(ErrorCode::kInvalidArgument,
                          "--first-chunk-kib " + std::to_string(config.first_chunk_kib) +
                              " is not 0 or a power of two of at least 16"));
  }

  // The cluster-wide manifest cache.
  ManifestApiOptions manifest_options;
  manifest_options.cache.tag_ttl = std::chrono::seconds(config.manifest_ttl_s);
  manifest_options.cache.lease_ttl = std::chrono::seconds(config.manifest_lease_ttl_s);
  manifest_options.cache.missing_ttl = std::chrono::seconds(config.manifest_missing_ttl_s);
  manifest_options.cache.max_manifests = config.max_manifests;
  manifest_options.max_waiters = static_cast<size_t>(config.max_connections);
  manifest_options.cache.max_bytes = config.max_manifest_cache_mib << 20;

  asio::io_context ioc(1);
  prometheus::Registry registry;
  TrackerService service(options, registry);
  BlobApi blobs(blob_options, registry, BlobApi::NewTrackerId());
  // Chunk torrents announce here too, so the swarm table knows when a ready chunk lost its seeds.
  blobs.SetSeedersLostProbe([&service](const swarm::Sha1& hash) {
    auto id = InfoHash::FromBytes(
        std::string_view(reinterpret_cast<const char*>(hash.data()), hash.size()));
    return id ? service.table().SeedersLostAt(*id) : std::nullopt;
  });
  ServerOptions server_options;
  server_options.max_connections = config.max_connections;
  // Each connection is a descriptor: raise the soft limit, and say so if it is still too low.
  if (uint64_t fds = RaiseFdLimit(); fds < static_cast<uint64_t>(config.max_connections) + 256) {
    spdlog::warn("the open-file limit is {}: fewer than --max-connections {} + 256; accepts will "
                 "fail beyond it (raise the container's nofile limit)",
                 fds, config.max_connections);
  }
  ManifestApi manifests(manifest_options, registry, blobs.tracker_id());
  // Cluster prefetch jobs (agents poll every replica; a job lives on the one that created it).
  PrefetchApiOptions prefetch_options;
  prefetch_options.jobs.agent_ttl = std::chrono::seconds(config.prefetch_agent_ttl_s);
  prefetch_options.jobs.max_jobs = config.max_prefetch_jobs;
  prefetch_options.max_waiters = static_cast<size_t>(config.max_connections);
  prefetch_options.jobs.keep_ended = std::chrono::seconds(config.prefetch_keep_s);
  // A live agent is heard from at least every long-poll, so a poll lasts well within the TTL.
  prefetch_options.max_wait = std::min<std::chrono::milliseconds>(
      prefetch_options.max_wait, prefetch_options.jobs.agent_ttl / 3);
  PrefetchApi prefetch(prefetch_options, registry, blobs.tracker_id());
  AccessOptions access_options;
  access_options.agent_tokens_file = config.agent_tokens_file;
  access_options.operator_tokens_file = config.operator_tokens_file;
  access_options.insecure_open = config.insecure_open;
  auto access = Access::Create(access_options, registry);
  if (!access) return fail(access.error());
  Server server(ioc, service, blobs, manifests, prefetch, access.value(), server_options);
  server.SetMetricsHandler(
      [&registry] { return prometheus::TextSerializer().Serialize(registry.Collect()); });
  ImageRates image_rates;  // the cluster view's per-image rates, between requests
  server.SetClusterViewHandler([&] {
    TimePoint now = TrackerClock::now();
    blobs.Sweep(now);
    prefetch.Sweep(now);
    ClusterViewInput in;
    in.tracker_id = blobs.tracker_id();
    in.replicas = config.replicas;
    in.upstream_cap_cluster = config.max_upstream_fetchers;
    in.blobs = &blobs.table();
    in.lease_waiters = blobs.waiters();
    in.swarms = &service.table();
    in.prefetch = &prefetch.jobs();
    in.manifests = &manifests.cache();
    in.rates = &image_rates;
    in.announce_silence =
        LongestInterval(service.options().announce_interval, service.options().interval_jitter) +
        std::chrono::seconds(30);
    return BuildClusterView(in, now).dump();
  });
  // UDP announces on the same port number (bound before the port file tells anyone the port).
  // With port 0 the number the kernel picked for TCP may be taken for UDP: pick again.
  UdpServer udp(ioc, service, access.value(), registry);
  Result<uint16_t> port = MakeError(ErrorCode::kInternal, "not bound");
  for (int attempt = 1;; ++attempt) {
    port = server.Listen(listen.value().first, listen.value().second);
    if (!port) return fail(port.error());
    if (!config.udp_announce) break;
    auto udp_port = udp.Listen(listen.value().first, port.value());
    if (udp_port) break;
    if (listen.value().second != 0 || attempt == 10) return fail(udp_port.error());
    server.Unlisten();
  }
  if (config.udp_announce) udp.Start();
  if (!config.port_file.empty()) {
    Status written = WritePortFile(config.port_file, port.value());
    if (!written) return fail(written.error());
  }
  server.Start();
  spdlog::info(
      "tracker listening on {}:{} (TCP{}); announce interval {} s, min interval {} s, peer ttl {} s",
      listen.value().first, port.value(), config.udp_announce ? " and UDP" : "",
      options.announce_interval.count(),
      options.min_interval.count(), service.table().options().peer_ttl.count());
  spdlog::info(
      "tracker id {}; chunks of up to {} KiB with {} KiB pieces (blobs below that x {} get smaller "
      "chunks, at least {} KiB; first chunk {} KiB); {} to {} upstream leases (this "
      "replica's share of {} to {} over {} replicas, more while leases run at {} Mbit/s; {} per "
      "agent, {} per blob; a blob's chunk 0 alone for up to {} ms), lease ttl {} s, at most {} "
      "blob tables",
      blobs.tracker_id(), config.chunk_size_kib, config.piece_size_kib, config.target_chunks,
      config.min_chunk_size_kib, config.first_chunk_kib, BaseUpstreamLeasesPerReplica(config),
      UpstreamLeasesPerReplica(config), config.base_upstream_fetchers, config.max_upstream_fetchers,
      config.replicas, config.fast_lease_mbit, config.max_leases_per_agent,
      config.max_leases_per_blob, config.head_start_ms, config.lease_ttl_s, config.max_blobs);
  spdlog::info(
      "manifest cache: tag ttl {} s, upstream 404 ttl {} s, fetch lease ttl {} s, at most {} "
      "manifests / {} MiB",
      config.manifest_ttl_s, config.manifest_missing_ttl_s, config.manifest_lease_ttl_s,
      config.max_manifests, config.max_manifest_cache_mib);
  if (access.value().open()) {
    spdlog::warn("access: {}", access.value().Describe());
  } else {
    spdlog::info("access: {}; token files re-read when they change", access.value().Describe());
  }
  spdlog::info(
      "prefetch jobs: agents gone after {} s of silence, at most {} jobs, ended ones "
      "kept {} s",
      config.prefetch_agent_ttl_s, config.max_prefetch_jobs, config.prefetch_keep_s);

  // Upkeep: drop silent peers. A tenth of the TTL keeps the overshoot small and the cost low
  // (one pass over the peers).
  asio::steady_timer sweep(ioc);
  auto sweep_period = std::max(std::chrono::seconds(1), service.table().options().peer_ttl / 10);
  std::function<void()> schedule_sweep = [&] {
    sweep.expires_after(sweep_period);
    sweep.async_wait([&](boost::system::error_code ec) {
      if (ec) return;
      service.Sweep(TrackerClock::now());
      blobs.Sweep(TrackerClock::now());
      manifests.Sweep(TrackerClock::now());
      prefetch.Sweep(TrackerClock::now());
      schedule_sweep();
    });
  };
  schedule_sweep();

  // Token files: re-read when they change (a Secret volume is updated in place), so tokens
  // rotate without a restart.
  asio::steady_timer reload(ioc);
  std::function<void()> schedule_reload = [&] {
    reload.expires_after(std::chrono::seconds(2));
    reload.async_wait([&](boost::system::error_code ec) {
      if (ec) return;
      access.value().Reload();
      schedule_reload();
    });
  };
  schedule_reload();

  // Graceful shutdown: stop accepting, give open requests a bounded time, then stop.
  asio::signal_set signals(ioc, SIGINT, SIGTERM);
  asio::steady_timer drain(ioc);
  std::function<void()> drain_check;
  auto deadline = std::chrono::steady_clock::time_point::max();
  drain_check = [&] {
    if (server.active_connections() == 0 || std::chrono::steady_clock::now() >= deadline) {
      ioc.stop();
      return;
    }
    drain.expires_after(std::chrono::milliseconds(50));
    drain.async_wait([&](boost::system::error_code) { drain_check(); });
  };
  signals.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    spdlog::info("signal {}: shutting down", sig);
    server.Stop();
    udp.Stop();
    blobs.Shutdown();
    manifests.Shutdown();
    prefetch.Shutdown();
    sweep.cancel();
    reload.cancel();
    deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    drain_check();
  });
  ioc.run();
  spdlog::info("stopped");
  return 0;
}

}  // namespace shoal::tracker
