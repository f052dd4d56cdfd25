// shoal-tracker's blob API over real HTTP: chunk tables, upstream leases, publication, and
// lease long-polls that wake on publish, release and expiry (not when wait_ms runs out).

#include <doctest/doctest.h>

#include <utility>

#include <chrono>
#include <filesystem>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/core/base64.h"
#include "lib/core/content_hash.h"
#include "lib/swarm/chunk_torrent.h"
#include "tests/support/chromium.h"
#include "tests/support/http_client.h"
#include "tests/support/process.h"
#include "tests/support/tokens.h"
#include "tests/support/tracker.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kChunk = 64 << 10;
constexpr uint32_t kPiece = 16 << 10;
constexpr uint64_t kSize = 2 * kChunk + 1000;  // three chunks
const std::string kDigest = "sha256:" + std::string(64, 'e');

// A running shoal-tracker on 127.0.0.1 with 64 KiB chunks and 16 KiB pieces.
struct Tracker {
  std::unique_ptr<TrackerProcess> process;
  std::string base;  // http://127.0.0.1:<port>

  std::string Blob(const std::string& digest = kDigest) const {
    return base + "/v1/blobs/" + digest;
  }
  std::string Chunk(uint32_t k, const std::string& action = "") const {
    return Blob() + "/chunks/" + std::to_string(k) + (action.empty() ? "" : "/" + action);
  }
};

Tracker StartTracker(const TempDir& /*dir*/, std::vector<std::string> extra = {}) {
  // The shared fixture (tests/support/tracker.h): port file, log, /healthz wait.
  std::vector<std::string> args = {"--chunk-size-kib", "64", "--piece-size-kib", "16"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto started = TrackerProcess::Start(std::move(args));
  REQUIRE_MESSAGE(started.has_value(), Why(started));
  Tracker t{std::move(started.value()), ""};
  t.base = t.process->Url();
  return t;
}

struct Reply {
  int status = 0;
  json body;
};

// Sends a JSON request and parses the JSON answer (every blob API answer is a JSON object).
Reply Send(const std::string& method, const std::string& url, const std::string& body = "",
           milliseconds timeout = milliseconds(4000)) {
  std::vector<std::pair<std::string, std::string>> headers = AgentAuth();
  if (!body.empty()) headers.emplace_back("Content-Type", "application/json");
  auto res = HttpRequest(method, url, headers, body, timeout);
  REQUIRE_MESSAGE(res.has_value(), method << " " << url << ": " << Why(res));
  INFO(method << " " << url << " -> " << res.value().status << " " << res.value().body);
  CHECK(res.value().Header("content-type") == "application/json");
  json j = json::parse(res.value().body, nullptr, false);
  REQUIRE(j.is_object());
  return Reply{res.value().status, std::move(j)};
}

std::string Source(const std::string& agent, uint64_t size = kSize) {
  return json{{"agent", agent}, {"size", size}, {"registry", "r.test"}, {"repository", "demo/app"}}
      .dump();
}

// Metainfo of a chunk of `length` bytes filled with `fill`: an SSL torrent of the test cluster's
// peer CA, as the test kit's tracker requires.
std::string Metainfo(uint64_t length, char fill = 'x') {
  std::string data(length, fill);
  swarm::PieceHasher hasher(length, kPiece);
  REQUIRE(hasher.Update(data.data(), data.size()).has_value());
  auto torrent = swarm::BuildChunkTorrent("chunk", length, kPiece, hasher.Finish().value(),
                                          Tokens().peer_ca_pem);
  REQUIRE(torrent.has_value());
  return torrent.value().metainfo;
}

std::string PublishBody(const std::string& agent, const std::string& lease_id,
                        const std::string& metainfo) {
  json j = json::parse(Source(agent));
  if (!lease_id.empty()) j["lease_id"] = lease_id;
  j["metainfo"] = Base64Encode(metainfo);
  return j.dump();
}

// A lease request long-polling on its own thread.
class LongPoll {
 public:
  LongPoll(const std::string& url, std::string body) {
    thread_ = std::thread([this, url, body = std::move(body)] {
      auto headers = AgentAuth();
      headers.emplace_back("Content-Type", "application/json");
      auto res = HttpRequest("POST", url, headers, body, milliseconds(15000));
      done_at_ = Clock::now();
      if (res.has_value()) {
        status_ = res.value().status;
        body_ = res.value().body;
      }
    });
  }
  ~LongPoll() {
    if (thread_.joinable()) thread_.join();
  }
  // Waits for the answer; returns its status and body.
  Reply Join() {
    thread_.join();
    json j = json::parse(body_, nullptr, false);
    return Reply{status_, j.is_discarded() ? json::object() : j};
  }
  Clock::time_point done_at() const { return done_at_; }

 private:
  std::thread thread_;
  int status_ = 0;
  std::string body_;
  Clock::time_point done_at_;
};

// Waits until the status page shows `n` parked long-polls.
bool WaitForPolls(const Tracker& t, int n) {
  std::string want = std::to_string(n) + " lease requests long-polling";
  return WaitUntil(
      [&] {
        auto page = HttpGet(t.base + "/", OperatorAuth(), seconds(2));
        return page.has_value() && page.value().body.find(want) != std::string::npos;
      },
      seconds(3), milliseconds(10));
}

// The answer to a long-poll (POST url with body) that is parked while "holder" holds the lease
// on chunk 1, and how long after chunk 1's publication it came.
struct WokenPoll {
  Reply answer;
  milliseconds after_publish{0};
  milliseconds total{0};  // since the poll was sent
};
WokenPoll PollWokenByPublish(const Tracker& t, const std::string& url, const std::string& body) {
  Reply granted = Send("POST", t.Chunk(1, "lease"), Source("holder"));
  REQUIRE(granted.body["state"] == "granted");
  Clock::time_point asked = Clock::now();
  LongPoll poll(url, body);
  REQUIRE_MESSAGE(WaitForPolls(t, 1), "the poll was not parked");
  // Other connections are served while it waits.
  auto health = HttpGet(t.base + "/healthz", {}, seconds(1));
  REQUIRE(health.has_value());
  CHECK(health.value().status == 200);
  Clock::time_point published_at = Clock::now();
  Reply published =
      Send("PUT", t.Chunk(1), PublishBody("holder", granted.body["lease_id"], Metainfo(kChunk)));
  REQUIRE(published.status == 200);
  WokenPoll out{poll.Join()};
  out.after_publish = std::chrono::duration_cast<milliseconds>(poll.done_at() - published_at);
  out.total = std::chrono::duration_cast<milliseconds>(poll.done_at() - asked);
  return out;
}

}  // namespace

