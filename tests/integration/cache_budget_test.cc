// The agent's cache budget and pins, end to end: a real agent with a small --cache-budget in
// front of Debian's docker-registry, images pulled with `shoalctl pull`, the cache driven with
// `shoalctl cache ls|pin|unpin|gc`. Eviction must never touch a pinned blob or one being served
// (a client that reads slowly holds it), and pins must survive a restart.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/support/agent.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/runtimes.h"
#include "tests/support/tracker.h"
#include "tests/support/why.h"

namespace shoal::testkit {
namespace {

uint64_t ImageBytes(const BuiltImage& b) { return b.total_blob_bytes + b.manifest_json.size(); }

std::set<std::string> Digests(const BuiltImage& b) {
  std::set<std::string> out{b.manifest_digest.str(), b.config_digest.str()};
  for (const auto& d : b.layer_digests) out.insert(d.str());
  return out;
}

// A client that asks for a blob and then reads nothing, with a tiny receive buffer: the agent
// is stuck mid-body, so the blob stays in use until the client goes away.
class SlowReader {
 public:
  SlowReader(const std::string& host_port, const std::string& target) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    int small = 4096;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(host_port.rfind(':') + 1))));
    ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    std::string req = "GET " + target + " HTTP/1.1\r\nHost: " + host_port + "\r\n\r\n";
    REQUIRE(::send(fd_, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
    char buf[512];
    std::string head;
    while (head.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      REQUIRE(n > 0);
      head.append(buf, static_cast<size_t>(n));
    }
    CHECK(head.rfind("HTTP/1.1 200", 0) == 0);
  }
  ~SlowReader() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

nlohmann::json CacheLs(const Agent& agent) {
  auto out = Shoalctl({"cache", "ls", "--json", "--agent", agent.Url()});
  REQUIRE_MESSAGE(out.has_value(), Why(out));
  auto j = nlohmann::json::parse(out.value(), nullptr, false);
  REQUIRE_MESSAGE(!j.is_discarded(), out.value());
  return j;
}

// digest -> entry of `cache ls --json`.
std::map<std::string, nlohmann::json> Entries(const Agent& agent) {
  std::map<std::string, nlohmann::json> out;
  const nlohmann::json ls = CacheLs(agent);  // a named value: range-for over a temporary's member dangles
  for (const auto& e : ls["entries"]) out[e["digest"].get<std::string>()] = e;
  return out;
}

bool HasAll(const std::map<std::string, nlohmann::json>& entries, const std::set<std::string>& ds) {
  for (const auto& d : ds) {
    if (!entries.count(d)) return false;
  }
  return true;
}

bool HasNone(const std::map<std::string, nlohmann::json>& entries,
             const std::set<std::string>& ds) {
  for (const auto& d : ds) {
    if (entries.count(d)) return false;
  }
  return true;
}

void Pull(const Agent& agent, const std::string& image) {
  auto out = Shoalctl({"pull", image, "--agent", agent.Url()});
  REQUIRE_MESSAGE(out.has_value(), (Why(out) + "\n" + agent.LogTail()));
}

}  // namespace

