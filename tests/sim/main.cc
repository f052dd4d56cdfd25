// shoal-sim: a cold pull of one image on N simulated nodes, scheduled by the real tracker tables
// (tracker::BlobTable) over a flow-level network model. Prints p50/p99/max completion against
// the fluid bound max(S/U, S/B, N*S/(U + N*B)), upstream bytes over S, the first byte, the spread
// of chunk 0, the tracker's request rate, and the simulator's own run time. A program, not a
// test: never registered with ctest. See tests/sim/sim.h for what is modelled and what is not.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "tests/sim/sim.h"

namespace shoal::sim {
namespace {

using json = nlohmann::json;

// 17 GB (1e9 bytes) as a realistic layer mix: one 10.5 GB layer, three of 3, 2 and 1 GB and
// several small ones, plus a config blob.
std::vector<uint64_t> Image17G() {
  const uint64_t MB = 1000 * 1000;
  return {12 * 1024, 10500 * MB, 3000 * MB, 2000 * MB, 1000 * MB, 250 * MB,
          150 * MB,  60 * MB,    30 * MB,   8 * MB,    2 * MB};
}

double FluidBound(double S, double N, double B, double U) {
  // Bytes and bits per second (nominal link rates, as shoal-bench-swarm's physical limit).
  return std::max({S / U, S / B, N * S / (U + N * B)});
}

int Main(int argc, char** argv) {
  CLI::App app{
      "shoal-sim: N simulated agents pull one image at once, scheduled by the real tracker "
      "tables (BlobTable) over a flow-level network model (per-node up/down B, one shared "
      "upstream link U, max-min fair sharing)"};
  SimConfig c;
  c.table = TrackerDefaults();
  std::vector<size_t> nodes = {6};
  std::vector<double> upstream_mbit = {50};
  std::vector<double> blob_mib;
  std::vector<uint64_t> blob_bytes;
  std::string image = "";
  uint64_t chunk_mib = c.table.chunk_size >> 20, piece_kib = c.table.piece_size >> 10,
           first_chunk_kib = c.table.first_chunk_size >> 10,
           min_chunk_kib = c.table.min_chunk_size >> 10;
  int head_start_ms = 500, lease_ttl_s = 15;
  double rtt_ms = 1, registry_ms = 5, client_start_ms = 500, quantum_ms = 1, lease_wait_ms = 5000;
  double ready_interval_ms = 250;
  uint64_t request_window_kib = 256;
  std::vector<uint64_t> seeds = {1};
  std::string json_path;
  double timeline_s = 0;
  bool first_byte_run = false;
  app.add_option("--nodes", nodes, "N: nodes pulling at once (a list runs each)")
      ->delimiter(',')
      ->check(CLI::Range(size_t{1}, size_t{100000}))
      ->capture_default_str();
  app.add_option("--node-mbit", c.node_mbit, "B: each node's link, Mbit/s each direction")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--upstream-mbit", upstream_mbit,
                 "U: the upstream registry's one link (the NAT), Mbit/s (a list runs each)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto* img = app.add_option("--image", image,
                             "A named image: 17g (10.5 + 3 + 2 + 1 GB and 6 small layers, 17.0 GB)")
                  ->check(CLI::IsMember({"17g"}));
  app.add_option("--blob-bytes", blob_bytes, "The image's blobs (config and layers), bytes")
      ->delimiter(',')
      ->excludes(img);
  app.add_option("--blob-mib", blob_mib, "The image's blobs in MiB (instead of --blob-bytes)")
      ->delimiter(',')
      ->excludes(img);
  app.add_option("--chunk-mib", chunk_mib, "tracker --chunk-size-kib, in MiB")
      ->capture_default_str();
  app.add_option("--piece-kib", piece_kib, "tracker --piece-size-kib")->capture_default_str();
  app.add_option("--target-chunks", c.table.target_chunks, "tracker --target-chunks")
      ->capture_default_str();
  app.add_option("--min-chunk-kib", min_chunk_kib, "tracker --min-chunk-size-kib")
      ->capture_default_str();
  app.add_option("--first-chunk-kib", first_chunk_kib, "tracker --first-chunk-kib (0: no ramp)")
      ->capture_default_str();
  app.add_option("--max-upstream-fetchers", c.table.max_upstream_fetchers,
                 "tracker --max-upstream-fetchers")
      ->capture_default_str();
  app.add_option("--base-upstream-fetchers", c.table.base_upstream_fetchers,
                 "tracker --base-upstream-fetchers")
      ->capture_default_str();
  double fast_lease_mbit = static_cast<double>(c.table.fast_lease_rate) * 8 / 1e6;
  app.add_option("--fast-lease-mbit", fast_lease_mbit, "tracker --fast-lease-mbit (0: off)")
      ->capture_default_str();
  app.add_option("--max-leases-per-agent", c.table.max_leases_per_agent,
                 "tracker --max-leases-per-agent")
      ->capture_default_str();
  app.add_option("--max-leases-per-blob", c.table.max_leases_per_blob,
                 "tracker --max-leases-per-blob")
      ->capture_default_str();
  app.add_option("--head-start-ms", head_start_ms, "tracker --head-start-ms")
      ->capture_default_str();
  app.add_option("--lease-ttl-s", lease_ttl_s, "tracker --lease-ttl-s")->capture_default_str();
  app.add_option("--range-streams", c.range_streams, "agent --range-streams")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--head-streams", c.head_streams,
                 "Of the --range-streams, how many take the chunks in order; the rest are "
                 "background streams (-1: all in order, the agent before session 18)")
      ->check(CLI::Range(-1, 64))
      ->capture_default_str();
  std::map<std::string, SimConfig::Background> orders{{"rarest", SimConfig::Background::kRarest},
                                                      {"random", SimConfig::Background::kRandom},
                                                      {"watcher", SimConfig::Background::kWatcher}};
  app.add_option("--background", c.background,
                 "How background streams pick a chunk: rarest (the tracker names the ready chunk "
                 "with the smallest swarm that the node lacks), random (the same request, any "
                 "such chunk), watcher (a random one of those the blob's ready watcher knows are "
                 "ready: today's tracker API)")
      ->transform(CLI::CheckedTransformer(orders, CLI::ignore_case))
      ->capture_default_str();
  std::map<std::string, SimConfig::Sequential> sequential{{"head", SimConfig::Sequential::kHead},
                                                          {"first", SimConfig::Sequential::kFirst},
                                                          {"none", SimConfig::Sequential::kNone}};
  app.add_option("--sequential", c.sequential,
                 "Which chunk a node downloads in order, the others rarest first: head (the chunk "
                 "a streaming client waits on), first (that chunk only while it is chunk 0), none")
      ->transform(CLI::CheckedTransformer(sequential, CLI::ignore_case))
      ->capture_default_str();
  app.add_option("--upstream-reserve", c.upstream_reserve,
                 "While a node fetches from upstream, its peer downloads get at most (1 - this) of "
                 "its downlink (0: no limit, the agent's default)")
      ->check(CLI::Range(0.0, 0.95))
      ->capture_default_str();
  app.add_option("--lease-wait-ms", lease_wait_ms, "agent long-poll wait (--lease-wait-ms)")
      ->capture_default_str();
  app.add_option("--ready-interval-ms", ready_interval_ms,
                 "a blob's ready watcher polls no sooner than this after its last poll (0: at "
                 "once; the agent's default is 250)")
      ->capture_default_str();
  app.add_option("--rtt-ms", rtt_ms, "Round trip between any two hosts")->capture_default_str();
  app.add_option("--registry-latency-ms", registry_ms,
                 "The registry's time to its first body byte after a GET arrives")
      ->capture_default_str();
  app.add_option("--connect-rtts", c.connect_rtts,
                 "Round trips from a chunk torrent's announce answer to its first request "
                 "(TCP and TLS handshakes)")
      ->capture_default_str();
  app.add_option("--client-start-ms", client_start_ms,
                 "The client's start, manifest and config before its blob GETs")
      ->capture_default_str();
  app.add_option("--max-sources", c.max_sources, "Pieces of one chunk a node fetches at once")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--max-uploads", c.max_uploads, "Upload flows one node serves at once")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--peers-per-chunk", c.peers_per_chunk,
                 "P: connections per chunk torrent and node (the agent's --peers-per-chunk); each "
                 "announce gets max(1, P/2) peers from the tracker; 0: no neighbour lists, every "
                 "holder of a piece is a possible source")
      ->check(CLI::Range(0, 255))
      ->capture_default_str();
  app.add_option("--request-window-kib", request_window_kib,
                 "Bytes a peer connection keeps requested: caps its rate at window / RTT")
      ->capture_default_str();
  uint64_t split_min_kib = 64;
  app.add_option("--split-min-kib", split_min_kib,
                 "End game: a free slot takes half of a part in flight larger than twice this "
                 "from another holder (a huge value turns it off)")
      ->capture_default_str();
  app.add_option("--wire-efficiency", c.wire_efficiency,
                 "Payload share of a link's bit rate (1448 / 1514: TCP/IP over Ethernet)")
      ->check(CLI::Range(0.1, 1.0))
      ->capture_default_str();
  app.add_option("--quantum-ms", quantum_ms,
                 "Rates are re-solved at most this often (flows added in between get the spare "
                 "capacity of their links)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", seeds, "Random seeds (a list runs each)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--timeline-s", timeline_s,
                 "Print each run's timeline (upstream and peer rates, leases, flows, nodes done) "
                 "sampled this often");
  app.add_flag("--first-byte-run", first_byte_run,
               "Also simulate shoal-bench-swarm's cold first-byte run: only the largest blob, "
               "every client's GET at 0 (the fb1 columns)");
  app.add_flag("--progress", c.progress, "A line on stderr every 10 simulated seconds");
  app.add_option("--json", json_path, "Also write the results as JSON to this file");
  RelayModelConfig relay;
  relay.replicas = 0;
  app.add_option("--relay-replicas", relay.replicas,
                 "Model the agents' announce relay (--tracker-announce batch) over this many "
                 "tracker replicas, beside UDP, from each run's announces (0: off)")
      ->capture_default_str();
  app.add_option("--relay-batch-us", relay.batch_us,
                 "Relay model: tracker CPU per POST /v1/announces request, us")
      ->capture_default_str();
  app.add_option("--relay-announce-us", relay.announce_us,
                 "Relay model: tracker CPU per announce in a batch, us")
      ->capture_default_str();
  app.add_option("--relay-udp-us", relay.udp_us,
                 "Relay model: tracker CPU per UDP announce, us")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::vector<uint64_t> blobs;
  if (image == "17g") blobs = Image17G();
  for (uint64_t b : blob_bytes) blobs.push_back(b);
  for (double m : blob_mib) blobs.push_back(static_cast<uint64_t>(std::llround(m * 1048576)));
  if (blobs.empty()) {
    std::fprintf(stderr, "name the image: --image, --blob-bytes or --blob-mib\n");
    return 2;
  }
  c.table.fast_lease_rate = static_cast<uint64_t>(fast_lease_mbit * 1e6 / 8);
  c.table.chunk_size = chunk_mib << 20;
  c.table.piece_size = static_cast<uint32_t>(piece_kib << 10);
  c.table.first_chunk_size = first_chunk_kib << 10;
  c.table.min_chunk_size = min_chunk_kib << 10;
  c.table.head_start = std::chrono::milliseconds(head_start_ms);
  c.table.lease_ttl = std::chrono::seconds(lease_ttl_s);
  c.rtt_s = rtt_ms / 1000;
  c.registry_latency_s = registry_ms / 1000;
  c.client_start_s = client_start_ms / 1000;
  c.quantum_s = quantum_ms / 1000;
  c.lease_wait_s = lease_wait_ms / 1000;
  c.ready_interval_s = ready_interval_ms / 1000;
  c.request_window = request_window_kib << 10;
  c.split_min = split_min_kib << 10;
  c.blobs = blobs;
  c.timeline_step_s = timeline_s;
  c.log_announces = relay.replicas > 0;
  relay.rtt_s = c.rtt_s;
  double S = 0;
  for (uint64_t b : blobs) S += static_cast<double>(b);

  std::printf(
      "shoal-sim: B = %g Mbit/s per node, image S = %.0f bytes (%.1f MiB) in %zu blobs; tracker: "
      "chunks up to %llu MiB / pieces up to %llu KiB, first chunk %llu KiB, target %u chunks, "
      "%u to %u fetchers (more while leases run at %g Mbit/s; %u per agent, %u per blob), head "
      "start %d ms, lease ttl %d s; agent: --range-streams %d, head %d%s, in order: %s, "
      "upstream reserve %g; model: RTT %g ms, registry %g ms, "
      "connect %g RTT, client start %g ms, "
      "%d sources per chunk, %d uploads per node, %d peers per chunk%s, window %llu KiB, wire "
      "%.3f, quantum %g ms\n",
      c.node_mbit, S, S / 1048576, blobs.size(), static_cast<unsigned long long>(chunk_mib),
      static_cast<unsigned long long>(piece_kib), static_cast<unsigned long long>(first_chunk_kib),
      c.table.target_chunks,
      c.table.base_upstream_fetchers == 0 ? c.table.max_upstream_fetchers
                                          : c.table.base_upstream_fetchers,
      c.table.max_upstream_fetchers, fast_lease_mbit, c.table.max_leases_per_agent,
      c.table.max_leases_per_blob, head_start_ms, lease_ttl_s, c.range_streams, c.head_streams,
      c.head_streams < 0
          ? " (all in order)"
          : (c.background == SimConfig::Background::kRarest   ? ", background rarest"
             : c.background == SimConfig::Background::kRandom ? ", background random"
                                                              : ", background watcher"),
      c.sequential == SimConfig::Sequential::kHead    ? "the head chunk"
      : c.sequential == SimConfig::Sequential::kFirst ? "chunk 0"
                                                      : "none",
      c.upstream_reserve, rtt_ms, registry_ms, c.connect_rtts, client_start_ms, c.max_sources,
      c.max_uploads, c.peers_per_chunk, c.peers_per_chunk == 0 ? " (every holder)" : "",
      static_cast<unsigned long long>(request_window_kib), c.wire_efficiency, quantum_ms);

  json out = json::array();
  struct Row {
    size_t n;
    double u;
    uint64_t seed;
    SimResult r;
    SimResult fb;  // the first-byte run, if any
    std::vector<ReplicaLoad> relay;  // the relay model, if asked
  };
  std::vector<Row> rows;
  for (size_t n : nodes) {
    for (double u : upstream_mbit) {
      for (uint64_t seed : seeds) {
        SimConfig run = c;
        run.nodes = n;
        run.upstream_mbit = u;
        run.seed = seed;
        SimResult r = RunSim(run);
        if (rows.empty()) {
          std::printf("layouts (the tracker's LayoutFor):");
          for (const auto& l : r.layouts) {
            std::printf(" %.1f MiB: %u chunks of %llu KiB / %u KiB pieces;", l.size / 1048576.0,
                        l.chunks, static_cast<unsigned long long>(l.chunk_size >> 10),
                        l.piece_size >> 10);
          }
          std::printf("\n");
        }
        SimResult fb;
        if (first_byte_run) {
          SimConfig one = run;
          one.blobs = {*std::max_element(blobs.begin(), blobs.end())};
          one.client_start_s = 0;
          one.timeline_step_s = 0;
          fb = RunSim(one);
        }
        std::vector<ReplicaLoad> loads;
        if (relay.replicas > 0) loads = ModelRelay(std::move(r.announces), blobs, relay);
        r.announces = {};
        rows.push_back(Row{n, u, seed, std::move(r), std::move(fb), std::move(loads)});
      }
    }
  }

  std::printf(
      "\n%6s %8s %8s %5s %9s %8s %5s %8s %5s %8s %5s %8s %7s %7s %7s %7s %7s %8s %8s %8s %8s %7s\n",
      "N", "B Mbit", "U Mbit", "seed", "bound s", "p50 s", "x", "p99 s", "x", "max s", "x",
      "up / S", "up end", "fb p50", "fb max", "fb1 p50", "fb1 max", "chunk0 s", "req/s", "peak/s",
      "calls/s", "sim s");
  for (const auto& row : rows) {
    const SimResult& r = row.r;
    const double bound =
        FluidBound(S * 8, static_cast<double>(row.n), c.node_mbit * 1e6, row.u * 1e6);
    const double p50 = Percentile(r.completion_s, 0.5), p99 = Percentile(r.completion_s, 0.99),
                 mx = Percentile(r.completion_s, 1.0);
    const double span = std::max(1e-9, mx - c.client_start_s);
    std::printf(
        "%6zu %8g %8g %5llu %9.2f %8.2f %5.2f %8.2f %5.2f %8.2f %5.2f %8.3f %7.2f %7.3f %7.3f "
        "%7.3f %7.3f %8.2f "
        "%8.0f %8llu %8.0f %7.1f\n",
        row.n, c.node_mbit, row.u, static_cast<unsigned long long>(row.seed), bound, p50,
        p50 / bound, p99, p99 / bound, mx, mx / bound, r.upstream_bytes / S, r.upstream_busy_end_s,
        Percentile(r.first_byte_s, 0.5), Percentile(r.first_byte_s, 1.0),
        Percentile(row.fb.first_byte_s, 0.5), Percentile(row.fb.first_byte_s, 1.0), r.chunk0_all_s,
        static_cast<double>(r.calls.total_requests) / span,
        static_cast<unsigned long long>(r.calls.peak_requests_per_s),
        static_cast<double>(r.calls.total_table_calls) / span, r.wall_s);
    json routes = json::object(), calls = json::object();
    for (const auto& [k, v] : r.calls.requests) routes[k] = v;
    for (const auto& [k, v] : r.calls.table_calls) calls[k] = v;
    out.push_back({{"nodes", row.n},
                   {"node_mbit", c.node_mbit},
                   {"upstream_mbit", row.u},
                   {"seed", row.seed},
                   {"image_bytes", S},
                   {"blobs", blobs},
                   {"bound_s", bound},
                   {"p50_s", p50},
                   {"p99_s", p99},
                   {"max_s", mx},
                   {"upstream_over_s", r.upstream_bytes / S},
                   {"peer_bytes", r.peer_bytes},
                   {"first_byte_p50_s", Percentile(r.first_byte_s, 0.5)},
                   {"first_byte_max_s", Percentile(r.first_byte_s, 1.0)},
                   {"first_byte_run_p50_s", Percentile(row.fb.first_byte_s, 0.5)},
                   {"first_byte_run_max_s", Percentile(row.fb.first_byte_s, 1.0)},
                   {"first_byte_run_s", row.fb.first_byte_s},
                   {"prefix50_p50_s", Percentile(r.prefix50_s, 0.5)},
                   {"prefix50_p99_s", Percentile(r.prefix50_s, 0.99)},
                   {"prefix75_p99_s", Percentile(r.prefix75_s, 0.99)},
                   {"chunk0_first_s", r.chunk0_first_s},
                   {"chunk0_all_s", r.chunk0_all_s},
                   {"upstream_end_s", r.upstream_busy_end_s},
                   {"leases_granted", r.leases_granted},
                   {"leases_expired", r.leases_expired},
                   {"requests", routes},
                   {"table_calls", calls},
                   {"requests_per_s", static_cast<double>(r.calls.total_requests) / span},
                   {"peak_requests_per_s", r.calls.peak_requests_per_s},
                   {"table_calls_per_s", static_cast<double>(r.calls.total_table_calls) / span},
                   {"peak_table_calls_per_s", r.calls.peak_table_calls_per_s},
                   {"completion_s", r.completion_s},
                   {"sim_wall_s", r.wall_s},
                   {"events", r.events},
                   {"piece_events", r.piece_events},
                   {"recomputes", r.recomputes},
                   {"peak_flows", r.peak_flows},
                   {"peers_per_chunk", c.peers_per_chunk},
                   {"connections", r.connections},
                   {"refused", r.refused},
                   {"redundant_closed", r.redundant_closed},
                   {"reannounces", r.reannounces},
                   {"no_peer_stalls", r.no_peer_stalls},
                   {"peer_stalls", r.peer_stalls},
                   {"longest_no_peer_s", r.longest_no_peer_s},
                   {"max_chunk_connections", r.max_chunk_connections}});
    if (!row.relay.empty()) {
      json replicas = json::array();
      for (const ReplicaLoad& l : row.relay) {
        replicas.push_back({{"replica", l.replica},
                            {"announces", l.announces},
                            {"batches", l.batches},
                            {"batch_mean", l.batch_mean},
                            {"batch_p50", l.batch_p50},
                            {"batch_p99", l.batch_p99},
                            {"batch_max", l.batch_max},
                            {"core_s", l.core_s},
                            {"peak_second", l.peak_second},
                            {"wait_p50_s", l.wait_p50_s},
                            {"wait_p99_s", l.wait_p99_s},
                            {"wait_max_s", l.wait_max_s},
                            {"udp_core_s", l.udp_core_s},
                            {"udp_peak_second", l.udp_peak_second},
                            {"udp_wait_p50_s", l.udp_wait_p50_s},
                            {"udp_wait_p99_s", l.udp_wait_p99_s},
                            {"udp_wait_max_s", l.udp_wait_max_s},
                            {"span_s", l.span_s}});
      }
      out.back()["relay_model"] = {{"batch_us", relay.batch_us},
                                   {"announce_us", relay.announce_us},
                                   {"udp_us", relay.udp_us},
                                   {"replicas", replicas}};
    }
  }
  std::printf(
      "\nbound: the fluid bound max(S/U, S/B, N*S/(U+N*B)) (Kumar and Ross) at nominal link "
      "rates, as shoal-bench-swarm's physical limit; x: / bound. up / S: bytes over the upstream "
      "link / S. fb: first byte of the largest blob at a node (p50, slowest). chunk0: when the "
      "last node had all of the largest blob's chunk 0. req/s: agents' tracker requests (table, "
      "work, ready, renew, publish, announce) over the pull (from the client start to the last "
      "node), peak/s: in the busiest second; calls/s: BlobTable calls (a parked long-poll re-asks "
      "at every wake-up). sim s: the simulator's own run time.\n");
  for (const auto& row : rows) {
    std::printf("N=%zu U=%g seed %llu: requests", row.n, row.u,
                static_cast<unsigned long long>(row.seed));
    for (const auto& [k, v] : row.r.calls.requests)
      std::printf(" %s %llu", k.c_str(), static_cast<unsigned long long>(v));
    std::printf("; table calls");
    for (const auto& [k, v] : row.r.calls.table_calls)
      std::printf(" %s %llu", k.c_str(), static_cast<unsigned long long>(v));
    std::printf(
        "; in-order prefix of the largest blob at 25/50/75%% (p50, p99 over nodes): %.2f/%.2f, "
        "%.2f/%.2f, %.2f/%.2f s",
        Percentile(row.r.prefix25_s, 0.5), Percentile(row.r.prefix25_s, 0.99),
        Percentile(row.r.prefix50_s, 0.5), Percentile(row.r.prefix50_s, 0.99),
        Percentile(row.r.prefix75_s, 0.5), Percentile(row.r.prefix75_s, 0.99));
    std::printf(
        "; leases %llu (expired %llu); peak table calls/s %llu; %llu events (%llu pieces), "
        "%llu rate solves, peak %zu flows\n",
        static_cast<unsigned long long>(row.r.leases_granted),
        static_cast<unsigned long long>(row.r.leases_expired),
        static_cast<unsigned long long>(row.r.calls.peak_table_calls_per_s),
        static_cast<unsigned long long>(row.r.events),
        static_cast<unsigned long long>(row.r.piece_events),
        static_cast<unsigned long long>(row.r.recomputes), row.r.peak_flows);
    if (c.peers_per_chunk > 0) {
      std::printf(
          "N=%zu U=%g seed %llu: neighbours (P = %d): %llu connections, %llu refused, %llu "
          "seed-to-seed closed, %llu re-announces; %llu chunk downloads without a connection "
          "after %g s (the agent gives those up), %llu without a piece for %g s; longest wait "
          "for a first connection %.2f s; at most %d connections on a chunk\n",
          row.n, row.u, static_cast<unsigned long long>(row.seed), c.peers_per_chunk,
          static_cast<unsigned long long>(row.r.connections),
          static_cast<unsigned long long>(row.r.refused),
          static_cast<unsigned long long>(row.r.redundant_closed),
          static_cast<unsigned long long>(row.r.reannounces),
          static_cast<unsigned long long>(row.r.no_peer_stalls), c.no_peer_limit_s,
          static_cast<unsigned long long>(row.r.peer_stalls), c.peer_stall_s,
          row.r.longest_no_peer_s, row.r.max_chunk_connections);
    }
  }
  for (const auto& row : rows) {
    if (row.relay.empty()) continue;
    std::printf(
        "\nrelay model N=%zu U=%g seed %llu: each node's relay keeps one POST /v1/announces in "
        "flight per replica; a replica is one FIFO thread costing %g us a batch + %g us an "
        "announce, against %g us per UDP announce. batch p50/p99: the batch an announce rides "
        "in; busiest s: the busiest second's share of one core; wait: from an announce leaving "
        "libtorrent to its answer\n%7s %9s %8s %6s %6s %6s %6s %8s %8s %9s %9s %9s %8s %8s "
        "%9s %9s\n",
        row.n, row.u, static_cast<unsigned long long>(row.seed), relay.batch_us,
        relay.announce_us, relay.udp_us, "replica", "announces", "batches", "mean", "p50", "p99",
        "max", "core-s", "busiest", "wait p50", "wait p99", "wait max", "UDP c-s", "UDP busy",
        "UDP w p99", "UDP w max");
    for (const ReplicaLoad& l : row.relay) {
      std::printf(
          "%7zu %9llu %8llu %6.1f %6.0f %6.0f %6zu %8.2f %8.2f %9.4f %9.4f %9.4f %8.2f %8.2f "
          "%9.4f %9.4f\n",
          l.replica, static_cast<unsigned long long>(l.announces),
          static_cast<unsigned long long>(l.batches), l.batch_mean, l.batch_p50, l.batch_p99,
          l.batch_max, l.core_s, l.peak_second, l.wait_p50_s, l.wait_p99_s, l.wait_max_s,
          l.udp_core_s, l.udp_peak_second, l.udp_wait_p99_s, l.udp_wait_max_s);
    }
  }
  for (const auto& row : rows) {
    if (row.r.timeline.empty()) continue;
    std::printf(
        "\ntimeline N=%zu U=%g seed %llu (Gbit/s over each step; link totals: U %g, "
        "nodes' downlinks %g; use: share of capacity in use at the instant)\n%8s %10s %10s %7s %8s "
        "%6s %8s %8s %8s\n",
        row.n, row.u, static_cast<unsigned long long>(row.seed), row.u / 1000,
        static_cast<double>(row.n) * c.node_mbit / 1000, "t s", "upstream", "peers", "leases",
        "flows", "done", "U use", "up use", "down use");
    for (const auto& s : row.r.timeline) {
      std::printf("%8.2f %10.3f %10.3f %7zu %8zu %6zu %8.2f %8.2f %8.2f\n", s.t,
                  s.upstream_bytes * 8 / 1e9 / timeline_s, s.peer_bytes * 8 / 1e9 / timeline_s,
                  s.leases, s.flows, s.nodes_done, s.nat_use, s.up_use, s.down_use);
    }
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace shoal::sim

int main(int argc, char** argv) {
  try {
    return shoal::sim::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shoal-sim: %s\n", e.what());
    return 1;
  }
}