TEST_CASE("tracker lease: tables, grants, waits and publication over HTTP, with a tracker id") {
  TempDir dir("shoal-tracker-lease");
  Tracker t = StartTracker(dir, {"--max-upstream-fetchers", "2"});

  Reply created = Send("POST", t.Blob(), Source("a1"));
  REQUIRE(created.status == 200);
  std::string id = created.body.value("tracker_id", "");
  CHECK(id.size() == 16);
  CHECK(created.body["digest"] == kDigest);
  CHECK(created.body["size"] == kSize);
  CHECK(created.body["chunk_size"] == kChunk);
  CHECK(created.body["piece_size"] == kPiece);
  REQUIRE(created.body["chunks"].size() == 3);
  CHECK(created.body["chunks"][2]["state"] == "none");

  Reply granted = Send("POST", t.Chunk(2, "lease"), Source("a1"));
  REQUIRE(granted.status == 200);
  REQUIRE(granted.body["state"] == "granted");
  CHECK(granted.body["begin"] == 2 * kChunk);
  CHECK(granted.body["length"] == 1000);
  CHECK(granted.body["tracker_id"] == id);
  std::string lease_id = granted.body["lease_id"];
  // Asking again is idempotent.
  CHECK(Send("POST", t.Chunk(2, "lease"), Source("a1")).body["lease_id"] == lease_id);

  Reply leased = Send("POST", t.Chunk(2, "lease"), Source("a2"));
  CHECK(leased.body["state"] == "wait");
  CHECK(leased.body["reason"] == "leased");
  CHECK(Send("POST", t.Chunk(0, "lease"), Source("a2")).body["state"] == "granted");
  Reply capped = Send("POST", t.Chunk(1, "lease"), Source("a3"));
  CHECK(capped.body["state"] == "wait");
  CHECK(capped.body["reason"] == "cluster_cap");

  Reply renewed = Send("POST", t.Chunk(2, "renew"),
                       json{{"agent", "a1"}, {"lease_id", lease_id}, {"bytes", 500}}.dump());
  CHECK(renewed.status == 200);
  CHECK(renewed.body["ttl_ms"] == 15000);
  Reply wrong = Send("POST", t.Chunk(2, "renew"),
                     json{{"agent", "a1"}, {"lease_id", "nope"}, {"bytes", 1}}.dump());
  CHECK(wrong.status == 409);
  CHECK(wrong.body["tracker_id"] == id);

  std::string metainfo = Metainfo(1000);
  Reply published = Send("PUT", t.Chunk(2), PublishBody("a1", lease_id, metainfo));
  CHECK(published.status == 200);
  CHECK(published.body["state"] == "ready");
  Reply kept = Send("PUT", t.Chunk(2), PublishBody("a2", "", Metainfo(1000, 'y')));
  CHECK(kept.status == 200);
  CHECK(kept.body["kept"] == "existing");

  Reply table = Send("GET", t.Blob());
  REQUIRE(table.status == 200);
  CHECK(table.body["chunks"][0]["state"] == "leased");
  CHECK(table.body["chunks"][2]["state"] == "ready");
  CHECK(Base64Decode(table.body["chunks"][2]["metainfo"].get<std::string>()) == metainfo);
  Reply ready = Send("POST", t.Chunk(2, "lease"), Source("a3"));
  CHECK(ready.body["state"] == "ready");
  CHECK(ready.body["size"] == kSize);

  auto metrics = HttpGet(t.base + "/metrics");
  REQUIRE(metrics.has_value());
  CHECK(MetricSum(metrics.value().body, "shoal_tracker_leases_granted_total") == 2);
  CHECK(MetricSum(metrics.value().body, "shoal_tracker_chunks_published_total") == 1);
  CHECK(MetricSum(metrics.value().body, "shoal_tracker_leases_active") == 1);
  CHECK(MetricSum(metrics.value().body, "shoal_tracker_blobs") == 1);
  CHECK(MetricSum(metrics.value().body, "shoal_tracker_blob_api_requests_total",
                  {{"route", "lease"}, {"code", "200"}}) >= 5);
  auto page = HttpGet(t.base + "/", OperatorAuth());
  REQUIRE(page.has_value());
  CHECK(page.value().body.find("upstream leases 1 active") != std::string::npos);

  CHECK(t.process->Stop() == 0);
}

