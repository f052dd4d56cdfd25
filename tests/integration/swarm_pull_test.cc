// The swarm end to end: a real shoal-tracker, several real shoal-agents (each its own cache,
// shim port and BitTorrent port on 127.0.0.1), a real docker-registry upstream behind a counting
// proxy, and real skopeo pulls through each agent.
#include <doctest/doctest.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "lib/swarm/session.h"
#include "tests/support/agent.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/tokens.h"
#include "tests/support/tracker.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Small files (gzip), a 24 MiB file (gzip: several 2 MiB chunks), a zstd layer.
ImageSpec SwarmImage(uint64_t seed) {
  ImageSpec spec;
  spec.layers.push_back(LayerSpec{Compression::kGzip, 20, {}, seed});
  spec.layers.push_back(LayerSpec{Compression::kGzip, 2, {24ull << 20}, seed + 1});
  spec.layers.push_back(LayerSpec{Compression::kZstd, 10, {1ull << 20}, seed + 2});
  return spec;
}

struct SwarmWorld {
  TempDir dir{"shoal-swarm"};
  std::unique_ptr<Registry> registry;
  std::unique_ptr<CountingProxy> proxy;
  std::unique_ptr<TrackerProcess> tracker;
  std::vector<std::unique_ptr<Agent>> agents;
  BuiltImage image;
  std::vector<std::string> agent_args;

  explicit SwarmWorld(std::vector<std::string> tracker_args = {}, uint64_t seed = 11) {
    auto reg = Registry::Start();
    REQUIRE_MESSAGE(reg.has_value(), Why(reg));
    registry = std::move(reg.value());
    auto built = BuildImage(SwarmImage(seed), dir.Sub("layout"), "1");
    REQUIRE_MESSAGE(built.has_value(), Why(built));
    image = built.value();
    auto pushed = PushImage(*registry, image.layout_dir, "1", "demo/app");
    REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
    auto p = CountingProxy::Start(registry->HostPort());
    REQUIRE(p.has_value());
    proxy = std::move(p.value());
    std::vector<std::string> targs = {"--chunk-size-kib", "2048", "--piece-size-kib", "256",
                                      "--lease-ttl-s",    "3"};
    targs.insert(targs.end(), tracker_args.begin(), tracker_args.end());
    auto t = TrackerProcess::Start(targs);
    REQUIRE_MESSAGE(t.has_value(), Why(t));
    tracker = std::move(t.value());
  }

  Agent& AddAgent(std::vector<std::string> extra = {}, std::string tracker_url = "") {
    AgentOptions opts;
    opts.cache_dir = dir.Sub("cache" + std::to_string(agents.size()));
    opts.upstreams = {"docker.io=" + proxy->Url()};
    opts.extra_args = {"--tracker",          tracker_url.empty() ? tracker->Url() : tracker_url,
                       "--swarm-listen",     "127.0.0.1:0",
                       "--agent-id",         "agent" + std::to_string(agents.size()),
                       "--node-name",        "node" + std::to_string(agents.size()),
                       "--lease-wait-ms",    "1000",
                       "--tracker-grace-ms", "3000",
                       "--peer-stall-ms",    "3000"};
    opts.extra_args.insert(opts.extra_args.end(), extra.begin(), extra.end());
    auto a = Agent::Start(opts);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    agents.push_back(std::move(a.value()));
    return *agents.back();
  }

  Result<LayoutImage> Pull(size_t agent, const std::string& out) {
    return SkopeoCopyToLayout(agents[agent]->HostPort() + "/demo/app:1", dir.Sub(out));
  }

  // Pulls through every agent at once; checks each result digest for digest.
  void PullAll(const std::string& tag) {
    std::vector<Result<LayoutImage>> results(agents.size(),
                                             MakeError(ErrorCode::kInternal, "not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < agents.size(); ++i) {
      if (!agents[i]) continue;
      threads.emplace_back([&, i] { results[i] = Pull(i, tag + std::to_string(i)); });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < agents.size(); ++i) {
      if (!agents[i]) continue;
      REQUIRE_MESSAGE(results[i].has_value(),
                      (Why(results[i]) + "\n" + agents[i]->LogTail()));
      CheckSame(results[i].value());
    }
  }

  void CheckSame(const LayoutImage& pulled) const {
    CHECK(pulled.manifest_digest == image.manifest_digest);
    CHECK(pulled.config_digest == image.config_digest);
    CHECK(pulled.layer_digests == image.layer_digests);
  }

  std::string CachedPath(size_t agent, const Digest& d) const {
    return dir.Sub("cache" + std::to_string(agent)) + "/blobs/sha256/" + d.hex().substr(0, 2) +
           "/" + d.hex();
  }

  double Sum(const std::string& metric, const std::map<std::string, std::string>& labels = {}) {
    double total = 0;
    for (auto& a : agents)
      if (a) total += a->Metric(metric, labels);
    return total;
  }
};

}  // namespace

TEST_CASE("swarm: a cold pull on 5 agents at once crosses from upstream about once") {
  SwarmWorld w({"--max-upstream-fetchers", "4"});
  for (int i = 0; i < 5; ++i) w.AddAgent();
  w.PullAll("cold");
  double upstream = static_cast<double>(w.proxy->BlobBytes());
  double total = static_cast<double>(w.image.total_blob_bytes);
  MESSAGE("upstream blob bytes " << upstream << " for an image of " << total << " blob bytes");
  CHECK(upstream <= 1.1 * total);
  CHECK(upstream >= total);
  // Chunk torrents announced over UDP (the agents' default), none over HTTP.
  CHECK(w.tracker->Metric("shoal_tracker_udp_requests_total",
                          {{"action", "announce"}, {"result", "ok"}}) > 0);
  CHECK(w.tracker->Metric("shoal_tracker_http_requests_total", {{"route", "announce"}}) == 0);
  // Four agents got (nearly) everything from peers.
  CHECK(w.Sum("shoal_swarm_peer_bytes_total") >= 3.0 * total);
  CHECK(w.Sum("shoal_swarm_fallback_total") == 0);
  // Every agent holds the verified big layer in its cache.
  for (size_t i = 0; i < w.agents.size(); ++i)
    CHECK(std::filesystem::exists(w.CachedPath(i, w.image.layer_digests[1])));
  // Every agent exports libtorrent's discarded peer bytes by reason (sampled every second), and
  // they are a part of what it received from peers.
  for (auto& a : w.agents) {
    std::string text = a->Metrics();
    double wasted = 0;
    for (const char* reason : swarm::kWasteReasons) {
      CHECK_MESSAGE(text.find("shoal_swarm_wasted_bytes_total{reason=\"" + std::string(reason) +
                              "\"}") != std::string::npos,
                    reason);
      wasted += testkit::MetricSum(text, "shoal_swarm_wasted_bytes_total", {{"reason", reason}});
    }
    CHECK(wasted <= testkit::MetricSum(text, "shoal_swarm_payload_downloaded_bytes_total"));
  }
}

