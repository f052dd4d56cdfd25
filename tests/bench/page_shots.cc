// shoal-page-shots: screenshots of the tracker's cluster page (/ui) during and after a real pull,
// for docs/img, each checked against the JSON it shows.
//
// The cluster, all on 127.0.0.1: a shoal-tracker, N shoal-agents (each its own node name, cache,
// shim and swarm port), Debian's docker-registry as the upstream behind the test kit's counting
// proxy with its link capped (--upstream-mibps), so that the pull lasts long enough to be seen
// in progress. Two images are pushed: a larger one that skopeo pulls through every agent's shim
// at once (a plain pull: the page names its slowest nodes from their chunks in the swarms), and a
// smaller one that `shoalctl prefetch --cluster` warms on every node (a prefetch job).
//
// Mid-pull (the plain pull's nodes hold between --from and --to of the image between them) every
// agent is frozen with SIGSTOP, so that the cluster stands still, and headless chromium renders
// /ui#token=<operator token> at 1280x900 and 390x844. Each number on the page (its data-value)
// and the slowest nodes and jobs it lists are checked against GET /v1/cluster taken right after,
// which must also equal the one taken before the renders (the freeze held). The agents go on,
// the pulls finish, and the page is rendered and checked again once the image is complete on
// every node.
//
// Writes <out>/cluster-page-desktop.png and cluster-page-phone.png (mid-pull) and
// cluster-page-desktop-done.png and cluster-page-phone-done.png. Exits 1 when a check fails or
// the harness does, 130 on Ctrl-C (children are killed and the temp dir goes). A program, not a
// test: never run by ctest.

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/agent.h"
#include "tests/support/chromium.h"
#include "tests/support/counted_upstream.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/tokens.h"
#include "tests/support/tracker.h"

namespace shoal::testkit {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr char kPulled[] = "team/trainer";  // pulled by skopeo through every agent
constexpr char kPulledTag[] = "v7";
constexpr char kPrefetched[] = "team/sidecar";  // prefetched by a cluster job
constexpr char kPrefetchedTag[] = "1.2";

std::mutex g_dir_mu;
std::string g_dir;  // GUARDED_BY(g_dir_mu): the run's temp dir, for the interrupt thread

struct HarnessError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename T>
T Must(Result<T> r, const std::string& what) {
  if (!r) throw HarnessError(what + ": " + r.error().ToString());
  return std::move(r.value());
}

std::string Mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1 << 20));
  return buf;
}

struct Options {
  std::string out;
  int agents = 4;
  double upstream_mibps = 3;
  double from = 0.3, to = 0.7;
};

// The tracker's view, as an operator reads it.
json View(const TrackerProcess& tracker) {
  auto got = HttpGet(tracker.Url() + "/v1/cluster", OperatorAuth(), seconds(10));
  if (!got || got.value().status != 200) {
    throw HarnessError("GET /v1/cluster: " +
                       (got ? std::to_string(got.value().status) + " " + got.value().body
                            : got.error().ToString()));
  }
  return json::parse(got.value().body);
}

// The image entry of the view with this reference (null when it has none).
json ImageOf(const json& view, const std::string& reference) {
  for (const json& im : view.value("images", json::array())) {
    for (const json& r : im["references"]) {
      if (r == reference) return im;
    }
  }
  return nullptr;
}

// Every value of attribute `name` in a dumped DOM, in document order.
std::vector<std::string> Attributes(const std::string& dom, const std::string& name) {
  std::vector<std::string> out;
  const std::string open = " " + name + "=\"";
  for (size_t at = dom.find(open); at != std::string::npos; at = dom.find(open, at)) {
    at += open.size();
    out.push_back(dom.substr(at, dom.find('"', at) - at));
  }
  return out;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& e : v) s += (s.empty() ? "" : ",") + e;
  return s;
}