TEST_CASE("tracker lease: malformed requests get 400 JSON errors, unknown blobs 404") {
  TempDir dir("shoal-tracker-lease-bad");
  Tracker t = StartTracker(dir);
  struct Case {
    std::string method, url, body;
  };
  json bad_metainfo = json::parse(PublishBody("a1", "", Metainfo(kChunk)));
  bad_metainfo["metainfo"] = Base64Encode("not a torrent");
  std::vector<Case> cases = {
      {"POST", t.base + "/v1/blobs/sha256:1234", Source("a1")},
      {"POST", t.base + "/v1/blobs/" + kDigest + "/chunks/x/lease", Source("a1")},
      {"POST", t.Chunk(3, "lease"), Source("a1")},
      {"POST", t.Chunk(0, "lease"), "{not json"},
      {"POST", t.Chunk(0, "lease"), json{{"agent", "a1"}}.dump()},
      {"POST", t.Chunk(0, "lease") + "?wait_ms=-5", Source("a1")},
      {"PUT", t.Chunk(2), PublishBody("a1", "", Metainfo(kChunk))},  // chunk 2 is 1000 bytes
      {"PUT", t.Chunk(0), bad_metainfo.dump()},
  };
  std::string id;
  for (const Case& c : cases) {
    Reply r = Send(c.method, c.url, c.body);
    CHECK_MESSAGE(r.status == 400, c.method << " " << c.url << " " << c.body);
    CHECK(!r.body.value("error", "").empty());
    if (id.empty()) id = r.body.value("tracker_id", "");
    CHECK(r.body.value("tracker_id", "") == id);
  }
  CHECK(id.size() == 16);
  Reply unknown = Send("GET", t.Blob("sha256:" + std::string(64, '0')));
  CHECK(unknown.status == 404);
  CHECK(unknown.body["tracker_id"] == id);
  CHECK(Send("DELETE", t.Chunk(0, "lease") + "?agent=a1&lease_id=none").status == 409);
  // A body over the 8 MiB limit is refused without killing the server.
  auto huge = HttpRequest("PUT", t.Chunk(0), {{"Content-Type", "application/json"}},
                          std::string((8u << 20) + 10, ' '), seconds(10));
  if (huge.has_value()) CHECK(huge.value().status == 413);
  CHECK(WaitForHttp(t.base + "/healthz", seconds(2)));
  CHECK(t.process->Stop() == 0);
}

TEST_CASE("tracker lease: a long-poll on a leased chunk answers right after the publish") {
  TempDir dir("shoal-tracker-lease-poll");
  Tracker t = StartTracker(dir);
  WokenPoll poll = PollWokenByPublish(t, t.Chunk(1, "lease") + "?wait_ms=8000", Source("waiter"));
  CHECK(poll.answer.status == 200);
  CHECK(poll.answer.body["state"] == "ready");
  CHECK(Base64Decode(poll.answer.body.value("metainfo", "")) == Metainfo(kChunk));
  MESSAGE("long-poll answered " << poll.after_publish.count() << " ms after the publish, "
                                << poll.total.count() << " ms after it was sent");
  CHECK(poll.after_publish < milliseconds(1000));
  CHECK(poll.total < milliseconds(8000));
  auto metrics = HttpGet(t.base + "/metrics");
  REQUIRE(metrics.has_value());
  CHECK(MetricSum(metrics.value().body, "shoal_tracker_lease_waits_total") == 1);
  CHECK(t.process->Stop() == 0);
}

TEST_CASE("tracker lease: one ready poll for several chunks answers right after any is published") {
  TempDir dir("shoal-tracker-ready-poll");
  Tracker t = StartTracker(dir);
  json body = json::parse(Source("waiter"));
  body["chunks"] = json::array({0, 1});
  WokenPoll poll =
      PollWokenByPublish(t, t.base + "/v1/blobs/" + kDigest + "/ready?wait_ms=8000", body.dump());
  CHECK(poll.answer.status == 200);
  CHECK(poll.answer.body["state"] == "ready");
  REQUIRE(poll.answer.body["chunks"].size() == 1);
  CHECK(poll.answer.body["chunks"][0]["chunk"] == 1);
  CHECK(Base64Decode(poll.answer.body["chunks"][0].value("metainfo", "")) == Metainfo(kChunk));
  MESSAGE("ready poll answered " << poll.after_publish.count() << " ms after the publish");
  CHECK(poll.after_publish < milliseconds(1000));
  // Chunk 0 was only waited for, never leased to the waiter.
  Reply table = Send("GET", t.base + "/v1/blobs/" + kDigest, "");
  CHECK(table.body["chunks"][0]["state"] == "none");
  CHECK(t.process->Stop() == 0);
}