TEST_CASE("cache budget: LRU eviction spares pinned and in-use blobs, and pins survive a restart") {
  TempDir dir("shoal-cache-budget");
  auto reg = Registry::Start();
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  Registry& registry = *reg.value();
  auto push = [&](const std::string& name, uint64_t seed, uint64_t big) {
    auto pushed =
        PushOneLayerImage(registry, dir.Sub("layout-" + std::to_string(seed)), name, big, seed);
    REQUIRE_MESSAGE(pushed.has_value(), Why(pushed));
    return pushed.value();
  };
  BuiltImage a = push("proj/a", 801, 1ull << 20);
  BuiltImage b = push("proj/b", 802, 1ull << 20);
  // Large enough that a reader that does not read holds the response mid-body.
  BuiltImage c = push("proj/c", 803, 24ull << 20);
  // A and C fit; A, B and C do not.
  const uint64_t budget = ImageBytes(a) + ImageBytes(c) + 4096;
  REQUIRE(ImageBytes(a) + ImageBytes(b) + ImageBytes(c) > budget);

  AgentOptions opts;
  opts.cache_dir = dir.Sub("cache");
  opts.upstreams = {"gcr.io=" + registry.Url()};
  opts.extra_args = {"--unmapped", "error", "--cache-budget", std::to_string(budget)};
  auto started = Agent::Start(opts);
  REQUIRE_MESSAGE(started.has_value(), Why(started));
  Agent& agent = *started.value();

  // Pinning an image reference pins its manifest, config and layers (before they are cached).
  auto pinned = Shoalctl({"cache", "pin", "gcr.io/proj/a:1", "--ttl", "1h", "--owner", "test",
                          "--json", "--agent", agent.Url()});
  REQUIRE_MESSAGE(pinned.has_value(), (Why(pinned) + "\n" + agent.LogTail()));
  auto pin_json = nlohmann::json::parse(pinned.value(), nullptr, false);
  REQUIRE(pin_json.is_array());
  std::set<std::string> pinned_digests;
  for (const auto& d : pin_json[0]["pinned"]) pinned_digests.insert(d.get<std::string>());
  CHECK(pinned_digests == Digests(a));

  // A pull ends once the last byte is verified; the cache commit (fsync, rename) follows on a
  // pool thread, under load a moment later (CI, session 34: right after B's pull not all of
  // B's entries were listed, and after C's B was not evicted within 10 s; a late commit of B's
  // makes it newer than C's, the likely cause, not traced). So wait for the commits before the
  // next pull, which keeps the use order A, B, C.
  Pull(agent, "gcr.io/proj/a:1");
  REQUIRE(WaitUntil([&] { return HasAll(Entries(agent), Digests(a)); }, std::chrono::seconds(10)));
  Pull(agent, "gcr.io/proj/b:1");
  REQUIRE(WaitUntil([&] { return HasAll(Entries(agent), Digests(b)); }, std::chrono::seconds(10)));
  Pull(agent, "gcr.io/proj/c:1");
  // C pushed the cache over budget: B, the least recently used unpinned image, went.
  REQUIRE(WaitUntil([&] { return HasNone(Entries(agent), Digests(b)); },
                    std::chrono::seconds(10)));
  CHECK(WaitUntil([&] { return HasAll(Entries(agent), Digests(c)); }, std::chrono::seconds(10)));
  auto entries = Entries(agent);
  CHECK(HasAll(entries, Digests(a)));
  CHECK(HasAll(entries, Digests(c)));
  for (const auto& d : Digests(a)) CHECK(entries[d]["pinned"] == true);
  CHECK(agent.Metric("shoal_cache_evictions_total") >= 3);
  CHECK(agent.Metric("shoal_cache_budget_bytes") == static_cast<double>(budget));
  CHECK(agent.Metric("shoal_cache_pinned_bytes") == static_cast<double>(ImageBytes(a)));
  CHECK(agent.Metric("shoal_cache_bytes") <= static_cast<double>(budget));

  // A client holds C's layer mid-body: gc down to nothing spares it and the pinned image.
  const std::string c_layer = c.layer_digests[0].str();
  {
    SlowReader reader(agent.HostPort(), "/v2/proj/c/blobs/" + c_layer + "?ns=gcr.io");
    REQUIRE(WaitUntil([&] { return Entries(agent)[c_layer]["in_use"] == true; },
                      std::chrono::seconds(10)));
    auto gc = Shoalctl({"cache", "gc", "--to", "0", "--json", "--agent", agent.Url()});
    REQUIRE_MESSAGE(gc.has_value(), Why(gc));
    auto gc_json = nlohmann::json::parse(gc.value(), nullptr, false);
    REQUIRE(gc_json.is_object());
    std::set<std::string> evicted;
    for (const auto& d : gc_json["evicted"]) evicted.insert(d.get<std::string>());
    CHECK(evicted == std::set<std::string>{c.manifest_digest.str(), c.config_digest.str()});
    CHECK(gc_json["freed_bytes"].get<uint64_t>() ==
          c.manifest_json.size() + (c.total_blob_bytes - c.layer_sizes[0]));
    CHECK(gc_json["over_budget"].get<uint64_t>() > 0);
    entries = Entries(agent);
    CHECK(entries.count(c_layer) == 1);
    CHECK(HasAll(entries, Digests(a)));
    reader.Close();
  }
  REQUIRE(WaitUntil([&] { return Entries(agent)[c_layer]["in_use"] == false; },
                    std::chrono::seconds(10)));

  // Pins are on disk: after a restart A is still pinned and gc takes only C's layer.
  REQUIRE(agent.Stop() == 0);
  REQUIRE_MESSAGE(agent.Restart().has_value(), agent.LogTail());
  entries = Entries(agent);
  CHECK(HasAll(entries, Digests(a)));
  for (const auto& d : Digests(a)) CHECK(entries[d]["pinned"] == true);
  auto gc2 = Shoalctl({"cache", "gc", "--to", "0", "--agent", agent.Url()});
  REQUIRE_MESSAGE(gc2.has_value(), Why(gc2));
  CHECK(gc2.value().find("freed") != std::string::npos);
  entries = Entries(agent);
  CHECK(entries.count(c_layer) == 0);
  CHECK(entries.size() == 3);

  // Unpinned, A goes at the next gc; the human-readable ls shows an empty cache.
  auto unpinned = Shoalctl({"cache", "unpin", "gcr.io/proj/a:1", "--agent", agent.Url()});
  REQUIRE_MESSAGE(unpinned.has_value(), Why(unpinned));
  auto gc3 = Shoalctl({"cache", "gc", "--to", "0", "--json", "--agent", agent.Url()});
  REQUIRE(gc3.has_value());
  auto gc3_json = nlohmann::json::parse(gc3.value(), nullptr, false);
  CHECK(gc3_json["freed_bytes"].get<uint64_t>() == ImageBytes(a));
  auto ls = Shoalctl({"cache", "ls", "--agent", agent.Url()});
  REQUIRE(ls.has_value());
  CHECK(ls.value().find("0 blobs") != std::string::npos);
}