TEST_CASE(
    "swarm: after a pull on 3 agents the cluster view and shoalctl show the image, its size, "
    "nodes done and upstream bytes, and name a fourth node that stopped half-way") {
  // Agents that stop polling count as gone after 3 s (the default is 30 s).
  SwarmWorld w({"--prefetch-agent-ttl-s", "3"});
  for (int i = 0; i < 3; ++i) w.AddAgent();
  w.PullAll("view");
  const uint64_t upstream = w.proxy->BlobBytes();
  const double peers = w.Sum("shoal_swarm_peer_bytes_total");
  MESSAGE("upstream blob bytes " << upstream << ", peer bytes " << peers << ", image "
                                 << w.image.total_blob_bytes << " blob bytes");
  // Agents announce a chunk's completion right after it; wait until the tracker counts every node.
  nlohmann::json img;
  WaitUntil(
      [&] {
        auto got = HttpGet(w.tracker->Url() + "/v1/cluster", OperatorAuth(), seconds(5));
        if (!got.has_value() || got.value().status != 200) return false;
        nlohmann::json v = nlohmann::json::parse(got.value().body, nullptr, false);
        if (!v.is_object() || !v["images"].is_array() || v["images"].size() != 1) return false;
        img = v["images"][0];
        return img["nodes_done"] == 3 && img["nodes_in_progress"] == 0;
      },
      seconds(10), milliseconds(100));
  INFO(img.dump());
  CHECK(img["manifest"] == w.image.manifest_digest.str());
  CHECK(img["references"][0] == "docker.io/demo/app:1");
  CHECK(img["size"] == w.image.total_blob_bytes);
  CHECK(img["blobs_total"] == w.image.layer_digests.size() + 1);
  CHECK(img["blobs_known"] == img["blobs_total"]);
  CHECK(img["blobs_ready"] == img["blobs_total"]);
  CHECK(img["nodes_done"] == 3);
  CHECK(img["nodes_in_progress"] == 0);
  CHECK(img["complete"] == true);
  CHECK(img["eta_ms"] == 0);
  // Every blob byte crossed from upstream once, under a lease, as the proxy counted.
  CHECK(img["upstream_bytes"] == upstream);
  // The seeders hold 3 copies: one from upstream, two from peers (as the agents counted them).
  CHECK(img["held_bytes"] == 3 * w.image.total_blob_bytes);
  CHECK(img["peer_bytes"].get<double>() == doctest::Approx(peers).epsilon(0.02));
  // No image name on /metrics, which answers anyone.
  auto metrics = HttpGet(w.tracker->Url() + "/metrics", {}, seconds(5));
  REQUIRE(metrics.has_value());
  CHECK(metrics.value().body.find("demo/app") == std::string::npos);

  // shoalctl status --cluster --image: complete without any prefetch job, from the image's entry.
  const std::string cmd = std::string("'") + SHOAL_CTL_BIN +
                          "' status --cluster --operator-token-file '" + Tokens().operator_file +
                          "' --tracker " + w.tracker->Url() + " --image demo/app:1";
  auto run = RunCommand({"sh", "-c", cmd + " 2>&1; echo exit=$?"}, seconds(30));
  REQUIRE(run.has_value());
  INFO(run.value());
  CHECK(run.value().find("exit=0") != std::string::npos);
  CHECK(run.value().find("3 nodes done, 0 in progress, 0 failed") != std::string::npos);
  CHECK(run.value().find("docker.io/demo/app:1") != std::string::npos);

  // A fourth node takes the config blob only (its client stopped there). The tracker names it
  // among the image's slowest nodes by the node name its agent polls with, since the poll says
  // which swarm port is its own; the swarms say how much of the image it holds.
  Agent& partial = w.AddAgent();
  auto config =
      HttpGet(partial.Url() + "/v2/demo/app/blobs/" + w.image.config_digest.str(), {}, seconds(30));
  REQUIRE(config.has_value());
  CHECK(config.value().status == 200);
  auto image_entry = [&] {
    auto got = HttpGet(w.tracker->Url() + "/v1/cluster", OperatorAuth(), seconds(5));
    if (!got.has_value() || got.value().status != 200) return nlohmann::json();
    nlohmann::json v = nlohmann::json::parse(got.value().body, nullptr, false);
    if (!v.is_object() || !v["images"].is_array() || v["images"].size() != 1)
      return nlohmann::json();
    return v["images"][0];
  };
  WaitUntil(
      [&] {
        img = image_entry();
        return img.is_object() && img["slowest_nodes"].size() == 1 &&
               img["slowest_nodes"][0]["chunks_held"] == 1;
      },
      seconds(10), milliseconds(100));
  INFO(img.dump());
  CHECK(img["nodes_exact"] == true);
  CHECK(img["nodes_done"] == 3);
  CHECK(img["nodes_in_progress"] == 1);
  CHECK(img["complete"] == false);
  REQUIRE(img["slowest_nodes"].size() == 1);
  nlohmann::json slow = img["slowest_nodes"][0];
  CHECK(slow["node"] == "node3");
  CHECK(slow["agent"] == "agent3");
  CHECK(slow["state"] == "running");
  CHECK(slow["blobs_done"] == 1);
  CHECK(slow["blobs_total"] == img["blobs_total"]);
  CHECK(slow["bytes_done"] == img["blobs"][0]["size"]);  // the config, listed first
  CHECK(slow["bytes_total"] == w.image.total_blob_bytes);

  // Its agent dies: once it has not polled for the agent TTL the node is stalled, counted failed,
  // and shoalctl says so for that node by name.
  partial.Kill();
  WaitUntil(
      [&] {
        img = image_entry();
        return img.is_object() && img["nodes_failed"] == 1;
      },
      seconds(10), milliseconds(100));
  REQUIRE(img["slowest_nodes"].size() == 1);
  slow = img["slowest_nodes"][0];
  CHECK(slow["node"] == "node3");
  CHECK(slow["state"] == "stalled");
  CHECK(slow["error"].get<std::string>().find("its agent stopped polling") == 0);
  run = RunCommand({"sh", "-c", cmd + " --nodes node3 2>&1; echo exit=$?"}, seconds(30));
  REQUIRE(run.has_value());
  INFO(run.value());
  CHECK(run.value().find("exit=1") != std::string::npos);
  CHECK(run.value().find("stalled on node3") != std::string::npos);
}

