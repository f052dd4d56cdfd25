// shoal-demo: a small cluster on loopback: a real docker-registry upstream (behind a counting
// proxy), shoal-tracker, and three shoal-agents. A generated multi-layer image with a >= 256 MiB
// layer is pulled with skopeo through every agent at once (a cold cluster), then once more
// through one agent (warm). Prints, per pull and agent, the time and the bytes that came from
// upstream, from peers and from the agent's cache, and whether every pulled blob re-hashed to
// its digest. Exits non-zero on any failure.

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "tests/support/counting_proxy.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"
#include "tests/support/tokens.h"
#include "tests/support/tracker.h"

namespace shoal::testkit {
namespace {

using Clock = std::chrono::steady_clock;

std::mutex g_dir_mu;
std::string g_dir;  // GUARDED_BY(g_dir_mu): the demo's temp dir, for the interrupt thread
// Set on SIGINT/SIGTERM/SIGHUP: the main thread stops at the next step and cleans up.
std::atomic<bool> g_interrupted{false};
constexpr int kInterruptedExit = 130;

struct Interrupted {};

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (bytes >= 1024 && u < 3) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

const char* CompressionName(Compression c) {
  switch (c) {
    case Compression::kNone:
      return "tar";
    case Compression::kGzip:
      return "gzip";
    case Compression::kZstd:
      return "zstd";
  }
  return "?";
}

// Prints a step and its duration.
class Step {
 public:
  explicit Step(const std::string& what) : start_(Clock::now()) {
    if (g_interrupted) throw Interrupted{};
    std::printf("- %s ... ", what.c_str());
    std::fflush(stdout);
  }
  void Done(const std::string& detail = "") {
    std::printf("ok (%.2f s)%s%s\n", Seconds(Clock::now() - start_), detail.empty() ? "" : ": ",
                detail.c_str());
  }

