// `shoalctl prefetch` end to end: real agents in front of Debian's docker-registry (behind a
// counting proxy), a real shoal-tracker for cluster jobs. A node prefetch caches and pins a
// whole image; a cluster prefetch warms every selected agent so that each then serves the image
// with no upstream blob bytes, and only the selected ones; bad references and unknown images
// fail with a clear error and a non-zero exit code.
#include <doctest/doctest.h>

#include <set>

#include <nlohmann/json.hpp>

#include "tests/support/agent.h"
#include "tests/support/counted_upstream.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/runtimes.h"
#include "tests/support/tokens.h"
#include "tests/support/tracker.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

using std::chrono::seconds;

// Two small layers and a 3 MiB one (several chunks with the tracker's 1 MiB chunks).
ImageSpec PrefetchImage(uint64_t seed) {
  ImageSpec spec;
  spec.layers.push_back(LayerSpec{Compression::kGzip, 10, {}, seed});
  spec.layers.push_back(LayerSpec{Compression::kGzip, 2, {3ull << 20}, seed + 1});
  spec.layers.push_back(LayerSpec{Compression::kZstd, 5, {}, seed + 2});
  return spec;
}

std::set<std::string> BlobDigests(const BuiltImage& b) {
  std::set<std::string> out{b.config_digest.str()};
  for (const auto& d : b.layer_digests) out.insert(d.str());
  return out;
}

// digest -> entry of the agent's GET /shoal/v1/cache.
std::map<std::string, nlohmann::json> CacheEntries(const Agent& agent) {
  auto res = HttpGet(agent.Url() + "/shoal/v1/cache");
  REQUIRE(res.has_value());
  REQUIRE(res.value().status == 200);
  const nlohmann::json j = nlohmann::json::parse(res.value().body);
  std::map<std::string, nlohmann::json> out;
  for (const auto& e : j["entries"]) out[e["digest"].get<std::string>()] = e;
  return out;
}

bool CachesAll(const Agent& agent, const std::set<std::string>& digests) {
  auto entries = CacheEntries(agent);
  for (const auto& d : digests) {
    if (!entries.count(d)) return false;
  }
  return true;
}

bool CachesNone(const Agent& agent, const std::set<std::string>& digests) {
  auto entries = CacheEntries(agent);
  for (const auto& d : digests) {
    if (entries.count(d)) return false;
  }
  return true;
}

nlohmann::json ParseJson(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  REQUIRE_MESSAGE(!j.is_discarded(), text);
  return j;
}

struct PrefetchWorld {
  TempDir dir{"shoal-prefetch"};
  std::unique_ptr<Registry> registry;
  std::unique_ptr<CountingProxy> proxy;
  std::unique_ptr<TrackerProcess> tracker;
  std::vector<std::unique_ptr<Agent>> agents;

  PrefetchWorld() {
    auto up = CountedUpstream::Start();
    REQUIRE_MESSAGE(up.has_value(), Why(up));
    registry = std::move(up.value().registry);
    proxy = std::move(up.value().proxy);
  }

  BuiltImage Push(const std::string& name, uint64_t seed) {
    std::string layout = dir.Sub("layout-" + std::to_string(seed));
    auto built = BuildImage(PrefetchImage(seed), layout, "1");
    REQUIRE_MESSAGE(built.has_value(), Why(built));
    auto pushed = PushImage(*registry, layout, "1", name);
    REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
    return built.value();
  }

  void StartTracker() {
    auto t =
        TrackerProcess::Start({"--chunk-size-kib", "1024", "--piece-size-kib", "256",
                               "--min-chunk-size-kib", "1024", "--prefetch-agent-ttl-s", "10"});
    REQUIRE_MESSAGE(t.has_value(), Why(t));
    tracker = std::move(t.value());
  }

