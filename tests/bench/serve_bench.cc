// shoal-bench-serve: how fast shoal-agent serves one large blob, next to a baseline measured in
// the same run on the same machine with the same client.
//
//   cached: the blob is complete in the agent's cache; the agent (sendfile) vs nginx (sendfile)
//           serving the very same file, with 1 and 8 concurrent clients.
//   cold:   a fresh cache per run; the agent fetches from docker-registry with parallel Range
//           requests while streaming to the client, vs the client reading straight from
//           docker-registry. Tried with several --range-streams values. With
//           --upstream-ms-per-mib both sides read docker-registry through the same throttling
//           proxy (a delay per MiB on each connection), which models a network-limited upstream
//           instead of a loopback one.
//
// Also reports the agent's peak RSS (VmHWM) and CPU time (utime+stime), the baselines' CPU time
// and how busy the whole machine was. Everything runs on 127.0.0.1 in temp dirs that are removed
// at the end. This is a program, not a test: it is never registered with ctest.

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <utility>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/blob_get.h"
#include "tests/support/counting_proxy.h"
#include "tests/support/image.h"
#include "tests/support/proc_stats.h"
#include "tests/support/process.h"
#include "tests/support/registry.h"

namespace shoal::testkit {
namespace {

namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr char kRepo[] = "bench/blob";
// A response that makes no progress for this long fails the run.
constexpr auto kStallTimeout = std::chrono::seconds(60);
// No single response may take longer than this.
constexpr auto kRequestTimeout = std::chrono::seconds(900);

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---- Ctrl-C: finish cleanly (stop daemons, remove temp dirs); a second one exits at once. ----

std::atomic<bool> g_stop{false};

void OnSignal(int sig) {
  if (g_stop.exchange(true)) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

void InstallSignalHandlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

// ---- Clients ----------------------------------------------------------------------------------

// One GET of the whole blob (the native client is tests/support/blob_get.h).
using Fetch = BlobGet;

Fetch NativeGet(uint16_t port, const std::string& target, uint64_t expect_size) {
  BlobGetOptions o;
  o.timeout = kRequestTimeout;
  o.stall = kStallTimeout;
  o.stop = &g_stop;
  o.user_agent = "shoal-bench-serve";
  return GetBlob(port, target, expect_size, o);
}

// The same GET with a curl process writing to /dev/null.
Fetch CurlGet(uint16_t port, const std::string& target, uint64_t expect_size) {
  Fetch f;
  std::string url = "http://127.0.0.1:" + std::to_string(port) + target;
  auto out = RunCommand(
      {"curl", "-s", "-S", "-o", "/dev/null", "--max-time", std::to_string(kRequestTimeout.count()),
       "-w", "%{http_code} %{size_download} %{time_total} %{time_starttransfer}", url},
      kRequestTimeout + std::chrono::seconds(10));
  if (!out) {
    f.error = out.error().ToString();
    return f;
  }
  std::istringstream in(out.value());
  int status = 0;
  in >> status >> f.bytes >> f.seconds >> f.ttfb_s;
  if (status != 200)
    f.error = "HTTP status " + std::to_string(status) + " from " + url;
  else if (expect_size != 0 && f.bytes != expect_size) {
    f.error =
        "curl got " + std::to_string(f.bytes) + " bytes, expected " + std::to_string(expect_size);
  }
  return f;
}

// ---- Measurements -----------------------------------------------------------------------------

// One measured run: `clients` concurrent GETs of the whole blob. CPU figures are utime+stime
// during the run.
struct Run {
  double mbps = 0;  // aggregate: all body bytes / wall time (MB = 10^6 bytes)
  double wall_s = 0;
  double gib = 0;             // body bytes received, in GiB
  double server_cpu_s = 0;    // the server measured (agent, nginx, or docker-registry)
  double upstream_cpu_s = 0;  // docker-registry while it fed a cold agent; 0 otherwise
  double client_cpu_s = 0;    // the clients: this process's threads, or the curl processes
  double machine_busy_s = 0;  // busy time of all cores together
  double machine_s = 0;       // wall time x cores
  double ttfb_s = 0;          // slowest client
  double last_byte_s = 0;     // slowest client; native client only
  std::vector<std::string> errors;

  // The server's CPU as a share of one core.
  double ServerCorePct() const { return 100 * server_cpu_s / wall_s; }
  // The server's CPU seconds per GiB served.
  double ServerSecPerGib() const { return server_cpu_s / gib; }
  // Share of the whole machine busy with something other than the server, its upstream and
  // the clients: other engineers' builds, kernel threads.
  double OtherPct() const {
    double ours = server_cpu_s + upstream_cpu_s + client_cpu_s;
    return machine_s == 0 ? 0 : std::max(0.0, 100 * (machine_busy_s - ours) / machine_s);
  }
};

json ToJson(const Run& r) {
  return {{"mb_per_s", r.mbps},
          {"wall_s", r.wall_s},
          {"server_cpu_s", r.server_cpu_s},
          {"server_cpu_s_per_gib", r.ServerSecPerGib()},
          {"upstream_cpu_s", r.upstream_cpu_s},
          {"client_cpu_s", r.client_cpu_s},
          {"machine_busy_pct", r.machine_s == 0 ? 0 : 100 * r.machine_busy_s / r.machine_s},
          {"other_load_pct", r.OtherPct()},
          {"ttfb_s", r.ttfb_s},
          {"last_byte_wait_s", r.last_byte_s}};
}

class Bench {
 public:
  Bench(std::string client, uint64_t size) : client_(std::move(client)), size_(size) {}

  // Runs `clients` concurrent GETs of target on port. server_cpu() returns the server's CPU
  // seconds so far, upstream_cpu() (may be empty) those of the server's upstream.
  Run Measure(uint16_t port, const std::string& target, int clients,
              const std::function<double()>& server_cpu,
              const std::function<double()>& upstream_cpu = {}) const {
    std::vector<Fetch> fetches(static_cast<size_t>(clients));
    std::latch ready(clients + 1);
    std::vector<std::thread> threads;
    for (int i = 0; i < clients; ++i) {
      threads.emplace_back([&, i] {
        ready.arrive_and_wait();
        fetches[static_cast<size_t>(i)] =
            client_ == "curl" ? CurlGet(port, target, size_) : NativeGet(port, target, size_);
      });
    }
    double server0 = server_cpu(), upstream0 = upstream_cpu ? upstream_cpu() : 0;
    double client0 = SelfAndChildrenCpuSeconds();
    SystemTicks ticks0 = ReadSystemTicks();
    auto start = Clock::now();
    ready.arrive_and_wait();
    for (auto& t : threads) t.join();
    Run run;
    run.wall_s = Seconds(Clock::now() - start);
    SystemTicks ticks1 = ReadSystemTicks();
    run.server_cpu_s = server_cpu() - server0;
    run.upstream_cpu_s = upstream_cpu ? upstream_cpu() - upstream0 : 0;
    run.client_cpu_s = SelfAndChildrenCpuSeconds() - client0;
    run.machine_busy_s = TicksToSeconds(ticks1.busy - ticks0.busy);
    run.machine_s = TicksToSeconds(ticks1.total - ticks0.total);
    uint64_t bytes = 0;
    for (const auto& f : fetches) {
      bytes += f.bytes;
      run.ttfb_s = std::max(run.ttfb_s, f.ttfb_s);
      run.last_byte_s = std::max(run.last_byte_s, f.last_byte_s);
      if (!f.error.empty()) run.errors.push_back(f.error);
    }
    run.mbps = static_cast<double>(bytes) / 1e6 / run.wall_s;
    run.gib = static_cast<double>(bytes) / (1ull << 30);
    return run;
  }

 private:
  std::string client_;
  uint64_t size_;
};

// The median run by MB/s (the upper middle one for an even count); runs keep their order.
Run MedianRun(const std::vector<Run>& runs) {
  std::vector<Run> sorted = runs;
  std::sort(sorted.begin(), sorted.end(),
            [](const Run& a, const Run& b) { return a.mbps < b.mbps; });
  return sorted[sorted.size() / 2];
}

// One row of the table: the agent vs a baseline in one scenario.
struct Row {
  std::string scenario;
  std::string baseline;
  std::vector<Run> shoal;
  std::vector<Run> base;
  uint64_t agent_peak_rss = 0;  // max VmHWM of the agents of this row
};

// ---- Daemons ----------------------------------------------------------------------------------

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

// A running shoal-agent (stopped by Process's destructor) and the port it bound.
struct AgentProc {
  std::unique_ptr<Process> process;
  uint16_t port = 0;
};

// Starts `binary` on 127.0.0.1 port 0 with docker.io mapped to upstream_url plus `extra`
// arguments, log in dir/<name>.log, and waits until GET /v2/ answers. Errors: kUnavailable with
// the log tail.
Result<AgentProc> StartAgent(const std::string& binary, const TempDir& dir, const std::string& name,
                             const std::string& cache_dir, const std::string& upstream_url,
                             const std::vector<std::string>& extra) {
  std::string port_file = dir.Sub(name + ".port");
  std::filesystem::remove(port_file);
  std::vector<std::string> argv = {binary,         "--listen",   "127.0.0.1:0",
                                   "--port-file",  port_file,    "--cache-dir",
                                   cache_dir,      "--upstream", "docker.io=" + upstream_url,
                                   "--log-format", "text"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto proc = Process::Start(argv, dir.Sub(name + ".log"));
  if (!proc) return proc.error();
  AgentProc agent;
  agent.process = std::move(proc.value());
  bool ready = WaitUntil([&] { return !agent.process->Running() || !ReadFile(port_file).empty(); },
                         std::chrono::seconds(30));
  std::string port = Trim(ReadFile(port_file));
  if (!ready || port.empty() || !agent.process->Running()) {
    return MakeError(ErrorCode::kUnavailable,
                     "shoal-agent did not start:\n" + agent.process->LogTail());
  }
  agent.port = static_cast<uint16_t>(std::stoi(port));
  if (!WaitForHttp("http://127.0.0.1:" + port + "/v2/", std::chrono::seconds(30))) {
    return MakeError(ErrorCode::kUnavailable,
                     "shoal-agent does not answer GET /v2/:\n" + agent.process->LogTail());
  }
  return agent;
}

// A running nginx master (its workers are its children) and its port.
struct NginxProc {
  std::unique_ptr<Process> process;
  uint16_t port = 0;
};

// An nginx.conf serving `root` as static files with sendfile, like Debian's default config minus
// the access log, with every path under `prefix`. As root, the workers must stay root: as nobody
// they could not read the agent's cache in a 0700 temp dir.
std::string NginxConfig(const std::string& prefix, const std::string& root, uint16_t port,
                        const std::string& workers) {
  return fmt::format(R"({user}worker_processes {workers};
error_log {prefix}/error.log warn;
pid {prefix}/nginx.pid;
events {{ worker_connections 256; }}
http {{
  access_log off;
  sendfile on;
  tcp_nopush on;
  tcp_nodelay on;
  keepalive_timeout 5;
  default_type application/octet-stream;
  client_body_temp_path {prefix}/tmp/body;
  proxy_temp_path {prefix}/tmp/proxy;
  fastcgi_temp_path {prefix}/tmp/fastcgi;
  uwsgi_temp_path {prefix}/tmp/uwsgi;
  scgi_temp_path {prefix}/tmp/scgi;
  server {{
    listen 127.0.0.1:{port};
    location / {{ root {root}; }}
  }}
}}
)",
                     fmt::arg("user", geteuid() == 0 ? "user root;\n" : ""),
                     fmt::arg("workers", workers), fmt::arg("prefix", prefix),
                     fmt::arg("port", port), fmt::arg("root", root));
}

// Starts nginx with NginxConfig on a free port and waits until it answers. Errors: kUnavailable
// with nginx's error log.
Result<NginxProc> StartNginx(const TempDir& dir, const std::string& root,
                             const std::string& workers) {
  std::string prefix = dir.Sub("nginx");
  std::filesystem::create_directories(prefix + "/tmp");
  for (int attempt = 0; attempt < 5; ++attempt) {
    uint16_t port = FreePort();
    std::string conf = prefix + "/nginx.conf";
    WriteFile(conf, NginxConfig(prefix, root, port, workers));
    auto proc = Process::Start(
        {"nginx", "-e", prefix + "/error.log", "-c", conf, "-p", prefix, "-g", "daemon off;"},
        dir.Sub("nginx.log"));
    if (!proc) return proc.error();
    NginxProc n{std::move(proc.value()), port};
    std::string url = "http://127.0.0.1:" + std::to_string(port) + "/";
    bool up = WaitUntil(
        [&] { return !n.process->Running() || WaitForHttp(url, std::chrono::milliseconds(100)); },
        std::chrono::seconds(20));
    if (up && n.process->Running()) return n;
    n.process->Stop();
  }
  return MakeError(ErrorCode::kUnavailable,
                   "nginx did not start; " + ReadFile(prefix + "/error.log"));
}

// ---- Output -----------------------------------------------------------------------------------

std::string Mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

std::string Fixed(double v, int decimals) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

void PrintTable(const std::vector<Row>& rows, double goal) {
  std::printf("\n%-28s %8s  %-15s %6s %6s %6s  %-13s %-13s %6s\n", "scenario", "shoal", "baseline",
              "", "ratio", "goal", "shoal CPU", "base CPU", "other");
  std::printf("%-28s %8s  %-15s %6s %6s %6s  %-13s %-13s %6s\n", "", "MB/s", "", "MB/s", "", "",
              "core s/GiB", "core s/GiB", "load");
  for (const Row& row : rows) {
    const Run s = MedianRun(row.shoal);
    const Run b = MedianRun(row.base);
    double ratio = s.mbps / b.mbps;
    std::printf("%-28s %8.0f  %-15s %6.0f %6.2f %6s  %4.0f%% %6.2f  %4.0f%% %6.2f  %5.0f%%\n",
                row.scenario.c_str(), s.mbps, row.baseline.c_str(), b.mbps, ratio,
                ratio >= goal ? "met" : "MISSED", s.ServerCorePct(), s.ServerSecPerGib(),
                b.ServerCorePct(), b.ServerSecPerGib(), s.OtherPct());
  }
  std::printf(
      "\nMB/s: all clients' body bytes / wall time (10^6 bytes/s), median of the runs; ratio =\n"
      "shoal / baseline. CPU: the server's utime+stime as a share of one core over the run, and "
      "in\n"
      "seconds per GiB served. Other load: share of the whole machine (all cores) that was busy "
      "with\n"
      "neither server, upstream nor clients during the median shoal run (e.g. other builds).\n");
  std::printf("\nevery run, MB/s (in the order they ran):\n");
  for (const Row& row : rows) {
    std::string shoal, base;
    for (const Run& r : row.shoal) shoal += " " + Fixed(r.mbps, 0);
    for (const Run& r : row.base) base += " " + Fixed(r.mbps, 0);
    std::printf("  %-28s shoal%s | %s%s\n", row.scenario.c_str(), shoal.c_str(),
                row.baseline.c_str(), base.c_str());
  }
}

json RowJson(const Row& row, double goal) {
  json shoal = json::array(), base = json::array();
  for (const Run& r : row.shoal) shoal.push_back(ToJson(r));
  for (const Run& r : row.base) base.push_back(ToJson(r));
  const Run s = MedianRun(row.shoal);
  const Run b = MedianRun(row.base);
  return {{"scenario", row.scenario},
          {"baseline", row.baseline},
          {"shoal_median", ToJson(s)},
          {"baseline_median", ToJson(b)},
          {"ratio", s.mbps / b.mbps},
          {"goal_met", s.mbps / b.mbps >= goal},
          {"agent_peak_rss_bytes", row.agent_peak_rss},
          {"shoal_runs", shoal},
          {"baseline_runs", base}};
}


// ---- Main -------------------------------------------------------------------------------------

int Fail(const std::string& what) {
  std::fprintf(stderr, "\nshoal-bench-serve: %s\n", what.c_str());
  return 1;
}

int Main(int argc, char** argv) {
  CLI::App app{
      "shoal-bench-serve: blob serving throughput of shoal-agent vs nginx (cached) and "
      "vs docker-registry (cold), with the agent's peak RSS and CPU"};
  uint64_t size_mib = 1024;
  int repeat = 3;
  std::vector<int> clients = {1, 8};
  std::vector<int> cold_streams = {4, 1};
  std::string client = "native";
  std::string nginx_workers = "auto";
  std::string json_path;
  std::string agent_bin = SHOAL_AGENT_BIN;
  std::vector<std::string> agent_args;
  bool keep = false;
  bool no_cached = false, no_cold = false;
  double goal = 0.9;
  app.add_option("--size-mib", size_mib, "Size of the blob (MiB)")
      ->check(CLI::Range(1, 16384))
      ->capture_default_str();
  app.add_option("--repeat", repeat, "Runs per measurement (the median is reported)")
      ->check(CLI::Range(1, 99))
      ->capture_default_str();
  app.add_option("--clients", clients, "Concurrent clients for the cached blob")
      ->check(CLI::Range(1, 256))
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--cold-streams", cold_streams, "--range-streams values to try for the cold blob")
      ->check(CLI::Range(1, 64))
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--client", client, "native (C++ socket client) or curl (curl -o /dev/null)")
      ->check(CLI::IsMember({"native", "curl"}))
      ->capture_default_str();
  app.add_option("--nginx-workers", nginx_workers, "nginx worker_processes")->capture_default_str();
  app.add_option("--agent", agent_bin, "shoal-agent binary")->capture_default_str();
  app.add_option("--agent-arg", agent_args, "Extra shoal-agent argument (repeatable)");
  app.add_option("--json", json_path, "Also write the results as JSON to this file");
  app.add_flag("--no-cached", no_cached, "Skip the cached-blob measurements");
  app.add_flag("--no-cold", no_cold, "Skip the cold-blob measurements");
  int upstream_ms_per_mib = 0;
  app.add_option("--upstream-ms-per-mib", upstream_ms_per_mib,
                 "Cold runs: put a throttling proxy (this delay per MiB on each connection) "
                 "between docker-registry and both the agent and the baseline client; 0 = none")
      ->check(CLI::Range(0, 10000))
      ->capture_default_str();
  app.add_flag("--keep", keep, "Keep the temp dir (registry storage, caches, logs)");
  CLI11_PARSE(app, argc, argv);
  if (keep) setenv("SHOAL_KEEP_TMP", "1", 1);
  spdlog::set_level(spdlog::level::warn);
  InstallSignalHandlers();
  for (const char* tool : {"nginx", "docker-registry", "skopeo", "curl"}) {
    if (!RunCommand({"sh", "-c", std::string("command -v ") + tool}, std::chrono::seconds(10))) {
      return Fail(std::string(tool) + " is not installed (scripts/setup.sh installs it)");
    }
  }
  if (!std::filesystem::exists(agent_bin)) {
    return Fail(agent_bin + " does not exist; build the shoal-agent target");
  }

  std::printf("shoal-bench-serve: %llu MiB blob, %d run(s) per figure (median), %s client\n",
              static_cast<unsigned long long>(size_mib), repeat, client.c_str());
  const std::string load_at_start = Trim(ReadFile("/proc/loadavg"));
  std::printf("machine: %s; load average at start: %s\n", MachineSummary().c_str(), load_at_start.c_str());
  TempDir dir("shoal-bench");

  // The blob: one uncompressed layer holding one big file, pushed with skopeo.
  auto t0 = Clock::now();
  auto registry = Registry::Start();
  if (!registry) return Fail("docker-registry: " + registry.error().ToString());
  Registry& reg = *registry.value();
  pid_t reg_pid = reg.pid();
  if (reg_pid == 0) return Fail("cannot find the docker-registry process in /proc");
  ImageSpec spec;
  spec.layers = {LayerSpec{.compression = Compression::kNone,
                           .small_files = 0,
                           .big_files = {size_mib << 20},
                           .seed = 7,
                           .with_symlink_and_hardlink = false}};
  auto image = BuildImage(spec, dir.Sub("layout"), "1");
  if (!image) return Fail("image build: " + image.error().ToString());
  if (auto st = PushImage(reg, image.value().layout_dir, "1", kRepo); !st) {
    return Fail("push: " + st.error().ToString());
  }
  std::filesystem::remove_all(dir.Sub("layout"));
  if (g_stop) return Fail("interrupted");
  const Digest digest = image.value().layer_digests[0];
  const uint64_t size = image.value().layer_sizes[0];
  const std::string target = std::string("/v2/") + kRepo + "/blobs/" + digest.str();
  std::printf("blob: %s, %llu bytes, built and pushed to docker-registry in %.1f s\n",
              digest.str().c_str(), static_cast<unsigned long long>(size),
              Seconds(Clock::now() - t0));

  // The upstream as the cold runs see it: docker-registry itself or a throttling proxy.
  std::unique_ptr<CountingProxy> throttle;
  uint16_t upstream_port = reg.port();
  std::string upstream_url = reg.Url();
  std::string upstream_name = "docker-registry";
  if (upstream_ms_per_mib > 0) {
    auto proxy = CountingProxy::Start(reg.HostPort());
    if (!proxy) return Fail("throttling proxy: " + proxy.error().ToString());
    throttle = std::move(proxy.value());
    throttle->SetDelayPerMiB(std::chrono::milliseconds(upstream_ms_per_mib));
    const std::string hp = throttle->HostPort();
    upstream_port = static_cast<uint16_t>(std::stoi(hp.substr(hp.rfind(':') + 1)));
    upstream_url = throttle->Url();
    upstream_name = "registry, throttled";
    std::printf("cold runs read docker-registry through a proxy that waits %d ms per MiB on each "
                "connection\n",
                upstream_ms_per_mib);
  }

  Bench bench(client, size);
  std::vector<Row> rows;
  uint64_t peak_rss = 0;
  auto check = [&](const Run& r, const std::string& what) -> std::optional<std::string> {
    if (g_stop) return "interrupted";
    if (r.errors.empty()) return std::nullopt;
    return what + ": " + r.errors.front();
  };

  // ---- Cached: the agent and nginx serve the same file from the page cache. ----
  if (!no_cached) {
    std::string cache = dir.Sub("cache");
    auto agent = StartAgent(agent_bin, dir, "agent-cached", cache, reg.Url(), agent_args);
    if (!agent) return Fail(agent.error().ToString());
    AgentProc& a = agent.value();
    std::printf("filling the agent's cache (one cold GET) ... ");
    std::fflush(stdout);
    Run fill = bench.Measure(a.port, target, 1, [] { return 0.0; });
    if (auto e = check(fill, "cache fill")) return Fail(*e + "\n" + a.process->LogTail());
    std::string blob_dir = cache + "/blobs/sha256/" + digest.hex().substr(0, 2);
    if (!WaitUntil([&] { return std::filesystem::exists(blob_dir + "/" + digest.hex()); },
                   std::chrono::seconds(60))) {
      return Fail("the agent did not cache " + digest.str() + " under " + blob_dir);
    }
    std::printf("%.0f MB/s\n", fill.mbps);
    auto nginx = StartNginx(dir, blob_dir, nginx_workers);
    if (!nginx) return Fail(nginx.error().ToString());
    NginxProc& n = nginx.value();
    pid_t agent_pid = a.process->pid(), nginx_pid = n.process->pid();
    for (int c : clients) {
      Row row{
          "cached, " + std::to_string(c) + (c == 1 ? " client" : " clients"), "nginx", {}, {}, 0};
      for (int i = 0; i < repeat; ++i) {
        std::printf("%s, run %d/%d ... ", row.scenario.c_str(), i + 1, repeat);
        std::fflush(stdout);
        // Alternate who goes first so that a burst of other load does not always hit one side.
        for (int side = 0; side < 2; ++side) {
          bool shoal_turn = (side == 0) == (i % 2 == 0);
          if (shoal_turn) {
            Run r = bench.Measure(a.port, target, c, [&] { return ProcessCpuSeconds(agent_pid); });
            if (auto e = check(r, "shoal " + row.scenario)) return Fail(*e);
            row.shoal.push_back(r);
          } else {
            Run r = bench.Measure(n.port, "/" + digest.hex(), c,
                                  [&] { return TreeCpuSeconds(nginx_pid); });
            if (auto e = check(r, "nginx " + row.scenario)) return Fail(*e);
            row.base.push_back(r);
          }
        }
        std::printf("shoal %.0f MB/s, nginx %.0f MB/s\n", row.shoal.back().mbps,
                    row.base.back().mbps);
      }
      row.agent_peak_rss = StatusBytes(agent_pid, "VmHWM");
      rows.push_back(std::move(row));
    }
    peak_rss = std::max(peak_rss, StatusBytes(agent_pid, "VmHWM"));
    std::printf("agent after the cached runs: VmHWM %s, VmRSS %s\n",
                Mib(StatusBytes(agent_pid, "VmHWM")).c_str(),
                Mib(StatusBytes(agent_pid, "VmRSS")).c_str());
    n.process->Stop();
    a.process->Stop();
    std::filesystem::remove_all(cache);
  }

  // ---- Cold: a fresh agent and cache per run vs reading straight from docker-registry. ----
  if (!no_cold && !cold_streams.empty()) {
    Row base_row{"cold, 1 client", upstream_name, {}, {}, 0};
    std::vector<Row> stream_rows;
    for (int s : cold_streams) {
      stream_rows.push_back(
          Row{"cold, 1 client, streams=" + std::to_string(s), upstream_name, {}, {}, 0});
    }
    for (int i = 0; i < repeat; ++i) {
      std::printf("cold, run %d/%d ... ", i + 1, repeat);
      std::fflush(stdout);
      Run r = bench.Measure(upstream_port, target, 1, [&] { return ProcessCpuSeconds(reg_pid); });
      if (auto e = check(r, "docker-registry")) return Fail(*e);
      base_row.base.push_back(r);
      std::printf("registry %.0f MB/s", r.mbps);
      for (size_t k = 0; k < cold_streams.size(); ++k) {
        std::string name = "agent-cold-" + std::to_string(i) + "-" + std::to_string(k);
        TempDir cache("shoal-bench-cache");
        std::vector<std::string> args = agent_args;
        args.push_back("--range-streams");
        args.push_back(std::to_string(cold_streams[k]));
        auto agent = StartAgent(agent_bin, dir, name, cache.path(), upstream_url, args);
        if (!agent) return Fail(agent.error().ToString());
        pid_t pid = agent.value().process->pid();
        Run ar = bench.Measure(
            agent.value().port, target, 1, [&] { return ProcessCpuSeconds(pid); },
            [&] { return ProcessCpuSeconds(reg_pid); });
        if (auto e = check(ar, "shoal cold")) {
          return Fail(*e + "\n" + agent.value().process->LogTail());
        }
        uint64_t hwm = StatusBytes(pid, "VmHWM");
        stream_rows[k].agent_peak_rss = std::max(stream_rows[k].agent_peak_rss, hwm);
        peak_rss = std::max(peak_rss, hwm);
        stream_rows[k].shoal.push_back(ar);
        std::printf(", streams=%d %.0f MB/s (last byte +%.2f s)", cold_streams[k], ar.mbps,
                    ar.last_byte_s);
        std::fflush(stdout);
        agent.value().process->Stop();
      }
      std::printf("\n");
    }
    for (Row& row : stream_rows) {
      row.base = base_row.base;
      rows.push_back(std::move(row));
    }
  }

  PrintTable(rows, goal);
  std::printf("\nagent peak RSS (max VmHWM over all agents): %s; goal < 200 MB: %s\n",
              Mib(peak_rss).c_str(), peak_rss < 200'000'000 ? "met" : "MISSED");
  for (const Row& row : rows) {
    if (row.scenario.rfind("cold", 0) != 0) continue;
    const Run s = MedianRun(row.shoal);
    const Run b = MedianRun(row.base);
    std::printf(
        "%s: first byte after %.3f s; the last byte came %.3f s after the one before it\n"
        "  (the agent holds it back until the digest matched and the blob is committed).\n"
        "  CPU per GiB: agent %.2f s + docker-registry %.2f s + client %.2f s = %.2f s, vs\n"
        "  docker-registry %.2f s + client %.2f s = %.2f s straight from the registry.\n",
        row.scenario.c_str(), s.ttfb_s, s.last_byte_s, s.server_cpu_s / s.gib,
        s.upstream_cpu_s / s.gib, s.client_cpu_s / s.gib,
        (s.server_cpu_s + s.upstream_cpu_s + s.client_cpu_s) / s.gib, b.server_cpu_s / b.gib,
        b.client_cpu_s / b.gib, (b.server_cpu_s + b.client_cpu_s) / b.gib);
  }

  if (!json_path.empty()) {
    json out = {{"benchmark", "shoal-bench-serve"},
                {"machine", MachineSummary()},
                {"blob_bytes", size},
                {"repeat", repeat},
                {"client", client},
                {"load_average_at_start", load_at_start},
                {"nginx_workers", nginx_workers},
                {"agent", agent_bin},
                {"agent_args", agent_args},
                {"goal_ratio", goal},
                {"agent_peak_rss_bytes", peak_rss},
                {"rows", json::array()}};
    for (const Row& row : rows) out["rows"].push_back(RowJson(row, goal));
    WriteFile(json_path, out.dump(2) + "\n");
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace shoal::testkit

int main(int argc, char** argv) {
  try {
    return shoal::testkit::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shoal-bench-serve: %s\n", e.what());
    return 1;
  }
}
