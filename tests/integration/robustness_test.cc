// The agent as the weak link of a node (issue 13): clients that hang up mid-body, small and
// full disks, bytes flipped on the agent's own disk, an upstream that fails before the first
// byte, a dead tracker. Real agents, a real docker-registry behind the counting proxy, real
// sockets; the small disks are tmpfs mounts that the tests make (they need root and skip
// without it).
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>

#include "lib/core/sha256.h"
#include "tests/support/agent.h"
#include "tests/support/counted_upstream.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/netns.h"
#include "tests/support/proc_stats.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/small_disk.h"
#include "tests/support/tracker.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// One image pushed to a docker-registry with the counting proxy in front, and agents on it.
struct World {
  TempDir dir{"shoal-robust"};
  std::unique_ptr<Registry> registry;
  std::unique_ptr<CountingProxy> proxy;
  std::vector<std::unique_ptr<Agent>> agents;

  World() {
    auto up = CountedUpstream::Start();
    REQUIRE_MESSAGE(up.has_value(), Why(up));
    registry = std::move(up.value().registry);
    proxy = std::move(up.value().proxy);
  }

  // Pushes demo/<name>:1: one layer with a big file of `big` bytes (about half of it once
  // compressed) and a few small files.
  BuiltImage Push(const std::string& name, uint64_t big, uint64_t seed) {
    auto pushed = PushOneLayerImage(*registry, dir.Sub("layout-" + name), "demo/" + name, big, seed);
    REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
    return pushed.value();
  }

  Agent& AddAgent(std::string cache_dir, std::vector<std::string> extra = {}) {
    AgentOptions opts;
    opts.cache_dir = std::move(cache_dir);
    opts.upstreams = {"docker.io=" + proxy->Url()};
    opts.extra_args = std::move(extra);
    auto a = Agent::Start(opts);
    REQUIRE_MESSAGE(a.has_value(), Why(a));
    agents.push_back(std::move(a.value()));
    return *agents.back();
  }
};

std::string BlobUrl(const Agent& a, const std::string& name, const Digest& d) {
  return a.Url() + "/v2/demo/" + name + "/blobs/" + d.str();
}

uint16_t PortOf(const std::string& host_port) {
  return static_cast<uint16_t>(std::stoi(host_port.substr(host_port.rfind(':') + 1)));
}

// Opens a connection, asks for `target`, reads up to `read_bytes` of the answer (head
// included), then closes: with an RST (SO_LINGER 0) when `reset`, else a FIN.
void HangUp(uint16_t port, const std::string& target, size_t read_bytes, bool reset) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    std::string req = "GET " + target + " HTTP/1.1\r\nHost: x\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[16384];
      size_t got = 0;
      while (got < read_bytes) {
        ssize_t n = ::recv(fd, buf, std::min(sizeof(buf), read_bytes - got), 0);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
    }
  }
  if (reset) {
    linger lg{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  }
  ::close(fd);
}