TEST_CASE("tracker lease: a long-poll held by the cluster cap gets the lease when one ends") {
  TempDir dir("shoal-tracker-lease-cap");
  Tracker t = StartTracker(dir, {"--max-upstream-fetchers", "1"});
  Reply granted = Send("POST", t.Chunk(0, "lease"), Source("a1"));
  REQUIRE(granted.body["state"] == "granted");

  LongPoll poll(t.Chunk(1, "lease") + "?wait_ms=8000", Source("a2"));
  REQUIRE(WaitForPolls(t, 1));
  Clock::time_point released_at = Clock::now();
  std::string lease_id = granted.body["lease_id"];
  Reply released = Send("DELETE", t.Chunk(0, "lease") + "?agent=a1&lease_id=" + lease_id);
  CHECK(released.status == 200);
  Reply answer = poll.Join();
  CHECK(answer.body["state"] == "granted");
  CHECK(answer.body["begin"] == kChunk);
  CHECK(poll.done_at() - released_at < milliseconds(1000));
  // The first holder now waits for the cap in turn.
  Reply capped = Send("POST", t.Chunk(0, "lease"), Source("a1"));
  CHECK(capped.body["state"] == "wait");
  CHECK(capped.body["reason"] == "cluster_cap");
  CHECK(t.process->Stop() == 0);
}

TEST_CASE("tracker lease: a long-poll gets the lease of a holder that stopped renewing") {
  TempDir dir("shoal-tracker-lease-expiry");
  Tracker t = StartTracker(dir, {"--lease-ttl-s", "1"});
  Clock::time_point granted_at = Clock::now();
  Reply granted = Send("POST", t.Chunk(0, "lease"), Source("a1"));
  REQUIRE(granted.body["state"] == "granted");
  CHECK(granted.body["ttl_ms"] == 1000);

  LongPoll poll(t.Chunk(0, "lease") + "?wait_ms=5000", Source("a2"));
  Reply answer = poll.Join();
  CHECK(answer.body["state"] == "granted");
  CHECK(answer.body["lease_id"] != granted.body["lease_id"]);
  auto waited = std::chrono::duration_cast<milliseconds>(poll.done_at() - granted_at);
  MESSAGE("the expired lease was handed over after " << waited.count() << " ms");
  CHECK(waited >= milliseconds(900));
  CHECK(waited < milliseconds(2500));
  Reply lost =
      Send("POST", t.Chunk(0, "renew"),
           json{{"agent", "a1"}, {"lease_id", granted.body["lease_id"]}, {"bytes", 1}}.dump());
  CHECK(lost.status == 409);
  auto metrics = HttpGet(t.base + "/metrics");
  REQUIRE(metrics.has_value());
  CHECK(MetricSum(metrics.value().body, "shoal_tracker_leases_expired_total") == 1);
  CHECK(t.process->Stop() == 0);
}

TEST_CASE("tracker lease: a long-poll with nothing happening answers wait after wait_ms") {
  TempDir dir("shoal-tracker-lease-timeout");
  Tracker t = StartTracker(dir);
  REQUIRE(Send("POST", t.Chunk(0, "lease"), Source("a1")).body["state"] == "granted");
  Clock::time_point asked = Clock::now();
  Reply answer = Send("POST", t.Chunk(0, "lease") + "?wait_ms=300", Source("a2"));
  auto took = Clock::now() - asked;
  CHECK(answer.body["state"] == "wait");
  CHECK(answer.body["reason"] == "leased");
  CHECK(took >= milliseconds(290));
  CHECK(took < milliseconds(2000));
  // SIGTERM while a long-poll waits: it is answered at once and the tracker exits cleanly.
  LongPoll poll(t.Chunk(0, "lease") + "?wait_ms=10000", Source("a2"));
  REQUIRE(WaitForPolls(t, 1));
  Clock::time_point stopping = Clock::now();
  CHECK(t.process->Stop() == 0);
  Reply last = poll.Join();
  CHECK(last.body["state"] == "wait");
  CHECK(poll.done_at() - stopping < milliseconds(2000));
}