TEST_CASE("swarm: peers receive a large layer's bytes before any agent has all of it") {
  SwarmWorld w({"--max-upstream-fetchers", "1"});
  // A slow upstream: 24 MiB take several seconds, so the window is easy to see.
  w.proxy->SetDelayPerMiB(milliseconds(150));
  for (int i = 0; i < 3; ++i) w.AddAgent();
  const Digest& big = w.image.layer_digests[1];
  std::atomic<bool> done{false};
  std::thread puller([&] {
    w.PullAll("early");
    done = true;
  });
  bool seen = false;
  while (!done && !seen) {
    bool any_complete = false;
    for (size_t i = 0; i < w.agents.size(); ++i)
      any_complete |= std::filesystem::exists(w.CachedPath(i, big));
    double peer = w.Sum("shoal_swarm_peer_bytes_total");
    // More than the small blobs: bytes of the big layer arrived from peers.
    if (!any_complete && peer > 4.0 * (1 << 20)) seen = true;
    std::this_thread::sleep_for(milliseconds(50));
  }
  puller.join();
  CHECK_MESSAGE(seen, "no agent received big-layer bytes from peers before one had it whole");
}

// Whether the tracker's status page lists an upstream lease held by agent `id` (its lease rows
// are "<blob digest>  <chunk>  <agent id>  <progress>  <expires in>").
bool HoldsLease(const TrackerProcess& tracker, const std::string& id) {
  auto page = HttpGet(tracker.Url() + "/", OperatorAuth());
  if (!page.has_value()) return false;
  return std::regex_search(page.value().body, std::regex("\\s\\d+\\s+" + id + "\\s"));
}

TEST_CASE("swarm: an agent killed mid-pull: the others finish and its lease passes on") {
  SwarmWorld w({"--max-upstream-fetchers", "1", "--max-leases-per-agent", "1"});
  w.proxy->SetDelayPerMiB(milliseconds(300));
  for (int i = 0; i < 3; ++i) w.AddAgent();
  std::vector<Result<LayoutImage>> results(3, MakeError(ErrorCode::kInternal, "not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 3; ++i)
    threads.emplace_back([&, i] { results[i] = w.Pull(i, "k" + std::to_string(i)); });
  // Kill an agent that holds a lease on a big-layer chunk. A candidate (granted more than it
  // finished) is frozen with SIGSTOP first, and the tracker's status page must then still list a
  // lease of it: a stopped agent can neither publish nor release, so that lease can only expire.
  // (Choosing from the agents' metrics alone raced with the lease ending before the kill.)
  std::optional<size_t> victim;
  WaitUntil(
      [&] {
        if (w.Sum("shoal_upstream_blob_bytes_total") <= 2.0 * (1 << 20)) return false;
        for (size_t i = 0; i < 3; ++i) {
          double granted = w.agents[i]->Metric("shoal_swarm_leases_granted_total");
          double finished =
              w.agents[i]->Metric("shoal_swarm_chunks_total", {{"source", "upstream_lease"}});
          if (granted <= finished) continue;
          ::kill(w.agents[i]->pid(), SIGSTOP);
          // Let a request it sent just before the stop reach the tracker.
          std::this_thread::sleep_for(milliseconds(300));
          if (HoldsLease(*w.tracker, "agent" + std::to_string(i))) {
            victim = i;
            return true;
          }
          ::kill(w.agents[i]->pid(), SIGCONT);
        }
        return false;
      },
      seconds(30), milliseconds(20));
  REQUIRE_MESSAGE(victim.has_value(), "no agent was seen holding a lease");
  w.agents[*victim]->Kill();
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < 3; ++i) {
    if (i == *victim) continue;
    REQUIRE_MESSAGE(results[i].has_value(),
                    (Why(results[i]) + "\n" + w.agents[i]->LogTail()));
    w.CheckSame(results[i].value());
  }
  CHECK(w.tracker->Metric("shoal_tracker_leases_expired_total") >= 1);
  // The dead agent's chunk was fetched again by a survivor: upstream served a bit more than 1x.
  CHECK(static_cast<double>(w.proxy->BlobBytes()) <= 1.5 * w.image.total_blob_bytes);
}

TEST_CASE("swarm: a leaseholder that hears nothing from upstream lets its lease lapse, and "
          "another agent fetches the chunk") {
  // One lease in the whole cluster (ttl 3 s), and the first blob GET reaches an upstream that
  // never answers: before, its holder renewed the lease through every retry of the GET (30 s
  // each) and every node waited on that one chunk.
  SwarmWorld w({"--max-upstream-fetchers", "1", "--max-leases-per-agent", "1"});
  w.proxy->StallNextBlobGets(1);
  for (int i = 0; i < 3; ++i) w.AddAgent();
  const auto started = std::chrono::steady_clock::now();
  std::vector<double> took(3, 0);
  std::vector<Result<LayoutImage>> results(3, MakeError(ErrorCode::kInternal, "not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      results[i] = w.Pull(i, "lapse" + std::to_string(i));
      took[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    });
  }
  for (auto& t : threads) t.join();
  size_t prompt = 0;
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE_MESSAGE(results[i].has_value(),
                    (Why(results[i]) + "\n" + w.agents[i]->LogTail()));
    w.CheckSame(results[i].value());
    MESSAGE("agent " << i << " pulled in " << took[i] << " s");
    if (took[i] < 20) ++prompt;
  }
  // The two agents whose GETs were answered did not wait out the stalled one (30 s a try).
  CHECK(prompt >= 2);
  CHECK(w.tracker->Metric("shoal_tracker_leases_expired_total") >= 1);
  // The stalled agent's next try was answered after its lease had lapsed: it gave the chunk
  // up instead of fetching it a second time, and took it from its peers.
  size_t gave_way = 0;
  for (auto& a : w.agents)
    if (a->Log().find("lapsed before its first upstream byte") != std::string::npos) ++gave_way;
  CHECK(gave_way == 1);
}