size_t OpenFds(pid_t pid) {
  std::error_code ec;
  size_t n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

size_t FilesIn(const std::string& dir) {
  std::error_code ec;
  size_t n = 0;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

}  // namespace

// Defect 7: an agent whose announces all fail (its swarm socket is on an address from which the
// tracker cannot be reached; here loopback, with the tracker in a network namespace) stalled
// for more than a minute. It now sees the failed announces within seconds and fetches straight
// from upstream, without reporting the chunks bad (other agents still seed them).
TEST_CASE("robustness: an agent whose announces all fail falls back to upstream in seconds") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: a network namespace needs root");
    return;
  }
  NetNs ns(61);
  REQUIRE(ns.ok());
  World w;
  BuiltImage img = w.Push("app", 24ull << 20, 51);
  auto tracker = TrackerProcess::StartAt(
      {"ip", "netns", "exec", ns.name()}, ns.inside(),
      {"--chunk-size-kib", "2048", "--piece-size-kib", "256", "--lease-ttl-s", "3"});
  REQUIRE_MESSAGE(tracker.has_value(), Why(tracker));
  auto agent_args = [&](const std::string& id, const std::string& swarm_ip) {
    return std::vector<std::string>{"--tracker",       tracker.value()->Url(),
                                    "--swarm-listen",  swarm_ip + ":0",
                                    "--agent-id",      id,
                                    "--lease-wait-ms", "1000"};
  };
  // The seed's agent announces from the host side of the veth: it works.
  Agent& good = w.AddAgent(w.dir.Sub("good"), agent_args("good", ns.host()));
  auto first = SkopeoCopyToLayout(good.HostPort() + "/demo/app:1", w.dir.Sub("p-good"));
  REQUIRE_MESSAGE(first.has_value(), (Why(first) + "\n" + good.LogTail()));
  // This one announces from 127.0.0.1, which cannot reach the namespace; its blob API calls can.
  Agent& cut = w.AddAgent(w.dir.Sub("cut"), agent_args("cut", "127.0.0.1"));
  auto started = std::chrono::steady_clock::now();
  auto pulled = SkopeoCopyToLayout(cut.HostPort() + "/demo/app:1", w.dir.Sub("p-cut"));
  auto took = std::chrono::steady_clock::now() - started;
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + cut.LogTail()));
  CHECK(pulled.value().layer_digests == img.layer_digests);
  CHECK(took < seconds(14));  // the default --peer-stall-ms alone is 15 s, per window
  CHECK(cut.Metric("shoal_swarm_fallback_total", {{"reason", "announce_failed"}}) >= 1);
  // libtorrent does not even send an announce that no listen socket can route: nothing answered.
  CHECK(cut.Metric("shoal_swarm_announces_total", {{"result", "ok"}}) == 0);
  CHECK(good.Metric("shoal_swarm_announces_total", {{"result", "ok"}}) >= 1);
  CHECK(cut.Log().find("announces fail") != std::string::npos);
}

// Defect 1: a client that closed its connection during a blob body killed the agent (SIGPIPE,
// exit 141). A thousand clients hang up at random points, half of them on a cached blob and
// half on one still streaming from a slow upstream, some with a FIN and some with an RST.
TEST_CASE("robustness: 1,000 clients hanging up mid-body never end the agent or leak") {
  World w;
  BuiltImage cached = w.Push("cached", 24ull << 20, 1);
  BuiltImage slow = w.Push("slow", 24ull << 20, 2);
  Agent& agent = w.AddAgent(w.dir.Sub("cache"));
  auto warm = SkopeoCopyToLayout(agent.HostPort() + "/demo/cached:1", w.dir.Sub("warm"));
  REQUIRE_MESSAGE(warm.has_value(), Why(warm));
  const pid_t pid = agent.pid();
  REQUIRE(pid > 0);
  const size_t fds_before = OpenFds(pid);
  const uint64_t rss_before = StatusBytes(pid, "VmRSS");

  // The second image's layer streams from upstream during the storm (about 10 s at 400 ms/MiB).
  w.proxy->SetDelayPerMiB(milliseconds(400));
  auto manifest = HttpGet(agent.Url() + "/v2/demo/slow/manifests/1",
                          {{"Accept", "application/vnd.oci.image.manifest.v1+json"}});
  REQUIRE(manifest.has_value());
  const std::string cached_target = "/v2/demo/cached/blobs/" + cached.layer_digests.front().str();
  const std::string slow_target = "/v2/demo/slow/blobs/" + slow.layer_digests.front().str();
  const uint16_t port = PortOf(agent.HostPort());
  std::atomic<int> next{0};
  std::vector<std::thread> clients;
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) * 7919u);
      for (int i = next++; i < 1000 && std::chrono::steady_clock::now() < deadline; i = next++) {
        const bool streaming = i % 2 == 1;
        size_t read =
            std::uniform_int_distribution<size_t>(0, streaming ? (256 << 10) : (8 << 20))(rng);
        HangUp(port, streaming ? slow_target : cached_target, read, i % 3 == 0);
      }
    });
  }
  for (auto& c : clients) c.join();
  CHECK(next.load() >= 1000);
  REQUIRE_MESSAGE(agent.Running(), agent.LogTail());
  CHECK(agent.Metric("shoal_shim_aborted_responses_total", {{"reason", "client_gone"}}) >= 100);

  // Once the slow fetch has ended, descriptors and memory are back where they were.
  w.proxy->SetDelayPerMiB(milliseconds(0));
  auto full = HttpGet("http://" + agent.HostPort() + slow_target, {}, seconds(120));
  REQUIRE(full.has_value());
  CHECK(full.value().status == 200);
  CHECK(WaitUntil([&] { return OpenFds(pid) <= fds_before + 4; }, seconds(20)));
  INFO("fds " << fds_before << " -> " << OpenFds(pid) << ", RSS " << rss_before << " -> "
              << StatusBytes(pid, "VmRSS"));
  CHECK(StatusBytes(pid, "VmRSS") <= rss_before + (48ull << 20));
  // The last byte goes out once the digest matched, a moment before the fsync and rename.
  CHECK(WaitUntil([&] { return FilesIn(w.dir.Sub("cache/tmp")) == 0; }, seconds(20)));
  // And a normal pull still works.
  auto after = SkopeoCopyToLayout(agent.HostPort() + "/demo/slow:1", w.dir.Sub("after"));
  REQUIRE_MESSAGE(after.has_value(), (Why(after) + "\n" + agent.LogTail()));
  CHECK(after.value().layer_digests == slow.layer_digests);
  CHECK(agent.Running());
}