 private:
  Clock::time_point start_;
};

int Fail(const std::string& what, const std::string& detail) {
  if (g_interrupted) throw Interrupted{};
  std::printf("FAILED\n\nshoal-demo: %s\n%s\n", what.c_str(), detail.c_str());
  return 1;
}

struct PullResult {
  size_t agent = 0;
  double seconds = 0;
  double upstream_bytes = 0;  // agent metric delta: shoal_upstream_blob_bytes_total
  double peer_bytes = 0;      // agent metric delta: shoal_swarm_peer_bytes_total
  double cache_bytes = 0;     // agent metric delta: shoal_shim_blob_bytes_total{source="cache"}
  bool verified = false;
  std::string error;
};

// The running agent: its process and the port it bound.
struct AgentProc {
  std::unique_ptr<Process> process;
  std::string host_port;
  std::string Url() const { return "http://" + host_port; }
  std::string Metrics() const {
    auto r = HttpGet(Url() + "/metrics", {}, std::chrono::seconds(10));
    return r && r.value().status == 200 ? r.value().body : "";
  }
};

Result<AgentProc> StartAgent(const std::string& binary, const TempDir& dir, size_t index,
                             const std::string& upstream_url, const std::string& tracker_url) {
  std::string name = "agent" + std::to_string(index);
  std::string port_file = dir.Sub(name + ".port");
  std::vector<std::string> argv = {binary,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--port-file",
                                   port_file,
                                   "--cache-dir",
                                   dir.Sub(name + "-cache"),
                                   "--upstream",
                                   "docker.io=" + upstream_url,
                                   "--tracker",
                                   tracker_url,
                                   "--tracker-token-file",
                                   Tokens().agent_file,
                                   "--peer-ca-cert",
                                   Tokens().peer_ca_cert,
                                   "--peer-ca-key",
                                   Tokens().peer_ca_key,
                                   "--swarm-listen",
                                   "127.0.0.1:0",
                                   "--agent-id",
                                   name,
                                   "--log-format",
                                   "text"};
  auto proc = Process::Start(argv, dir.Sub(name + ".log"));
  if (!proc) return proc.error();
  AgentProc agent;
  agent.process = std::move(proc.value());
  bool ready = WaitUntil([&] { return !agent.process->Running() || !ReadFile(port_file).empty(); },
                         std::chrono::seconds(30));
  std::string port = ReadFile(port_file);
  while (!port.empty() && (port.back() == '\n' || port.back() == ' ')) port.pop_back();
  if (!ready || port.empty() || !agent.process->Running()) {
    return MakeError(ErrorCode::kUnavailable, "shoal-agent did not start; log " +
                                                  agent.process->log_path() + ":\n" +
                                                  agent.process->LogTail());
  }
  agent.host_port = "127.0.0.1:" + port;
  if (!WaitForHttp(agent.Url() + "/v2/", std::chrono::seconds(30))) {
    return MakeError(ErrorCode::kUnavailable,
                     "shoal-agent does not answer GET /v2/; log:\n" + agent.process->LogTail());
  }
  return agent;
}

double Delta(const std::string& before, const std::string& after, const char* metric,
             const std::map<std::string, std::string>& labels = {}) {
  return MetricSum(after, metric, labels) - MetricSum(before, metric, labels);
}

PullResult Pull(const AgentProc& agent, size_t index, const BuiltImage& image,
                const std::string& out_dir) {
  PullResult r;
  r.agent = index;
  std::string before = agent.Metrics();
  auto start = Clock::now();
  auto copied = Skopeo({"copy", "--quiet", "--src-tls-verify=false", "--preserve-digests",
                        "docker://" + agent.host_port + "/demo/app:1", "oci:" + out_dir + ":1"});
  r.seconds = Seconds(Clock::now() - start);
  std::string after = agent.Metrics();
  r.upstream_bytes = Delta(before, after, "shoal_upstream_blob_bytes_total");
  r.peer_bytes = Delta(before, after, "shoal_swarm_peer_bytes_total");
  r.cache_bytes = Delta(before, after, "shoal_shim_blob_bytes_total", {{"source", "cache"}});
  if (!copied) {
    r.error = copied.error().ToString();
    return r;
  }
  // Verification (not timed): every pulled blob re-hashes to its name, and the digests equal
  // what was pushed upstream.
  auto blobs = LayoutBlobDigests(out_dir);
  if (!blobs) {
    r.error = blobs.error().ToString();
    return r;
  }
  auto pulled = ReadLayout(out_dir, "1");
  if (!pulled) {
    r.error = pulled.error().ToString();
    return r;
  }
  const LayoutImage& got = pulled.value();
  if (got.manifest_digest != image.manifest_digest || got.config_digest != image.config_digest ||
      got.layer_digests != image.layer_digests ||
      blobs.value().size() != image.layer_digests.size() + 2) {
    r.error = "pulled digests differ from upstream: manifest " + got.manifest_digest.str() +
              " vs " + image.manifest_digest.str();
    return r;
  }
  r.verified = true;
  return r;
}

int Run(int argc, char** argv) {
  CLI::App app{
      "shoal-demo: a cold cluster pull and a warm pull of a generated image through shoal"};
  std::string agent_bin = SHOAL_AGENT_BIN;
  uint64_t big_mib = 256;
  bool keep = false;
  size_t num_agents = 3;
  app.add_option("--agents", num_agents, "Number of agents in the demo cluster")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--agent", agent_bin, "shoal-agent binary")->capture_default_str();
  app.add_option("--big-layer-mib", big_mib,
                 "Compressed size of the big layer in MiB (its file is twice as large: the "
                 "generated content compresses about 2x)")
      ->check(CLI::Range(1, 8192))
      ->capture_default_str();
  app.add_flag("--keep", keep, "Keep the temp dir (registry storage, cache, logs)");
  CLI11_PARSE(app, argc, argv);
  if (keep) setenv("SHOAL_KEEP_TMP", "1", 1);
  spdlog::set_level(spdlog::level::warn);

  std::printf(
      "shoal demo: docker-registry -> counting proxy -> shoal-agents (+ shoal-tracker) -> "
      "skopeo\n\n");
  TempDir dir("shoal-demo");
  {
    std::lock_guard<std::mutex> lock(g_dir_mu);
    g_dir = dir.path();
  }
  // Every other temp dir (registry storage, skopeo's scratch files) goes inside it, so one
  // removal cleans up, also after Ctrl-C.
  setenv("TMPDIR", dir.path().c_str(), 1);

  Step s1("starting docker-registry (distribution) on 127.0.0.1");
  auto registry = Registry::Start();
  if (!registry) return Fail("docker-registry", registry.error().ToString());
  auto proxy = CountingProxy::Start(registry.value()->HostPort());
  if (!proxy) return Fail("counting proxy", proxy.error().ToString());
  s1.Done(registry.value()->HostPort() + ", counting proxy " + proxy.value()->HostPort());

  ImageSpec spec;
  spec.layers = {
      LayerSpec{.compression = Compression::kGzip, .small_files = 200, .seed = 1},
      LayerSpec{.compression = Compression::kGzip,
                .small_files = 20,
                .big_files = {24ull << 20},
                .seed = 2,
                .with_whiteout = true},
      LayerSpec{.compression = Compression::kZstd,
                .small_files = 50,
                .big_files = {16ull << 20},
                .seed = 3},
      LayerSpec{.compression = Compression::kGzip,
                .small_files = 5,
                // A little over 2x so that the gzip blob itself is >= big_mib MiB.
                .big_files = {(big_mib << 21) + (big_mib << 15)},
                .seed = 4},
  };
  Step s2("building a " + std::to_string(spec.layers.size()) + "-layer OCI image");
  auto image = BuildImage(spec, dir.Sub("layout"), "1");
  if (!image) return Fail("image build", image.error().ToString());
  const BuiltImage& img = image.value();
  s2.Done(HumanBytes(static_cast<double>(img.total_blob_bytes)) + " of blobs");
  for (size_t i = 0; i < img.layer_digests.size(); ++i) {
    std::printf("    layer %zu  %-4s  %10s  %s\n", i + 1,
                CompressionName(spec.layers[i].compression),
                HumanBytes(static_cast<double>(img.layer_sizes[i])).c_str(),
                img.layer_digests[i].str().substr(0, 19).c_str());
  }

  Step s3("pushing it with skopeo as demo/app:1");
  if (auto st = PushImage(*registry.value(), img.layout_dir, "1", "demo/app"); !st) {
    return Fail("push", st.error().ToString());
  }
  s3.Done(img.manifest_digest.str().substr(0, 19));

  Step s4("starting shoal-tracker and " + std::to_string(num_agents) + " shoal-agents");
  if (!std::filesystem::exists(agent_bin)) {
    return Fail("shoal-agent", agent_bin + " does not exist; build the shoal-agent target");
  }
  // Small chunks so that a few hundred MiB spread over several upstream leases and peers.
  auto tracker = TrackerProcess::Start({"--chunk-size-kib", "16384", "--piece-size-kib", "1024"});
  if (!tracker) return Fail("shoal-tracker", tracker.error().ToString());
  std::vector<AgentProc> agents;
  for (size_t i = 0; i < num_agents; ++i) {
    auto agent = StartAgent(agent_bin, dir, i, proxy.value()->Url(), tracker.value()->Url());
    if (!agent) return Fail("shoal-agent", agent.error().ToString());
    agents.push_back(std::move(agent.value()));
  }
  std::string where = "tracker " + tracker.value()->Url() + ", agents";
  for (const auto& a : agents) where += " " + a.host_port;
  s4.Done(where);

  // Pull 1: every agent at once on a cold cluster. Pull 2: agent 0 again (warm cache).
  std::vector<std::vector<PullResult>> rounds;
  Step p1("pull 1: skopeo copy docker://<agent>/demo/app:1 on all " + std::to_string(num_agents) +
          " agents at once");
  proxy.value()->Reset();
  auto cold_start = Clock::now();
  std::vector<PullResult> cold(agents.size());
  {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < agents.size(); ++i) {
      threads.emplace_back([&, i] {
        cold[i] = Pull(agents[i], i, img, dir.Sub("pull1-agent" + std::to_string(i)));
      });
    }
    for (auto& t : threads) t.join();
  }
  double cold_seconds = Seconds(Clock::now() - cold_start);
  uint64_t cold_upstream = proxy.value()->BlobBytes();
  for (const auto& r : cold) {
    if (!r.error.empty()) {
      return Fail("pull 1 on agent " + std::to_string(r.agent),
                  r.error + "\n\nagent log tail:\n" + agents[r.agent].process->LogTail());
    }
  }
  p1.Done();
  rounds.push_back(cold);