TEST_CASE("cache budget: pin by digest with a TTL, bad requests, and the admin API's answers") {
  TempDir dir("shoal-cache-admin");
  auto reg = Registry::Start();
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  AgentOptions opts;
  opts.cache_dir = dir.Sub("cache");
  opts.upstreams = {"gcr.io=" + reg.value()->Url()};
  opts.extra_args = {"--unmapped", "error", "--cache-budget", "50%"};
  auto started = Agent::Start(opts);
  REQUIRE_MESSAGE(started.has_value(), Why(started));
  Agent& agent = *started.value();
  CHECK(agent.Metric("shoal_cache_budget_bytes") > 0);

  const std::string digest = "sha256:" + std::string(64, 'a');
  auto pinned = Shoalctl({"cache", "pin", digest, "--ttl", "90s", "--json", "--agent", agent.Url()});
  REQUIRE_MESSAGE(pinned.has_value(), Why(pinned));
  CHECK(pinned.value().find(digest) != std::string::npos);
  // A bad TTL and an unknown image fail with an exit code.
  CHECK_FALSE(Shoalctl({"cache", "pin", digest, "--ttl", "soon", "--agent", agent.Url()}).has_value());
  CHECK_FALSE(
      Shoalctl({"cache", "pin", "gcr.io/proj/none:1", "--agent", agent.Url()}).has_value());
  CHECK_FALSE(Shoalctl({"cache", "gc", "--to", "lots", "--agent", agent.Url()}).has_value());
  auto unpinned = Shoalctl({"cache", "unpin", digest, "--json", "--agent", agent.Url()});
  REQUIRE(unpinned.has_value());
  // An unknown admin path is a JSON 404; no OCI route is shadowed.
  auto res = HttpGet(agent.Url() + "/shoal/v1/nothing");
  REQUIRE(res.has_value());
  CHECK(res.value().status == 404);
}