// Defect 3: eviction never made room for an incoming blob, in-flight bytes were not counted and
// a percentage budget was measured once. Budget eviction before the write, a clear 507 for what
// cannot fit, nothing partial left, and the same pull working once space returns.
TEST_CASE("robustness: a small disk: eviction makes room, what cannot fit gets a clear 507") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: mounting a small tmpfs needs root");
    return;
  }
  World w;
  BuiltImage a = w.Push("a", 40ull << 20, 11);  // each layer about 20 MiB
  BuiltImage b = w.Push("b", 40ull << 20, 12);
  BuiltImage c = w.Push("c", 40ull << 20, 13);
  BuiltImage huge = w.Push("huge", 100ull << 20, 14);  // about 50 MiB
  SmallDisk disk(w.dir, "disk", 64);
  REQUIRE(disk.mounted());
  Agent& agent = w.AddAgent(disk.path() + "/cache", {"--cache-budget", "36MiB"});

  // a, then b: b does not fit beside a, so a is evicted before b is written.
  REQUIRE(SkopeoCopyToLayout(agent.HostPort() + "/demo/a:1", w.dir.Sub("pa")).has_value());
  auto pb = SkopeoCopyToLayout(agent.HostPort() + "/demo/b:1", w.dir.Sub("pb"));
  REQUIRE_MESSAGE(pb.has_value(), (Why(pb) + "\n" + agent.LogTail()));
  CHECK(agent.Metric("shoal_cache_evictions_total") >= 1);

  // Larger than the whole budget: 507 before any body byte, with the reason, nothing left.
  auto r = HttpGet(agent.Url() + "/v2/demo/huge/manifests/1",
                   {{"Accept", "application/vnd.oci.image.manifest.v1+json"}});
  REQUIRE(r.has_value());
  auto blob = HttpGet(BlobUrl(agent, "huge", huge.layer_digests.front()));
  REQUIRE(blob.has_value());
  CHECK(blob.value().status == 507);
  CHECK(blob.value().body.find("cannot fit") != std::string::npos);
  CHECK(FilesIn(disk.path() + "/cache/tmp") == 0);

  // Two at once that do not both fit: one is served, the other refused with 507 (both failed
  // with ENOSPC before, since in-flight bytes were not counted).
  w.proxy->SetDelayPerMiB(milliseconds(100));
  std::vector<Result<HttpResponse>> got(2, MakeError(ErrorCode::kInternal, "not run"));
  (void)HttpGet(agent.Url() + "/v2/demo/a/manifests/1",
                {{"Accept", "application/vnd.oci.image.manifest.v1+json"}});
  (void)HttpGet(agent.Url() + "/v2/demo/c/manifests/1",
                {{"Accept", "application/vnd.oci.image.manifest.v1+json"}});
  std::thread t0(
      [&] { got[0] = HttpGet(BlobUrl(agent, "a", a.layer_digests.front()), {}, seconds(120)); });
  std::this_thread::sleep_for(milliseconds(300));
  std::thread t1(
      [&] { got[1] = HttpGet(BlobUrl(agent, "c", c.layer_digests.front()), {}, seconds(120)); });
  t0.join();
  t1.join();
  w.proxy->SetDelayPerMiB(milliseconds(0));
  REQUIRE(got[0].has_value());
  REQUIRE(got[1].has_value());
  CHECK(got[0].value().status == 200);
  CHECK(got[1].value().status == 507);
  CHECK(FilesIn(disk.path() + "/cache/tmp") == 0);

  // A full disk (not the budget): the agent evicts what it can, then says so; once space
  // returns the same pull works.
  agent.Stop();
  Agent& unbounded = w.AddAgent(disk.path() + "/cache2", {"--cache-budget", "0"});
  WriteFile(disk.path() + "/filler", std::string(36u << 20, 'x'));
  (void)HttpGet(unbounded.Url() + "/v2/demo/c/manifests/1",
                {{"Accept", "application/vnd.oci.image.manifest.v1+json"}});
  auto full = HttpGet(BlobUrl(unbounded, "c", c.layer_digests.front()));
  REQUIRE(full.has_value());
  CHECK(full.value().status == 507);
  CHECK(full.value().body.find("disk is full") != std::string::npos);
  std::filesystem::remove(disk.path() + "/filler");
  auto pc = SkopeoCopyToLayout(unbounded.HostPort() + "/demo/c:1", w.dir.Sub("pc"));
  REQUIRE_MESSAGE(pc.has_value(), (Why(pc) + "\n" + unbounded.LogTail()));
  CHECK(pc.value().layer_digests == c.layer_digests);
  unbounded.Stop();

  // A percentage budget follows the file system's size.
  Agent& pct = w.AddAgent(disk.path() + "/cache3", {"--cache-budget", "50%"});
  const double before = pct.Metric("shoal_cache_budget_bytes");
  CHECK(before == doctest::Approx(32.0 * (1 << 20)).epsilon(0.02));
  REQUIRE(disk.Resize(128));
  CHECK(pct.Metric("shoal_cache_budget_bytes") == doctest::Approx(64.0 * (1 << 20)).epsilon(0.02));
  pct.Stop();
}

