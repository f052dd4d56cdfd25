// The tracker's trust model (issue 14) with real parts: a real shoal-tracker with the cluster's
// token files, real agents pulling through it with skopeo, a docker-registry upstream behind the
// counting proxy. The outsider is curl in a network namespace of its own (it stands for a pod
// or a machine on the cluster network that holds no credential).
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "lib/auth/tokens.h"
#include "lib/core/base64.h"
#include "tests/support/agent.h"
#include "tests/support/counted_upstream.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/netns.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/tokens.h"
#include "tests/support/tracker.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

struct World {
  TempDir dir{"shoal-auth"};
  std::unique_ptr<Registry> registry;
  std::unique_ptr<CountingProxy> proxy;
  std::vector<std::unique_ptr<Agent>> agents;

  World() {
    auto up = CountedUpstream::Start();
    REQUIRE_MESSAGE(up.has_value(), Why(up));
    registry = std::move(up.value().registry);
    proxy = std::move(up.value().proxy);
  }

  BuiltImage Push(const std::string& name, uint64_t big, uint64_t seed) {
    auto pushed = PushOneLayerImage(*registry, dir.Sub("layout-" + name), "demo/" + name, big, seed);
    REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
    return pushed.value();
  }

  Agent& AddAgent(const std::string& id, const std::string& tracker,
                  std::vector<std::string> extra = {}, const std::string& swarm_ip = "127.0.0.1") {
    AgentOptions opts;
    opts.cache_dir = dir.Sub("cache-" + id);
    opts.upstreams = {"docker.io=" + proxy->Url()};
    opts.extra_args = {"--tracker",  tracker, "--swarm-listen",  swarm_ip + ":0",
                       "--agent-id", id,      "--peer-stall-ms", "4000"};
    opts.extra_args.insert(opts.extra_args.end(), extra.begin(), extra.end());
    auto a = Agent::Start(opts);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    agents.push_back(std::move(a.value()));
    return *agents.back();
  }

  LayoutImage Pull(Agent& agent, const std::string& name, const std::string& into) {
    auto pulled = SkopeoCopyToLayout(agent.HostPort() + "/demo/" + name + ":1", dir.Sub(into));
    REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + agent.LogTail()));
    return pulled.value();
  }
};

struct Answer {
  int status = 0;
  std::string body;
};

// curl inside the namespace: the status and body of one request (status 0 when curl failed).
Answer CurlInside(const NetNs& ns, const std::string& method, const std::string& url,
                  const std::string& body = "", const std::string& bearer = "") {
  std::vector<std::string> argv = ns.Exec();
  argv.insert(argv.end(),
              {"curl", "-sS", "-m", "5", "-o", "-", "-w", "\n%{http_code}", "-X", method, url});
  if (!body.empty())
    argv.insert(argv.end(), {"-H", "Content-Type: application/json", "--data", body});
  if (!bearer.empty()) argv.insert(argv.end(), {"-H", "Authorization: Bearer " + bearer});
  auto out = RunCommand(argv, seconds(10));
  if (!out) return Answer{0, out.error().message};
  const std::string& text = out.value();
  size_t nl = text.rfind('\n');
  return Answer{std::atoi(text.c_str() + nl + 1), text.substr(0, nl)};
}

}  // namespace