  // An agent for gcr.io (through the counting proxy); with the tracker when one runs.
  Agent& AddAgent(const std::string& node, const std::string& labels,
                  std::vector<std::string> extra = {}) {
    AgentOptions opts;
    opts.cache_dir = dir.Sub("cache-" + node);
    opts.upstreams = {"gcr.io=" + proxy->Url()};
    opts.extra_args = {"--unmapped", "error", "--node-name", node};
    if (!labels.empty()) {
      opts.extra_args.push_back("--node-labels");
      opts.extra_args.push_back(labels);
    }
    if (tracker) {
      const std::vector<std::string> swarm = {
          "--tracker",     tracker->Url(),    "--swarm-listen", "127.0.0.1:0",        "--agent-id",
          "agent-" + node, "--peer-stall-ms", "3000",           "--tracker-grace-ms", "5000"};
      opts.extra_args.insert(opts.extra_args.end(), swarm.begin(), swarm.end());
    }
    opts.extra_args.insert(opts.extra_args.end(), extra.begin(), extra.end());
    auto a = Agent::Start(opts);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    agents.push_back(std::move(a.value()));
    return *agents.back();
  }

  // Waits until the tracker (or another replica) has heard from n agents.
  void WaitForAgents(size_t n, TrackerProcess* replica = nullptr) {
    if (!replica) replica = tracker.get();
    bool ok = WaitUntil(
        [&] {
          auto r = HttpGet(replica->Url() + "/v1/prefetch/agents", OperatorAuth());
          if (!r || r.value().status != 200) return false;
          auto j = nlohmann::json::parse(r.value().body, nullptr, false);
          return !j.is_discarded() && j["agents"].size() == n;
        },
        seconds(20), std::chrono::milliseconds(50));
    REQUIRE_MESSAGE(ok, replica->LogTail());
  }

  // shoalctl prefetch ... --json; returns its parsed output (which must be there).
  nlohmann::json Prefetch(std::vector<std::string> args, bool expect_ok = true) {
    args.insert(args.begin(), "prefetch");
    args.push_back("--json");
    args.push_back("--timeout");
    args.push_back("25s");
    args.push_back("--operator-token-file");
    args.push_back(Tokens().operator_file);
    auto out = Shoalctl(args);
    std::string logs;
    for (auto& a : agents) logs += a->LogTail() + "\n";
    if (expect_ok) {
      REQUIRE_MESSAGE(out.has_value(), (Why(out) + "\n" + logs));
      return ParseJson(out.value());
    }
    REQUIRE_MESSAGE(!out.has_value(), out.value());
    return nlohmann::json{{"error", Why(out)}};
  }
};

}  // namespace

TEST_CASE(
    "prefetch: a node prefetch caches and pins every blob of an image, and eviction spares it") {
  PrefetchWorld w;
  BuiltImage a = w.Push("proj/a", 101);
  Agent& agent = w.AddAgent("solo", "", {"--cache-budget", "4096"});

  nlohmann::json out =
      w.Prefetch({"gcr.io/proj/a:1", "--node", "--agent", agent.Url(), "--ttl", "1h"});
  CHECK(out["mode"] == "node");
  CHECK(out["ok"] == true);
  REQUIRE(out["nodes"].size() == 1);
  CHECK(out["nodes"][0]["bytes"] == a.total_blob_bytes);
  const nlohmann::json& job = out["job"];
  CHECK(job["state"] == "done");
  CHECK(job["blobs_total"] == a.layer_digests.size() + 1);
  for (const auto& b : job["blobs"]) {
    CHECK(b["state"] == "done");
    CHECK(b["done"] == b["size"]);
  }

  // Every blob and the manifest are cached and pinned by "prefetch", over a 4 KiB budget.
  std::set<std::string> all = BlobDigests(a);
  all.insert(a.manifest_digest.str());
  auto entries = CacheEntries(agent);
  for (const auto& d : all) {
    REQUIRE_MESSAGE(entries.count(d), d);
    CHECK(entries[d]["pinned"] == true);
    CHECK(entries[d]["pins"][0]["owner"] == "prefetch");
  }
  auto gc = Shoalctl({"cache", "gc", "--to", "0", "--agent", agent.Url()});
  REQUIRE_MESSAGE(gc.has_value(), Why(gc));
  CHECK(CachesAll(agent, all));

  // Again, in human form: everything is cached already; the table says so.
  auto human = Shoalctl({"prefetch", "gcr.io/proj/a:1", "--agent", agent.Url()});
  REQUIRE_MESSAGE(human.has_value(), Why(human));
  CHECK(human.value().find("1 of 1 nodes ok") != std::string::npos);
  CHECK(human.value().find("RESULT") != std::string::npos);

  // The job stays readable through the admin API.
  auto res = HttpGet(agent.Url() + "/shoal/v1/prefetch");
  REQUIRE(res.has_value());
  CHECK(res.value().status == 200);
  CHECK(ParseJson(res.value().body)["jobs"].size() == 2);
}