  Step p2("pull 2: the same image again through agent 0");
  proxy.value()->Reset();
  PullResult warm = Pull(agents[0], 0, img, dir.Sub("pull2-agent0"));
  uint64_t warm_upstream = proxy.value()->BlobBytes();
  if (!warm.error.empty()) {
    return Fail("pull 2", warm.error + "\n\nagent log tail:\n" + agents[0].process->LogTail());
  }
  p2.Done();
  rounds.push_back({warm});

  const double total = static_cast<double>(img.total_blob_bytes);
  std::printf("\n%-5s %-6s %9s %9s %15s %15s %15s %9s\n", "pull", "agent", "time", "MiB/s",
              "from upstream", "from peers", "from cache", "verified");
  for (size_t round = 0; round < rounds.size(); ++round) {
    for (const PullResult& r : rounds[round]) {
      std::printf("%-5zu %-6zu %7.2f s %9.0f %15s %15s %15s %9s\n", round + 1, r.agent, r.seconds,
                  total / (1 << 20) / r.seconds, HumanBytes(r.upstream_bytes).c_str(),
                  HumanBytes(r.peer_bytes).c_str(), HumanBytes(r.cache_bytes).c_str(),
                  r.verified ? "yes" : "NO");
    }
  }
  std::printf(
      "\nimage blobs: %s (config + %zu layers). Pull 1 on %zu agents took %.2f s; the upstream\n"
      "served %s for it (%.2fx the image, counted at the proxy). Per-agent columns are each\n"
      "agent's metrics: shoal_upstream_blob_bytes_total, shoal_swarm_peer_bytes_total and\n"
      "shoal_shim_blob_bytes_total{source=\"cache\"}.\n",
      HumanBytes(total).c_str(), img.layer_digests.size(), agents.size(), cold_seconds,
      HumanBytes(static_cast<double>(cold_upstream)).c_str(),
      static_cast<double>(cold_upstream) / total);

