// The tracker's cluster-wide manifest cache end to end: a real shoal-tracker, five real
// shoal-agents and a real docker-registry behind a counting proxy. N agents resolving one tag at
// once cost about one upstream manifest request; after the TTL, one more; with the tracker dead
// they still resolve, straight from upstream; a tracker serving bytes that do not hash to the
// digest poisons nobody.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "lib/core/base64.h"
#include "tests/support/agent.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/sync_server.h"
#include "tests/support/tokens.h"
#include "tests/support/tracker.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kTtlS = 3;
const char kAccept[] =
    "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, "
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json";

struct ManifestWorld {
  TempDir dir{"shoal-manifest-cache"};
  std::unique_ptr<Registry> registry;
  std::unique_ptr<CountingProxy> proxy;
  std::unique_ptr<TrackerProcess> tracker;
  std::vector<std::unique_ptr<Agent>> agents;
  BuiltImage image;

  ManifestWorld() {
    auto reg = Registry::Start();
    REQUIRE_MESSAGE(reg.has_value(), Why(reg));
    registry = std::move(reg.value());
    ImageSpec spec;
    spec.layers.push_back(LayerSpec{Compression::kGzip, 5, {}, 31});
    auto built = BuildImage(spec, dir.Sub("layout"), "1");
    REQUIRE_MESSAGE(built.has_value(), Why(built));
    image = built.value();
    auto pushed = PushImage(*registry, image.layout_dir, "1", "demo/app");
    REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
    auto p = CountingProxy::Start(registry->HostPort());
    REQUIRE(p.has_value());
    proxy = std::move(p.value());
  }

  void StartTracker() {
    auto t = TrackerProcess::Start(
        {"--manifest-ttl-s", std::to_string(kTtlS), "--manifest-lease-ttl-s", "5"});
    REQUIRE_MESSAGE(t.has_value(), Why(t));
    tracker = std::move(t.value());
  }

  Agent& AddAgent(const std::string& tracker_url, std::vector<std::string> extra = {}) {
    AgentOptions opts;
    opts.cache_dir = dir.Sub("cache" + std::to_string(agents.size()));
    opts.upstreams = {"docker.io=" + proxy->Url()};
    // --tag-ttl 0: every resolution asks the cluster cache, so the tracker's TTL is what counts.
    opts.extra_args = {"--tracker",   tracker_url,  "--swarm-listen",
                       "127.0.0.1:0", "--agent-id", "agent" + std::to_string(agents.size()),
                       "--tag-ttl",   "0"};
    opts.extra_args.insert(opts.extra_args.end(), extra.begin(), extra.end());
    auto a = Agent::Start(opts);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    agents.push_back(std::move(a.value()));
    return *agents.back();
  }

  // Upstream GETs/HEADs of the tag's manifest so far.
  uint64_t UpstreamTagRequests() const {
    auto log = proxy->RequestLog();
    return static_cast<uint64_t>(std::count_if(log.begin(), log.end(), [](const std::string& l) {
      return l.find("/v2/demo/app/manifests/1 ") != std::string::npos;
    }));
  }

  // Every agent resolves demo/app:1 at the same moment; each must answer the pushed manifest.
  void ResolveAll() {
    std::vector<Result<HttpResponse>> results(agents.size(),
                                              MakeError(ErrorCode::kInternal, "not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < agents.size(); ++i) {
      threads.emplace_back([&, i] {
        results[i] = HttpGet(agents[i]->Url() + "/v2/demo/app/manifests/1", {{"Accept", kAccept}});
      });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < agents.size(); ++i) {
      REQUIRE_MESSAGE(results[i].has_value(),
                      (Why(results[i]) + "\n" + agents[i]->LogTail()));
      const HttpResponse& r = results[i].value();
      REQUIRE_MESSAGE(r.status == 200, (r.body + "\n" + agents[i]->LogTail()));
      CHECK(r.Header("docker-content-digest") == image.manifest_digest.str());
      CHECK(r.body == image.manifest_json);
    }
  }

  double Sum(const std::string& metric, const std::map<std::string, std::string>& labels = {}) {
    double total = 0;
    for (auto& a : agents) total += a->Metric(metric, labels);
    return total;
  }
};

}  // namespace