TEST_CASE("swarm: the tracker restarted mid-pull: the pull completes") {
  SwarmWorld w({"--max-upstream-fetchers", "2"});
  w.proxy->SetDelayPerMiB(milliseconds(300));
  // Re-published at once after the restart, not within the default 10 s: the pull takes about
  // 7 s, and the check below needs blobs that are still downloading when that happens.
  for (int i = 0; i < 3; ++i) w.AddAgent({"--republish-spread-s", "0"});
  std::atomic<bool> done{false};
  std::thread puller([&] {
    w.PullAll("restart");
    done = true;
  });
  WaitUntil([&] { return w.Sum("shoal_swarm_peer_bytes_total") > 1.0 * (1 << 20); }, seconds(30));
  REQUIRE(w.tracker->Restart().has_value());
  puller.join();
  // The restarted tracker learned the chunks again from the agents.
  bool republished = WaitUntil(
      [&] { return w.tracker->Metric("shoal_tracker_chunks_published_total") >= 1; }, seconds(10));
  CHECK(republished);
  // Chunks of blobs still downloading when the tracker came back were re-published too (the
  // restart came after peers had exchanged bytes, so some agent held such chunks).
  int partial = 0;
  const std::regex line(R"(re-published \d+ chunks .*; (\d+) of blobs still downloading)");
  for (auto& a : w.agents) {
    std::string log = a->Log();
    for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it) {
      partial += std::stoi((*it)[1].str());
    }
  }
  CHECK(partial > 0);
}

TEST_CASE("swarm: with UDP to the tracker blocked, agents announce over HTTP from the start and "
          "the swarm carries the pull") {
  // A tracker without UDP announces: its UDP port answers nothing, its TCP port does, as behind
  // a firewall that lets TCP through but not UDP.
  SwarmWorld w({"--udp-announce", "false", "--max-upstream-fetchers", "4"});
  for (int i = 0; i < 3; ++i) w.AddAgent();
  w.PullAll("tcp-only");
  CHECK(w.Sum("shoal_swarm_fallback_total") == 0);
  CHECK(static_cast<double>(w.proxy->BlobBytes()) <= 1.1 * w.image.total_blob_bytes);
  CHECK(w.Sum("shoal_swarm_peer_bytes_total") > 0);
  CHECK(w.tracker->Metric("shoal_tracker_http_requests_total", {{"route", "announce"}}) > 0);
  for (auto& a : w.agents) {
    CHECK(a->Log().find("its UDP announce port does not answer, its TCP port does") !=
          std::string::npos);
  }
}

TEST_CASE("swarm: with --ready-interval-ms, agents ask for ready chunks at most that often and "
          "the swarm carries the pull") {
  SwarmWorld w({"--max-upstream-fetchers", "4"});
  constexpr int kIntervalMs = 1000;
  for (int i = 0; i < 3; ++i) w.AddAgent({"--ready-interval-ms", std::to_string(kIntervalMs)});
  const auto started = std::chrono::steady_clock::now();
  w.PullAll("batched");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
                          .count();
  CHECK(w.Sum("shoal_swarm_fallback_total") == 0);
  CHECK(static_cast<double>(w.proxy->BlobBytes()) <= 1.1 * w.image.total_blob_bytes);
  CHECK(w.Sum("shoal_swarm_peer_bytes_total") > 0);
  // Each blob's watcher polls at most once per interval (and once more as it starts).
  const double ready =
      w.tracker->Metric("shoal_tracker_blob_api_requests_total", {{"route", "ready"}});
  const double blobs = static_cast<double>(w.image.layer_digests.size() + 1);
  const double bound = w.agents.size() * blobs * (took * 1000 / kIntervalMs + 1);
  MESSAGE("ready polls " << ready << " in " << took << " s, at most " << bound);
  CHECK(ready <= bound);
}

TEST_CASE("swarm: with --tracker-announce batch, chunk torrents announce through the agent's relay, several to a request") {
  SwarmWorld w({"--max-upstream-fetchers", "4"});
  for (int i = 0; i < 4; ++i) w.AddAgent({"--tracker-announce", "batch"});
  w.PullAll("batched-announces");
  const double total = static_cast<double>(w.image.total_blob_bytes);
  CHECK(static_cast<double>(w.proxy->BlobBytes()) <= 1.1 * total);
  CHECK(w.Sum("shoal_swarm_peer_bytes_total") >= 2.0 * total);
  CHECK(w.Sum("shoal_swarm_fallback_total") == 0);
  for (size_t i = 0; i < w.agents.size(); ++i)
    CHECK(std::filesystem::exists(w.CachedPath(i, w.image.layer_digests[1])));
  // Every announce came in a batch: none over UDP or GET /announce, and fewer requests than
  // announces.
  const double batched = w.tracker->Metric("shoal_tracker_batched_announces_total");
  const double batches = w.tracker->Metric("shoal_tracker_http_requests_total",
                                           {{"route", "announce-batch"}, {"code", "200"}});
  MESSAGE(batched << " announces in " << batches << " batches");
  CHECK(batched >= w.agents.size() * (w.image.layer_digests.size() + 1));
  CHECK(batches <= batched);  // how many share a batch during a pull is up to timing
  CHECK(w.tracker->Metric("shoal_tracker_udp_requests_total", {{"action", "announce"}}) == 0);
  CHECK(w.tracker->Metric("shoal_tracker_http_requests_total", {{"route", "announce"}}) == 0);
  CHECK(w.tracker->Metric("shoal_tracker_http_requests_total", {{"route", "announce-batch"}}) ==
        batches);

  // The relay serves only its own libtorrent session: a request without its key, or for a
  // replica it does not have, gets a failure reason and reaches no tracker.
  const std::string log = w.agents[0]->Log();
  const std::string said = "announce relay on 127.0.0.1:";
  const size_t at = log.find(said);
  REQUIRE(at != std::string::npos);
  const std::string relay = "http://127.0.0.1:" + std::to_string(std::stoi(log.substr(at + said.size())));
  const std::string query = "&info_hash=" + std::string(20, 'a') +
                            "&peer_id=-LT2080-abcdefghijkl&port=7000&left=1&compact=1";
  for (const std::string& target : {"/announce/0?auth=wrong" + query, "/announce/0" + query,
                                    "/announce/7?auth=wrong" + query, std::string("/scrape/0?x=1")}) {
    auto res = HttpGet(relay + target, {}, std::chrono::seconds(5));
    REQUIRE(res.has_value());
    CHECK_MESSAGE(res.value().body.find("failure reason") != std::string::npos, target);
  }
  CHECK(w.tracker->Metric("shoal_tracker_batched_announces_total") == batched);

  // A restarted agent seeds its whole cache again: every chunk torrent announces at once, and
  // the relay sends them in a few batches, not one request each. Before that, as it stops, its
  // chunk torrents' `stopped` announces go through the relay too (the swarm pauses and waits for
  // them while the relay still runs), so the tracker drops it from their swarms at once.
  const double chunk_torrents = batched / static_cast<double>(w.agents.size()) / 2;  // per agent
  const double stopped_before =
      w.tracker->Metric("shoal_tracker_announces_total", {{"event", "stopped"}});
  REQUIRE_MESSAGE(w.agents[0]->Restart().has_value(), w.agents[0]->LogTail());
  const double stopped =
      w.tracker->Metric("shoal_tracker_announces_total", {{"event", "stopped"}}) - stopped_before;
  MESSAGE("stopped announces at the restart: " << stopped << " of about " << chunk_torrents);
  CHECK(stopped >= chunk_torrents * 0.9);
  CHECK(w.agents[0]->Log().find("stopped announces answered") != std::string::npos);
  double after = batched;
  bool seeded = WaitUntil(
      [&] {
        after = w.tracker->Metric("shoal_tracker_batched_announces_total");
        return after - batched >= chunk_torrents * 0.9;
      },
      std::chrono::seconds(30), std::chrono::milliseconds(100));
  const double more_batches = w.tracker->Metric("shoal_tracker_http_requests_total",
                                                {{"route", "announce-batch"}, {"code", "200"}}) -
                              batches;
  MESSAGE("after the restart: " << after - batched << " announces in " << more_batches
                                << " batches");
  CHECK(seeded);
  CHECK(more_batches * 3 <= after - batched);
}