TEST_CASE(
    "prefetch: a cluster prefetch warms all 3 agents, which then serve the image with no upstream "
    "blob bytes") {
  PrefetchWorld w;
  BuiltImage a = w.Push("proj/a", 201);
  w.StartTracker();
  for (int i = 0; i < 3; ++i) w.AddAgent("node" + std::to_string(i), "");
  w.WaitForAgents(3);

  nlohmann::json out = w.Prefetch({"gcr.io/proj/a:1", "--cluster", "--tracker", w.tracker->Url()});
  CHECK(out["mode"] == "cluster");
  CHECK(out["ok"] == true);
  REQUIRE(out["nodes"].size() == 3);
  for (const auto& n : out["nodes"]) {
    CHECK(n["ok"] == true);
    CHECK(n["bytes"] == a.total_blob_bytes);
  }
  for (auto& agent : w.agents) CHECK(CachesAll(*agent, BlobDigests(a)));
  CHECK(w.tracker->Metric("shoal_tracker_prefetch_jobs_created_total") == 1);

  // Warm: each agent serves the whole image without a blob byte from upstream.
  w.proxy->Reset();
  for (auto& agent : w.agents) {
    auto pulled = Shoalctl({"pull", "gcr.io/proj/a:1", "--agent", agent->Url()});
    REQUIRE_MESSAGE(pulled.has_value(), Why(pulled));
  }
  CHECK(w.proxy->BlobBytes() == 0);
}

TEST_CASE("prefetch: a cluster prefetch of a subset warms only the chosen nodes") {
  PrefetchWorld w;
  BuiltImage b = w.Push("proj/b", 301);
  BuiltImage c = w.Push("proj/c", 401);
  w.StartTracker();
  w.AddAgent("node0", "zone=a");
  w.AddAgent("node1", "zone=b,gpu=yes");
  w.AddAgent("node2", "zone=b");
  w.WaitForAgents(3);

  // By name.
  nlohmann::json out = w.Prefetch(
      {"gcr.io/proj/b:1", "--cluster", "--tracker", w.tracker->Url(), "--nodes", "node1"});
  CHECK(out["ok"] == true);
  REQUIRE(out["nodes"].size() == 1);
  CHECK(out["nodes"][0]["node"] == "node1");
  CHECK(CachesAll(*w.agents[1], BlobDigests(b)));
  CHECK(CachesNone(*w.agents[0], BlobDigests(b)));
  CHECK(CachesNone(*w.agents[2], BlobDigests(b)));

  // By label selector.
  out = w.Prefetch(
      {"gcr.io/proj/c:1", "--cluster", "--tracker", w.tracker->Url(), "--selector", "zone=a"});
  CHECK(out["ok"] == true);
  REQUIRE(out["nodes"].size() == 1);
  CHECK(out["nodes"][0]["node"] == "node0");
  CHECK(CachesAll(*w.agents[0], BlobDigests(c)));
  CHECK(CachesNone(*w.agents[1], BlobDigests(c)));
  CHECK(CachesNone(*w.agents[2], BlobDigests(c)));

  // A percentage: half of 3 nodes is 2 (rounded up), picked deterministically.
  out = w.Prefetch(
      {"gcr.io/proj/c:1", "--cluster", "--tracker", w.tracker->Url(), "--percent", "50"});
  CHECK(out["ok"] == true);
  CHECK(out["nodes"].size() == 2);
  nlohmann::json again = w.Prefetch(
      {"gcr.io/proj/c:1", "--cluster", "--tracker", w.tracker->Url(), "--percent", "50"});
  REQUIRE(again["nodes"].size() == 2);
  for (size_t i = 0; i < 2; ++i) CHECK(again["nodes"][i]["node"] == out["nodes"][i]["node"]);

  // A selection that matches nobody is refused before anything runs.
  auto none =
      Shoalctl({"prefetch", "gcr.io/proj/c:1", "--cluster", "--tracker", w.tracker->Url(),
                "--selector", "zone=mars", "--operator-token-file", Tokens().operator_file});
  REQUIRE_FALSE(none.has_value());
  CHECK(none.error().message.find("matches none") != std::string::npos);
}