TEST_CASE("manifest cache: 5 agents resolving one tag cost one upstream request per TTL") {
  ManifestWorld w;
  w.StartTracker();
  for (int i = 0; i < 5; ++i) w.AddAgent(w.tracker->Url());
  w.proxy->Reset();

  auto first = std::chrono::steady_clock::now();
  w.ResolveAll();
  uint64_t cold = w.UpstreamTagRequests();
  MESSAGE("upstream manifest requests for 5 agents at once: " << cold);
  CHECK(cold >= 1);
  CHECK(cold <= 2);
  CHECK(w.Sum("shoal_manifest_requests_total", {{"source", "tracker"}}) >= 3);
  CHECK(w.Sum("shoal_manifest_tracker_leases_total") == static_cast<double>(cold));
  CHECK(w.Sum("shoal_manifest_tracker_fallbacks_total") == 0);
  CHECK(w.tracker->Metric("shoal_tracker_manifests_published_total") >= 1);

  // Within the TTL: nobody goes upstream.
  w.ResolveAll();
  if (std::chrono::steady_clock::now() - first < seconds(kTtlS)) {
    CHECK(w.UpstreamTagRequests() == cold);
  }

  // After the TTL: one more upstream request for all five. The wait is the TTL itself.
  auto expired = first + seconds(kTtlS) + milliseconds(200);
  while (std::chrono::steady_clock::now() < expired) std::this_thread::sleep_for(milliseconds(50));
  w.ResolveAll();
  uint64_t warm = w.UpstreamTagRequests() - cold;
  MESSAGE("upstream manifest requests after the TTL: " << warm);
  CHECK(warm >= 1);
  CHECK(warm <= 2);

  // Tracker dead: every agent still resolves, straight from upstream, and says so.
  w.tracker->Kill();
  uint64_t before = w.UpstreamTagRequests();
  w.ResolveAll();
  CHECK(w.UpstreamTagRequests() - before >= 1);
  CHECK(w.Sum("shoal_manifest_tracker_fallbacks_total", {{"reason", "error"}}) >= 5);
}