TEST_CASE("tracker lease: replicas share the cluster cap, and a cap below the replica count is "
          "refused at start") {
  TempDir dir("shoal-tracker-lease-replicas");
  // 5 over 2 replicas: this replica grants 2, so both together never pass 5.
  Tracker t = StartTracker(dir, {"--max-upstream-fetchers", "5", "--replicas", "2"});
  CHECK(Send("POST", t.Chunk(2, "lease"), Source("a1")).body["state"] == "granted");
  CHECK(Send("POST", t.Chunk(1, "lease"), Source("a2")).body["state"] == "granted");
  Reply capped = Send("POST", t.Chunk(0, "lease"), Source("a3"));
  CHECK(capped.body["state"] == "wait");
  CHECK(capped.body["reason"] == "cluster_cap");
  CHECK(t.process->Stop() == 0);

  auto refused = RunCommand({SHOAL_TRACKER_BIN, "--listen", "127.0.0.1:0", "--insecure-open",
                             "--max-upstream-fetchers", "2", "--replicas", "3"},
                            std::chrono::seconds(20));
  REQUIRE_FALSE(refused.has_value());
  CHECK_MESSAGE(Why(refused).find(
                    "2 is less than --replicas 3: each replica needs at least one") !=
                    std::string::npos,
                Why(refused));
}

// Sends an operator's JSON request; returns status and body.
Reply OperatorSend(const std::string& method, const std::string& url, const std::string& body) {
  auto headers = OperatorAuth();
  if (!body.empty()) headers.emplace_back("Content-Type", "application/json");
  auto res = HttpRequest(method, url, headers, body, milliseconds(4000));
  REQUIRE_MESSAGE(res.has_value(), method << " " << url << ": " << Why(res));
  json j = json::parse(res.value().body, nullptr, false);
  return Reply{res.value().status, j.is_discarded() ? json::object() : j};
}

// An OCI manifest whose only layer is the test blob (kDigest, kSize), with a small config.
constexpr uint64_t kConfigSize = 321;
std::string ImageManifest() {
  return json{{"schemaVersion", 2},
              {"mediaType", "application/vnd.oci.image.manifest.v1+json"},
              {"config",
               {{"mediaType", "application/vnd.oci.image.config.v1+json"},
                {"digest", "sha256:" + std::string(64, 'c')},
                {"size", kConfigSize}}},
              {"layers",
               {{{"mediaType", "application/vnd.oci.image.layer.v1.tar+gzip"},
                 {"digest", kDigest},
                 {"size", kSize}}}}}
      .dump();
}

// Resolves r.test/demo/app:1 as an agent would, and publishes ImageManifest() under its fetch
// lease; returns the manifest's digest.
std::string PublishImage(const Tracker& t) {
  const json ref = {{"agent", "a1"}, {"registry", "r.test"}, {"repository", "demo/app"},
                    {"reference", "1"}};
  Reply resolved = Send("POST", t.base + "/v1/manifests/resolve?wait_ms=0", ref.dump());
  REQUIRE(resolved.body["state"] == "fetch");
  const std::string body = ImageManifest();
  const std::string digest = ContentHash::Of(DigestAlgorithm::kSha256, body).str();
  json put = ref;
  put["lease_id"] = resolved.body["lease_id"];
  put["media_type"] = "application/vnd.oci.image.manifest.v1+json";
  put["manifest"] = Base64Encode(body);
  Reply published = Send("PUT", t.base + "/v1/manifests/" + digest, put.dump());
  REQUIRE_MESSAGE(published.status == 200, published.body.dump());
  return digest;
}

json ClusterView(const Tracker& t) {
  Reply view = OperatorSend("GET", t.base + "/v1/cluster", "");
  REQUIRE(view.status == 200);
  return view.body;
}

// The page as headless chromium renders it (tests/support/chromium.h), and a screenshot of it
// into `png` (when not empty).
std::string RenderPage(const TempDir& dir, const std::string& url, int width, int height,
                       const std::string& png = "") {
  auto dom = testkit::RenderPage(dir.Sub("chromium-profile"), url, width, height, png);
  REQUIRE_MESSAGE(dom.has_value(), Why(dom));
  return dom.value();
}