TEST_CASE("cache budget: with a tracker, an evicted blob leaves the swarm and is fetched again at once") {
  TempDir dir("shoal-cache-swarm");
  auto reg = Registry::Start();
  REQUIRE_MESSAGE(reg.has_value(), Why(reg));
  ImageSpec spec;
  spec.layers.push_back(LayerSpec{Compression::kGzip, 4, {8ull << 20}, 901});
  auto built = BuildImage(spec, dir.Sub("layout"), "1");
  REQUIRE_MESSAGE(built.has_value(), Why(built));
  REQUIRE(PushImage(*reg.value(), dir.Sub("layout"), "1", "proj/s").has_value());
  auto tracker = TrackerProcess::Start({"--chunk-size-kib", "2048", "--piece-size-kib", "256"});
  REQUIRE_MESSAGE(tracker.has_value(), Why(tracker));
  AgentOptions opts;
  opts.cache_dir = dir.Sub("cache");
  opts.upstreams = {"gcr.io=" + reg.value()->Url()};
  opts.extra_args = {"--unmapped", "error", "--tracker", tracker.value()->Url(), "--swarm-listen",
                     "127.0.0.1:0", "--tracker-grace-ms", "3000", "--peer-stall-ms", "120000"};
  auto started = Agent::Start(opts);
  REQUIRE_MESSAGE(started.has_value(), Why(started));
  Agent& agent = *started.value();

  const std::string layer = built.value().layer_digests[0].str();
  const double layer_bytes = static_cast<double>(built.value().layer_sizes[0]);
  const std::string seed_record = opts.cache_dir + "/swarm/" + built.value().layer_digests[0].hex() + ".json";
  Pull(agent, "gcr.io/proj/s:1");
  REQUIRE(WaitUntil([&] { return std::filesystem::exists(seed_record); }, std::chrono::seconds(10)));
  // The fetch lets go of the blob once it has published its chunks.
  REQUIRE_MESSAGE(WaitUntil([&] { return Entries(agent)[layer]["in_use"] == false; },
                            std::chrono::seconds(10)),
                  CacheLs(agent).dump());
  auto gc = Shoalctl({"cache", "gc", "--to", "0", "--json", "--agent", agent.Url()});
  REQUIRE_MESSAGE(gc.has_value(), Why(gc));
  CHECK(gc.value().find(layer) != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(seed_record));
  CHECK(Entries(agent).empty());
  // The removed chunk torrents announce `stopped`, so the tracker sees their last seeder leave.
  REQUIRE_MESSAGE(WaitUntil([&] { return tracker.value()->Metric("shoal_tracker_seeders") == 0; },
                            std::chrono::seconds(10)),
                  tracker.value()->LogTail());
  // Fetched again at once: the tracker drops the ready chunks nobody seeds any more and leases
  // them, instead of handing out torrents that would stall for --peer-stall-ms (two minutes).
  const double upstream_before = agent.Metric("shoal_upstream_blob_bytes_total");
  Pull(agent, "gcr.io/proj/s:1");
  CHECK(Entries(agent).count(layer) == 1);
  CHECK(agent.Metric("shoal_swarm_peer_stalls_total") == 0);
  CHECK(agent.Metric("shoal_upstream_blob_bytes_total") - upstream_before >= layer_bytes);
  CHECK(WaitUntil([&] { return std::filesystem::exists(seed_record); }, std::chrono::seconds(10)));
}

}  // namespace shoal::testkit