TEST_CASE("manifest cache: 5 agents asking for a tag that does not exist cost one upstream 404") {
  ManifestWorld w;
  w.StartTracker();
  for (int i = 0; i < 5; ++i) w.AddAgent(w.tracker->Url());
  w.proxy->Reset();
  auto missing_requests = [&] {
    auto log = w.proxy->RequestLog();
    return std::count_if(log.begin(), log.end(), [](const std::string& l) {
      return l.find("/v2/demo/app/manifests/nosuchtag ") != std::string::npos;
    });
  };
  std::vector<Result<HttpResponse>> results(w.agents.size(),
                                            MakeError(ErrorCode::kInternal, "not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < w.agents.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] =
          HttpGet(w.agents[i]->Url() + "/v2/demo/app/manifests/nosuchtag", {{"Accept", kAccept}});
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < w.agents.size(); ++i) {
    REQUIRE_MESSAGE(results[i].has_value(),
                    (Why(results[i]) + "\n" + w.agents[i]->LogTail()));
    CHECK_MESSAGE(results[i].value().status == 404, results[i].value().body);
    CHECK(results[i].value().body.find("MANIFEST_UNKNOWN") != std::string::npos);
    // The tracker passes the fetching agent's upstream message on: its URL stays out.
    CHECK(results[i].value().body.find(w.proxy->HostPort()) == std::string::npos);
  }
  // One agent asked upstream; the tracker told the others (and a second round) "missing".
  MESSAGE("upstream requests for the missing tag from 5 agents: " << missing_requests());
  CHECK(missing_requests() == 1);
  auto again =
      HttpGet(w.agents[0]->Url() + "/v2/demo/app/manifests/nosuchtag", {{"Accept", kAccept}});
  REQUIRE(again.has_value());
  CHECK(again.value().status == 404);
  CHECK(missing_requests() == 1);
  CHECK(w.tracker->Metric("shoal_tracker_manifest_missing_reports_total") == 1);
  CHECK(w.tracker->Metric("shoal_tracker_manifest_missing_hits_total") >= 4);
}

TEST_CASE("manifest cache: a fetch lease that never publishes costs at most --manifest-wait-ms") {
  ManifestWorld w;
  auto t = TrackerProcess::Start({"--manifest-lease-ttl-s", "60"});
  REQUIRE_MESSAGE(t.has_value(), Why(t));
  w.tracker = std::move(t.value());
  // Another "agent" takes the tag's fetch lease and never publishes (hung, or partitioned away).
  auto headers = AgentAuth();
  headers.emplace_back("Content-Type", "application/json");
  auto taken = HttpRequest("POST", w.tracker->Url() + "/v1/manifests/resolve", headers,
                           R"({"agent":"stuck","registry":"docker.io","repository":"demo/app",)"
                           R"("reference":"1"})");
  REQUIRE(taken.has_value());
  REQUIRE_MESSAGE(taken.value().body.find("\"fetch\"") != std::string::npos, taken.value().body);
  Agent& agent = w.AddAgent(w.tracker->Url(), {"--manifest-wait-ms", "1000"});
  const auto start = std::chrono::steady_clock::now();
  auto r = HttpGet(agent.Url() + "/v2/demo/app/manifests/1", {{"Accept", kAccept}});
  const auto waited = std::chrono::steady_clock::now() - start;
  REQUIRE(r.has_value());
  REQUIRE_MESSAGE(r.value().status == 200, (r.value().body + "\n" + agent.LogTail()));
  CHECK(r.value().Header("docker-content-digest") == w.image.manifest_digest.str());
  // It waited for the lease holder, gave up after --manifest-wait-ms and went upstream itself
  // (well before the 60 s lease would have passed on).
  CHECK(agent.Metric("shoal_manifest_tracker_fallbacks_total", {{"reason", "timeout"}}) == 1);
  CHECK(w.UpstreamTagRequests() == 1);
  CHECK(waited >= milliseconds(900));
  CHECK(waited < seconds(20));
}

TEST_CASE("manifest cache: manifest bytes from a lying tracker are not served") {
  ManifestWorld w;
  // A fake tracker that answers every resolution with the right digest but other bytes.
  std::string tampered = w.image.manifest_json;
  tampered.insert(tampered.size() - 1, " ");
  std::string digest = w.image.manifest_digest.str();
  std::string media_type = w.image.media_type;
  auto fake = SyncHttpServer::Start([&](const SyncHttpServer::Request& req) {
    namespace http = boost::beast::http;
    SyncHttpServer::Response res{http::status::not_found, req.version()};
    res.set(http::field::content_type, "application/json");
    res.body() = R"({"error":"no","tracker_id":"fake"})";
    if (req.target().starts_with("/v1/manifests/resolve")) {
      res.result(http::status::ok);
      res.body() = nlohmann::json{
          {"state", "found"},
          {"digest", digest},
          {"media_type", media_type},
          {"manifest", Base64Encode(tampered)},
          {"age_ms", 0},
          {"tracker_id",
           "fake"}}.dump();
    }
    return res;
  });
  REQUIRE(fake.has_value());
  Agent& agent = w.AddAgent("http://" + fake.value()->HostPort());
  w.ResolveAll();
  CHECK(agent.Metric("shoal_manifest_tracker_fallbacks_total", {{"reason", "unverified"}}) >= 1);
  CHECK(agent.Metric("shoal_manifest_requests_total", {{"source", "tracker"}}) == 0);
  CHECK(w.UpstreamTagRequests() >= 1);
  fake.value()->Stop();
}

}  // namespace shoal::testkit