// What the page shows against what the JSON says: "what: page X, JSON Y" for each difference;
// *checked counts the comparisons.
std::vector<std::string> Compare(const std::string& dom, const json& v, int* checked) {
  std::vector<std::string> diffs;
  auto same = [&](const std::string& what, const std::string& page, const std::string& want) {
    ++*checked;
    if (page != want) diffs.push_back(what + ": page \"" + page + "\", JSON \"" + want + "\"");
  };
  auto number = [&](const std::string& id, const json& value) {
    same(id, PageValue(dom, id), value.is_null() ? "" : value.dump());
  };
  const json& up = v["upstream"];
  number("replicas", v["replicas"]);
  number("leases-active", up["leases_active"]);
  number("cap-replica", up["cap_this_replica"]);
  number("cap-cluster", up["cap_cluster"]);
  number("upstream-bytes", up["bytes_total"]);
  number("blobs-count", v["blobs"]["count"]);
  number("chunks-ready", v["blobs"]["chunks_ready"]);
  number("chunks-total", v["blobs"]["chunks"]);
  number("agents-live", v["agents"]["live"]);
  number("agents-stale", v["agents"]["stale"]);
  number("swarms", v["swarms"]["count"]);
  number("peers", v["swarms"]["peers"]);
  std::vector<std::string> manifests, slow;
  for (size_t i = 0; i < v["images"].size(); ++i) {
    const json& im = v["images"][i];
    const std::string p = "img" + std::to_string(i);
    number(p + "-done", im["nodes_done"]);
    number(p + "-progress", im["nodes_in_progress"]);
    number(p + "-failed", im["nodes_failed"]);
    number(p + "-size", im["size"]);
    number(p + "-upstream", im["upstream_bytes"]);
    number(p + "-peers", im["peer_bytes"]);
    manifests.push_back(im["manifest"]);
    for (const json& n : im["slowest_nodes"]) slow.push_back(n["node"]);
  }
  same("images (by manifest)", Join(Attributes(dom, "data-manifest")), Join(manifests));
  same("images' slowest nodes", Join(Attributes(dom, "data-node")), Join(slow));
  std::vector<std::string> jobs, done;
  for (const json& j : v["prefetch_jobs"]) {
    jobs.push_back(j["id"]);
    done.push_back(j["totals"]["done"].dump());
  }
  same("prefetch jobs", Join(Attributes(dom, "data-id")), Join(jobs));
  same("prefetch jobs' nodes done", Join(Attributes(dom, "data-done")), Join(done));
  return diffs;
}

// The view's figures the page shows and that only the cluster's activity changes (not the
// clock): what must not move while the agents are frozen.
json Frozen(const json& v) {
  json f = {{"upstream", v["upstream"]["bytes_total"]},
            {"leases", v["upstream"]["leases_active"]},
            {"chunks_ready", v["blobs"]["chunks_ready"]},
            {"peers", v["swarms"]["peers"]},
            {"agents_live", v["agents"]["live"]}};
  for (const json& im : v["images"]) {
    json slow = json::array();
    for (const json& n : im["slowest_nodes"]) slow.push_back({n["node"], n["bytes_done"]});
    f["images"].push_back({im["manifest"], im["nodes_done"], im["nodes_in_progress"],
                           im["nodes_failed"], im["held_bytes"], slow});
  }
  for (const json& j : v["prefetch_jobs"]) f["jobs"].push_back({j["id"], j["totals"]});
  return f;
}