TEST_CASE("access: an outsider can announce, publish, resolve, report or read nothing") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: a network namespace needs root");
    return;
  }
  NetNs ns(71);
  REQUIRE(ns.ok());
  World w;
  BuiltImage img = w.Push("app", 8ull << 20, 71);
  // The tracker listens on the host side of the veth: agents and the outsider both reach it.
  auto tracker = TrackerProcess::StartAt({}, ns.host(),
                                         {"--chunk-size-kib", "1024", "--piece-size-kib", "256"});
  REQUIRE_MESSAGE(tracker.has_value(), Why(tracker));
  TrackerProcess& t = *tracker.value();
  Agent& a1 = w.AddAgent("a1", t.Url(), {}, ns.host());
  LayoutImage first = w.Pull(a1, "app", "p1");
  CHECK(first.layer_digests == img.layer_digests);
  const std::string layer = img.layer_digests.front().str();
  const std::string layer_hex = layer.substr(7);

  const std::string base = t.Url();
  const std::string announce_query =
      "?info_hash=%01%02%03%04%05%06%07%08%09%10%11%12%13%14%15%16%17%18%19%20"
      "&peer_id=-XX0001-000000000000&port=6881&uploaded=0&downloaded=0&left=0";
  const std::string ref_body =
      R"({"agent":"intruder","registry":"docker.io","repository":"demo/app","reference":"1"})";
  struct Attempt {
    std::string method, path, body, bearer;
  };
  std::vector<Attempt> attempts = {
      {"GET", "/announce" + announce_query, "", ""},
      {"GET", "/announce" + announce_query + "&auth=00000000000000000000000000000000", "", ""},
      {"GET", "/scrape", "", ""},
      {"GET", "/v1/blobs/" + layer, "", ""},
      {"POST", "/v1/blobs/" + layer, R"({"agent":"intruder","size":1})", ""},
      {"POST", "/v1/blobs/" + layer + "/work", R"({"agent":"intruder","size":1})", ""},
      {"POST", "/v1/blobs/" + layer + "/chunks/0/bad", R"({"agent":"intruder"})", ""},
      {"PUT", "/v1/manifests/" + img.manifest_digest.str(), ref_body, ""},
      {"POST", "/v1/manifests/resolve", ref_body, ""},
      {"POST", "/v1/prefetch/jobs", R"({"images":["demo/app:1"]})", ""},
      {"POST", "/v1/prefetch/poll", R"({"agent":"intruder","node":"x"})", ""},
      {"GET", "/v1/prefetch/agents", "", ""},
      {"GET", "/v1/blobs/" + layer, "", "made-up-token-0123456789"},
  };
  for (const Attempt& at : attempts) {
    Answer a = CurlInside(ns, at.method, base + at.path, at.body, at.bearer);
    CAPTURE(at.method);
    CAPTURE(at.path);
    CHECK(a.status == 401);
    CHECK(a.body.find("metainfo") == std::string::npos);
    CHECK(a.body.find(layer_hex) == std::string::npos);
  }
  CHECK(t.Metric("shoal_tracker_refused_requests_total") == attempts.size());
  CHECK(t.Metric("shoal_tracker_refused_requests_total", {{"reason", "invalid"}}) == 2);
  CHECK(t.Metric("shoal_tracker_refused_requests_total", {{"route", "announce"}}) == 2);

  // Probes and Prometheus need nothing, and learn no image from it.
  Answer health = CurlInside(ns, "GET", base + "/healthz");
  CHECK(health.status == 200);
  Answer metrics = CurlInside(ns, "GET", base + "/metrics");
  CHECK(metrics.status == 200);
  CHECK(metrics.body.find("sha256:") == std::string::npos);
  Answer page = CurlInside(ns, "GET", base + "/");
  CHECK(page.status == 200);
  CHECK(page.body.find("swarms ") != std::string::npos);  // the totals
  CHECK(page.body.find(layer_hex) == std::string::npos);
  auto detail = HttpGet(base + "/", OperatorAuth());
  REQUIRE(detail.has_value());
  CHECK(detail.value().body.find("manifest") != std::string::npos);
  CHECK(detail.value().body.find("blobs ") != std::string::npos);

  // Roles: an agent's token cannot start cluster jobs, an operator's cannot publish.
  auto job = HttpRequest("POST", base + "/v1/prefetch/jobs", AgentAuth(),
                         R"({"images":["docker.io/demo/app:1"]})");
  REQUIRE(job.has_value());
  CHECK(job.value().status == 403);
  auto publish = HttpRequest("POST", base + "/v1/blobs/" + layer + "/chunks/0/bad", OperatorAuth(),
                             R"({"agent":"op"})");
  REQUIRE(publish.has_value());
  CHECK(publish.value().status == 403);
  CHECK(t.Metric("shoal_tracker_refused_requests_total", {{"reason", "forbidden"}}) == 2);

  // The cluster's own agents work as before: a second one pulls from the first through the swarm.
  Agent& a2 = w.AddAgent("a2", t.Url(), {}, ns.host());
  w.proxy->Reset();
  LayoutImage second = w.Pull(a2, "app", "p2");
  CHECK(second.layer_digests == img.layer_digests);
  CHECK_MESSAGE(w.proxy->BlobBytes() == 0, a2.LogTail());  // every blob byte came from a1
  CHECK(t.Metric("shoal_tracker_refused_requests_total") == attempts.size() + 2);
}