TEST_CASE("swarm: with no tracker answering, agents fetch straight from upstream") {
  SwarmWorld w;
  uint16_t dead = FreePort();
  for (int i = 0; i < 2; ++i) w.AddAgent({}, "http://127.0.0.1:" + std::to_string(dead));
  w.PullAll("direct");
  CHECK(w.Sum("shoal_swarm_fallback_total") >= 2);
  CHECK(w.Sum("shoal_swarm_peer_bytes_total") == 0);
}

TEST_CASE("swarm: a peer serving corrupt data is detected and its bytes never reach a client") {
  SwarmWorld w;
  w.AddAgent();
  auto first = w.Pull(0, "seed");
  REQUIRE_MESSAGE(first.has_value(), Why(first));
  // Corrupt the seeder's cached copy of the big layer in place (its torrents read this file).
  const Digest& big = w.image.layer_digests[1];
  {
    std::fstream f(w.CachedPath(0, big), std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f.good());
    for (uint64_t off = 4096; off < w.image.layer_sizes[1]; off += 1 << 20) {
      f.seekp(static_cast<std::streamoff>(off));
      f.write("CORRUPT!", 8);
    }
  }
  w.proxy->Reset();
  w.AddAgent();
  auto second = w.Pull(1, "victim");
  REQUIRE_MESSAGE(second.has_value(), (Why(second) + "\n" + w.agents[1]->LogTail()));
  w.CheckSame(second.value());
  CHECK(w.agents[1]->Metric("shoal_swarm_hash_failures_total") >= 1);
  // The chunks the corrupt peer could not serve came again from upstream.
  CHECK(w.proxy->BlobBytes() > 0);
}

}  // namespace shoal::testkit

namespace shoal::testkit {

TEST_CASE("swarm: two tracker replicas: with one dead, the other coordinates the pull") {
  SwarmWorld w({"--max-upstream-fetchers", "4"});
  auto second = TrackerProcess::Start(
      {"--chunk-size-kib", "2048", "--piece-size-kib", "256", "--lease-ttl-s", "3"});
  REQUIRE_MESSAGE(second.has_value(), Why(second));
  std::string both = w.tracker->Url() + "," + second.value()->Url();
  for (int i = 0; i < 3; ++i) w.AddAgent({}, both);
  // The first replica dies: blobs it owned by rendezvous order move to the second.
  w.tracker->Kill();
  w.PullAll("replica");
  CHECK(w.Sum("shoal_swarm_fallback_total") == 0);
  CHECK(static_cast<double>(w.proxy->BlobBytes()) <= 1.1 * w.image.total_blob_bytes);
  CHECK(second.value()->Metric("shoal_tracker_chunks_published_total") >= 1);
}

}  // namespace shoal::testkit

