// shoal-bench-swarm: N nodes pull the same image at once over shaped links, in three scenarios
// measured in the same run with the same N, links and image:
//
//   shoal:   shoal-tracker + one shoal-agent per node; every node pulls through its own agent,
//            its peers connected over TLS with certificates from the cluster's peer CA.
//   shoal-plain: the same with plain TCP peers (--insecure-peers): what peer TLS costs.
//   direct:  every node pulls straight from the upstream registry.
//   central: one docker-registry in proxy mode (pull-through cache) in front of the upstream;
//            every node pulls through it, over a link of B like a node's.
//   central-nginx: the strongest central cache users deploy: nginx with proxy_cache_lock (a cold
//            blob crosses the upstream link once however many nodes ask; the others wait for
//            it to be complete), on a link of its own as fast as a server's (--cache-mbit).
//
// A node's pull that fails is retried (--pull-attempts, the same for every scenario; its time
// counts from the common start, retries included); a node that fails every attempt is reported
// as failed (and left out of the times) instead of aborting the run.
//
// The network is built from Linux network namespaces (addresses in 198.18.0.0/15 only): a
// "switch" namespace with a bridge; every node, the tracker and the central cache connect to it
// with a veth shaped to B in both directions (tbf on both ends); the upstream registry connects
// with ONE veth shaped to U (the shared NAT link to the registry). The client is
// `skopeo copy docker://... oci:...` inside each node's namespace.
//
// Reported per scenario: p50/p99/max per-node completion time (also as a ratio to the physical
// limit max(S/B, S/U)), the bytes the upstream registry transmitted on its link divided by the
// image size S, and CPU use (the whole machine from /proc/stat, each daemon from /proc/PID/stat,
// the clients from getrusage) so that a reader can tell whether the machine was CPU-bound. For
// shoal also the time to a client's first blob byte on a cold cluster (a separate cold run).
//
// Needs root (ip netns, veth, bridge, tc). Every namespace, link and process is removed at the
// end, also on failure and on Ctrl-C; namespaces left by a crashed run (prefix "shoalb-") are
// removed at start. This is a program, not a test: it is never registered with ctest.

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <utility>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <latch>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "lib/swarm/session.h"
#include "tests/support/http_client.h"
#include "tests/support/image.h"
#include "tests/support/proc_stats.h"
#include "tests/support/process.h"
#include "tests/support/tokens.h"