void Describe(const char* when, const json& v, const std::string& reference) {
  const json im = ImageOf(v, reference);
  if (im.is_null()) return;
  std::printf(
      "%s: %s: %s nodes done, %s in progress, %s failed; %s from upstream of %s, %s from "
      "peers; %zu prefetch job(s)\n",
      when, reference.c_str(), im["nodes_done"].dump().c_str(),
      im["nodes_in_progress"].dump().c_str(), im["nodes_failed"].dump().c_str(),
      Mib(im["upstream_bytes"].get<double>()).c_str(), Mib(im["size"].get<double>()).c_str(),
      Mib(im["peer_bytes"].get<double>()).c_str(), v["prefetch_jobs"].size());
  for (const json& n : im["slowest_nodes"]) {
    std::printf(
        "  slowest: %-12s %-8s %s of %s chunks (%s of %s)\n", n["node"].get<std::string>().c_str(),
        n["state"].get<std::string>().c_str(), n.value("chunks_held", json(nullptr)).dump().c_str(),
        n.value("chunks_total", json(nullptr)).dump().c_str(),
        Mib(n["bytes_done"].get<double>()).c_str(), Mib(n["bytes_total"].get<double>()).c_str());
  }
}

// Renders the page at one size into out/name and checks it against the view taken after it.
// Returns the number of failed checks.
int Shoot(const TrackerProcess& tracker, const TempDir& dir, const std::string& out,
          const std::string& name, int width, int height, const json* must_equal) {
  const std::string png = out + "/" + name;
  const auto start = Clock::now();
  const std::string dom =
      Must(RenderPage(dir.Sub("chromium-profile"), tracker.Url() + "/ui#token=" + Tokens().op,
                      width, height, png),
           "chromium");
  const json v = View(tracker);
  int checked = 0;
  std::vector<std::string> diffs = Compare(dom, v, &checked);
  if (must_equal && Frozen(v) != *must_equal) {
    diffs.push_back("the cluster moved while frozen: before " + must_equal->dump() + ", after " +
                    Frozen(v).dump());
  }
  std::printf(
      "%s: %dx%d in %.1f s, %ju bytes; the page matches GET /v1/cluster on %d of %d "
      "checks\n",
      png.c_str(), width, height, std::chrono::duration<double>(Clock::now() - start).count(),
      static_cast<uintmax_t>(fs::file_size(png)), checked - static_cast<int>(diffs.size()),
      checked);
  for (const auto& d : diffs) std::printf("  MISMATCH %s\n", d.c_str());
  return static_cast<int>(diffs.size());
}