namespace shoal::testkit {
namespace {

// Chunks of every blob of `image` in the tracker's tables (0 for a blob it does not know).
size_t TrackerChunks(const TrackerProcess& tracker, const BuiltImage& image) {
  std::vector<Digest> blobs = image.layer_digests;
  blobs.push_back(image.config_digest);
  size_t chunks = 0;
  for (const Digest& d : blobs) {
    auto r = HttpGet(tracker.Url() + "/v1/blobs/" + d.str(), AgentAuth());
    if (!r || r.value().status != 200) continue;
    auto j = nlohmann::json::parse(r.value().body, nullptr, false);
    if (j.is_object() && j.contains("chunks")) chunks += j["chunks"].size();
  }
  return chunks;
}

}  // namespace

// UDP blocked after the agents started (the replica comes back without its UDP port, as behind a
// firewall rule added later): the UDP announces time out while its HTTP API answers, a probe
// finds TCP open and UDP silent, and the chunk torrents announce to it over HTTP from then on.
TEST_CASE("swarm: UDP to the tracker blocked after the agents started: announces move to HTTP "
          "once a probe finds UDP silent and TCP open") {
  SwarmWorld w({"--max-upstream-fetchers", "4"});
  for (int i = 0; i < 3; ++i) w.AddAgent();
  w.PullAll("udp-then-tcp");
  const double chunks = static_cast<double>(TrackerChunks(*w.tracker, w.image));
  REQUIRE(chunks > 0);
  REQUIRE(WaitUntil([&] { return w.tracker->Metric("shoal_tracker_seeders") >= 3 * chunks; },
                    seconds(15), milliseconds(100)));
  REQUIRE_MESSAGE(w.tracker->Restart({"--udp-announce", "false"}).has_value(),
                  w.tracker->LogTail());
  // The agents see the restart (their prefetch polls), re-announce every chunk within the
  // spread; those time out over UDP, the probe says TCP only, and they come back over HTTP.
  const bool back = WaitUntil(
      [&] { return w.tracker->Metric("shoal_tracker_seeders") >= 3 * chunks; }, seconds(60),
      milliseconds(200));
  CHECK_MESSAGE(back, "seeders " << w.tracker->Metric("shoal_tracker_seeders") << " of "
                                 << 3 * chunks);
  CHECK(w.tracker->Metric("shoal_tracker_http_requests_total", {{"route", "announce"}}) > 0);
  for (auto& a : w.agents) {
    CHECK_MESSAGE(a->Log().find("UDP announces to it time out while its TCP port answers") !=
                      std::string::npos,
                  a->LogTail());
  }
}

// Issue 16: a chunk torrent lists its blob's owner replica (rendezvous order, as the blob calls)
// in tier 0 and the other replicas after it, one tier each, and libtorrent announces to the
// first tier that works. So each replica tracks the swarms of the blobs it owns and no others,
// and R replicas share the cluster's announces instead of each receiving all of them. The same
// pull with libtorrent's announce_to_all_tiers and announce_to_all_trackers (the design until
// then) is the baseline, measured in the same run. When an owner dies, a new node's chunks of
// its blobs are announced to the next replica, which then owns those blobs' tables.
TEST_CASE(
    "swarm: three tracker replicas: chunk announces reach each blob's owner only, and "
    "move to the next replica when the owner dies") {
  struct Round {
    double swarms = 0, announces = 0;
  };
  auto run = [&](const std::vector<std::string>& agent_extra, bool kill_owner) {
    SwarmWorld w;
    std::vector<std::unique_ptr<TrackerProcess>> more;
    for (int i = 0; i < 2; ++i) {
      auto t = TrackerProcess::Start(
          {"--chunk-size-kib", "2048", "--piece-size-kib", "256", "--lease-ttl-s", "3"});
      REQUIRE_MESSAGE(t.has_value(), Why(t));
      more.push_back(std::move(t.value()));
    }
    std::vector<TrackerProcess*> replicas = {w.tracker.get(), more[0].get(), more[1].get()};
    std::string all = replicas[0]->Url() + "," + replicas[1]->Url() + "," + replicas[2]->Url();
    for (int i = 0; i < 3; ++i) w.AddAgent(agent_extra, all);
    w.PullAll("own");
    CHECK(w.Sum("shoal_swarm_fallback_total") == 0);
    // Every chunk's swarm, on the replicas that track it: announces are asynchronous, so wait
    // for the completed ones (each agent seeds every chunk it pulled).
    size_t chunks = 0;
    for (TrackerProcess* r : replicas) chunks += TrackerChunks(*r, w.image);
    REQUIRE(chunks > 0);
    const double copies = agent_extra.empty() ? 1 : 3;
    auto swarms = [&] {
      double sum = 0;
      for (TrackerProcess* r : replicas) sum += r->Metric("shoal_tracker_swarms");
      return sum;
    };
    WaitUntil([&] { return swarms() >= copies * static_cast<double>(chunks); }, seconds(15),
              milliseconds(100));
    Round round;
    round.swarms = swarms();
    for (size_t i = 0; i < replicas.size(); ++i) {
      const double own = static_cast<double>(TrackerChunks(*replicas[i], w.image));
      const double tracked = replicas[i]->Metric("shoal_tracker_swarms");
      const double announces = replicas[i]->Metric("shoal_tracker_announces_total");
      round.announces += announces;
      MESSAGE("replica " << i << ": owns " << own << " chunks, tracks " << tracked
                         << " swarms, received " << announces << " announces");
      // Owner-only: a replica tracks exactly the chunks of its own tables.
      if (agent_extra.empty()) CHECK(tracked == own);
    }
    CHECK(round.swarms == copies * static_cast<double>(chunks));
    if (!kill_owner) return round;

    // Kill the owner of the largest layer; a fourth node pulls the image.
    const Digest& big = w.image.layer_digests[1];
    size_t owner = replicas.size();
    for (size_t i = 0; i < replicas.size(); ++i) {
      auto r = HttpGet(replicas[i]->Url() + "/v1/blobs/" + big.str(), AgentAuth());
      if (r && r.value().status == 200) owner = i;
    }
    REQUIRE(owner < replicas.size());
    replicas[owner]->Kill();
    // The seeders see the replica fail (their prefetch polls break) and, within the 10 s
    // spread, re-publish its blobs' tables to the next replica and announce their chunks there.
    size_t next = replicas.size();
    auto next_has_table = [&] {
      for (size_t i = 0; i < replicas.size(); ++i) {
        if (i == owner) continue;
        auto r = HttpGet(replicas[i]->Url() + "/v1/blobs/" + big.str(), AgentAuth());
        if (!r || r.value().status != 200) continue;
        auto j = nlohmann::json::parse(r.value().body, nullptr, false);
        if (!j.is_object() || !j.contains("chunks")) continue;
        bool all_ready = !j["chunks"].empty();
        for (const auto& c : j["chunks"]) all_ready = all_ready && c.value("state", "") == "ready";
        if (all_ready) next = i;
        if (all_ready) return true;
      }
      return false;
    };
    REQUIRE(WaitUntil(next_has_table, seconds(20), milliseconds(200)));
    // And the 3 seeders of every chunk it now owns announced there.
    const double next_chunks = static_cast<double>(TrackerChunks(*replicas[next], w.image));
    CHECK(WaitUntil(
        [&] { return replicas[next]->Metric("shoal_tracker_seeders") >= 3 * next_chunks; },
        seconds(20), milliseconds(200)));
    w.proxy->Reset();
    Agent& late = w.AddAgent({}, all);
    auto pulled = w.Pull(3, "late");
    REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + late.LogTail()));
    w.CheckSame(pulled.value());
    CHECK(late.Metric("shoal_swarm_fallback_total") == 0);
    // Every blob came from the seeders, the dead owner's too: nothing from upstream.
    CHECK_MESSAGE(w.proxy->BlobBytes() == 0, late.LogTail());
    // The next replica tracks exactly the swarms of the tables it now has.
    const double next_own = static_cast<double>(TrackerChunks(*replicas[next], w.image));
    CHECK(WaitUntil([&] { return replicas[next]->Metric("shoal_tracker_swarms") >= next_own; },
                    seconds(15), milliseconds(100)));
    CHECK(replicas[next]->Metric("shoal_tracker_swarms") == next_own);