namespace shoal::testkit {
namespace {

namespace fs = std::filesystem;
namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr char kPrefix[] = "shoalb-";  // every namespace this program creates
constexpr char kRepo[] = "demo/app";
constexpr char kTag[] = "1";
constexpr char kUpstreamIp[] = "198.18.0.1";
constexpr char kTrackerIp[] = "198.18.0.2";
constexpr char kCacheIp[] = "198.18.0.3";
constexpr char kNginxCacheIp[] = "198.18.0.4";
constexpr int kRegistryPort = 5000;
constexpr int kTrackerPort = 7070;
constexpr int kSwarmPort = 6881;
constexpr int kInterruptedExit = 130;
constexpr auto kStallTimeout = std::chrono::seconds(60);  // first-byte client: no progress

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

std::string Fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Fmt(const char* format, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(buf, sizeof(buf), format, ap);
  va_end(ap);
  return buf;
}

std::string Mib(double bytes) { return Fmt("%.1f MiB", bytes / (1 << 20)); }

// A failure of the harness itself (not a missed goal): printed, exit status 1.
struct HarnessError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Ctrl-C: unwind, clean up, exit 130.
struct Interrupted {};

// ---- Interrupts and cleanup --------------------------------------------------------------------

std::atomic<bool> g_interrupted{false};
std::mutex g_cleanup_mu;
std::string g_dir;  // GUARDED_BY(g_cleanup_mu): the run's temp dir, for the interrupt thread

// The autogroup nice to put back at exit (--nice changes it), if it was changed.
std::atomic<int> g_autogroup_restore{std::numeric_limits<int>::min()};

// With CONFIG_SCHED_AUTOGROUP every session is one scheduling group and a task's nice only
// counts inside its group, so --nice also sets the nice of this session's group.
std::optional<int> AutogroupNice() {
  std::string text = ReadFile("/proc/self/autogroup");  // "/autogroup-21 nice 0"
  auto pos = text.find(" nice ");
  if (pos == std::string::npos) return std::nullopt;
  return std::atoi(text.c_str() + pos + 6);
}

void RestoreAutogroupNice() {
  int old = g_autogroup_restore.exchange(std::numeric_limits<int>::min());
  if (old == std::numeric_limits<int>::min()) return;
  std::ofstream("/proc/self/autogroup") << old;
}

void CheckInterrupted() {
  if (g_interrupted) throw Interrupted{};
}

std::string NetnsPath(const std::string& name) { return "/run/netns/" + name; }

// Names of the namespaces in /run/netns that start with kPrefix.
std::vector<std::string> OurNamespaces() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/run/netns", ec)) {
    std::string name = e.path().filename();
    if (name.rfind(kPrefix, 0) == 0) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Processes whose network namespace is the named one.
std::vector<pid_t> PidsInNetns(const std::string& name) {
  std::vector<pid_t> out;
  struct stat ns {};
  if (::stat(NetnsPath(name).c_str(), &ns) != 0) return out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    std::string pid = e.path().filename();
    if (pid.empty() || !std::all_of(pid.begin(), pid.end(), ::isdigit)) continue;
    struct stat st {};
    if (::stat(("/proc/" + pid + "/ns/net").c_str(), &st) != 0) continue;
    if (st.st_ino == ns.st_ino && st.st_dev == ns.st_dev) out.push_back(std::stoi(pid));
  }
  return out;
}

// Kills every process in the namespace and deletes it the way `ip netns del` does (detach the
// bind mount, unlink). Its devices (veth ends, bridge) go with it; a veth's peer goes too. Uses
// no child processes, so it is safe from the interrupt thread while children are being killed.
void DeleteNetns(const std::string& name) {
  for (int round = 0; round < 50; ++round) {
    auto pids = PidsInNetns(name);
    if (pids.empty()) break;
    for (pid_t p : pids) kill(p, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string path = NetnsPath(name);
  umount2(path.c_str(), MNT_DETACH);
  unlink(path.c_str());
}

void DeleteOurNamespaces() {
  std::lock_guard<std::mutex> lock(g_cleanup_mu);
  for (const auto& name : OurNamespaces()) DeleteNetns(name);
}

void RemoveRunDir() {
  std::lock_guard<std::mutex> lock(g_cleanup_mu);
  const char* keep = std::getenv("SHOAL_KEEP_TMP");
  if (g_dir.empty() || (keep && std::string(keep) == "1")) return;
  std::error_code ec;
  fs::remove_all(g_dir, ec);
}

// Runs `f` on a thread that has joined the named network namespace (the network namespace is
// per thread), so sockets it opens live there. Rethrows f's exceptions.
template <class F>
auto InNetns(const std::string& ns, F&& f) -> decltype(f()) {
  using R = decltype(f());
  std::optional<R> result;
  std::exception_ptr error;
  std::thread t([&] {
    try {
      int fd = ::open(NetnsPath(ns).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw HarnessError("open " + NetnsPath(ns) + ": " + std::strerror(errno));
      int rc = ::setns(fd, CLONE_NEWNET);
      int err = errno;
      ::close(fd);
      if (rc != 0) throw HarnessError("setns " + ns + ": " + std::strerror(err));
      result.emplace(f());
    } catch (...) {
      error = std::current_exception();
    }
  });
  t.join();
  if (error) std::rethrow_exception(error);
  return std::move(*result);
}

// Runs a command (ip, tc, ...) that must succeed.
std::string Must(const std::vector<std::string>& argv,
                 std::chrono::seconds timeout = std::chrono::seconds(60)) {
  CheckInterrupted();
  auto out = RunCommand(argv, timeout);
  CheckInterrupted();
  if (!out) throw HarnessError(out.error().ToString());
  return out.value();
}

// ---- /proc readers ----------------------------------------------------------------------------

// Samples the machine's busy share every 500 ms while alive.
class BusySampler {
 public:
  BusySampler() : thread_([this] { Loop(); }) {}
  ~BusySampler() { Stop(); }
  std::vector<double> Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return samples_;
  }

 private:
  void Loop() {
    SystemTicks prev = ReadSystemTicks();
    while (!stop_) {
      for (int i = 0; i < 5 && !stop_; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      SystemTicks now = ReadSystemTicks();
      if (now.total > prev.total) {
        samples_.push_back(static_cast<double>(now.busy - prev.busy) /
                           static_cast<double>(now.total - prev.total));
      }
      prev = now;
    }
  }
  std::atomic<bool> stop_{false};
  std::vector<double> samples_;
  std::thread thread_;
};

// Byte counters of every device of one namespace, sampled every 250 ms by a thread that joined
// it (it reads /proc/thread-self/net/dev, which shows the calling thread's namespace).
struct LinkSample {
  double t = 0;                                                // seconds since the sampler started
  std::map<std::string, std::pair<uint64_t, uint64_t>> bytes;  // device -> (rx, tx)
};

std::map<std::string, std::pair<uint64_t, uint64_t>> ReadNetDev() {
  std::map<std::string, std::pair<uint64_t, uint64_t>> out;
  std::istringstream in(ReadFile("/proc/thread-self/net/dev"));
  for (std::string line; std::getline(in, line);) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    std::istringstream fields(line.substr(colon + 1));
    std::vector<uint64_t> v;
    for (uint64_t x; fields >> x;) v.push_back(x);
    if (v.size() >= 9) out[name] = {v[0], v[8]};
  }
  return out;
}

class LinkSampler {
 public:
  LinkSampler(const std::string& ns, Clock::time_point origin)
      : thread_([this, ns, origin] { Loop(ns, origin); }) {}
  ~LinkSampler() { Stop(); }
  std::vector<LinkSample> Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return samples_;
  }

 private:
  void Loop(const std::string& ns, Clock::time_point origin) {
    int fd = ::open(NetnsPath(ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    int rc = ::setns(fd, CLONE_NEWNET);
    ::close(fd);
    if (rc != 0) return;
    for (;;) {
      samples_.push_back(LinkSample{Seconds(Clock::now() - origin), ReadNetDev()});
      if (stop_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }
  std::atomic<bool> stop_{false};
  std::vector<LinkSample> samples_;
  std::thread thread_;
};

// ---- The network ------------------------------------------------------------------------------

struct Endpoint {
  std::string ns;      // namespace name
  std::string ip;      // address of its eth0
  std::string sw_dev;  // the veth end in the switch namespace
  int mbit = 0;        // shaping of both directions
};

// /proc path of net.ipv4.neigh.default.gc_thresh<i+1>.
std::string NeighbourPath(int i) {
  return "/proc/sys/net/ipv4/neigh/default/gc_thresh" + std::to_string(i + 1);
}

std::vector<long> g_neighbour_restore;  // GUARDED_BY(g_cleanup_mu): gc_thresh1..3 to put back

// Puts back the neighbour table limits NeighbourLimits raised (also from the interrupt thread).
void RestoreNeighbourLimits() {
  std::lock_guard<std::mutex> lock(g_cleanup_mu);
  for (size_t i = 0; i < g_neighbour_restore.size(); ++i) {
    try {
      WriteFile(NeighbourPath(static_cast<int>(i)), std::to_string(g_neighbour_restore[i]) + "\n");
    } catch (const std::exception&) {
    }
  }
  g_neighbour_restore.clear();
}

// The kernel's neighbour (ARP) table is one for all namespaces, 1,024 entries by default
// (gc_thresh3), and every namespace here learns every other it talks to: past about 30 nodes
// it overflows ("neighbor table overflow!" in dmesg), ARP answers are dropped and connects time
// out, which is what the seed's cluster hit (docs/operations.md; `shoalctl node setup` raises
// them on real nodes). Raised for the run when too small for `endpoints`, restored after.
class NeighbourLimits {
 public:
  explicit NeighbourLimits(size_t endpoints) {
    const long needed = static_cast<long>(endpoints * endpoints + 256);
    std::vector<long> old;
    for (int i = 0; i < 3; ++i) {
      try {
        old.push_back(std::stol(Trim(ReadFile(NeighbourPath(i)))));
      } catch (const std::exception&) {
        return;  // not readable here: leave them alone
      }
    }
    if (old[2] >= needed) return;
    const long raised[3] = {std::max(old[0], needed / 2), std::max(old[1], needed),
                            std::max(old[2], 2 * needed)};
    {
      std::lock_guard<std::mutex> lock(g_cleanup_mu);
      g_neighbour_restore = old;
    }
    for (int i = 0; i < 3; ++i) WriteFile(NeighbourPath(i), std::to_string(raised[i]) + "\n");
    std::printf("neighbour table: gc_thresh1..3 %ld/%ld/%ld -> %ld/%ld/%ld for %zu namespaces "
                "(restored at exit)\n",
                old[0], old[1], old[2], raised[0], raised[1], raised[2], endpoints);
  }
  ~NeighbourLimits() { RestoreNeighbourLimits(); }
  NeighbourLimits(const NeighbourLimits&) = delete;
  NeighbourLimits& operator=(const NeighbourLimits&) = delete;
};

// Namespaces, the bridge and the shaped veths. The destructor deletes every namespace (which
// removes the veths and the bridge with it).
class Network {
 public:
  Network() = default;
  ~Network() { DeleteOurNamespaces(); }
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  std::string switch_ns = std::string(kPrefix) + "sw";

  void CreateSwitch() {
    AddNetns(switch_ns);
    Must({"ip", "-n", switch_ns, "link", "add", "br0", "type", "bridge"});
    // Forward at once (no STP, no learning delay): a plain learning switch.
    Must({"ip", "-n", switch_ns, "link", "set", "br0", "type", "bridge", "forward_delay", "0",
          "stp_state", "0"});
    Must({"ip", "-n", switch_ns, "link", "set", "br0", "up"});
    Must({"ip", "-n", switch_ns, "link", "set", "lo", "up"});
  }

  // A namespace with eth0 = ip/16, connected to the bridge by a veth shaped to mbit both ways.
  Endpoint Attach(const std::string& short_name, const std::string& ip, int mbit) {
    Endpoint e{std::string(kPrefix) + short_name, ip, short_name, mbit};
    AddNetns(e.ns);
    Must({"ip", "link", "add", e.sw_dev, "netns", switch_ns, "type", "veth", "peer", "name", "eth0",
          "netns", e.ns});
    Must({"ip", "-n", switch_ns, "link", "set", e.sw_dev, "master", "br0", "up"});
    Must({"ip", "-n", e.ns, "addr", "add", ip + "/16", "dev", "eth0"});
    Must({"ip", "-n", e.ns, "link", "set", "eth0", "up"});
    Must({"ip", "-n", e.ns, "link", "set", "lo", "up"});
    Shape(switch_ns, e.sw_dev, mbit);  // towards the endpoint (its download)
    Shape(e.ns, "eth0", mbit);         // from the endpoint (its upload)
    return e;
  }

 private:
  void AddNetns(const std::string& name) {
    std::lock_guard<std::mutex> lock(g_cleanup_mu);
    CheckInterrupted();
    auto out = RunCommand({"ip", "netns", "add", name}, std::chrono::seconds(30));
    if (!out) throw HarnessError(out.error().ToString());
  }

  // tbf: rate, a burst of at least 128 KiB (a 64 KiB GSO packet must fit) or 2 ms at the rate,
  // and a queue of 20 ms.
  static void Shape(const std::string& ns, const std::string& dev, int mbit) {
    uint64_t burst =
        std::max<uint64_t>(128 * 1024, static_cast<uint64_t>(mbit) * 1'000'000 / 8 / 500);
    Must({"tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
          std::to_string(mbit) + "mbit", "burst", std::to_string(burst), "latency", "20ms"});
  }
};

// A counter of /sys/class/net/<dev>/statistics inside a namespace.
uint64_t NetCounter(const std::string& ns, const std::string& dev, const std::string& counter) {
  std::string out =
      Must({"ip", "netns", "exec", ns, "cat", "/sys/class/net/" + dev + "/statistics/" + counter});
  return std::stoull(Trim(out));
}

// TCP segments and tbf drops over a run: where bytes beyond S on the wire come from besides
// framing (segments sent again after a drop at a shaped link) and what the shaped links dropped.
struct NetStats {
  uint64_t node_segs = 0, node_retrans = 0;  // TCP segments the nodes sent, and sent again
  uint64_t reg_segs = 0, reg_retrans = 0;    // the same for the upstream registry
  uint64_t up_pkts = 0, up_drops = 0;        // the nodes' uplinks (tbf on their eth0)
  uint64_t down_pkts = 0, down_drops = 0;    // the nodes' downlinks (tbf on the switch's ends)
  uint64_t reg_drops = 0;                    // the registry's uplink
  NetStats operator-(const NetStats& o) const {
    return {node_segs - o.node_segs, node_retrans - o.node_retrans, reg_segs - o.reg_segs,
            reg_retrans - o.reg_retrans,       up_pkts - o.up_pkts,     up_drops - o.up_drops,
            down_pkts - o.down_pkts,           down_drops - o.down_drops, reg_drops - o.reg_drops};
  }
};

// (OutSegs, RetransSegs) from /proc/net/snmp inside `ns`.
std::pair<uint64_t, uint64_t> TcpSegments(const std::string& ns) {
  std::istringstream in(Must({"ip", "netns", "exec", ns, "cat", "/proc/net/snmp"}));
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Tcp:", 0) != 0) continue;
    std::istringstream fields(line.substr(4));
    std::vector<std::string> v{std::istream_iterator<std::string>(fields), {}};
    if (names.empty()) {
      names = v;
      continue;
    }
    uint64_t out = 0, retrans = 0;
    for (size_t i = 0; i < names.size() && i < v.size(); ++i) {
      if (names[i] == "OutSegs") out = std::stoull(v[i]);
      if (names[i] == "RetransSegs") retrans = std::stoull(v[i]);
    }
    return {out, retrans};
  }
  throw HarnessError("no Tcp: counters in /proc/net/snmp of " + ns);
}

// Per device in `ns`: (packets sent, packets dropped) by its root qdisc, from `tc -s qdisc`.
std::map<std::string, std::pair<uint64_t, uint64_t>> QdiscCounters(const std::string& ns) {
  std::map<std::string, std::pair<uint64_t, uint64_t>> out;
  std::istringstream in(Must({"tc", "-s", "-n", ns, "qdisc", "show"}));
  std::string dev;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::vector<std::string> w{std::istream_iterator<std::string>(words), {}};
    if (!w.empty() && w[0] == "qdisc") {
      dev.clear();
      for (size_t i = 0; i + 1 < w.size(); ++i)
        if (w[i] == "dev") dev = w[i + 1];
      continue;
    }
    // " Sent 123 bytes 45 pkt (dropped 6, overlimits 7 requeues 0)"
    if (w.size() >= 7 && w[0] == "Sent" && !dev.empty()) {
      std::string dropped = w[6];
      if (!dropped.empty() && dropped.back() == ',') dropped.pop_back();
      out[dev] = {std::stoull(w[3]), std::stoull(dropped)};
    }
  }
  return out;
}

NetStats ReadNetStats(size_t nodes, const std::string& upstream_ns, const std::string& switch_ns) {
  NetStats s;
  auto sw = QdiscCounters(switch_ns);
  for (size_t i = 0; i < nodes; ++i) {
    std::string dev = "n" + std::to_string(i + 1), ns = std::string(kPrefix) + dev;
    auto [segs, retrans] = TcpSegments(ns);
    s.node_segs += segs;
    s.node_retrans += retrans;
    auto [pkts, drops] = QdiscCounters(ns)["eth0"];
    s.up_pkts += pkts;
    s.up_drops += drops;
    s.down_pkts += sw[dev].first;
    s.down_drops += sw[dev].second;
  }
  std::tie(s.reg_segs, s.reg_retrans) = TcpSegments(upstream_ns);
  s.reg_drops = QdiscCounters(upstream_ns)["eth0"].second;
  return s;
}

// ---- Daemons ----------------------------------------------------------------------------------

struct Paths {
  std::string dir;   // the run's temp dir
  std::string logs;  // dir/logs
  std::string skopeo_registries_conf, skopeo_auth;
};

// docker-registry (distribution) inside `ns`, listening on 0.0.0.0:5000, storage under `root`;
// a pull-through cache of `proxy_remote` when that is non-empty. Waits until /v2/ answers.
std::unique_ptr<Process> StartRegistry(const Paths& p, const std::string& ns,
                                       const std::string& root, const std::string& proxy_remote,
                                       const std::string& log_name) {
  fs::create_directories(root + "/storage");
  std::string cfg;
  cfg += "version: 0.1\n";
  cfg += "log:\n  level: warn\n  formatter: text\n  accesslog:\n    disabled: true\n";
  cfg += "storage:\n  filesystem:\n    rootdirectory: \"" + root + "/storage\"\n";
  cfg += "  delete:\n    enabled: true\n";
  cfg += "  maintenance:\n    uploadpurging:\n      enabled: false\n";
  cfg += "http:\n  addr: 0.0.0.0:" + std::to_string(kRegistryPort) + "\n";
  cfg += "health:\n  storagedriver:\n    enabled: false\n";
  if (!proxy_remote.empty()) cfg += "proxy:\n  remoteurl: \"" + proxy_remote + "\"\n";
  WriteFile(root + "/config.yml", cfg);
  CheckInterrupted();
  auto proc =
      Process::Start({"ip", "netns", "exec", ns, "docker-registry", "serve", root + "/config.yml"},
                     p.logs + "/" + log_name + ".log");
  if (!proc) throw HarnessError(proc.error().ToString());
  std::unique_ptr<Process> reg = std::move(proc.value());
  std::string url = "http://127.0.0.1:" + std::to_string(kRegistryPort) + "/v2/";
  bool up = InNetns(ns, [&] {
    return WaitUntil(
        [&] { return !reg->Running() || WaitForHttp(url, std::chrono::milliseconds(300)); },
        std::chrono::seconds(30));
  });
  CheckInterrupted();
  if (!up || !reg->Running()) {
    throw HarnessError("docker-registry in " + ns + " did not start; log:\n" + reg->LogTail());
  }
  return reg;
}

// nginx inside `ns` as a pull-through cache of `upstream_url` on 0.0.0.0:5000, the way users
// deploy one in front of a registry: every GET under /v2/ is cached on disk (key: path and
// Accept), and proxy_cache_lock makes a cold entry cross the upstream link once: the first
// request streams it from upstream, the others wait until it is complete, then get it from the
// cache. The lock's timeout and age are raised from their 5 s default (past which nginx sends a
// second request upstream, and does not cache its answer) to the pull deadline. Waits until
// /v2/ answers through it.
std::unique_ptr<Process> StartNginxCache(const Paths& p, const std::string& ns,
                                         const std::string& root, const std::string& upstream_url,
                                         int deadline_s) {
  fs::create_directories(root + "/cache");
  const std::string lock_s = std::to_string(std::max(60, deadline_s)) + "s";
  std::string cfg;
  cfg += "user root;\nworker_processes 2;\ndaemon off;\n";
  cfg += "error_log " + root + "/error.log warn;\npid " + root + "/nginx.pid;\n";
  cfg += "events { worker_connections 4096; }\n";
  cfg += "http {\n";
  cfg += "  access_log off;\n  sendfile on;\n  tcp_nopush on;\n";
  cfg += "  client_body_temp_path " + root + "/body;\n  proxy_temp_path " + root + "/proxy;\n";
  cfg += "  fastcgi_temp_path " + root + "/fcgi;\n  uwsgi_temp_path " + root + "/uwsgi;\n";
  cfg += "  scgi_temp_path " + root + "/scgi;\n";
  cfg += "  proxy_cache_path " + root +
         "/cache levels=1:2 keys_zone=registry:16m max_size=64g inactive=1h use_temp_path=off;\n";
  cfg += "  server {\n    listen 0.0.0.0:" + std::to_string(kRegistryPort) + ";\n";
  cfg += "    location /v2/ {\n";
  cfg += "      proxy_pass " + upstream_url + ";\n";
  cfg += "      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n";
  cfg += "      proxy_cache registry;\n      proxy_cache_key \"$uri $http_accept\";\n";
  cfg += "      proxy_cache_valid 200 1h;\n";
  cfg += "      proxy_ignore_headers Cache-Control Expires Set-Cookie Vary X-Accel-Expires;\n";
  cfg += "      proxy_cache_lock on;\n      proxy_cache_lock_timeout " + lock_s +
         ";\n      proxy_cache_lock_age " + lock_s + ";\n";
  cfg += "      proxy_read_timeout " + lock_s + ";\n";
  cfg += "      add_header X-Cache-Status $upstream_cache_status;\n";
  cfg += "    }\n  }\n}\n";
  WriteFile(root + "/nginx.conf", cfg);
  CheckInterrupted();
  auto proc = Process::Start(
      {"ip", "netns", "exec", ns, "nginx", "-e", root + "/error.log", "-c", root + "/nginx.conf",
       "-p", root},
      p.logs + "/central-nginx.log");
  if (!proc) throw HarnessError(proc.error().ToString());
  std::unique_ptr<Process> nginx = std::move(proc.value());
  std::string url = "http://127.0.0.1:" + std::to_string(kRegistryPort) + "/v2/";
  bool up = InNetns(ns, [&] {
    return WaitUntil(
        [&] { return !nginx->Running() || WaitForHttp(url, std::chrono::milliseconds(300)); },
        std::chrono::seconds(30));
  });
  CheckInterrupted();
  if (!up || !nginx->Running()) {
    throw HarnessError("nginx in " + ns + " did not start; error log:\n" +
                       ReadFile(root + "/error.log") + nginx->LogTail());
  }
  return nginx;
}

std::vector<std::string> SkopeoEnv(const Paths& p) {
  return {"CONTAINERS_REGISTRIES_CONF=" + p.skopeo_registries_conf,
          "REGISTRY_AUTH_FILE=" + p.skopeo_auth};
}

// `skopeo --insecure-policy <args>` inside a namespace, isolated from the host's configuration.
Result<std::string> SkopeoIn(const Paths& p, const std::string& ns, std::vector<std::string> args,
                             std::chrono::seconds timeout) {
  std::vector<std::string> argv = {"ip", "netns", "exec", ns, "skopeo", "--insecure-policy"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(std::move(argv), timeout, SkopeoEnv(p));
}

struct AgentProc {
  std::unique_ptr<Process> process;
  std::string ns;
  uint16_t port = 0;
  std::string Url() const { return "http://127.0.0.1:" + std::to_string(port); }
  std::string Metrics() const {
    auto r = InNetns(ns, [&] { return HttpGet(Url() + "/metrics", {}, std::chrono::seconds(10)); });
    return r && r.value().status == 200 ? r.value().body : "";
  }
};

// A tracker and one agent per node, each with an empty cache.
struct ShoalCluster {
  std::unique_ptr<Process> tracker;
  std::vector<AgentProc> agents;

  std::vector<pid_t> AgentPids() const {
    std::vector<pid_t> out;
    for (const auto& a : agents) out.push_back(a.process->pid());
    return out;
  }
  // Stops everything; returns a note for each daemon that did not exit cleanly.
  std::vector<std::string> Stop() {
    std::vector<std::string> notes;
    for (size_t i = 0; i < agents.size(); ++i) {
      int st = agents[i].process->Stop(std::chrono::seconds(10));
      if (st != 0 && st != 128 + SIGTERM) {
        notes.push_back("agent on node " + std::to_string(i + 1) + " exited with status " +
                        std::to_string(st) + " on SIGTERM");
      }
    }
    if (tracker) {
      int st = tracker->Stop(std::chrono::seconds(10));
      if (st != 0 && st != 128 + SIGTERM) {
        notes.push_back("tracker exited with status " + std::to_string(st) + " on SIGTERM");
      }
    }
    return notes;
  }
};

// The tracker's /metrics text ("" if it does not answer).
std::string TrackerMetrics(const Endpoint& tracker_ep) {
  const std::string url = "http://" + tracker_ep.ip + ":" + std::to_string(kTrackerPort) + "/metrics";
  auto r = InNetns(tracker_ep.ns, [&] { return HttpGet(url, {}, std::chrono::seconds(10)); });
  return r && r.value().status == 200 ? r.value().body : "";
}

// The requests a tracker answered between two /metrics texts, by kind: announces over UDP and
// over HTTP, UDP connects, announce batches (--tracker-announce batch), and each blob API route
// (lease, work, ready, renew, publish, ...).
std::map<std::string, double> TrackerRequests(const std::string& before, const std::string& after) {
  std::map<std::string, double> out;
  auto delta = [&](const char* metric, const std::map<std::string, std::string>& labels) {
    return MetricSum(after, metric, labels) - MetricSum(before, metric, labels);
  };
  out["announce (udp)"] = delta("shoal_tracker_udp_requests_total", {{"action", "announce"}});
  out["connect (udp)"] = delta("shoal_tracker_udp_requests_total", {{"action", "connect"}});
  out["announce (http)"] = delta("shoal_tracker_http_requests_total", {{"route", "announce"}});
  out["announce batch"] = delta("shoal_tracker_http_requests_total", {{"route", "announce-batch"}});
  for (const char* route : {"create_blob", "get_blob", "lease", "work", "ready", "release",
                            "renew", "publish", "bad"}) {
    out[route] = delta("shoal_tracker_blob_api_requests_total", {{"route", route}});
  }
  std::erase_if(out, [](const auto& kv) { return kv.second <= 0; });
  return out;
}

// The chunk layout the tracker gave `digest` ("" if it cannot say), e.g. "1 MiB first chunk,
// then doubling to 4 MiB chunks of 512 KiB pieces: 67 chunks".
std::string LayoutOf(const Endpoint& tracker_ep, const Digest& digest) {
  std::string url =
      "http://" + tracker_ep.ip + ":" + std::to_string(kTrackerPort) + "/v1/blobs/" + digest.str();
  auto r = InNetns(tracker_ep.ns, [&] { return HttpGet(url, AgentAuth(), std::chrono::seconds(10)); });
  if (!r || r.value().status != 200) return "";
  json j = json::parse(r.value().body, nullptr, false);
  if (j.is_discarded() || !j.contains("chunk_size") || !j.contains("chunks")) return "";
  auto kib = [](uint64_t b) {
    return b >= (1u << 20) && b % (1u << 20) == 0 ? std::to_string(b >> 20) + " MiB"
                                                  : std::to_string(b >> 10) + " KiB";
  };
  std::string out;
  uint64_t first = j.value("first_chunk_size", uint64_t{0});
  if (first > 0) out += kib(first) + " first chunk, doubling to ";
  out += kib(j["chunk_size"].get<uint64_t>()) + " chunks of " +
         kib(j["piece_size"].get<uint64_t>()) + " pieces: " + std::to_string(j["chunks"].size()) +
         " chunks";
  return out;
}

struct Options {
  // Defaults: see "Choosing N and B" in docs/benchmarks.md (CPU budget of a 2-core machine).
  size_t nodes = 6;
  int node_mbit = 100;
  int upstream_mbit = 50;  // B = 2U: a node link faster than its share of the NAT (docs)
  uint64_t image_mib = 256;
  uint64_t chunk_mib = 16;  // shoal-tracker's defaults: 16 MiB chunks of 1 MiB pieces
  uint64_t piece_kib = 0;   // 0: min(1024, chunk size)
  std::vector<std::string> scenarios = {"shoal", "direct", "central", "central-nginx"};
  int cache_mbit = 0;     // central-nginx's link; 0: 10 x B
  int pull_attempts = 3;  // per node and scenario
  bool first_byte = true;
  bool keep = false;
  int timeout_s = 0;  // 0: derived from the sizes
  std::string agent_bin = SHOAL_AGENT_BIN;
  std::string tracker_bin = SHOAL_TRACKER_BIN;
  std::vector<std::string> agent_args, tracker_args;
  std::string json_path;
  std::string work_dir;
  int nice = 0;
  bool timeline = false;
};

ShoalCluster StartShoal(const Options& o, const Paths& p, const std::vector<Endpoint>& nodes,
                        const Endpoint& tracker_ep, const std::string& upstream_url,
                        const std::string& tag, bool plain_peers = false) {
  ShoalCluster c;
  std::string tdir = p.dir + "/" + tag + "-tracker";
  fs::create_directories(tdir);
  std::vector<std::string> targv = {
      "ip", "netns", "exec", tracker_ep.ns, o.tracker_bin, "--listen",
      tracker_ep.ip + ":" + std::to_string(kTrackerPort), "--port-file", tdir + "/port",
      "--log-format", "text", "--chunk-size-kib", std::to_string(o.chunk_mib * 1024),
      "--piece-size-kib", std::to_string(o.piece_kib),
      // The cluster's tokens, as deployed (issue 14).
      "--agent-tokens-file", Tokens().agent_file, "--operator-tokens-file", Tokens().operator_file};
  if (!plain_peers) targv.insert(targv.end(), {"--peer-ca-cert", Tokens().peer_ca_cert});
  targv.insert(targv.end(), o.tracker_args.begin(), o.tracker_args.end());
  CheckInterrupted();
  auto tproc = Process::Start(targv, p.logs + "/" + tag + "-tracker.log");
  if (!tproc) throw HarnessError(tproc.error().ToString());
  c.tracker = std::move(tproc.value());
  std::string tracker_url = "http://" + tracker_ep.ip + ":" + std::to_string(kTrackerPort);
  bool up = WaitUntil([&] { return !c.tracker->Running() || !ReadFile(tdir + "/port").empty(); },
                      std::chrono::seconds(30)) &&
            c.tracker->Running() && InNetns(tracker_ep.ns, [&] {
              return WaitForHttp(tracker_url + "/healthz", std::chrono::seconds(30));
            });
  CheckInterrupted();
  if (!up) throw HarnessError("shoal-tracker did not start; log:\n" + c.tracker->LogTail());

  for (size_t i = 0; i < nodes.size(); ++i) {
    const Endpoint& n = nodes[i];
    std::string name = tag + "-node" + std::to_string(i + 1);
    std::string port_file = p.dir + "/" + name + ".port";
    fs::remove(port_file);  // an earlier scenario's agent left its port there
    std::vector<std::string> argv = {"ip",
                                     "netns",
                                     "exec",
                                     n.ns,
                                     o.agent_bin,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--port-file",
                                     port_file,
                                     "--cache-dir",
                                     p.dir + "/" + name + "-cache",
                                     "--upstream",
                                     "docker.io=" + upstream_url,
                                     "--tracker",
                                     tracker_url,
                                     "--tracker-token-file",
                                     Tokens().agent_file,
                                     "--swarm-listen",
                                     n.ip + ":" + std::to_string(kSwarmPort),
                                     "--agent-id",
                                     "node" + std::to_string(i + 1),
                                     "--log-format",
                                     "text"};
    if (plain_peers) {
      argv.push_back("--insecure-peers");
    } else {
      argv.insert(argv.end(), {"--peer-ca-cert", Tokens().peer_ca_cert, "--peer-ca-key",
                               Tokens().peer_ca_key});
    }
    argv.insert(argv.end(), o.agent_args.begin(), o.agent_args.end());
    CheckInterrupted();
    auto proc = Process::Start(argv, p.logs + "/" + name + ".log");
    if (!proc) throw HarnessError(proc.error().ToString());
    AgentProc a;
    a.process = std::move(proc.value());
    a.ns = n.ns;
    bool ready = WaitUntil([&] { return !a.process->Running() || !ReadFile(port_file).empty(); },
                           std::chrono::seconds(30));
    std::string port = Trim(ReadFile(port_file));
    CheckInterrupted();
    if (!ready || port.empty() || !a.process->Running()) {
      throw HarnessError("shoal-agent on node " + std::to_string(i + 1) + " did not start; log:\n" +
                         a.process->LogTail());
    }
    a.port = static_cast<uint16_t>(std::stoi(port));
    if (!InNetns(n.ns, [&] { return WaitForHttp(a.Url() + "/v2/", std::chrono::seconds(30)); })) {
      throw HarnessError("shoal-agent on node " + std::to_string(i + 1) +
                         " does not answer GET /v2/; log:\n" + a.process->LogTail());
    }
    c.agents.push_back(std::move(a));
  }
  return c;
}

// ---- Clients ----------------------------------------------------------------------------------

// One node's pull (or GET) in a measured run.
struct NodeRun {
  double seconds = 0;       // common start .. done
  double header_s = 0;      // first-byte run: request .. response header
  double first_byte_s = 0;  // first-byte run: request .. first body byte
  uint64_t bytes = 0;
  int attempts = 1;   // pulls started (retries after a failure)
  std::string error;  // the last attempt's error: the node failed
  std::vector<std::string> retried;  // errors of the attempts that were retried
  // shoal: the node's agent metrics over the run
  double from_upstream = 0, from_peers = 0, leases = 0, stalls = 0, fallbacks = 0;
  double redundant = 0;  // peer payload bytes the node already had (end-game duplicates)
  std::map<std::string, double> wasted;  // shoal_swarm_wasted_bytes_total by reason
};

// GET http://127.0.0.1:port<target> from the calling thread's namespace with a plain socket:
// Beast parses the response header, the body is read into a 1 MiB buffer and discarded. Records
// when the header and the first body byte arrived.
NodeRun TimedGet(uint16_t port, const std::string& target, uint64_t expect_size,
                 Clock::time_point start, Clock::time_point deadline) {
  NodeRun r;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    r.error = std::string("socket: ") + std::strerror(errno);
    return r;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  timeval tv{0, 200'000};  // wake up to notice Ctrl-C and deadlines
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    r.error = "connect 127.0.0.1:" + std::to_string(port) + ": " + std::strerror(errno);
    return r;
  }
  std::string req = "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                    "\r\nUser-Agent: shoal-bench-swarm\r\nConnection: close\r\n\r\n";
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    r.error = std::string("send: ") + std::strerror(errno);
    return r;
  }
  std::vector<char> buf(1 << 20);
  std::string head;
  http::response_parser<http::empty_body> parser;
  parser.eager(false);
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  bool have_header = false;
  uint64_t length = 0;
  auto last_progress = Clock::now();
  for (;;) {
    if (g_interrupted) {
      r.error = "interrupted";
      return r;
    }
    auto now = Clock::now();
    if (now > deadline) {
      r.error = "timed out after " + std::to_string(r.bytes) + " body bytes";
      return r;
    }
    if (now - last_progress > kStallTimeout) {
      r.error = "no progress for 60 s after " + std::to_string(r.bytes) + " body bytes";
      return r;
    }
    ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n < 0) {
      r.error = std::string("recv: ") + std::strerror(errno);
      return r;
    }
    if (n == 0) {
      r.error = "connection closed after " + std::to_string(r.bytes) + " body bytes";
      return r;
    }
    last_progress = Clock::now();
    uint64_t body_now = static_cast<uint64_t>(n);
    if (!have_header) {
      head.append(buf.data(), static_cast<size_t>(n));
      boost::beast::error_code ec;
      size_t used = parser.put(boost::asio::buffer(head), ec);
      if (ec == http::error::need_more) continue;
      if (ec || !parser.is_header_done()) {
        r.error = "bad response header";
        return r;
      }
      have_header = true;
      r.header_s = Seconds(last_progress - start);
      if (parser.get().result_int() != 200) {
        r.error = "HTTP status " + std::to_string(parser.get().result_int());
        return r;
      }
      if (!parser.content_length() || *parser.content_length() != expect_size) {
        r.error = "unexpected Content-Length";
        return r;
      }
      length = *parser.content_length();
      body_now = head.size() - used;
    }
    if (body_now == 0) continue;
    if (r.bytes == 0) r.first_byte_s = Seconds(last_progress - start);
    r.bytes += body_now;
    if (r.bytes >= length) {
      r.seconds = Seconds(Clock::now() - start);
      if (r.bytes > length) r.error = "more body bytes than Content-Length";
      return r;
    }
  }
}

// ---- Measurement ------------------------------------------------------------------------------

// A named group of daemons whose CPU time is reported.
struct CpuGroup {
  std::string name;
  std::vector<pid_t> pids;
  bool with_children = false;  // also count each pid's direct children (nginx's workers)
};

struct Measured {
  std::string name;
  std::vector<NodeRun> nodes;
  double wall_s = 0;         // start .. last node done
  uint64_t upstream_tx = 0;  // bytes the upstream registry's veth transmitted
  uint64_t upstream_rx = 0;  // and received (requests, ACKs)
  double machine_s = 0;      // wall x cores, from /proc/stat
  double busy_s = 0, softirq_s = 0, steal_s = 0, iowait_s = 0;
  std::vector<double> busy_samples;    // 500 ms samples, 0..1
  std::map<std::string, double> cpu;   // core-seconds per group, plus "clients"
  std::map<std::string, double> wait;  // run-queue wait (runnable, no CPU) per group, seconds
  std::vector<LinkSample> links;       // the switch's veth ends over time
  NetStats net;                        // TCP retransmissions and tbf drops over the run
  double pressure_s = 0;               // PSI cpu "some": time some task waited for a CPU
  // shoal: the requests the tracker answered during the pulls, by kind (TrackerRequests)
  std::map<std::string, double> tracker_requests;
  double batched_announces = 0;  // announces inside the "announce batch" requests
  double Ours() const {
    double s = 0;
    for (const auto& [k, v] : cpu) s += v;
    return s;
  }
};

// Runs work(i) for every node i at once (released together) and measures around it.
Measured Measure(const std::string& name, size_t nodes, const std::string& upstream_ns,
                 const std::string& switch_ns, const std::vector<CpuGroup>& groups,
                 const std::function<NodeRun(size_t, Clock::time_point)>& work) {
  CheckInterrupted();
  Measured m;
  m.name = name;
  m.nodes.resize(nodes);
  uint64_t tx0 = NetCounter(upstream_ns, "eth0", "tx_bytes");
  uint64_t rx0 = NetCounter(upstream_ns, "eth0", "rx_bytes");
  std::map<std::string, double> cpu0;
  auto group_cpu = [](const CpuGroup& g) {
    double s = 0;
    for (pid_t p : g.pids) s += g.with_children ? TreeCpuSeconds(p) : ProcessCpuSeconds(p);
    return s;
  };
  auto group_wait = [](const CpuGroup& g) {
    double s = 0;
    for (pid_t p : g.pids) s += RunDelaySeconds(p);
    return s;
  };
  NetStats net0 = ReadNetStats(nodes, upstream_ns, switch_ns);
  std::map<std::string, double> wait0;
  for (const auto& g : groups) {
    cpu0[g.name] = group_cpu(g);
    wait0[g.name] = group_wait(g);
  }
  double pressure0 = CpuPressureSeconds();
  double clients0 = SelfAndChildrenCpuSeconds();
  SystemTicks t0 = ReadSystemTicks();
  std::latch go(static_cast<std::ptrdiff_t>(nodes) + 1);
  Clock::time_point start;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < nodes; ++i) {
    threads.emplace_back([&, i] {
      go.arrive_and_wait();
      try {
        m.nodes[i] = work(i, start);
      } catch (const Interrupted&) {
        m.nodes[i].error = "interrupted";  // not std::exception; escaping would terminate()
      } catch (const std::exception& e) {
        m.nodes[i].error = e.what();
      }
    });
  }
  BusySampler sampler;
  start = Clock::now();
  LinkSampler links(switch_ns, start);
  go.arrive_and_wait();
  for (auto& t : threads) t.join();
  m.wall_s = Seconds(Clock::now() - start);
  m.busy_samples = sampler.Stop();
  m.links = links.Stop();
  SystemTicks t1 = ReadSystemTicks();
  m.cpu["clients"] = SelfAndChildrenCpuSeconds() - clients0;
  for (const auto& g : groups) {
    m.cpu[g.name] = group_cpu(g) - cpu0[g.name];
    m.wait[g.name] = group_wait(g) - wait0[g.name];
  }
  m.pressure_s = CpuPressureSeconds() - pressure0;
  m.machine_s = TicksToSeconds(t1.total - t0.total);
  m.busy_s = TicksToSeconds(t1.busy - t0.busy);
  m.softirq_s = TicksToSeconds(t1.softirq - t0.softirq);
  m.steal_s = TicksToSeconds(t1.steal - t0.steal);
  m.iowait_s = TicksToSeconds(t1.iowait - t0.iowait);
  m.upstream_tx = NetCounter(upstream_ns, "eth0", "tx_bytes") - tx0;
  m.upstream_rx = NetCounter(upstream_ns, "eth0", "rx_bytes") - rx0;
  m.net = ReadNetStats(nodes, upstream_ns, switch_ns) - net0;
  CheckInterrupted();
  return m;
}

// The first line of a (multi-line) error text.
std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// Percentile by nearest rank (p99 of fewer than 100 values is the maximum).
double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

// Completion times of the nodes that completed (failed nodes are counted apart).
std::vector<double> Times(const Measured& m) {
  std::vector<double> out;
  for (const auto& n : m.nodes) {
    if (n.error.empty()) out.push_back(n.seconds);
  }
  return out;
}

size_t Failed(const Measured& m) {
  return static_cast<size_t>(
      std::count_if(m.nodes.begin(), m.nodes.end(), [](const NodeRun& n) { return !n.error.empty(); }));
}

size_t Retries(const Measured& m) {
  size_t r = 0;
  for (const auto& n : m.nodes) r += n.retried.size();
  return r;
}

// ---- The image --------------------------------------------------------------------------------

struct Image {
  BuiltImage built;
  uint64_t size = 0;          // S: config + layers
  Digest big = NullDigest();  // the largest layer
  uint64_t big_size = 0;
};

Image BuildBenchImage(const Options& o, const std::string& layout) {
  // Three small layers (a few MiB) and one big one that makes up the rest; gzip, like most
  // images. The generated content compresses about 2x, so the big file is twice the target.
  uint64_t big_mib = o.image_mib > 12 ? o.image_mib - 6 : std::max<uint64_t>(o.image_mib / 2, 1);
  ImageSpec spec;
  spec.layers = {
      LayerSpec{.compression = Compression::kGzip, .small_files = 100, .seed = 11},
      LayerSpec{.compression = Compression::kGzip,
                .small_files = 20,
                .big_files = {4ull << 20},
                .seed = 12},
      LayerSpec{.compression = Compression::kGzip,
                .small_files = 40,
                .big_files = {2ull << 20},
                .seed = 13},
      LayerSpec{.compression = Compression::kGzip,
                .small_files = 5,
                .big_files = {(big_mib << 21) + (big_mib << 15)},
                .seed = 14},
  };
  auto built = BuildImage(spec, layout, kTag);
  if (!built) throw HarnessError("image build: " + built.error().ToString());
  Image img;
  img.built = built.value();
  img.size = img.built.total_blob_bytes;
  for (size_t i = 0; i < img.built.layer_sizes.size(); ++i) {
    if (img.built.layer_sizes[i] > img.big_size) {
      img.big_size = img.built.layer_sizes[i];
      img.big = img.built.layer_digests[i];
    }
  }
  return img;
}

// Checks a pulled layout: the manifest digest and every layer file with its size (skopeo has
// verified each blob's digest while copying).
std::string CheckLayout(const std::string& out, const Image& img) {
  auto got = ReadLayout(out, kTag);
  if (!got) return got.error().ToString();
  if (got.value().manifest_digest != img.built.manifest_digest) {
    return "pulled manifest " + got.value().manifest_digest.str() + ", expected " +
           img.built.manifest_digest.str();
  }
  for (size_t i = 0; i < img.built.layer_digests.size(); ++i) {
    std::string path = out + "/blobs/sha256/" + img.built.layer_digests[i].hex();
    std::error_code ec;
    auto size = fs::file_size(path, ec);
    if (ec || size != img.built.layer_sizes[i]) return "layer missing or short: " + path;
  }
  return "";
}

// ---- Output -----------------------------------------------------------------------------------

struct Context {
  Options o;
  Image img;
  double limit_s = 0;  // max(S/B, S/U)
};

void PrintTimes(const Context& c, const std::vector<Measured>& runs) {
  std::printf("\n%-15s %8s %6s %8s %6s %8s %6s   %10s %7s %7s %6s\n", "scenario", "p50 s", "x lim",
              "p99 s", "x lim", "max s", "x lim", "upstream", "x S", "retried", "failed");
  for (const auto& m : runs) {
    auto t = Times(m);
    double p50 = Percentile(t, 0.5), p99 = Percentile(t, 0.99), mx = Percentile(t, 1.0);
    std::printf("%-15s %8.2f %6.2f %8.2f %6.2f %8.2f %6.2f   %10s %7.3f %7zu %6zu\n",
                m.name.c_str(), p50, p50 / c.limit_s, p99, p99 / c.limit_s, mx, mx / c.limit_s,
                Mib(static_cast<double>(m.upstream_tx)).c_str(),
                static_cast<double>(m.upstream_tx) / static_cast<double>(c.img.size), Retries(m),
                Failed(m));
  }
}

void PrintCpu(const std::vector<Measured>& runs, int cores) {
  std::printf("\n%-15s %6s %5s %5s %5s %5s %5s %5s | %6s %6s %7s %8s %6s %7s %6s\n", "scenario",
              "wall s", "busy", "ours", "other", "psi", "sirq", "steal", "agents", "(wait)",
              "tracker", "upstream", "cache", "clients", "other");
  for (const auto& m : runs) {
    auto pct = [&](double s) { return m.machine_s > 0 ? 100 * s / m.machine_s : 0.0; };
    auto get = [](const std::map<std::string, double>& from, const char* k) {
      auto it = from.find(k);
      return it == from.end() ? 0.0 : it->second;
    };
    double other = std::max(0.0, m.busy_s - m.Ours());
    std::printf(
        "%-15s %6.1f %4.0f%% %4.0f%% %4.0f%% %4.0f%% %4.0f%% %4.0f%% | %6.1f %6.1f %7.1f %8.1f "
        "%6.1f %7.1f %6.1f\n",
        m.name.c_str(), m.wall_s, pct(m.busy_s), pct(m.Ours()), pct(other),
        m.wall_s > 0 ? 100 * m.pressure_s / m.wall_s : 0, pct(m.softirq_s), pct(m.steal_s),
        get(m.cpu, "agents"), get(m.wait, "agents"), get(m.cpu, "tracker"),
        get(m.cpu, "upstream registry"), get(m.cpu, "central cache"), get(m.cpu, "clients"), other);
  }
  std::printf(
      "Shares of all %d cores over the scenario (/proc/stat): busy (idle and iowait are not); "
      "ours:\nthis benchmark's processes (columns right of |); other: busy minus ours (softirq, "
      "kernel\nthreads, other users' work). psi: share of the time some runnable task waited for "
      "a CPU\n(/proc/pressure/cpu). sirq: softirq (network stack: veths, bridge, tbf); steal: "
      "taken by the\nhypervisor. Right of |: CPU seconds (utime+stime) of the agents (and the "
      "seconds their\nthreads were runnable but waited for a CPU, summed over threads), the "
      "tracker, the upstream\ndocker-registry, the central cache, the clients (skopeo, or the "
      "first-byte client threads),\nand everything else that was busy.\n",
      cores);
}

// Per-second link rates of a run, from the switch's veth ends: "up0" received = what the
// upstream registry sent; "nK" transmitted = node K's download, received = its upload; "cc0"
// received = what the central cache sent.
struct Timeline {
  std::vector<double> t;  // end of each 1 s bucket
  // column -> Mbit/s per bucket: "upstream", "cache", "nK" (download), "nK up", "node uploads"
  std::map<std::string, std::vector<double>> mbit;
};

Timeline MakeTimeline(const Measured& m, size_t nodes) {
  Timeline tl;
  if (m.links.size() < 2) return tl;
  auto counter = [](const LinkSample& s, const std::string& dev, bool rx) -> uint64_t {
    auto it = s.bytes.find(dev);
    if (it == s.bytes.end()) return 0;
    return rx ? it->second.first : it->second.second;
  };
  size_t prev = 0;
  for (int sec = 1;; ++sec) {
    // The last sample at or before `sec` seconds (or the final one).
    size_t cur = prev;
    while (cur + 1 < m.links.size() && m.links[cur + 1].t <= sec + 0.05) ++cur;
    if (cur == prev) {
      if (prev + 1 >= m.links.size()) break;
      cur = prev + 1;
    }
    const LinkSample& a = m.links[prev];
    const LinkSample& b = m.links[cur];
    double dt = b.t - a.t;
    if (dt <= 0) break;
    auto rate = [&](const std::string& dev, bool rx) {
      return static_cast<double>(counter(b, dev, rx) - counter(a, dev, rx)) * 8 / 1e6 / dt;
    };
    tl.t.push_back(b.t);
    tl.mbit["upstream"].push_back(rate("up0", true));
    tl.mbit["cache"].push_back(rate("cc0", true) + rate("cc1", true));  // one runs at a time
    double up = 0;
    for (size_t i = 0; i < nodes; ++i) {
      std::string dev = "n" + std::to_string(i + 1);
      tl.mbit[dev].push_back(rate(dev, false));
      tl.mbit[dev + " up"].push_back(rate(dev, true));
      up += rate(dev, true);
    }
    tl.mbit["node uploads"].push_back(up);
    prev = cur;
    if (cur + 1 >= m.links.size()) break;
  }
  return tl;
}

void PrintTimeline(const Measured& m, size_t nodes, bool with_cache) {
  Timeline tl = MakeTimeline(m, nodes);
  std::printf(
      "\n%s: link rates per second, Mbit/s (upstream: what the registry sent; nK: node K's "
      "download;\nuploads: all nodes' uploads together%s)\n",
      m.name.c_str(), with_cache ? "; cache: what the central cache sent" : "");
  std::printf("%6s %8s", "t s", "upstream");
  if (with_cache) std::printf(" %6s", "cache");
  for (size_t i = 0; i < nodes; ++i) std::printf(" %5s", ("n" + std::to_string(i + 1)).c_str());
  std::printf(" %8s\n", "uploads");
  for (size_t k = 0; k < tl.t.size(); ++k) {
    std::printf("%6.1f %8.0f", tl.t[k], tl.mbit["upstream"][k]);
    if (with_cache) std::printf(" %6.0f", tl.mbit["cache"][k]);
    for (size_t i = 0; i < nodes; ++i) {
      std::printf(" %5.0f", tl.mbit["n" + std::to_string(i + 1)][k]);
    }
    std::printf(" %8.0f\n", tl.mbit["node uploads"][k]);
  }
}

// Bytes node i's veth carried in (download) and out (upload) over a run.
std::pair<uint64_t, uint64_t> NodeLinkBytes(const Measured& m, size_t i) {
  if (m.links.size() < 2) return {0, 0};
  std::string dev = "n" + std::to_string(i + 1);
  auto get = [&](const LinkSample& s) {
    auto it = s.bytes.find(dev);
    return it == s.bytes.end() ? std::make_pair(uint64_t{0}, uint64_t{0}) : it->second;
  };
  auto a = get(m.links.front()), b = get(m.links.back());
  // Seen from the switch: what it transmits to the node is the node's download.
  return {b.second - a.second, b.first - a.first};
}

// How well a run used the links: the upstream link's average use over the run, and the
// nodes' average download rate (as shares of U and B).
void PrintLinkUse(const Context& c, const std::vector<Measured>& runs) {
  std::printf(
      "\nlink use: upstream = registry bytes / (U x wall time); node downloads = mean over "
      "nodes of S / (B x node time),\nand mean bytes into a node's veth / S\n");
  for (const auto& m : runs) {
    double up = static_cast<double>(m.upstream_tx) * 8 / 1e6 / (c.o.upstream_mbit * m.wall_s);
    double node = 0;
    for (const auto& n : m.nodes) {
      node += static_cast<double>(c.img.size) * 8 / 1e6 / (c.o.node_mbit * n.seconds);
    }
    node /= static_cast<double>(std::max<size_t>(1, m.nodes.size()));
    // Seconds in which the upstream link ran at >= 80% of U.
    Timeline tl = MakeTimeline(m, m.nodes.size());
    int busy = 0;
    for (double v : tl.mbit["upstream"]) busy += v >= 0.8 * c.o.upstream_mbit ? 1 : 0;
    double in = 0;
    for (size_t i = 0; i < m.nodes.size(); ++i)
      in += static_cast<double>(NodeLinkBytes(m, i).first);
    in /=
        static_cast<double>(std::max<size_t>(1, m.nodes.size())) * static_cast<double>(c.img.size);
    std::printf(
        "  %-15s upstream link %3.0f%% used (>= 80%% of U during %d of %zu s); node "
        "downloads at %3.0f%% of B on average, %.3fx S on the wire\n",
        m.name.c_str(), 100 * up, busy, tl.t.size(), 100 * node, in);
  }
  std::printf(
      "lag: the registry link's last second at >= 20%% of U, and how far the nodes trailed it "
      "then:\nthe share of its bytes the registry had sent minus the mean share of its bytes a "
      "node had received\n(at B = U a node cannot make up a lag: it still has that share to "
      "download at B)\n");
  for (const auto& m : runs) {
    Timeline tl = MakeTimeline(m, m.nodes.size());
    const std::vector<double>& up = tl.mbit["upstream"];
    if (up.empty()) continue;
    size_t end = 0;
    for (size_t k = 0; k < up.size(); ++k) {
      if (up[k] >= 0.2 * c.o.upstream_mbit) end = k;
    }
    // Bytes (in Mbit) up to and including sample `upto`, and in all, of one series.
    auto sums = [&](const std::vector<double>& v, size_t upto) {
      double part = 0, all = 0;
      for (size_t k = 0; k < v.size(); ++k) {
        double x = v[k] * (tl.t[k] - (k == 0 ? 0.0 : tl.t[k - 1]));
        all += x;
        if (k <= upto) part += x;
      }
      return std::make_pair(part, all);
    };
    auto [reg_part, reg_all] = sums(up, end);
    double nodes_share = 0;
    for (size_t i = 0; i < m.nodes.size(); ++i) {
      auto [part, all] = sums(tl.mbit["n" + std::to_string(i + 1)], end);
      nodes_share += all > 0 ? part / all : 0;
    }
    nodes_share /= static_cast<double>(std::max<size_t>(1, m.nodes.size()));
    const double p99 = Percentile(Times(m), 0.99);
    std::printf(
        "  %-15s registry until %.0f s (%.2fx the limit); nodes then at %.0f%% of their bytes, "
        "a lag of %.2f; p99 %.1f s after it\n",
        m.name.c_str(), tl.t[end], tl.t[end] / c.limit_s, 100 * nodes_share,
        (reg_all > 0 ? reg_part / reg_all : 0) - nodes_share, p99 - tl.t[end]);
  }
  std::printf(
      "TCP: segments sent again (after a drop at a shaped link) among all sent; tbf drops among "
      "packets\n");
  auto pct = [](uint64_t part, uint64_t all) {
    return all == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(all);
  };
  for (const auto& m : runs) {
    const NetStats& n = m.net;
    std::printf(
        "  %-15s nodes %.2f%% of %llu segments, registry %.2f%% of %llu; drops: node uplinks "
        "%.2f%%, node downlinks %.2f%%, registry link %llu packets\n",
        m.name.c_str(), pct(n.node_retrans, n.node_segs),
        static_cast<unsigned long long>(n.node_segs), pct(n.reg_retrans, n.reg_segs),
        static_cast<unsigned long long>(n.reg_segs), pct(n.up_drops, n.up_pkts + n.up_drops),
        pct(n.down_drops, n.down_pkts + n.down_drops),
        static_cast<unsigned long long>(n.reg_drops));
  }
}

json TimelineJson(const Measured& m, size_t nodes) {
  Timeline tl = MakeTimeline(m, nodes);
  return {{"t", tl.t}, {"mbit", tl.mbit}};
}

json MeasuredJson(const Context& c, const Measured& m) {
  json nodes = json::array();
  for (const auto& n : m.nodes) {
    nodes.push_back({{"seconds", n.seconds},
                     {"first_byte_s", n.first_byte_s},
                     {"header_s", n.header_s},
                     {"from_upstream", n.from_upstream},
                     {"from_peers", n.from_peers},
                     {"redundant", n.redundant},
                     {"wasted", n.wasted},
                     {"leases", n.leases},
                     {"stalls", n.stalls},
                     {"fallbacks", n.fallbacks},
                     {"attempts", n.attempts},
                     {"retried_errors", n.retried},
                     {"error", n.error}});
  }
  auto t = Times(m);
  return {
      {"scenario", m.name},
      {"failed_nodes", Failed(m)},
      {"retries", Retries(m)},
      {"p50_s", Percentile(t, 0.5)},
      {"p99_s", Percentile(t, 0.99)},
      {"max_s", Percentile(t, 1.0)},
      {"limit_s", c.limit_s},
      {"upstream_tx_bytes", m.upstream_tx},
      {"upstream_rx_bytes", m.upstream_rx},
      {"upstream_x_image", static_cast<double>(m.upstream_tx) / static_cast<double>(c.img.size)},
      {"wall_s", m.wall_s},
      {"machine_busy_pct", m.machine_s > 0 ? 100 * m.busy_s / m.machine_s : 0},
      {"softirq_pct", m.machine_s > 0 ? 100 * m.softirq_s / m.machine_s : 0},
      {"steal_pct", m.machine_s > 0 ? 100 * m.steal_s / m.machine_s : 0},
      {"busy_samples", m.busy_samples},
      {"cpu_s", m.cpu},
      {"timeline", TimelineJson(m, m.nodes.size())},
      {"tcp", {{"node_segments", m.net.node_segs},
               {"node_retransmitted", m.net.node_retrans},
               {"registry_segments", m.net.reg_segs},
               {"registry_retransmitted", m.net.reg_retrans},
               {"uplink_packets", m.net.up_pkts},
               {"uplink_drops", m.net.up_drops},
               {"downlink_packets", m.net.down_pkts},
               {"downlink_drops", m.net.down_drops},
               {"registry_drops", m.net.reg_drops}}},
      {"run_queue_wait_s", m.wait},
      {"cpu_pressure_pct", m.wall_s > 0 ? 100 * m.pressure_s / m.wall_s : 0},
      {"tracker_requests", m.tracker_requests},
      {"batched_announces", m.batched_announces},
      {"nodes", nodes}};
}

// Lines at warn level or above in the agents' and trackers' logs (text format:
// "<time> <level> [<component>] <message>").
std::vector<std::string> LogProblems(const std::string& logs_dir, size_t* total) {
  std::vector<std::string> out;
  *total = 0;
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(logs_dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.find("-node") != std::string::npos || name.find("-tracker") != std::string::npos) {
      files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f);
    for (std::string line; std::getline(in, line);) {
      std::istringstream fields(line);
      std::string time, level;
      fields >> time >> level;
      if (level != "warning" && level != "warn" && level != "error" && level != "critical")
        continue;
      ++*total;
      if (out.size() < 15) out.push_back(f.filename().string() + ": " + line.substr(0, 400));
    }
  }
  return out;
}


// ---- Main -------------------------------------------------------------------------------------

int Main(int argc, char** argv) {
  CLI::App app{
      "shoal-bench-swarm: N nodes pull one image at once over shaped links: through shoal, "
      "straight from the upstream registry, and through a central pull-through cache"};
  Options o;
  app.add_option("--nodes", o.nodes, "Nodes pulling at once")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--node-mbit", o.node_mbit,
                 "B: each node's link (and the tracker's and the "
                 "central cache's), Mbit/s each direction")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--upstream-mbit", o.upstream_mbit,
                 "U: the one link of the upstream registry, Mbit/s each direction")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--image-mib", o.image_mib,
                 "Approximate image size S in MiB (one big layer "
                 "plus three small ones, gzip)")
      ->check(CLI::Range(8, 16384))
      ->capture_default_str();
  app.add_option("--chunk-mib", o.chunk_mib,
                 "shoal-tracker --chunk-size-kib, in MiB (16: the tracker's default)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--piece-kib", o.piece_kib,
                 "shoal-tracker --piece-size-kib: a power of two, at most the chunk size "
                 "(default: 1024, the tracker's default, or the chunk size if smaller)");
  app.add_option("--scenarios", o.scenarios, "Scenarios to run, in this order")
      ->delimiter(',')
      ->check(CLI::IsMember({"shoal", "shoal-plain", "direct", "central", "central-nginx"}))
      ->capture_default_str();
  app.add_option("--cache-mbit", o.cache_mbit,
                 "central-nginx's link, Mbit/s each direction (default: 10 x B, a server's)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--pull-attempts", o.pull_attempts,
                 "Pulls a node tries before it counts as failed (every scenario alike)")
      ->check(CLI::Range(1, 10))
      ->capture_default_str();
  app.add_flag("!--no-first-byte", o.first_byte, "Skip shoal's separate cold first-byte run");
  app.add_option("--timeout-s", o.timeout_s,
                 "Deadline of each node's pull in seconds (default: 120 + 4 x N x S / min(B,U))");
  app.add_option("--agent", o.agent_bin, "shoal-agent binary")->capture_default_str();
  app.add_option("--tracker", o.tracker_bin, "shoal-tracker binary")->capture_default_str();
  app.add_option("--agent-arg", o.agent_args, "Extra shoal-agent argument (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--tracker-arg", o.tracker_args, "Extra shoal-tracker argument (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--json", o.json_path, "Also write the results as JSON to this file");
  app.add_option("--work-dir", o.work_dir,
                 "Where the temp dir goes (registry storage, caches, pulled images, logs); "
                 "default $TMPDIR or /tmp");
  app.add_option("--nice", o.nice,
                 "Niceness of this program and everything it starts, also set on this session's "
                 "scheduler autogroup (restored at exit): e.g. -10 on a machine busy with other "
                 "work, so that the figures measure the network, not the other work")
      ->check(CLI::Range(-20, 19))
      ->capture_default_str();
  app.add_flag("--timeline", o.timeline,
               "Print each scenario's link rates per second (upstream, every node's download)");
  app.add_flag("--keep", o.keep, "Keep the temp dir (logs, caches) at the end");
  CLI11_PARSE(app, argc, argv);
  // A repeated --scenarios appends (CLI11); each scenario runs once, at its first mention.
  {
    std::vector<std::string> once;
    for (const auto& s : o.scenarios) {
      if (std::find(once.begin(), once.end(), s) == once.end()) once.push_back(s);
    }
    if (once.size() != o.scenarios.size()) {
      std::fprintf(stderr, "note: a scenario named twice runs once\n");
    }
    o.scenarios = std::move(once);
  }
  if (o.keep) setenv("SHOAL_KEEP_TMP", "1", 1);
  if (o.piece_kib == 0) o.piece_kib = std::min<uint64_t>(1024, o.chunk_mib * 1024);
  if ((o.piece_kib & (o.piece_kib - 1)) != 0 || o.piece_kib < 16 ||
      o.piece_kib > o.chunk_mib * 1024) {
    std::fprintf(stderr, "--piece-kib must be a power of two from 16 to the chunk size\n");
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);
  if (geteuid() != 0) throw HarnessError("needs root (ip netns, veth, bridge, tc)");
  // Niceness is per thread on Linux: threads and children created from here on inherit it.
  if (o.nice != 0 && setpriority(PRIO_PROCESS, 0, o.nice) != 0) {
    throw HarnessError(std::string("setpriority: ") + std::strerror(errno));
  }
  if (auto old = AutogroupNice(); o.nice != 0 && old) {
    std::ofstream out("/proc/self/autogroup");
    out << o.nice;
    out.close();
    if (!out) throw HarnessError("cannot set the nice of /proc/self/autogroup");
    g_autogroup_restore = *old;
  }
  for (const char* tool : {"ip", "tc", "docker-registry", "skopeo"}) {
    if (!RunCommand({"sh", "-c", std::string("command -v ") + tool}, std::chrono::seconds(10))) {
      throw HarnessError(std::string(tool) + " is not installed (scripts/setup.sh installs it)");
    }
  }
  bool want_shoal = std::count(o.scenarios.begin(), o.scenarios.end(), "shoal") > 0 ||
                    std::count(o.scenarios.begin(), o.scenarios.end(), "shoal-plain") > 0;
  bool want_central = std::count(o.scenarios.begin(), o.scenarios.end(), "central") > 0;
  bool want_nginx = std::count(o.scenarios.begin(), o.scenarios.end(), "central-nginx") > 0;
  if (o.cache_mbit == 0) o.cache_mbit = 10 * o.node_mbit;
  if (want_nginx && !RunCommand({"sh", "-c", "command -v nginx"}, std::chrono::seconds(10))) {
    throw HarnessError("nginx is not installed (scripts/setup.sh installs it)");
  }
  if (want_shoal) {
    for (const auto& bin : {o.agent_bin, o.tracker_bin}) {
      if (!fs::exists(bin)) throw HarnessError(bin + " does not exist; build it first");
    }
  }

  // One run at a time: a second one would delete this one's namespaces.
  int lock_fd = ::open("/run/shoal-bench-swarm.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0)
    throw HarnessError(std::string("open /run/shoal-bench-swarm.lock: ") + std::strerror(errno));
  // A run that was just killed may take a moment to let go (its children are being killed).
  if (!WaitUntil([&] { return ::flock(lock_fd, LOCK_EX | LOCK_NB) == 0; }, std::chrono::seconds(30),
                 std::chrono::milliseconds(500))) {
    throw HarnessError("another shoal-bench-swarm is running (/run/shoal-bench-swarm.lock)");
  }
  // The lock file names the temp dir of the run holding it: one that was killed (SIGKILL, a
  // crash) left it behind.
  if (std::string prev = Trim(ReadFile("/run/shoal-bench-swarm.lock"));
      !prev.empty() && fs::path(prev).filename().string().rfind("shoal-bench-swarm-", 0) == 0 &&
      fs::is_directory(prev)) {
    std::printf("removing the temp dir of an earlier run that did not finish: %s\n", prev.c_str());
    std::error_code ec;
    fs::remove_all(prev, ec);
  }
  auto stale = OurNamespaces();
  if (!stale.empty()) {
    std::string names;
    for (const auto& s : stale) names += " " + s;
    std::printf("removing namespaces left by an earlier run:%s\n", names.c_str());
    DeleteOurNamespaces();
  }

  if (!o.work_dir.empty()) setenv("TMPDIR", o.work_dir.c_str(), 1);
  TempDir dir("shoal-bench-swarm");
  {
    std::lock_guard<std::mutex> lock(g_cleanup_mu);
    g_dir = dir.path();
  }
  struct LockNote {  // names the temp dir in the lock file while it exists (not with --keep)
    int fd;
    LockNote(int fd, const std::string& dir) : fd(fd) {
      if (fd >= 0 && ::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, dir.data(), dir.size(), 0);
    }
    ~LockNote() {
      if (fd >= 0) (void)!::ftruncate(fd, 0);
    }
  } lock_note(o.keep ? -1 : lock_fd, dir.path());
  // skopeo's scratch files go inside it too.
  setenv("TMPDIR", dir.path().c_str(), 1);
  Paths p;
  p.dir = dir.path();
  p.logs = dir.Sub("logs");
  fs::create_directories(p.logs);
  p.skopeo_registries_conf = dir.Sub("registries.conf");
  p.skopeo_auth = dir.Sub("auth.json");
  WriteFile(p.skopeo_registries_conf, "");
  WriteFile(p.skopeo_auth, "{}");

  // Run copies of the binaries: the build tree may be rebuilt while this runs.
  if (want_shoal) {
    fs::create_directories(dir.Sub("bin"));
    for (std::string* bin : {&o.agent_bin, &o.tracker_bin}) {
      std::string copy = dir.Sub("bin/" + fs::path(*bin).filename().string());
      bool ok = false;
      for (int attempt = 0; attempt < 30 && !ok; ++attempt) {
        std::error_code ec;
        fs::copy_file(*bin, copy, fs::copy_options::overwrite_existing, ec);
        ok = !ec && RunCommand({copy, "--help"}, std::chrono::seconds(20)).has_value();
        if (!ok) std::this_thread::sleep_for(std::chrono::seconds(2));  // being linked?
        CheckInterrupted();
      }
      if (!ok) throw HarnessError("cannot copy and run " + *bin);
      std::printf("using a copy of %s (modified %s)\n", bin->c_str(),
                  Trim(Must({"date", "-r", *bin, "+%F %T"})).c_str());
      *bin = copy;
    }
  }

  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const std::string load_at_start = Trim(ReadFile("/proc/loadavg"));
  std::printf(
      "shoal-bench-swarm: %zu nodes, B = %d Mbit/s per node, U = %d Mbit/s upstream, "
      "image ~%llu MiB, chunks up to %llu MiB / pieces up to %llu KiB (smaller blobs get "
      "smaller ones: see the layout in the results)\n",
      o.nodes, o.node_mbit, o.upstream_mbit, static_cast<unsigned long long>(o.image_mib),
      static_cast<unsigned long long>(o.chunk_mib), static_cast<unsigned long long>(o.piece_kib));
  std::printf("machine: %s; load average at start: %s; nice %d\n", MachineSummary().c_str(),
              load_at_start.c_str(), o.nice);
  std::printf("temp dir: %s\n", dir.path().c_str());

  Context c;
  c.o = o;
  auto t0 = Clock::now();
  c.img = BuildBenchImage(o, dir.Sub("layout"));
  CheckInterrupted();
  std::printf(
      "image: %s, S = %llu bytes (%s) in config + %zu layers, largest layer %s; built in "
      "%.1f s\n",
      c.img.built.manifest_digest.str().substr(0, 19).c_str(),
      static_cast<unsigned long long>(c.img.size), Mib(static_cast<double>(c.img.size)).c_str(),
      c.img.built.layer_digests.size(), Mib(static_cast<double>(c.img.big_size)).c_str(),
      Seconds(Clock::now() - t0));
  const double S = static_cast<double>(c.img.size);
  c.limit_s = S * 8 / (1e6 * std::min(o.node_mbit, o.upstream_mbit));
  const int timeout_s = o.timeout_s > 0
                            ? o.timeout_s
                            : static_cast<int>(120 + 4 * static_cast<double>(o.nodes) * c.limit_s);
  const auto deadline_per_pull = std::chrono::seconds(timeout_s);
  std::printf("physical limit max(S/B, S/U) = %.2f s; deadline per pull %d s\n", c.limit_s,
              timeout_s);

  // ---- The network. ----
  t0 = Clock::now();
  NeighbourLimits neighbours(o.nodes + 5);  // the nodes, the registry, tracker and caches
  Network net;
  net.CreateSwitch();
  Endpoint upstream = net.Attach("up0", kUpstreamIp, o.upstream_mbit);
  std::optional<Endpoint> tracker_ep, cache_ep;
  if (want_shoal) tracker_ep = net.Attach("tr0", kTrackerIp, o.node_mbit);
  if (want_central) cache_ep = net.Attach("cc0", kCacheIp, o.node_mbit);
  std::optional<Endpoint> nginx_ep;
  if (want_nginx) nginx_ep = net.Attach("cc1", kNginxCacheIp, o.cache_mbit);
  std::vector<Endpoint> nodes;
  for (size_t i = 0; i < o.nodes; ++i) {
    nodes.push_back(
        net.Attach("n" + std::to_string(i + 1), "198.18.1." + std::to_string(i + 1), o.node_mbit));
  }
  std::printf("network: %zu namespaces, veths shaped with tbf, built in %.1f s\n",
              OurNamespaces().size(), Seconds(Clock::now() - t0));

  // ---- The upstream registry, with the image. ----
  auto registry = StartRegistry(p, upstream.ns, dir.Sub("upstream"), "", "upstream-registry");
  const pid_t registry_pid = registry->pid();
  t0 = Clock::now();
  {
    std::string digest_file = dir.Sub("pushed-digest");
    auto out =
        SkopeoIn(p, upstream.ns,
                 {"copy", "--all", "--preserve-digests", "--quiet", "--dest-tls-verify=false",
                  "--digestfile", digest_file, "oci:" + c.img.built.layout_dir + ":" + kTag,
                  "docker://127.0.0.1:" + std::to_string(kRegistryPort) + "/" + kRepo + ":" + kTag},
                 std::chrono::seconds(600));
    CheckInterrupted();
    if (!out) throw HarnessError("push: " + out.error().ToString());
    if (Trim(ReadFile(digest_file)) != c.img.built.manifest_digest.str()) {
      throw HarnessError("push: the registry has " + Trim(ReadFile(digest_file)) + ", expected " +
                         c.img.built.manifest_digest.str());
    }
  }
  fs::remove_all(dir.Sub("layout"));
  std::printf("pushed to docker-registry in %s (%s) in %.1f s (over loopback, not the U link)\n",
              upstream.ns.c_str(), upstream.ip.c_str(), Seconds(Clock::now() - t0));
  const std::string upstream_url =
      "http://" + std::string(kUpstreamIp) + ":" + std::to_string(kRegistryPort);

  std::vector<std::string> notes;
  // Every node pulls with skopeo from src(i) into a fresh layout; a failed pull is retried, up
  // to --pull-attempts in all and within the node's deadline, counted from the common start.
  auto skopeo_pull = [&](const std::string& run, const std::function<std::string(size_t)>& src) {
    return [&, run, src](size_t i, Clock::time_point start) {
      NodeRun r;
      std::string out = p.dir + "/" + run + "-pull-node" + std::to_string(i + 1);
      for (r.attempts = 1;; ++r.attempts) {
        auto left = deadline_per_pull - (Clock::now() - start);
        auto res = SkopeoIn(
            p, nodes[i].ns,
            {"copy", "--quiet", "--src-tls-verify=false", "--preserve-digests",
             "docker://" + src(i) + "/" + kRepo + ":" + kTag, "oci:" + out + ":" + kTag},
            std::chrono::duration_cast<std::chrono::seconds>(left));
        r.seconds = Seconds(Clock::now() - start);
        r.error = res ? CheckLayout(out, c.img) : res.error().ToString();
        fs::remove_all(out);
        if (r.error.empty()) {
          r.bytes = c.img.size;
          break;
        }
        CheckInterrupted();
        if (r.attempts >= o.pull_attempts ||
            Clock::now() - start > deadline_per_pull - std::chrono::seconds(5)) {
          break;
        }
        r.retried.push_back(r.error);
      }
      return r;
    };
  };
  // Failed nodes and retried pulls become notes (with the daemon's log tail for a failure).
  size_t failed_shoal_nodes = 0;
  auto check_runs = [&](const Measured& m, const std::function<std::string(size_t)>& log_tail) {
    for (size_t i = 0; i < m.nodes.size(); ++i) {
      const NodeRun& n = m.nodes[i];
      std::string who = m.name + ": node " + std::to_string(i + 1);
      for (size_t a = 0; a < n.retried.size(); ++a) {
        notes.push_back(who + ": attempt " + std::to_string(a + 1) + " failed (retried): " +
                        FirstLine(n.retried[a]));
      }
      if (n.error.empty()) continue;
      if (m.name.rfind("shoal", 0) == 0) ++failed_shoal_nodes;
      notes.push_back(who + ": FAILED after " + std::to_string(n.attempts) + " attempt(s): " +
                      n.error + (log_tail ? "\n" + log_tail(i) : std::string()));
      std::printf("\n%s: FAILED: %s\n", who.c_str(), FirstLine(n.error).c_str());
    }
  };

  std::vector<Measured> runs;
  std::optional<Measured> first_byte;
  std::string tracker_settings;  // the tracker's log line with its chunk and lease settings
  std::string big_layout;        // the largest layer's chunk layout, as the tracker cut it
  std::vector<std::string> problem_lines;
  size_t problem_count = 0;
  for (const auto& scenario : o.scenarios) {
    CheckInterrupted();
    if (scenario == "shoal" || scenario == "shoal-plain") {
      const bool plain = scenario == "shoal-plain";
      std::vector<CpuGroup> groups;
      if (o.first_byte && !plain) {
        // A cold cluster; every node first GETs the manifest (as a runtime does), then all GET
        // the largest layer at once with a client that notes its first body byte.
        std::printf("shoal, cold first-byte run: %zu agents GET the %s layer at once ... ", o.nodes,
                    Mib(static_cast<double>(c.img.big_size)).c_str());
        std::fflush(stdout);
        ShoalCluster cl = StartShoal(o, p, nodes, *tracker_ep, upstream_url, "fb");
        for (size_t i = 0; i < o.nodes; ++i) {
          auto r = InNetns(nodes[i].ns, [&] {
            return HttpGet(cl.agents[i].Url() + "/v2/" + kRepo + "/manifests/" + kTag,
                           {{"Accept",
                             "application/vnd.oci.image.manifest.v1+json, "
                             "application/vnd.docker.distribution.manifest.v2+json"}},
                           std::chrono::seconds(60));
          });
          if (!r || r.value().status != 200) {
            throw HarnessError(
                "manifest through agent on node " + std::to_string(i + 1) + ": " +
                (r ? "HTTP " + std::to_string(r.value().status) : r.error().ToString()) + "\n" +
                cl.agents[i].process->LogTail());
          }
        }
        groups = {{"agents", cl.AgentPids()},
                  {"tracker", {cl.tracker->pid()}},
                  {"upstream registry", {registry_pid}}};
        std::string target = std::string("/v2/") + kRepo + "/blobs/" + c.img.big.str();
        Measured m = Measure("shoal 1st byte", o.nodes, upstream.ns, net.switch_ns, groups,
                             [&](size_t i, Clock::time_point start) {
                               return InNetns(nodes[i].ns, [&] {
                                 return TimedGet(cl.agents[i].port, target, c.img.big_size, start,
                                                 start + deadline_per_pull);
                               });
                             });
        check_runs(m, [&](size_t i) { return cl.agents[i].process->LogTail(); });
        auto stopped = cl.Stop();
        notes.insert(notes.end(), stopped.begin(), stopped.end());
        std::vector<double> fb;
        for (const auto& n : m.nodes) fb.push_back(n.first_byte_s);
        std::printf("first byte p50 %.3f s, max %.3f s; whole layer p50 %.2f s, max %.2f s\n",
                    Percentile(fb, 0.5), Percentile(fb, 1.0), Percentile(Times(m), 0.5),
                    Percentile(Times(m), 1.0));
        first_byte = std::move(m);
        for (size_t i = 0; i < o.nodes; ++i)
          fs::remove_all(p.dir + "/fb-node" + std::to_string(i + 1) + "-cache");
      }
      std::printf("%s: tracker + %zu agents (%s peers), %zu skopeo pulls at once ... ",
                  scenario.c_str(), o.nodes, plain ? "plain TCP" : "TLS", o.nodes);
      std::fflush(stdout);
      ShoalCluster cl = StartShoal(o, p, nodes, *tracker_ep, upstream_url, scenario, plain);
      for (std::istringstream log(cl.tracker->Log()); std::getline(log, tracker_settings);) {
        if (tracker_settings.find("upstream leases") != std::string::npos) break;
      }
      std::vector<std::string> before;
      for (const auto& a : cl.agents) before.push_back(a.Metrics());
      const std::string tracker_before = TrackerMetrics(*tracker_ep);
      groups = {{"agents", cl.AgentPids()},
                {"tracker", {cl.tracker->pid()}},
                {"upstream registry", {registry_pid}}};
      Measured m = Measure(scenario, o.nodes, upstream.ns, net.switch_ns, groups,
                           skopeo_pull(scenario, [&](size_t i) {
                             return "127.0.0.1:" + std::to_string(cl.agents[i].port);
                           }));
      check_runs(m, [&](size_t i) { return cl.agents[i].process->LogTail(); });
      for (size_t i = 0; i < o.nodes; ++i) {
        std::string after = cl.agents[i].Metrics();
        auto delta = [&](const char* metric) {
          return MetricSum(after, metric) - MetricSum(before[i], metric);
        };
        m.nodes[i].from_upstream = delta("shoal_upstream_blob_bytes_total");
        m.nodes[i].from_peers = delta("shoal_swarm_peer_bytes_total");
        m.nodes[i].redundant = delta("shoal_swarm_redundant_bytes_total");
        for (const char* reason : swarm::kWasteReasons) {
          double w = MetricSum(after, "shoal_swarm_wasted_bytes_total", {{"reason", reason}}) -
                     MetricSum(before[i], "shoal_swarm_wasted_bytes_total", {{"reason", reason}});
          if (w > 0) m.nodes[i].wasted[reason] = w;
        }
        m.nodes[i].leases = delta("shoal_swarm_leases_granted_total");
        m.nodes[i].stalls = delta("shoal_swarm_peer_stalls_total");
        m.nodes[i].fallbacks = delta("shoal_swarm_fallback_total");
      }
      const std::string tracker_after = TrackerMetrics(*tracker_ep);
      m.tracker_requests = TrackerRequests(tracker_before, tracker_after);
      m.batched_announces = MetricSum(tracker_after, "shoal_tracker_batched_announces_total") -
                            MetricSum(tracker_before, "shoal_tracker_batched_announces_total");
      big_layout = LayoutOf(*tracker_ep, c.img.big);
      auto stopped = cl.Stop();
      notes.insert(notes.end(), stopped.begin(), stopped.end());
      problem_lines = LogProblems(p.logs, &problem_count);
      std::printf("p50 %.2f s, max %.2f s\n", Percentile(Times(m), 0.5), Percentile(Times(m), 1.0));
      runs.push_back(std::move(m));
      for (size_t i = 0; i < o.nodes; ++i)
        fs::remove_all(p.dir + "/" + scenario + "-node" + std::to_string(i + 1) + "-cache");
    } else if (scenario == "direct") {
      std::printf("direct: %zu skopeo pulls at once from the upstream registry ... ", o.nodes);
      std::fflush(stdout);
      Measured m =
          Measure("direct", o.nodes, upstream.ns, net.switch_ns,
                  {{"upstream registry", {registry_pid}}}, skopeo_pull("direct", [&](size_t) {
                    return std::string(kUpstreamIp) + ":" + std::to_string(kRegistryPort);
                  }));
      check_runs(m, {});
      std::printf("p50 %.2f s, max %.2f s\n", Percentile(Times(m), 0.5), Percentile(Times(m), 1.0));
      runs.push_back(std::move(m));
    } else if (scenario == "central") {
      std::printf("central cache: docker-registry proxy in %s, %zu skopeo pulls at once ... ",
                  cache_ep->ns.c_str(), o.nodes);
      std::fflush(stdout);
      auto cache =
          StartRegistry(p, cache_ep->ns, dir.Sub("central"), upstream_url, "central-cache");
      Measured m =
          Measure("central cache", o.nodes, upstream.ns, net.switch_ns,
                  {{"upstream registry", {registry_pid}}, {"central cache", {cache->pid()}}},
                  skopeo_pull("central", [&](size_t) {
                    return std::string(kCacheIp) + ":" + std::to_string(kRegistryPort);
                  }));
      check_runs(m, [&](size_t) { return cache->LogTail(); });
      cache->Stop();
      fs::remove_all(dir.Sub("central"));
      std::printf("p50 %.2f s, max %.2f s\n", Percentile(Times(m), 0.5), Percentile(Times(m), 1.0));
      runs.push_back(std::move(m));
    } else if (scenario == "central-nginx") {
      std::printf("central cache: nginx proxy_cache_lock in %s (link %d Mbit/s), %zu skopeo pulls "
                  "at once ... ",
                  nginx_ep->ns.c_str(), o.cache_mbit, o.nodes);
      std::fflush(stdout);
      auto cache = StartNginxCache(p, nginx_ep->ns, dir.Sub("central-nginx"), upstream_url,
                                   timeout_s);
      Measured m = Measure(
          "central nginx", o.nodes, upstream.ns, net.switch_ns,
          {{"upstream registry", {registry_pid}}, {"central cache", {cache->pid()}, true}},
          skopeo_pull("central-nginx", [&](size_t) {
            return std::string(kNginxCacheIp) + ":" + std::to_string(kRegistryPort);
          }));
      check_runs(m, [&](size_t) {
        return ReadFile(dir.Sub("central-nginx") + "/error.log") + cache->LogTail();
      });
      cache->Stop();
      fs::remove_all(dir.Sub("central-nginx"));
      std::printf("p50 %.2f s, max %.2f s\n", Percentile(Times(m), 0.5), Percentile(Times(m), 1.0));
      runs.push_back(std::move(m));
    }
  }
  if (!registry->Running()) notes.push_back("the upstream docker-registry exited during the run");
  registry->Stop();

  // ---- Report. ----
  std::printf(
      "\n==== results: %zu nodes, B = %d Mbit/s, U = %d Mbit/s, S = %s (%llu bytes), "
      "chunks of up to %llu MiB ====\n",
      o.nodes, o.node_mbit, o.upstream_mbit, Mib(S).c_str(),
      static_cast<unsigned long long>(c.img.size), static_cast<unsigned long long>(o.chunk_mib));
  std::printf(
      "physical limit max(S/B, S/U) = %.2f s (S x 8 / min(B, U); TCP/IP framing alone "
      "makes ~1.05x of it the floor)\n",
      c.limit_s);
  if (!tracker_settings.empty()) {
    auto pos = tracker_settings.find("chunks of");
    std::printf("tracker: %s\n",
                tracker_settings.substr(pos == std::string::npos ? 0 : pos).c_str());
  }
  if (!big_layout.empty())
    std::printf("largest layer as the tracker cut it: %s\n", big_layout.c_str());
  PrintTimes(c, runs);
  std::printf(
      "\ntimes: from the common start to each node's skopeo exit (manifest, config and all layers "
      "in\nan OCI layout); p99 of fewer than 100 nodes is the maximum. x lim: / physical limit. "
      "upstream:\nbytes the upstream registry's veth transmitted (payload + headers; GSO frames "
      "count their\nheaders once), x S: / image size.\n");
  PrintLinkUse(c, runs);
  if (o.timeline) {
    for (const auto& m : runs) PrintTimeline(m, o.nodes, m.name.rfind("central", 0) == 0);
  }
  std::vector<Measured> cpu_runs = runs;
  if (first_byte) cpu_runs.insert(cpu_runs.begin(), *first_byte);
  PrintCpu(cpu_runs, cores);

  const Measured* shoal = nullptr;
  for (const auto& m : runs) {
    if (m.name == "shoal") shoal = &m;
  }
  if (shoal) {
    std::printf(
        "\nshoal per node (agent metrics over the pull; link in/out: the node's veth)\n"
        "%-5s %8s %12s %12s %12s %7s %7s %9s %12s %12s\n",
        "node", "time s", "upstream", "peers", "redundant", "leases", "stalls", "fallback",
        "link in", "link out");
    for (size_t i = 0; i < shoal->nodes.size(); ++i) {
      const NodeRun& n = shoal->nodes[i];
      auto [in, out] = NodeLinkBytes(*shoal, i);
      std::printf("%-5zu %8.2f %12s %12s %12s %7.0f %7.0f %9.0f %12s %12s\n", i + 1, n.seconds,
                  Mib(n.from_upstream).c_str(), Mib(n.from_peers).c_str(), Mib(n.redundant).c_str(),
                  n.leases, n.stalls, n.fallbacks, Mib(static_cast<double>(in)).c_str(),
                  Mib(static_cast<double>(out)).c_str());
    }
    std::map<std::string, double> wasted;
    for (const NodeRun& n : shoal->nodes) {
      for (const auto& [reason, bytes] : n.wasted) wasted[reason] += bytes;
    }
    std::printf("wasted peer bytes by libtorrent's reason, all nodes:");
    if (wasted.empty()) std::printf(" none");
    for (const auto& [reason, bytes] : wasted) {
      std::printf(" %s %s;", reason.c_str(), Mib(bytes).c_str());
    }
    std::printf("\n");
  }
  if (first_byte) {
    std::printf(
        "\nshoal cold first-byte run (largest layer, %s, all %zu nodes at once, manifest "
        "fetched first):\n%-5s %9s %12s %10s\n",
        Mib(static_cast<double>(c.img.big_size)).c_str(), o.nodes, "node", "header s",
        "first byte s", "layer s");
    for (size_t i = 0; i < first_byte->nodes.size(); ++i) {
      const NodeRun& n = first_byte->nodes[i];
      std::printf("%-5zu %9.3f %12.3f %10.2f\n", i + 1, n.header_s, n.first_byte_s, n.seconds);
    }
    std::printf("upstream sent %s (%.3fx the layer) in this run\n",
                Mib(static_cast<double>(first_byte->upstream_tx)).c_str(),
                static_cast<double>(first_byte->upstream_tx) / static_cast<double>(c.img.big_size));
  }

  // Goals and verdict.
  std::printf("\n%-44s %12s %10s  %s\n", "goal (shoal)", "measured", "goal", "verdict");
  auto verdict = [](double v, double goal, bool at_most) {
    bool met = at_most ? v <= goal : v < goal;
    return met ? std::string("met") : Fmt("MISSED by %.0f%%", 100 * (v / goal - 1));
  };
  std::vector<std::string> missed;
  if (shoal) {
    double p99 = Percentile(Times(*shoal), 0.99) / c.limit_s;
    double up = static_cast<double>(shoal->upstream_tx) / S;
    std::printf("%-44s %11.2fx %9s  %s\n", "p99 completion / physical limit", p99, "<= 1.25x",
                verdict(p99, 1.25, true).c_str());
    std::printf("%-44s %11.3fx %9s  %s\n", "upstream bytes / S", up, "<= 1.05x",
                verdict(up, 1.05, true).c_str());
    if (p99 > 1.25) missed.push_back("p99");
    if (up > 1.05) missed.push_back("upstream bytes");
  }
  if (first_byte) {
    std::vector<double> fb;
    for (const auto& n : first_byte->nodes) fb.push_back(n.first_byte_s);
    double worst = Percentile(fb, 1.0);
    std::printf("%-44s %10.3f s %9s  %s\n", "first blob byte, cold cluster (slowest node)", worst,
                "< 1 s", verdict(worst, 1.0, false).c_str());
    std::printf("%-44s %10.3f s\n", "first blob byte, cold cluster (median node)",
                Percentile(fb, 0.5));
    if (worst >= 1.0) missed.push_back("first byte");
  }
  std::printf("(Kraken publishes p99 = 1.8x the physical limit for 2,600 hosts.)\n");

  // Short verdict.
  std::printf("\nverdict:");
  for (const auto& m : runs) {
    std::printf(" %s p99 %.2fx, upstream %.2fx S;", m.name.c_str(),
                Percentile(Times(m), 0.99) / c.limit_s, static_cast<double>(m.upstream_tx) / S);
  }
  std::printf("\n");
  if (shoal) {
    for (const auto& m : runs) {
      if (&m == shoal) continue;
      std::printf("  shoal's p99 is %.1fx faster than %s's\n",
                  Percentile(Times(m), 0.99) / Percentile(Times(*shoal), 0.99), m.name.c_str());
    }
    std::string goals = missed.empty() ? "all met" : "missed:";
    for (size_t k = 0; k < missed.size(); ++k) goals += (k == 0 ? " " : ", ") + missed[k];
    std::printf("  shoal goals: %s\n", goals.c_str());
  }
  for (const auto& m : cpu_runs) {
    if (m.machine_s <= 0) continue;
    double ours = m.Ours() / m.machine_s, busy = m.busy_s / m.machine_s;
    double psi = m.wall_s > 0 ? m.pressure_s / m.wall_s : 0;
    const char* reading = ours >= 0.7 ? "CPU-bound: its figures measure this machine's CPU"
                          : busy >= 0.9 && psi >= 0.25
                              ? "not CPU-bound by its own work, but it competed with other work"
                              : "not CPU-bound";
    std::printf(
        "  CPU during %s: ours %.0f%% of the machine (%.2f of %d cores), other work %.0f%%, "
        "CPU pressure %.0f%% of the time: %s\n",
        m.name.c_str(), 100 * ours, ours * cores, cores, 100 * std::max(0.0, busy - ours),
        100 * psi, reading);
  }
  for (const auto& m : runs) {
    if (m.tracker_requests.empty()) continue;
    double total = 0;
    std::string kinds;
    for (const auto& [kind, n] : m.tracker_requests) {
      total += n;
      kinds += (kinds.empty() ? "" : ", ") + kind + " " + std::to_string(std::llround(n));
    }
    std::printf("  tracker requests during %s: %.0f (%.0f per node): %s\n", m.name.c_str(),
                total, total / static_cast<double>(std::max<size_t>(1, m.nodes.size())),
                kinds.c_str());
    if (m.batched_announces > 0) {
      auto it = m.tracker_requests.find("announce batch");
      const double batches = it == m.tracker_requests.end() ? 0 : it->second;
      std::printf("  announces in the %.0f batches: %.0f (%.1f a batch)\n", batches,
                  m.batched_announces, m.batched_announces / std::max(1.0, batches));
    }
  }
  if (problem_count > 0) {
    std::printf("\nagent/tracker log lines at warn or error level: %zu; the first ones:\n",
                problem_count);
    for (const auto& l : problem_lines) std::printf("  %s\n", l.c_str());
  }
  for (const auto& n : notes) std::printf("note: %s\n", n.c_str());
  std::printf("logs: %s%s\n", p.logs.c_str(),
              o.keep ? "" : " (removed at exit; --keep keeps them)");

  {
    json out = {{"benchmark", "shoal-bench-swarm"},
                {"machine", MachineSummary()},
                {"load_average_at_start", load_at_start},
                {"nice", o.nice},
                {"nodes", o.nodes},
                {"node_mbit", o.node_mbit},
                {"upstream_mbit", o.upstream_mbit},
                {"image_bytes", c.img.size},
                {"largest_layer_bytes", c.img.big_size},
                {"chunk_mib", o.chunk_mib},
                {"piece_kib", o.piece_kib},
                {"agent_args", o.agent_args},
                {"tracker_args", o.tracker_args},
                {"limit_s", c.limit_s},
                {"tracker_settings", tracker_settings},
                {"largest_layer_layout", big_layout},
                {"scenarios", json::array()}};
    for (const auto& m : runs) out["scenarios"].push_back(MeasuredJson(c, m));
    if (first_byte) out["first_byte_run"] = MeasuredJson(c, *first_byte);
    WriteFile(dir.Sub("results.json"), out.dump(2) + "\n");
    if (!o.json_path.empty()) {
      WriteFile(o.json_path, out.dump(2) + "\n");
      std::printf("wrote %s\n", o.json_path.c_str());
    }
  }
  // A baseline's failed node is part of its result; a failed shoal node is a shoal bug.
  if (failed_shoal_nodes > 0) {
    std::printf("FAILED: %zu shoal node pull(s) failed (see the notes above)\n", failed_shoal_nodes);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace shoal::testkit

int main(int argc, char** argv) {
  // Ctrl-C must not leave namespaces, daemons or GiBs in /tmp behind: block the signals in every
  // thread (children get a clean mask from posix_spawn) and handle them on a thread of their own.
  // A shell starts background jobs with SIGINT ignored, and an ignored signal never reaches
  // sigwait: take the default disposition back (the signals are blocked right below).
  signal(SIGPIPE, SIG_IGN);
  shoal::testkit::HandleInterruptsOnThread([](int sig) {
    std::fprintf(stderr, "\nshoal-bench-swarm: interrupted (signal %d), cleaning up\n", sig);
    shoal::testkit::g_interrupted = true;
    // Killing the children makes the step in progress fail; the main thread then unwinds and
    // its destructors stop the daemons and delete the namespaces. If it is busy elsewhere
    // (building the image), clean up from here after 3 s.
    for (int i = 0; i < 30; ++i) {
      shoal::testkit::KillAllChildren();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    shoal::testkit::DeleteOurNamespaces();
    shoal::testkit::RemoveRunDir();
    shoal::testkit::RestoreAutogroupNice();
    shoal::testkit::RestoreNeighbourLimits();
    std::fflush(stdout);
    _exit(shoal::testkit::kInterruptedExit);
  });
  int rc = 1;
  try {
    rc = shoal::testkit::Main(argc, argv);
  } catch (const shoal::testkit::Interrupted&) {
    rc = shoal::testkit::kInterruptedExit;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nshoal-bench-swarm: %s\n", e.what());
    rc = 1;
  }
  if (shoal::testkit::g_interrupted) rc = shoal::testkit::kInterruptedExit;
  // Destructors have run (daemons stopped, namespaces deleted, temp dir removed); make sure.
  shoal::testkit::DeleteOurNamespaces();
  shoal::testkit::RestoreAutogroupNice();
  shoal::testkit::RestoreNeighbourLimits();
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(rc);
}