  // What the demo claims: a cold cluster fetched the image from upstream about once, and a warm
  // agent needs nothing from anywhere but its cache.
  std::vector<std::string> problems;
  if (static_cast<double>(cold_upstream) > 1.1 * total) {
    problems.push_back("pull 1 took " + std::to_string(cold_upstream) +
                       " bytes from upstream, more than 1.1x the image's " +
                       std::to_string(img.total_blob_bytes));
  }
  if (warm_upstream != 0) {
    problems.push_back("pull 2 took " + std::to_string(warm_upstream) +
                       " bytes from upstream, expected 0");
  }
  if (static_cast<uint64_t>(warm.cache_bytes) != img.total_blob_bytes) {
    problems.push_back("pull 2 served " + std::to_string(warm.cache_bytes) +
                       " bytes from cache (agent metrics), expected " +
                       std::to_string(img.total_blob_bytes));
  }
  if (!problems.empty()) {
    std::printf("\nshoal-demo: FAILED\n");
    for (const auto& p : problems) std::printf("  - %s\n", p.c_str());
    std::printf("logs: %s (rerun with --keep to keep them)\n", dir.path().c_str());
    return 1;
  }
  std::printf(
      "\nshoal-demo: OK (cold cluster: %.2fx the image from upstream for %zu agents; "
      "warm pull: 0 bytes from upstream)\n",
      static_cast<double>(cold_upstream) / total, agents.size());
  for (auto& a : agents) {
    int status = a.process->Stop();
    if (status != 0 && status != 128 + SIGTERM) {
      std::printf("shoal-demo: note: shoal-agent exited with status %d on SIGTERM\n", status);
    }
  }
  return 0;
}

}  // namespace

// Removes the demo's temp dir unless SHOAL_KEEP_TMP=1 (--keep).
void RemoveDemoDir() {
  std::lock_guard<std::mutex> lock(g_dir_mu);
  const char* keep = std::getenv("SHOAL_KEEP_TMP");
  if (g_dir.empty() || (keep && std::string(keep) == "1")) return;
  std::error_code ec;
  std::filesystem::remove_all(g_dir, ec);
}

}  // namespace shoal::testkit

int main(int argc, char** argv) {
  // Ctrl-C must not leave daemons running or hundreds of MiB in /tmp: block the signals in every
  // thread (children get a clean mask from posix_spawn) and handle them on a thread of their own.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread([signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "\nshoal-demo: interrupted (signal %d), cleaning up\n", sig);
    shoal::testkit::g_interrupted = true;
    // Killing the children makes the step in progress fail; the main thread then unwinds and
    // its destructors remove the temp dir. If it is busy elsewhere (building the image), give
    // it 10 s before cleaning up here.
    for (int i = 0; i < 100; ++i) {
      shoal::testkit::KillAllChildren();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    shoal::testkit::RemoveDemoDir();
    _exit(shoal::testkit::kInterruptedExit);
  }).detach();
  int rc = 1;
  try {
    rc = shoal::testkit::Run(argc, argv);
  } catch (const shoal::testkit::Interrupted&) {
    rc = shoal::testkit::kInterruptedExit;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shoal-demo: %s\n", e.what());
  }
  if (shoal::testkit::g_interrupted) rc = shoal::testkit::kInterruptedExit;
  // _exit, not exit: the interrupt thread may still be running; every temp dir is already gone.
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(rc);
}