    // The next replica restarts (tables and swarms gone) while the owner is still dead. The
    // seeders re-publish there and re-announce both its own blobs and the dead owner's, whose
    // chunk torrents reach it from their second tier (tier 0 still fails).
    replicas[next]->Kill();
    REQUIRE_MESSAGE(replicas[next]->Restart().has_value(), replicas[next]->LogTail());
    const auto restarted = std::chrono::steady_clock::now();
    CHECK(WaitUntil(
        [&] { return static_cast<double>(TrackerChunks(*replicas[next], w.image)) >= next_own; },
        seconds(30), milliseconds(200)));
    // 60 s: alone, 12-19 s after the restart (four at a time with both cores busy). In one CI
    // run 4 of 68 seeders took 77 s (not reproduced). Until session 34 an agent whose UDP
    // announces to the dying replicas timed out took them for UDP blocked (their HTTP API had
    // answered within 30 s) and replaced every chunk torrent's trackers, in every kept run;
    // whether that caused the 77 s is not proven. The trail below is for the next slow case.
    const bool all_back = WaitUntil(
        [&] { return replicas[next]->Metric("shoal_tracker_seeders") >= 4 * next_own; },
        seconds(60), milliseconds(200));
    std::string trail;
    if (!all_back) {
      // What each agent saw of the replicas, for the slow case.
      const std::regex seen(
          ".*(restarted|re-announcing|moving|over HTTP|stay on UDP|announces fail|work again).*");
      for (auto& a : w.agents) {
        const std::string log = a->Log();
        trail += "--- agent\n";
        for (std::sregex_iterator it(log.begin(), log.end(), seen), end; it != end; ++it)
          trail += it->str() + "\n";
      }
    }
    CHECK_MESSAGE(all_back, "seeders " << replicas[next]->Metric("shoal_tracker_seeders")
                                       << " of " << 4 * next_own << "\n"
                                       << trail);
    // A replica that died is not a blocked UDP port: its announces stay on UDP.
    for (auto& a : w.agents)
      CHECK(a->Log().find("over HTTP from now on") == std::string::npos);
    MESSAGE("every seeder re-announced to the restarted replica after "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - restarted)
                   .count()
            << " ms");
    return round;
  };
  Round owner_only = run({}, true);
  Round everyone = run({"--libtorrent-setting", "announce_to_all_tiers=true",
                        "--libtorrent-setting", "announce_to_all_trackers=true"},
                       false);
  MESSAGE("3 replicas, 3 agents: owner only "
          << owner_only.announces << " announces, " << owner_only.swarms
          << " swarms; to every replica " << everyone.announces << " announces, " << everyone.swarms
          << " swarms");
  CHECK(owner_only.announces < 0.5 * everyone.announces);
}

// Issue 13, defect 2: an agent killed with SIGKILL in the middle of a cold swarm pull and
// restarted with the same cache (so with the same agent id, its dead self's leases and its
// published chunks still in the tracker) once spun a grant-publish loop for 11 minutes. Three
// kill points, each on a fresh image: each pull after the restart completes with verified
// bytes in bounded time, and the tracker's lease and publish counters stay within a small
// multiple of the chunks there are.
TEST_CASE("swarm: an agent killed mid-pull and restarted on its cache completes, in bounded work") {
  SwarmWorld w;
  w.proxy->SetDelayPerMiB(milliseconds(150));
  Agent& agent = w.AddAgent();
  size_t chunks = 0;
  const double kill_at_mib[] = {0.5, 5, 10};  // of about 14 MiB
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    const std::string tag = "k" + std::to_string(round);
    auto built = BuildImage(SwarmImage(100 + 10 * round), w.dir.Sub("layout-" + tag), "1");
    REQUIRE_MESSAGE(built.has_value(), Why(built));
    REQUIRE(PushImage(*w.registry, built.value().layout_dir, "1", "demo/" + tag).has_value());
    const double upstream_before = w.proxy->BlobBytes();
    std::thread first([&] {
      (void)SkopeoCopyToLayout(agent.HostPort() + "/demo/" + tag + ":1", w.dir.Sub(tag + "-a"));
    });
    bool reached = WaitUntil(
        [&] { return w.proxy->BlobBytes() - upstream_before >= kill_at_mib[round] * (1 << 20); },
        seconds(60), milliseconds(10));
    agent.Kill();
    first.join();
    REQUIRE(reached);
    REQUIRE_MESSAGE(agent.Restart().has_value(), agent.LogTail());
    auto started = std::chrono::steady_clock::now();
    auto pulled =
        SkopeoCopyToLayout(agent.HostPort() + "/demo/" + tag + ":1", w.dir.Sub(tag + "-b"));
    auto took = std::chrono::steady_clock::now() - started;
    REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + agent.LogTail()));
    CHECK(pulled.value().layer_digests == built.value().layer_digests);
    // At 150 ms per MiB the image crosses in about 4 s; a dead seeder or lease costs seconds.
    CHECK(took < seconds(45));
    chunks += TrackerChunks(*w.tracker, built.value());
  }
  const double granted = w.tracker->Metric("shoal_tracker_leases_granted_total");
  const double published = w.tracker->Metric("shoal_tracker_chunks_published_total");
  const double released = w.tracker->Metric("shoal_tracker_leases_released_total");
  MESSAGE("chunks " << chunks << ", granted " << granted << ", published " << published
                    << ", released " << released);
  REQUIRE(chunks > 0);
  CHECK(granted <= 3.0 * chunks + 10);
  CHECK(published <= 3.0 * chunks + 10);
  CHECK(released <= 3.0 * chunks + 10);
}

// The tracker killed with SIGKILL twice during a cold pull by three agents and restarted (its
// tables are soft state): every pull completes with verified bytes, and no agent loops on
// leases or re-publication.
TEST_CASE("swarm: the tracker killed twice mid-pull: every pull completes, in bounded work") {
  SwarmWorld w({"--max-upstream-fetchers", "2"});
  w.proxy->SetDelayPerMiB(milliseconds(200));
  for (int i = 0; i < 3; ++i) w.AddAgent();
  std::thread puller([&] { w.PullAll("tk"); });
  for (double mib : {2.0, 12.0}) {
    WaitUntil([&] { return w.proxy->BlobBytes() >= mib * (1 << 20); }, seconds(60),
              milliseconds(10));
    w.tracker->Kill();
    std::this_thread::sleep_for(milliseconds(300));
    REQUIRE_MESSAGE(w.tracker->Restart().has_value(), w.tracker->LogTail());
  }
  puller.join();
  const size_t chunks = TrackerChunks(*w.tracker, w.image);
  const double granted = w.Sum("shoal_swarm_leases_granted_total");
  const double republished = w.Sum("shoal_swarm_chunks_republished_total");
  MESSAGE("chunks " << chunks << ", agent leases " << granted << ", republished " << republished);
  REQUIRE(chunks > 0);
  CHECK(granted <= 3.0 * chunks + 10);
  CHECK(republished <= 1.0 * chunks + 10);
  // The image crossed from upstream about once, not once per restart.
  CHECK(static_cast<double>(w.proxy->BlobBytes()) <= 2.0 * w.image.total_blob_bytes);
}

}  // namespace shoal::testkit