// Defect 4: a blob corrupted on the agent's own disk was served as a complete 200. The first
// time this process serves a cached file it hashes it; the last byte waits for the match.
TEST_CASE("robustness: bytes flipped in a cached blob are never served as complete") {
  World w;
  BuiltImage img = w.Push("app", 8ull << 20, 21);
  Agent& agent = w.AddAgent(w.dir.Sub("cache"));
  auto pulled = SkopeoCopyToLayout(agent.HostPort() + "/demo/app:1", w.dir.Sub("p1"));
  REQUIRE_MESSAGE(pulled.has_value(), Why(pulled));
  const Digest layer = img.layer_digests.front();
  const std::string path =
      w.dir.Sub("cache") + "/blobs/sha256/" + layer.hex().substr(0, 2) + "/" + layer.hex();
  const uint64_t gets_before = w.proxy->BlobGets(layer);
  {
    int fd = ::open(path.c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    char flipped = 0x5a;
    REQUIRE(::pwrite(fd, &flipped, 1, 4096) == 1);
    ::close(fd);
  }
  auto bad = HttpGet(BlobUrl(agent, "app", layer));
  // Either the connection was cut before the last byte or no body at all: never all of it.
  if (bad.has_value()) {
    CHECK(bad.value().body.size() <
          std::filesystem::file_size(img.layout_dir + "/blobs/sha256/" + layer.hex()));
  }
  CHECK(
      WaitUntil([&] { return agent.Metric("shoal_cache_corrupt_blobs_total") == 1; }, seconds(10)));
  // A Range ending before the last byte is held too: the blob is gone, so it is fetched again.
  auto again = SkopeoCopyToLayout(agent.HostPort() + "/demo/app:1", w.dir.Sub("p2"));
  REQUIRE_MESSAGE(again.has_value(), (Why(again) + "\n" + agent.LogTail()));
  CHECK(again.value().layer_digests == img.layer_digests);
  CHECK(w.proxy->BlobGets(layer) > gets_before);
  CHECK(agent.Metric("shoal_cache_corrupt_blobs_total") == 1);
}

// Defect 5: failures known before the first body byte were sent as 200 and then cut.
TEST_CASE("robustness: an upstream failing before the first byte gets 503 in bounded time") {
  World w;
  BuiltImage img = w.Push("app", 4ull << 20, 31);
  Agent& agent = w.AddAgent(w.dir.Sub("cache"));
  auto m = HttpGet(agent.Url() + "/v2/demo/app/manifests/1",
                   {{"Accept", "application/vnd.oci.image.manifest.v1+json"}});
  REQUIRE(m.has_value());
  REQUIRE(m.value().status == 200);
  const Digest layer = img.layer_digests.front();
  w.proxy->FailNext(100000, 500);
  auto started = std::chrono::steady_clock::now();
  auto r = HttpGet(BlobUrl(agent, "app", layer), {}, seconds(60));
  auto took = std::chrono::steady_clock::now() - started;
  w.proxy->FailNext(0);
  REQUIRE(r.has_value());
  CHECK(r.value().status == 503);
  CHECK(!r.value().Header("Retry-After").empty());
  CHECK(r.value().body.find("\"errors\"") != std::string::npos);
  // docs/architecture.md: a blob fails after 2 failed chunk fetches, each GET retried 6 times
  // with backoff (3-6 s a round).
  CHECK(took < seconds(16));
  CHECK(w.proxy->BlobGets(layer) <= 30);
  CHECK(agent.Running());
}

// TCP connections to 127.0.0.1:port that sent the start of a request and nothing more, held open
// until destroyed: `n` of them fill a tracker
// at --max-connections n, which then sheds every other connection with 503.
class HeldConnections {
 public:
  HeldConnections(uint16_t port, int n) {
    for (int i = 0; i < n; ++i) {
      // CLOEXEC: agents started later must not inherit (and so keep open) these connections.
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(port);
      ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
      fds_.push_back(fd);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) break;
      // The start of a request: the tracker accepts a connection once bytes arrive
      // (TCP_DEFER_ACCEPT), and then holds it waiting for the rest.
      constexpr std::string_view kStart = "GET /healthz HTTP/1.1\r\n";
      if (::send(fd, kStart.data(), kStart.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(kStart.size())) {
        break;
      }
      ++connected_;
    }
  }
  ~HeldConnections() {
    for (int fd : fds_) ::close(fd);
  }
  int connected() const { return connected_; }

 private:
  std::vector<int> fds_;
  int connected_ = 0;
};

// A full tracker answers 503 + Retry-After (--max-connections). It is alive: the agent keeps
// asking it for --tracker-busy-grace-ms instead of sending the cluster upstream after the
// (shorter) --tracker-grace-ms, and goes upstream only once the busy grace is spent.
TEST_CASE("robustness: a full tracker (503) is waited for, and bypassed only after the busy grace") {
  World w;
  auto img = w.Push("busy", 3 << 20, 61);
  auto img2 = w.Push("busy2", 3 << 20, 62);
  constexpr int kSlots = 8;
  auto tracker = TrackerProcess::Start({"--max-connections", std::to_string(kSlots)});
  REQUIRE_MESSAGE(tracker.has_value(), Why(tracker));
  // Full before the agents start, so that none of them holds a connection that gets through.
  auto held = std::make_unique<HeldConnections>(tracker.value()->port(), kSlots);
  REQUIRE(held->connected() == kSlots);
  CHECK(WaitUntil(
      [&] {
        auto r = HttpGet(tracker.value()->Url() + "/healthz", {}, seconds(2));
        return r.has_value() && r.value().status == 503 &&
               !r.value().Header("Retry-After").empty();
      },
      seconds(5), milliseconds(50)));
  auto agent_with = [&](const std::string& name, const std::string& busy_grace) -> Agent& {
    return w.AddAgent(w.dir.Sub("cache-" + name),
                      {"--tracker", tracker.value()->Url(), "--swarm-listen", "127.0.0.1:0",
                       "--agent-id", name, "--tracker-grace-ms", "1000",
                       "--tracker-busy-grace-ms", busy_grace, "--manifest-wait-ms", "500"});
  };
  Agent& patient = agent_with("patient", "30000");
  Agent& hasty = agent_with("hasty", "2000");
  const Digest layer = img.layer_digests.front();
  const Digest layer2 = img2.layer_digests.front();
  for (auto [a, name] : {std::pair{&patient, "busy"}, std::pair{&hasty, "busy2"}}) {
    auto m = HttpGet(a->Url() + "/v2/demo/" + name + "/manifests/1");
    REQUIRE(m.has_value());
    REQUIRE(m.value().status == 200);  // from upstream: the tracker is full
  }

  std::optional<Result<HttpResponse>> got, got2;
  std::thread pull([&] { got = HttpGet(BlobUrl(patient, "busy", layer), {}, seconds(60)); });
  std::thread pull2([&] { got2 = HttpGet(BlobUrl(hasty, "busy2", layer2), {}, seconds(60)); });
  // Three times the tracker grace: the patient agent still waits for the tracker.
  std::this_thread::sleep_for(milliseconds(3000));
  CHECK(patient.Metric("shoal_swarm_fallback_total") == 0);
  CHECK(w.proxy->BlobGets(layer) == 0);
  // The hasty agent's busy grace (2 s) runs out while the tracker is still full. Its retries
  // wait a Retry-After of 0.5-1.5 s each, so the third 503 can come after 3 s: wait for the
  // fallback itself rather than for a fixed time. Counted as tracker_busy; under load a shed
  // connection can also end in a reset before its 503 is read (tracker_unreachable).
  const auto hasty_fallbacks = [&] {
    return hasty.Metric("shoal_swarm_fallback_total", {{"reason", "tracker_busy"}}) +
           hasty.Metric("shoal_swarm_fallback_total", {{"reason", "tracker_unreachable"}});
  };
  CHECK_MESSAGE(WaitUntil([&] { return hasty_fallbacks() >= 1; }, seconds(15), milliseconds(50)),
                hasty.LogTail());
  CHECK(patient.Metric("shoal_swarm_fallback_total") == 0);
  held.reset();  // the tracker has room again
  const auto released = std::chrono::steady_clock::now();
  pull.join();
  // Within a Retry-After or two (0.5-1.5 s each) of the tracker having room.
  CHECK(std::chrono::steady_clock::now() - released < seconds(10));
  pull2.join();
  REQUIRE(got.has_value());
  REQUIRE_MESSAGE(got->has_value(), (got->error().ToString() + "\n" + patient.LogTail()));
  CHECK(got->value().status == 200);
  CHECK(Sha256::Of(got->value().body) == layer);
  CHECK_MESSAGE(patient.Metric("shoal_swarm_fallback_total") == 0, patient.LogTail());
  CHECK(patient.Metric("shoal_swarm_leases_granted_total") >= 1);
  CHECK(tracker.value()->Metric("shoal_tracker_http_connections_shed_total") >= 1);
  // The hasty agent went upstream while the tracker was full, and got the right bytes.
  REQUIRE(got2.has_value());
  REQUIRE_MESSAGE(got2->has_value(), (got2->error().ToString() + "\n" + hasty.LogTail()));
  CHECK(got2->value().status == 200);
  CHECK(Sha256::Of(got2->value().body) == layer2);
  CHECK(hasty_fallbacks() >= 1);
  CHECK(w.proxy->BlobGets(layer2) >= 1);
  CHECK(patient.Running());
  CHECK(hasty.Running());
}

// Defect 6: with the tracker down, every blob paid --tracker-grace-ms on its own. Once the
// agent knows no replica answers, later blobs fall back at once; when the tracker returns, a
// background probe brings the swarm back.
TEST_CASE("robustness: a dead tracker costs the grace once per outage, not once per blob") {
  World w;
  ImageSpec spec;
  for (uint64_t i = 0; i < 4; ++i)
    spec.layers.push_back(LayerSpec{Compression::kGzip, 3, {}, 40 + i});
  auto built = BuildImage(spec, w.dir.Sub("layout-multi"), "1");
  REQUIRE(built.has_value());
  REQUIRE(PushImage(*w.registry, built.value().layout_dir, "1", "demo/multi").has_value());
  const uint16_t tracker_port = FreePort();
  Agent& agent = w.AddAgent(w.dir.Sub("cache"),
                            {"--tracker", "http://127.0.0.1:" + std::to_string(tracker_port),
                             "--swarm-listen", "127.0.0.1:0", "--agent-id", "a0",
                             "--tracker-grace-ms", "3000", "--manifest-wait-ms", "1000"});
  auto started = std::chrono::steady_clock::now();
  auto pulled = SkopeoCopyToLayout(agent.HostPort() + "/demo/multi:1", w.dir.Sub("p1"));
  auto took = std::chrono::steady_clock::now() - started;
  REQUIRE_MESSAGE(pulled.has_value(), (Why(pulled) + "\n" + agent.LogTail()));
  // 5 blobs (4 layers and the config): 15 s if each paid the grace, about 3 s now.
  CHECK(took < milliseconds(8000));
  CHECK(agent.Metric("shoal_swarm_fallback_total") >= 5);

  // The tracker comes up on that address; the next cold pull goes through the swarm again.
  auto tracker = TrackerProcess::Start({}, tracker_port);
  REQUIRE_MESSAGE(tracker.has_value(), Why(tracker));
  auto spec2 = spec;
  for (auto& l : spec2.layers) l.seed += 100;
  auto built2 = BuildImage(spec2, w.dir.Sub("layout-multi2"), "1");
  REQUIRE(built2.has_value());
  REQUIRE(PushImage(*w.registry, built2.value().layout_dir, "1", "demo/multi2").has_value());
  std::this_thread::sleep_for(seconds(6));  // the probe's pause grows to 5 s at most
  const double fallbacks = agent.Metric("shoal_swarm_fallback_total");
  auto pulled2 = SkopeoCopyToLayout(agent.HostPort() + "/demo/multi2:1", w.dir.Sub("p2"));
  REQUIRE_MESSAGE(pulled2.has_value(), (Why(pulled2) + "\n" + agent.LogTail()));
  CHECK(agent.Metric("shoal_swarm_fallback_total") == fallbacks);
  CHECK(tracker.value()->Metric("shoal_tracker_leases_granted_total") >= 1);
}

}  // namespace shoal::testkit