TEST_CASE(
    "prefetch: with two tracker replicas a job lives on the first that answers, and agents poll "
    "both") {
  PrefetchWorld w;
  BuiltImage a = w.Push("proj/a", 601);
  BuiltImage b = w.Push("proj/b", 701);
  w.StartTracker();
  auto second = TrackerProcess::Start(
      {"--chunk-size-kib", "1024", "--piece-size-kib", "256", "--min-chunk-size-kib", "1024"});
  REQUIRE_MESSAGE(second.has_value(), Why(second));
  TrackerProcess& replica2 = *second.value();
  for (int i = 0; i < 2; ++i) {
    w.AddAgent("node" + std::to_string(i), "", {"--tracker", replica2.Url()});
  }
  w.WaitForAgents(2);
  w.WaitForAgents(2, &replica2);

  // The job goes to the replica named; both agents take it from there.
  nlohmann::json out = w.Prefetch({"gcr.io/proj/a:1", "--cluster", "--tracker", replica2.Url()});
  CHECK(out["ok"] == true);
  CHECK(out["server"] == replica2.Url());
  CHECK(out["nodes"].size() == 2);
  for (auto& agent : w.agents) CHECK(CachesAll(*agent, BlobDigests(a)));

  // The first replica dies: shoalctl passes over it, the job lives on the second.
  const std::string dead = w.tracker->Url();
  w.tracker->Kill();
  out = w.Prefetch({"gcr.io/proj/b:1", "--cluster", "--tracker", dead + "," + replica2.Url()});
  CHECK(out["ok"] == true);
  CHECK(out["server"] == replica2.Url());
  CHECK(out["nodes"].size() == 2);
  for (auto& agent : w.agents) CHECK(CachesAll(*agent, BlobDigests(b)));
}

TEST_CASE(
    "prefetch: a bad reference or an unknown image fails with a clear error and a non-zero exit "
    "code") {
  PrefetchWorld w;
  w.Push("proj/a", 501);
  w.StartTracker();
  Agent& agent = w.AddAgent("node0", "");
  w.WaitForAgents(1);

  // A bad reference: refused by shoalctl, by the agent and by the tracker.
  auto bad = Shoalctl({"prefetch", "gcr.io/Proj/UPPER:1", "--agent", agent.Url()});
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().message.find("gcr.io/Proj/UPPER:1") != std::string::npos);
  auto res = HttpRequest("POST", agent.Url() + "/shoal/v1/prefetch?ref=gcr.io/Proj/UPPER:1");
  REQUIRE(res.has_value());
  CHECK(res.value().status == 400);
  CHECK(res.value().body.find("gcr.io/Proj/UPPER:1") != std::string::npos);
  res = HttpRequest("POST", w.tracker->Url() + "/v1/prefetch/jobs", OperatorAuth(),
                    R"({"images":["gcr.io/Proj/UPPER:1"]})");
  REQUIRE(res.has_value());
  CHECK(res.value().status == 400);
  CHECK(res.value().body.find("is not a valid reference") != std::string::npos);

  // An unknown image: the node job fails, naming the image and the registry's answer.
  nlohmann::json node = w.Prefetch({"gcr.io/proj/none:1", "--agent", agent.Url()}, false);
  std::string message = node["error"];
  CHECK(message.find("gcr.io/proj/none:1") != std::string::npos);
  CHECK(message.find("\"ok\": false") != std::string::npos);

  // The same through the tracker: the node's part fails with the agent's error.
  auto cluster = Shoalctl({"prefetch", "gcr.io/proj/none:1", "--cluster", "--tracker",
                           w.tracker->Url(), "--timeout", "25s", "--operator-token-file",
                           Tokens().operator_file});
  REQUIRE_FALSE(cluster.has_value());
  CHECK(cluster.error().message.find("node0") != std::string::npos);
  CHECK(cluster.error().message.find("failed") != std::string::npos);
  CHECK(cluster.error().message.find("gcr.io/proj/none:1") != std::string::npos);
  CHECK(cluster.error().message.find("0 of 1 nodes ok") != std::string::npos);
}

}  // namespace shoal::testkit