namespace shoal::testkit {
namespace {

// A query to Prometheus' HTTP API: the sum of an instant vector's values, or nullopt while the
// answer is empty or not a success.
std::optional<double> PromQuery(const std::string& prom, const std::string& query) {
  std::string target = prom + "/api/v1/query?query=";
  for (unsigned char c : query) {
    if (std::isalnum(c) || c == '_') {
      target += static_cast<char>(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "%%%02X", c);
      target += hex;
    }
  }
  auto res = HttpGet(target, {}, std::chrono::seconds(5));
  if (!res.has_value() || res.value().status != 200) return std::nullopt;
  auto j = nlohmann::json::parse(res.value().body, nullptr, false);
  if (j.is_discarded() || j.value("status", "") != "success") return std::nullopt;
  const auto& result = j["data"]["result"];
  if (!result.is_array() || result.empty()) return std::nullopt;
  double sum = 0;
  for (const auto& r : result) sum += std::stod(r["value"][1].get<std::string>());
  return sum;
}

}  // namespace

TEST_CASE("observability: Debian's Prometheus scrapes the tracker and 3 agents through a swarm "
          "pull, and its sums match what the test counted") {
  SwarmWorld w({"--max-upstream-fetchers", "4"});
  std::vector<std::string> agent_targets;
  for (int i = 0; i < 3; ++i) {
    std::string port_file = w.dir.Sub("metrics-port" + std::to_string(i));
    w.AddAgent({"--metrics-listen", "127.0.0.1:0", "--metrics-port-file", port_file});
    std::string port = ReadFile(port_file);
    REQUIRE(!port.empty());
    agent_targets.push_back("127.0.0.1:" + std::to_string(std::stoi(port)));
  }
  // The pull API is not on the metrics listener.
  auto pull_api = HttpGet("http://" + agent_targets[0] + "/v2/", {}, std::chrono::seconds(2));
  REQUIRE(pull_api.has_value());
  CHECK(pull_api.value().status == 404);

  std::string tracker_target = w.tracker->Url().substr(std::string("http://").size());
  std::string config = "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
                       "scrape_configs:\n"
                       "  - job_name: tracker\n    static_configs:\n      - targets: ['" +
                       tracker_target + "']\n"
                       "  - job_name: agent\n    static_configs:\n      - targets: [";
  for (size_t i = 0; i < agent_targets.size(); ++i) {
    config += (i ? ", '" : "'") + agent_targets[i] + "'";
  }
  config += "]\n";
  WriteFile(w.dir.Sub("prometheus.yml"), config);
  auto checked = RunCommand({"promtool", "check", "config", w.dir.Sub("prometheus.yml")});
  REQUIRE_MESSAGE(checked.has_value(), Why(checked));
  const std::string prom_addr = "127.0.0.1:" + std::to_string(FreePort());
  auto prom = Process::Start({"prometheus", "--config.file=" + w.dir.Sub("prometheus.yml"),
                              "--storage.tsdb.path=" + w.dir.Sub("tsdb"),
                              "--web.listen-address=" + prom_addr, "--log.level=warn"},
                             w.dir.Sub("prometheus.log"));
  REQUIRE_MESSAGE(prom.has_value(), Why(prom));
  const std::string prom_url = "http://" + prom_addr;
  REQUIRE_MESSAGE(WaitUntil(
                      [&] {
                        auto up = PromQuery(prom_url, "sum(up)");
                        return up && *up == 4;
                      },
                      std::chrono::seconds(30), std::chrono::milliseconds(200)),
                  ReadFile(w.dir.Sub("prometheus.log")));

  w.PullAll("prom");
  const double upstream = static_cast<double>(w.proxy->BlobBytes());
  REQUIRE(upstream > 0);
  const double blobs = static_cast<double>(w.image.layer_digests.size() + 1);  // + config

  // Wait for a scrape after the pull: every agent's blob responses are counted.
  bool seen = WaitUntil(
      [&] {
        auto done = PromQuery(prom_url, "sum(shoal_shim_blob_complete_seconds_count{job=\"agent\"})");
        auto bytes = PromQuery(prom_url, "sum(shoal_upstream_blob_bytes_total{job=\"agent\"})");
        return done && *done == 3 * blobs && bytes && *bytes == upstream;
      },
      std::chrono::seconds(20), std::chrono::milliseconds(250));
  INFO("upstream bytes at the proxy " << upstream << ", blobs per pull " << blobs);
  CHECK_MESSAGE(seen, "Prometheus' sums never matched the proxy's counts");
  // Bytes from upstream in Prometheus equal the bytes the counting proxy relayed; every pull's
  // every blob reached its client, each with a first byte.
  CHECK(PromQuery(prom_url, "sum(shoal_upstream_blob_bytes_total)").value_or(-1) == upstream);
  CHECK(PromQuery(prom_url, "sum(shoal_shim_blob_first_byte_seconds_count)").value_or(-1) ==
        3 * blobs);
  // The peers moved the rest: 3 pulls of the image took about one image from upstream.
  double peer = PromQuery(prom_url, "sum(shoal_swarm_peer_bytes_total)").value_or(0);
  CHECK(peer > 0);
  CHECK(PromQuery(prom_url, "sum(shoal_tracker_chunks_published_total)").value_or(0) > 0);
  CHECK(PromQuery(prom_url, "count(up{job=\"agent\"} == 1)").value_or(0) == 3);
  // Every agent reports its open peer connections; during the pull some were open.
  CHECK(PromQuery(prom_url, "count(shoal_swarm_peers_connected)").value_or(0) == 3);
  CHECK(PromQuery(prom_url, "sum(max_over_time(shoal_swarm_peers_connected[5m]))").value_or(0) > 0);

  // Every /metrics output passes promtool's exposition-format check.
  for (const std::string& target : agent_targets) {
    auto lint = RunCommand({"sh", "-c", "curl -sf http://" + target + "/metrics | promtool check metrics"});
    CHECK_MESSAGE(lint.has_value(), target << ": " << Why(lint));
  }
  auto lint = RunCommand(
      {"sh", "-c", "curl -sf http://" + tracker_target + "/metrics | promtool check metrics"});
  CHECK_MESSAGE(lint.has_value(), "tracker: " << Why(lint));
  prom.value()->Stop();
}

}  // namespace shoal::testkit