int Main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "shoal-page-shots: screenshots of the tracker's cluster page during and after a "
      "real pull, checked against GET /v1/cluster"};
  app.add_option("--out", o.out, "Directory for the PNGs")->required();
  app.add_option("--agents", o.agents, "Agents (nodes)")
      ->check(CLI::Range(2, 16))
      ->capture_default_str();
  app.add_option("--upstream-mibps", o.upstream_mibps, "The upstream link's cap in MiB/s")
      ->check(CLI::Range(0.1, 1000.0))
      ->capture_default_str();
  app.add_option("--from", o.from,
                 "Mid-pull: the shots are taken once the nodes hold this share "
                 "of the image (of nodes x size)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--to", o.to, "... and before they hold this share")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  fs::create_directories(o.out);
  o.out = fs::canonical(o.out).string();

  TempDir dir("shoal-page-shots");
  {
    std::lock_guard<std::mutex> lock(g_dir_mu);
    g_dir = dir.path();
  }
  CountedUpstream upstream = Must(CountedUpstream::Start(), "docker-registry");
  // The pulled image: small files, a 40 MiB file (about 20 MiB compressed) and a zstd layer;
  // the prefetched one is smaller.
  ImageSpec pulled;
  pulled.layers = {LayerSpec{Compression::kGzip, 20, {}, 1},
                   LayerSpec{Compression::kGzip, 2, {40ull << 20}, 2},
                   LayerSpec{Compression::kZstd, 10, {8ull << 20}, 3}};
  ImageSpec prefetched;
  prefetched.layers = {LayerSpec{Compression::kGzip, 10, {6ull << 20}, 11},
                       LayerSpec{Compression::kGzip, 5, {}, 12}};
  BuiltImage image = Must(BuildImage(pulled, dir.Sub("pulled"), kPulledTag), "build image");
  BuiltImage side = Must(BuildImage(prefetched, dir.Sub("prefetched"), kPrefetchedTag), "build");
  if (auto st = PushImage(*upstream.registry, image.layout_dir, kPulledTag, kPulled); !st)
    throw HarnessError("push: " + st.error().ToString());
  if (auto st = PushImage(*upstream.registry, side.layout_dir, kPrefetchedTag, kPrefetched); !st)
    throw HarnessError("push: " + st.error().ToString());
  upstream.proxy->SetRateLimit(static_cast<uint64_t>(o.upstream_mibps * (1 << 20)));

  // Leases and agents must outlive the freeze: nothing may expire while the cluster stands still.
  auto tracker =
      Must(TrackerProcess::Start({"--lease-ttl-s", "300", "--prefetch-agent-ttl-s", "300"}),
           "shoal-tracker");
  std::vector<std::unique_ptr<Agent>> agents;
  for (int i = 0; i < o.agents; ++i) {
    AgentOptions a;
    a.cache_dir = dir.Sub("cache" + std::to_string(i));
    a.upstreams = {"docker.io=" + upstream.proxy->Url()};
    char node[32];
    std::snprintf(node, sizeof(node), "gpu-node-%02d", i + 1);
    a.extra_args = {"--tracker",   tracker->Url(), "--swarm-listen",
                    "127.0.0.1:0", "--agent-id",   std::string(node) + "-agent",
                    "--node-name", node,           "--log-level",
                    "info"};
    agents.push_back(Must(Agent::Start(a), std::string("shoal-agent ") + node));
  }
  if (!WaitUntil([&] { return View(*tracker)["agents"]["live"] == o.agents; }, seconds(30),
                 milliseconds(200))) {
    throw HarnessError("the agents did not all poll the tracker");
  }
  const std::string reference = std::string("docker.io/") + kPulled + ":" + kPulledTag;
  std::printf(
      "shoal-page-shots: %d agents; %s (%s) pulled by skopeo through every agent, "
      "docker.io/%s:%s (%s) prefetched by a cluster job; upstream capped at %.1f MiB/s\n",
      o.agents, reference.c_str(), Mib(static_cast<double>(image.total_blob_bytes)).c_str(),
      kPrefetched, kPrefetchedTag, Mib(static_cast<double>(side.total_blob_bytes)).c_str(),
      o.upstream_mibps);
  std::fflush(stdout);

  // The job first, then every node's pull at once.
  Result<std::string> job = MakeError(ErrorCode::kInternal, "not run");
  std::thread prefetch([&] {
    job = RunCommand({SHOAL_CTL_BIN, "prefetch", std::string(kPrefetched) + ":" + kPrefetchedTag,
                      "--cluster", "--tracker", tracker->Url(), "--operator-token-file",
                      Tokens().operator_file, "--timeout", "10m", "--json"},
                     seconds(900));
  });
  std::vector<Result<LayoutImage>> pulls(agents.size(), MakeError(ErrorCode::kInternal, "not run"));
  std::vector<std::thread> clients;
  for (size_t i = 0; i < agents.size(); ++i) {
    clients.emplace_back([&, i] {
      pulls[i] = SkopeoCopyToLayout(agents[i]->HostPort() + "/" + kPulled + ":" + kPulledTag,
                                    dir.Sub("pull" + std::to_string(i)));
    });
  }
  auto join = [&] {
    for (auto& t : clients) t.join();
    prefetch.join();
  };
  // On a harness error while the clients run: stop every child, so that their threads end.
  struct Joiner {
    std::function<void()> join;
    bool joined = false;
    ~Joiner() {
      if (joined) return;
      KillAllChildren();
      join();
    }
  } joiner{join};

  // Mid-pull: the nodes hold between `from` and `to` of nodes x size.
  json mid;
  double share = 0;
  const bool seen = WaitUntil(
      [&] {
        mid = View(*tracker);
        const json im = ImageOf(mid, reference);
        if (im.is_null() || im["size"] == 0) return false;
        const double target =
            (im["nodes_done"].get<double>() + im["nodes_in_progress"].get<double>()) *
            im["size"].get<double>();
        share = target > 0 ? im["held_bytes"].get<double>() / target : 0;
        return share >= o.from && share < o.to && im["nodes_done"] < o.agents;
      },
      seconds(600), milliseconds(100));
  int failures = 0;
  if (!seen) {
    throw HarnessError("the pull never stood between --from and --to (last share " +
                       std::to_string(share) + "); try a lower --upstream-mibps");
  }
  for (auto& a : agents) ::kill(a->pid(), SIGSTOP);
  // Let what they sent just before the stop reach the tracker.
  std::this_thread::sleep_for(milliseconds(500));
  const json before = View(*tracker);
  const json frozen = Frozen(before);
  Describe("mid-pull", before, reference);
  std::fflush(stdout);
  failures += Shoot(*tracker, dir, o.out, "cluster-page-desktop.png", 1280, 900, &frozen);
  failures += Shoot(*tracker, dir, o.out, "cluster-page-phone.png", 390, 844, &frozen);
  for (auto& a : agents) ::kill(a->pid(), SIGCONT);

  joiner.joined = true;
  join();
  for (size_t i = 0; i < pulls.size(); ++i) {
    if (!pulls[i])
      throw HarnessError("pull through agent " + std::to_string(i) + ": " +
                         pulls[i].error().ToString() + "\n" + agents[i]->LogTail());
    if (pulls[i].value().manifest_digest != image.manifest_digest)
      throw HarnessError("pull through agent " + std::to_string(i) + " got another manifest");
  }
  if (!job) throw HarnessError("shoalctl prefetch --cluster: " + job.error().ToString());
  // Done: the image complete on every node (agents announce a chunk's completion right after it).
  json done;
  if (!WaitUntil(
          [&] {
            done = View(*tracker);
            const json im = ImageOf(done, reference);
            return !im.is_null() && im["complete"] == true && im["nodes_done"] == o.agents;
          },
          seconds(30), milliseconds(200))) {
    throw HarnessError("the image is not complete on every node in the view: " +
                       ImageOf(done, reference).dump());
  }
  Describe("done", done, reference);
  std::printf("upstream served %s of blobs for %s of images (%.2fx)\n",
              Mib(static_cast<double>(upstream.proxy->BlobBytes())).c_str(),
              Mib(static_cast<double>(image.total_blob_bytes + side.total_blob_bytes)).c_str(),
              static_cast<double>(upstream.proxy->BlobBytes()) /
                  static_cast<double>(image.total_blob_bytes + side.total_blob_bytes));
  std::fflush(stdout);
  failures += Shoot(*tracker, dir, o.out, "cluster-page-desktop-done.png", 1280, 900, nullptr);
  failures += Shoot(*tracker, dir, o.out, "cluster-page-phone-done.png", 390, 844, nullptr);
  if (failures) {
    std::printf("shoal-page-shots: %d checks failed\n", failures);
    return 1;
  }
  std::printf("shoal-page-shots: every check passed; PNGs in %s\n", o.out.c_str());
  return 0;
}

}  // namespace
}  // namespace shoal::testkit

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  shoal::testkit::HandleInterruptsOnThread([](int sig) {
    std::fprintf(stderr, "\nshoal-page-shots: interrupted (signal %d), cleaning up\n", sig);
    shoal::testkit::KillAllChildren();
    std::string dir;
    {
      std::lock_guard<std::mutex> lock(shoal::testkit::g_dir_mu);
      dir = shoal::testkit::g_dir;
    }
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    std::_Exit(130);
  });
  try {
    return shoal::testkit::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nshoal-page-shots: %s\n", e.what());
    shoal::testkit::KillAllChildren();
    return 1;
  }
}