TEST_CASE("access: a tag can be rebound by nobody but the holder of its fetch lease") {
  World w;
  BuiltImage app = w.Push("app", 2ull << 20, 81);
  BuiltImage evil = w.Push("evil", 2ull << 20, 82);
  auto tracker = TrackerProcess::Start(
      {"--chunk-size-kib", "1024", "--piece-size-kib", "256", "--manifest-ttl-s", "120"});
  REQUIRE_MESSAGE(tracker.has_value(), Why(tracker));
  TrackerProcess& t = *tracker.value();
  Agent& a1 = w.AddAgent("a1", t.Url());
  w.Pull(a1, "app", "p1");
  // A node of the cluster (it holds the agent token) tries to point demo/app:1 at its own image:
  // without the lease id, with a guessed one, and as the agent that published the tag.
  json evil_pub = {{"agent", "intruder"},           {"registry", "docker.io"},
                   {"repository", "demo/app"},      {"reference", "1"},
                   {"media_type", evil.media_type}, {"manifest", Base64Encode(evil.manifest_json)}};
  auto headers = AgentAuth();
  headers.emplace_back("Content-Type", "application/json");
  for (const std::string agent : {"intruder", "a1"}) {
    for (const std::string lease : {"", "0123456789abcdef0123456789abcdef"}) {
      json body = evil_pub;
      body["agent"] = agent;
      if (!lease.empty()) body["lease_id"] = lease;
      auto r = HttpRequest("PUT", t.Url() + "/v1/manifests/" + evil.manifest_digest.str(), headers,
                           body.dump());
      REQUIRE(r.has_value());
      CHECK(r.value().status == 403);
      CHECK(r.value().body.find("fetch lease") != std::string::npos);
    }
  }
  CHECK(t.Metric("shoal_tracker_manifest_publishes_refused_total") == 4);
  // Every other node still gets the real image for the tag.
  Agent& a2 = w.AddAgent("a2", t.Url());
  LayoutImage got = w.Pull(a2, "app", "p2");
  CHECK(got.layer_digests == app.layer_digests);
  CHECK(got.layer_digests != evil.layer_digests);
}

TEST_CASE("access: tokens rotate without a restart, the old token stops working") {
  World w;
  w.Push("one", 4ull << 20, 91);
  BuiltImage two = w.Push("two", 4ull << 20, 92);
  const std::string old_token = NewToken(), new_token = NewToken();
  const std::string tracker_file = w.dir.Sub("agent-tokens");
  const std::string agent_file = w.dir.Sub("agent-token");
  // Written as a Secret volume changes its files: a new file renamed over the old one.
  auto put = [](const std::string& path, const std::string& text) {
    WriteFile(path + ".new", text);
    std::filesystem::rename(path + ".new", path);
  };
  put(tracker_file, old_token + "\n");
  put(agent_file, old_token + "\n");
  auto tracker = TrackerProcess::Start({"--chunk-size-kib", "1024", "--piece-size-kib", "256",
                                        "--agent-tokens-file", tracker_file,
                                        "--operator-tokens-file", Tokens().operator_file});
  REQUIRE_MESSAGE(tracker.has_value(), Why(tracker));
  TrackerProcess& t = *tracker.value();
  Agent& a1 = w.AddAgent("a1", t.Url(), {"--tracker-token-file", agent_file});
  w.Pull(a1, "one", "p1");
  CHECK(t.Metric("shoal_tracker_refused_requests_total") == 0);

  // 1. The trackers accept both; 2. the agents move to the new one; 3. the old one is dropped.
  put(tracker_file, old_token + "\n" + new_token + "\n");
  std::this_thread::sleep_for(seconds(3));  // the tracker re-reads every 2 s
  put(agent_file, new_token + "\n");
  bool moved = WaitUntil([&] { return a1.Log().find("agent token rotated") != std::string::npos; },
                         seconds(15), milliseconds(200));
  REQUIRE_MESSAGE(moved, a1.LogTail());
  put(tracker_file, new_token + "\n");
  std::this_thread::sleep_for(seconds(3));

  auto stale = HttpGet(t.Url() + "/v1/blobs/" + two.layer_digests.front().str(),
                       {{"Authorization", "Bearer " + old_token}});
  REQUIRE(stale.has_value());
  CHECK(stale.value().status == 401);
  auto stale_announce =
      HttpGet(t.Url() + "/announce?info_hash=x&auth=" + auth::AnnounceKey(old_token));
  REQUIRE(stale_announce.has_value());
  CHECK(stale_announce.value().status == 401);
  const double refused_before = t.Metric("shoal_tracker_refused_requests_total");
  CHECK(refused_before == 2);

  // The same agent process keeps working with the new token: a new image through the tracker,
  // and a new agent (new token only) finds the first as a peer (its announces use the new key).
  LayoutImage got = w.Pull(a1, "two", "p2");
  CHECK(got.layer_digests == two.layer_digests);
  Agent& a2 = w.AddAgent("a2", t.Url(), {"--tracker-token-file", agent_file});
  w.proxy->Reset();
  w.Pull(a2, "two", "p3");
  CHECK_MESSAGE(w.proxy->BlobBytes() == 0,
                (a2.LogTail() + "\n---- a1\n" + a1.LogTail() + "\n---- tracker\n" + t.LogTail()));
  CHECK(t.Metric("shoal_tracker_refused_requests_total") == refused_before);
}

}  // namespace shoal::testkit