// Where tests leave files for people to look at (CI keeps the build dir): <build>/artifacts.
std::string ArtifactDir() {
  std::filesystem::path bin(SHOAL_TRACKER_BIN);  // <build>/tracker/shoal-tracker
  std::filesystem::path dir = bin.parent_path().parent_path() / "artifacts";
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST_CASE("tracker cluster view: operators get leases, blobs, jobs and agents as JSON, others "
          "get 401/403") {
  TempDir dir("shoal-tracker-cluster");
  Tracker t = StartTracker(dir, {"--max-upstream-fetchers", "6", "--replicas", "2"});
  auto anon = HttpGet(t.base + "/v1/cluster", {}, seconds(2));
  REQUIRE(anon.has_value());
  CHECK(anon.value().status == 401);
  CHECK(anon.value().body.find("operator") != std::string::npos);
  auto agent = HttpGet(t.base + "/v1/cluster", AgentAuth(), seconds(2));
  REQUIRE(agent.has_value());
  CHECK(agent.value().status == 403);

  Reply polled = Send("POST", t.base + "/v1/prefetch/poll?wait_ms=0",
                      json{{"agent", "n1-a"}, {"node", "n1"}}.dump());
  REQUIRE(polled.status == 200);
  Reply job = OperatorSend("POST", t.base + "/v1/prefetch/jobs",
                           json{{"images", {"r.test/demo/app:1"}}, {"nodes", {"n1"}}}.dump());
  REQUIRE_MESSAGE(job.status == 201, job.body.dump());
  const std::string manifest = PublishImage(t);
  Reply granted = Send("POST", t.Chunk(2, "lease"), Source("a1"));
  REQUIRE(granted.body["state"] == "granted");
  REQUIRE(Send("POST", t.Chunk(2, "renew"),
               json{{"agent", "a1"}, {"lease_id", granted.body["lease_id"]}, {"bytes", 500}}.dump())
              .status == 200);

  json v = ClusterView(t);
  INFO(v.dump());
  CHECK(v["tracker_id"] == granted.body["tracker_id"]);
  CHECK(v["replicas"] == 2);
  CHECK(v["upstream"]["cap_cluster"] == 6);
  CHECK(v["upstream"]["cap_this_replica"] == 3);
  CHECK(v["upstream"]["leases_active"] == 1);
  REQUIRE(v["upstream"]["leases"].size() == 1);
  CHECK(v["upstream"]["leases"][0]["agent"] == "a1");
  CHECK(v["upstream"]["leases"][0]["bytes"] == 500);
  CHECK(v["upstream"]["leases"][0]["length"] == 1000);
  CHECK(v["blobs"]["count"] == 1);
  REQUIRE(v["blobs"]["recent"].size() == 1);
  const json& b = v["blobs"]["recent"][0];
  CHECK(b["digest"] == kDigest);
  CHECK(b["repository"] == "demo/app");
  CHECK(b["size"] == kSize);
  CHECK(b["chunks"] == 3);
  CHECK(b["chunks_ready"] == 0);
  CHECK(b["ready_after_ms"].is_null());
  REQUIRE(v["prefetch_jobs"].size() == 1);
  CHECK(v["prefetch_jobs"][0]["id"] == job.body["id"]);
  CHECK(v["prefetch_jobs"][0]["slowest_nodes"][0]["node"] == "n1");
  CHECK(v["agents"]["live"] == 1);
  CHECK(v["agents"]["stale"] == 0);
  // The image: its manifest from the manifest cache, its layer's table, the job naming it.
  REQUIRE(v["images"].size() == 1);
  const json& img = v["images"][0];
  CHECK(img["manifest"] == manifest);
  CHECK(img["references"][0] == "r.test/demo/app:1");
  CHECK(img["size"] == kSize + kConfigSize);
  CHECK(img["blobs_total"] == 2);
  CHECK(img["blobs_known"] == 1);  // the config has no table here
  CHECK(img["nodes_done"] == 0);
  CHECK(img["prefetch_job"] == job.body["id"]);
  CHECK(img["slowest_nodes"][0]["node"] == "n1");
  CHECK(img["blobs"][1]["digest"] == kDigest);
  CHECK(img["blobs"][1]["chunks"] == 3);
  // /metrics answers anyone: the job's progress is there by job id, and no image name is.
  auto metrics = HttpGet(t.base + "/metrics", {}, seconds(2));
  REQUIRE(metrics.has_value());
  const std::string id = job.body["id"];
  CHECK(metrics.value().body.find("shoal_tracker_prefetch_job_nodes{prefetch_job=\"" + id +
                                  "\",state=\"pending\"} 1") != std::string::npos);
  CHECK(metrics.value().body.find("demo/app") == std::string::npos);

  // Publishing under the lease: the chunk crossed the NAT once, and the lease ended.
  REQUIRE(Send("PUT", t.Chunk(2), PublishBody("a1", granted.body["lease_id"], Metainfo(1000)))
              .status == 200);
  v = ClusterView(t);
  CHECK(v["upstream"]["leases_active"] == 0);
  CHECK(v["upstream"]["bytes_total"] == 1000);
  CHECK(v["blobs"]["recent"][0]["chunks_ready"] == 1);
  CHECK(v["blobs"]["recent"][0]["upstream_bytes"] == 1000);
  CHECK(v["images"][0]["upstream_bytes"] == 1000);
  CHECK(v["images"][0]["blobs"][1]["chunks_ready"] == 1);
  CHECK(HttpGet(t.base + "/metrics", {}, seconds(2)).value().body.find("demo/app") ==
        std::string::npos);
  // Re-publishing without a lease (after a tracker restart) is not upstream traffic.
  REQUIRE(Send("PUT", t.Chunk(0), PublishBody("a2", "", Metainfo(kChunk))).status == 200);
  CHECK(ClusterView(t)["upstream"]["bytes_total"] == 1000);
  CHECK(t.process->Stop() == 0);
}

TEST_CASE("tracker cluster page: chromium shows the JSON's numbers, follows the pull, and fits a "
          "phone") {
  TempDir dir("shoal-tracker-page");
  Tracker t = StartTracker(dir);
  auto page = HttpGet(t.base + "/ui", {}, seconds(2));
  REQUIRE(page.has_value());
  CHECK(page.value().status == 200);
  CHECK(page.value().Header("content-type") == "text/html; charset=utf-8");
  // Nothing on the page may come from elsewhere: the policy allows only this tracker.
  CHECK(page.value().Header("content-security-policy").find("default-src 'none'") == 0);
  CHECK(page.value().body.find("http://") == std::string::npos);
  CHECK(page.value().body.find("https://") == std::string::npos);

  PublishImage(t);
  Reply granted = Send("POST", t.Chunk(2, "lease"), Source("a1"));
  REQUIRE(granted.body["state"] == "granted");
  REQUIRE(Send("POST", t.Chunk(1, "lease"), Source("a2")).body["state"] == "granted");
  REQUIRE(Send("POST", t.base + "/v1/prefetch/poll?wait_ms=0",
               json{{"agent", "n1-a"}, {"node", "n1"}}.dump())
              .status == 200);
  const std::string url = t.base + "/ui#token=" + Tokens().op;
  const std::string shots = ArtifactDir();

  std::string dom = RenderPage(dir, url, 1280, 900, shots + "/cluster-page-desktop.png");
  json v = ClusterView(t);
  INFO(dom.substr(0, 4000));
  CHECK(PageValue(dom, "leases-active") == to_string(v["upstream"]["leases_active"]));
  CHECK(PageValue(dom, "leases-active") == "2");
  CHECK(PageValue(dom, "cap-replica") == to_string(v["upstream"]["cap_this_replica"]));
  CHECK(PageValue(dom, "blobs-count") == "1");
  CHECK(PageValue(dom, "chunks-ready") == "0");
  CHECK(PageValue(dom, "chunks-total") == to_string(v["blobs"]["chunks"]));
  CHECK(PageValue(dom, "agents-live") == "1");
  CHECK(dom.find("demo/app") != std::string::npos);
  // The image's card: its size from the manifest, nothing from upstream yet.
  CHECK(PageValue(dom, "img0-size") == to_string(v["images"][0]["size"]));
  CHECK(PageValue(dom, "img0-size") == std::to_string(kSize + kConfigSize));
  CHECK(PageValue(dom, "img0-upstream") == "0");
  CHECK(PageValue(dom, "img0-done") == "0");

  // The pull moves on: both chunks published, so the page's numbers change with the JSON's.
  REQUIRE(Send("PUT", t.Chunk(2), PublishBody("a1", granted.body["lease_id"], Metainfo(1000)))
              .status == 200);
  dom = RenderPage(dir, url, 390, 844, shots + "/cluster-page-phone.png");
  v = ClusterView(t);
  CHECK(PageValue(dom, "leases-active") == "1");
  CHECK(PageValue(dom, "chunks-ready") == "1");
  CHECK(PageValue(dom, "upstream-bytes") == to_string(v["upstream"]["bytes_total"]));
  CHECK(PageValue(dom, "upstream-bytes") == "1000");
  CHECK(PageValue(dom, "img0-upstream") == "1000");
  CHECK(std::filesystem::file_size(shots + "/cluster-page-desktop.png") > 10'000);
  CHECK(std::filesystem::file_size(shots + "/cluster-page-phone.png") > 10'000);

  // A wrong token: the page asks for one instead of showing data.
  dom = RenderPage(dir, t.base + "/ui#token=not-a-valid-token-at-all", 800, 600);
  CHECK(dom.find("refused the token") != std::string::npos);
  CHECK(t.process->Stop() == 0);
}

struct CtlRun {
  int code = -1;
  std::string out;
};

// `shoalctl status --cluster ...` with the test cluster's operator token; its exit code and
// output (stdout and stderr).
CtlRun ClusterStatus(const std::vector<std::string>& args, seconds timeout = seconds(30)) {
  std::string cmd = std::string("'") + SHOAL_CTL_BIN +
                    "' status --cluster --operator-token-file '" + Tokens().operator_file + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  auto r = RunCommand({"sh", "-c", cmd + " 2>&1; echo \"exit=$?\""}, timeout);
  REQUIRE_MESSAGE(r.has_value(), Why(r));
  CtlRun run;
  size_t at = r.value().rfind("exit=");
  REQUIRE(at != std::string::npos);
  run.code = std::stoi(r.value().substr(at + 5));
  run.out = r.value().substr(0, at);
  return run;
}

TEST_CASE("shoalctl status --cluster: merges the replicas, names the dead one, and tells by its "
          "exit code whether an image is done on the nodes") {
  TempDir dir("shoal-ctl-cluster");
  Tracker t1 = StartTracker(dir, {"--max-upstream-fetchers", "4", "--replicas", "2"});
  Tracker t2 = StartTracker(dir, {"--max-upstream-fetchers", "4", "--replicas", "2"});
  const std::string dead = "http://127.0.0.1:" + std::to_string(FreePort());
  const std::string trackers = t1.base + "," + t2.base + "," + dead;

  for (const Tracker* t : {&t1, &t2}) {
    for (const char* node : {"n1", "n2"}) {
      REQUIRE(Send("POST", t->base + "/v1/prefetch/poll?wait_ms=0",
                   json{{"agent", std::string(node) + "-a"}, {"node", node}}.dump())
                  .status == 200);
    }
  }
  const std::string image = "r.test/demo/app:1";
  Reply job = OperatorSend("POST", t2.base + "/v1/prefetch/jobs",
                           json{{"images", {image}}, {"nodes", {"n1", "n2"}}}.dump());
  REQUIRE_MESSAGE(job.status == 201, job.body.dump());
  const std::string id = job.body["id"];
  REQUIRE(Send("POST", t1.Chunk(0, "lease"), Source("a1")).body["state"] == "granted");
  // The image's manifest is on t2, its layer's table on t1.
  const std::string manifest = PublishImage(t2);

  CtlRun run = ClusterStatus({"--tracker", trackers, "--json", "--image", image});
  INFO(run.out);
  CHECK(run.code == 3);  // not yet done
  json merged = json::parse(run.out, nullptr, false);
  REQUIRE(merged.is_object());
  CHECK(merged["replicas_up"] == 2);
  REQUIRE(merged["replicas"].size() == 3);
  CHECK(merged["replicas"][2]["up"] == false);
  CHECK(merged["replicas"][2]["error"].get<std::string>().find("127.0.0.1") != std::string::npos);
  CHECK(merged["replicas"][0]["agents_live"] == 2);
  CHECK(merged["upstream"]["leases_active"] == 1);
  CHECK(merged["upstream"]["cap_replicas_up"] == 4);  // 2 + 2 of the cluster's 4
  CHECK(merged["upstream"]["cap_cluster"] == 4);
  CHECK(merged["blobs"].size() == 1);
  REQUIRE(merged["prefetch_jobs"].size() == 1);
  CHECK(merged["prefetch_jobs"][0]["replica"] == t2.base);
  CHECK(merged["image"]["state"] == "in_progress");
  // One image, its layer filled in from t1's answer; the config has no table anywhere.
  REQUIRE(merged["images"].size() == 1);
  CHECK(merged["images"][0]["manifest"] == manifest);
  CHECK(merged["images"][0]["blobs_known"] == 1);
  CHECK(merged["images"][0]["blobs"][1]["known"] == true);
  CHECK(merged["images"][0]["blobs"][1]["chunks"] == 3);
  CHECK(merged["image"]["detail"].get<std::string>().find("0 nodes done") != std::string::npos);

  // The table names the dead replica and the job.
  run = ClusterStatus({"--tracker", trackers, "--image", image});
  CHECK(run.code == 3);
  CHECK(run.out.find("tracker replicas: 2 of 3 answer") != std::string::npos);
  CHECK(run.out.find(dead + " ") != std::string::npos);
  CHECK(run.out.find("unreachable") != std::string::npos);
  CHECK(run.out.find(id) != std::string::npos);
  CHECK(run.out.find("r.test/demo/app") != std::string::npos);

  // n1 finishes: done on n1 alone, not yet on both; a node outside the job is a failure.
  const std::string n1 = t2.base + "/v1/prefetch/jobs/" + id + "/nodes/n1";
  const std::string n2 = t2.base + "/v1/prefetch/jobs/" + id + "/nodes/n2";
  REQUIRE(Send("PUT", n1, R"({"agent":"n1-a","state":"done","bytes_done":10,"bytes_total":10})")
              .status == 200);
  CHECK(ClusterStatus({"--tracker", trackers, "--image", image, "--nodes", "n1"}).code == 0);
  CHECK(ClusterStatus({"--tracker", trackers, "--image", image}).code == 3);
  run = ClusterStatus({"--tracker", trackers, "--image", image, "--nodes", "n1,n9"});
  CHECK(run.code == 1);
  CHECK(run.out.find("n9 (not in job " + id + ")") != std::string::npos);
  CHECK(ClusterStatus({"--tracker", trackers, "--image", "r.test/other:1"}).code == 3);

  // --watch returns as soon as the image is complete everywhere.
  std::thread finisher([&] {
    std::this_thread::sleep_for(milliseconds(1500));
    Send("PUT", n2, R"({"agent":"n2-a","state":"done","bytes_done":10,"bytes_total":10})");
  });
  auto started = Clock::now();
  run = ClusterStatus({"--tracker", trackers, "--image", image, "--watch", "--interval", "0.5",
                       "--timeout", "20s"});
  finisher.join();
  CHECK(run.code == 0);
  CHECK(Clock::now() - started < seconds(10));
  CHECK(run.out.find("2 of 2 nodes done") != std::string::npos);

  // Usage errors and a missing token.
  CHECK(ClusterStatus({"--nodes", "n1"}).code == 2);
  auto anon = RunCommand({"sh", "-c", std::string("'") + SHOAL_CTL_BIN +
                                          "' status --cluster --tracker " + t1.base +
                                          " 2>&1; echo \"exit=$?\""},
                         seconds(20));
  REQUIRE(anon.has_value());
  CHECK(anon.value().find("HTTP 401") != std::string::npos);
  CHECK(anon.value().find("exit=1") != std::string::npos);
  CHECK(t1.process->Stop() == 0);
  CHECK(t2.process->Stop() == 0);
}

}  // namespace shoal::testkit
